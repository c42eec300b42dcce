/*
 * test_cancel.c -- tp_cancel: a queued task, a task waiting for its retry, a
 * running task; bad, unknown and finished ids; cancel racing completion; and
 * the promptness of on_done for tasks ended without running while every
 * worker is busy.
 *
 * Pool threads record into atomics (including whether on_done ran on the
 * thread that called tp_cancel); only the main thread asserts.
 */
#include "tp_test.h"

#include <poll.h>
#include <sched.h>

/* Scale the race loop down under sanitizers (several times slower, 2 cores). */
#if TPT_SANITIZED
#define RACE_ITERS 150
#else
#define RACE_ITERS 600
#endif

/* ------------------------------------------------------------ helpers */

enum { M_NOP, M_SLEEP, M_UNTIL_ERR_RET0, M_UNTIL_ERR_RET5, M_POLL_FD, M_FAIL, M_RET_ERR };

typedef struct rec {
    int mode;
    pthread_t caller; /* the thread that will call tp_cancel */
    atomic_int ran;
    atomic_int calls;
    atomic_int status;
    atomic_int on_caller;           /* on_done ran on the cancelling thread */
    atomic_int sleep_rc;            /* what tp_ctx_sleep returned */
    atomic_int err_after;           /* tp_ctx_err() at the end of the task */
    atomic_int revents;             /* poll() result on the cancel fd */
    atomic_uint_least64_t sleep_ns; /* how long tp_ctx_sleep actually took */
} rec;

static void rec_init(rec *r, int mode) {
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->caller = pthread_self();
    atomic_init(&r->sleep_rc, 12345);
    atomic_init(&r->err_after, 12345);
}

/* Spin (with short pauses) until the context is cancelled; bounded. */
static void until_err(tp_ctx *c) {
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (tp_ctx_err(c) == 0 && tp_now_ns() < end) tpt_pause();
}

static int rec_task(tp_ctx *c, void *arg) {
    rec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    switch (r->mode) {
    case M_SLEEP: {
        uint64_t t0 = tp_now_ns();
        int rc = tp_ctx_sleep(c, TPT_WAIT_NS);
        atomic_store(&r->sleep_ns, tp_now_ns() - t0);
        atomic_store(&r->sleep_rc, rc);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return rc;
    }
    case M_UNTIL_ERR_RET0:
        until_err(c);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return 0;
    case M_UNTIL_ERR_RET5:
        until_err(c);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return 5;
    case M_POLL_FD: {
        int fd = tp_ctx_fd(c);
        if (fd < 0) return fd;
        struct pollfd pf = {fd, POLLIN, 0};
        int n = poll(&pf, 1, (int)(TPT_WAIT_NS / 1000000ull));
        atomic_store(&r->revents, n > 0 ? pf.revents : -1);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return tp_ctx_err(c);
    }
    case M_FAIL: return 3;
    case M_RET_ERR: return tp_ctx_err(c);
    default: return 0;
    }
}

static void rec_done(void *arg, int status) {
    rec *r = arg;
    if (pthread_equal(pthread_self(), r->caller)) atomic_fetch_add(&r->on_caller, 1);
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
}

static int sum_calls(rec *r, int n) {
    int sum = 0;
    for (int i = 0; i < n; i++) sum += atomic_load(&r[i].calls);
    return sum;
}

static uint64_t submit_rec(tp_pool *p, rec *r) {
    tp_task_opts o = {0};
    o.on_done = rec_done;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, rec_task, r, &o, &id), TP_OK);
    assert_true(id != 0);
    return id;
}

/* A cancel storm: one thread submits and at once cancels, far faster than
 * the service thread runs the on_done calls. The queue is empty before each
 * submit, so every one must be accepted -- the records held by ended tasks
 * awaiting their on_done must not turn into spurious TP_EFULL (20000 pending
 * endings stay below the pool's record cap). Every on_done still runs once. */
static void test_cancel_storm_no_spurious_full(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    enum { N = 20000 };
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {.on_done = tpt_done_fn};
    int not_ok = 0, cancel_bad = 0;
    for (int i = 0; i < N; i++) {
        uint64_t id = 0;
        if (tp_submit(p, tpt_nop_task, d, &o, &id) != TP_OK) {
            not_ok++;
            continue;
        }
        if (tp_cancel(p, id) != TP_OK) cancel_bad++;
    }
    assert_int_equal(not_ok, 0);
    assert_int_equal(cancel_bad, 0);
    TPT_EVENTUALLY(atomic_load(&d->calls) == N);
    assert_int_equal(atomic_load(&d->status), TP_ECANCELED);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, N);
    assert_int_equal(s.rejected, 0);
    assert_int_equal(atomic_load(&d->calls), N);
}

