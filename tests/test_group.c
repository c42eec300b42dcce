/*
 * test_group.c -- task groups (header section 11).
 *
 * Covers: wait returns after every member ended and its on_done returned; the
 * first error, with one worker (order is known) and under concurrent failures
 * (the first one wins, later ones do not replace it, the error is sticky);
 * cancel on error: queued members end TP_ECANCELED without running, a running
 * member sees cancellation, the group's error is the failing member's status,
 * non-members are untouched, later submits are TP_ECANCELED and count nothing;
 * cancel on error fired from the service thread (a member expiring in the
 * queue together with another, a member whose deadline passes while it waits
 * for a retry, next to other members waiting for theirs); tp_group_cancel;
 * several waiters; a wait with a timeout leaves the group intact; members
 * submitted while someone waits are waited for; TP_EDEADLK from a task and
 * from an on_done (and not for another pool's group); groups racing
 * tp_shutdown (forced and not); a pool destroyed before its groups; invalid
 * arguments.
 *
 * Pool threads record into atomics; only the main thread asserts (helper
 * threads record their results too). Tests run under the fixtures of
 * tp_test.h: latches and helper threads are the fixture's, and what pool
 * threads touch is static, so a failed assert cannot leave them on a dead
 * stack frame.
 */
#define _GNU_SOURCE
#include "tp_test.h"

/* ------------------------------------------------------------ member tasks */

/* What one member does and saw. */
typedef struct member {
    tpt_latch *latch;  /* NULL: do not wait */
    int status;        /* returned after the latch */
    int cooperate;     /* wait for cancellation instead of the latch (bounded) */
    uint64_t sleep_ns; /* with cooperate: tp_ctx_sleep this long at most */
    int keep_status;   /* with cooperate: return `status` even when cancelled */
    atomic_int runs;
    atomic_int saw_cancel; /* tp_ctx_err was TP_ECANCELED when it returned */
    atomic_int done_calls;
    atomic_int done_status;
    atomic_int ticket; /* order in which on_done ran, from 1 */
} member;

static atomic_int done_seq;
static atomic_int done_total;

static int member_task(tp_ctx *c, void *arg) {
    member *m = arg;
    atomic_fetch_add(&m->runs, 1);
    if (m->cooperate && m->sleep_ns) {
        tp_ctx_sleep(c, m->sleep_ns);
    } else if (m->cooperate) {
        uint64_t end = tp_now_ns() + TPT_WAIT_NS;
        while (tp_ctx_err(c) == 0 && tp_now_ns() < end) tp_ctx_sleep(c, TPT_MS(1));
    } else if (m->latch) {
        tpt_latch_wait(m->latch);
    }
    if (tp_ctx_err(c) == TP_ECANCELED) atomic_store(&m->saw_cancel, 1);
    return m->cooperate && !m->keep_status && tp_ctx_err(c) == TP_ECANCELED ? TP_ECANCELED : m->status;
}

static void member_done(void *arg, int status) {
    member *m = arg;
    atomic_store(&m->done_status, status);
    atomic_store(&m->ticket, atomic_fetch_add(&done_seq, 1) + 1);
    atomic_fetch_add(&m->done_calls, 1);
    atomic_fetch_add(&done_total, 1);
}

static void member_init(member *m, tpt_latch *l, int status) {
    memset(m, 0, sizeof *m);
    m->latch = l;
    m->status = status;
}

static int submit_member(tp_group *g, member *m, const char *user) {
    tp_task_opts o = {0};
    o.on_done = member_done;
    o.user = user;
    return tp_group_submit(g, member_task, m, &o, NULL);
}

static void reset_counters(void) {
    atomic_store(&done_seq, 0);
    atomic_store(&done_total, 0);
}

/* ------------------------------------------------------------ basics */

/* A slow on_done: wait must not return before it has. */
static atomic_int slow_done_finished;
static void slow_done(void *arg, int status) {
    (void)arg;
    (void)status;
    tpt_sleep_ns(TPT_MS(20));
    atomic_fetch_add(&slow_done_finished, 1);
}

typedef struct waiter {
    tpt_fx_thr *th;
    tp_group *g;
    uint64_t timeout;
    atomic_int started;
    atomic_int returned;
    int rc;
    int done_total_seen; /* done_total when the wait returned */
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = arg;
    atomic_store(&w->started, 1);
    w->rc = tp_group_wait(w->g, w->timeout);
    w->done_total_seen = atomic_load(&done_total);
    atomic_store(&w->returned, 1);
    return NULL;
}

