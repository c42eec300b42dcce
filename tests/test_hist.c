/*
 * test_hist.c -- latency histograms (header section 12).
 *
 * Covers: the bucket bounds (strictly rising, 128 ns first, at most 12.5 %
 * apart from there to past 1 hour, UINT64_MAX last, 0 out of range) and the
 * recording index against them for values at, just below and just above
 * every bound; tp_hist_quantile_ns (empty, q at 0, 1, out of range and NaN,
 * exact bucket boundaries of the cumulative count); counts at rest equal
 * started + retried under retries, cancellations and expiries (tasks that
 * never ran record nothing); what is recorded (a run of at least 2 ms lands
 * at or above 2 ms, a queue wait of at least 5 ms likewise); snapshots taken
 * while tasks run always have sum(buckets) == count, counts that never
 * decrease and a sum that never exceeds count x the highest bound used;
 * every submit path (tp_submit, tp_submit_wait, tp_submit_batch,
 * tp_group_submit) stamps admission on the histograms' clock; invalid
 * arguments.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>

#include "tp_test.h"
#include "pool.h" /* tp__hist_index: the recording side of the bounds */

static uint64_t hist_sum(const tp_hist *h) {
    uint64_t n = 0;
    for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) n += h->buckets[i];
    return n;
}

static void test_hist_bounds(void **state) {
    (void)state;
    assert_int_equal(tp_hist_bound_ns(0), 128);
    assert_true(tp_hist_bound_ns(TP_HIST_BUCKETS - 1) == UINT64_MAX);
    assert_true(tp_hist_bound_ns(TP_HIST_BUCKETS) == 0);
    assert_true(tp_hist_bound_ns(UINT_MAX) == 0);
    const uint64_t hour = 3600ull * 1000000000ull;
    bool reached_hour = false;
    for (unsigned i = 1; i < TP_HIST_BUCKETS; i++) {
        uint64_t a = tp_hist_bound_ns(i - 1), b = tp_hist_bound_ns(i);
        assert_true(b > a); /* strictly rising */
        if (i < TP_HIST_BUCKETS - 1) {
            /* b <= 1.125 a, in integers: 8 b <= 9 a */
            if (8 * b > 9 * a)
                fail_msg("bound %u (%llu) is more than 12.5 %% above bound %u (%llu)", i,
                         (unsigned long long)b, i - 1, (unsigned long long)a);
        }
        if (a >= hour) reached_hour = true;
    }
    assert_true(reached_hour);
    assert_true(tp_hist_bound_ns(TP_HIST_BUCKETS - 2) >= hour);
}

/* The recording index puts v in the bucket whose bound is the smallest >= v. */
static void check_index(uint64_t v) {
    unsigned i = tp__hist_index(v);
    assert_true(i < TP_HIST_BUCKETS);
    if (v > tp_hist_bound_ns(i))
        fail_msg("value %llu recorded in bucket %u with bound %llu", (unsigned long long)v, i,
                 (unsigned long long)tp_hist_bound_ns(i));
    if (i > 0 && v <= tp_hist_bound_ns(i - 1))
        fail_msg("value %llu recorded in bucket %u, but bucket %u (bound %llu) holds it",
                 (unsigned long long)v, i, i - 1, (unsigned long long)tp_hist_bound_ns(i - 1));
}

static void test_hist_index_matches_bounds(void **state) {
    (void)state;
    check_index(0);
    check_index(1);
    check_index(UINT64_MAX);
    for (unsigned i = 0; i + 1 < TP_HIST_BUCKETS; i++) {
        uint64_t b = tp_hist_bound_ns(i);
        check_index(b - 1);
        check_index(b);
        check_index(b + 1);
    }
    uint32_t seed = 12345;
    for (int k = 0; k < 200000; k++) {
        uint64_t v = ((uint64_t)tpt_xorshift(&seed) << 32) | tpt_xorshift(&seed);
        v >>= tpt_xorshift(&seed) % 64;
        check_index(v);
    }
}

