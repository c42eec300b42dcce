/*
 * test_stage.c -- staged submits (src/stage.h): a plain tp_submit (no
 * options, or only an on_done bound to a completion queue and a user; no id
 * asked) on a FIFO pool with fixed workers is accepted
 * without the pool lock and admitted by whoever takes the lock next. From
 * the outside nothing may tell the two paths apart: the queue's bound is
 * exact, the statistics count a staged task as waiting, one thread's tasks
 * start in the order it submitted them whichever path each took, a closing
 * pool never drops a task it accepted, and an idle pool wakes for one.
 *
 * As everywhere, "full" and "queued" are states the test builds with
 * workers blocked on a latch; every wait is bounded.
 */
#include "tp_test.h"

#include <limits.h>

#include "pool.h" /* TP__DEBUG and its test hook tp__test_stage_claimed */

/* ------------------------------------------------------------ helpers */

/* A task that appends its index to a shared order log. */
typedef struct order_log {
    atomic_int next; /* places handed out */
    atomic_int done; /* places written */
    atomic_int at[4096];
} order_log;

typedef struct order_task {
    order_log *log;
    int index;
} order_task;

/* An empty log, owned by the test's fixture. */
static order_log *order_log_new(tpt_fixture *f) {
    order_log *log = tpt_fx_alloc(f, sizeof *log);
    atomic_init(&log->next, 0);
    atomic_init(&log->done, 0);
    return log;
}

static int order_fn(tp_ctx *c, void *arg) {
    (void)c;
    order_task *t = (order_task *)arg;
    int k = atomic_fetch_add(&t->log->next, 1);
    if (k < 4096) atomic_store(&t->log->at[k], t->index);
    atomic_fetch_add(&t->log->done, 1);
    return 0;
}

static atomic_int g_runs;

static int count_fn(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add(&g_runs, 1);
    return 0;
}

/* ------------------------------------------------------------ the bound */

/* Every staged task takes a place: with the worker blocked, capacity plain
 * submits are accepted and the next is refused, on either path; the stats
 * count them as waiting before any worker admitted them. */
static void test_staged_bound_exact(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 5, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
    for (int i = 0; i < 5; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL); /* the locked path agrees */
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, 5);
    assert_int_equal(s.accepted, 6);
    assert_int_equal(s.submitted, 8);
    assert_int_equal(s.rejected_full, 2);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&g_runs) == 5);
    /* room again, for both paths */
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_OK);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 8), TPT_EQ(completed, 8), TPT_EQ(rejected_full, 2));
    assert_int_equal(atomic_load(&g_runs), 7);
}

/* More staged tasks than the ring holds (stage.h, TP__STAGE_MAX): the
 * submit that finds it full takes the locked path, which admits the ring
 * first; the bound is still the queue's. */
static void test_staged_ring_overflow(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    const unsigned cap = TP__STAGE_MAX + 904; /* the ring holds TP__STAGE_MAX */
    tp_pool *p = tpt_quiet_pool(f, 1, cap, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
    for (unsigned i = 0; i < cap; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tpt_stats(p).queued, cap);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, cap + 1), TPT_EQ(completed, cap + 1), TPT_EQ(rejected_full, 1));
    assert_int_equal(atomic_load(&g_runs), (int)cap);
}

/* Fails its first attempt, then succeeds: a retry that waits for its delay. */
static int fail_once_fn(tp_ctx *c, void *arg) {
    (void)c;
    return atomic_fetch_add((atomic_int *)arg, 1) == 0 ? 1 : 0;
}

/* A pool keeps the count that staged submits take places from (src/life.h,
 * `room_taken`) only from its first staged submit on; until then every admission
 * is locked. The tasks waiting then, and a retry waiting for its delay, hold
 * their places in it: with the worker held, two tasks waiting and one retry
 * delayed in six places, exactly three plain submits are accepted, both
 * paths refuse the next, and the retry's place, once it ends, goes to one
 * more. */
static void test_staged_room_starts_late(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 6, TP_UNLIMITED);
    c.max_retries = 1;
    c.retry_delay_ns = TPT_S(600); /* it stays delayed until cancelled */
    tp_pool *p = tpt_fx_pool(f, &c);
    static atomic_int attempts;
    atomic_store(&attempts, 0);
    atomic_store(&g_runs, 0);
    uint64_t rid = 0, id = 0;
    /* every submit until the first plain one asks for an id or has options: locked */
    assert_int_equal(tp_submit(p, fail_once_fn, &attempts, NULL, &rid), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1);
    tpt_fill_workers(p, l, 1, NULL);
    for (int i = 0; i < 2; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, 5);
    assert_int_equal(s.delayed, 1);
    assert_int_equal(tp_cancel(p, rid), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
    tpt_latch_open(l);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 8), TPT_EQ(completed, 8), TPT_EQ(rejected_full, 4),
                      TPT_EQ(cancelled, 1));
    assert_int_equal(atomic_load(&g_runs), 6);
    assert_int_equal(atomic_load(&attempts), 1);
}

/* The count of free places is three counts that only grow, the places
 * taken, the places starts gave back and the places taken and not used
 * (src/life.h, `room_taken`); a submitter reads the last two only when its
 * last look at them leaves no place. Round after
 * round through the bound: with the worker held, exactly `cap` plain
 * submits are accepted and both paths refuse the next; then a retry
 * delayed while the count is kept holds its place (one fewer accepted)
 * until it ends. */
static void test_staged_bound_rounds(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    const int cap = 3, rounds = 120;
    tp_config c = tpt_quiet_config(1, (unsigned)cap, TP_UNLIMITED);
    c.max_retries = 1;
    c.retry_delay_ns = TPT_S(600); /* it stays delayed until cancelled */
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&g_runs, 0);
    uint64_t id = 0;
    for (int r = 0; r < rounds; r++) {
        if (r > 0) tpt_latch_rearm(l);
        tpt_fill_workers(p, l, 1, NULL);
        for (int i = 0; i < cap; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
        assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
        assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
        assert_int_equal(tpt_stats(p).queued, (uint64_t)cap);
        tpt_latch_open(l);
        TPT_EVENTUALLY(atomic_load(&g_runs) == cap * (r + 1));
        TPT_EVENTUALLY(tpt_stats(p).active == 0);
    }
    static atomic_int attempts;
    atomic_store(&attempts, 0);
    uint64_t rid = 0;
    assert_int_equal(tp_submit(p, fail_once_fn, &attempts, NULL, &rid), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1);
    tpt_latch_rearm(l);
    tpt_fill_workers(p, l, 1, NULL);
    for (int i = 0; i < cap - 1; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
    assert_int_equal(tp_cancel(p, rid), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    const uint64_t acc = (uint64_t)rounds * (cap + 1) + 1 + 1 + (cap - 1) + 1; /* with the held tasks */
    tpt_assert_counts(s, TPT_EQ(accepted, acc), TPT_EQ(completed, acc), TPT_EQ(cancelled, 1),
                      TPT_EQ(rejected_full, (uint64_t)rounds * 2 + 3));
    assert_int_equal(atomic_load(&g_runs), cap * rounds + cap);
    assert_int_equal(atomic_load(&attempts), 1);
}

/* A done counter for bound tasks: on_done runs inside tp_cq_drain. */
typedef struct done_count {
    atomic_int calls;
    atomic_int bad; /* a status other than 0 */
} done_count;

static void count_done(void *arg, int status) {
    done_count *d = (done_count *)arg;
    atomic_fetch_add(&d->calls, 1);
    if (status != 0) atomic_fetch_add(&d->bad, 1);
}

/* on_done of order_fn's tasks that are bound. */
static void order_done(void *arg, int status) {
    (void)arg;
    assert_int_equal(status, 0);
}

#if defined(TP__DEBUG)
static atomic_int claims; /* staged submits past their ticket (the debug hook) */
static void count_claims(tp_pool *p) {
    (void)p;
    atomic_fetch_add(&claims, 1);
}
#endif

/* A pool of 10 places whose one worker is held on `l`, a completion queue of
 * `places` for its bound tasks (the test destroys it), their done counter. */
static tp_pool *bound_pool(tpt_fixture *f, tpt_latch *l, unsigned places, tp_cq **q, done_count *d) {
    tp_pool *p = tpt_quiet_pool(f, 1, 10, TP_UNLIMITED);
    assert_int_equal(tp_cq_create(q, places), TP_OK);
    atomic_init(&d->calls, 0);
    atomic_init(&d->bad, 0);
    tpt_fill_workers(p, l, 1, NULL);
    return p;
}

/* A submit whose only options are an on_done and its completion queue is
 * staged too: it takes the queue's place as it takes the pool's (the
 * queue full refuses it with TP_EFULL, counted in rejected_full), and its
 * on_done runs once in a drain of that queue. */
static void test_staged_bound(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_cq *q = NULL;
    done_count d;
    tp_pool *p = bound_pool(f, l, 3, &q, &d);
    atomic_store(&g_runs, 0);
#if defined(TP__DEBUG)
    atomic_store(&claims, 0);
    atomic_store(&tp__test_stage_claimed, count_claims);
#endif
    tp_task_opts o = {0};
    o.on_done = count_done;
    o.cq = q;
    for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, count_fn, &d, &o, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, &d, &o, NULL), TP_EFULL);  /* the queue's places */
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK); /* the pool has room */
#if defined(TP__DEBUG)
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&claims), 4); /* none took the lock */
#endif
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 5), TPT_EQ(queued, 4), TPT_EQ(rejected_full, 1));
    assert_int_equal(tp_cq_drain(q, 0), 0);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&g_runs) == 4);
    TPT_EVENTUALLY(tp_cq_drain(q, 0) >= 0 && atomic_load(&d.calls) == 3);
    assert_int_equal(atomic_load(&d.bad), 0);
    /* the places came back: three more fit */
    for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, count_fn, &d, &o, NULL), TP_OK);
    s = tpt_finish(p);
    assert_int_equal(tp_cq_drain(q, 0), 3);
    assert_int_equal(atomic_load(&d.calls), 6);
    tpt_assert_counts(s, TPT_EQ(accepted, 8), TPT_EQ(completed, 8), TPT_EQ(succeeded, 8));
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* A bound submit is staged on its options' look alone: an empty user and an
 * empty log id are no user and no log id (staged); whatever else the locked
 * path would refuse, it still refuses -- with TP_EINVAL, counting nothing and
 * holding none of the queue's places. */