/* ------------------------------------------------------------ queued */

static void test_cancel_queued(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_NOP);
    uint64_t id = submit_rec(p, r);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);

    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->on_caller), 0); /* a pool thread, not ours */
    assert_int_equal(atomic_load(&r->ran), 0);
    /* a second cancel of the same task finds nothing */
    assert_int_equal(tp_cancel(p, id), TP_ENOTFOUND);
    /* its queue place is free again */
    TPT_EVENTUALLY(tpt_stats(p).queued == 0);
    rec *r2 = tpt_fx_new(f, rec);
    rec_init(r2, M_NOP);
    submit_rec(p, r2);

    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(cancelled, 1), TPT_EQ(failed, 1), TPT_EQ(completed, 1),
                      TPT_EQ(started, 1)); /* the blocker only */

    tpt_latch_open(l);
    s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->ran), 0);
    assert_int_equal(atomic_load(&r->calls), 1);
    assert_int_equal(atomic_load(&r2->calls), 1);
    assert_int_equal(atomic_load(&r2->status), 0);
    tpt_assert_counts(s, TPT_EQ(started, 2), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* Every worker is blocked; cancelled queued tasks still get their on_done
 * promptly (on the service thread), while the workers are still blocked. */
static void test_cancel_queued_on_done_prompt_when_busy(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 2, Q = 6 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, Q, TP_UNLIMITED);
    tpt_fill_workers(p, l, W, NULL);
    rec *r = tpt_fx_array(f, rec, Q);
    uint64_t ids[Q];
    for (int i = 0; i < Q; i++) {
        rec_init(&r[i], M_NOP);
        ids[i] = submit_rec(p, &r[i]);
    }
    for (int i = 0; i < Q; i++) assert_int_equal(tp_cancel(p, ids[i]), TP_OK);
    /* Well inside the latch's own 20 s bound, so a pool that needs a free
     * worker for these on_done calls fails here. */
    int all = TPT_POLL(sum_calls(r, Q) == Q, TPT_WAIT_NS / 4);
    assert_true(all);
    assert_int_equal(atomic_load(&l->waiting), W); /* workers still blocked */
    assert_int_equal(atomic_load(&l->timeouts), 0);
    for (int i = 0; i < Q; i++) {
        assert_int_equal(atomic_load(&r[i].calls), 1);
        assert_int_equal(atomic_load(&r[i].status), TP_ECANCELED);
        assert_int_equal(atomic_load(&r[i].on_caller), 0);
    }
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    for (int i = 0; i < Q; i++) assert_int_equal(atomic_load(&r[i].ran), 0);
    assert_int_equal(s.cancelled, Q);
    assert_int_equal(s.succeeded, W);
}

/* ------------------------------------------------------------ retry wait */

static void test_cancel_waiting_for_retry(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 4;
    c.max_per_user = 1;
    c.max_retries = 3;
    c.retry_delay_ns = TPT_S(60); /* never within the test */
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_FAIL);
    tp_task_opts o = {0};
    o.on_done = rec_done;
    o.user = "u";
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, rec_task, r, &o, &id), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1 && tpt_stats(p).active == 0);
    assert_int_equal(atomic_load(&r->ran), 1);
    assert_int_equal(atomic_load(&r->calls), 0);
    assert_int_equal(tp_user_active(p, "u"), 1); /* kept while it waits */

    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->on_caller), 0);
    assert_int_equal(atomic_load(&r->ran), 1); /* the retry never ran */
    assert_int_equal(tp_user_active(p, "u"), 0);
    assert_int_equal(tp_cancel(p, id), TP_ENOTFOUND);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);

    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->ran), 1);
    tpt_assert_counts(s, TPT_EQ(retried, 0), TPT_EQ(cancelled, 1), TPT_EQ(failed, 1), TPT_EQ(started, 1));
}

/* ------------------------------------------------------------ running */