static void test_group_wait_all_and_on_done(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tp_pool *p = tpt_quiet_pool(f, 2, 64, TP_UNLIMITED);
    tp_group *g = NULL;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    assert_non_null(g);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK); /* empty: at once */

    enum { N = 40 };
    static member m[N];
    for (int i = 0; i < N; i++) {
        member_init(&m[i], NULL, 0);
        assert_int_equal(submit_member(g, &m[i], i % 2 ? "u" : NULL), TP_OK);
    }
    atomic_store(&slow_done_finished, 0);
    tp_task_opts o = {0};
    o.on_done = slow_done;
    uint64_t id = 0;
    assert_int_equal(tp_group_submit(g, tpt_nop_task, NULL, &o, &id), TP_OK);
    assert_true(id != 0);
    /* timeout 0: no limit; waited for on a thread of its own, so that this
     * test's wait keeps its bound */
    waiter *w = tpt_fx_new(f, waiter);
    w->g = g;
    w->timeout = 0;
    w->th = tpt_fx_thread(f, waiter_main, w);
    TPT_EVENTUALLY(atomic_load(&w->returned));
    tpt_fx_join(w->th);
    assert_int_equal(w->rc, TP_OK);
    /* every member ended and its on_done returned */
    assert_int_equal(atomic_load(&slow_done_finished), 1);
    assert_int_equal(atomic_load(&done_total), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&m[i].runs), 1);
        assert_int_equal(atomic_load(&m[i].done_calls), 1);
        assert_int_equal(atomic_load(&m[i].done_status), 0);
    }
    /* a member is a task: the same counters */
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.accepted, N + 1);
    assert_int_equal(s.succeeded, N + 1);
    /* reusable */
    member_init(&m[0], NULL, 0);
    assert_int_equal(submit_member(g, &m[0], NULL), TP_OK);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    s = tpt_finish(p);
    assert_int_equal(s.completed, N + 2);
}

/* Refusals are tp_submit's, and a refused task is not a member. */
static void test_group_submit_refusals(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    static member a, b, c;
    member_init(&a, l, 0);
    member_init(&b, l, 0);
    member_init(&c, NULL, 0);
    assert_int_equal(submit_member(g, &a, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1);
    assert_int_equal(submit_member(g, &b, NULL), TP_OK); /* the one queue place */
    assert_int_equal(submit_member(g, &c, NULL), TP_EFULL);
    assert_int_equal(tp_group_wait(g, TPT_MS(2)), TP_ETIMEDOUT);
    tpt_latch_open(l);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
    assert_int_equal(atomic_load(&c.runs), 0);
    assert_int_equal(atomic_load(&c.done_calls), 0);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.rejected_full, 1);
    assert_int_equal(s.submitted, 3);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(submit_member(g, &c, NULL), TP_ECLOSED);
    assert_int_equal(tpt_stats(p).rejected_closed, 1);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ first error */

/* One worker: members end in FIFO order, so the first failing one is known.
 * Later failures do not replace it; the error is sticky across waits. */
static void test_group_first_error_in_order(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tp_pool *p = tpt_quiet_pool(f, 1, 16, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    static member m[6];
    int st[6] = {0, 0, -11, 0, -12, -13};
    for (int i = 0; i < 6; i++) {
        member_init(&m[i], NULL, st[i]);
        assert_int_equal(submit_member(g, &m[i], NULL), TP_OK);
    }
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), -11);
    for (int i = 0; i < 6; i++) assert_int_equal(atomic_load(&m[i].runs), 1); /* no cancel on error */
    member_init(&m[0], NULL, -14);
    assert_int_equal(submit_member(g, &m[0], NULL), TP_OK);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), -11);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.failed, 4);
}

/* Concurrent failures: the first to end wins and stays. A first failure is
 * made to end alone (observed through its on_done); then many members on
 * four workers fail at once, released by one latch, each with its own
 * status: the group's error is still the first one. Without a first failure,
 * the error is one of the concurrent statuses, never 0 or another value. */
static void test_group_first_error_concurrent(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int round = 0; round < 2; round++) {
        reset_counters();
        tpt_latch *l = tpt_fx_latch(f);
        tp_pool *p = tpt_quiet_pool(f, 4, 64, TP_UNLIMITED);
        tp_group *g;
        assert_int_equal(tp_group_create(p, round ? TP_GROUP_CANCEL_ON_ERROR : 0, &g), TP_OK);
        static member first;
        member_init(&first, NULL, -100);
        if (round == 0) {
            assert_int_equal(submit_member(g, &first, NULL), TP_OK);
            TPT_EVENTUALLY(atomic_load(&first.done_calls) == 1);
        }
        enum { N = 32 };
        static member m[N];
        for (int i = 0; i < N; i++) {
            member_init(&m[i], l, -(200 + i));
            assert_int_equal(submit_member(g, &m[i], NULL), TP_OK);
        }
        TPT_EVENTUALLY(atomic_load(&l->waiting) == 4);
        tpt_latch_open(l);
        int rc = tp_group_wait(g, TPT_WAIT_NS);
        if (round == 0) {
            assert_int_equal(rc, -100);
        } else {
            /* cancel on error: the first of the four running members to end
             * wins; the queued ones are cancelled, never the group's error */
            assert_true(rc <= -200 && rc > -(200 + N));
            int ran = 0;
            for (int i = 0; i < N; i++) {
                ran += atomic_load(&m[i].runs);
                assert_int_equal(atomic_load(&m[i].done_calls), 1);
                if (atomic_load(&m[i].runs) == 0)
                    assert_int_equal(atomic_load(&m[i].done_status), TP_ECANCELED);
            }
            /* the four running ones only: the first to end cancelled the
             * queued ones before any worker could take another */
            assert_int_equal(ran, 4);
            /* the member whose status is the error ran and ended with it */
            int idx = -(rc + 200);
            assert_int_equal(atomic_load(&m[idx].runs), 1);
            assert_int_equal(atomic_load(&m[idx].done_status), rc);
        }
        assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), rc); /* sticky */
        assert_int_equal(tp_group_destroy(g), TP_OK);
        tpt_finish(p);
    }
}