static void test_staged_bound_checks(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_cq *q = NULL;
    done_count d;
    tp_pool *p = bound_pool(f, l, 2, &q, &d);
    tp_stats before = tpt_stats(p);
    tp_task_opts o = {0};
    o.on_done = count_done;
    o.cq = q;
    assert_int_equal(tp_submit(p, NULL, &d, &o, NULL), TP_EINVAL);
    tp_task_opts bad = o;
    bad.reserved[2] = 1;
    assert_int_equal(tp_submit(p, count_fn, &d, &bad, NULL), TP_EINVAL);
    bad = o;
    bad.priority = TP_PRIO_MAX + 1;
    assert_int_equal(tp_submit(p, count_fn, &d, &bad, NULL), TP_EINVAL);
    bad = o;
    bad.on_done = NULL;
    assert_int_equal(tp_submit(p, count_fn, &d, &bad, NULL), TP_EINVAL);
    char long_id[TP_LOG_ID_MAX + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    bad = o;
    bad.log_id = long_id;
    assert_int_equal(tp_submit(p, count_fn, &d, &bad, NULL), TP_EINVAL);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.submitted, before.submitted);
    assert_int_equal(s.accepted, before.accepted);
    assert_int_equal(s.rejected, before.rejected);
#if defined(TP__DEBUG)
    atomic_store(&claims, 0);
    atomic_store(&tp__test_stage_claimed, count_claims);
#endif
    tp_task_opts empty = o;
    empty.user = "";
    empty.log_id = "";
    /* both of the queue's places are free: none was held by a refusal */
    assert_int_equal(tp_submit(p, count_fn, &d, &empty, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, &d, &empty, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, &d, &empty, NULL), TP_EFULL);
#if defined(TP__DEBUG)
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&claims), 2); /* the two accepted were staged, not locked */
#endif
    tpt_latch_open(l);
    s = tpt_finish(p);
    assert_int_equal(tp_cq_drain(q, 0), 2);
    assert_int_equal(atomic_load(&d.calls), 2);
    assert_int_equal(atomic_load(&d.bad), 0);
    tpt_assert_counts(s, TPT_EQ(accepted, before.accepted + 2), TPT_EQ(rejected_full, 1));
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* ------------------------------------------------------------ order */

/* One thread's tasks start in its submit order, whether each was staged or
 * admitted under the lock (an id asked for, options; by tp_submit or
 * tp_submit_wait): the locked path admits what was staged before it. */
static void test_staged_order_with_locked(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    const int n = 600;
    tp_pool *p = tpt_quiet_pool(f, 1, (unsigned)n, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, (size_t)n * sizeof *tasks);
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, (unsigned)n), TP_OK);
    tpt_fill_workers(p, l, 1, NULL);
    uint32_t rng = 12345;
    int bound = 0;
    for (int i = 0; i < n; i++) {
        tasks[i].log = log;
        tasks[i].index = i;
        uint64_t id = 0;
        tp_task_opts o = {0};
        switch (tpt_xorshift(&rng) % 6) {
        case 0: assert_int_equal(tp_submit(p, order_fn, &tasks[i], NULL, NULL), TP_OK); break;
        case 1: assert_int_equal(tp_submit(p, order_fn, &tasks[i], NULL, &id), TP_OK); break;
        case 4: /* staged: a place is free */
            assert_int_equal(tp_submit_wait(p, order_fn, &tasks[i], NULL, TPT_WAIT_NS, NULL), TP_OK);
            break;
        case 5:
            assert_int_equal(tp_submit_wait(p, order_fn, &tasks[i], NULL, TPT_WAIT_NS, &id), TP_OK);
            break;
        case 2: /* staged, bound to a completion queue */
            o.on_done = order_done;
            o.cq = q;
            assert_int_equal(tp_submit(p, order_fn, &tasks[i], &o, NULL), TP_OK);
            bound++;
            break;
        default: assert_int_equal(tp_submit(p, order_fn, &tasks[i], &o, NULL), TP_OK); break;
        }
    }
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == n);
    for (int i = 0; i < n; i++)
        if (atomic_load(&log->at[i]) != i) fail_msg("start %d was task %d", i, atomic_load(&log->at[i]));
    tpt_finish(p);
    assert_int_equal(tp_cq_drain(q, 0), bound);
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* ------------------------------------------------------------ tp_submit_wait */

typedef struct wait_submit {
    tp_pool *p;
    atomic_int started; /* about to call */
    atomic_int rc;      /* INT_MIN until it returns */
} wait_submit;

static void *wait_submit_main(void *arg) {
    wait_submit *w = (wait_submit *)arg;
    atomic_store(&w->started, 1);
    atomic_store(&w->rc, tp_submit_wait(w->p, count_fn, NULL, NULL, TPT_WAIT_NS, NULL));
    return NULL;
}

/* A tp_submit_wait that tp_submit would stage is staged when a place is
 * free (counted as waiting at once, no worker needed); with none free it
 * counts no refusal, waits, and is accepted when one frees; a budget spent
 * before it looks is TP_ETIMEDOUT even with places free. */
static void test_staged_submit_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 3, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
    for (int i = 0; i < 20; i++)
        assert_int_equal(tp_submit_wait(p, count_fn, NULL, NULL, 1, NULL), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_timeout, 20), TPT_EQ(accepted, 1), TPT_EQ(queued, 0));
    for (int i = 0; i < 3; i++)
        assert_int_equal(tp_submit_wait(p, count_fn, NULL, NULL, TPT_WAIT_NS, NULL), TP_OK);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(queued, 3), TPT_EQ(rejected_full, 0));
    wait_submit *w = tpt_fx_new(f, wait_submit);
    w->p = p;
    atomic_store(&w->rc, INT_MIN);
    tpt_fx_thr *th = tpt_fx_thread(f, wait_submit_main, w);
    TPT_EVENTUALLY(atomic_load(&w->started) == 1);
    /* it waits (or has not yet looked): no refusal is counted meanwhile */
    TPT_EVENTUALLY(tpt_stats(p).submitted == 25);
    assert_int_equal(atomic_load(&w->rc), INT_MIN);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 0), TPT_EQ(accepted, 4));
    tpt_latch_open(l);
    tpt_fx_join(th);
    assert_int_equal(atomic_load(&w->rc), TP_OK);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 5), TPT_EQ(completed, 5), TPT_EQ(rejected_full, 0),
                      TPT_EQ(rejected_timeout, 20));
    assert_int_equal(atomic_load(&g_runs), 4);
}

/* ------------------------------------------------------------ the records' cap */

static tpt_latch *g_svc_gate; /* the running test's, from its fixture */
static atomic_int g_done_calls;

/* on_done of the first cancelled task (tpt_hold_ending) */
static void svc_hold_done(void *arg, int status) {
    (void)arg;
    (void)status;
    tpt_hold_ending(g_svc_gate, &g_done_calls);
}

static void cancelled_done(void *arg, int status) {
    (void)arg;
    assert_int_equal(status, TP_ECANCELED);
    atomic_fetch_add(&g_done_calls, 1);
}

/* Locked submits with an on_done, each cancelled while queued, until one
 * is refused (TP_EFULL: the records are at their cap); each keeps its
 * record while the service thread is held. The number accepted. */
static unsigned pile_endings(tp_pool *p) {
    tp_task_opts o = {0};
    o.on_done = cancelled_done;
    unsigned n = 0;
    for (;;) {
        uint64_t id = 0;
        int rc = tp_submit(p, count_fn, NULL, &o, &id);
        if (rc == TP_EFULL) return n;
        assert_int_equal(rc, TP_OK);
        assert_int_equal(tp_cancel(p, id), TP_OK);
        assert_true(++n < (1u << 20));
    }
}

/* A pool of one worker (held on `l`) and a queue of 4 whose records are at
 * their cap for locked admissions: the service thread held in the first
 * cancelled task's on_done, then pile_endings. The endings piled in *n. */
static tp_pool *pool_at_the_record_cap(tpt_fixture *f, tpt_latch *l, unsigned *n) {
    g_svc_gate = tpt_fx_latch(f);
    atomic_store(&g_runs, 0);
    atomic_store(&g_done_calls, 0);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    tpt_hold_service(p, g_svc_gate, svc_hold_done);
    *n = pile_endings(p);
    return p;
}

/* Records are capped for locked admissions and higher for staged ones,
 * which were accepted before they get one (pool.c). The cap counts the
 * records in use, not only those allocated: records that staged admissions
 * grew past the locked cap, once free, do not let locked tasks hold more,
 * so a staged task accepted while locked tasks hold every record up to
 * their cap still gets one and runs. (It was ended unrun with TP_ENOMEM, or
 * tripped an assertion in a debug build, when the locked tasks had taken
 * the records it needed: the service thread held in an on_done, the
 * endings of cancelled tasks holding records.) */
static void test_staged_admitted_at_the_record_cap(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l1 = tpt_fx_latch(f), *l2 = tpt_fx_latch(f);
    /* locked tasks up to the cap, then 4 staged ones, admitted past it by a
     * locked submit (refused: the queue is full) */
    unsigned n1 = 0;
    tp_pool *p = pool_at_the_record_cap(f, l1, &n1);
    uint64_t id = 0;
    assert_true(n1 > 60000); /* the cap: the tasks that fit and 65,536 awaiting on_done, at least */
    for (int i = 0; i < 4; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
    assert_int_equal(tpt_stats(p).queued, 4);
    /* they run, and their records are free; the worker is held again */
    tpt_latch_open(l1);
    TPT_EVENTUALLY(atomic_load(&g_runs) == 4);
    tpt_fill_workers(p, l2, 1, NULL);

    /* the tasks in flight are back at the cap: no locked task gets one of
     * the free records */
    assert_int_equal(pile_endings(p), 0);
    /* a staged task is accepted (the queue has room) and admitted by the
     * next locked submit, which the cap refuses */
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, &id), TP_EFULL);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(queued, 1), TPT_EQ(failed, (uint64_t)n1 + 1),
                      TPT_EQ(cancelled, (uint64_t)n1 + 1));

    tpt_latch_open(l2);
    tpt_latch_open(g_svc_gate);
    s = tpt_finish(p);
    assert_int_equal(atomic_load(&g_runs), 5);
    assert_int_equal(atomic_load(&g_done_calls), (int)n1 + 1);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)n1 + 8), TPT_EQ(completed, (uint64_t)n1 + 8),
                      TPT_EQ(cancelled, (uint64_t)n1 + 1), TPT_EQ(failed, (uint64_t)n1 + 1),
                      TPT_EQ(succeeded, 7));
}

/* A tp_submit_wait (an id asked: the locked path) that finds the records at
 * their cap waits, counting no refusal, and is accepted once an ending's
 * record is given back (the record that brings the tasks in flight below
 * the cap wakes it). */
static void *wait_submit_id_main(void *arg) {
    wait_submit *w = (wait_submit *)arg;
    atomic_store(&w->started, 1);
    uint64_t id = 0;
    atomic_store(&w->rc, tp_submit_wait(w->p, count_fn, NULL, NULL, TPT_WAIT_NS, &id));
    return NULL;
}

