/* Evaluations: the model sent to the job's evaluator as an evaluation comes due (its result
 * comes back to the job's life, lifecycle.c). */
#define OMV_LOG_TAG "daemon"
#include "run_priv.h"

void omv_run_request_eval(omv_run_t *r)
{
    omv_eval_t *ev = &r->eval;
    if (ev->evaluator == 0)
        return;
    if (ev->busy) {
        ev->wanted = 1;
        return;
    }
    omv_member_t *m = omv_members_get(r->env.members, ev->evaluator);
    int final = r->state == OMV_JOB_FINISHING;
    /* A role whose model is not here evaluates it where it is, or once it is here. */
    if (r->role && r->role->evaluate && r->role->evaluate(r, m, final))
        return;
    if (omv_shardset_gather(r->shards, 0) < 0)
        return;
    omv_eval_send(ev, r->env.router, &m->peer, r->shards->gather_params,
                  (uint32_t)r->layout.param_count, omv_run_epoch(r), omv_run_train_seconds(r),
                  final);
}