/* ------------------------------------------------------------ cancel on error */

static void test_group_cancel_on_error_stops_queued(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *fail_gate = tpt_fx_latch(f);
    tpt_latch *other = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 64, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    static member failing, running, queued[10], nonmember;
    member_init(&failing, fail_gate, -42);
    member_init(&running, NULL, 0);
    running.cooperate = 1; /* runs until cancelled */
    assert_int_equal(submit_member(g, &failing, "u1"), TP_OK);
    assert_int_equal(submit_member(g, &running, "u1"), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).active == 2 && atomic_load(&fail_gate->waiting) == 1);
    for (int i = 0; i < 10; i++) {
        member_init(&queued[i], NULL, 0);
        assert_int_equal(submit_member(g, &queued[i], i % 2 ? "u2" : NULL), TP_OK);
    }
    /* a non-member queued behind them: the group's cancel leaves it alone */
    member_init(&nonmember, other, 0);
    tp_task_opts o = {0};
    o.on_done = member_done;
    assert_int_equal(tp_submit(p, member_task, &nonmember, &o, NULL), TP_OK);
    assert_int_equal(tpt_stats(p).queued, 11);

    tpt_latch_open(fail_gate);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), -42);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(atomic_load(&queued[i].runs), 0);
        assert_int_equal(atomic_load(&queued[i].done_calls), 1);
        assert_int_equal(atomic_load(&queued[i].done_status), TP_ECANCELED);
    }
    assert_int_equal(atomic_load(&running.saw_cancel), 1);
    assert_int_equal(atomic_load(&running.done_status), TP_ECANCELED);
    assert_int_equal(atomic_load(&failing.done_status), -42);
    /* the non-member runs */
    TPT_EVENTUALLY(atomic_load(&other->waiting) == 1);
    assert_int_equal(atomic_load(&nonmember.done_calls), 0);
    tpt_latch_open(other);
    TPT_EVENTUALLY(atomic_load(&nonmember.done_calls) == 1);
    assert_int_equal(atomic_load(&nonmember.done_status), 0);

    /* cancelled now: submits refused, nothing counted; EINVAL first */
    tp_stats before = tpt_stats(p);
    static member late;
    member_init(&late, NULL, 0);
    assert_int_equal(submit_member(g, &late, NULL), TP_ECANCELED);
    assert_int_equal(tp_group_submit(g, NULL, NULL, NULL, NULL), TP_EINVAL);
    tp_task_opts bad = {0};
    bad.priority = TP_PRIO_MAX + 1;
    assert_int_equal(tp_group_submit(g, member_task, &late, &bad, NULL), TP_EINVAL);
    tp_stats after = tpt_stats(p);
    assert_int_equal(after.submitted, before.submitted);
    assert_int_equal(after.rejected, before.rejected);
    assert_int_equal(atomic_load(&late.runs), 0);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), -42);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 11); /* ten queued, one running that returned TP_ECANCELED */
    assert_int_equal(s.started, 3);
}

/* Cancel on error fired on the service thread: (a) two queued members expire
 * in the same pass while every worker is busy -- the first to end cancels the
 * others, among them the second, which was already taken out of the queue;
 * (b) a member's deadline passes while it waits for a retry, next to other
 * members waiting for theirs. Both need the submits in before a deadline
 * `span` away: they run under tpt_with_time_to_spare. */
