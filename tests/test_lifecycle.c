/*
 * test_lifecycle.c -- tp_create / tp_close / tp_shutdown / tp_wait /
 * tp_destroy: draining, forced shutdown, the one shared countdown, concurrent
 * callers, tasks that ignore cancellation, and TP_EDEADLK from the pool's own
 * threads.
 *
 * A "task that ignores cancellation" blocks on a latch; the test opens the
 * latch itself once it has checked what it wanted, so nothing relies on the
 * latch's own 20 s bound. Pool threads record into atomics; only the main
 * thread asserts.
 */
#include "tp_test.h"

#include <unistd.h>

/* ------------------------------------------------------------ helpers */

/* A task record: what ran, what on_done saw. */
enum { M_NOP, M_BLOCK, M_SLEEP, M_WORK };

typedef struct rec {
    int mode;
    tpt_latch *latch;
    atomic_int ran;
    atomic_int calls;
    atomic_int status;
    atomic_int err_after; /* tp_ctx_err() after the latch opened / sleep returned */
    atomic_int slow_done; /* on_done takes a while before counting */
    atomic_int *done_counter;
} rec;

static void rec_init(rec *r, int mode, tpt_latch *l) {
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->latch = l;
    atomic_init(&r->err_after, 12345);
}

static int rec_task(tp_ctx *c, void *arg) {
    rec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    switch (r->mode) {
    case M_BLOCK:
        tpt_latch_wait(r->latch);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return 0;
    case M_SLEEP: {
        int rc = tp_ctx_sleep(c, TPT_WAIT_NS);
        atomic_store(&r->err_after, tp_ctx_err(c));
        return rc;
    }
    case M_WORK: return tp_ctx_sleep(c, TPT_MS(1));
    default: return 0;
    }
}

static void rec_done(void *arg, int status) {
    rec *r = arg;
    if (atomic_load(&r->slow_done)) tpt_sleep_ns(TPT_MS(5)); /* a shutdown must wait for this too */
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
    if (r->done_counter != NULL) atomic_fetch_add(r->done_counter, 1);
}

static uint64_t submit_rec(tp_pool *p, rec *r) {
    tp_task_opts o = {0};
    o.on_done = rec_done;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, rec_task, r, &o, &id), TP_OK);
    return id;
}

/* Has the pool stopped admission? (A refused probe leaves only a counter.) */
static int pool_closed(tp_pool *p) { return tp_submit(p, tpt_nop_task, NULL, NULL, NULL) == TP_ECLOSED; }

typedef struct opener {
    tpt_latch *l;
    uint64_t delay_ns;
} opener;

static void *opener_main(void *a) {
    opener *o = a;
    tpt_sleep_ns(o->delay_ns);
    tpt_latch_open(o->l);
    return NULL;
}

/* ------------------------------------------------------------ close */

static void test_close_stops_admission_and_drains(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 2, Q = 10 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, 20, TP_UNLIMITED);
    tpt_fill_workers(p, l, W, NULL);
    rec *r = tpt_fx_array(f, rec, Q);
    for (int i = 0; i < Q; i++) {
        rec_init(&r[i], M_NOP, NULL);
        submit_rec(p, &r[i]);
    }
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_close(p), TP_OK); /* idempotent */
    assert_int_equal(tp_close(NULL), TP_EINVAL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_MS(10), NULL), TP_ECLOSED);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, Q);  /* nothing accepted is dropped */
    assert_int_equal(s.workers, W); /* workers stay to drain */

    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    s = tpt_stats(p);
    assert_int_equal(s.workers, 0);
    tpt_assert_at_rest(&s);
    for (int i = 0; i < Q; i++) {
        assert_int_equal(atomic_load(&r[i].ran), 1);
        assert_int_equal(atomic_load(&r[i].calls), 1);
        assert_int_equal(atomic_load(&r[i].status), 0);
    }
    assert_int_equal(s.succeeded, W + Q);
    assert_int_equal(s.rejected_closed, 2);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK); /* repeatable */
    assert_int_equal(tp_wait(p, 0), TP_OK);           /* 0: no limit, already done */
    s = tpt_finish(p);
    assert_int_equal(s.workers, 0);
}

/* A pool closed with nothing in it: workers exit, wait gives TP_OK. */
static void test_close_idle_pool(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 3, 4, TP_UNLIMITED);
    TPT_EVENTUALLY(tpt_stats(p).workers == 3);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tpt_stats(p).workers, 0);
    tpt_finish(p);
}

