/*
 * test_backoff.c -- retry backoff (tp_config.retry_delay_max_ns; taskpool.h
 * section 4, SPEC 14): the wait before retry k is
 * min(retry_delay_ns x 2^(k-1), retry_delay_max_ns).
 *
 * Covers: the delays between attempts grow and stop at the maximum --
 * measured as lower bounds between an attempt's end and the next one's
 * start (timestamps taken by the task), checked exactly in the log hook's
 * "retry k of n in <delay>" lines, and with a cap that an uncapped doubling
 * would exceed by seconds (an upper bound with a margin of 40x); 0 keeps
 * 1.1's fixed delay; the computation without overflow (the delay function
 * itself, for retries far beyond what a test can wait for); a deadline that
 * falls inside a backoff wait ends the task with TP_ETIMEDOUT at the
 * deadline, not at the retry's due time (cancelled, not expired; the user
 * slot held and the task counted delayed until then); invalid
 * configurations.
 *
 * Pool threads record into atomics and a mutex-protected log; only the main
 * thread asserts.
 */
#define _GNU_SOURCE
#include <inttypes.h>

#include "life.h" /* tp__life_retry_delay, for the overflow cases */
#include "tp_test.h"

/* ------------------------------------------------------------ a failing task */

#define BO_MAX 64

typedef struct bo {
    int fail_until; /* attempts below it return 1 */
    atomic_int attempts;
    _Atomic uint64_t t_start[BO_MAX]; /* tp_now_ns() as attempt k starts */
    _Atomic uint64_t t_end[BO_MAX];   /* ... and just before it returns */
    atomic_int done_calls, done_status;
    _Atomic uint64_t t_done;
} bo;

static int bo_task(tp_ctx *c, void *arg) {
    bo *b = arg;
    unsigned a = tp_ctx_attempt(c);
    if (a < BO_MAX) atomic_store(&b->t_start[a], tp_now_ns());
    atomic_fetch_add(&b->attempts, 1);
    int rc = (int)a < b->fail_until ? 1 : 0;
    if (a < BO_MAX) atomic_store(&b->t_end[a], tp_now_ns());
    return rc;
}

static void bo_done(void *arg, int status) {
    bo *b = arg;
    atomic_store(&b->t_done, tp_now_ns());
    atomic_store(&b->done_status, status);
    atomic_fetch_add(&b->done_calls, 1);
}

/* The wait before retry k (k = 1 for the first) by the header's formula,
 * doubling step by step: once twice the value would reach the maximum, it
 * is the maximum. */
static uint64_t want_delay(uint64_t d, uint64_t max, unsigned k) {
    if (!max) return d;
    uint64_t v = d < max ? d : max;
    for (unsigned i = 1; i < k; i++) {
        if (v >= max - v) return max; /* 2v >= max, without computing 2v */
        v *= 2;
    }
    return v;
}

/* ------------------------------------------------------------ the log */

typedef struct log_entry {
    int level;
    char msg[256];
} log_entry;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static log_entry log_rec[128];
static int log_n;

static void rec_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    (void)log_id;
    pthread_mutex_lock(&log_mu);
    if (log_n < 128) {
        log_rec[log_n].level = level;
        snprintf(log_rec[log_n].msg, sizeof log_rec[log_n].msg, "%s", msg ? msg : "");
        log_n++;
    }
    pthread_mutex_unlock(&log_mu);
}

static void log_reset(void) {
    pthread_mutex_lock(&log_mu);
    log_n = 0;
    pthread_mutex_unlock(&log_mu);
}

/* The k-th WARN line (k from 1) announces retry k "in <text>". */
static void assert_log_delays(const char *const *text, int n, unsigned max_retries) {
    pthread_mutex_lock(&log_mu);
    int got = 0;
    char want[96];
    for (int i = 0; i < log_n; i++) {
        if (log_rec[i].level != TP_LOG_WARN) continue;
        if (got < n) {
            snprintf(want, sizeof want, "; retry %d of %u in %s", got + 1, max_retries, text[got]);
            if (!strstr(log_rec[i].msg, want)) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s", log_rec[i].msg);
                pthread_mutex_unlock(&log_mu);
                fail_msg("failed attempt %d: \"%s\", want \"...%s\"", got, msg, want);
            }
        }
        got++;
    }
    pthread_mutex_unlock(&log_mu);
    assert_int_equal(got, n);
}