static bool expiry_cancels_group(tpt_fixture *f, uint64_t span, void *arg) {
    tpt_latch *l = arg;
    tpt_latch_rearm(l);
    reset_counters();
    tp_pool *p = tpt_quiet_pool(f, 1, 16, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    tpt_fill_workers(p, l, 1, NULL); /* not a member */
    static member e1, e2, q[4];
    member_init(&e1, NULL, 0);
    member_init(&e2, NULL, 0);
    for (int i = 0; i < 4; i++) member_init(&q[i], NULL, 0);
    uint64_t dl = tp_now_ns() + span;
    tp_task_opts o = {0};
    o.on_done = member_done;
    o.deadline_ns = dl;
    /* e1, q[0], q[1], e2, q[2], q[3]: once e1 expired, the group refuses */
    int rc[6];
    rc[0] = tp_group_submit(g, member_task, &e1, &o, NULL);
    for (int i = 0; i < 2; i++) rc[1 + i] = submit_member(g, &q[i], NULL);
    rc[3] = tp_group_submit(g, member_task, &e2, &o, NULL);
    for (int i = 2; i < 4; i++) rc[2 + i] = submit_member(g, &q[i], NULL);
    bool in_time = true;
    for (int i = 0; i < 6; i++) {
        if (rc[i] != TP_OK) in_time = false;
        assert_int_equal(rc[i], in_time ? TP_OK : TP_ECANCELED); /* refused from the first one on */
    }
    if (!in_time) { /* e1 expired before the last submit */
        (void)tp_group_wait(g, TPT_WAIT_NS);
        assert_int_equal(tp_group_destroy(g), TP_OK);
        tpt_latch_open(l);
        tpt_finish(p);
        return false;
    }
    /* the worker is held: everything ends on the service thread. The group's
     * error is TP_ETIMEDOUT, which the wait's own timeout would also give:
     * it must come well before that. */
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_ETIMEDOUT);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS);
    assert_true(tp_now_ns() >= dl);
    assert_int_equal(atomic_load(&e1.done_status), TP_ETIMEDOUT);
    /* e2 expired in the same pass, or was cancelled by e1's failure */
    int s2 = atomic_load(&e2.done_status);
    assert_true(s2 == TP_ETIMEDOUT || s2 == TP_ECANCELED);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&q[i].done_calls), 1);
        assert_int_equal(atomic_load(&q[i].done_status), TP_ECANCELED);
        assert_int_equal(atomic_load(&q[i].runs), 0);
    }
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.expired, s2 == TP_ETIMEDOUT ? 2 : 1);
    return true;
}

static bool expiry_while_retry_waits(tpt_fixture *f, uint64_t span, void *arg) {
    (void)arg;
    reset_counters();
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 16;
    cfg.max_retries = 3;
    cfg.retry_delay_ns = TPT_S(3600); /* the retries never come back by themselves */
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tp_group *g;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    static member r[5];
    uint64_t dl = TP_FOREVER;
    bool in_time = true;
    for (int i = 0; i < 5; i++) {
        member_init(&r[i], NULL, -7);
        tp_task_opts ro = {0};
        ro.on_done = member_done;
        /* long enough for its first attempt to run: the five fail at once */
        if (i == 2) ro.deadline_ns = dl = tp_now_ns() + span;
        int rc = tp_group_submit(g, member_task, &r[i], &ro, NULL);
        if (rc != TP_OK) in_time = false;
        assert_int_equal(rc, in_time ? TP_OK : TP_ECANCELED);
    }
    /* The state: all five wait for a retry before r[2]'s deadline. */
    if (!in_time || !TPT_POLL(tpt_stats(p).delayed == 5 && tp_now_ns() < dl, tpt_left_until(dl))) {
        (void)tp_group_wait(g, TPT_WAIT_NS); /* r[2]'s deadline ends it all */
        assert_int_equal(tp_group_destroy(g), TP_OK);
        tpt_finish(p);
        return false;
    }
    /* r[2]'s deadline passes while it waits: it ends TP_ETIMEDOUT (it ran:
     * cancelled, not expired) and cancels the four others */
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_ETIMEDOUT);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(atomic_load(&r[i].runs), 1);
        assert_int_equal(atomic_load(&r[i].done_status), i == 2 ? TP_ETIMEDOUT : TP_ECANCELED);
    }
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 5);
    assert_int_equal(s.expired, 0);
    return true;
}

static void test_group_cancel_on_error_from_service(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_with_time_to_spare(f, TPT_MS(5), expiry_cancels_group, tpt_fx_latch(f));
    tpt_with_time_to_spare(f, TPT_MS(300) * tpt_slowdown(), expiry_while_retry_waits, NULL);
}

/* A member of a cancel-on-error group cancelled by its id has failed (its
 * status is TP_ECANCELED): it cancels the whole group, and the group's error
 * is its TP_ECANCELED. A running member cancelled by its id fails only if it
 * returns non-zero: returning 0 is a success and cancels nothing. */