static void test_submit_wait_at_the_record_cap(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    unsigned n = 0;
    tp_pool *p = pool_at_the_record_cap(f, l, &n);
    tp_stats s0 = tpt_stats(p);

    wait_submit *w = tpt_fx_new(f, wait_submit);
    w->p = p;
    atomic_store(&w->rc, INT_MIN);
    tpt_fx_thr *th = tpt_fx_thread(f, wait_submit_id_main, w);
    TPT_EVENTUALLY(tpt_stats(p).submitted == s0.submitted + 1);
    assert_int_equal(atomic_load(&w->rc), INT_MIN); /* it waits */
    tpt_latch_open(g_svc_gate);                     /* the endings run: their records come back */
    tpt_fx_join(th);
    assert_int_equal(atomic_load(&w->rc), TP_OK);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&g_runs), 1);
    assert_int_equal(atomic_load(&g_done_calls), (int)n + 1);
    tpt_assert_counts(s, TPT_EQ(rejected_full, s0.rejected_full), TPT_EQ(rejected_timeout, 0),
                      TPT_EQ(accepted, (uint64_t)n + 3), TPT_EQ(cancelled, (uint64_t)n + 1),
                      TPT_EQ(succeeded, 2));
}

/* ------------------------------------------------------------ batches */

/* A batch of tasks that could all be staged is staged under one hold of
 * the ring's put lock: the places as the locked path takes them (the first
 * task without one is refused, counted once, and the batch stops there),
 * and the tasks counted as waiting at once. */
static void test_staged_batch_bound(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 5, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
#if defined(TP__DEBUG)
    atomic_store(&claims, 0);
    atomic_store(&tp__test_stage_claimed, count_claims); /* once per staged batch */
#endif
    tp_task t[8];
    for (int i = 0; i < 8; i++) t[i] = (tp_task){.fn = count_fn};
    size_t k = 99;
    assert_int_equal(tp_submit_batch(p, t, 3, NULL, &k), TP_OK);
    assert_int_equal(k, 3);
    assert_int_equal(tp_submit_batch(p, t, 8, NULL, &k), TP_EFULL);
    assert_int_equal(k, 2);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(queued, 5), TPT_EQ(accepted, 6), TPT_EQ(rejected_full, 1),
                      TPT_EQ(submitted, 7));
    assert_int_equal(tp_submit_batch(p, t, 1, NULL, &k), TP_EFULL);
    assert_int_equal(k, 0);
    /* a bound batch stops at its completion queue's last place */
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 2), TP_OK);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&g_runs) == 5);
    tp_task_opts o = {.on_done = order_done, .cq = q};
    for (int i = 0; i < 4; i++) t[i].opts = &o;
    assert_int_equal(tp_submit_batch(p, t, 4, NULL, &k), TP_EFULL);
    assert_int_equal(k, 2);
#if defined(TP__DEBUG)
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&claims), 3); /* the three batches that were accepted in part or whole */
#endif
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 8), TPT_EQ(completed, 8), TPT_EQ(rejected_full, 3));
    assert_int_equal(atomic_load(&g_runs), 7);
    assert_int_equal(tp_cq_drain(q, 0), 2);
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* A bound batch cut at its completion queue's last place keeps none of the
 * pool's places it did not use: the rest of the queue is there for others. */
static void test_staged_batch_cq_cut_room(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 6, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 2), TP_OK);
    tp_task_opts o = {.on_done = order_done, .cq = q};
    tp_task t[5];
    for (int i = 0; i < 5; i++) t[i] = (tp_task){.fn = count_fn, .opts = &o};
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, 5, NULL, &k), TP_EFULL);
    assert_int_equal(k, 2);
    for (int i = 0; i < 4; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_EFULL);
    tpt_assert_counts(tpt_stats(p), TPT_EQ(queued, 6), TPT_EQ(rejected_full, 2));
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 7), TPT_EQ(completed, 7));
    assert_int_equal(tp_cq_drain(q, 0), 2);
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* Tasks that must start in one sequence: each checks the count of starts so
 * far against its own place. */
static atomic_int seq_bad;

static int seq_fn(tp_ctx *c, void *arg) {
    (void)c;
    if (atomic_fetch_add(&g_runs, 1) != (int)(intptr_t)arg) atomic_store(&seq_bad, 1);
    return 0;
}

/* A queue larger than the ring (TP__STAGE_MAX slots): a batch that finds too
 * few slots left stages nothing (no entry claimed), gives its places back
 * and takes the locked path, which admits the ring first; a batch larger
 * than the ring goes there at once. Order and counts as always. */
static void test_staged_batch_ring_short(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    const int ring = (int)TP__STAGE_MAX, singles = ring - 8, cap = ring + 40;
    tp_pool *p = tpt_quiet_pool(f, 1, (unsigned)cap, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
    atomic_store(&seq_bad, 0);
#if defined(TP__DEBUG)
    atomic_store(&claims, 0);
    atomic_store(&tp__test_stage_claimed, count_claims);
#endif
    for (int i = 0; i < singles; i++)
        assert_int_equal(tp_submit(p, seq_fn, (void *)(intptr_t)i, NULL, NULL), TP_OK);
    tp_task t[16];
    for (int i = 0; i < 16; i++) t[i] = (tp_task){.fn = seq_fn, .arg = (void *)(intptr_t)(singles + i)};
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, 16, NULL, &k), TP_OK); /* 8 slots left */
    assert_int_equal(k, 16);
#if defined(TP__DEBUG)
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&claims), singles); /* the batch claimed nothing */
#endif
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(queued, (uint64_t)singles + 16), TPT_EQ(accepted, (uint64_t)singles + 17),
                      TPT_EQ(rejected_full, 0));
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&g_runs) == singles + 16);
    assert_int_equal(atomic_load(&seq_bad), 0);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(completed, (uint64_t)singles + 17));
}

/* A tp_submit_wait that waited (here for its completion queue's place)
 * comes after what was staged meanwhile, though a worker left part of it in
 * the ring (the lane was deep): the locked path admits the ring again after
 * each wait. The batch stays whole, the waiting task after it. */
typedef struct waiter {
    tp_pool *p;
    tp_cq *q;
    order_task task;
    tpt_latch *released; /* opened once the submit returned */
    atomic_int rc;
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = (waiter *)arg;
    tp_task_opts o = {.on_done = order_done, .cq = w->q};
    atomic_store(&w->rc, tp_submit_wait(w->p, order_fn, &w->task, &o, TPT_WAIT_NS, NULL));
    tpt_latch_open(w->released);
    return NULL;
}

/* Batch task 1: holds the worker until the waiter's submit returned. */
typedef struct gate_task {
    order_task t;
    tpt_latch *gate;
} gate_task;

static int gate_fn(tp_ctx *c, void *arg) {
    gate_task *g = (gate_task *)arg;
    (void)order_fn(c, &g->t);
    tpt_latch_wait(g->gate);
    return 0;
}

static void test_staged_waiter_after_batch(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    enum { B = 300 }; /* more than a worker admits in one turn (TP__STAGE_BATCH) */
    tp_pool *p = tpt_quiet_pool(f, 1, 400, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 1), TP_OK);
    tpt_fill_workers(p, l, 1, NULL);
    /* the queue's one place, taken by a bound task (index -1) */
    order_task first = {log, -1};
    tp_task_opts o = {.on_done = order_done, .cq = q};
    assert_int_equal(tp_submit(p, order_fn, &first, &o, NULL), TP_OK);
    waiter *w = tpt_fx_new(f, waiter);
    *w = (waiter){p, q, {log, B}, tpt_fx_latch(f), INT_MIN};
    tpt_fx_thr *th = tpt_fx_thread(f, waiter_main, w);
    TPT_EVENTUALLY(tpt_stats(p).submitted == 3); /* it waits, under the lock */
    order_task *tasks = tpt_fx_alloc(f, B * sizeof *tasks);
    gate_task *g = tpt_fx_new(f, gate_task);
    *g = (gate_task){{log, 1}, w->released};
    tp_task *t = tpt_fx_alloc(f, B * sizeof *t);
    for (int i = 0; i < B; i++) {
        tasks[i] = (order_task){log, i};
        t[i] = (tp_task){.fn = order_fn, .arg = &tasks[i]};
    }
    t[1] = (tp_task){.fn = gate_fn, .arg = g};
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, B, NULL, &k), TP_OK);
    tpt_latch_open(l);
    /* the bound task ran and batch task 1 holds the worker: the worker has
     * admitted one turn's worth of the batch, and left the rest */
    TPT_EVENTUALLY(atomic_load(&log->done) == 3);
    assert_int_equal(tp_cq_drain(q, 0), 1); /* the place comes back: the waiter goes on */
    tpt_fx_join(th);
    assert_int_equal(atomic_load(&w->rc), TP_OK);
    TPT_EVENTUALLY(atomic_load(&log->done) == B + 2);
    assert_int_equal(atomic_load(&log->at[0]), -1);
    for (int i = 0; i <= B; i++)
        if (atomic_load(&log->at[i + 1]) != i)
            fail_msg("start %d was task %d, not %d", i + 1, atomic_load(&log->at[i + 1]), i);
    tpt_finish(p);
    assert_int_equal(tp_cq_drain(q, 0), 1);
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* Batches from two threads at once: each batch's tasks start one after
 * another in their order (adjacent in the lane, SPEC section 12), and each
 * thread's batches in its order. */
enum { BT_THREADS = 2, BT_BATCHES = 240, BT_SIZE = 8 };

static atomic_int bt_ready; /* threads at the start line */

typedef struct batch_thread {
    tp_pool *p;
    order_log *log;
    order_task tasks[BT_BATCHES * BT_SIZE];
    int thread;
    atomic_int bad;
} batch_thread;

static void *batch_thread_main(void *arg) {
    batch_thread *b = (batch_thread *)arg;
    /* both at once, so that their batches meet */
    atomic_fetch_add(&bt_ready, 1);
    uint64_t until = tp_now_ns() + TPT_WAIT_NS;
    while (atomic_load(&bt_ready) < BT_THREADS)
        if (tp_now_ns() > until) {
            atomic_store(&b->bad, 1);
            break;
        }
    for (int j = 0; j < BT_BATCHES; j++) {
        tp_task t[BT_SIZE];
        for (int i = 0; i < BT_SIZE; i++) {
            order_task *o = &b->tasks[j * BT_SIZE + i];
            *o = (order_task){b->log, b->thread * 10000 + j * BT_SIZE + i};
            t[i] = (tp_task){.fn = order_fn, .arg = o};
        }
        size_t k = 0;
        if (tp_submit_batch(b->p, t, BT_SIZE, NULL, &k) != TP_OK || k != BT_SIZE) atomic_store(&b->bad, 1);
    }
    return NULL;
}

