/* Compute groups: a step's shards are applied once all live members pushed them, refusals of bad
 * pushes, members leaving, retiring groups, and the staleness bound across groups. */
#include <check.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "groups.h"
#include "testutil.h"

/* Every event, in order, as text: "apply g/s;", "advance g c;", "retire g;". */
static char events[4096];
static int n_apply, n_advance, n_retire;

__attribute__((format(printf, 1, 2))) static void log_event(const char *fmt, ...)
{
    size_t used = strlen(events);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(events + used, sizeof(events) - used, fmt, ap);
    va_end(ap);
}

static void on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    ck_assert_ptr_eq(ctx, events);
    log_event("apply %u/%u;", group, shard);
    n_apply++;
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    log_event("advance %u %llu;", group, (unsigned long long)clock);
    n_advance++;
}

static void on_retire(void *ctx, uint32_t group)
{
    log_event("retire %u;", group);
    n_retire++;
}

static omv_groups_t *make(uint32_t slots, uint32_t groups, uint32_t shards, int64_t staleness)
{
    omv_groups_events_t ev = {on_apply, on_advance, on_retire, events};
    events[0] = '\0';
    n_apply = n_advance = n_retire = 0;
    omv_groups_t *g = omv_groups_new(slots, groups, shards, staleness, &ev);
    ck_assert_ptr_nonnull(g);
    return g;
}

/* Checks and, when accepted, records a push; returns the verdict. */
static omv_refuse_t push(omv_groups_t *g, uint32_t slot, uint64_t step, uint32_t shard)
{
    char why[OMV_WIRE_REASON_MAX] = "";
    omv_refuse_t r = omv_groups_check_push(g, slot, step, shard, why);
    if (r == OMV_REFUSE_NONE)
        omv_groups_record_push(g, slot, shard);
    else
        ck_assert_msg(why[0] != '\0', "refusal %d without a reason", (int)r);
    return r;
}

static void push_ok(omv_groups_t *g, uint32_t slot, uint64_t step, uint32_t shard)
{
    ck_assert_int_eq(push(g, slot, step, shard), OMV_REFUSE_NONE);
}

/* A whole step of one single-member group over all n_shards. */
static void run_step(omv_groups_t *g, uint32_t slot, uint64_t step, uint32_t n_shards)
{
    for (uint32_t s = 0; s < n_shards; s++)
        push_ok(g, slot, step, s);
}

START_TEST(test_group_of_three)
{
    omv_groups_t *g = make(3, 1, 2, -1);
    for (uint32_t s = 0; s < 3; s++)
        ck_assert_int_eq(omv_groups_join(g, s, 0), 0);
    ck_assert_uint_eq(omv_groups_live(g, 0), 3);
    push_ok(g, 0, 0, 0);
    push_ok(g, 1, 0, 0);
    push_ok(g, 0, 0, 1);
    ck_assert_str_eq(events, ""); /* nothing until all three pushed a shard */
    push_ok(g, 2, 0, 0);
    ck_assert_str_eq(events, "apply 0/0;");
    push_ok(g, 2, 0, 1);
    push_ok(g, 1, 0, 1);
    ck_assert_str_eq(events, "apply 0/0;apply 0/1;advance 0 1;");
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    /* The next step starts clean: the same members may push again, for step 1. */
    for (uint32_t s = 0; s < 3; s++)
        run_step(g, s, 1, 2);
    ck_assert_int_eq(n_apply, 4);
    ck_assert_int_eq(n_advance, 2);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 2);
    omv_groups_destroy(&g);
    ck_assert_ptr_null(g);
}
END_TEST