static void test_hist_quantile(void **state) {
    (void)state;
    static tp_hist h;
    memset(&h, 0, sizeof h);
    assert_true(tp_hist_quantile_ns(NULL, 0.5) == 0);
    assert_true(tp_hist_quantile_ns(&h, 0.5) == 0); /* empty */
    /* 10 observations: 4 in bucket 3, 5 in bucket 10, 1 in the last */
    h.buckets[3] = 4;
    h.buckets[10] = 5;
    h.buckets[TP_HIST_BUCKETS - 1] = 1;
    h.count = 10;
    assert_true(tp_hist_quantile_ns(&h, 0.0) == tp_hist_bound_ns(0));
    assert_true(tp_hist_quantile_ns(&h, -1.0) == tp_hist_bound_ns(0));
    assert_true(tp_hist_quantile_ns(&h, NAN) == tp_hist_bound_ns(0));
    assert_true(tp_hist_quantile_ns(&h, 0.1) == tp_hist_bound_ns(3));
    assert_true(tp_hist_quantile_ns(&h, 0.4) == tp_hist_bound_ns(3)); /* exactly 4 of 10 */
    assert_true(tp_hist_quantile_ns(&h, 0.41) == tp_hist_bound_ns(10));
    assert_true(tp_hist_quantile_ns(&h, 0.5) == tp_hist_bound_ns(10));
    assert_true(tp_hist_quantile_ns(&h, 0.9) == tp_hist_bound_ns(10)); /* exactly 9 of 10 */
    assert_true(tp_hist_quantile_ns(&h, 0.91) == UINT64_MAX);
    assert_true(tp_hist_quantile_ns(&h, 1.0) == UINT64_MAX);
    assert_true(tp_hist_quantile_ns(&h, 7.0) == UINT64_MAX);
    /* a count the buckets do not hold: not a snapshot of ours */
    h.count = 100;
    assert_true(tp_hist_quantile_ns(&h, 0.5) == UINT64_MAX);
    /* one observation */
    memset(&h, 0, sizeof h);
    h.buckets[0] = 1;
    h.count = 1;
    assert_true(tp_hist_quantile_ns(&h, 0.5) == 128);
    assert_true(tp_hist_quantile_ns(&h, 1.0) == 128);
}

static void test_hist_invalid(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    static tp_hist h;
    memset(&h, 0x5a, sizeof h);
    assert_int_equal(tp_hist_get(NULL, TP_HIST_RUN, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, TP_HIST_RUN, NULL), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, 2, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, -1, &h), TP_EINVAL);
    /* each side of the lanes' range, and the ends of int (no overflow: UBSan) */
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MIN) - 1, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MAX) + 1, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, INT_MIN, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, INT_MIN + 15, &h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, INT_MAX, &h), TP_EINVAL);
    assert_true(h.count == 0x5a5a5a5a5a5a5a5aull); /* untouched */
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MIN), &h), TP_OK);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MAX), &h), TP_OK);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT, &h), TP_OK);
    assert_true(h.count == 0 && h.sum_ns == 0 && hist_sum(&h) == 0);
    tpt_finish(p);
}

/* ------------------------------------------------------------ exact at rest */

/* At rest both counts equal started + retried, exactly, with retries,
 * cancellations and expiries in the mix (tasks that never ran record
 * nothing). tpt_finish destroys the pool: this one keeps it to read. */
