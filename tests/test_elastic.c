/*
 * test_elastic.c -- elastic workers and the service thread under pressure.
 *
 * Covers: a retry that returns to the queue while every worker is busy adds
 * exactly one worker, even when new threads are slow to start (the service
 * thread must count threads still starting, not spawn until max_workers);
 * tp_submit_wait() called from an on_done on the service thread does not wait
 * (waiting would stall the timers and endings that free room).
 */
#include "tp_test.h"

static atomic_int starts;
static atomic_int slow_starts; /* starts beyond this many take 50 ms */

static void counting_start(void *arg) {
    (void)arg;
    int n = atomic_fetch_add(&starts, 1) + 1;
    if (n > atomic_load(&slow_starts)) {
        /* A slow thread start is the load condition under test, not a way to
         * wait for a state. */
        tpt_sleep_ns(TPT_MS(50) * tpt_slowdown());
    }
}

/* The test must fill the third worker before the retry comes back, within
 * the retry delay `delay`: a window, not a wait. 30 ms was missed once on a
 * 2-CPU machine at load average 11; the scenario now sees whether it was in
 * time and, if not, runs again with twice the delay (tpt_with_time_to_spare). */
static bool retry_into_busy_pool(tpt_fixture *f, uint64_t delay, void *arg) {
    tpt_latch *gate = arg;
    tpt_latch_rearm(gate);
    atomic_store(&starts, 0);
    atomic_store(&slow_starts, 3);
    tp_config cfg = {0};
    cfg.workers = 3;
    cfg.max_workers = 16;
    cfg.max_retries = 1;
    cfg.retry_delay_ns = delay;
    cfg.idle_timeout_ns = TP_FOREVER;
    cfg.on_worker_start = counting_start;
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    TPT_EVENTUALLY(tpt_stats(p).idle == 3);

    for (int i = 0; i < 2; i++) assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 2);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {.on_done = tpt_done_fn};
    assert_int_equal(tp_submit(p, tpt_fail_once_task, d, &o, NULL), TP_OK);
    /* Wait for the third worker to be idle again, not only for the retry to
     * be scheduled: a submit that finds it still finishing the failed attempt
     * sees a backlog and no idle worker, and rightly adds a worker itself. */
    tp_stats s;
    bool in_time = TPT_POLL(((s = tpt_stats(p)).delayed == 1 && s.idle == 1) || atomic_load(&d->calls) == 1,
                            TPT_WAIT_NS) &&
                   s.delayed == 1 && s.idle == 1;
    /* the third worker is busy too when the retry comes back: the retry
     * still waited when the blocker was seen running */
    if (in_time) {
        assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&gate->waiting) == 3 || atomic_load(&d->calls) == 1);
        in_time = atomic_load(&gate->waiting) == 3 && tpt_stats(p).delayed == 1;
    }
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    assert_int_equal(atomic_load(&d->status), 0);
    if (in_time) {
        assert_int_equal(atomic_load(&starts), 4); /* exactly one more worker */
        assert_true(tpt_stats(p).workers <= 4);
    }
    tpt_latch_open(gate);
    s = tpt_finish(p);
    assert_int_equal(s.retried, 1);
    if (in_time) assert_int_equal(atomic_load(&starts), 4);
    return in_time;
}

static void test_retry_spawns_one_worker(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_with_time_to_spare(f, TPT_MS(300) * tpt_slowdown(), retry_into_busy_pool, tpt_fx_latch(f));
}

typedef struct svc_probe {
    tp_pool *pool;
    atomic_int rc;
    atomic_int returned;
} svc_probe;

static void probe_done(void *arg, int status) {
    svc_probe *pr = (svc_probe *)arg;
    (void)status;
    tp_task_opts o = {.user = "u"};
    /* "u" is at its limit: a waiting submit would need the blocked task to
     * end; here it must give up at once instead of stalling the service
     * thread for its whole (unlimited) budget. */
    atomic_store(&pr->rc, tp_submit_wait(pr->pool, tpt_nop_task, NULL, &o, TP_FOREVER, NULL));
    atomic_store(&pr->returned, 1);
}

static void test_submit_wait_on_service_thread_does_not_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {.workers = 1, .max_per_user = 1};
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    tp_task_opts bo = {.user = "u"};
    assert_int_equal(tp_submit(p, tpt_block_task, gate, &bo, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    svc_probe *pr = tpt_fx_new(f, svc_probe);
    pr->pool = p;
    atomic_init(&pr->rc, 1);
    tp_task_opts xo = {.user = "v", .on_done = probe_done};
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, pr, &xo, &id), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_OK); /* its on_done runs on the service thread */
    TPT_EVENTUALLY(atomic_load(&pr->returned) == 1);
    assert_int_equal(atomic_load(&pr->rc), TP_ETIMEDOUT);
    assert_int_equal(tpt_stats(p).rejected_timeout, 1);
    tpt_latch_open(gate);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_retry_spawns_one_worker),
        TPT_TEST(test_submit_wait_on_service_thread_does_not_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