static tp_pool *bo_pool(tpt_fixture *f, uint64_t delay, uint64_t max, unsigned retries, tp_log_fn log) {
    tp_config c = tpt_quiet_config(1, 8, TP_UNLIMITED);
    c.retry_delay_ns = delay;
    c.retry_delay_max_ns = max;
    c.max_retries = retries;
    if (log) c.log = log;
    return tpt_fx_pool(f, &c);
}

/* ------------------------------------------------------------ growth */

/* 5 ms doubling up to 40 ms over 6 retries: 5 10 20 40 40 40. Each gap
 * between an attempt's end and the next one's start is at least its delay;
 * the log announces each delay exactly. */
static void test_delays_double_up_to_max(void **state) {
    tpt_fixture *f = tpt_fx(state);
    log_reset();
    const uint64_t d = TPT_MS(5), max = TPT_MS(40);
    tp_pool *p = bo_pool(f, d, max, 6, rec_log);
    bo *b = tpt_fx_new(f, bo);
    b->fail_until = 6; /* the last attempt succeeds */
    tp_task_opts o = {0};
    o.on_done = bo_done;
    o.user = "slow";
    assert_int_equal(tp_submit(p, bo_task, b, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&b->done_calls) == 1);
    assert_int_equal(atomic_load(&b->done_status), 0);
    assert_int_equal(atomic_load(&b->attempts), 7);
    for (unsigned k = 1; k <= 6; k++) {
        uint64_t gap = atomic_load(&b->t_start[k]) - atomic_load(&b->t_end[k - 1]);
        uint64_t w = want_delay(d, max, k);
        if (gap < w)
            fail_msg("retry %u started %" PRIu64 " ns after the failed attempt, before its delay %" PRIu64
                     " ns",
                     k, gap, w);
    }
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(started, 1), TPT_EQ(retried, 6), TPT_EQ(succeeded, 1));
    static const char *const text[] = {"5 ms", "10 ms", "20 ms", "40 ms", "40 ms", "40 ms"};
    assert_log_delays(text, 6, 6);
}

/* The cap holds: 10 ms doubling up to 20 ms over 12 retries takes
 * 10 + 11 x 20 = 230 ms; doubling without the cap would take 41 s. */
static void test_cap_bounds_the_total(void **state) {
    tpt_fixture *f = tpt_fx(state);
    log_reset();
    const uint64_t d = TPT_MS(10), max = TPT_MS(20);
    tp_pool *p = bo_pool(f, d, max, 12, rec_log);
    bo *b = tpt_fx_new(f, bo);
    b->fail_until = 100; /* never succeeds */
    tp_task_opts o = {0};
    o.on_done = bo_done;
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit(p, bo_task, b, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&b->done_calls) == 1);
    uint64_t total = atomic_load(&b->t_done) - t0;
    assert_int_equal(atomic_load(&b->done_status), 1);
    assert_int_equal(atomic_load(&b->attempts), 13);
    uint64_t sum = 0;
    for (unsigned k = 1; k <= 12; k++) {
        uint64_t gap = atomic_load(&b->t_start[k]) - atomic_load(&b->t_end[k - 1]);
        assert_true(gap >= want_delay(d, max, k));
        sum += want_delay(d, max, k);
    }
    assert_true(sum == TPT_MS(230));
    assert_true(total >= sum);
    /* Uncapped doubling would take 41 s; the logged delays below say which
     * delay each retry was given, so this bound only needs to be far above
     * what a stalled machine adds to 230 ms. */
    if (total > TPT_WAIT_NS / 2)
        fail_msg("12 capped retries took %" PRIu64 " ms (the delays sum to 230 ms)", total / 1000000);
    tpt_finish(p);
    static const char *const text[] = {"10 ms", "20 ms", "20 ms", "20 ms", "20 ms", "20 ms",
                                       "20 ms", "20 ms", "20 ms", "20 ms", "20 ms", "20 ms"};
    assert_log_delays(text, 12, 12);
}

/* retry_delay_max_ns 0 keeps the fixed delay; a maximum equal to the delay
 * too; a maximum below the first doubling stops growth at once. */
