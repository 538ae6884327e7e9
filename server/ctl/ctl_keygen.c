/* omnivorectl keygen: CURVE key pairs in ZeroMQ's certificate form, for the daemon and for each
 * worker (with the roles it may take), and a helper that makes a whole set in one folder. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cert.h"
#include "config.h"
#include "ctl.h"
#include "router.h"

int omv_ctl_make_cert(const char *dir, const char *name, unsigned roles, char *err)
{
    omv_cert_t c = {.roles = roles};
    int r = omv_router_keypair(c.public_key, c.secret_key);
    if (r < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "cannot make a key pair: %s",
                 r == -ENOTSUP ? "libzmq was built without CURVE" : strerror(-r));
        return r;
    }
    r = omv_cert_write(dir, name, &c, err);
    memset(&c, 0, sizeof(c));
    return r;
}

int omv_ctl_keygen(const char *sock, int argc, char **argv, int json)
{
    (void)sock, (void)json;
    static const struct option opts[] = {
        {"roles", required_argument, NULL, 'r'},
        {NULL, 0, NULL, 0},
    };
    const char *roles_arg = "trainer";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:", opts, NULL)) != -1) {
        if (c != 'r') {
            omv_ctl_usage(stderr);
            return 2;
        }
        roles_arg = optarg;
    }
    if (optind >= argc || optind + 2 < argc || strchr(argv[optind], '/') ||
        argv[optind][0] == '.' || argv[optind][0] == '\0') {
        fprintf(stderr, "omnivorectl keygen: give a NAME (no slashes) and at most a folder\n");
        return 2;
    }
    int roles = omv_cert_parse_roles(roles_arg);
    if (roles < 0 || strcmp(argv[optind], "daemon") == 0)
        roles = roles < 0 ? roles : 0;
    if (roles < 0) {
        fprintf(stderr,
                "omnivorectl keygen: --roles: '%s' is not trainer, evaluator or both "
                "(trainer,evaluator)\n",
                roles_arg);
        return 2;
    }
    const char *name = argv[optind], *dir = optind + 1 < argc ? argv[optind + 1] : ".";
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_ctl_make_cert(dir, name, (unsigned)roles, err) < 0) {
        fprintf(stderr, "omnivorectl keygen: %s\n", err);
        return 1;
    }
    printf("%s/%s.key: public: %s\n%s/%s.key_secret: secret (mode 0600): keep it on %s only\n", dir,
           name,
           strcmp(name, "daemon") == 0 ? "give it to every worker (--server-key)"
                                       : "put it in the daemon's allow-list folder",
           dir, name, strcmp(name, "daemon") == 0 ? "the head node" : "that worker's machine");
    return 0;
}