static void test_group_member_cancelled_by_id(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 16, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    tpt_fill_workers(p, l, 1, NULL); /* not a member */
    static member q[4];
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        member_init(&q[i], NULL, 0);
        tp_task_opts o = {.on_done = member_done};
        assert_int_equal(tp_group_submit(g, member_task, &q[i], &o, &ids[i]), TP_OK);
    }
    assert_int_equal(tp_cancel(p, ids[1]), TP_OK);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_ECANCELED);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&q[i].runs), 0);
        assert_int_equal(atomic_load(&q[i].done_calls), 1);
        assert_int_equal(atomic_load(&q[i].done_status), TP_ECANCELED);
    }
    assert_int_equal(submit_member(g, &q[0], NULL), TP_ECANCELED);
    assert_int_equal(tp_group_destroy(g), TP_OK);

    /* running, cancelled by id, returns 0: a success; the others run */
    reset_counters();
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    static member run_ok, run_fail, after[2];
    member_init(&run_ok, NULL, 0);
    run_ok.cooperate = 1;
    run_ok.keep_status = 1; /* sees the cancel, returns 0 */
    uint64_t id_ok;
    tp_task_opts o = {.on_done = member_done};
    tpt_latch_open(l); /* the blocker ends; the worker takes run_ok */
    assert_int_equal(tp_group_submit(g, member_task, &run_ok, &o, &id_ok), TP_OK);
    TPT_EVENTUALLY(atomic_load(&run_ok.runs) == 1);
    for (int i = 0; i < 2; i++) {
        member_init(&after[i], NULL, 0);
        assert_int_equal(submit_member(g, &after[i], NULL), TP_OK);
    }
    assert_int_equal(tp_cancel(p, id_ok), TP_OK);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
    assert_int_equal(atomic_load(&run_ok.done_status), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(atomic_load(&after[i].runs), 1);
    assert_int_equal(tp_group_destroy(g), TP_OK);

    /* running, cancelled by id, returns TP_ECANCELED: the group's error, and
     * the queued members behind it are cancelled */
    reset_counters();
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    member_init(&run_fail, NULL, 0);
    run_fail.cooperate = 1;
    uint64_t id_fail;
    assert_int_equal(tp_group_submit(g, member_task, &run_fail, &o, &id_fail), TP_OK);
    TPT_EVENTUALLY(atomic_load(&run_fail.runs) == 1);
    for (int i = 0; i < 2; i++) {
        member_init(&after[i], NULL, 0);
        assert_int_equal(submit_member(g, &after[i], NULL), TP_OK);
    }
    assert_int_equal(tp_cancel(p, id_fail), TP_OK);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_ECANCELED);
    assert_int_equal(atomic_load(&run_fail.done_status), TP_ECANCELED);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(atomic_load(&after[i].runs), 0);
        assert_int_equal(atomic_load(&after[i].done_status), TP_ECANCELED);
    }
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ tp_group_cancel */

static void test_group_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 16, TP_UNLIMITED);
    tp_group *g, *other;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    assert_int_equal(tp_group_create(p, 0, &other), TP_OK);
    static member run_ok, run_coop, q[5], o1;
    member_init(&run_ok, l, 0); /* ignores the cancel, returns 0: a success */
    member_init(&run_coop, NULL, 0);
    run_coop.cooperate = 1;
    assert_int_equal(submit_member(g, &run_ok, NULL), TP_OK);
    assert_int_equal(submit_member(g, &run_coop, NULL), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).active == 2 && atomic_load(&l->waiting) == 1);
    for (int i = 0; i < 5; i++) {
        member_init(&q[i], NULL, 0);
        assert_int_equal(submit_member(g, &q[i], NULL), TP_OK);
    }
    member_init(&o1, NULL, 0);
    assert_int_equal(submit_member(other, &o1, NULL), TP_OK);

    assert_int_equal(tp_group_cancel(g), TP_OK);
    assert_int_equal(tp_group_cancel(g), TP_OK); /* idempotent */
    for (int i = 0; i < 5; i++) TPT_EVENTUALLY(atomic_load(&q[i].done_calls) == 1);
    TPT_EVENTUALLY(atomic_load(&run_coop.done_calls) == 1);
    assert_int_equal(atomic_load(&run_coop.done_status), TP_ECANCELED);
    assert_int_equal(tp_group_wait(g, TPT_MS(5)), TP_ETIMEDOUT); /* run_ok still inside */
    tpt_latch_open(l);
    /* the first member to fail is the first cancelled one */
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_ECANCELED);
    assert_int_equal(atomic_load(&run_ok.done_status), 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(atomic_load(&q[i].runs), 0);
        assert_int_equal(atomic_load(&q[i].done_status), TP_ECANCELED);
    }
    /* the other group is untouched */
    assert_int_equal(tp_group_wait(other, TPT_WAIT_NS), TP_OK);
    assert_int_equal(atomic_load(&o1.runs), 1);
    assert_int_equal(submit_member(g, &o1, NULL), TP_ECANCELED);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    assert_int_equal(tp_group_destroy(other), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ waiters */

static void test_group_several_waiters(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 64, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    enum { N = 20, W = 6 };
    static member m[N];
    for (int i = 0; i < N; i++) {
        member_init(&m[i], l, i == 7 ? -5 : 0);
        assert_int_equal(submit_member(g, &m[i], NULL), TP_OK);
    }
    static waiter w[W];
    for (int i = 0; i < W; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].g = g;
        w[i].timeout = i % 2 ? TP_FOREVER : TPT_WAIT_NS;
        w[i].th = tpt_fx_thread(f, waiter_main, &w[i]);
    }
    for (int i = 0; i < W; i++) TPT_EVENTUALLY(atomic_load(&w[i].started));
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 2);
    for (int i = 0; i < W; i++) assert_int_equal(atomic_load(&w[i].returned), 0);
    tpt_latch_open(l);
    for (int i = 0; i < W; i++) {
        TPT_EVENTUALLY(atomic_load(&w[i].returned));
        tpt_fx_join(w[i].th);
        assert_int_equal(w[i].rc, -5);
        assert_int_equal(w[i].done_total_seen, N);
    }
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

