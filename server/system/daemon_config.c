/* omnivored's configuration file: its table of keys, and reading it again while running
 * (SIGHUP, or `omnivorectl reload`, which systemctl reload runs and which waits for it). */
#define OMV_LOG_TAG "daemon"
#include "daemon_config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "util.h"

#define FIELD(f) offsetof(omv_daemon_config_t, f)
#define STR(f) OMV_CONFIG_STRING, FIELD(f), sizeof(((omv_daemon_config_t *)0)->f)

const omv_config_entry_t omv_daemon_table[] = {
    {"daemon", "endpoint", STR(endpoint), "tcp://*:5555", 0, 0, 0,
     "where workers connect: tcp://ADDR:PORT or ipc://PATH"},
    {"daemon", "control", STR(control), "/run/omnivore/control.sock", 0, 0, 0,
     "control socket for omnivorectl"},
    {"daemon", "job", STR(job), "", 0, 0, 0,
     "job file to run at start (empty: start idle and wait for omnivorectl submit)"},
    {"daemon", "log_level", STR(log_level), "info", 0, 0, OMV_CONFIG_RUNTIME,
     "error, warn, info or debug"},
    {"daemon", "state_dir", STR(state_dir), "/var/lib/omnivore", 0, 0, 0,
     "state folder: checkpoints go to STATE_DIR/checkpoints/JOB_NAME unless the job says"},
    {"security", "max_message_bytes", OMV_CONFIG_INT, FIELD(max_message_bytes), sizeof(int64_t),
     "0", 0, 1099511627776.0, 0,
     "largest frame a peer may send the worker endpoint (0: the start job's model, at least 16 "
     "MiB; else 64 MiB)"},
    {"security", "admin_group", STR(admin_group), "", 0, 0, 0,
     "group whose members may submit, stop, regroup, checkpoint and shut down (besides root and "
     "the daemon's user); others who reach the control socket may only read"},
    {"security", "checkpoint_root", STR(checkpoint_root), "", 0, 0, 0,
     "a folder besides the state folder where a job's [checkpoint] dir may lie (empty: none)"},
    {"security", "curve", STR(curve), "auto", 0, 0, 0,
     "CURVE on the worker endpoint: yes, no, or auto (yes for tcp://, no for ipc://, whose "
     "socket file's permissions say who may connect)"},
    {"security", "secret_key", STR(secret_key), "/etc/omnivore/keys/daemon.key_secret", 0, 0, 0,
     "the daemon's secret certificate (omnivorectl keygen); a relative path is taken from "
     "$CREDENTIALS_DIRECTORY (systemd's LoadCredential=)"},
    {"security", "allow_dir", STR(allow_dir), "/etc/omnivore/workers.d", 0, 0, 0,
     "the folder of admitted workers' public certificates (NAME.key, with their roles)"},
    {"daemon", "role", STR(role), "coordinator", 0, 0, 0,
     "coordinator (holds jobs, members and, without shard servers, the model) or shard (holds "
     "some of a job's shards for the coordinator below)"},
    {"daemon", "coordinator", STR(coordinator), "", 0, 0, 0,
     "role shard: the coordinator's worker endpoint (tcp://HEAD:5555)"},
    {"daemon", "coordinator_timeout_s", OMV_CONFIG_DOUBLE, FIELD(coordinator_timeout_s),
     sizeof(double), "15", 0.5, 3600, 0,
     "role shard: a coordinator silent this long is taken for gone (its job's part is dropped "
     "and the server registers again)"},
    {"daemon", "server_timeout_s", OMV_CONFIG_DOUBLE, FIELD(server_timeout_s), sizeof(double), "10",
     0.5, 3600, 0,
     "a shard server silent this long (it says its counters every second) is taken for gone: "
     "its job goes on from a replica, or goes back to its last checkpoint once a server "
     "registers in its place"},
    {"daemon", "spin_us", OMV_CONFIG_INT, FIELD(spin_us), sizeof(int64_t), "300", 0, 100000, 0,
     "after an envelope from a trainer on this host, poll this many microseconds (yielding "
     "the CPU between tries) before sleeping, so that the rest of its group's step is taken in "
     "without a wake-up (0: sleep at once)"},
    {"daemon", "advertise", STR(advertise), "", 0, 0, 0,
     "role shard: the endpoint workers are told to connect to (empty: endpoint, when it names "
     "a host)"},
    {"security", "coordinator_key", STR(coordinator_key), "/etc/omnivore/keys/coordinator.key", 0,
     0, 0,
     "role shard with CURVE: the coordinator's public certificate (its daemon.key); a relative "
     "path is taken from $CREDENTIALS_DIRECTORY"},
};
const size_t omv_daemon_table_len = OMV_ARRAY_SIZE(omv_daemon_table);

int omv_daemon_config_reload(omv_daemon_reload_t *self, omv_daemon_config_t *running, char *why,
                             size_t cap)
{
    if (self->config_path[0] == '\0') {
        snprintf(why, cap, "omnivored was started without --config: nothing to reload");
        omv_log_warn("reload: %s", why);
        return -ENOENT;
    }
    omv_daemon_config_t cfg;
    char err[OMV_CONFIG_ERR_MAX];
    memset(&cfg, 0, sizeof(cfg));
    omv_config_defaults(omv_daemon_table, omv_daemon_table_len, &cfg);
    int r =
        omv_config_load(omv_daemon_table, omv_daemon_table_len, self->config_path, &cfg, NULL, err);
    if (r >= 0 && self->cli_log_level[0])
        omv_strlcpy(cfg.log_level, self->cli_log_level, sizeof(cfg.log_level));
    if (r >= 0 && omv_log_set_level_name(cfg.log_level) < 0) {
        snprintf(err, sizeof(err), "%s: log_level '%s' is not error, warn, info or debug",
                 self->config_path, cfg.log_level);
        r = -EINVAL;
    }
    if (r < 0) {
        self->reloads_failed_total++;
        snprintf(why, cap, "reload: %s; the running configuration stays", err);
        omv_log_error("%s", why);
        return r;
    }
    omv_strlcpy(running->log_level, cfg.log_level, sizeof(running->log_level));
    self->reloads_total++;
    snprintf(why, cap,
             "reloaded %s: log_level %s (endpoint, control, job and state_dir apply at the next "
             "start)",
             self->config_path, running->log_level);
    /* Logged at warn so that it shows whatever the level now is. */
    omv_log_warn("%s", why);
    return 0;
}
