/* omnivored's configuration file: the table of its keys (omv_daemon_table, declared in
 * daemon.h) and reloading it while the daemon runs. */
#pragma once

#include <stddef.h>

#include "daemon.h"

/* Re-reads the config file omnivored was started with and applies what may change while running
 * (log_level; a --log-level flag keeps precedence). A broken file changes nothing. Returns 0 or a
 * negative errno; why[cap] says what was applied, or what was wrong (also logged, and counted in
 * status). */
int omv_daemon_config_reload(omv_daemon_t *d, char *why, size_t cap);