START_TEST(test_refusals)
{
    omv_groups_t *g = make(4, 1, 2, -1);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0);
    ck_assert_int_eq(omv_groups_join(g, 1, 0), 0);
    push_ok(g, 0, 0, 0);
    ck_assert_int_eq(push(g, 0, 0, 0), OMV_REFUSE_STEP);           /* duplicate */
    ck_assert_int_eq(push(g, 1, 1, 0), OMV_REFUSE_STEP);           /* ahead of the group */
    ck_assert_int_eq(push(g, 2, 0, 0), OMV_REFUSE_UNKNOWN_WORKER); /* empty slot */
    ck_assert_int_eq(push(g, 9, 0, 0), OMV_REFUSE_UNKNOWN_WORKER); /* no such slot */
    ck_assert_int_eq(push(g, 1, 0, 2), OMV_REFUSE_SHAPE);          /* no such shard */
    ck_assert_str_eq(events, "");
    push_ok(g, 1, 0, 0);
    push_ok(g, 0, 0, 1);
    push_ok(g, 1, 0, 1);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    ck_assert_int_eq(push(g, 0, 0, 1), OMV_REFUSE_STEP); /* a step already done */
    ck_assert_int_eq(n_apply, 2);
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_join)
{
    omv_groups_t *g = make(2, 2, 1, -1);
    ck_assert_int_eq(omv_groups_of(g, 0), -1);
    ck_assert_int_eq(omv_groups_join(g, 0, 1), 0);
    ck_assert_int_eq(omv_groups_of(g, 0), 1);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), -EINVAL); /* slot taken */
    ck_assert_int_eq(omv_groups_join(g, 2, 0), -EINVAL);
    ck_assert_int_eq(omv_groups_join(g, 1, 2), -EINVAL);
    ck_assert_int_eq(omv_groups_of(g, 5), -1);
    ck_assert_uint_eq(omv_groups_count(g), 2);
    ck_assert_uint_eq(omv_groups_live(g, 0), 0);
    ck_assert_uint_eq(omv_groups_live(g, 1), 1);
    omv_groups_destroy(&g);
    omv_groups_events_t ev = {0};
    errno = 0;
    ck_assert_ptr_null(omv_groups_new(0, 1, 1, -1, &ev));
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_ptr_null(omv_groups_new(1, 1, 0, -1, &ev));
}
END_TEST

START_TEST(test_leave_before_pushing)
{
    omv_groups_t *g = make(3, 1, 2, -1);
    for (uint32_t s = 0; s < 3; s++)
        omv_groups_join(g, s, 0);
    push_ok(g, 0, 0, 0);
    push_ok(g, 1, 0, 0);
    omv_groups_leave(g, 2); /* the two that pushed shard 0 are all the group waits for now */
    ck_assert_str_eq(events, "apply 0/0;");
    ck_assert_uint_eq(omv_groups_live(g, 0), 2);
    ck_assert_int_eq(omv_groups_of(g, 2), -1);
    ck_assert_int_eq(push(g, 2, 0, 1), OMV_REFUSE_UNKNOWN_WORKER);
    push_ok(g, 0, 0, 1);
    push_ok(g, 1, 0, 1);
    ck_assert_str_eq(events, "apply 0/0;apply 0/1;advance 0 1;");
    omv_groups_leave(g, 2); /* leaving twice changes nothing */
    ck_assert_uint_eq(omv_groups_live(g, 0), 2);
    ck_assert_int_eq(n_retire, 0);
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_leave_after_others_pushed)
{
    omv_groups_t *g = make(3, 1, 2, -1);
    for (uint32_t s = 0; s < 3; s++)
        omv_groups_join(g, s, 0);
    run_step(g, 0, 0, 2);
    run_step(g, 1, 0, 2);
    ck_assert_str_eq(events, "");
    omv_groups_leave(g, 2); /* the last one missing goes: the step completes at once */
    ck_assert_str_eq(events, "apply 0/0;apply 0/1;advance 0 1;");
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_leave_after_own_push)
{
    /* A member that pushed a shard and then died: its gradient stays in the sum (the shard's
     * business, not this object's), and its push does not stand in for another member's. */
    omv_groups_t *g = make(3, 1, 1, -1);
    for (uint32_t s = 0; s < 3; s++)
        omv_groups_join(g, s, 0);
    push_ok(g, 2, 0, 0);
    omv_groups_leave(g, 2);
    push_ok(g, 0, 0, 0);
    ck_assert_str_eq(events, "");
    push_ok(g, 1, 0, 0);
    ck_assert_str_eq(events, "apply 0/0;advance 0 1;");
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_retire)
{
    omv_groups_t *g = make(3, 2, 1, 0);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 0);
    omv_groups_join(g, 2, 1);
    omv_groups_leave(g, 2);
    ck_assert_str_eq(events, "retire 1;");
    ck_assert_uint_eq(omv_groups_live(g, 1), 0);
    omv_groups_leave(g, 0);
    ck_assert_int_eq(n_retire, 1); /* group 0 still has a member */
    omv_groups_leave(g, 1);
    ck_assert_str_eq(events, "retire 1;retire 0;");
    ck_assert(omv_groups_min_clock(g) == UINT64_MAX);
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_lock_step)
{
    omv_groups_t *g = make(2, 2, 2, 0);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 1);
    ck_assert(omv_groups_may_begin(g, 0, 0));
    ck_assert(omv_groups_may_begin(g, 1, 0));
    run_step(g, 0, 0, 2);
    ck_assert(!omv_groups_may_begin(g, 0, 1)); /* group 1 has not finished step 0 */
    ck_assert(!omv_groups_may_begin(g, 0, 0)); /* already done */
    ck_assert(!omv_groups_may_begin(g, 0, 2));
    ck_assert(omv_groups_may_begin(g, 1, 0));
    run_step(g, 1, 0, 2);
    ck_assert(omv_groups_may_begin(g, 0, 1));
    ck_assert(omv_groups_may_begin(g, 1, 1));
    ck_assert(!omv_groups_may_begin(g, 2, 0)); /* no such group */
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_bounded_staleness)
{
    omv_groups_t *g = make(2, 2, 1, 2);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 1);
    for (uint64_t step = 0; step < 3; step++) {
        ck_assert_msg(omv_groups_may_begin(g, 0, step), "step %llu", (unsigned long long)step);
        run_step(g, 0, step, 1);
    }
    /* Group 0 began step 2 while group 1 was at step 0: two ahead. Step 3 waits. */
    ck_assert(!omv_groups_may_begin(g, 0, 3));
    run_step(g, 1, 0, 1);
    ck_assert(omv_groups_may_begin(g, 0, 3));
    run_step(g, 0, 3, 1);
    ck_assert(!omv_groups_may_begin(g, 0, 4));
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_unbounded)
{
    omv_groups_t *g = make(2, 2, 1, -1);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 1);
    for (uint64_t step = 0; step < 50; step++) {
        ck_assert(omv_groups_may_begin(g, 0, step));
        run_step(g, 0, step, 1);
    }
    ck_assert_uint_eq(omv_groups_clock(g, 0), 50);
    ck_assert_uint_eq(omv_groups_clock(g, 1), 0);
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_dead_group_does_not_block)
{
    omv_groups_t *g = make(3, 3, 1, 0);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 1);
    /* Group 2 never got a member; group 1 loses its only one. */
    run_step(g, 0, 0, 1);
    ck_assert(!omv_groups_may_begin(g, 0, 1));
    omv_groups_leave(g, 1);
    ck_assert(omv_groups_may_begin(g, 0, 1));
    omv_groups_destroy(&g);
}
END_TEST