/* ------------------------------------------------------------ shutdown in time */

static void test_shutdown_drains_in_time(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 2, N = 8 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, 16, TP_UNLIMITED);
    atomic_int done = 0;
    rec *r = tpt_fx_array(f, rec, N);
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], i < W ? M_BLOCK : M_WORK, l);
        atomic_store(&r[i].slow_done, 1);
        r[i].done_counter = &done;
        submit_rec(p, &r[i]);
    }
    TPT_EVENTUALLY(atomic_load(&l->waiting) == W);
    opener *op = tpt_fx_new(f, opener);
    *op = (opener){l, TPT_MS(50)};
    tpt_fx_thr *th = tpt_fx_thread(f, opener_main, op);
    uint64_t t0 = tp_now_ns();
    int rc = tp_shutdown(p, TPT_WAIT_NS);
    int done_at_return = atomic_load(&done);
    uint64_t el = tp_now_ns() - t0;
    tpt_fx_join(th);
    assert_int_equal(rc, TP_OK);
    assert_int_equal(done_at_return, N); /* every on_done had returned */
    assert_true(el < TPT_WAIT_NS);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&r[i].calls), 1);
        assert_int_equal(atomic_load(&r[i].status), 0);
        assert_int_equal(atomic_load(&r[i].ran), 1);
    }
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK); /* same result again */
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, N);
    assert_int_equal(s.cancelled, 0);
}

/* ------------------------------------------------------------ forced shutdown */

static void test_forced_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { Q = 5 };
    const uint64_t budget = TPT_MS(200);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 10, TP_UNLIMITED);
    rec *blk = tpt_fx_new(f, rec);
    rec *slp = tpt_fx_new(f, rec);
    rec *q = tpt_fx_array(f, rec, Q);
    rec_init(blk, M_BLOCK, l); /* ignores cancellation until the latch opens */
    rec_init(slp, M_SLEEP, NULL);
    submit_rec(p, blk);
    submit_rec(p, slp);
    TPT_EVENTUALLY(tpt_stats(p).active == 2 && atomic_load(&blk->ran) == 1 && atomic_load(&slp->ran) == 1);
    for (int i = 0; i < Q; i++) {
        rec_init(&q[i], M_NOP, NULL);
        submit_rec(p, &q[i]);
    }

    uint64_t t0 = tp_now_ns();
    int rc = tp_shutdown(p, budget);
    uint64_t el = tp_now_ns() - t0;
    assert_int_equal(rc, TP_ETIMEDOUT);
    assert_true(el >= budget - TPT_MS(1));         /* not before its deadline */
    assert_true(el < budget + TPT_WAIT_NS / 4);    /* and not waiting for the blocked task */
    assert_int_equal(atomic_load(&blk->calls), 0); /* still running */

    /* The sleeping task sees the cancellation and ends with it. */
    TPT_EVENTUALLY(atomic_load(&slp->calls) == 1);
    assert_int_equal(atomic_load(&slp->status), TP_ECANCELED);
    assert_int_equal(atomic_load(&slp->err_after), TP_ECANCELED);
    /* Queued tasks end without running, once, with TP_ECANCELED, even though
     * one worker is still blocked. */
    for (int i = 0; i < Q; i++) {
        TPT_EVENTUALLY(atomic_load(&q[i].calls) == 1);
        assert_int_equal(atomic_load(&q[i].status), TP_ECANCELED);
        assert_int_equal(atomic_load(&q[i].ran), 0);
    }
    assert_int_equal(atomic_load(&l->waiting), 1);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);

    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT); /* the shutdown's result */
    assert_int_equal(atomic_load(&blk->calls), 1);
    assert_int_equal(atomic_load(&blk->status), 0);               /* 0 is success */
    assert_int_equal(atomic_load(&blk->err_after), TP_ECANCELED); /* it was told */
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_assert_counts(s, TPT_EQ(workers, 0), TPT_EQ(started, 2), TPT_EQ(succeeded, 1),
                      TPT_EQ(cancelled, Q + 1), TPT_EQ(failed, Q + 1));
    for (int i = 0; i < Q; i++) {
        assert_int_equal(atomic_load(&q[i].calls), 1);
        assert_int_equal(atomic_load(&q[i].ran), 0);
    }
    assert_int_equal(atomic_load(&slp->calls), 1);
    tpt_destroy(p);
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* A task waiting for its retry is dropped by a forced shutdown, no retry runs. */
static atomic_int retry_attempts;

