/* Runs a program under two of the units' restrictions, as systemd would apply them:
 * RestrictAddressFamilies= (a seccomp filter that fails socket(2) for other families with
 * EAFNOSUPPORT) and MemoryDenyWriteExecute=yes (the kernel's PR_SET_MDWE, when it has it).
 * Usage: sandbox_exec [--families "AF_UNIX AF_INET ..."] [--mdwe] -- PROGRAM ARGS... */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

#define MAX_FAMILIES 16

static const struct {
    const char *name;
    int value;
} families[] = {
    {"AF_UNIX", AF_UNIX},       {"AF_INET", AF_INET},     {"AF_INET6", AF_INET6},
    {"AF_NETLINK", AF_NETLINK}, {"AF_PACKET", AF_PACKET},
};

static int restrict_families(char *list)
{
    int allowed[MAX_FAMILIES], n = 0;
    char *save = NULL;
    for (char *w = strtok_r(list, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        size_t i = 0;
        while (i < sizeof(families) / sizeof(families[0]) && strcmp(families[i].name, w) != 0)
            i++;
        if (i == sizeof(families) / sizeof(families[0]) || n == MAX_FAMILIES) {
            fprintf(stderr, "sandbox_exec: unknown address family '%s'\n", w);
            return -EINVAL;
        }
        allowed[n++] = families[i].value;
    }
    /* Only socket(2) is filtered, on its first argument, as systemd does. */
    struct sock_filter f[4 + 2 * MAX_FAMILIES];
    int k = 0;
    f[k++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                          offsetof(struct seccomp_data, args[0]));
    for (int j = 0; j < n; j++) {
        f[k++] =
            (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)allowed[j], 0, 1);
        f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT);
    struct sock_fprog prog = {(unsigned short)k, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return -errno;
    return 0;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--families") == 0 && i + 1 < argc) {
            int r = restrict_families(argv[++i]);
            if (r < 0) {
                fprintf(stderr, "sandbox_exec: cannot restrict address families: %s\n",
                        strerror(-r));
                return 125;
            }
        } else if (strcmp(argv[i], "--mdwe") == 0) {
            if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0)
                fprintf(stderr, "sandbox_exec: no PR_SET_MDWE here (%s): W^X not enforced\n",
                        strerror(errno));
        } else {
            fprintf(stderr, "usage: sandbox_exec [--families LIST] [--mdwe] -- PROGRAM ARGS...\n");
            return 125;
        }
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "usage: sandbox_exec [--families LIST] [--mdwe] -- PROGRAM ARGS...\n");
        return 125;
    }
    execv(argv[i + 1], argv + i + 1);
    fprintf(stderr, "sandbox_exec: cannot run %s: %s\n", argv[i + 1], strerror(errno));
    return 127;
}
