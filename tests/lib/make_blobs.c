/* Writes the integration tests' generated data set (8x8 images of 4 classes, as cluster_util.c's
 * write_job makes) into a folder, for tests that are shell scripts.
 * Usage: make_blobs DIR   ->  DIR/train-images.gz, train-labels.gz, test-images, test-labels */
#include <stdio.h>

#include "testutil.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_blobs DIR\n");
        return 2;
    }
    char images[4096], labels[4096], timages[4096], tlabels[4096];
    snprintf(images, sizeof(images), "%s/train-images.gz", argv[1]);
    snprintf(labels, sizeof(labels), "%s/train-labels.gz", argv[1]);
    snprintf(timages, sizeof(timages), "%s/test-images", argv[1]);
    snprintf(tlabels, sizeof(tlabels), "%s/test-labels", argv[1]);
    if (omv_test_make_blobs(images, labels, 4096, 8, 8, 4, 1, 1) < 0 ||
        omv_test_make_blobs(timages, tlabels, 512, 8, 8, 4, 2, 0) < 0) {
        fprintf(stderr, "make_blobs: cannot write into %s\n", argv[1]);
        return 1;
    }
    return 0;
}
