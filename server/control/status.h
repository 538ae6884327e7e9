/* Read-only formatters of the daemon's state for the control socket (key:value sections, or
 * JSON) and systemd's STATUS= line. They change nothing. */
#pragma once

#include "daemon_priv.h"
#include "strbuf.h"

void omv_status_status(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_workers(const omv_daemon_t *d, omv_strbuf_t *out, int json);
/* The shard servers: a coordinator's, each with its part, role and traffic; a shard server's
 * own link to its coordinator. */
void omv_status_servers(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_groups(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_summary(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_jobs(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_history(const omv_daemon_t *d, omv_strbuf_t *out, int json);
void omv_status_optimizer(const omv_daemon_t *d, omv_strbuf_t *out, int json);
/* Prometheus text exposition format 0.0.4. */
void omv_status_metrics(const omv_daemon_t *d, omv_strbuf_t *out);
/* Sends systemd a one-line STATUS= (state, epoch, step, images/s, workers); rate-limited in
 * notify.c, so it may be called from every cron tick. */
void omv_status_notify(const omv_daemon_t *d);