static void test_fixed_delay_when_unset_or_equal(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const struct {
        uint64_t d, max;
        const char *t[3];
    } cases[] = {
        {TPT_MS(3), 0, {"3 ms", "3 ms", "3 ms"}},
        {TPT_MS(3), TPT_MS(3), {"3 ms", "3 ms", "3 ms"}},
        {TPT_MS(2), TPT_MS(3), {"2 ms", "3 ms", "3 ms"}},
        {TPT_MS(1) / 2, TP_FOREVER, {"500 us", "1 ms", "2 ms"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        log_reset();
        tp_pool *p = bo_pool(f, cases[i].d, cases[i].max, 3, rec_log);
        bo *b = tpt_fx_new(f, bo);
        b->fail_until = 3;
        tp_task_opts o = {0};
        o.on_done = bo_done;
        assert_int_equal(tp_submit(p, bo_task, b, &o, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&b->done_calls) == 1);
        for (unsigned k = 1; k <= 3; k++) {
            uint64_t gap = atomic_load(&b->t_start[k]) - atomic_load(&b->t_end[k - 1]);
            assert_true(gap >= want_delay(cases[i].d, cases[i].max, k));
        }
        tpt_finish(p);
        assert_log_delays(cases[i].t, 3, 3);
    }
}

/* The delay function against the formula, far beyond what a test can wait
 * for: shifts past 64 bits, delays near 2^64, the maximum TP_FOREVER. */
static void test_delay_without_overflow(void **state) {
    (void)state;
    static const uint64_t ds[] = {
        1, 3, TPT_MS(1), TPT_S(1), 1ull << 40, (1ull << 62) + 7, UINT64_MAX / 3, UINT64_MAX - 1};
    static const uint64_t maxs[] = {0, TPT_S(60), 1ull << 50, (1ull << 63) + 1, UINT64_MAX - 1, TP_FOREVER};
    static const unsigned ks[] = {1, 2, 3, 10, 31, 32, 33, 62, 63, 64, 65, 66, 99, 100, 128, 1000};
    tp__life L;
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        for (size_t j = 0; j < sizeof maxs / sizeof maxs[0]; j++) {
            if (maxs[j] && maxs[j] < ds[i]) continue; /* refused by tp_create */
            memset(&L, 0, sizeof L);
            L.cfg.retry_delay = ds[i];
            L.cfg.retry_delay_max = maxs[j];
            uint64_t prev = 0;
            for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
                uint64_t got = tp__life_retry_delay(&L, ks[k]);
                uint64_t want = want_delay(ds[i], maxs[j], ks[k]);
                if (got != want)
                    fail_msg("delay %" PRIu64 ", max %" PRIu64 ", retry %u: %" PRIu64 ", want %" PRIu64,
                             ds[i], maxs[j], ks[k], got, want);
                assert_true(got >= prev); /* never shrinks */
                prev = got;
            }
        }
    }
}

/* ------------------------------------------------------------ deadlines */

/* A deadline inside a backoff wait: the task ends with TP_ETIMEDOUT at the
 * deadline (not before, and not at the retry's due time); until then it is
 * delayed and keeps its user slot. It ran, so it is cancelled, not expired.
 *
 * 400 ms doubling: attempt 0 at 0, attempt 1 at 400 ms, then a wait of
 * 800 ms (a fixed delay would retry at 800 ms); the deadline, at 850 ms, is
 * inside that wait. Whether it ended "at the deadline" is a bound on
 * scheduling: a run whose premise (attempt 1 before the deadline) or bound
 * (ended before the retry's due time) a stalled machine broke is run again,
 * and the test fails only if three runs in a row do. A wrong status, an end
 * before the deadline or wrong counters fail at once. */
