/* Refusals: a message that does not fit is answered with an Error naming what was wrong,
 * logged (the first few of each kind) and counted for the daemon's whole life. */
#pragma once

#include <stdint.h>

#include "router.h"
#include "wire.h"

typedef struct {
    omv_router_t *router;               /* borrowed: where the answers go */
    uint64_t counts[OMV_REFUSE_COUNT_]; /* by reason */
    uint64_t unanswered;                /* answers dropped: the peer was gone or not reading */
    int quiet; /* logged and counted, not answered (a backup's: its primary answers) */
    /* The latest refusal, as logged ("KIND from WHO: REASON"; empty before the first), kept
     * whole however many of its kind came before, so that status can say why the last one was
     * refused when the log stopped saying it. */
    char last[OMV_WIRE_REASON_MAX + 64];
} omv_refusals_t;

/* Starts counting from zero; answers go out through router (borrowed). */
void omv_refusals_init(omv_refusals_t *self, omv_router_t *router);

/* Answers peer with an Error (code, reason), logs it unless this kind was logged often already,
 * and counts it. who names the peer in the log (quoted by the caller where it came from one). */
void omv_refusals_add(omv_refusals_t *self, const omv_peer_t *peer, omv_refuse_t code,
                      const char *who, const char *reason);

/* Logs and counts a refusal that cannot be answered (a handshake, before any message). */
void omv_refusals_count(omv_refusals_t *self, omv_refuse_t code, const char *who,
                        const char *reason);

/* Every refusal so far, all reasons together. */
uint64_t omv_refusals_total(const omv_refusals_t *self);
