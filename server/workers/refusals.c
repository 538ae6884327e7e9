/* Refusals: answered, logged while they are few, counted. */
#define OMV_LOG_TAG "daemon"
#include "refusals.h"

#include <stdio.h>

#include "log.h"

/* Refusals of one kind logged before the rest are only counted. */
#define REFUSALS_LOGGED 10

void omv_refusals_init(omv_refusals_t *self, omv_router_t *router)
{
    *self = (omv_refusals_t){.router = router};
}

void omv_refusals_count(omv_refusals_t *self, omv_refuse_t code, const char *who,
                        const char *reason)
{
    uint64_t n = ++self->counts[code];
    snprintf(self->last, sizeof(self->last), "%s from %s: %s", omv_refuse_name(code), who, reason);
    for (char *c = self->last; *c; c++) /* one line of status, whatever the reason held */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    if (n <= REFUSALS_LOGGED)
        omv_log_warn("refused %s%s", self->last,
                     n == REFUSALS_LOGGED ? " (further refusals of this kind are only counted)"
                                          : "");
}

void omv_refusals_add(omv_refusals_t *self, const omv_peer_t *peer, omv_refuse_t code,
                      const char *who, const char *reason)
{
    omv_refusals_count(self, code, who, reason);
    if (self->quiet)
        return;
    omv_msg_t e;
    omv_wire_error(&e, code, "%s", reason);
    /* A peer that floods without reading fills its queue (OMV_ROUTER_HWM): its answers are then
     * dropped and counted, and cost nothing more. */
    if (omv_router_send(self->router, peer, &e, NULL) < 0)
        self->unanswered++;
}

uint64_t omv_refusals_total(const omv_refusals_t *self)
{
    uint64_t total = 0;
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++)
        total += self->counts[i];
    return total;
}
