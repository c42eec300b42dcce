/*
 * test_retry.c -- retries (header sections 4, 6, 9).
 *
 * Covers: retries exhausted (one start, max_retries extra attempts, attempts
 * 0..max seen, one on_done with the last status), success on attempt k, a
 * waiting retry holds no worker (delayed, not active) but keeps its user slot,
 * a retry goes to the back of the queue, forced shutdown cuts a retry short,
 * no retry after tp_cancel, cancel while waiting for a retry, a deadline that
 * passes while a retry waits (or while the attempt runs), a run timeout is a
 * retried failure, delayed tasks count toward the queue capacity, the log hook
 * sees TP_LOG_WARN / TP_LOG_ERROR per failed attempt with the task's log id
 * and the retry delay in the unit that fits (ns, us, ms, s),
 * and tp_close lets pending retries finish.
 *
 * Pool threads record into atomics (and a mutex-protected log array); only
 * the main thread asserts.
 */
#define _GNU_SOURCE
#include <inttypes.h>

#include "tp_test.h"

enum { RT_RETURN = 0, RT_TIMEOUT = 1, RT_WAIT_CANCEL = 2 };
#define ALWAYS INT32_MAX

typedef struct rt {
    /* inputs */
    int mode;             /* RT_RETURN, RT_TIMEOUT (sleep until the timeout), RT_WAIT_CANCEL */
    int fail_until;       /* attempts < fail_until fail; ALWAYS: every one */
    int fail_status;      /* RT_RETURN: the failing status */
    int after_cancel;     /* RT_WAIT_CANCEL: status returned once cancelled */
    tpt_latch *gate0;     /* attempt 0 waits on it before deciding */
    tp_pool *close_pool;  /* attempt 0 calls tp_close() on it */
    uint64_t run_timeout; /* the run timeout it was submitted with (0: none) */
    int tag;              /* for the order log */
    tp_pool *pool;        /* on_done: look at the pool's state from there */
    const char *user;
    /* outputs */
    atomic_int attempts;
    atomic_uint seen;       /* bit n: attempt n (< 32) ran */
    atomic_int attempt_sum; /* sum of tp_ctx_attempt over all attempts */
    atomic_int max_attempt;
    atomic_int bad_id;        /* tp_ctx_id changed between attempts */
    atomic_int err_start_bad; /* tp_ctx_err non-zero when an attempt began (see rt_task) */
    _Atomic uint64_t t_prev;  /* the submit (set by the test), then each attempt's return */
    _Atomic uint64_t id;
    atomic_int running;
    _Atomic uint64_t t_return0;
    atomic_int done_calls;
    atomic_int done_status;
    _Atomic uint64_t t_done;
    atomic_int done_user_slots;      /* tp_user_active() seen in on_done */
    _Atomic uint64_t done_completed; /* stats.completed seen in on_done */
} rt;

static atomic_int order_n;
static atomic_int order[64];

static void order_reset(void) {
    atomic_store(&order_n, 0);
    for (int i = 0; i < 64; i++) atomic_store(&order[i], -1);
}

static void rt_done(void *arg, int status) {
    rt *r = arg;
    if (r->pool) {
        atomic_store(&r->done_user_slots, (int)tp_user_active(r->pool, r->user));
        atomic_store(&r->done_completed, tpt_stats(r->pool).completed);
    }
    atomic_store(&r->t_done, tp_now_ns());
    atomic_store(&r->done_status, status);
    atomic_fetch_add(&r->done_calls, 1);
}