static int deadline_run(tpt_fixture *f, int run) {
    const uint64_t S = tpt_slowdown();
    const uint64_t d = TPT_MS(400) * S, max = TPT_S(60);
    tp_pool *p = bo_pool(f, d, max, 10, NULL);
    bo *b = tpt_fx_new(f, bo);
    b->fail_until = 100;
    tp_task_opts o = {0};
    o.on_done = bo_done;
    o.user = "late";
    uint64_t t0 = tp_now_ns();
    uint64_t deadline = t0 + TPT_MS(850) * S;
    o.deadline_ns = deadline;
    assert_int_equal(tp_submit(p, bo_task, b, &o, NULL), TP_OK);
    /* The premise, seen before the deadline: attempt 0 ran and the task is
     * delayed, holding its slot. */
    bool seen =
        TPT_POLL((atomic_load(&b->attempts) >= 1 && tpt_stats(p).delayed == 1 && tp_now_ns() < deadline) ||
                     atomic_load(&b->done_calls) == 1,
                 TPT_WAIT_NS) &&
        atomic_load(&b->done_calls) == 0;
    int active = seen ? (int)tp_user_active(p, "late") : -1;
    if (!seen || tp_now_ns() >= deadline) {
        TPT_EVENTUALLY(atomic_load(&b->done_calls) == 1);
        tpt_finish(p);
        print_message("run %d: the task was not seen delayed before its deadline (a stalled machine?)\n",
                      run);
        return 0;
    }
    assert_int_equal(active, 1); /* delayed, holding its slot */
    TPT_EVENTUALLY(atomic_load(&b->done_calls) == 1);
    uint64_t t_done = atomic_load(&b->t_done);
    int n = atomic_load(&b->attempts);
    assert_int_equal(atomic_load(&b->done_status), TP_ETIMEDOUT);
    assert_true(t_done >= deadline);
    assert_true(n >= 1 && n <= 2);
    assert_int_equal(tp_user_active(p, "late"), 0);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(started, 1), TPT_EQ(retried, (uint64_t)n - 1), TPT_EQ(failed, 1),
                      TPT_EQ(cancelled, 1), TPT_EQ(expired, 0), TPT_EQ(delayed, 0));
    uint64_t last_end = atomic_load(&b->t_end[n - 1]);
    uint64_t due = last_end + want_delay(d, max, (unsigned)n); /* the retry that did not happen */
    if (n == 2 && last_end < deadline && t_done < due) return 1;
    print_message("run %d: %d attempt(s), the last ended at %" PRIu64 " ms; deadline %" PRIu64
                  " ms; the next retry due at %" PRIu64 " ms; ended at %" PRIu64 " ms (a stalled machine?)\n",
                  run, n, (last_end - t0) / 1000000, (deadline - t0) / 1000000, (due - t0) / 1000000,
                  (t_done - t0) / 1000000);
    return 0;
}

static void test_deadline_inside_backoff_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int run = 1; run <= 3; run++)
        if (deadline_run(f, run)) return;
    fail_msg("three runs in a row did not end at the deadline inside the 800 ms wait");
}

/* ------------------------------------------------------------ order */

/* Retries go back to the queue in the order their delays end, also when
 * the service thread comes late and finds several due in one pass: with
 * backoff a task on its second retry (a longer wait) may fail before one on
 * its first and still be due after it. X's second attempt fails, then Y's
 * first, while the service thread is held in an on_done; once both retries
 * are due it is let go, and the one worker, held meanwhile, then starts Y's
 * retry before X's. (It started X's first: the delayed list's order.) Y's
 * retry is due first when Y's attempt fails less than `d` after X's; on a
 * machine slow enough to take longer (valgrind), X's is due first and must
 * start first: the expected order follows the failures' times (either order
 * within 2 ms of the tie, where the pool's own stamps may differ). */
typedef struct ro {
    tpt_latch *x_gate; /* X's second attempt waits here */
    tpt_latch *svc;    /* the held on_done waits here */
    pthread_mutex_t mu;
    char order[16];
    int n;
    _Atomic uint64_t x_failed, y_failed; /* when X's second and Y's first attempt ended */
} ro;

static void ro_mark(ro *r, char c) {
    pthread_mutex_lock(&r->mu);
    if (r->n < (int)sizeof r->order - 1) r->order[r->n++] = c;
    pthread_mutex_unlock(&r->mu);
}

static int ro_x(tp_ctx *c, void *arg) {
    ro *r = arg;
    unsigned a = tp_ctx_attempt(c);
    ro_mark(r, (char)('0' + a)); /* X's attempts: 0, 1, 2 */
    if (a == 1) {
        tpt_latch_wait(r->x_gate);
        atomic_store(&r->x_failed, tp_now_ns());
    }
    return a < 2 ? 1 : 0;
}

static int ro_y(tp_ctx *c, void *arg) {
    ro *r = arg;
    unsigned a = tp_ctx_attempt(c);
    ro_mark(r, a == 0 ? 'y' : 'Y');
    if (a == 0) atomic_store(&r->y_failed, tp_now_ns());
    return a < 1 ? 1 : 0;
}

static void ro_hold(void *arg, int status) {
    (void)status;
    tpt_latch_wait(((ro *)arg)->svc);
}