static void test_cancel_running_sleep(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_SLEEP);
    uint64_t id = submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->sleep_rc), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->err_after), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);  /* its return value */
    assert_true(atomic_load(&r->sleep_ns) < TPT_WAIT_NS / 2); /* returned early */
    assert_int_equal(atomic_load(&r->on_caller), 0);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(failed, 1), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0), TPT_EQ(succeeded, 0));
}

static void test_cancel_running_fd_readable(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_POLL_FD);
    uint64_t id = submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_true(atomic_load(&r->revents) > 0);
    assert_true(atomic_load(&r->revents) & POLLIN);
    assert_int_equal(atomic_load(&r->err_after), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);
    tpt_finish(p);
}

/* A cancelled task that still returns 0 counts as succeeded. */
static void test_cancel_running_return_zero(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_UNTIL_ERR_RET0);
    uint64_t id = submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->err_after), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->status), 0);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(succeeded, 1), TPT_EQ(failed, 0), TPT_EQ(cancelled, 0));
}

/* A cancelled running task that fails is not retried; its status is its own
 * return value, a plain failure. */
static void test_cancel_running_not_retried(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 4;
    c.max_retries = 3;
    c.retry_delay_ns = TPT_MS(1);
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_UNTIL_ERR_RET5);
    uint64_t id = submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->status), 5);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->ran), 1);
    tpt_assert_counts(s, TPT_EQ(retried, 0), TPT_EQ(failed, 1), TPT_EQ(cancelled, 0));
}

/* ------------------------------------------------------------ bad ids */

static void test_cancel_bad_ids(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    assert_int_equal(tp_cancel(p, 0), TP_EINVAL);
    assert_int_equal(tp_cancel(NULL, 1), TP_EINVAL);
    assert_int_equal(tp_cancel(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_cancel(p, 1), TP_ENOTFOUND); /* nothing submitted yet */
    assert_int_equal(tp_cancel(p, UINT64_MAX), TP_ENOTFOUND);

    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_NOP);
    uint64_t id = submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1); /* ended: on_done ran */
    assert_int_equal(tp_cancel(p, id), TP_ENOTFOUND);
    assert_int_equal(tp_cancel(p, id + 1000000), TP_ENOTFOUND);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 0);
    assert_int_equal(s.succeeded, 1);
    assert_int_equal(atomic_load(&r->status), 0);
}

/* Cancelling after the pool drained, and on a closed pool, still answers. */
static void test_cancel_after_close(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_NOP);
    uint64_t id = submit_rec(p, r);
    assert_int_equal(tp_close(p), TP_OK);
    /* closed, but the task is accepted and unfinished: cancel still works */
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->calls) == 1);
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);
    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_ENOTFOUND);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->ran), 0);
    assert_int_equal(s.cancelled, 1);
}

/* ------------------------------------------------------------ race */

/* Submit, then cancel at once, many times: the cancel meets the task queued,
 * running or finished. Exactly one outcome, one on_done, consistent counters. */
static void test_cancel_vs_completion_race(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = RACE_ITERS };
    rec *r = calloc(N, sizeof *r);
    int *crc = calloc(N, sizeof *crc);
    assert_non_null(r);
    assert_non_null(crc);
    tp_pool *p = tpt_quiet_pool(f, 2, N, TP_UNLIMITED);
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], M_RET_ERR);
        uint64_t id = submit_rec(p, &r[i]);
        /* Give the workers a varying head start (0..100 us) so the cancel
         * meets the task queued, running or already ended. */
        uint64_t until = tp_now_ns() + (uint64_t)(i % 11) * 10000u;
        while (tp_now_ns() < until)
            ;
        crc[i] = tp_cancel(p, id);
        if (crc[i] != TP_OK && crc[i] != TP_ENOTFOUND) break;
    }
    tp_stats s = tpt_finish(p);
    uint64_t n_ok = 0, n_cancelled = 0, n_ran = 0, n_cancel_ok = 0;
    for (int i = 0; i < N; i++) {
        if (crc[i] != TP_OK && crc[i] != TP_ENOTFOUND)
            fail_msg("task %d: tp_cancel returned %d (%s)", i, crc[i], tp_err_name(crc[i]));
        int calls = atomic_load(&r[i].calls), st = atomic_load(&r[i].status);
        int ran = atomic_load(&r[i].ran);
        if (calls != 1) fail_msg("task %d: on_done called %d times", i, calls);
        if (ran > 1) fail_msg("task %d: ran %d times", i, ran);
        if (st != 0 && st != TP_ECANCELED) fail_msg("task %d: status %d", i, st);
        if (crc[i] == TP_ENOTFOUND && (st != 0 || ran != 1))
            fail_msg("task %d: cancel said ended, but status %d ran %d", i, st, ran);
        if (ran == 0 && st != TP_ECANCELED) fail_msg("task %d: never ran but status %d", i, st);
        if (atomic_load(&r[i].on_caller) != 0) fail_msg("task %d: on_done ran on the cancelling thread", i);
        n_ok += (st == 0);
        n_cancelled += (st == TP_ECANCELED);
        n_ran += (uint64_t)ran;
        n_cancel_ok += (crc[i] == TP_OK);
    }
    tpt_assert_counts(s, TPT_EQ(accepted, N), TPT_EQ(completed, N), TPT_EQ(succeeded, n_ok),
                      TPT_EQ(cancelled, n_cancelled), TPT_EQ(failed, n_cancelled), TPT_EQ(started, n_ran),
                      TPT_EQ(retried, 0));
    print_message("race: %d tasks, %llu cancels accepted, %llu ended cancelled, %llu ran\n", N,
                  (unsigned long long)n_cancel_ok, (unsigned long long)n_cancelled,
                  (unsigned long long)n_ran);
    free(r);
    free(crc);
}

