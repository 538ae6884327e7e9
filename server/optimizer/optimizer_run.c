/* The optimizer's current run (a probe or a phase): its steps per group, the ring of its
 * latest losses, its timing, whether it diverged, and the command that starts it. */
#include "optimizer_priv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void omv_opt_run_reset(omv_optimizer_t *self, double now_s, uint32_t budget)
{
    self->budget = budget;
    self->run_start_s = now_s;
    memset(self->steps, 0, sizeof(*self->steps) * self->p.workers);
    self->n_reached = self->n_warm = 0;
    self->t0 = self->t_last = 0.0;
    self->timed = self->timed_images = 0;
    self->n_obs = 0;
    self->first_loss = NAN;
    self->ref_sum = 0.0;
    self->ref_n = 0;
}

/* Mean of the newest k losses. */
double omv_opt_ring_mean(const omv_optimizer_t *self, uint64_t k)
{
    if (k > self->n_obs)
        k = self->n_obs;
    if (k > self->ring_cap)
        k = self->ring_cap;
    if (k == 0)
        return NAN;
    double sum = 0.0;
    for (uint64_t i = 0; i < k; i++)
        sum += self->ring[(self->n_obs - 1 - i) % self->ring_cap];
    return sum / (double)k;
}

/* The standard error of ring_mean(self, k): the sample deviation of those losses over sqrt(k).
 * Neighbouring losses are not independent (they share a trend), which only makes it larger. */
double omv_opt_ring_se(const omv_optimizer_t *self, uint64_t k)
{
    if (k > self->n_obs)
        k = self->n_obs;
    if (k > self->ring_cap)
        k = self->ring_cap;
    if (k < 2)
        return NAN;
    double mean = omv_opt_ring_mean(self, k), ss = 0.0;
    for (uint64_t i = 0; i < k; i++) {
        double dv = self->ring[(self->n_obs - 1 - i) % self->ring_cap] - mean;
        ss += dv * dv;
    }
    return sqrt(ss / (double)(k - 1) / (double)k);
}

/* Seconds per iteration (one group step) of the whole system, after every group's warm-up. */
double omv_opt_run_spi(const omv_optimizer_t *self)
{
    return self->timed > 0 ? (self->t_last - self->t0) / (double)self->timed : NAN;
}

double omv_opt_run_images_per_s(const omv_optimizer_t *self)
{
    double dt = self->t_last - self->t0;
    return self->timed > 0 && dt > 0.0 ? (double)self->timed_images / dt : NAN;
}

/* Steps of the run's slowest group. */
uint32_t omv_opt_run_slowest(const omv_optimizer_t *self)
{
    uint32_t slowest = UINT32_MAX;
    for (uint32_t k = 0; k < self->g && k < self->p.workers; k++)
        slowest = self->steps[k] < slowest ? self->steps[k] : slowest;
    return slowest == UINT32_MAX ? 0 : slowest;
}

/* The divergence window of the current run. */
uint32_t omv_opt_run_window(const omv_optimizer_t *self)
{
    return self->state == OMV_OPT_STATE_RUNNING ? self->p.phase_diverge_window
                                                : self->p.diverge_window;
}

/* Whether the run diverged with this newest loss (already in the ring): a loss that is not
 * finite, or the mean of the latest window above diverge_factor x the mean of the first. */
bool omv_opt_run_diverged(const omv_optimizer_t *self, double loss, char *reason, size_t cap)
{
    uint32_t w = omv_opt_run_window(self);
    if (!isfinite(loss)) {
        snprintf(reason, cap, "loss %g is not finite", loss);
        return true;
    }
    if (self->n_obs <= w || self->ref_n == 0)
        return false;
    double first = self->ref_sum / self->ref_n, recent = omv_opt_ring_mean(self, w);
    if (recent <= self->p.diverge_factor * first)
        return false;
    snprintf(reason, cap, "mean of the last %u losses %.4g > %g x the first %u's %.4g", w, recent,
             self->p.diverge_factor, w, first);
    return true;
}

/* Starts configuration generation gen + 1 with the given flags (SET always among them). A
 * command that was not polled yet is replaced, keeping what it asked of the probe base: a
 * SNAPSHOT still to be taken makes a RESTORE needless (the base is the model as it is). */
void omv_opt_issue(omv_optimizer_t *self, unsigned flags, uint32_t g, double momentum, double lr,
                   double now_s, uint32_t budget)
{
    if (self->has_cmd) {
        unsigned keep = OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_RESTORE;
        if (!(flags & OMV_OPT_CMD_PROBE))
            keep |= OMV_OPT_CMD_DONE_SEARCH;
        flags |= self->cmd.flags & keep;
        if (flags & OMV_OPT_CMD_SNAPSHOT)
            flags &= ~(unsigned)OMV_OPT_CMD_RESTORE;
    }
    self->gen++;
    self->cmd = (omv_opt_cmd_t){flags, self->gen, g, momentum, lr};
    self->has_cmd = true;
    if (flags & OMV_OPT_CMD_SET) {
        self->g = g;
        self->momentum = momentum;
        self->lr = lr;
    }
    omv_opt_run_reset(self, now_s, budget);
}