static int fail_once_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add(&retry_attempts, 1);
    return 3;
}

static void test_forced_shutdown_drops_retry(void **state) {
    tpt_fixture *f = tpt_fx(state);
    atomic_store(&retry_attempts, 0);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 4;
    c.max_retries = 5;
    c.retry_delay_ns = TPT_S(60); /* never within the test */
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, fail_once_task, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1 && tpt_stats(p).active == 0);
    assert_int_equal(atomic_load(&d->calls), 0);

    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_shutdown(p, TPT_MS(100)), TP_ETIMEDOUT);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS / 4);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    assert_int_equal(atomic_load(&d->status), TP_ECANCELED);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&retry_attempts), 1);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_assert_counts(s, TPT_EQ(retried, 0), TPT_EQ(cancelled, 1), TPT_EQ(workers, 0));
    tpt_destroy(p);
    assert_int_equal(atomic_load(&d->calls), 1);
}

/* ------------------------------------------------------------ one countdown */

typedef struct shut_call {
    tp_pool *p;
    uint64_t budget;
    atomic_int *start; /* optional gate */
    atomic_int *ready; /* counts callers about to call */
    uint64_t called_at, returned_at;
    int rc;
    int is_wait; /* call tp_wait instead */
    atomic_int *done_counter;
    int done_at_return;
} shut_call;

static void *shut_main(void *a) {
    shut_call *s = a;
    if (s->ready != NULL) atomic_fetch_add(s->ready, 1);
    if (s->start != NULL) {
        uint64_t end = tp_now_ns() + TPT_WAIT_NS;
        while (!atomic_load(s->start) && tp_now_ns() < end) tpt_pause();
    }
    s->called_at = tp_now_ns();
    s->rc = s->is_wait ? tp_wait(s->p, s->budget) : tp_shutdown(s->p, s->budget);
    if (s->done_counter != NULL) s->done_at_return = atomic_load(s->done_counter);
    s->returned_at = tp_now_ns();
    return NULL;
}

/* A second call with a huge budget started later still returns TP_ETIMEDOUT
 * at the first call's deadline. */
static void test_shutdown_countdown_not_reset(void **state) {
    tpt_fixture *f = tpt_fx(state);
    const uint64_t budget = TPT_MS(300);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);

    shut_call *first = tpt_fx_new(f, shut_call);
    first->p = p;
    first->budget = budget;
    tpt_fx_thr *th = tpt_fx_thread(f, shut_main, first);
    TPT_EVENTUALLY(pool_closed(p)); /* the first call has begun */
    uint64_t t1 = tp_now_ns();
    int rc2 = tp_shutdown(p, TPT_S(60));
    uint64_t t2 = tp_now_ns();
    tpt_fx_join(th);

    assert_int_equal(first->rc, TP_ETIMEDOUT);
    assert_int_equal(rc2, TP_ETIMEDOUT);
    /* The second returned at the first deadline: not before it, and far
     * earlier than its own 60 s (the blocked task holds on for up to 20 s). */
    assert_true(t2 >= first->called_at + budget - TPT_MS(1));
    assert_true(t2 - t1 < TPT_WAIT_NS / 4);
    assert_true(first->returned_at - first->called_at >= budget - TPT_MS(1));

    /* A later call returns the same outcome at once. */
    uint64_t t3 = tp_now_ns();
    assert_int_equal(tp_shutdown(p, TP_FOREVER), TP_ETIMEDOUT);
    assert_true(tp_now_ns() - t3 < TPT_WAIT_NS / 4);
    assert_int_equal(tp_shutdown(p, 0), TP_ETIMEDOUT);

    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_destroy(p);
}

/* A shorter budget in a later call does not shorten the countdown either. */
static void test_shutdown_countdown_not_shortened(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_int done = 0;
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_NOP, NULL);
    r->done_counter = &done;
    submit_rec(p, r);

    shut_call *first = tpt_fx_new(f, shut_call);
    first->p = p;
    first->budget = TPT_WAIT_NS;
    tpt_fx_thr *th = tpt_fx_thread(f, shut_main, first);
    TPT_EVENTUALLY(pool_closed(p));
    /* The first call's budget is 20 s: a 1 ms call must wait for the same
     * outcome, which comes when the test opens the latch. */
    shut_call *second = tpt_fx_new(f, shut_call);
    second->p = p;
    second->budget = TPT_MS(1);
    second->done_counter = &done;
    tpt_fx_thr *th2 = tpt_fx_thread(f, shut_main, second);
    tpt_sleep_ns(TPT_MS(30)); /* let the second call start; not needed for correctness */
    tpt_latch_open(l);
    tpt_fx_join(th);
    tpt_fx_join(th2);
    assert_int_equal(first->rc, TP_OK);
    assert_int_equal(second->rc, TP_OK);
    assert_int_equal(second->done_at_return, 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 0);
}

