/* What omnivorectl's commands share: the help text, a request to the daemon that says why it
 * cannot be reached and what to do, and the flag that Ctrl-C sets for the commands that wait. */
#include "ctl.h"

#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "control.h"
#include "util.h"

static volatile sig_atomic_t interrupted;

void omv_ctl_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: omnivorectl [--socket PATH] COMMAND [--json]\n"
        "       omnivorectl [--socket PATH] watch [--interval S] [--count N] [COMMAND]\n"
        "       omnivorectl [--socket PATH] report [--out DIR] [--name BASE] [--json]\n"
        "       omnivorectl [--socket PATH] submit JOB.ini [--workers N] [--set S.K=V]...\n"
        "       omnivorectl run JOB.ini [--workers N] [--threads T] [--set S.K=V]...\n"
        "                   [--report DIR] [--curve] [--json]\n"
        "       omnivorectl keygen [--roles trainer,evaluator] NAME [DIR]\n"
        "       omnivorectl export CHECKPOINT|JOB.ini --out MODEL.safetensors [--state-dir DIR]\n\n"
        "Commands for a running omnivored:\n"
        "  status      daemon, job progress, cluster and refusal counters\n"
        "  workers     every registered worker\n"
        "  servers     the shard servers: each one's shards, role and traffic\n"
        "  groups      every compute group: clock, live members and their worker ids\n"
        "  metrics     every counter and gauge in Prometheus text format (no --json)\n"
        "  watch       repeat status (or COMMAND) every S seconds (default 2), in place on a\n"
        "              terminal; until Ctrl-C, or N times with --count\n"
        "  summary     the job's result and evaluation history\n"
        "  history     the training timeline: loss and images/s about every second, every\n"
        "              evaluation, each change of groups, momentum or learning rate, phases\n"
        "  report      write the training report: BASE.csv (every point) and BASE.svg (loss,\n"
        "              test accuracy, groups/momentum/learning rate over time, probes shaded)\n"
        "              into DIR (default: here; BASE default: omnivore-report-JOB)\n"
        "  checkpoint  write a checkpoint now and print its path\n"
        "  optimizer   the optimizer's state, the configuration of each phase, its decisions\n"
        "  regroup G   use G compute groups from the next step boundary (1 to the workers)\n"
        "  jobs        the current job, the queue, and how the last jobs ended\n"
        "  submit JOB  queue a job file (run now if nothing runs); the daemon reads the file\n"
        "              and the files it names only when you could read them too (and its\n"
        "              user can); --workers and --set as\n"
        "              for run. A job that has checkpoints resumes from the newest\n"
        "  stop [ID|NAME]  stop the current job (after a checkpoint: submitting it again\n"
        "              resumes it) or drop a queued one; the next queued job starts\n"
        "  reload      re-read omnivored.conf and apply log_level; answers once done (what\n"
        "              systemctl reload runs; a broken file is refused with the reason)\n"
        "  shutdown    stop the daemon: it checkpoints a running job first, and its workers\n"
        "              wait for it to come back (with --retry, in omnivore-worker)\n"
        "  help        this text\n\n");
    /* In two parts: one string literal of over 4095 bytes is beyond what C99 promises. */
    fprintf(
        out,
        "  run JOB     start omnivored, N trainers and an evaluator on this machine, train the\n"
        "              job, print its summary and stop them all (default N: the job's workers)\n"
        "              --report DIR: write the training report there before they stop;\n"
        "              --curve: over CURVE, with keys made for this run only\n"
        "  keygen NAME [DIR]  write a CURVE key pair: DIR/NAME.key (public: for the daemon's\n"
        "              allow-list folder, or, for NAME daemon, for every worker) and\n"
        "              DIR/NAME.key_secret (mode 0600); --roles: what a worker may be\n"
        "              (default trainer)\n"
        "  export X    write a checkpoint (X, or the newest of job file X: its [checkpoint] dir,\n"
        "              else DIR/checkpoints/NAME, DIR /var/lib/omnivore or --state-dir) as a\n"
        "              safetensors file with PyTorch's state_dict names and layouts\n\n"
        "Options:\n"
        "  -s, --socket PATH   control socket (default $OMNIVORE_SOCKET or " OMV_CTL_DEFAULT_SOCKET
        ")\n"
        "  -j, --json          JSON for programs (run: the summary as the last line)\n"
        "  -i, --interval S    watch: seconds between refreshes (default 2)\n"
        "  -n, --count N       watch: stop after N refreshes\n"
        "  -w, --workers N     run: trainer processes\n"
        "  -t, --threads T     run: threads per worker (default 1)\n"
        "      --set S.K=V     run: override a job key, e.g. --set train.learning_rate=0.05\n"
        "  -o, --out DIR       report: folder for the files (made when missing)\n"
        "  -N, --name BASE     report: file name without .csv / .svg\n"
        "      --report DIR    run: write the training report into DIR at the end\n"
        "  -h, --help          this text\n\n"
        "Exit status: 0 ok, 1 the daemon answered with an error or the job failed,\n"
        "2 bad usage, 3 the daemon cannot be reached (no socket, no permission, no answer).\n");
}

void omv_ctl_explain_unreachable(const char *sock, int r)
{
    if (r == -ENOENT || r == -ENOTDIR) {
        fprintf(stderr,
                "omnivorectl: is omnivored running? socket %s not found (set --socket or "
                "$OMNIVORE_SOCKET)\n",
                sock);
    } else if (r == -EACCES || r == -EPERM) {
        /* The socket is 0660 in a 0750 folder: its group (or the folder's, when the folder
         * itself is what we may not enter) grants access. */
        struct stat st;
        char dir[PATH_MAX];
        omv_strlcpy(dir, sock, sizeof(dir));
        int have = stat(sock, &st) == 0 || stat(dirname(dir), &st) == 0;
        struct group *g = have ? getgrgid(st.st_gid) : NULL;
        if (g)
            fprintf(stderr,
                    "omnivorectl: permission denied on %s: join the group '%s' (sudo "
                    "usermod -aG %s $USER, then log in again) or run as root\n",
                    sock, g->gr_name, g->gr_name);
        else
            fprintf(stderr,
                    "omnivorectl: permission denied on %s: join the group that owns it "
                    "(usually 'omnivore') or run as root\n",
                    sock);
    } else if (r == -ECONNREFUSED) {
        fprintf(stderr,
                "omnivorectl: nothing answers on %s: omnivored has stopped or died "
                "(journalctl -u omnivored; systemctl start omnivored)\n",
                sock);
    } else if (r == -ETIMEDOUT) {
        fprintf(stderr,
                "omnivorectl: omnivored at %s did not answer in time; it may be "
                "overloaded or stuck (journalctl -u omnivored)\n",
                sock);
    } else {
        fprintf(stderr,
                "omnivorectl: cannot reach omnivored at %s: %s (is omnivored running? "
                "set --socket or $OMNIVORE_SOCKET)\n",
                sock, omv_strerror(r));
    }
}

int omv_ctl_request(const char *sock, const char *line, omv_strbuf_t *body)
{
    int r = omv_control_request(sock, line, body, 10000);
    if (r == -EREMOTEIO) {
        fprintf(stderr, "omnivorectl: %s\n", omv_strbuf_str(body));
        return 1;
    }
    if (r < 0) {
        omv_ctl_explain_unreachable(sock, r);
        return 3;
    }
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

void omv_ctl_catch_interrupts(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: Ctrl-C cuts a sleep short */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int omv_ctl_interrupted(void)
{
    return interrupted;
}