static int rt_task(tp_ctx *c, void *arg) {
    rt *r = arg;
    int a = (int)tp_ctx_attempt(c);
    int n = atomic_fetch_add(&order_n, 1);
    if (n >= 0 && n < 64) atomic_store(&order[n], r->tag * 100 + a);
    /* An attempt's run timeout counts from its own start, which is after the
     * previous attempt returned (or after the submit): an error seen less
     * than a run timeout after that moment is one the attempt did not earn.
     * A later one may be the machine's stall, not the pool's: not counted. */
    if (tp_ctx_err(c) != 0) {
        uint64_t seen = tp_now_ns();
        if (!r->run_timeout || seen - atomic_load(&r->t_prev) < r->run_timeout)
            atomic_fetch_add(&r->err_start_bad, 1);
    }
    uint64_t id = tp_ctx_id(c);
    uint64_t expect = 0;
    if (!atomic_compare_exchange_strong(&r->id, &expect, id) && expect != id) atomic_fetch_add(&r->bad_id, 1);
    if (a < 32) atomic_fetch_or(&r->seen, 1u << a);
    atomic_fetch_add(&r->attempt_sum, a);
    if (a > atomic_load(&r->max_attempt)) atomic_store(&r->max_attempt, a);
    atomic_fetch_add(&r->attempts, 1);
    atomic_store(&r->running, 1);

    if (a == 0 && r->gate0) tpt_latch_wait(r->gate0);
    if (a == 0 && r->close_pool) tp_close(r->close_pool);

    int rc = 0;
    if (r->mode == RT_WAIT_CANCEL) {
        uint64_t end = tp_now_ns() + TPT_WAIT_NS;
        while (tp_ctx_err(c) == 0 && tp_now_ns() < end) tpt_pause(); /* between polls of a bounded loop */
        rc = r->after_cancel;
    } else if (a < r->fail_until) {
        if (r->mode == RT_TIMEOUT)
            rc = tp_ctx_sleep(c, TPT_S(20)); /* ends at the run timeout */
        else
            rc = r->fail_status;
    }
    uint64_t t_end = tp_now_ns();
    if (a == 0) atomic_store(&r->t_return0, t_end);
    atomic_store(&r->t_prev, t_end);
    atomic_store(&r->running, 0);
    return rc;
}

/* A quiet pool that retries a failed task max_retries times, delay_ns apart. */
static tp_pool *retry_pool(tpt_fixture *f, unsigned workers, unsigned max_retries, uint64_t delay_ns,
                           unsigned capacity) {
    tp_config cfg = tpt_quiet_config(workers, capacity, 0);
    cfg.max_retries = max_retries;
    cfg.retry_delay_ns = delay_ns;
    return tpt_fx_pool(f, &cfg);
}

static void submit_rt(tp_pool *p, rt *r, const tp_task_opts *base, uint64_t *id) {
    tp_task_opts o = {0};
    if (base) o = *base;
    o.on_done = rt_done;
    r->run_timeout = o.run_timeout_ns;
    atomic_store(&r->t_prev, tp_now_ns());
    assert_int_equal(tp_submit(p, rt_task, r, &o, id), TP_OK);
}

/* ------------------------------------------------------------ outcomes */

static void test_retry_exhausted(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 2, 3, TPT_MS(2), 0);
    rt *r = tpt_fx_new(f, rt);
    r->fail_until = ALWAYS;
    r->fail_status = 42;
    r->pool = p;
    r->user = "exhausted-user";
    tp_task_opts o = {0};
    o.user = r->user;
    submit_rt(p, r, &o, NULL);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    /* Before on_done ran, the slot was released and the task counted. */
    assert_int_equal(atomic_load(&r->done_user_slots), 0);
    assert_int_equal(atomic_load(&r->done_completed), 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    assert_int_equal(atomic_load(&r->done_status), 42);
    assert_int_equal(atomic_load(&r->attempts), 4);
    assert_int_equal(atomic_load(&r->seen), 0xF);
    assert_int_equal(atomic_load(&r->bad_id), 0);
    tpt_assert_counts(s, TPT_EQ(accepted, 1), TPT_EQ(started, 1), TPT_EQ(retried, 3), TPT_EQ(completed, 1),
                      TPT_EQ(succeeded, 0), TPT_EQ(failed, 1), TPT_EQ(cancelled, 0), TPT_EQ(expired, 0));
}

static void test_retry_none_by_default(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 1, 0, 0, 0);
    rt *r = tpt_fx_new(f, rt);
    r->fail_until = ALWAYS;
    r->fail_status = -1000;
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->attempts), 1);
    assert_int_equal(atomic_load(&r->done_status), -1000);
    assert_int_equal(s.retried, 0);
    assert_int_equal(s.failed, 1);
}

static void test_retry_max_100(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 1, TP_MAX_RETRIES, TPT_MS(1), 0);
    rt *r = tpt_fx_new(f, rt);
    r->fail_until = ALWAYS;
    r->fail_status = 3;
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->attempts), 101);
    assert_int_equal(atomic_load(&r->attempt_sum), 100 * 101 / 2);
    assert_int_equal(atomic_load(&r->max_attempt), 100);
    assert_int_equal(atomic_load(&r->done_status), 3);
    assert_int_equal(s.started, 1);
    assert_int_equal(s.retried, 100);
}