/* ------------------------------------------------------------ concurrent callers */

static void test_concurrent_shutdown_drained(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 2, N = 6, T = 6 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, 16, TP_UNLIMITED);
    atomic_int done = 0;
    rec *r = tpt_fx_array(f, rec, N);
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], M_BLOCK, l);
        atomic_store(&r[i].slow_done, 1);
        r[i].done_counter = &done;
        submit_rec(p, &r[i]);
    }
    TPT_EVENTUALLY(atomic_load(&l->waiting) == W && tpt_stats(p).active == W);

    atomic_int start = 0, ready = 0;
    shut_call *c = tpt_fx_array(f, shut_call, T);
    tpt_fx_thr *th[T];
    for (int i = 0; i < T; i++) {
        c[i].p = p;
        c[i].budget = TPT_WAIT_NS;
        c[i].start = &start;
        c[i].ready = &ready;
        c[i].is_wait = (i % 3 == 2); /* some plain waiters among them */
        c[i].done_counter = &done;
        th[i] = tpt_fx_thread(f, shut_main, &c[i]);
    }
    TPT_EVENTUALLY(atomic_load(&ready) == T);
    atomic_store(&start, 1);
    TPT_EVENTUALLY(pool_closed(p));
    tpt_sleep_ns(TPT_MS(20)); /* likely all inside their call */
    tpt_latch_open(l);
    for (int i = 0; i < T; i++) tpt_fx_join(th[i]);
    for (int i = 0; i < T; i++) {
        assert_int_equal(c[i].rc, TP_OK);
        assert_int_equal(c[i].done_at_return, N); /* on_done all returned */
    }
    for (int i = 0; i < N; i++) assert_int_equal(atomic_load(&r[i].calls), 1);
    tpt_finish(p);
}

static void test_concurrent_shutdown_forced(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { T = 6 };
    const uint64_t budget = TPT_MS(150);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    rec *q = tpt_fx_new(f, rec);
    rec_init(q, M_NOP, NULL);
    submit_rec(p, q);

    atomic_int start = 0, ready = 0;
    shut_call *c = tpt_fx_array(f, shut_call, T);
    tpt_fx_thr *th[T];
    for (int i = 0; i < T; i++) {
        c[i].p = p;
        c[i].budget = budget;
        c[i].start = &start;
        c[i].ready = &ready;
        th[i] = tpt_fx_thread(f, shut_main, &c[i]);
    }
    TPT_EVENTUALLY(atomic_load(&ready) == T);
    uint64_t t0 = tp_now_ns();
    atomic_store(&start, 1);
    for (int i = 0; i < T; i++) tpt_fx_join(th[i]);
    for (int i = 0; i < T; i++) {
        assert_int_equal(c[i].rc, TP_ETIMEDOUT);
        assert_true(c[i].returned_at - t0 >= budget - TPT_MS(1));
        assert_true(c[i].returned_at - t0 < TPT_WAIT_NS / 4);
    }
    TPT_EVENTUALLY(atomic_load(&q->calls) == 1);
    assert_int_equal(atomic_load(&q->status), TP_ECANCELED);
    assert_int_equal(atomic_load(&q->ran), 0);

    /* concurrent tp_wait callers while the blocked task still runs, then
     * after it returned: all get the shutdown's result */
    shut_call *w = tpt_fx_array(f, shut_call, 3);
    tpt_fx_thr *wt[3];
    for (int i = 0; i < 3; i++) {
        w[i].p = p;
        w[i].budget = TPT_WAIT_NS;
        w[i].is_wait = 1;
        wt[i] = tpt_fx_thread(f, shut_main, &w[i]);
    }
    tpt_latch_open(l);
    for (int i = 0; i < 3; i++) {
        tpt_fx_join(wt[i]);
        assert_int_equal(w[i].rc, TP_ETIMEDOUT);
    }
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    tpt_destroy(p);
}

