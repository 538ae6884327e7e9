/* Which job runs: loading a job as the daemon's run (destroy + new), starting the next queued
 * one when the current is over, and recording how each one ended. */
#pragma once

#include "daemon_priv.h"

/* Makes q's job the current run (q is taken). Idle members are told to register again, into
 * it. Returns 0, or a negative errno after logging why (no job is loaded then). */
int omv_schedule_load(omv_daemon_t *d, omv_queued_job_t *q, int submitted);

/* From the loop: records the current job's end once, and loads the next queued job that loads
 * when the current one is over; writes jobs.queue when it changed. */
void omv_schedule_poll(omv_daemon_t *d);