static void test_retry_succeeds_on_attempt_k(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 2, 5, TPT_MS(2), 0);
    rt *r = tpt_fx_new(f, rt);
    r->fail_until = 2; /* attempts 0 and 1 fail, 2 succeeds */
    r->fail_status = 9;
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    assert_int_equal(atomic_load(&r->done_status), 0);
    assert_int_equal(atomic_load(&r->attempts), 3);
    assert_int_equal(atomic_load(&r->seen), 0x7);
    assert_int_equal(atomic_load(&r->bad_id), 0);
    tpt_assert_counts(s, TPT_EQ(started, 1), TPT_EQ(retried, 2), TPT_EQ(succeeded, 1), TPT_EQ(failed, 0));
}

/* ------------------------------------------------------------ waiting retries */

static void test_retry_holds_no_worker(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    tp_pool *p = retry_pool(fx, 1, 1, TPT_S(60), 0); /* the retry would come in 60 s */
    rt *f = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    tp_task_opts o = {0};
    o.user = "u";
    uint64_t fid = 0;
    submit_rt(p, f, &o, &fid);

    tp_stats s;
    TPT_EVENTUALLY((s = tpt_stats(p)).delayed == 1 && s.active == 0 && s.idle == 1);
    assert_int_equal(s.queued, 0);
    assert_int_equal(atomic_load(&f->attempts), 1);
    /* It keeps its user slot while it waits. */
    assert_int_equal(tp_user_active(p, "u"), 1);
    assert_int_equal(s.users, 1);

    /* The only worker is free: another task runs meanwhile. */
    rt *g = tpt_fx_new(fx, rt);
    submit_rt(p, g, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&g->done_calls) == 1);
    assert_int_equal(atomic_load(&g->done_status), 0);
    s = tpt_stats(p);
    assert_int_equal(s.delayed, 1);
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_int_equal(atomic_load(&f->done_calls), 0);

    /* Cancelled while waiting: TP_ECANCELED, no further attempt. */
    assert_int_equal(tp_cancel(p, fid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ECANCELED);
    assert_int_equal(tp_cancel(p, fid), TP_ENOTFOUND);
    assert_int_equal(tp_user_active(p, "u"), 0);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);

    s = tpt_finish(p);
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_int_equal(atomic_load(&f->done_calls), 1);
    tpt_assert_counts(s, TPT_EQ(started, 2), TPT_EQ(retried, 0), TPT_EQ(succeeded, 1), TPT_EQ(failed, 1),
                      TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
}

static void test_retry_cancel_while_waiting_all_workers_busy(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    tp_pool *p = retry_pool(fx, 1, 2, TPT_S(60), 0);
    rt *f = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    uint64_t fid = 0;
    submit_rt(p, f, NULL, &fid);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1);

    tpt_latch *gate = tpt_fx_latch(fx);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    /* Its on_done must not need a worker. */
    assert_int_equal(tp_cancel(p, fid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ECANCELED);
    assert_int_equal(atomic_load(&gate->waiting), 1);

    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_int_equal(s.retried, 0);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

static void test_retry_goes_to_back_of_queue(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    order_reset();
    tp_pool *p = retry_pool(fx, 1, 1, TPT_MS(1), 0);
    tpt_latch *l0 = tpt_fx_latch(fx);
    tpt_latch *l1 = tpt_fx_latch(fx);
    rt *f = tpt_fx_new(fx, rt);
    rt *a1 = tpt_fx_new(fx, rt);
    rt *a2 = tpt_fx_new(fx, rt);
    rt *a3 = tpt_fx_new(fx, rt);
    rt *a4 = tpt_fx_new(fx, rt);
    f->tag = 9;
    f->fail_until = 1;
    f->fail_status = 1;
    f->gate0 = l0;
    a1->tag = 1;
    a1->gate0 = l1;
    a2->tag = 2;
    a3->tag = 3;
    a4->tag = 4;

    submit_rt(p, f, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&l0->waiting) == 1);
    submit_rt(p, a1, NULL, NULL);
    submit_rt(p, a2, NULL, NULL);
    submit_rt(p, a3, NULL, NULL);
    /* f fails; a1 takes the worker and blocks; f's retry queues behind a3-> */
    tpt_latch_open(l0);
    tp_stats s;
    TPT_EVENTUALLY(atomic_load(&l1->waiting) == 1 && (s = tpt_stats(p)).queued == 3 && s.delayed == 0);
    submit_rt(p, a4, NULL, NULL); /* after the retry was queued */
    tpt_latch_open(l1);

    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1 && atomic_load(&a4->done_calls) == 1);
    s = tpt_finish(p);
    const int expect[] = {900, 100, 200, 300, 901, 400};
    assert_int_equal(atomic_load(&order_n), 6);
    for (int i = 0; i < 6; i++) assert_int_equal(atomic_load(&order[i]), expect[i]);
    assert_int_equal(atomic_load(&f->done_status), 0);
    assert_int_equal(s.retried, 1);
    assert_int_equal(s.succeeded, 5);
}