/* ------------------------------------------------------------ ignoring task */

static void test_task_ignoring_cancellation(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    rec *blk = tpt_fx_new(f, rec);
    rec_init(blk, M_BLOCK, l);
    submit_rec(p, blk);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1 && tpt_stats(p).active == 1);

    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_shutdown(p, TPT_MS(100)), TP_ETIMEDOUT);
    uint64_t el = tp_now_ns() - t0;
    assert_true(el >= TPT_MS(99));
    assert_true(el < TPT_WAIT_NS / 4);

    t0 = tp_now_ns();
    assert_int_equal(tp_wait(p, TPT_MS(50)), TP_ETIMEDOUT); /* its own timeout */
    el = tp_now_ns() - t0;
    assert_true(el >= TPT_MS(49));
    assert_true(el < TPT_WAIT_NS / 4);
    assert_int_equal(tpt_stats(p).active, 1);
    assert_int_equal(tpt_stats(p).workers, 1);
    assert_int_equal(atomic_load(&blk->calls), 0);

    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT); /* the shutdown's result */
    assert_int_equal(atomic_load(&blk->calls), 1);
    assert_int_equal(atomic_load(&blk->status), 0);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    tpt_destroy(p);
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* ------------------------------------------------------------ tp_wait */

typedef struct wait_call {
    tp_pool *p;
    atomic_int returned;
    int rc;
} wait_call;

static void *wait_main(void *a) {
    wait_call *w = a;
    w->rc = tp_wait(w->p, TPT_WAIT_NS);
    atomic_store(&w->returned, 1);
    return NULL;
}

/* tp_wait does not start a shutdown: it waits for someone else's close. */
static void test_wait_alone_waits_for_close(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 8, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);

    /* On its own it times out and leaves the pool open and working. */
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_wait(p, TPT_MS(50)), TP_ETIMEDOUT);
    assert_true(tp_now_ns() - t0 >= TPT_MS(49));
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    assert_int_equal(tpt_stats(p).workers, 2);

    wait_call *w = tpt_fx_new(f, wait_call);
    w->p = p;
    tpt_fx_thr *th = tpt_fx_thread(f, wait_main, w);
    /* Idle workers and an open pool: the waiter must not return by itself. */
    assert_false(TPT_POLL(atomic_load(&w->returned), TPT_MS(100)));
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);

    assert_int_equal(tp_close(p), TP_OK);
    assert_false(TPT_POLL(atomic_load(&w->returned), TPT_MS(20))); /* a task still runs */
    tpt_latch_open(l);
    tpt_fx_join(th);
    assert_int_equal(w->rc, TP_OK);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.workers, 0);
    tpt_assert_at_rest(&s);
    tpt_finish(p);
}