static void test_staged_batch_adjacent(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    const int n = BT_THREADS * BT_BATCHES * BT_SIZE;
    tp_pool *p = tpt_quiet_pool(f, 1, (unsigned)n, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    tpt_fill_workers(p, l, 1, NULL);
    batch_thread *b[BT_THREADS];
    tpt_fx_thr *th[BT_THREADS];
    atomic_store(&bt_ready, 0);
    for (int i = 0; i < BT_THREADS; i++) {
        b[i] = tpt_fx_alloc(f, sizeof *b[i]);
        b[i]->p = p;
        b[i]->log = log;
        b[i]->thread = i;
        atomic_init(&b[i]->bad, 0);
        th[i] = tpt_fx_thread(f, batch_thread_main, b[i]);
    }
    for (int i = 0; i < BT_THREADS; i++) tpt_fx_join(th[i]);
    for (int i = 0; i < BT_THREADS; i++) assert_int_equal(atomic_load(&b[i]->bad), 0);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == n);
    int next[BT_THREADS] = {0};
    for (int k = 0; k < n; k += BT_SIZE) {
        int first = atomic_load(&log->at[k]), thread = first / 10000;
        if (thread < 0 || thread >= BT_THREADS) fail_msg("start %d: task %d", k, first);
        for (int i = 0; i < BT_SIZE; i++)
            if (atomic_load(&log->at[k + i]) != thread * 10000 + next[thread] + i)
                fail_msg("start %d was task %d, not %d", k + i, atomic_load(&log->at[k + i]),
                         thread * 10000 + next[thread] + i);
        next[thread] += BT_SIZE;
    }
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)n + 1), TPT_EQ(completed, (uint64_t)n + 1));
}

/* ------------------------------------------------------------ a deep lane */

/* While the default lane holds TP__STAGE_LOW tasks or more, a worker starts
 * them and leaves the ring alone (stage.h, "When a worker admits"). From
 * the outside that must not show: below, the lane is deeper than that mark
 * throughout. */
#define DEEP ((int)TP__STAGE_LOW + 8)

/* A task that fails its first attempt (the worker held on `gate` until
 * then) and succeeds its retry, logging each start. */
typedef struct retry_once {
    order_log *log;
    int index;
    tpt_latch *gate;
    atomic_int attempts;
} retry_once;

static int retry_once_fn(tp_ctx *c, void *arg) {
    retry_once *r = (retry_once *)arg;
    order_task t = {r->log, r->index};
    (void)order_fn(c, &t);
    if (atomic_fetch_add(&r->attempts, 1) > 0) return 0;
    tpt_latch_wait(r->gate);
    return -1;
}

/* The deep lane's first task: logs its start, then holds the worker until
 * the retry is back in the queue (bounded; a timeout is reported). */
typedef struct until_requeued {
    order_task t;
    tp_pool *p;
    atomic_int timed_out;
} until_requeued;

static int until_requeued_fn(tp_ctx *c, void *arg) {
    until_requeued *u = (until_requeued *)arg;
    (void)order_fn(c, &u->t);
    tp_stats s;
    if (!TPT_POLL((tp_stats_get(u->p, &s), s.delayed == 0), TPT_WAIT_NS)) atomic_store(&u->timed_out, 1);
    return 0;
}

/* A retry goes back to the end of its lane: behind the staged tasks
 * accepted before it came back, though no worker admitted them (the lane
 * was deep while it came back: the service thread admits the ring first). */
static void test_staged_retry_behind(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *gate = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 4 * DEEP, TP_UNLIMITED);
    c.max_retries = 1;
    c.retry_delay_ns = 1000; /* 1 us: back while the lane's first task holds the worker */
    tp_pool *p = tpt_fx_pool(f, &c);
    order_log *log = order_log_new(f);
    const int staged = 10, retry_index = 1000;
    retry_once r = {log, retry_index, gate, 0};
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, retry_once_fn, &r, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&log->done) == 1); /* the worker holds it on the gate */
    until_requeued first = {{log, 0}, p, 0};
    order_task *tasks = tpt_fx_alloc(f, (size_t)(DEEP + staged) * sizeof *tasks);
    /* the deep lane, locked (an id asked), then staged tasks behind it */
    assert_int_equal(tp_submit(p, until_requeued_fn, &first, NULL, &id), TP_OK);
    for (int i = 1; i < DEEP + staged; i++) {
        tasks[i] = (order_task){log, i};
        assert_int_equal(tp_submit(p, order_fn, &tasks[i], NULL, i < DEEP ? &id : NULL), TP_OK);
    }
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&log->done) == DEEP + staged + 2);
    assert_int_equal(atomic_load(&first.timed_out), 0);
    assert_int_equal(atomic_load(&log->at[0]), retry_index);
    for (int i = 0; i < DEEP + staged; i++)
        if (atomic_load(&log->at[i + 1]) != i)
            fail_msg("start %d was task %d", i + 1, atomic_load(&log->at[i + 1]));
    assert_int_equal(atomic_load(&log->at[DEEP + staged + 1]), retry_index);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)(DEEP + staged + 1)), TPT_EQ(retried, 1));
}

/* Higher lanes deep, a staged task in the default lane: that lane is ready
 * from the worker's first turn, so it takes a start after prio_starve_limit
 * starts of the higher lane, as if it had been admitted under the lock. (The
 * default lane is empty here, so the worker admits at once; a mark that
 * counted the higher lanes' tasks would leave the task in the ring.) */
static void test_staged_starve_count(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 4 * DEEP, TP_UNLIMITED);
    c.prio_starve_limit = 4;
    tp_pool *p = tpt_fx_pool(f, &c);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, (size_t)(DEEP + 1) * sizeof *tasks);
    tpt_fill_workers(p, l, 1, NULL);
    tp_task_opts urgent = {.priority = 1};
    for (int i = 0; i < DEEP; i++) {
        tasks[i] = (order_task){log, i};
        assert_int_equal(tp_submit(p, order_fn, &tasks[i], &urgent, NULL), TP_OK);
    }
    tasks[DEEP] = (order_task){log, DEEP};
    assert_int_equal(tp_submit(p, order_fn, &tasks[DEEP], NULL, NULL), TP_OK); /* staged */
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == DEEP + 1);
    for (int k = 0; k <= DEEP; k++) {
        int want = k < 4 ? k : k == 4 ? DEEP : k - 1;
        if (atomic_load(&log->at[k]) != want)
            fail_msg("start %d was task %d, not %d", k, atomic_load(&log->at[k]), want);
    }
    tpt_finish(p);
}

/* The default lane deep with tasks whose deadline has passed (the service
 * thread, held in an on_done, has not ended them), a staged task behind
 * them and a background task: the worker's take ends the expired ones, and
 * the staged task, of the default lane, starts before the background one,
 * as if it had been admitted under the lock. (The take went on to the
 * background lane once the default lane was empty, leaving the staged task
 * in the ring: a lower lane started first.) */
static void test_staged_behind_expired_lane(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    g_svc_gate = tpt_fx_latch(f);
    atomic_store(&g_done_calls, 0);
    tp_pool *p = tpt_quiet_pool(f, 1, 4 * DEEP, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, (size_t)(DEEP + 2) * sizeof *tasks);
    tpt_fill_workers(p, l, 1, NULL);
    tpt_hold_service(p, g_svc_gate, svc_hold_done); /* no expiry scan meanwhile */
    tasks[0] = (order_task){log, 0};
    tp_task_opts background = {.priority = -1};
    assert_int_equal(tp_submit(p, order_fn, &tasks[0], &background, NULL), TP_OK);
    tp_task_opts expiring = {.deadline_ns = tp_now_ns() + TPT_MS(20)};
    for (int i = 1; i <= DEEP; i++) {
        tasks[i] = (order_task){log, i};
        assert_int_equal(tp_submit(p, order_fn, &tasks[i], &expiring, NULL), TP_OK);
    }
    tasks[DEEP + 1] = (order_task){log, DEEP + 1};
    assert_int_equal(tp_submit(p, order_fn, &tasks[DEEP + 1], NULL, NULL), TP_OK); /* staged */
    assert_int_equal(tpt_stats(p).queued, DEEP + 2);
    TPT_EVENTUALLY(tp_now_ns() > expiring.deadline_ns);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == 2);
    assert_int_equal(atomic_load(&log->at[0]), DEEP + 1); /* the default lane first */
    assert_int_equal(atomic_load(&log->at[1]), 0);
    tpt_latch_open(g_svc_gate);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(expired, DEEP), TPT_EQ(succeeded, 3));
}

/* An order_task that then holds its worker on `gate`. */
typedef struct gated_order {
    order_task task;
    tpt_latch *gate;
} gated_order;

static int gated_order_fn(tp_ctx *c, void *arg) {
    gated_order *g = (gated_order *)arg;
    (void)order_fn(c, &g->task);
    tpt_latch_wait(g->gate);
    return 0;
}

/* The default lane's only task here leaves it unstarted (cancelled, or
 * ended by the service thread's expiry scan: `expire`) while a staged task
 * of that lane waits in the ring: the lane stays ready, so its starvation
 * count goes on, as if the staged task had been admitted under the lock.
 * Limit 2: U1 starts (the lane's count 1), then L leaves, then U2 (count 2),
 * then the staged task. L's deadline (`expire`) is `span` away: it must not
 * pass before the staged task is in (else the lane was empty then, and the
 * count rightly 0): under tpt_with_time_to_spare. (The lane's count returned to 0 when L left, so
 * the staged task started after U3.) */