/* ------------------------------------------------------------ what ends a retry */

static void test_retry_cut_by_forced_shutdown(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    tp_pool *p = retry_pool(fx, 2, 3, TPT_S(60), 0);
    /* f waits for a retry 60 s away; r runs until cancelled, then fails. */
    rt *f = tpt_fx_new(fx, rt);
    rt *r = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    f->pool = p;
    f->user = "waiting-user";
    r->mode = RT_WAIT_CANCEL;
    r->after_cancel = 5;
    tp_task_opts fo = {0};
    fo.user = f->user;
    submit_rt(p, f, &fo, NULL);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1);
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->running) == 1);

    assert_int_equal(tp_shutdown(p, TPT_MS(50)), TP_ETIMEDOUT);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1 && atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->done_status), 5);
    assert_int_equal(atomic_load(&f->done_user_slots), 0);
    assert_true(atomic_load(&f->done_completed) >= 1);
    tp_stats s = tpt_finish_forced(p);
    /* Neither got another attempt. */
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_int_equal(atomic_load(&r->attempts), 1);
    assert_int_equal(atomic_load(&f->done_calls), 1);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    tpt_assert_counts(s, TPT_EQ(started, 2), TPT_EQ(retried, 0), TPT_EQ(failed, 2),
                      TPT_EQ(cancelled, 1)); /* f; r returned a plain failure */
}

static void test_retry_not_after_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 1, 3, TPT_MS(1), 0);
    const int after[] = {7, TP_ECANCELED, 0};
    /* Outlives the loop: a wrong late retry must not touch a dead frame. */
    static rt rs[3];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < 3; i++) {
        rt *r = &rs[i];
        r->mode = RT_WAIT_CANCEL;
        r->after_cancel = after[i];
        uint64_t id = 0;
        submit_rt(p, r, NULL, &id);
        TPT_EVENTUALLY(atomic_load(&r->running) == 1);
        assert_int_equal(tp_cancel(p, id), TP_OK);
        TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
        assert_int_equal(atomic_load(&r->done_status), after[i]);
        /* Let a (wrong) retry, 1 ms away, have its chance. */
        TPT_POLL(atomic_load(&r->attempts) > 1, TPT_MS(50));
        assert_int_equal(atomic_load(&r->attempts), 1);
        assert_int_equal(atomic_load(&r->done_calls), 1);
    }
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(started, 3), TPT_EQ(retried, 0),
                      TPT_EQ(succeeded, 1),                     /* 0 is success even when cancelled */
                      TPT_EQ(failed, 2), TPT_EQ(cancelled, 1)); /* only the TP_ECANCELED status */
}

/* Deadline scenarios run under tpt_with_time_to_spare. One whose state was
 * not reached before its deadline lets everything end and finishes. */
static bool missed(tp_pool *p, rt *r, tpt_latch *a, tpt_latch *b) {
    if (a) tpt_latch_open(a);
    if (b) tpt_latch_open(b);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    tpt_finish(p);
    return false;
}

/* The retry is 60 s away; the deadline ends the task well before. */
static bool deadline_while_waiting(tpt_fixture *fx, uint64_t span, void *arg) {
    (void)arg;
    tp_pool *p = retry_pool(fx, 1, 3, TPT_S(60), 0);
    rt *f = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + span;
    submit_rt(p, f, &o, NULL);
    /* The state: attempt 0 failed and its retry waits, before the deadline. */
    if (!TPT_POLL(tpt_stats(p).delayed == 1 && tp_now_ns() < o.deadline_ns, tpt_left_until(o.deadline_ns)))
        return missed(p, f, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_true(atomic_load(&f->t_return0) < o.deadline_ns);
    /* The task did not end before its deadline. */
    assert_true(atomic_load(&f->t_done) >= o.deadline_ns);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(started, 1), TPT_EQ(retried, 0), TPT_EQ(failed, 1), TPT_EQ(cancelled, 1),
                      TPT_EQ(expired, 0)); /* it ran */
    return true;
}