/* The same race with the cancel coming from another thread while the main
 * thread keeps submitting. */
typedef struct canceller {
    tp_pool *p;
    atomic_uint_least64_t *ids;
    int n;
    atomic_int *published;
    int bad;
    int ok;
} canceller;

static void *canceller_main(void *a) {
    canceller *c = a;
    int next = 0;
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (next < c->n && tp_now_ns() < end) {
        if (next >= atomic_load(c->published)) {
            sched_yield();
            continue;
        }
        int rc = tp_cancel(c->p, atomic_load(&c->ids[next]));
        if (rc == TP_OK)
            c->ok++;
        else if (rc != TP_ENOTFOUND)
            c->bad++;
        next++;
    }
    return NULL;
}

static void test_cancel_race_other_thread(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = RACE_ITERS };
    rec *r = calloc(N, sizeof *r);
    atomic_uint_least64_t *ids = calloc(N, sizeof *ids);
    assert_non_null(r);
    assert_non_null(ids);
    atomic_int *published = tpt_fx_new(f, atomic_int);
    tp_pool *p = tpt_quiet_pool(f, 2, N, TP_UNLIMITED);
    canceller *c = tpt_fx_new(f, canceller);
    *c = (canceller){p, ids, N, published, 0, 0};
    tpt_fx_thr *th = tpt_fx_thread(f, canceller_main, c);
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], M_RET_ERR);
        r[i].caller = th->id; /* on_done must not run on the cancelling thread */
        atomic_store(&ids[i], submit_rec(p, &r[i]));
        atomic_store(published, i + 1);
    }
    tpt_fx_join(th);
    tp_stats s = tpt_finish(p);
    assert_int_equal(c->bad, 0);
    uint64_t n_ok = 0, n_cancelled = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&r[i].calls), 1);
        assert_int_equal(atomic_load(&r[i].on_caller), 0);
        int st = atomic_load(&r[i].status);
        assert_true(st == 0 || st == TP_ECANCELED);
        n_ok += (st == 0);
        n_cancelled += (st == TP_ECANCELED);
    }
    tpt_assert_counts(s, TPT_EQ(succeeded, n_ok), TPT_EQ(cancelled, n_cancelled), TPT_EQ(completed, N));
    free(r);
    free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_cancel_queued),
        TPT_TEST(test_cancel_queued_on_done_prompt_when_busy),
        TPT_TEST(test_cancel_waiting_for_retry),
        TPT_TEST(test_cancel_running_sleep),
        TPT_TEST(test_cancel_running_fd_readable),
        TPT_TEST(test_cancel_running_return_zero),
        TPT_TEST(test_cancel_running_not_retried),
        TPT_TEST(test_cancel_bad_ids),
        TPT_TEST(test_cancel_after_close),
        TPT_TEST(test_cancel_vs_completion_race),
        TPT_TEST(test_cancel_race_other_thread),
        TPT_TEST(test_cancel_storm_no_spurious_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