static void test_wait_returns_shutdown_result(void **state) {
    tpt_fixture *f = tpt_fx(state);
    /* drained */
    tp_pool *p = tpt_quiet_pool(f, 2, 8, TP_UNLIMITED);
    for (int i = 0; i < 4; i++) assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TP_FOREVER), TP_OK);
    tpt_finish(p);

    /* forced, the running task cooperates */
    p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    rec *r = tpt_fx_new(f, rec);
    rec_init(r, M_SLEEP, NULL);
    submit_rec(p, r);
    TPT_EVENTUALLY(atomic_load(&r->ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_shutdown(p, TPT_MS(20)), TP_ETIMEDOUT);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    assert_int_equal(tp_wait(p, 0), TP_ETIMEDOUT); /* repeatable */
    assert_int_equal(atomic_load(&r->calls), 1);   /* on_done returned */
    assert_int_equal(atomic_load(&r->status), TP_ECANCELED);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    tpt_destroy(p);

    assert_int_equal(tp_wait(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_shutdown(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_destroy(NULL), TP_EINVAL);
}

/* ------------------------------------------------------------ TP_EDEADLK */

#define RC_UNSET   1000
#define RC_SKIPPED 2000

typedef struct dl_probe {
    _Atomic(tp_pool *) pool;
    atomic_int shut_rc, wait_rc, destroy_rc, close_rc;
    atomic_int done;
    int do_close;
} dl_probe;

static void dl_init(dl_probe *d, tp_pool *p, int do_close) {
    atomic_init(&d->pool, p);
    atomic_init(&d->shut_rc, RC_UNSET);
    atomic_init(&d->wait_rc, RC_UNSET);
    atomic_init(&d->destroy_rc, RC_UNSET);
    atomic_init(&d->close_rc, RC_UNSET);
    atomic_init(&d->done, 0);
    d->do_close = do_close;
}

static void dl_run(dl_probe *d) {
    tp_pool *p = atomic_load(&d->pool);
    int s = tp_shutdown(p, TPT_MS(1));
    int w = tp_wait(p, TPT_MS(1));
    atomic_store(&d->shut_rc, s);
    atomic_store(&d->wait_rc, w);
    /* Only try destroy when the two others behaved: a wrong destroy here
     * would free the pool under our feet. */
    atomic_store(&d->destroy_rc, (s == TP_EDEADLK && w == TP_EDEADLK) ? tp_destroy(p) : RC_SKIPPED);
    if (d->do_close) atomic_store(&d->close_rc, tp_close(p));
    atomic_store(&d->done, 1);
}

static int dl_task(tp_ctx *c, void *arg) {
    (void)c;
    dl_run(arg);
    return 0;
}

static void dl_done(void *arg, int status) {
    (void)status;
    dl_run(arg);
}

static void assert_dl(dl_probe *d) {
    TPT_EVENTUALLY(atomic_load(&d->done) == 1);
    assert_int_equal(atomic_load(&d->shut_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d->wait_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d->destroy_rc), TP_EDEADLK);
}

static void test_edeadlk_from_task_and_on_done(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);

    /* inside a task */
    dl_probe *in_task = tpt_fx_new(f, dl_probe);
    dl_init(in_task, p, 0);
    assert_int_equal(tp_submit(p, dl_task, in_task, NULL, NULL), TP_OK);
    assert_dl(in_task);
    /* nothing else was done: the pool still admits and runs work */
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);

    /* inside on_done on a worker (after the task ran) */
    dl_probe *in_done = tpt_fx_new(f, dl_probe);
    dl_init(in_done, p, 0);
    o.on_done = dl_done;
    assert_int_equal(tp_submit(p, tpt_nop_task, in_done, &o, NULL), TP_OK);
    assert_dl(in_done);

    /* inside on_done of a task cancelled while queued (service thread) */
    tpt_fill_workers(p, l, 1, NULL);
    dl_probe *in_svc = tpt_fx_new(f, dl_probe);
    dl_init(in_svc, p, 0);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, in_svc, &o, &id), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_dl(in_svc);
    tpt_latch_open(l);

    /* still open after all that */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);

    /* tp_close from a task is fine and does close */
    dl_probe *closer = tpt_fx_new(f, dl_probe);
    dl_init(closer, p, 1);
    assert_int_equal(tp_submit(p, dl_task, closer, NULL, NULL), TP_OK);
    assert_dl(closer);
    assert_int_equal(atomic_load(&closer->close_rc), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tpt_finish(p);
}

/* The worker hooks and the log hook are the pool's own threads too. */
typedef struct hook_probe {
    _Atomic(tp_pool *) pool;
    pthread_t main_thread;
    atomic_int armed; /* probe the log hook only around the failing task */
    atomic_int calls, wrong;
    atomic_int log_calls, log_wrong, log_on_caller;
} hook_probe;

static void hook_stop(void *arg) {
    hook_probe *h = arg;
    tp_pool *p = atomic_load(&h->pool);
    if (p == NULL) return;
    atomic_fetch_add(&h->calls, 1);
    if (tp_wait(p, TPT_MS(1)) != TP_EDEADLK) atomic_fetch_add(&h->wrong, 1);
    if (tp_shutdown(p, TPT_MS(1)) != TP_EDEADLK) atomic_fetch_add(&h->wrong, 1);
}

static void hook_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)level;
    (void)log_id;
    (void)msg;
    hook_probe *h = arg;
    tp_pool *p = atomic_load(&h->pool);
    if (p == NULL || !atomic_load(&h->armed)) return;
    if (pthread_equal(pthread_self(), h->main_thread)) {
        atomic_fetch_add(&h->log_on_caller, 1); /* "called on a pool thread" */
        return;
    }
    atomic_fetch_add(&h->log_calls, 1);
    if (tp_wait(p, TPT_MS(1)) != TP_EDEADLK) atomic_fetch_add(&h->log_wrong, 1);
    if (tp_shutdown(p, TPT_MS(1)) != TP_EDEADLK) atomic_fetch_add(&h->log_wrong, 1);
}