static void test_retry_deadline_passes_while_waiting(void **state) {
    tpt_with_time_to_spare(tpt_fx(state), TPT_S(1), deadline_while_waiting, NULL);
}

static bool deadline_while_running(tpt_fixture *fx, uint64_t span, void *arg) {
    tp_pool *p = retry_pool(fx, 1, 3, TPT_MS(1), 0);
    /* Sleeps until the deadline, returns TP_ETIMEDOUT: not retried. */
    rt *f = tpt_fx_new(fx, rt);
    f->mode = RT_TIMEOUT;
    f->fail_until = ALWAYS;
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + span;
    o.run_timeout_ns = TP_FOREVER;
    submit_rt(p, f, &o, NULL);
    if (!TPT_POLL(atomic_load(&f->running) == 1 && tp_now_ns() < o.deadline_ns,
                  tpt_left_until(o.deadline_ns)))
        return missed(p, f, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ETIMEDOUT);

    /* Fails with a plain status after its deadline: not retried either, and
     * its status is what it returned. */
    rt *g = tpt_fx_new(fx, rt);
    g->mode = RT_RETURN;
    g->fail_until = ALWAYS;
    g->fail_status = 11;
    tpt_latch *gate = arg;
    tpt_latch_rearm(gate);
    g->gate0 = gate;
    o.deadline_ns = tp_now_ns() + span;
    submit_rt(p, g, &o, NULL);
    if (!TPT_POLL(atomic_load(&gate->waiting) == 1 && tp_now_ns() < o.deadline_ns,
                  tpt_left_until(o.deadline_ns)))
        return missed(p, g, gate, NULL);
    tpt_sleep_until(o.deadline_ns + TPT_MS(1));
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&g->done_calls) == 1);
    assert_int_equal(atomic_load(&g->done_status), 11);

    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&f->attempts), 1);
    assert_int_equal(atomic_load(&g->attempts), 1);
    tpt_assert_counts(s, TPT_EQ(retried, 0), TPT_EQ(failed, 2), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
    return true;
}

static void test_retry_deadline_passes_while_running(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    tpt_with_time_to_spare(fx, TPT_MS(300), deadline_while_running, tpt_fx_latch(fx));
}

/* The retry is back in the queue (behind a blocker) when its deadline passes:
 * it ends TP_ETIMEDOUT without another attempt, cancelled but not expired,
 * since it ran before. */
static bool deadline_while_requeued(tpt_fixture *fx, uint64_t span, void *arg) {
    tp_pool *p = retry_pool(fx, 1, 3, TPT_MS(1), 0);
    tpt_latch *l0 = ((tpt_latch **)arg)[0];
    tpt_latch *lb = ((tpt_latch **)arg)[1];
    tpt_latch_rearm(l0);
    tpt_latch_rearm(lb);
    rt *f = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    f->gate0 = l0;
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + span;
    submit_rt(p, f, &o, NULL);
    if (!TPT_POLL(atomic_load(&l0->waiting) == 1 && tp_now_ns() < o.deadline_ns,
                  tpt_left_until(o.deadline_ns)))
        return missed(p, f, l0, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, lb, NULL, NULL), TP_OK);
    tpt_latch_open(l0);
    /* The state: f failed, the blocker holds the worker, f's retry waits in
     * the queue -- before the deadline. */
    tp_stats s;
    if (!TPT_POLL(atomic_load(&lb->waiting) == 1 && (s = tpt_stats(p)).queued == 1 && s.delayed == 0 &&
                      tp_now_ns() < o.deadline_ns,
                  tpt_left_until(o.deadline_ns)))
        return missed(p, f, lb, NULL);
    assert_true(atomic_load(&f->t_return0) < o.deadline_ns);
    tpt_sleep_until(o.deadline_ns + TPT_MS(1));
    tpt_latch_open(lb);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    assert_int_equal(atomic_load(&f->done_status), TP_ETIMEDOUT);
    s = tpt_finish(p);
    assert_int_equal(atomic_load(&f->attempts), 1);
    tpt_assert_counts(s, TPT_EQ(started, 2), TPT_EQ(retried, 0), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
    return true;
}

static void test_retry_deadline_passes_while_requeued(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    tpt_latch *l[2] = {tpt_fx_latch(fx), tpt_fx_latch(fx)};
    tpt_with_time_to_spare(fx, TPT_MS(600), deadline_while_requeued, l);
}

