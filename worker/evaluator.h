/* An evaluator's loop: each snapshot of the model the daemon (or its shard servers) sends is
 * evaluated on the test set, and the result goes back. */
#pragma once

typedef struct omv_session omv_session_t;

/* Evaluates what comes until the daemon says stop. Returns OMV_WAIT_DONE, OMV_WAIT_LOST
 * (register again) or a negative errno. */
int omv_evaluator_run(omv_session_t *s);