static bool starve_count_after_leave(tpt_fixture *f, uint64_t span, void *arg) {
    bool expire = *(const bool *)arg;
    tpt_latch *l = tpt_fx_latch(f), *gate = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 4 * DEEP, TP_UNLIMITED);
    c.prio_starve_limit = 2;
    tp_pool *p = tpt_fx_pool(f, &c);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, 5 * sizeof *tasks);
    gated_order *u1 = tpt_fx_new(f, gated_order);
    tpt_fill_workers(p, l, 1, NULL);
    *u1 = (gated_order){{log, 1}, gate};
    tp_task_opts urgent = {.priority = 1};
    assert_int_equal(tp_submit(p, gated_order_fn, u1, &urgent, NULL), TP_OK);
    for (int i = 2; i <= 3; i++) {
        tasks[i] = (order_task){log, i};
        assert_int_equal(tp_submit(p, order_fn, &tasks[i], &urgent, NULL), TP_OK);
    }
    tasks[0] = (order_task){log, 0};
    tp_task_opts normal = {0};
    if (expire) normal.deadline_ns = tp_now_ns() + span;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, order_fn, &tasks[0], &normal, &id), TP_OK);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == 1); /* U1 holds the worker */
    tasks[4] = (order_task){log, 4};
    assert_int_equal(tp_submit(p, order_fn, &tasks[4], NULL, NULL), TP_OK); /* staged */
    if (expire && tp_now_ns() >= normal.deadline_ns) {
        /* L may have left before the staged task came: a lane empty then */
        tpt_latch_open(gate);
        tpt_finish(p);
        return false;
    }
    if (expire)
        TPT_EVENTUALLY(tpt_stats(p).expired == 1);
    else
        assert_int_equal(tp_cancel(p, id), TP_OK);
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&log->done) == 4);
    static const int want[] = {1, 2, 4, 3};
    for (int k = 0; k < 4; k++)
        if (atomic_load(&log->at[k]) != want[k])
            fail_msg("%s: start %d was task %d, not %d", expire ? "expired" : "cancelled", k,
                     atomic_load(&log->at[k]), want[k]);
    tpt_finish(p);
    return true;
}

static void test_staged_starve_count_after_leave(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const bool cancel = false, expire = true;
    assert_true(starve_count_after_leave(f, TP_FOREVER, (void *)&cancel));
    tpt_with_time_to_spare(f, TPT_MS(50), starve_count_after_leave, (void *)&expire);
}

/* The default lane's one task is cancelled while staged tasks wait behind
 * it: the lane must not seem empty (above), but the cancel admits only the
 * oldest staged task, not the ring -- tp_cancel's cost at the head of the
 * lane is O(1) (taskpool.h, tp_cancel, "Cost"), however many tasks are
 * staged. The others stay staged, and all start in their order. */
static void test_staged_cancel_admits_one(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4 * DEEP, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, (size_t)(DEEP + 1) * sizeof *tasks);
    tpt_fill_workers(p, l, 1, NULL);
    tasks[0] = (order_task){log, 0};
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, order_fn, &tasks[0], NULL, &id), TP_OK); /* locked: the lane's one task */
    for (int i = 1; i <= DEEP; i++) {
        tasks[i] = (order_task){log, i};
        assert_int_equal(tp_submit(p, order_fn, &tasks[i], NULL, NULL), TP_OK); /* staged */
    }
    assert_int_equal(tp__stage_count(&p->stage), DEEP); /* the worker is held: none admitted */
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_int_equal(tp__stage_count(&p->stage), DEEP - 1);
    assert_int_equal(tpt_stats(p).queued, DEEP);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == DEEP);
    for (int k = 0; k < DEEP; k++)
        if (atomic_load(&log->at[k]) != k + 1) fail_msg("start %d was task %d", k, atomic_load(&log->at[k]));
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(cancelled, 1), TPT_EQ(succeeded, (uint64_t)DEEP + 1));
}

#if defined(TP__DEBUG)
/* The submitter that the hook holds between its ticket and its entry: it
 * holds the ring's put lock meanwhile (stage.h). */
static tpt_latch *claim_gate;
static atomic_int claim_hold;    /* hold the next staged submit that claims */
static atomic_int claim_waiting; /* it is held now */

static void claim_hook(tp_pool *p) {
    (void)p;
    int one = 1;
    if (!atomic_compare_exchange_strong(&claim_hold, &one, 0)) return;
    atomic_store(&claim_waiting, 1);
    tpt_latch_wait(claim_gate);
}

typedef struct held_submit {
    tp_pool *p;
    order_task *task;  /* staged */
    order_task *after; /* then, from the same thread, a locked submit (an id asked); NULL: none */
    atomic_int rc;
} held_submit;

static void *held_submit_main(void *arg) {
    held_submit *h = (held_submit *)arg;
    int rc = tp_submit(h->p, order_fn, h->task, NULL, NULL);
    uint64_t id = 0;
    if (rc == TP_OK && h->after) rc = tp_submit(h->p, order_fn, h->after, NULL, &id);
    atomic_store(&h->rc, rc);
    return NULL;
}

static void *open_later(void *arg) {
    tpt_sleep_ns(TPT_MS(50)); /* long enough for the others to wait; any length keeps the order */
    tpt_latch_open((tpt_latch *)arg);
    return NULL;
}
#endif

/* A staged submit held between its ticket and its entry (the debug hook)
 * holds the ring's put lock. Meanwhile a locked submit of another thread
 * waits for it on that lock and admits it first; a second thread's staged
 * A waits for the lock, then its locked B starts after A. Whatever the
 * interleaving: the held task starts before the locked one that came after
 * its ticket and before A, A before B, and all four run once. */
static void test_staged_wait_for_unpublished(void **state) {
#if defined(TP__DEBUG)
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    claim_gate = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    order_log *log = order_log_new(f);
    order_task *tasks = tpt_fx_alloc(f, 4 * sizeof *tasks);
    for (int i = 0; i < 4; i++) tasks[i] = (order_task){log, i};
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&claim_waiting, 0);
    atomic_store(&claim_hold, 1);
    atomic_store(&tp__test_stage_claimed, claim_hook);
    held_submit h = {p, &tasks[0], NULL, 0};
    held_submit t = {p, &tasks[1], &tasks[2], 0}; /* A, then B */
    atomic_init(&h.rc, 99);
    atomic_init(&t.rc, 99);
    pthread_t th, tt, opener;
    assert_int_equal(pthread_create(&th, NULL, held_submit_main, &h), 0);
    TPT_EVENTUALLY(atomic_load(&claim_waiting) == 1);
    assert_int_equal(pthread_create(&tt, NULL, held_submit_main, &t), 0);
    assert_int_equal(pthread_create(&opener, NULL, open_later, claim_gate), 0);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, order_fn, &tasks[3], NULL, &id), TP_OK); /* locked, after the held ticket */
    assert_int_equal(pthread_join(opener, NULL), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(pthread_join(tt, NULL), 0);
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&h.rc), TP_OK);
    assert_int_equal(atomic_load(&t.rc), TP_OK);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&log->done) == 4);
    int where[4];
    for (int i = 0; i < 4; i++) where[atomic_load(&log->at[i])] = i;
    if (where[0] > where[3]) fail_msg("the locked submit started before the staged task held before it");
    if (where[0] > where[1]) fail_msg("a staged task overtook the one that held the put lock");
    if (where[1] > where[2]) fail_msg("the locked submit B started before the same thread's staged A");
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 5), TPT_EQ(completed, 5)); /* the four and the latch's filler */
#else
    (void)state;
    skip();
#endif
}

/* ------------------------------------------------------------ waking */

/* A task staged into an idle pool runs: the worker that parked is woken
 * (or saw it before parking). Many rounds, each bounded: a lost wake-up
 * would leave a task waiting forever. */
static void test_staged_wakes_idle_pool(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 2, 16, TP_UNLIMITED);
    atomic_store(&g_runs, 0);
    const int rounds = TPT_SANITIZED ? 300 : 3000;
    for (int r = 0; r < rounds; r++) {
        /* idle first: both workers parked or about to */
        if (r % 50 == 0) TPT_EVENTUALLY(tpt_stats(p).idle == 2);
        assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&g_runs) == r + 1);
    }
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)rounds), TPT_EQ(completed, (uint64_t)rounds));
}

/* ------------------------------------------------------------ closing */

typedef struct racer {
    tp_pool *p;
    atomic_int *go;
    tp_cq *q;      /* every other submit is bound to it (on_done: count_done) */
    done_count d;  /* its on_done calls */
    long bound_ok; /* bound tasks accepted */
    tpt_tally tally;
} racer;

static void *racer_main(void *arg) {
    racer *r = (racer *)arg;
    tp_task_opts o = {0};
    o.on_done = count_done;
    o.cq = r->q;
    tpt_wait_go(r->go);
    for (unsigned i = 0;; i++) {
        bool bind = i & 1;
        int rc = tp_submit(r->p, count_fn, &r->d, bind ? &o : NULL, NULL);
        tpt_tally_add(&r->tally, rc);
        if (bind && rc == TP_OK) r->bound_ok++;
        if (rc == TP_ECLOSED || r->tally.total > 2000000) break;
        if (rc == TP_EFULL) {
            (void)tp_cq_drain(r->q, 0);
            sched_yield();
        }
    }
    return NULL;
}

/* Threads submit plain tasks and bound ones while the pool shuts down:
 * every TP_OK task runs exactly once (none is dropped by the close) and a
 * bound one's on_done runs once, every refusal after the close is
 * TP_ECLOSED, and the counters add up. */
static void test_staged_close_race(void **state) {
    tpt_fixture *f = tpt_fx(state);
    const int rounds = TPT_SANITIZED ? 5 : 40;
    for (int round = 0; round < rounds; round++) {
        tp_pool *p = tpt_quiet_pool(f, 2, 64, TP_UNLIMITED);
        atomic_store(&g_runs, 0);
        atomic_int go;
        atomic_init(&go, 0);
        racer rs[3];
        pthread_t th[3];
        for (int i = 0; i < 3; i++) {
            memset(&rs[i], 0, sizeof rs[i]);
            rs[i].p = p;
            rs[i].go = &go;
            atomic_init(&rs[i].d.calls, 0);
            atomic_init(&rs[i].d.bad, 0);
            assert_int_equal(tp_cq_create(&rs[i].q, 16), TP_OK);
            assert_int_equal(pthread_create(&th[i], NULL, racer_main, &rs[i]), 0);
        }
        atomic_store(&go, 1);
        TPT_EVENTUALLY(tpt_stats(p).accepted >= (uint64_t)(100 + round * 10));
        assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
        tpt_tally all = {0};
        for (int i = 0; i < 3; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            tpt_tally_merge(&all, &rs[i].tally);
        }
        assert_int_equal(all.bad, 0);
        assert_true(all.closed >= 3);
        tp_stats s = tpt_finish(p);
        assert_int_equal(atomic_load(&g_runs), (int)all.ok);
        for (int i = 0; i < 3; i++) {
            (void)tp_cq_drain(rs[i].q, 0);
            assert_int_equal(atomic_load(&rs[i].d.calls), (int)rs[i].bound_ok);
            assert_int_equal(atomic_load(&rs[i].d.bad), 0);
            assert_int_equal(tp_cq_destroy(rs[i].q), TP_OK);
        }
        tpt_assert_counts(s, TPT_EQ(accepted, all.ok), TPT_EQ(completed, all.ok), TPT_EQ(succeeded, all.ok),
                          TPT_EQ(rejected_closed, all.closed), TPT_EQ(rejected_full, all.full),
                          TPT_EQ(submitted, all.total));
    }
}