static void test_retry_run_timeout_is_retried(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 1, 2, TPT_MS(2), 0);
    rt *r = tpt_fx_new(f, rt);
    r->mode = RT_TIMEOUT;
    r->fail_until = 2; /* attempts 0 and 1 run into their timeout */
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_MS(30);
    submit_rt(p, r, &o, NULL);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_status), 0);
    assert_int_equal(atomic_load(&r->attempts), 3);
    /* Each attempt gets its own run timeout, from its own start. */
    assert_int_equal(atomic_load(&r->err_start_bad), 0);
    tpt_assert_counts(s, TPT_EQ(retried, 2), TPT_EQ(succeeded, 1), TPT_EQ(failed, 0));

    /* Exhausted by run timeouts: the status is the last attempt's. */
    p = retry_pool(f, 1, 1, TPT_MS(2), 0);
    rt *t = tpt_fx_new(f, rt);
    t->mode = RT_TIMEOUT;
    t->fail_until = ALWAYS;
    submit_rt(p, t, &o, NULL);
    TPT_EVENTUALLY(atomic_load(&t->done_calls) == 1);
    s = tpt_finish(p);
    assert_int_equal(atomic_load(&t->done_status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&t->attempts), 2);
    tpt_assert_counts(s, TPT_EQ(retried, 1), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
}

/* ------------------------------------------------------------ capacity */

static void test_retry_delayed_counts_toward_capacity(void **state) {
    tpt_fixture *fx = tpt_fx(state);
    /* Capacity 1, one task waiting for a retry: the queue is empty and the
     * worker idle, yet there is no space. */
    tp_pool *p = retry_pool(fx, 1, 1, TPT_S(60), 1);
    rt *f = tpt_fx_new(fx, rt);
    f->fail_until = ALWAYS;
    f->fail_status = 1;
    uint64_t fid = 0;
    submit_rt(p, f, NULL, &fid);
    tp_stats s;
    TPT_EVENTUALLY((s = tpt_stats(p)).delayed == 1 && s.active == 0);
    assert_int_equal(s.queued, 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_MS(20), NULL), TP_ETIMEDOUT);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 1), TPT_EQ(rejected_timeout, 1), TPT_EQ(accepted, 1));
    assert_int_equal(tp_cancel(p, fid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&f->done_calls) == 1);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    tpt_finish(p);

    /* Capacity 2: one delayed + one queued (the worker blocked) is full. */
    p = retry_pool(fx, 1, 1, TPT_S(60), 2);
    rt *g = tpt_fx_new(fx, rt);
    g->fail_until = ALWAYS;
    g->fail_status = 1;
    submit_rt(p, g, NULL, &fid);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1);
    tpt_latch *gate = tpt_fx_latch(fx);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    TPT_EVENTUALLY((s = tpt_stats(p)).queued == 1 && s.delayed == 1 && s.active == 1);
    assert_true(s.active + s.queued + s.delayed <= 1 + 2);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    /* The retry leaving the delayed set makes room. */
    assert_int_equal(tp_cancel(p, fid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&g->done_calls) == 1);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    tpt_latch_open(gate);
    s = tpt_finish(p);
    assert_int_equal(s.rejected_full, 2);
    assert_int_equal(s.accepted, 4);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

/* ------------------------------------------------------------ logging */

typedef struct log_entry {
    int level;
    char log_id[TP_LOG_ID_MAX + 1];
    char msg[512];
} log_entry;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static log_entry log_rec[256];
static int log_n;
static int log_null_id;

static void rec_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    pthread_mutex_lock(&log_mu);
    if (!log_id) log_null_id++;
    if (log_n < 256) {
        log_entry *e = &log_rec[log_n++];
        e->level = level;
        snprintf(e->log_id, sizeof e->log_id, "%s", log_id ? log_id : "");
        snprintf(e->msg, sizeof e->msg, "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&log_mu);
}

/* Levels logged at WARN or worse for `log_id`, in order, into out[]. */
static int levels_for(const char *log_id, int *out, int max, uint64_t task_id, int *id_in_msg) {
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%" PRIu64, task_id);
    int n = 0;
    *id_in_msg = 1;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < log_n; i++) {
        if (log_rec[i].level > TP_LOG_WARN || strcmp(log_rec[i].log_id, log_id) != 0) continue;
        if (n < max) out[n] = log_rec[i].level;
        n++;
        if (!strstr(log_rec[i].msg, idbuf)) *id_in_msg = 0;
    }
    pthread_mutex_unlock(&log_mu);
    return n;
}