/* A wait that times out leaves the group as it was: members keep running
 * uncancelled, the group takes more members and is waited for later. */
static void test_group_wait_timeout_leaves_group_intact(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 16, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    static member m[4];
    for (int i = 0; i < 4; i++) {
        member_init(&m[i], l, 0);
        assert_int_equal(submit_member(g, &m[i], NULL), TP_OK);
    }
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 2);
    for (int k = 0; k < 3; k++) {
        uint64_t t0 = tp_now_ns();
        assert_int_equal(tp_group_wait(g, TPT_MS(3)), TP_ETIMEDOUT);
        assert_true(tp_now_ns() - t0 >= TPT_MS(3));
    }
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(active, 2), TPT_EQ(queued, 2), TPT_EQ(cancelled, 0));
    static member more;
    member_init(&more, NULL, 0);
    assert_int_equal(submit_member(g, &more, NULL), TP_OK);
    tpt_latch_open(l);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), TP_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&m[i].saw_cancel), 0);
        assert_int_equal(atomic_load(&m[i].done_status), 0);
    }
    assert_int_equal(atomic_load(&more.done_status), 0);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

/* Members submitted while someone waits are waited for (WaitGroup). */
static void test_group_members_added_while_waiting(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tpt_latch *l1 = tpt_fx_latch(f);
    tpt_latch *l2 = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 16, TP_UNLIMITED);
    tp_group *g;
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    static member a, b;
    member_init(&a, l1, 0);
    member_init(&b, l2, -3);
    assert_int_equal(submit_member(g, &a, NULL), TP_OK);
    static waiter w;
    memset(&w, 0, sizeof w);
    w.g = g;
    w.timeout = TPT_WAIT_NS;
    w.th = tpt_fx_thread(f, waiter_main, &w);
    TPT_EVENTUALLY(atomic_load(&w.started) && atomic_load(&l1->waiting) == 1);
    assert_int_equal(submit_member(g, &b, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l2->waiting) == 1);
    tpt_latch_open(l1);
    TPT_EVENTUALLY(atomic_load(&a.done_calls) == 1);
    /* a ended, b still runs: the waiter must still wait */
    tpt_sleep_ns(TPT_MS(2));
    assert_int_equal(atomic_load(&w.returned), 0);
    tpt_latch_open(l2);
    TPT_EVENTUALLY(atomic_load(&w.returned));
    tpt_fx_join(w.th);
    assert_int_equal(w.rc, -3);
    assert_int_equal(atomic_load(&b.done_calls), 1);
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ EDEADLK */

typedef struct dl_probe {
    tp_group *own;   /* a group of the task's pool */
    tp_group *other; /* a group of another pool */
    atomic_int wait_rc, destroy_rc, other_rc, done_wait_rc, done_destroy_rc, cancel_rc, submit_rc;
} dl_probe;

static int deadlock_task(tp_ctx *c, void *arg) {
    (void)c;
    dl_probe *d = arg;
    atomic_store(&d->wait_rc, tp_group_wait(d->own, TPT_MS(1)));
    atomic_store(&d->destroy_rc, tp_group_destroy(d->own));
    atomic_store(&d->other_rc, tp_group_wait(d->other, TPT_WAIT_NS));
    atomic_store(&d->submit_rc, tp_group_submit(d->own, tpt_nop_task, NULL, NULL, NULL));
    return 0;
}

static void deadlock_done(void *arg, int status) {
    (void)status;
    dl_probe *d = arg;
    atomic_store(&d->done_wait_rc, tp_group_wait(d->own, 0));
    atomic_store(&d->done_destroy_rc, tp_group_destroy(d->own));
    atomic_store(&d->cancel_rc, tp_group_cancel(d->other));
}