static int failing_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 7;
}

static void test_edeadlk_from_hooks(void **state) {
    tpt_fixture *f = tpt_fx(state);
    hook_probe *h = tpt_fx_new(f, hook_probe);
    atomic_init(&h->pool, NULL);
    atomic_init(&h->calls, 0);
    atomic_init(&h->wrong, 0);
    atomic_init(&h->log_calls, 0);
    atomic_init(&h->log_wrong, 0);
    atomic_init(&h->log_on_caller, 0);
    atomic_init(&h->armed, 0);
    h->main_thread = pthread_self();
    tp_config c = {0};
    c.workers = 2;
    c.queue_capacity = 4;
    c.on_worker_stop = hook_stop;
    c.hook_arg = h;
    c.log = hook_log;
    c.log_arg = h;
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&h->pool, p);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    atomic_store(&h->armed, 1);
    assert_int_equal(tp_submit(p, failing_task, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    assert_int_equal(atomic_load(&d->status), 7);
    TPT_EVENTUALLY(atomic_load(&h->log_calls) >= 1);
    atomic_store(&h->armed, 0);
    assert_int_equal(atomic_load(&h->log_wrong), 0);
    assert_int_equal(atomic_load(&h->log_on_caller), 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK); /* still open */
    tpt_finish(p);
    assert_int_equal(atomic_load(&h->calls), 2);
    assert_int_equal(atomic_load(&h->wrong), 0);
}

/* ------------------------------------------------------------ destroy, create */

static void test_destroy_without_shutdown_drains(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 6 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    rec *r = tpt_fx_array(f, rec, N);
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], i == 0 ? M_BLOCK : M_WORK, l);
        submit_rec(p, &r[i]);
    }
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1);
    opener *op = tpt_fx_new(f, opener);
    *op = (opener){l, TPT_MS(50)};
    tpt_fx_thr *th = tpt_fx_thread(f, opener_main, op);
    tpt_destroy(p);
    tpt_fx_join(th);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&r[i].ran), 1);
        assert_int_equal(atomic_load(&r[i].calls), 1);
        assert_int_equal(atomic_load(&r[i].status), 0);
    }
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* Destroying an idle, never-used pool is fine too. */
static void test_destroy_idle_pool(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 2, 2, TP_UNLIMITED);
    tpt_destroy(p);
}

static void test_create_null_config(void **state) {
    tpt_fixture *f = tpt_fx(state);
    assert_int_equal(tp_create(NULL, NULL), TP_EINVAL);
    tp_pool *p = tpt_fx_pool(f, NULL); /* asserts tp_create(&p, NULL) == TP_OK, p != NULL */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0) {
        unsigned want = (unsigned)ncpu * 4u;
        if (want > TP_MAX_WORKERS) want = TP_MAX_WORKERS;
        TPT_EVENTUALLY(tpt_stats(p).workers == want);
    }
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &o, NULL), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&d->calls), 1);
    assert_int_equal(s.succeeded, 1);
}

/* stats.workers falls to 0 once tp_wait returned, whichever way it ended. */
static void test_workers_zero_after_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 4, 8, TP_UNLIMITED);
    TPT_EVENTUALLY(tpt_stats(p).workers == 4);
    for (int i = 0; i < 8; i++) assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.workers, 0);
    assert_int_equal(s.idle, 0);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_close_stops_admission_and_drains),
        TPT_TEST(test_close_idle_pool),
        TPT_TEST(test_shutdown_drains_in_time),
        TPT_TEST(test_forced_shutdown),
        TPT_TEST(test_forced_shutdown_drops_retry),
        TPT_TEST(test_shutdown_countdown_not_reset),
        TPT_TEST(test_shutdown_countdown_not_shortened),
        TPT_TEST(test_concurrent_shutdown_drained),
        TPT_TEST(test_concurrent_shutdown_forced),
        TPT_TEST(test_task_ignoring_cancellation),
        TPT_TEST(test_wait_alone_waits_for_close),
        TPT_TEST(test_wait_returns_shutdown_result),
        TPT_TEST(test_edeadlk_from_task_and_on_done),
        TPT_TEST(test_edeadlk_from_hooks),
        TPT_TEST(test_destroy_without_shutdown_drains),
        TPT_TEST(test_destroy_idle_pool),
        TPT_TEST(test_create_null_config),
        TPT_TEST(test_workers_zero_after_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