static void test_retry_logging(void **state) {
    tpt_fixture *f = tpt_fx(state);
    pthread_mutex_lock(&log_mu);
    log_n = 0;
    log_null_id = 0;
    pthread_mutex_unlock(&log_mu);

    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_retries = 2;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = rec_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);

    rt *a = tpt_fx_new(f, rt);
    rt *b = tpt_fx_new(f, rt);
    rt *c = tpt_fx_new(f, rt);
    a->fail_until = ALWAYS;
    a->fail_status = 5;
    b->fail_until = 1;
    b->fail_status = 6;
    tp_task_opts o = {0};
    uint64_t ida = 0, idb = 0, idc = 0;
    o.log_id = "job-A";
    submit_rt(p, a, &o, &ida);
    o.log_id = "job-B";
    submit_rt(p, b, &o, &idb);
    o.log_id = "job-C";
    submit_rt(p, c, &o, &idc);
    TPT_EVENTUALLY(atomic_load(&a->done_calls) + atomic_load(&b->done_calls) + atomic_load(&c->done_calls) ==
                   3);
    tpt_finish(p);

    /* A pool without retries: the only failed attempt is the last. */
    cfg.max_retries = 0;
    p = tpt_fx_pool(f, &cfg);
    rt *d = tpt_fx_new(f, rt);
    d->fail_until = ALWAYS;
    d->fail_status = 8;
    uint64_t idd = 0;
    o.log_id = "job-D";
    submit_rt(p, d, &o, &idd);
    TPT_EVENTUALLY(atomic_load(&d->done_calls) == 1);
    tpt_finish(p);

    int lv[8], id_ok;
    int n = levels_for("job-A", lv, 8, ida, &id_ok);
    assert_int_equal(n, 3);
    assert_int_equal(lv[0], TP_LOG_WARN);
    assert_int_equal(lv[1], TP_LOG_WARN);
    assert_int_equal(lv[2], TP_LOG_ERROR);
    assert_true(id_ok); /* the message names the task id */

    n = levels_for("job-B", lv, 8, idb, &id_ok);
    assert_int_equal(n, 1);
    assert_int_equal(lv[0], TP_LOG_WARN);
    assert_true(id_ok);

    n = levels_for("job-C", lv, 8, idc, &id_ok);
    assert_int_equal(n, 0);

    n = levels_for("job-D", lv, 8, idd, &id_ok);
    assert_int_equal(n, 1);
    assert_int_equal(lv[0], TP_LOG_ERROR);
    assert_true(id_ok);

    pthread_mutex_lock(&log_mu);
    int nulls = log_null_id;
    pthread_mutex_unlock(&log_mu);
    assert_int_equal(nulls, 0);
}

/* The WARN message of the first failed attempt logged for `log_id`, copied
 * into out; 0 when there is none yet. */
static int warn_msg_for(const char *log_id, char *out, size_t len) {
    int found = 0;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < log_n && !found; i++) {
        if (log_rec[i].level == TP_LOG_WARN && strcmp(log_rec[i].log_id, log_id) == 0) {
            snprintf(out, len, "%s", log_rec[i].msg);
            found = 1;
        }
    }
    pthread_mutex_unlock(&log_mu);
    return found;
}

/* The retry delay is printed in the unit that fits: a 200 us delay used to
 * read "retry 1 of 1 in 0 ms". Each task fails once; once its WARN line is
 * in, a long delay is cut short by a cancel. */