/* A forced shutdown ends staged tasks that no worker admitted as it ends
 * waiting ones: cancelled, unrun, counted once. */
static void test_staged_forced_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 10, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
    for (int i = 0; i < 10; i++) assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_OK);
    assert_int_equal(tp_shutdown(p, TPT_MS(1)), TP_ETIMEDOUT);
    assert_int_equal(tp_submit(p, count_fn, NULL, NULL, NULL), TP_ECLOSED);
    tpt_latch_open(l);
    tp_stats s = tpt_finish_forced(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 11), TPT_EQ(completed, 11), TPT_EQ(cancelled, 10),
                      TPT_EQ(rejected_closed, 1));
    assert_int_equal(atomic_load(&g_runs), 0);
}

/* ------------------------------------------------------------ users */

/* tpt_finish, with each of `names` holding no slot once the pool is at rest
 * (asked before anything else reads the pool). */
static tp_stats finish_users(tp_pool *p, const char *const *names, int n) {
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    for (int i = 0; i < n; i++) assert_int_equal(tp_user_active(p, names[i]), 0);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    assert_int_equal(s.users, 0);
    tpt_fx_forget(p);
    assert_int_equal(tp_destroy(p), TP_OK);
    return s;
}

/* A task with a user is staged while its user holds fewer slots than its
 * limit minus one (src/life.h, users_put); the locked path takes the first
 * slot (a new entry) and the last, and answers TP_EUSERLIMIT. From the
 * outside the limit is as exact as ever: with per_user 3, three tasks of one
 * user are accepted and the fourth refused, by either path; a user below
 * its limit meets a full queue with TP_EFULL. */
static void test_staged_user_limit(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 5, 3);
    tpt_fill_workers(p, l, 1, NULL);
    atomic_store(&g_runs, 0);
#if defined(TP__DEBUG)
    atomic_store(&claims, 0);
    atomic_store(&tp__test_stage_claimed, count_claims);
#endif
    tp_task_opts u = {0};
    u.user = "u";
    for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, count_fn, NULL, &u, NULL), TP_OK);
    assert_int_equal(tp_submit(p, count_fn, NULL, &u, NULL), TP_EUSERLIMIT);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, count_fn, NULL, &u, &id), TP_EUSERLIMIT); /* the locked path agrees */
    assert_int_equal(tp_user_active(p, "u"), 3);
    tp_task_opts v = {0};
    v.user = "v";
    assert_int_equal(tp_submit(p, count_fn, NULL, &v, NULL), TP_OK);    /* a new entry: locked */
    assert_int_equal(tp_submit(p, count_fn, NULL, &v, NULL), TP_OK);    /* staged: the queue's last place */
    assert_int_equal(tp_submit(p, count_fn, NULL, &v, NULL), TP_EFULL); /* below its limit: full */
    assert_int_equal(tp_submit(p, count_fn, NULL, &u, NULL), TP_EUSERLIMIT); /* the limit comes first */
#if defined(TP__DEBUG)
    atomic_store(&tp__test_stage_claimed, NULL);
    assert_int_equal(atomic_load(&claims), 2); /* u's second and v's second */
#endif
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, 5);
    assert_int_equal(s.users, 2);
    assert_int_equal(s.rejected_user, 3);
    assert_int_equal(s.rejected_full, 1);
    tpt_latch_open(l);
    TPT_EVENTUALLY(atomic_load(&g_runs) == 5);
    static const char *const names[] = {"u", "v"};
    s = finish_users(p, names, 2);
    tpt_assert_counts(s, TPT_EQ(accepted, 6), TPT_EQ(completed, 6), TPT_EQ(rejected_user, 3),
                      TPT_EQ(rejected_full, 1));
}

/* Raises `flag`, then waits on the latch. */
typedef struct flag_block {
    atomic_int *flag;
    tpt_latch *l;
} flag_block;

static int flag_block_fn(tp_ctx *c, void *arg) {
    flag_block *fb = (flag_block *)arg;
    atomic_store(fb->flag, 1);
    return tpt_block_task(c, fb->l);
}

/* The slots a worker keeps back (debug builds: src/life.h, `rel`). */
static unsigned kept_slots(tp_pool *p) {
    unsigned n = 0;
#if defined(TP__DEBUG)
    tp__lock(p);
    n = p->life.rel_n;
    tp__unlock(p);
#else
    (void)p;
#endif
    return n;
}

/* A pool of one worker and 8 places, `per_user` slots a user, whose worker
 * runs a task of `holder` held on `l` (returned once it runs); g_runs 0. */
static tp_pool *held_user_pool(tpt_fixture *f, tpt_latch *l, unsigned per_user, const char *holder) {
    tp_pool *p = tpt_quiet_pool(f, 1, 8, per_user);
    tp_task_opts o = {0};
    o.user = holder;
    assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1);
    atomic_store(&g_runs, 0);
    return p;
}

/* Then a task of `user` that raises `fb->flag` when it starts and waits on
 * `fb->l`. */
static void submit_flag_block(tp_pool *p, flag_block *fb, const char *user) {
    tp_task_opts o = {0};
    o.user = user;
    assert_int_equal(tp_submit(p, flag_block_fn, fb, &o, NULL), TP_OK);
}

/* A worker that ends a task while others wait keeps its user's slot back
 * (not the user's last) and gives it back later under one hold of put
 * (src/life.h, `rel`); no one can tell. One worker holds b's task on a
 * latch while a's two tasks wait (per_user 2); once the latch opens it ends
 * b's task (b's last slot: given back), then a's first with a's second
 * waiting (kept), and holds on a's second. A submit of a's is then accepted
 * (the staged path sees two slots and takes the locked one, which gives the
 * kept slot back), the next refused, and tp_user_active and the users gauge
 * count what is held. */
static void test_staged_user_kept_slots(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l1 = tpt_fx_latch(f);
    tpt_latch *l2 = tpt_fx_latch(f);
    tp_pool *p = held_user_pool(f, l1, 2, "b");
    atomic_int started = 0;
    tp_task_opts a = {0};
    a.user = "a";
    assert_int_equal(tp_submit(p, count_fn, NULL, &a, NULL), TP_OK);
    flag_block fb = {&started, l2};
    submit_flag_block(p, &fb, "a");
    tpt_latch_open(l1);
    TPT_EVENTUALLY(atomic_load(&started) == 1);
    assert_int_equal(atomic_load(&g_runs), 1);
#if defined(TP__DEBUG)
    assert_int_equal(kept_slots(p), 1); /* a's first */
#endif
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.users, 1);
    assert_int_equal(s.completed, 2);
    assert_int_equal(tp_submit(p, count_fn, NULL, &a, NULL), TP_OK);
    assert_int_equal(kept_slots(p), 0);
    assert_int_equal(tp_submit(p, count_fn, NULL, &a, NULL), TP_EUSERLIMIT);
    assert_int_equal(tp_user_active(p, "a"), 2);
    assert_int_equal(tp_user_active(p, "b"), 0);
    assert_int_equal(tpt_stats(p).users, 1);
    tpt_latch_open(l2);
    static const char *const names[] = {"a", "b"};
    s = finish_users(p, names, 2);
    tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(completed, 4), TPT_EQ(rejected_user, 1));
    assert_int_equal(atomic_load(&g_runs), 2);
}

/* Kept slots are invisible to the statistics, which take no lock: b's task
 * held on a latch, then a's only task, b's second and b's third wait (b's
 * limit 4). Once the latch opens the worker ends b's first (kept: b holds
 * more), a's (a's last: given back at once, with b's kept one), b's second
 * (kept) and holds on b's third: tp_stats_get counts one user, and
 * tp_user_active a's none and b's one -- each the first reader after. */
static void test_staged_user_kept_stats(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l1 = tpt_fx_latch(f);
    tpt_latch *l2 = tpt_fx_latch(f);
    for (int k = 0; k < 2; k++) {
        tp_pool *p = held_user_pool(f, l1, 4, "b");
        atomic_int started = 0;
        tp_task_opts b = {0};
        b.user = "b";
        tp_task_opts a = {0};
        a.user = "a";
        assert_int_equal(tp_submit(p, count_fn, NULL, &a, NULL), TP_OK);
        assert_int_equal(tp_submit(p, count_fn, NULL, &b, NULL), TP_OK);
        flag_block fb = {&started, l2};
        submit_flag_block(p, &fb, "b");
        tpt_latch_open(l1);
        TPT_EVENTUALLY(atomic_load(&started) == 1);
#if defined(TP__DEBUG)
        assert_int_equal(kept_slots(p), 1); /* b's second */
#endif
        if (k == 0) {
            tp_stats s = tpt_stats(p);
            assert_int_equal(s.users, 1);
            assert_int_equal(s.active, 1);
            assert_int_equal(s.completed, 3);
        } else {
            assert_int_equal(tp_user_active(p, "a"), 0);
            assert_int_equal(tp_user_active(p, "b"), 1);
            assert_int_equal(tpt_stats(p).users, 1);
        }
        tpt_latch_open(l2);
        static const char *const names[] = {"a", "b"};
        tp_stats s = finish_users(p, names, 2);
        tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(completed, 4));
        assert_int_equal(atomic_load(&g_runs), 2);
        tpt_latch_rearm(l1);
        tpt_latch_rearm(l2);
    }
}

/* An on_done drained from a completion queue submits its own user's next
 * task and is not refused for the slot of the task it reports (taskpool.h,
 * section 15): a chain of 200 tasks of one user (per_user 2), each
 * submitted by the drained on_done of the one before. Each link's end gives
 * back its user's last slot at once, and the next submit takes the idle
 * entry's slot on the staged path; test_staged_user_drain_kept has the slot
 * kept. */
typedef struct chain {
    tp_pool *p;
    tp_cq *q;
    atomic_int left;
    atomic_int refused;
} chain;

static void chain_done(void *arg, int status) {
    chain *ch = (chain *)arg;
    assert_int_equal(status, 0);
    if (atomic_fetch_sub(&ch->left, 1) <= 1) return;
    tp_task_opts o = {0};
    o.user = "c";
    o.on_done = chain_done;
    o.cq = ch->q;
    if (tp_submit(ch->p, count_fn, ch, &o, NULL) != TP_OK) atomic_fetch_add(&ch->refused, 1);
}