START_TEST(test_min_clock)
{
    omv_groups_t *g = make(2, 2, 1, -1);
    ck_assert(omv_groups_min_clock(g) == UINT64_MAX);
    omv_groups_join(g, 0, 0);
    omv_groups_join(g, 1, 1);
    ck_assert_uint_eq(omv_groups_min_clock(g), 0);
    run_step(g, 0, 0, 1);
    run_step(g, 0, 1, 1);
    ck_assert_uint_eq(omv_groups_min_clock(g), 0);
    for (uint64_t s = 0; s < 5; s++)
        run_step(g, 1, s, 1);
    ck_assert_uint_eq(omv_groups_min_clock(g), 2);
    omv_groups_leave(g, 0); /* a retired group no longer counts */
    ck_assert_uint_eq(omv_groups_min_clock(g), 5);
    omv_groups_destroy(&g);
}
END_TEST

static Suite *groups_suite(void)
{
    Suite *s = suite_create("groups");
    TCase *tc = tcase_create("steps");
    tcase_add_test(tc, test_group_of_three);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_join);
    tcase_add_test(tc, test_leave_before_pushing);
    tcase_add_test(tc, test_leave_after_others_pushed);
    tcase_add_test(tc, test_leave_after_own_push);
    tcase_add_test(tc, test_retire);
    suite_add_tcase(s, tc);
    tc = tcase_create("staleness");
    tcase_add_test(tc, test_lock_step);
    tcase_add_test(tc, test_bounded_staleness);
    tcase_add_test(tc, test_unbounded);
    tcase_add_test(tc, test_dead_group_does_not_block);
    tcase_add_test(tc, test_min_clock);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(groups_suite());
}