static void test_retry_log_delay_unit(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const struct {
        uint64_t delay_ns;
        const char *expect;
    } cases[] = {
        {750, "; retry 1 of 1 in 750 ns"},
        {TPT_MS(1) / 5, "; retry 1 of 1 in 200 us"},
        {TPT_MS(1), "; retry 1 of 1 in 1 ms"},
        {TPT_MS(1) + TPT_MS(1) / 2, "; retry 1 of 1 in 1.5 ms"},
        {TPT_MS(250), "; retry 1 of 1 in 250 ms"},
        {TPT_S(2) + TPT_MS(500), "; retry 1 of 1 in 2.5 s"},
        {TPT_S(90), "; retry 1 of 1 in 90 s"},
        /* rounded up to a thousand of a unit: the next unit (was "1000 ms"); exact in us */
        {TPT_S(1) - 1, "; retry 1 of 1 in 1 s"},
        {TPT_MS(1) - 1, "; retry 1 of 1 in 999.999 us"},
        {TPT_S(2) - 1, "; retry 1 of 1 in 2 s"},
        {TPT_MS(1) - 500, "; retry 1 of 1 in 999.5 us"},
        {TPT_S(1) - TPT_MS(1), "; retry 1 of 1 in 999 ms"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pthread_mutex_lock(&log_mu);
        log_n = 0;
        log_null_id = 0;
        pthread_mutex_unlock(&log_mu);

        tp_config cfg = {0};
        cfg.workers = 1;
        cfg.max_retries = 1;
        cfg.retry_delay_ns = cases[i].delay_ns;
        cfg.log = rec_log;
        tp_pool *p = tpt_fx_pool(f, &cfg);
        rt *r = tpt_fx_new(f, rt);
        r->fail_until = 1;
        r->fail_status = 5;
        tp_task_opts o = {0};
        o.log_id = "unit";
        uint64_t id = 0;
        submit_rt(p, r, &o, &id);
        char msg[512];
        TPT_EVENTUALLY(warn_msg_for("unit", msg, sizeof msg));
        int crc = tp_cancel(p, id); /* a short delay may have run its retry already */
        assert_true(crc == TP_OK || crc == TP_ENOTFOUND);
        TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
        tpt_finish(p);
        if (!strstr(msg, cases[i].expect))
            fail_msg("delay %" PRIu64 " ns: got \"%s\", want \"...%s\"", cases[i].delay_ns, msg,
                     cases[i].expect);
    }
}

/* ------------------------------------------------------------ close */

static void test_retry_close_lets_retries_finish(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = retry_pool(f, 1, 3, TPT_MS(100), 0);
    /* Attempt 0 closes the pool, then fails: the retries still come. */
    rt *r = tpt_fx_new(f, rt);
    r->fail_until = 2;
    r->fail_status = 4;
    r->close_pool = p;
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->t_return0) != 0); /* tp_close done */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    assert_int_equal(atomic_load(&r->done_status), 0);
    assert_int_equal(atomic_load(&r->attempts), 3);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_assert_counts(s, TPT_EQ(workers, 0), TPT_EQ(retried, 2), TPT_EQ(succeeded, 1),
                      TPT_EQ(rejected_closed, 1));
    tpt_destroy(p);
}

/* An elastic pool grows for a retry that comes back to the queue, as it does
 * for a submit: the retry does not wait behind a task that holds the only
 * remaining worker. Regression: the service thread used to requeue retries
 * without ever adding a worker. */
static void test_retry_grows_elastic_pool(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TPT_MS(20);
    cfg.max_retries = 1;
    cfg.retry_delay_ns = TPT_MS(100);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);

    tpt_latch *gate = tpt_fx_latch(f);
    /* The blocker holds the first worker; the failing task gets a second,
     * which idles out while the retry waits. */
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    rt *r = tpt_fx_new(f, rt);
    r->mode = RT_RETURN;
    r->fail_until = 1;
    r->fail_status = 5;
    submit_rt(p, r, NULL, NULL);
    TPT_EVENTUALLY(atomic_load(&r->attempts) == 2 && atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->done_status), 0);
    assert_int_equal(atomic_load(&gate->waiting), 1); /* the blocker still holds its worker */
    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.retried, 1);
    assert_int_equal(s.succeeded, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_retry_exhausted),
        TPT_TEST(test_retry_none_by_default),
        TPT_TEST(test_retry_max_100),
        TPT_TEST(test_retry_succeeds_on_attempt_k),
        TPT_TEST(test_retry_holds_no_worker),
        TPT_TEST(test_retry_cancel_while_waiting_all_workers_busy),
        TPT_TEST(test_retry_goes_to_back_of_queue),
        TPT_TEST(test_retry_cut_by_forced_shutdown),
        TPT_TEST(test_retry_not_after_cancel),
        TPT_TEST(test_retry_deadline_passes_while_waiting),
        TPT_TEST(test_retry_deadline_passes_while_running),
        TPT_TEST(test_retry_deadline_passes_while_requeued),
        TPT_TEST(test_retry_run_timeout_is_retried),
        TPT_TEST(test_retry_delayed_counts_toward_capacity),
        TPT_TEST(test_retry_logging),
        TPT_TEST(test_retry_log_delay_unit),
        TPT_TEST(test_retry_close_lets_retries_finish),
        TPT_TEST(test_retry_grows_elastic_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
