/*
 * test_spin.c -- the idle worker that polls for work before it sleeps, and
 * which sleeping worker a task wakes.
 *
 * One idle worker at a time spins for a few microseconds before it parks
 * (engine.c: on its own semaphore, on a stack of parked workers), and a
 * submitter does not wake anyone while it spins. The risk of that shortcut is a lost wake-up: a task
 * pushed just as the spinner gives up, or a second task pushed while the
 * spinner takes the first, with the other workers asleep. These tests submit
 * with gaps spread across the spin window (engine.c, TP__SPIN_NS: 2 us; gaps
 * of 0 to ~6 us, and in the last test 1 ms, after which every worker has
 * parked) so submits land
 * before, during and after it, and require every task to start within a
 * bound; they also check that `idle` counts the spinning worker.
 */
#include "tp_test.h"

#include <sched.h>

static atomic_long ran;

static int count_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return 0;
}

/* Busy-wait for about `ns` (a gap between submits, not a synchronisation). */
static void gap(uint64_t ns) {
    uint64_t until = tp_now_ns() + ns;
    while (tp_now_ns() < until) sched_yield();
}

/* One task at a time into an idle pool: each must be picked up whether it
 * arrives while a worker spins, as the spin ends, or after every worker sleeps. */
static void test_single_tasks_across_the_spin_window(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 8;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    atomic_store(&ran, 0);
    const long n = TPT_SANITIZED ? 600 : 3000;
    for (long i = 0; i < n; i++) {
        gap((uint64_t)(i % 61) * 100u);
        assert_int_equal(tp_submit(p, count_task, NULL, NULL, NULL), TP_OK);
        assert_true(TPT_POLL(atomic_load(&ran) == i + 1, TPT_WAIT_NS));
    }
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, (uint64_t)n);
}

/* Bursts of two: while the spinner takes the first task, the second must
 * reach a sleeping worker (or the spinner after it), never wait for a
 * wake-up that nobody sends. The first task of each burst blocks until the
 * second has run, so one worker cannot serve both. */
typedef struct pair {
    tpt_latch second_ran;
} pair;

static int first_task(tp_ctx *c, void *arg) {
    (void)c;
    tpt_latch_wait(&((pair *)arg)->second_ran);
    atomic_fetch_add(&ran, 1);
    return 0;
}

static int second_task(tp_ctx *c, void *arg) {
    (void)c;
    atomic_fetch_add(&ran, 1);
    tpt_latch_open(&((pair *)arg)->second_ran);
    return 0;
}

static void test_bursts_reach_a_second_worker(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 8;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    atomic_store(&ran, 0);
    const long n = TPT_SANITIZED ? 300 : 1500;
    pair *pr = tpt_fx_new(f, pair); /* the pool's tasks use it: not on this stack */
    for (long i = 0; i < n; i++) {
        tpt_latch_init(&pr->second_ran);
        gap((uint64_t)(i % 61) * 100u);
        assert_int_equal(tp_submit(p, first_task, pr, NULL, NULL), TP_OK);
        gap((uint64_t)(i % 7) * 300u);
        assert_int_equal(tp_submit(p, second_task, pr, NULL, NULL), TP_OK);
        assert_true(TPT_POLL(atomic_load(&ran) == 2 * (i + 1), TPT_WAIT_NS));
        /* the first task's latch wait returned: it waited for the second */
        assert_int_equal(atomic_load(&pr->second_ran.timeouts), 0);
        assert_true(TPT_POLL(atomic_load(&pr->second_ran.waiting) == 0, TPT_WAIT_NS));
        tpt_latch_destroy(&pr->second_ran);
    }
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, (uint64_t)(2 * n));
}

/* An idle pool reports every worker idle, the spinning one included. */
static void test_idle_counts_the_spinner(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 3;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    for (int round = 0; round < 50; round++) {
        atomic_store(&ran, 0);
        assert_int_equal(tp_submit(p, count_task, NULL, NULL, NULL), TP_OK);
        assert_true(TPT_POLL(atomic_load(&ran) == 1, TPT_WAIT_NS));
        /* Whether the worker spins or sleeps, it is idle once its task ended. */
        assert_true(TPT_POLL(tpt_stats(p).idle == 3 && tpt_stats(p).active == 0, TPT_WAIT_NS));
        tp_stats s = tpt_stats(p);
        assert_int_equal(s.workers, 3);
        assert_true(s.idle <= s.workers);
    }
    tpt_finish(p);
}

/* One task at a time into an idle pool runs on the worker that went idle
 * last, whether it still spins or has parked (the top of the stack): the
 * warm worker, and one wake-up per task, not a different sleeper each time.
 * The first task only settles the pool (at start one worker may spin while
 * another runs, and the spinner takes the next task); after it, every
 * worker parks (1 ms), and from then on the gaps put each submit inside the
 * spin window or well after it. */
static pthread_t ran_on[64];
static int where_task(tp_ctx *c, void *arg) {
    (void)c;
    ran_on[(intptr_t)arg] = pthread_self();
    atomic_fetch_add(&ran, 1);
    return 0;
}

static void test_single_tasks_run_on_the_last_idle_worker(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 4;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    atomic_store(&ran, 0);
    for (intptr_t i = 0; i < 64; i++) {
        assert_int_equal(tp_submit(p, where_task, (void *)i, NULL, NULL), TP_OK);
        assert_true(TPT_POLL(atomic_load(&ran) == i + 1, TPT_WAIT_NS));
        assert_true(TPT_POLL(tpt_stats(p).idle == 4 && tpt_stats(p).active == 0, TPT_WAIT_NS));
        gap(i == 0 || i % 4 == 3 ? TPT_MS(1) : (uint64_t)(i % 4) * 600); /* 1 ms, or 0.6 or 1.2 us */
    }
    /* A worker the scheduler left mid-spin (a slow or loaded machine, a
     * sanitizer) can still take one task before it parks, so the check
     * counts changes of worker rather than asking for none: a pool that
     * woke its sleepers in turn (or any other than the last idle) changes
     * worker on most of the 62 steps, the stack on none, or a few. */
    int changes = 0;
    for (int i = 2; i < 64; i++)
        if (!pthread_equal(ran_on[i], ran_on[i - 1])) changes++;
    assert_in_range(changes, 0, 4);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_single_tasks_across_the_spin_window),
        TPT_TEST(test_bursts_reach_a_second_worker),
        TPT_TEST(test_idle_counts_the_spinner),
        TPT_TEST(test_single_tasks_run_on_the_last_idle_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