static void test_hist_exact_after_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 256;
    cfg.max_retries = 2;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    for (uintptr_t i = 0; i < 200; i++)
        assert_int_equal(tp_submit_wait(p, tpt_fail_attempts_task, (void *)(i % 4), NULL, TPT_WAIT_NS, NULL),
                         TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).completed == 200); /* retries included: then the queue stays still */
    tpt_fill_workers(p, l, 2, NULL);
    for (int i = 0; i < 30; i++) {
        tp_task_opts o = {0};
        uint64_t id;
        if (i % 3 == 0) o.deadline_ns = 1; /* expires unrun */
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, &id), TP_OK);
        if (i % 3 == 1) assert_int_equal(tp_cancel(p, id), TP_OK); /* queued behind the latch */
    }
    tpt_latch_open(l);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_true(s.retried > 0 && s.cancelled > 0 && s.expired > 0);
    static tp_hist q, r;
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT, &q), TP_OK);
    assert_int_equal(tp_hist_get(p, TP_HIST_RUN, &r), TP_OK);
    assert_int_equal(q.count, s.started + s.retried);
    assert_int_equal(r.count, s.started + s.retried);
    assert_int_equal(hist_sum(&q), q.count);
    assert_int_equal(hist_sum(&r), r.count);
    /* the tasks queued behind the latch waited, and the tasks ran: both
     * sums are above zero */
    assert_true(q.sum_ns > 0 && r.sum_ns > 0);
    tpt_destroy(p);
}

/* ------------------------------------------------------------ what is recorded */

static int sleep_task(tp_ctx *c, void *arg) {
    (void)arg;
    tpt_sleep_ns(TPT_MS(2));
    (void)c;
    return 0;
}

static void test_hist_records_run_and_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.queue_capacity = 8;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    /* run >= 2 ms */
    assert_int_equal(tp_submit(p, sleep_task, NULL, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).completed == 1);
    static tp_hist h;
    assert_int_equal(tp_hist_get(p, TP_HIST_RUN, &h), TP_OK);
    assert_int_equal(h.count, 1);
    assert_true(h.sum_ns >= TPT_MS(2));
    assert_true(tp_hist_quantile_ns(&h, 1.0) >= TPT_MS(2));
    /* a queue wait >= 5 ms: held behind the latch */
    tpt_fill_workers(p, l, 1, NULL);
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    tpt_sleep_until(t0 + TPT_MS(5));
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == 3);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT, &h), TP_OK);
    assert_int_equal(h.count, 3);
    assert_true(tp_hist_quantile_ns(&h, 1.0) >= TPT_MS(5));
    assert_true(h.sum_ns >= TPT_MS(5));
    tpt_finish(p);
}

/* ------------------------------------------------------------ every submit path */

/* Each way in stamps admission on the histograms' clock: a stamp from another
 * clock (CLOCK_MONOTONIC where the TSC is used) would make a queue wait of
 * years or of zero. Every wait recorded here lies inside the interval the
 * test measured around the submission and the completion. */

enum { PATH_SUBMIT, PATH_WAIT, PATH_BATCH, PATH_GROUP, PATHS };

static void test_hist_every_submit_path_on_one_clock(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int path = 0; path < PATHS; path++) {
        tp_config cfg = {0};
        cfg.workers = 1;
        cfg.queue_capacity = 64;
        tp_pool *p = tpt_fx_pool(f, &cfg);
        tp_group *g = NULL;
        if (path == PATH_GROUP) assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
        enum { N = 16 };
        uint64_t t0 = tp_now_ns();
        if (path == PATH_BATCH) {
            tp_task tasks[N];
            memset(tasks, 0, sizeof tasks);
            for (int i = 0; i < N; i++) tasks[i].fn = tpt_nop_task;
            size_t acc = 0;
            assert_int_equal(tp_submit_batch(p, tasks, N, NULL, &acc), TP_OK);
            assert_int_equal(acc, N);
        } else {
            for (int i = 0; i < N; i++) {
                int rc = path == PATH_SUBMIT ? tp_submit(p, tpt_nop_task, NULL, NULL, NULL)
                         : path == PATH_WAIT ? tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_WAIT_NS, NULL)
                                             : tp_group_submit(g, tpt_nop_task, NULL, NULL, NULL);
                assert_int_equal(rc, TP_OK);
            }
        }
        TPT_EVENTUALLY(tpt_stats(p).completed == N);
        uint64_t elapsed = tp_now_ns() - t0;
        static tp_hist h;
        assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT, &h), TP_OK);
        assert_int_equal(h.count, N);
        uint64_t top = 0;
        for (unsigned i = 0; i < TP_HIST_BUCKETS; i++)
            if (h.buckets[i]) top = i == 0 ? 0 : tp_hist_bound_ns(i - 1); /* the bucket's lower edge */
        if (top > elapsed || h.sum_ns > (uint64_t)N * elapsed)
            fail_msg("path %d: queue wait up to %llu ns (sum %llu) in %llu ns", path, (unsigned long long)top,
                     (unsigned long long)h.sum_ns, (unsigned long long)elapsed);
        if (g) {
            assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
            assert_int_equal(tp_group_destroy(g), TP_OK);
        }
        tpt_finish(p);
    }
}