static void test_staged_user_chain_from_drain(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, 2);
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 8), TP_OK);
    chain ch;
    ch.p = p;
    ch.q = q;
    atomic_init(&ch.left, 200);
    atomic_init(&ch.refused, 0);
    atomic_store(&g_runs, 0);
    tp_task_opts o = {0};
    o.user = "c";
    o.on_done = chain_done;
    o.cq = q;
    assert_int_equal(tp_submit(p, count_fn, &ch, &o, NULL), TP_OK);
    uint64_t until = tp_now_ns() + TPT_WAIT_NS;
    while (atomic_load(&ch.left) > 0 && tp_now_ns() < until) {
        (void)tp_cq_wait(q, TPT_MS(10));
        (void)tp_cq_drain(q, 0);
    }
    assert_int_equal(atomic_load(&ch.left), 0);
    assert_int_equal(atomic_load(&ch.refused), 0);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 200), TPT_EQ(completed, 200), TPT_EQ(rejected_user, 0),
                      TPT_EQ(users, 0));
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* The same promise with the reported task's slot kept back (src/life.h,
 * `rel`): one worker holds x's task on a latch while c's bound task and c's
 * second (per_user 2) wait; once the latch opens it ends x's, then c's first
 * with c's second waiting (kept) and holds on c's second. The drained
 * on_done of c's first submits c's next task: accepted (the staged path sees
 * two slots and takes the locked one, which gives the kept slot back); one
 * more is refused. */
typedef struct drain_sub {
    tp_pool *p;
    int rc[2];
} drain_sub;

static void drain_sub_done(void *arg, int status) {
    drain_sub *d = (drain_sub *)arg;
    assert_int_equal(status, 0);
    tp_task_opts o = {0};
    o.user = "c";
    d->rc[0] = tp_submit(d->p, count_fn, NULL, &o, NULL);
    d->rc[1] = tp_submit(d->p, count_fn, NULL, &o, NULL);
}

static void test_staged_user_drain_kept(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l1 = tpt_fx_latch(f);
    tpt_latch *l2 = tpt_fx_latch(f);
    tp_pool *p = held_user_pool(f, l1, 2, "x");
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 4), TP_OK);
    atomic_int started = 0;
    drain_sub d = {p, {99, 99}};
    tp_task_opts c = {0};
    c.user = "c";
    c.on_done = drain_sub_done;
    c.cq = q;
    assert_int_equal(tp_submit(p, count_fn, &d, &c, NULL), TP_OK);
    flag_block fb = {&started, l2};
    submit_flag_block(p, &fb, "c");
    tpt_latch_open(l1);
    TPT_EVENTUALLY(atomic_load(&started) == 1);
#if defined(TP__DEBUG)
    assert_int_equal(kept_slots(p), 1); /* c's first */
#endif
    assert_int_equal(tp_cq_drain(q, 0), 1);
    assert_int_equal(d.rc[0], TP_OK);
    assert_int_equal(d.rc[1], TP_EUSERLIMIT);
    assert_int_equal(tp_user_active(p, "c"), 2);
    tpt_latch_open(l2);
    static const char *const names[] = {"c", "x"};
    tp_stats s = finish_users(p, names, 2);
    tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(completed, 4), TPT_EQ(rejected_user, 1));
    assert_int_equal(atomic_load(&g_runs), 2);
    assert_int_equal(tp_cq_destroy(q), TP_OK);
}

/* A tp_submit_wait that waits for a slot of its user (TP_EUSERLIMIT) is
 * woken and accepted when a slot of that user is kept back (src/life.h,
 * `rel`), while the user's other task still runs: one worker holds b's
 * task while a's two tasks (per_user 2) wait and a third waits in
 * tp_submit_wait; once the latch opens, a's first ends with a's second
 * waiting (its slot kept), and the waiter takes it. Rounds vary when the
 * waiter starts waiting. */
typedef struct wait_sub {
    tp_pool *p;
    atomic_int rc;
    atomic_int done;
} wait_sub;

static void *wait_sub_main(void *arg) {
    wait_sub *w = (wait_sub *)arg;
    tp_task_opts a = {0};
    a.user = "a";
    atomic_store(&w->rc, tp_submit_wait(w->p, count_fn, NULL, &a, TPT_WAIT_NS, NULL));
    atomic_store(&w->done, 1);
    return NULL;
}

static void test_staged_user_wait_on_kept(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l1 = tpt_fx_latch(f);
    tpt_latch *l2 = tpt_fx_latch(f);
    for (int round = 0; round < 20; round++) {
        tp_pool *p = held_user_pool(f, l1, 2, "b");
        atomic_int started = 0;
        tp_task_opts a = {0};
        a.user = "a";
        assert_int_equal(tp_submit(p, count_fn, NULL, &a, NULL), TP_OK);
        flag_block fb = {&started, l2};
        submit_flag_block(p, &fb, "a");
        wait_sub *w = tpt_fx_new(f, wait_sub);
        w->p = p;
        atomic_init(&w->rc, 99);
        atomic_init(&w->done, 0);
        pthread_t th; /* joined below: its submit ends by its budget at the latest */
        assert_int_equal(pthread_create(&th, NULL, wait_sub_main, w), 0);
        if (round % 3 != 0) tpt_sleep_ns(TPT_MS(round % 3 == 1 ? 1 : 20)); /* waiting, likely, or surely */
        tpt_latch_open(l1);
        TPT_EVENTUALLY(atomic_load(&started) == 1);
        TPT_EVENTUALLY(atomic_load(&w->done) == 1); /* while a's second still runs */
        assert_int_equal(atomic_load(&w->rc), TP_OK);
        assert_int_equal(tp_user_active(p, "a"), 2);
        assert_int_equal(tpt_stats(p).users, 1);
        tpt_latch_open(l2);
        assert_int_equal(pthread_join(th, NULL), 0);
        static const char *const names[] = {"a", "b"};
        tp_stats s = finish_users(p, names, 2);
        tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(completed, 4));
        tpt_latch_rearm(l1);
        tpt_latch_rearm(l2);
    }
}

/* Threads race tasks of three users (per_user 3) through every path -- staged
 * tp_submit, tp_submit with an id (some cancelled), tp_submit_wait, some bound
 * to a completion queue -- while a checker reads tp_user_active and drains,
 * and every other round the pool is shut down mid-run: no user is ever seen
 * above its limit, every answer is one the contract allows, and at rest
 * every count is 0 and every accepted task completed. */
#define MIX_USERS 3
#define MIX_LIMIT 3

typedef struct user_mix {
    tp_pool *p;
    tp_cq *q;
    atomic_int go, stop;
    atomic_int over; /* tp_user_active above the limit */
    atomic_long accepted, bad;
    long per_thread;
} user_mix;

static const char *const mix_names[MIX_USERS] = {"m0", "m1", "m2"};

static int mix_fn(tp_ctx *c, void *arg) {
    (void)c;
    if ((uintptr_t)arg % 5 == 0) tpt_sleep_ns(20000);
    return 0;
}

static void mix_done(void *arg, int status) {
    (void)arg;
    (void)status;
}

static void *mix_main(void *arg) {
    user_mix *m = (user_mix *)arg;
    uint32_t seed = (uint32_t)(uintptr_t)&seed | 1u;
    tpt_wait_go(&m->go);
    for (long i = 0; i < m->per_thread; i++) {
        uint32_t x = tpt_xorshift(&seed);
        void *arg_x = (void *)(uintptr_t)x;
        tp_task_opts o = {0};
        o.user = mix_names[x % MIX_USERS];
        if ((x >> 4) % 3 == 0) {
            o.on_done = mix_done;
            o.cq = m->q;
        }
        int rc;
        uint64_t id = 0;
        switch ((x >> 8) % 8) {
        case 0: rc = tp_submit_wait(m->p, mix_fn, arg_x, &o, TPT_MS(5), NULL); break;
        case 1:
            rc = tp_submit(m->p, mix_fn, arg_x, &o, &id);
            if (rc == TP_OK && (x >> 12) % 4 == 0) (void)tp_cancel(m->p, id);
            break;
        default: rc = tp_submit(m->p, mix_fn, arg_x, &o, NULL); break;
        }
        if (rc == TP_OK)
            atomic_fetch_add(&m->accepted, 1);
        else if (rc != TP_EUSERLIMIT && rc != TP_EFULL && rc != TP_ETIMEDOUT && rc != TP_ECLOSED)
            atomic_fetch_add(&m->bad, 1);
        if (rc == TP_ECLOSED) break;
    }
    return NULL;
}

static void *mix_checker(void *arg) {
    user_mix *m = (user_mix *)arg;
    tpt_wait_go(&m->go);
    while (!atomic_load(&m->stop)) {
        for (int u = 0; u < MIX_USERS; u++)
            if (tp_user_active(m->p, mix_names[u]) > MIX_LIMIT) atomic_store(&m->over, 1);
        (void)tp_cq_drain(m->q, 0);
    }
    return NULL;
}

static void test_staged_user_mix(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int round = 0; round < 6; round++) {
        tp_pool *p = tpt_quiet_pool(f, 3, 12, MIX_LIMIT);
        user_mix *m = tpt_fx_new(f, user_mix);
        m->p = p;
        assert_int_equal(tp_cq_create(&m->q, 64), TP_OK);
        atomic_init(&m->go, 0);
        atomic_init(&m->stop, 0);
        atomic_init(&m->over, 0);
        atomic_init(&m->accepted, 0);
        atomic_init(&m->bad, 0);
        m->per_thread =
            TPT_SANITIZED || tpt_slowdown() > 1 ? 2000 : 50000; /* valgrind: one thread at a time */
        pthread_t t[3], checker; /* joined below: each ends after a bounded number of calls */
        for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&t[i], NULL, mix_main, m), 0);
        assert_int_equal(pthread_create(&checker, NULL, mix_checker, m), 0);
        atomic_store(&m->go, 1);
        if (round % 2) {
            tpt_sleep_ns(TPT_MS(20));
            assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK); /* the submitters meet TP_ECLOSED */
        }
        for (int i = 0; i < 3; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
        atomic_store(&m->stop, 1);
        assert_int_equal(pthread_join(checker, NULL), 0);
        tp_stats s = finish_users(p, mix_names, MIX_USERS);
        assert_int_equal(atomic_load(&m->over), 0);
        assert_int_equal(atomic_load(&m->bad), 0);
        tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)atomic_load(&m->accepted)));
        while (tp_cq_drain(m->q, 0) > 0) {
        }
        assert_int_equal(tp_cq_destroy(m->q), TP_OK);
    }
}

/* Users far below their limit, each with many slots in flight (the split
 * count's stale views decide without reading the other side's counter,
 * users.h), beside a stream of users that come once and go idle (their
 * entries taken over by the next new ones): two submitters, then the
 * limit holds for the hot users throughout, and at rest every count and
 * the users gauge are 0. */
#define FLIGHT_HOT   3
#define FLIGHT_LIMIT 40

typedef struct flight {
    tp_pool *p;
    atomic_int go, stop, over;
    atomic_long accepted, bad;
    long per_thread;
    atomic_uint salt;
} flight;