static void test_group_edeadlk(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED), *q = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    static dl_probe d;
    memset(&d, 0, sizeof d);
    assert_int_equal(tp_group_create(p, 0, &d.own), TP_OK);
    assert_int_equal(tp_group_create(q, 0, &d.other), TP_OK);
    tp_task_opts o = {0};
    o.on_done = deadlock_done;
    assert_int_equal(tp_group_submit(d.own, deadlock_task, &d, &o, NULL), TP_OK);
    assert_int_equal(tp_group_wait(d.own, TPT_WAIT_NS), TP_OK);
    assert_int_equal(atomic_load(&d.wait_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d.destroy_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d.other_rc), TP_OK); /* another pool's group: it may wait */
    assert_int_equal(atomic_load(&d.submit_rc), TP_OK);
    assert_int_equal(atomic_load(&d.done_wait_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d.done_destroy_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&d.cancel_rc), TP_OK);
    /* the group survived the refused destroys */
    assert_int_equal(tp_group_destroy(d.own), TP_OK);
    assert_int_equal(tp_group_submit(d.other, tpt_nop_task, NULL, NULL, NULL), TP_ECANCELED);
    assert_int_equal(tp_group_destroy(d.other), TP_OK);
    tpt_finish(p);
    tpt_finish(q);
}

/* ------------------------------------------------------------ shutdown races */

typedef struct racer {
    tpt_fx_thr *th;
    tp_pool *p;
    atomic_int *go;
    unsigned seed;
    int flags;
    /* results */
    long accepted, refused_closed, bad_rc, waits, bad_wait;
    member m[64];
} racer;

static void *racer_main(void *arg) {
    racer *r = arg;
    tp_group *g;
    if (tp_group_create(r->p, (unsigned)r->flags, &g) != TP_OK) {
        r->bad_rc++;
        return NULL;
    }
    tpt_wait_go(r->go);
    for (int round = 0; round < 40; round++) {
        int n = 1 + (int)(tpt_xorshift(&r->seed) % 8);
        int base = (round * 8) % 64;
        for (int i = 0; i < n; i++) {
            member *m = &r->m[(base + i) % 64];
            member_init(m, NULL, tpt_xorshift(&r->seed) % 5 == 0 ? -1 : 0);
            if (tpt_xorshift(&r->seed) % 4 == 0) { /* sleeps 1 ms unless cancelled */
                m->cooperate = 1;
                m->sleep_ns = TPT_MS(1);
            }
            int rc = submit_member(g, m, NULL);
            if (rc == TP_OK)
                r->accepted++;
            else if (rc == TP_ECLOSED || rc == TP_ECANCELED || rc == TP_EFULL)
                r->refused_closed++;
            else
                r->bad_rc++;
        }
        int rc = tp_group_wait(g, TPT_WAIT_NS);
        r->waits++;
        if (rc != TP_OK && rc != -1 && rc != TP_ECANCELED) r->bad_wait++;
        /* every member waited for has ended and its on_done returned */
        for (int i = 0; i < 64; i++)
            if (atomic_load(&r->m[i].runs) > 1 || atomic_load(&r->m[i].done_calls) > 1) r->bad_wait++;
    }
    if (tp_group_destroy(g) != TP_OK) r->bad_rc++;
    return NULL;
}

static void test_group_racing_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int forced = 0; forced < 2; forced++) {
        reset_counters();
        tp_pool *p = tpt_quiet_pool(f, 3, 32, TP_UNLIMITED);
        enum { R = 4 };
        static racer r[R];
        atomic_int *go = tpt_fx_new(f, atomic_int); /* outlives a failed test's threads */
        for (int i = 0; i < R; i++) {
            memset(&r[i], 0, sizeof r[i]);
            r[i].p = p;
            r[i].go = go;
            r[i].seed = 7919u * (unsigned)(i + 1) + (unsigned)forced;
            r[i].flags = i % 2 ? TP_GROUP_CANCEL_ON_ERROR : 0;
            r[i].th = tpt_fx_thread(f, racer_main, &r[i]);
        }
        atomic_store(go, 1);
        TPT_EVENTUALLY(tpt_stats(p).submitted > 0); /* the race is under way */
        int rc = tp_shutdown(p, forced ? TPT_MS(1) : TPT_WAIT_NS);
        if (forced)
            assert_true(rc == TP_OK || rc == TP_ETIMEDOUT);
        else
            assert_int_equal(rc, TP_OK);
        long accepted = 0;
        for (int i = 0; i < R; i++) {
            tpt_fx_join(r[i].th);
            assert_int_equal(r[i].bad_rc, 0);
            assert_int_equal(r[i].bad_wait, 0);
            assert_int_equal(r[i].waits, 40);
            accepted += r[i].accepted;
        }
        assert_int_equal(tp_wait(p, TPT_WAIT_NS), rc);
        tp_stats s = tpt_stats(p);
        tpt_assert_at_rest(&s);
        assert_int_equal(s.accepted, (uint64_t)accepted);
        assert_int_equal(atomic_load(&done_total), accepted);
        tpt_destroy(p);
    }
}