static void test_late_retries_in_due_order(void **state) {
    tpt_fixture *f = tpt_fx(state);
    ro *r = tpt_fx_new(f, ro);
    pthread_mutex_init(&r->mu, NULL);
    r->x_gate = tpt_fx_latch(f);
    r->svc = tpt_fx_latch(f);
    tpt_latch *g = tpt_fx_latch(f);
    const uint64_t d = TPT_MS(50), max = TPT_MS(400); /* retry 1 waits 50 ms, retry 2 100 ms */
    tp_config c = tpt_quiet_config(1, 0, 0);
    c.max_retries = 2;
    c.retry_delay_ns = d;
    c.retry_delay_max_ns = max;
    tp_pool *p = tpt_fx_pool(f, &c);
    assert_int_equal(tp_submit(p, ro_x, r, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->x_gate->waiting) == 1); /* X's first retry runs */
    assert_int_equal(tp_submit(p, ro_y, r, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, g, NULL, NULL), TP_OK);
    tp_task_opts hold = {0};
    hold.on_done = ro_hold;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, r, &hold, &id), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->svc->waiting) == 1); /* the service thread is held */
    tpt_latch_open(r->x_gate); /* X fails (retry 2 in 100 ms), then Y (retry 1 in 50 ms) */
    TPT_EVENTUALLY(atomic_load(&g->waiting) == 1 && tpt_stats(p).delayed == 2);
    tpt_sleep_until(tp_now_ns() + want_delay(d, max, 2) + TPT_MS(1)); /* both are due */
    tpt_latch_open(r->svc);                                           /* one pass takes both back */
    TPT_EVENTUALLY(tpt_stats(p).queued == 2);
    tpt_latch_open(g);
    tp_stats s = tpt_finish(p);
    pthread_mutex_lock(&r->mu);
    r->order[r->n] = '\0';
    pthread_mutex_unlock(&r->mu);
    /* due: X's at x_failed + 2d, Y's at y_failed + d */
    int64_t y_later = (int64_t)(atomic_load(&r->y_failed) - atomic_load(&r->x_failed)) - (int64_t)d;
    if (y_later < -(int64_t)TPT_MS(2))
        assert_string_equal(r->order, "01yY2"); /* the designed case: Y's retry is due first */
    else if (y_later > (int64_t)TPT_MS(2))
        assert_string_equal(r->order, "01y2Y");
    else if (strcmp(r->order, "01yY2") != 0)
        assert_string_equal(r->order, "01y2Y");
    tpt_assert_counts(s, TPT_EQ(retried, 3), TPT_EQ(succeeded, 3), TPT_EQ(cancelled, 1));
    pthread_mutex_destroy(&r->mu);
}

/* ------------------------------------------------------------ bad configurations */

static void test_invalid_configs(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = NULL;
    tp_config c = {0};
    c.workers = 1;
    c.log = tpt_quiet_log;
    c.retry_delay_ns = TPT_MS(10);
    c.retry_delay_max_ns = TPT_MS(10) - 1;
    assert_int_equal(tp_create(&p, &c), TP_EINVAL);
    c.retry_delay_max_ns = 1;
    assert_int_equal(tp_create(&p, &c), TP_EINVAL);
    c.retry_delay_ns = 0; /* the default, 1 s: the maximum must reach it */
    c.retry_delay_max_ns = TPT_S(1) - 1;
    assert_int_equal(tp_create(&p, &c), TP_EINVAL);
    assert_null(p);
    static const uint64_t ok_max[] = {TPT_S(1), TPT_S(2), TP_FOREVER};
    for (int i = 0; i < 3; i++) {
        c.retry_delay_max_ns = ok_max[i];
        p = NULL;
        assert_int_equal(tp_create(&p, &c), TP_OK);
        tpt_fx_adopt(f, p);
        tpt_finish(p);
    }
    c.retry_delay_ns = 5;
    c.retry_delay_max_ns = 5;
    p = NULL;
    assert_int_equal(tp_create(&p, &c), TP_OK);
    tpt_fx_adopt(f, p);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_delays_double_up_to_max),         TPT_TEST(test_cap_bounds_the_total),
        TPT_TEST(test_fixed_delay_when_unset_or_equal), TPT_TEST(test_delay_without_overflow),
        TPT_TEST(test_deadline_inside_backoff_wait),    TPT_TEST(test_invalid_configs),
        TPT_TEST(test_late_retries_in_due_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