static const char *const flight_hot[FLIGHT_HOT] = {"h0", "h1", "h2"};

static void *flight_main(void *arg) {
    flight *m = (flight *)arg;
    uint32_t seed = (uint32_t)(uintptr_t)&seed | 1u;
    unsigned salt = atomic_fetch_add(&m->salt, 1000000u);
    char cold[24];
    tpt_wait_go(&m->go);
    for (long i = 0; i < m->per_thread; i++) {
        uint32_t x = tpt_xorshift(&seed);
        tp_task_opts o = {0};
        if (x % 8 == 0) { /* a user seen once */
            snprintf(cold, sizeof cold, "c%u", salt + (unsigned)i);
            o.user = cold;
        } else {
            o.user = flight_hot[x % FLIGHT_HOT];
        }
        int rc = tp_submit(m->p, mix_fn, (void *)(uintptr_t)x, &o, NULL);
        if (rc == TP_OK)
            atomic_fetch_add(&m->accepted, 1);
        else if (rc != TP_EUSERLIMIT && rc != TP_EFULL)
            atomic_fetch_add(&m->bad, 1);
        if (rc != TP_OK) sched_yield();
    }
    return NULL;
}

static void *flight_checker(void *arg) {
    flight *m = (flight *)arg;
    tpt_wait_go(&m->go);
    while (!atomic_load(&m->stop))
        for (int u = 0; u < FLIGHT_HOT; u++)
            if (tp_user_active(m->p, flight_hot[u]) > FLIGHT_LIMIT) atomic_store(&m->over, 1);
    return NULL;
}

static void test_staged_user_many_in_flight(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 2, 256, FLIGHT_LIMIT);
    flight *m = tpt_fx_new(f, flight);
    m->p = p;
    atomic_init(&m->go, 0);
    atomic_init(&m->stop, 0);
    atomic_init(&m->over, 0);
    atomic_init(&m->accepted, 0);
    atomic_init(&m->bad, 0);
    atomic_init(&m->salt, 0);
    m->per_thread = TPT_SANITIZED || tpt_slowdown() > 1 ? 3000 : 100000;
    pthread_t t[2], checker; /* joined below: each ends after a bounded number of calls */
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, flight_main, m), 0);
    assert_int_equal(pthread_create(&checker, NULL, flight_checker, m), 0);
    atomic_store(&m->go, 1);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    atomic_store(&m->stop, 1);
    assert_int_equal(pthread_join(checker, NULL), 0);
    tp_stats s = finish_users(p, flight_hot, FLIGHT_HOT);
    assert_int_equal(atomic_load(&m->over), 0);
    assert_int_equal(atomic_load(&m->bad), 0);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)atomic_load(&m->accepted)));
}

/* Several submitters at once, each mixing every path -- staged plain,
 * staged with a user, staged batches (cut by a full queue: the rest comes
 * again), tp_submit_wait, and locked submits (an id asked) -- into a pool
 * of one worker, retrying on TP_EFULL: every thread's tasks start in the
 * order it submitted them (SPEC section 5; the two-lock queue of stage.h
 * keeps one thread's order across both paths), each once, and the
 * counters at rest are the callers'. The queue is deep enough that the
 * worker leaves the ring alone at times (TP__STAGE_LOW). */
#define ORD_THREADS 3

typedef struct thread_order {
    tp_pool *p;
    atomic_int go;
    atomic_long accepted, bad, out_of_order, runs;
    long per_thread;
    long next[ORD_THREADS]; /* the worker's: the next sequence number it expects of each thread */
} thread_order;

typedef struct ord_arg {
    thread_order *m;
    int thread;
    long seq;
} ord_arg;

static int ord_fn(tp_ctx *c, void *arg) {
    (void)c;
    ord_arg *a = (ord_arg *)arg;
    thread_order *m = a->m;
    if (a->seq != m->next[a->thread]) atomic_fetch_add(&m->out_of_order, 1); /* one worker: no race */
    m->next[a->thread] = a->seq + 1;
    atomic_fetch_add(&m->runs, 1);
    free(a);
    return 0;
}

static ord_arg *ord_new(thread_order *m, int thread, long seq) {
    ord_arg *a = malloc(sizeof *a);
    assert_non_null(a);
    a->m = m;
    a->thread = thread;
    a->seq = seq;
    return a;
}

typedef struct ord_thread {
    thread_order *m;
    int index;
} ord_thread;

static void *ord_main(void *arg) {
    ord_thread *t = (ord_thread *)arg;
    thread_order *m = t->m;
    uint32_t rng = 0x9e3779b9u * (uint32_t)(t->index + 1);
    char user[8];
    snprintf(user, sizeof user, "u%d", t->index);
    tpt_wait_go(&m->go);
    for (long seq = 0; seq < m->per_thread;) {
        uint32_t x = tpt_xorshift(&rng);
        unsigned kind = x % 5, n = 1 + (x >> 8) % 4;
        if (kind == 3 && seq + (long)n > m->per_thread) kind = 0;
        int rc;
        size_t got = 0;
        tp_task_opts o = {0};
        uint64_t id = 0;
        if (kind == 3) { /* a staged batch: what was accepted, in order; the rest again */
            tp_task tasks[4];
            memset(tasks, 0, sizeof tasks);
            for (unsigned i = 0; i < n; i++) {
                tasks[i].fn = ord_fn;
                tasks[i].arg = ord_new(m, t->index, seq + (long)i);
            }
            rc = tp_submit_batch(m->p, tasks, n, NULL, &got);
            for (size_t i = got; i < n; i++) free(tasks[i].arg);
            seq += (long)got;
            atomic_fetch_add(&m->accepted, (long)got);
            if (rc != TP_OK && rc != TP_EFULL) atomic_fetch_add(&m->bad, 1);
            if (rc != TP_OK) sched_yield();
            continue;
        }
        ord_arg *a = ord_new(m, t->index, seq);
        switch (kind) {
        case 0: rc = tp_submit(m->p, ord_fn, a, NULL, NULL); break; /* staged */
        case 1: rc = tp_submit(m->p, ord_fn, a, NULL, &id); break;  /* locked */
        case 2:
            o.user = user;
            rc = tp_submit(m->p, ord_fn, a, &o, NULL);
            break; /* staged, a user */
        default: rc = tp_submit_wait(m->p, ord_fn, a, NULL, TPT_WAIT_NS, NULL); break;
        }
        if (rc == TP_OK) {
            seq++;
            atomic_fetch_add(&m->accepted, 1);
        } else {
            free(a);
            if (rc != TP_EFULL) atomic_fetch_add(&m->bad, 1);
            sched_yield();
        }
    }
    return NULL;
}

static void test_staged_threads_keep_their_order(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 64, TP_UNLIMITED);
    thread_order *m = tpt_fx_new(f, thread_order);
    ord_thread *th = tpt_fx_alloc(f, ORD_THREADS * sizeof *th);
    m->p = p;
    m->per_thread = TPT_SANITIZED || tpt_slowdown() > 1 ? 2000 : 30000;
    pthread_t t[ORD_THREADS]; /* joined below: each ends after per_thread tasks */
    for (int i = 0; i < ORD_THREADS; i++) {
        th[i].m = m;
        th[i].index = i;
        assert_int_equal(pthread_create(&t[i], NULL, ord_main, &th[i]), 0);
    }
    atomic_store(&m->go, 1);
    for (int i = 0; i < ORD_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&m->bad), 0);
    assert_int_equal(atomic_load(&m->out_of_order), 0);
    assert_int_equal(atomic_load(&m->accepted), ORD_THREADS * m->per_thread);
    assert_int_equal(atomic_load(&m->runs), ORD_THREADS * m->per_thread);
    for (int i = 0; i < ORD_THREADS; i++) assert_int_equal(m->next[i], m->per_thread);
    tpt_assert_counts(s, TPT_EQ(accepted, (uint64_t)(ORD_THREADS * m->per_thread)),
                      TPT_EQ(succeeded, (uint64_t)(ORD_THREADS * m->per_thread)));
}

/* A pool that may start workers on demand (max_workers above workers) and
 * a fair pool do not stage: the same plain submits, the same answers. */
static void test_not_staged_pools(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int k = 0; k < 2; k++) {
        tpt_latch *l = tpt_fx_latch(f);
        tp_config c = tpt_quiet_config(k == 0 ? 1 : 2, 3, TP_UNLIMITED);
        if (k == 0)
            c.max_workers = 2; /* elastic: 1 to 2 */
        else
            c.sched = TP_SCHED_FAIR;
        tp_pool *p = tpt_fx_pool(f, &c);
        tpt_fill_workers(p, l, 2, NULL);
        for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
        assert_int_equal(tpt_stats(p).queued, 3);
        tpt_latch_open(l);
        tp_stats s = tpt_finish(p);
        tpt_assert_counts(s, TPT_EQ(accepted, 5), TPT_EQ(completed, 5));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_staged_bound_exact),
        TPT_TEST(test_staged_ring_overflow),
        TPT_TEST(test_staged_room_starts_late),
        TPT_TEST(test_staged_bound_rounds),
        TPT_TEST(test_staged_bound),
        TPT_TEST(test_staged_bound_checks),
        TPT_TEST(test_staged_order_with_locked),
        TPT_TEST(test_staged_submit_wait),
        TPT_TEST(test_staged_admitted_at_the_record_cap),
        TPT_TEST(test_submit_wait_at_the_record_cap),
        TPT_TEST(test_staged_batch_bound),
        TPT_TEST(test_staged_batch_adjacent),
        TPT_TEST(test_staged_batch_cq_cut_room),
        TPT_TEST(test_staged_batch_ring_short),
        TPT_TEST(test_staged_waiter_after_batch),
        TPT_TEST(test_staged_retry_behind),
        TPT_TEST(test_staged_starve_count),
        TPT_TEST(test_staged_behind_expired_lane),
        TPT_TEST(test_staged_starve_count_after_leave),
        TPT_TEST(test_staged_cancel_admits_one),
        TPT_TEST(test_staged_wait_for_unpublished),
        TPT_TEST(test_staged_wakes_idle_pool),
        TPT_TEST(test_staged_close_race),
        TPT_TEST(test_staged_forced_shutdown),
        TPT_TEST(test_staged_user_limit),
        TPT_TEST(test_staged_user_kept_slots),
        TPT_TEST(test_staged_user_kept_stats),
        TPT_TEST(test_staged_user_chain_from_drain),
        TPT_TEST(test_staged_user_drain_kept),
        TPT_TEST(test_staged_user_wait_on_kept),
        TPT_TEST(test_staged_user_mix),
        TPT_TEST(test_staged_user_many_in_flight),
        TPT_TEST(test_staged_threads_keep_their_order),
        TPT_TEST(test_not_staged_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