/* ------------------------------------------------------------ snapshots while running */

typedef struct reader {
    tp_pool *p;
    atomic_int stop;
    uint64_t until;        /* its own bound, should the test fail before `stop` */
    atomic_long snapshots; /* the test waits for the first before it submits */
    long bad_sum, bad_mono, bad_total;
} reader;

static void *reader_main(void *arg) {
    reader *r = arg;
    static tp_hist h[2];
    uint64_t last[2] = {0, 0};
    while (!atomic_load(&r->stop) && tp_now_ns() < r->until) {
        for (int w = 0; w < 2; w++) {
            if (tp_hist_get(r->p, w, &h[w]) != TP_OK) r->bad_sum++;
            if (hist_sum(&h[w]) != h[w].count) r->bad_sum++;
            if (h[w].count < last[w]) r->bad_mono++;
            last[w] = h[w].count;
            /* sum_ns covers only counted observations, each at most the
             * bound of the highest non-empty bucket */
            uint64_t top = 0;
            for (unsigned i = 0; i < TP_HIST_BUCKETS; i++)
                if (h[w].buckets[i]) top = tp_hist_bound_ns(i);
            if (top != UINT64_MAX && h[w].count && h[w].sum_ns / h[w].count > top) r->bad_total++;
        }
        atomic_fetch_add(&r->snapshots, 1);
    }
    return NULL;
}

static void test_hist_snapshot_consistent_while_running(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 128;
    cfg.max_retries = 1;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    static reader r;
    memset(&r, 0, sizeof r);
    r.p = p;
    r.until = tp_now_ns() + TPT_WAIT_NS;
    tpt_fx_thr *th = tpt_fx_thread(f, reader_main, &r);
    TPT_EVENTUALLY(atomic_load(&r.snapshots) > 0); /* it reads while the tasks run */
    int n = TPT_SANITIZED ? 3000 : 20000;
    for (int i = 0; i < n; i++)
        assert_int_equal(tp_submit_wait(p, tpt_fail_attempts_task, (void *)(uintptr_t)(i % 3 == 0), NULL,
                                        TPT_WAIT_NS, NULL),
                         TP_OK);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    atomic_store(&r.stop, 1);
    tpt_fx_join(th);
    assert_int_equal(r.bad_sum, 0);
    assert_int_equal(r.bad_mono, 0);
    assert_int_equal(r.bad_total, 0);
    tp_stats s = tpt_stats(p);
    static tp_hist h;
    assert_int_equal(tp_hist_get(p, TP_HIST_RUN, &h), TP_OK);
    assert_int_equal(h.count, s.started + s.retried);
    assert_int_equal(s.started, (uint64_t)n);
    tpt_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(f) TPT_TEST(f)
        T(test_hist_bounds),
        T(test_hist_index_matches_bounds),
        T(test_hist_quantile),
        T(test_hist_invalid),
        T(test_hist_exact_after_wait),
        T(test_hist_records_run_and_wait),
        T(test_hist_every_submit_path_on_one_clock),
        T(test_hist_snapshot_consistent_while_running),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