/* ------------------------------------------------------------ lifetime */

/* The pool goes first: its groups are detached, and every call on them is
 * defined (ASan checks that nothing touches the freed pool). */
static void test_group_pool_destroyed_first(void **state) {
    tpt_fixture *f = tpt_fx(state);
    reset_counters();
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    tp_group *g, *h;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g), TP_OK);
    assert_int_equal(tp_group_create(p, 0, &h), TP_OK);
    static member a, b;
    member_init(&a, NULL, -9);
    member_init(&b, NULL, 0);
    assert_int_equal(submit_member(g, &a, NULL), TP_OK);
    assert_int_equal(submit_member(h, &b, NULL), TP_OK);
    tpt_destroy(p); /* waits for every member, like every task */
    assert_int_equal(atomic_load(&a.done_calls), 1);
    assert_int_equal(atomic_load(&b.done_calls), 1);
    assert_int_equal(tp_group_wait(g, TPT_WAIT_NS), -9);
    assert_int_equal(tp_group_wait(h, 0), TP_OK);
    /* detached: arguments first, then cancelled, then closed */
    assert_int_equal(submit_member(h, &b, NULL), TP_ECLOSED);
    assert_int_equal(submit_member(g, &b, NULL), TP_ECANCELED); /* a's failure cancelled g */
    assert_int_equal(tp_group_submit(h, NULL, NULL, NULL, NULL), TP_EINVAL);
    assert_int_equal(tp_group_submit(g, NULL, NULL, NULL, NULL), TP_EINVAL);
    char longu[TP_USER_MAX + 2];
    memset(longu, 'x', sizeof longu - 1);
    longu[sizeof longu - 1] = '\0';
    tp_task_opts bad = {.user = longu};
    assert_int_equal(tp_group_submit(h, member_task, &b, &bad, NULL), TP_EINVAL);
    assert_int_equal(tp_group_submit(g, member_task, &b, &bad, NULL), TP_EINVAL);
    bad = (tp_task_opts){.reserved = {1}};
    assert_int_equal(tp_group_submit(h, member_task, &b, &bad, NULL), TP_EINVAL);
    assert_int_equal(tp_group_cancel(h), TP_OK);
    assert_int_equal(submit_member(h, &b, NULL), TP_ECLOSED); /* cancel does nothing on a detached group */
    assert_int_equal(tp_group_destroy(g), TP_OK);
    assert_int_equal(tp_group_destroy(h), TP_OK);
    assert_int_equal(atomic_load(&b.runs), 1);
}

static void test_group_invalid(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tp_group *g = (tp_group *)(uintptr_t)1;
    assert_int_equal(tp_group_create(NULL, 0, &g), TP_EINVAL);
    assert_int_equal(tp_group_create(p, 0, NULL), TP_EINVAL);
    assert_int_equal(tp_group_create(p, 2, &g), TP_EINVAL);
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR | 4, &g), TP_EINVAL);
    assert_true(g == (tp_group *)(uintptr_t)1); /* untouched */
    assert_int_equal(tp_group_submit(NULL, tpt_nop_task, NULL, NULL, NULL), TP_EINVAL);
    assert_int_equal(tp_group_wait(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_group_cancel(NULL), TP_EINVAL);
    assert_int_equal(tp_group_destroy(NULL), TP_EINVAL);
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    tp_task_opts o = {0};
    char longu[TP_USER_MAX + 2];
    memset(longu, 'x', sizeof longu - 1);
    longu[sizeof longu - 1] = '\0';
    o.user = longu;
    assert_int_equal(tp_group_submit(g, tpt_nop_task, NULL, &o, NULL), TP_EINVAL);
    assert_int_equal(tp_group_submit(g, NULL, NULL, NULL, NULL), TP_EINVAL);
    assert_int_equal(tpt_stats(p).submitted, 0); /* TP_EINVAL counts nothing */
    assert_int_equal(tp_group_destroy(g), TP_OK);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(f) TPT_TEST(f)
        T(test_group_wait_all_and_on_done),
        T(test_group_submit_refusals),
        T(test_group_first_error_in_order),
        T(test_group_first_error_concurrent),
        T(test_group_cancel_on_error_stops_queued),
        T(test_group_cancel_on_error_from_service),
        T(test_group_member_cancelled_by_id),
        T(test_group_cancel),
        T(test_group_several_waiters),
        T(test_group_wait_timeout_leaves_group_intact),
        T(test_group_members_added_while_waiting),
        T(test_group_edeadlk),
        T(test_group_racing_shutdown),
        T(test_group_pool_destroyed_first),
        T(test_group_invalid),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
