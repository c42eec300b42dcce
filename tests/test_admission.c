/*
 * test_admission.c -- admission: the queue bound, the order of refusals, what
 * a refusal leaves behind, FIFO start order, per-user slots on every ending,
 * tp_submit_wait and task ids.
 *
 * Every scenario first fills the workers with tasks blocked on a latch and
 * waits until stats.active says they run, so "full" and "queued" are states
 * the test constructed, not interleavings it hoped for. Pool threads record
 * into atomics; only the main thread asserts.
 */
#include "tp_test.h"

#include <stddef.h>

/* ------------------------------------------------------------ helpers */

static uint64_t stat_field(const tp_stats *s, size_t off) {
    uint64_t v;
    memcpy(&v, (const char *)s + off, sizeof v);
    return v;
}

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* ids[0..n) are all non-zero and pairwise distinct. */
static void assert_ids_unique(const uint64_t *ids, size_t n) {
    uint64_t *s = malloc(n * sizeof *s);
    assert_non_null(s);
    memcpy(s, ids, n * sizeof *s);
    qsort(s, n, sizeof *s, u64_cmp);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == 0) {
            free(s);
            fail_msg("task id 0 handed out");
        }
        if (i > 0 && s[i] == s[i - 1]) {
            uint64_t dup = s[i];
            free(s);
            fail_msg("task id %llu handed out twice", (unsigned long long)dup);
        }
    }
    free(s);
}

/* ------------------------------------------------------------ the bound */

/* W workers blocked: exactly queue_capacity more are accepted, the next one is
 * TP_EFULL. Running tasks do not count against the queue. */
static void test_queue_bound_excludes_running(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 3, CAP = 4 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, CAP, TP_UNLIMITED);
    tpt_fill_workers(p, l, W, NULL);

    for (unsigned i = 0; i < CAP; i++) assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, CAP);
    assert_int_equal(s.active, W);
    assert_true(s.active + s.queued + s.delayed <= W + CAP);

    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &o, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &o, NULL), TP_EFULL);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 2), TPT_EQ(accepted, W + CAP), TPT_EQ(queued, CAP));

    tpt_latch_open(l);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, W + CAP), TPT_EQ(succeeded, W + CAP), TPT_EQ(rejected_full, 2));
    assert_int_equal(atomic_load(&d->calls), 0);
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* With a bigger pool the same holds: the running set never shrinks the queue. */
static void test_queue_bound_one_slot(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 1, TP_UNLIMITED);
    tpt_fill_workers(p, l, 2, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    tpt_latch_open(l);
    /* Once everything ran there is room again. */
    TPT_EVENTUALLY(tpt_stats(p).completed == 3);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.rejected_full, 1);
    assert_int_equal(s.accepted, 4);
}

static int fail_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 4;
}

/* A task waiting for its retry occupies the waiting area (queued + delayed)
 * though no worker: with capacity 1 and an idle worker, the next is TP_EFULL. */
static void test_queue_bound_counts_delayed(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 1;
    c.max_retries = 1;
    c.retry_delay_ns = TPT_S(60); /* never within the test */
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, fail_task, d, &o, &id), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 1 && tpt_stats(p).active == 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_MS(10), NULL), TP_ETIMEDOUT);
    /* the delayed task ended: room again */
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    assert_int_equal(atomic_load(&d->status), TP_ECANCELED);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 1), TPT_EQ(rejected_timeout, 1), TPT_EQ(accepted, 2));
}

/* ------------------------------------------------------------ refusal order */

static char long_name[TP_USER_MAX + 2];

/* arguments -> closed -> user limit -> full, checked in states where several
 * conditions hold at once. */
static void test_refusal_order(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, 1);

    tpt_fill_workers(p, l, 1, "a"); /* "a" holds its only slot, running */
    tp_task_opts ob = {0};
    ob.user = "b";
    assert_int_equal(tp_submit(p, tpt_block_task, l, &ob, NULL), TP_OK); /* queue full */
    assert_int_equal(tp_user_active(p, "a"), 1);
    assert_int_equal(tp_user_active(p, "b"), 1);

    tp_task_opts oa = {0}, oc = {0};
    oa.user = "a";
    oc.user = "c";
    /* user limit + full -> user limit wins */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oa, NULL), TP_EUSERLIMIT);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &ob, NULL), TP_EUSERLIMIT);
    /* only full */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oc, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_user, 2), TPT_EQ(rejected_full, 2), TPT_EQ(rejected_closed, 0));

    /* bad arguments win over the full queue and the user limit */
    tp_task_opts bad = {0};
    bad.user = "a";
    bad.priority = TP_PRIO_MAX + 1;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &bad, NULL), TP_EINVAL);
    assert_int_equal(tp_submit(p, NULL, NULL, &oa, NULL), TP_EINVAL);
    s = tpt_stats(p);
    assert_int_equal(s.submitted, 2 + 4); /* TP_EINVAL changes no counter */

    assert_int_equal(tp_close(p), TP_OK);
    /* closed + user limit + full -> closed wins */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oa, NULL), TP_ECLOSED);
    /* closed + full */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oc, NULL), TP_ECLOSED);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    /* tp_submit_wait too: closed wins and it does not wait */
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, &oa, TPT_WAIT_NS, NULL), TP_ECLOSED);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS / 2);

    /* arguments still win over closed, and change nothing */
    tp_stats before = tpt_stats(p);
    assert_int_equal(tp_submit(p, NULL, NULL, NULL, NULL), TP_EINVAL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &bad, NULL), TP_EINVAL);
    memset(long_name, 'x', TP_USER_MAX + 1);
    long_name[TP_USER_MAX + 1] = '\0';
    tp_task_opts lu = {0};
    lu.user = long_name;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &lu, NULL), TP_EINVAL);
    tp_task_opts ll = {0};
    ll.log_id = long_name;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &ll, NULL), TP_EINVAL);
    assert_int_equal(tp_submit_wait(p, NULL, NULL, NULL, TPT_MS(1), NULL), TP_EINVAL);
    assert_int_equal(tp_submit(NULL, tpt_nop_task, NULL, NULL, NULL), TP_EINVAL);
    s = tpt_stats(p);
    assert_int_equal(s.submitted, before.submitted);
    assert_int_equal(s.rejected, before.rejected);

    tpt_latch_open(l);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK); /* a close drains */
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 2), TPT_EQ(rejected_user, 2), TPT_EQ(rejected_full, 2),
                      TPT_EQ(rejected_closed, 4), TPT_EQ(rejected_timeout, 0));
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* A user name of exactly TP_USER_MAX bytes is fine. */
static void test_user_name_max_length(void **state) {
    tpt_fixture *f = tpt_fx(state);
    char name[TP_USER_MAX + 1];
    memset(name, 'u', TP_USER_MAX);
    name[TP_USER_MAX] = '\0';
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 2);
    tp_task_opts o = {0};
    o.user = name;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ no trace */

/* Submit one task that must be refused with `want`; check that only the
 * submitted counter and the matching rejected_* counter moved. The pool is
 * quiescent (workers blocked, queue frozen) so two snapshots compare exactly. */
static void expect_refused(tp_pool *p, int want, size_t field, const char *user, tpt_done *d, int wait) {
    tp_stats b = tpt_stats(p);
    unsigned ua = tp_user_active(p, user);
    tp_task_opts o = {0};
    o.user = user;
    o.on_done = tpt_done_fn;
    int rc = wait ? tp_submit_wait(p, tpt_nop_task, d, &o, TPT_MS(20), NULL)
                  : tp_submit(p, tpt_nop_task, d, &o, NULL);
    assert_int_equal(rc, want);
    tp_stats a = tpt_stats(p);
    tpt_assert_counts(a, TPT_EQ(submitted, b.submitted + 1), TPT_EQ(accepted, b.accepted),
                      TPT_EQ(rejected, b.rejected + 1));
    assert_int_equal(stat_field(&a, field), stat_field(&b, field) + 1);
    tpt_assert_counts(a, TPT_EQ(queued, b.queued), TPT_EQ(users, b.users), TPT_EQ(completed, b.completed));
    assert_int_equal(tp_user_active(p, user), ua);
    assert_int_equal(atomic_load(&d->calls), 0);
}

static void test_rejection_leaves_no_trace(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { MAXIDS = 16 };
    uint64_t ids[MAXIDS];
    size_t nids = 0;
    tpt_done *refused = tpt_fx_array(f, tpt_done, 8);
    tpt_done *ok = tpt_fx_array(f, tpt_done, 4);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 2, 2);

    tpt_fill_workers(p, l, 1, "u"); /* u: 1 of 2 */
    tp_task_opts o = {0};
    o.user = "u";
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, &ok[0], &o, &ids[nids++]), TP_OK); /* u: 2 of 2 */
    assert_int_equal(tp_user_active(p, "u"), 2);
    assert_int_equal(tpt_stats(p).users, 1);

    /* user limit */
    expect_refused(p, TP_EUSERLIMIT, offsetof(tp_stats, rejected_user), "u", &refused[0], 0);
    /* the next accepted task gets a fresh id */
    tp_task_opts ov = {0};
    ov.user = "v";
    ov.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, &ok[1], &ov, &ids[nids++]), TP_OK); /* queue full */
    assert_int_equal(tp_user_active(p, "v"), 1);

    /* full, for a user with room: the slot reserved for the check is given back */
    expect_refused(p, TP_EFULL, offsetof(tp_stats, rejected_full), "w", &refused[1], 0);
    expect_refused(p, TP_EFULL, offsetof(tp_stats, rejected_full), "v", &refused[2], 0);
    expect_refused(p, TP_EFULL, offsetof(tp_stats, rejected_full), NULL, &refused[3], 0);
    /* a blocking submit that runs out of budget */
    expect_refused(p, TP_ETIMEDOUT, offsetof(tp_stats, rejected_timeout), "v", &refused[4], 1);
    expect_refused(p, TP_ETIMEDOUT, offsetof(tp_stats, rejected_timeout), "u", &refused[5], 1);
    assert_int_equal(tp_user_active(p, "w"), 0);
    assert_int_equal(tp_user_active(p, "v"), 1);
    assert_int_equal(tp_user_active(p, "u"), 2);
    assert_int_equal(tpt_stats(p).users, 2);

    /* Free one queue place by cancelling v's queued task, then an accepted
     * task after all those refusals still gets a fresh, non-zero id. */
    assert_int_equal(tp_cancel(p, ids[1]), TP_OK);
    TPT_EVENTUALLY(atomic_load(&ok[1].calls) == 1);
    assert_int_equal(atomic_load(&ok[1].status), TP_ECANCELED);
    assert_int_equal(tp_user_active(p, "v"), 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, &ok[2], &ov, &ids[nids++]), TP_OK);

    assert_int_equal(tp_close(p), TP_OK);
    expect_refused(p, TP_ECLOSED, offsetof(tp_stats, rejected_closed), "u", &refused[6], 0);
    expect_refused(p, TP_ECLOSED, offsetof(tp_stats, rejected_closed), "x", &refused[7], 0);
    assert_int_equal(tp_user_active(p, "x"), 0);

    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_ids_unique(ids, nids);
    for (int i = 0; i < 8; i++) assert_int_equal(atomic_load(&refused[i].calls), 0);
    assert_int_equal(atomic_load(&ok[0].calls), 1);
    assert_int_equal(atomic_load(&ok[0].status), 0);
    assert_int_equal(atomic_load(&ok[2].calls), 1);
    assert_int_equal(atomic_load(&ok[2].status), 0);
    tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(rejected_user, 1), TPT_EQ(rejected_full, 3),
                      TPT_EQ(rejected_timeout, 2), TPT_EQ(rejected_closed, 2));
    assert_int_equal(atomic_load(&l->timeouts), 0);
}

/* ------------------------------------------------------------ FIFO */

#define FIFO_N 64
static atomic_int fifo_next;
static atomic_int fifo_order[FIFO_N];

static int fifo_task(tp_ctx *c, void *arg) {
    (void)c;
    int pos = atomic_fetch_add(&fifo_next, 1);
    if (pos < FIFO_N) atomic_store(&fifo_order[pos], (int)(intptr_t)arg);
    return 0;
}

static void test_fifo_start_order(void **state) {
    tpt_fixture *f = tpt_fx(state);
    atomic_store(&fifo_next, 0);
    for (int i = 0; i < FIFO_N; i++) atomic_store(&fifo_order[i], -1);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, FIFO_N, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    for (int i = 0; i < FIFO_N; i++) {
        tp_task_opts o = {0};
        o.user = (i % 3 == 0) ? "a" : (i % 3 == 1) ? "b" : NULL; /* users don't reorder */
        assert_int_equal(tp_submit(p, fifo_task, (void *)(intptr_t)i, &o, NULL), TP_OK);
    }
    assert_int_equal(tpt_stats(p).queued, FIFO_N);
    tpt_latch_open(l);
    tpt_finish(p);
    assert_int_equal(atomic_load(&fifo_next), FIFO_N);
    for (int i = 0; i < FIFO_N; i++) assert_int_equal(atomic_load(&fifo_order[i]), i);
}

/* FIFO also holds when the queue wraps around several times. */
static void test_fifo_across_wraparound(void **state) {
    tpt_fixture *f = tpt_fx(state);
    atomic_store(&fifo_next, 0);
    for (int i = 0; i < FIFO_N; i++) atomic_store(&fifo_order[i], -1);
    tp_pool *p = tpt_quiet_pool(f, 1, 5, TP_UNLIMITED);
    for (int i = 0; i < FIFO_N; i++)
        assert_int_equal(tp_submit_wait(p, fifo_task, (void *)(intptr_t)i, NULL, TPT_WAIT_NS, NULL), TP_OK);
    tpt_finish(p);
    for (int i = 0; i < FIFO_N; i++) assert_int_equal(atomic_load(&fifo_order[i]), i);
}

/* ------------------------------------------------------------ user slots on every ending */

enum { M_OK, M_FAIL, M_SLEEP, M_BLOCK, M_UNTIL_ERR };

typedef struct slot_rec {
    tp_pool *pool;
    const char *user;
    tpt_latch *latch;
    int mode;
    atomic_int ran;
    atomic_int calls;
    atomic_int status;
    atomic_int user_active_in_done; /* tp_user_active(user) seen inside on_done */
    atomic_int users_in_done;       /* stats.users seen inside on_done */
} slot_rec;

static void slot_rec_init(slot_rec *r, tp_pool *p, const char *user, int mode, tpt_latch *l) {
    memset(r, 0, sizeof *r);
    r->pool = p;
    r->user = user;
    r->mode = mode;
    r->latch = l;
    atomic_init(&r->user_active_in_done, -1);
    atomic_init(&r->users_in_done, -1);
}

static int slot_task(tp_ctx *c, void *arg) {
    slot_rec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    switch (r->mode) {
    case M_OK: return 0;
    case M_FAIL: return 5;
    case M_SLEEP: return tp_ctx_sleep(c, TPT_WAIT_NS);
    case M_BLOCK: tpt_latch_wait(r->latch); return 0;
    case M_UNTIL_ERR: {
        uint64_t end = tp_now_ns() + TPT_WAIT_NS;
        while (tp_ctx_err(c) == 0 && tp_now_ns() < end) tpt_pause();
        return tp_ctx_err(c);
    }
    }
    return 0;
}

static void slot_done(void *arg, int status) {
    slot_rec *r = arg;
    tp_stats s;
    tp_stats_get(r->pool, &s);
    atomic_store(&r->users_in_done, (int)s.users);
    atomic_store(&r->user_active_in_done, (int)tp_user_active(r->pool, r->user));
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
}

static uint64_t submit_rec(tp_pool *p, slot_rec *r, uint64_t deadline, uint64_t run_timeout) {
    tp_task_opts o = {0};
    o.user = r->user;
    o.on_done = slot_done;
    o.deadline_ns = deadline;
    o.run_timeout_ns = run_timeout;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, slot_task, r, &o, &id), TP_OK);
    assert_true(id != 0);
    return id;
}

/* After the ending: on_done ran once, the slot was already free inside it, the
 * user can submit again (limit 1). */
static void assert_slot_free_after(tp_pool *p, slot_rec *r, int status) {
    TPT_EVENTUALLY(atomic_load(&r->calls) >= 1);
    assert_int_equal(atomic_load(&r->calls), 1);
    assert_int_equal(atomic_load(&r->status), status);
    assert_int_equal(atomic_load(&r->user_active_in_done), 0);
    assert_int_equal(tp_user_active(p, r->user), 0);
}

static void resubmit_ok(tp_pool *p, const char *user) {
    tp_task_opts o = {0};
    o.user = user;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
}

static void test_slot_released_on_success(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_OK, NULL);
    submit_rec(p, &r, 0, 0);
    assert_slot_free_after(p, &r, 0);
    assert_int_equal(atomic_load(&r.users_in_done), 0);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 2);
}

static void test_slot_released_on_failure(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_FAIL, NULL);
    submit_rec(p, &r, 0, 0);
    assert_slot_free_after(p, &r, 5);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.failed, 1);
    assert_int_equal(s.cancelled, 0);
}

/* Retries exhausted: the slot is kept through the retry wait, then released. */
static void test_slot_released_after_retries(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 4;
    c.max_per_user = 1;
    c.max_retries = 2;
    c.retry_delay_ns = TPT_MS(2);
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_FAIL, NULL);
    submit_rec(p, &r, 0, 0);
    assert_slot_free_after(p, &r, 5);
    assert_int_equal(atomic_load(&r.ran), 3);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.retried, 2);
    assert_int_equal(s.failed, 1);
}

static void test_slot_released_on_cancel_queued(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    tpt_fill_workers(p, l, 1, NULL);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_OK, NULL);
    uint64_t id = submit_rec(p, &r, 0, 0);
    assert_int_equal(tp_user_active(p, "u"), 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_slot_free_after(p, &r, TP_ECANCELED);
    assert_int_equal(atomic_load(&r.ran), 0);
    resubmit_ok(p, "u");
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r.ran), 0);
    assert_int_equal(s.cancelled, 1);
}

static void test_slot_released_on_cancel_running(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_SLEEP, NULL);
    uint64_t id = submit_rec(p, &r, 0, 0);
    TPT_EVENTUALLY(atomic_load(&r.ran) == 1 && tpt_stats(p).active == 1);
    assert_int_equal(tp_user_active(p, "u"), 1);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_slot_free_after(p, &r, TP_ECANCELED);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 1);
}

static void test_slot_released_on_run_timeout(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_UNTIL_ERR, NULL);
    submit_rec(p, &r, 0, TPT_MS(20));
    assert_slot_free_after(p, &r, TP_ETIMEDOUT);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(s.expired, 0);
}

static void test_slot_released_on_expiry(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    tpt_fill_workers(p, l, 1, NULL);
    slot_rec r;
    slot_rec_init(&r, p, "u", M_OK, NULL);
    submit_rec(p, &r, 1 /* long passed */, 0);
    tpt_latch_open(l); /* a worker picks it and finds the deadline passed */
    assert_slot_free_after(p, &r, TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r.ran), 0);
    resubmit_ok(p, "u");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.expired, 1);
    assert_int_equal(s.cancelled, 1);
}

/* Forced shutdown: the running one (cooperative) and the queued one both give
 * their slots back. */
static void test_slot_released_on_forced_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 1);
    slot_rec run, q;
    slot_rec_init(&run, p, "u", M_SLEEP, NULL);
    slot_rec_init(&q, p, "v", M_OK, NULL);
    submit_rec(p, &run, 0, 0);
    TPT_EVENTUALLY(atomic_load(&run.ran) == 1 && tpt_stats(p).active == 1);
    submit_rec(p, &q, 0, 0);
    assert_int_equal(tpt_stats(p).users, 2);
    assert_int_equal(tp_shutdown(p, TPT_MS(50)), TP_ETIMEDOUT);
    assert_slot_free_after(p, &run, TP_ECANCELED);
    assert_slot_free_after(p, &q, TP_ECANCELED);
    assert_int_equal(atomic_load(&q.ran), 0);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.users, 0);
    assert_int_equal(s.cancelled, 2);
    tpt_destroy(p);
}

/* ------------------------------------------------------------ tp_submit_wait */

typedef struct opener {
    tpt_latch *l;
    uint64_t delay_ns;
    atomic_int *go; /* optional: wait until set before the delay */
    uint64_t opened_at;
} opener;

static void *opener_main(void *a) {
    opener *o = a;
    if (o->go != NULL) {
        uint64_t end = tp_now_ns() + TPT_WAIT_NS;
        while (!atomic_load(o->go) && tp_now_ns() < end) tpt_pause();
    }
    tpt_sleep_ns(o->delay_ns); /* only makes it likely the caller is already waiting */
    o->opened_at = tp_now_ns();
    tpt_latch_open(o->l);
    return NULL;
}

static void test_submit_wait_times_out(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = {0};
    c.workers = 1;
    c.queue_capacity = 1;
    c.max_per_user = 2;
    c.submit_timeout_ns = TPT_MS(50);
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_fill_workers(p, l, 1, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);

    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.user = "u";
    o.on_done = tpt_done_fn;
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, d, &o, TPT_MS(30), NULL), TP_ETIMEDOUT);
    uint64_t el = tp_now_ns() - t0;
    assert_true(el >= TPT_MS(30) - TPT_MS(1)); /* the whole budget was waited */
    assert_true(el < TPT_WAIT_NS);
    assert_int_equal(tp_user_active(p, "u"), 0);

    /* budget 0 -> the configured submit_timeout_ns */
    t0 = tp_now_ns();
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, d, &o, 0, NULL), TP_ETIMEDOUT);
    el = tp_now_ns() - t0;
    assert_true(el >= TPT_MS(50) - TPT_MS(1));
    assert_true(el < TPT_WAIT_NS);

    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_timeout, 2), TPT_EQ(rejected_full, 0), /* never reported as full */
                      TPT_EQ(accepted, 2), TPT_EQ(users, 0));

    tpt_latch_open(l);
    s = tpt_finish(p);
    assert_int_equal(s.rejected_timeout, 2);
    assert_int_equal(atomic_load(&d->calls), 0);
}

/* The queue is full; another thread releases the blocked worker while the
 * caller waits, and the caller gets in. */
static void test_submit_wait_gets_space(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);

    atomic_int *go = tpt_fx_new(f, atomic_int);
    opener *op = tpt_fx_new(f, opener);
    *op = (opener){l, TPT_MS(50), go, 0};
    tpt_fx_thr *th = tpt_fx_thread(f, opener_main, op);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    atomic_store(go, 1);
    int rc = tp_submit_wait(p, tpt_nop_task, d, &o, TPT_WAIT_NS, &id);
    uint64_t ret = tp_now_ns();
    tpt_fx_join(th);
    assert_int_equal(rc, TP_OK);
    assert_true(id != 0);
    assert_true(ret >= op->opened_at); /* it could only get in after the release */

    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&d->calls), 1);
    assert_int_equal(atomic_load(&d->status), 0);
    assert_int_equal(s.accepted, 3);
    assert_int_equal(s.rejected_timeout, 0);
}

typedef struct delayed_cancel {
    tp_pool *p;
    uint64_t id;
    uint64_t delay_ns;
    atomic_int *go;
    int rc;
    uint64_t cancelled_at;
} delayed_cancel;

static void *delayed_cancel_main(void *a) {
    delayed_cancel *c = a;
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(c->go) && tp_now_ns() < end) tpt_pause();
    tpt_sleep_ns(c->delay_ns); /* only makes it likely the caller is already waiting */
    c->cancelled_at = tp_now_ns();
    c->rc = tp_cancel(c->p, c->id);
    return NULL;
}

/* Space freed by cancelling a queued task also wakes a waiting submitter,
 * while the worker stays blocked. */
static void test_submit_wait_gets_space_from_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    tpt_done *q = tpt_fx_new(f, tpt_done);
    tp_task_opts oq = {0};
    oq.on_done = tpt_done_fn;
    uint64_t qid = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, q, &oq, &qid), TP_OK); /* full */

    atomic_int *go = tpt_fx_new(f, atomic_int);
    delayed_cancel *dc = tpt_fx_new(f, delayed_cancel);
    *dc = (delayed_cancel){p, qid, TPT_MS(50), go, 12345, 0};
    tpt_fx_thr *th = tpt_fx_thread(f, delayed_cancel_main, dc);
    atomic_store(go, 1);
    uint64_t t0 = tp_now_ns();
    int rc = tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_WAIT_NS, NULL);
    uint64_t ret = tp_now_ns();
    tpt_fx_join(th);
    assert_int_equal(dc->rc, TP_OK);
    assert_int_equal(rc, TP_OK);
    assert_true(ret >= dc->cancelled_at);
    assert_true(ret - t0 < TPT_WAIT_NS / 4);       /* woken, not timed out */
    assert_int_equal(atomic_load(&l->waiting), 1); /* the worker never moved */
    TPT_EVENTUALLY(atomic_load(&q->calls) == 1);
    assert_int_equal(atomic_load(&q->status), TP_ECANCELED);

    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.accepted, 3);
    assert_int_equal(s.cancelled, 1);
}

/* The user is at its limit (one running task); space exists. The caller waits
 * for the user's slot and gets in when that task ends. */
static void test_submit_wait_gets_user_slot(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 2, 8, 1);
    tpt_fill_workers(p, l, 1, "u");
    tp_task_opts o = {0};
    o.user = "u";
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_EUSERLIMIT);
    /* other users are not held up */
    tp_task_opts ov = {0};
    ov.user = "v";
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, &ov, TPT_WAIT_NS, NULL), TP_OK);

    atomic_int *go = tpt_fx_new(f, atomic_int);
    opener *op = tpt_fx_new(f, opener);
    *op = (opener){l, TPT_MS(50), go, 0};
    tpt_fx_thr *th = tpt_fx_thread(f, opener_main, op);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    o.on_done = tpt_done_fn;
    atomic_store(go, 1);
    int rc = tp_submit_wait(p, tpt_nop_task, d, &o, TPT_WAIT_NS, NULL);
    uint64_t ret = tp_now_ns();
    tpt_fx_join(th);
    assert_int_equal(rc, TP_OK);
    assert_true(ret >= op->opened_at);

    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&d->calls), 1);
    tpt_assert_counts(s, TPT_EQ(rejected_user, 1), TPT_EQ(rejected_timeout, 0), TPT_EQ(accepted, 3));
}

typedef struct waiter {
    tp_pool *p;
    const char *user;
    atomic_int entering;
    int rc;
    uint64_t returned_at;
    tpt_done d;
} waiter;

static void *waiter_main(void *a) {
    waiter *w = a;
    tp_task_opts o = {0};
    o.user = w->user;
    o.on_done = tpt_done_fn;
    atomic_store(&w->entering, 1);
    w->rc = tp_submit_wait(w->p, tpt_nop_task, &w->d, &o, TPT_WAIT_NS, NULL);
    w->returned_at = tp_now_ns();
    return NULL;
}

/* A close wakes every waiter at once with TP_ECLOSED, long before its 20 s
 * budget: one waiting for space, one waiting for a user slot. */
static void test_submit_wait_woken_by_close(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, 1);
    tpt_fill_workers(p, l, 1, "a");
    tp_task_opts ob = {0};
    ob.user = "b";
    assert_int_equal(tp_submit(p, tpt_block_task, l, &ob, NULL), TP_OK); /* full */

    waiter *w = tpt_fx_array(f, waiter, 2); /* zeroed, outlives a failed assert */
    w[0].p = p;
    w[0].user = "c"; /* waits for space */
    w[1].p = p;
    w[1].user = "a"; /* waits for a's slot (and space) */
    tpt_fx_thr *th[2];
    for (int i = 0; i < 2; i++) th[i] = tpt_fx_thread(f, waiter_main, &w[i]);
    TPT_EVENTUALLY(atomic_load(&w[0].entering) && atomic_load(&w[1].entering));
    tpt_sleep_ns(TPT_MS(50)); /* likely inside the wait; correctness does not depend on it */
    uint64_t t_close = tp_now_ns();
    assert_int_equal(tp_close(p), TP_OK);
    for (int i = 0; i < 2; i++) tpt_fx_join(th[i]);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w[i].rc, TP_ECLOSED);
        /* "at once": far below the 20 s budget even on a slow sanitizer run */
        assert_true(w[i].returned_at - t_close < TPT_WAIT_NS / 4);
    }
    assert_int_equal(tp_user_active(p, "c"), 0);
    assert_int_equal(tp_user_active(p, "a"), 1);

    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.rejected_closed, 2);
    assert_int_equal(s.accepted, 2);
    for (int i = 0; i < 2; i++) assert_int_equal(atomic_load(&w[i].d.calls), 0);
}

/* A budget already spent is TP_ETIMEDOUT even though there is space. */
static void test_submit_wait_budget_spent(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 20 };
    tp_pool *p = tpt_quiet_pool(f, 1, 100, TP_UNLIMITED);
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    o.user = "u";
    for (int i = 0; i < N; i++)
        assert_int_equal(tp_submit_wait(p, tpt_nop_task, d, &o, 1, NULL), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.rejected_timeout, N);
    assert_int_equal(s.accepted, 0);
    assert_int_equal(tp_user_active(p, "u"), 0);
    /* with a real budget the same call is accepted */
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, d, &o, TPT_WAIT_NS, NULL), TP_OK);
    s = tpt_finish(p);
    assert_int_equal(atomic_load(&d->calls), 1);
    assert_int_equal(s.rejected_timeout, N);
    assert_int_equal(s.accepted, 1);
}

/* ------------------------------------------------------------ full, lock-free */

/* A full queue is refused without the pool lock while no user is at its
 * limit (pool.c, refuse_full_fast). The refusal order must not change: a
 * user at its limit gets TP_EUSERLIMIT, never the lock-free TP_EFULL, however
 * it reached the limit (admission) and left it (cancel, completion). */
static void test_full_refusal_tracks_users_at_limit(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 2, 2);
    tpt_fill_workers(p, l, 1, "x"); /* x holds 1 of 2 */
    tp_task_opts ox = {.user = "x"}, oy = {.user = "y"}, oz = {.user = "z"};
    uint64_t y1 = 0, y2 = 0, plain = 0;
    assert_int_equal(tp_submit(p, tpt_block_task, l, &oy, &y1), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, l, &oy, &y2), TP_OK); /* y at its limit; queue full */
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &ox, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oy, NULL), TP_EUSERLIMIT);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);

    /* y leaves its limit by a cancel; the queue fills again: nobody at a
     * limit, so every kind of task is refused for space */
    assert_int_equal(tp_cancel(p, y2), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, &plain), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &ox, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oy, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oz, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);

    /* y reaches its limit again through admission: TP_EUSERLIMIT at once */
    assert_int_equal(tp_cancel(p, plain), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, l, &oy, &y2), TP_OK);
    assert_int_equal(tp_user_active(p, "y"), 2);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oy, NULL), TP_EUSERLIMIT);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oz, NULL), TP_EFULL);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.rejected_user, 2);
    assert_int_equal(s.rejected_full, 7);

    /* ... and leaves it through completion: with the queue full again of
     * plain tasks, y is refused for space */
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == 5 && tp_user_active(p, "y") == 0);
    tpt_latch *l2 = tpt_fx_latch(f);
    tpt_fill_workers(p, l2, 1, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, l2, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, l2, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &oy, NULL), TP_EFULL);
    tpt_latch_open(l2);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(rejected_user, 2), TPT_EQ(rejected_full, 8), TPT_EQ(accepted, 8),
                      TPT_EQ(cancelled, 2));
}

/* ------------------------------------------------------------ the lock-free refusal */

/* A thread that has read queued + delayed < queue_capacity from tp_stats_get
 * is not then refused for space: the lock-free "full" word that tp_submit
 * consults before the lock is published before the counters a reader
 * acquires, never after (a reader saw queued = 0 while the word still said
 * full: 36 refusals in 1,000,000 rounds). One worker, room for one, one
 * submitter: after the stats show the pool empty, nothing else can fill it. */
static void test_empty_stats_never_full(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
    /* up to 200,000 rounds (about 0.5 s in a plain build), as many as fit
     * in 3 s under a sanitizer or a loaded machine (the file runs 10-30 times
     * in CI), but at least 2,000 */
    const uint64_t stop = tp_now_ns() + TPT_S(3);
    unsigned bad = 0, rounds = 0;
    for (; rounds < 200000u && (rounds < 2000u || tp_now_ns() < stop); rounds++) {
        while (tp_submit(p, tpt_nop_task, NULL, NULL, NULL) != TP_OK) sched_yield();
        tp_stats s;
        const uint64_t until = tp_now_ns() + TPT_WAIT_NS; /* this round's own bound */
        do {
            tp_stats_get(p, &s);
        } while (s.active + s.queued + s.delayed != 0 && tp_now_ns() < until);
        if (s.active + s.queued + s.delayed != 0) fail_msg("round %u: the pool never showed empty", rounds);
        if (tp_submit(p, tpt_nop_task, NULL, NULL, NULL) != TP_OK) bad++;
    }
    tp_stats s = tpt_finish(p);
    if (bad) fail_msg("%u of %u submits refused after the stats showed an empty pool", bad, rounds);
    if (getenv("TPT_VERBOSE")) print_message("%u rounds\n", rounds);
    assert_int_equal(s.rejected_full, s.submitted - s.accepted);
}

/* ------------------------------------------------------------ ids */

static void test_ids_unique_nonzero(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 2000 };
    uint64_t *ids = calloc(N, sizeof *ids);
    assert_non_null(ids);
    tp_pool *p = tpt_quiet_pool(f, 2, 16, TP_UNLIMITED);
    for (int i = 0; i < N; i++) {
        assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_WAIT_NS, &ids[i]), TP_OK);
        if (i % 100 == 0) /* a NULL id_out is fine too */
            assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, TPT_WAIT_NS, NULL), TP_OK);
    }
    tpt_finish(p);
    assert_ids_unique(ids, N);
    free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_queue_bound_excludes_running),
        TPT_TEST(test_queue_bound_one_slot),
        TPT_TEST(test_queue_bound_counts_delayed),
        TPT_TEST(test_refusal_order),
        TPT_TEST(test_user_name_max_length),
        TPT_TEST(test_rejection_leaves_no_trace),
        TPT_TEST(test_fifo_start_order),
        TPT_TEST(test_fifo_across_wraparound),
        TPT_TEST(test_slot_released_on_success),
        TPT_TEST(test_slot_released_on_failure),
        TPT_TEST(test_slot_released_after_retries),
        TPT_TEST(test_slot_released_on_cancel_queued),
        TPT_TEST(test_slot_released_on_cancel_running),
        TPT_TEST(test_slot_released_on_run_timeout),
        TPT_TEST(test_slot_released_on_expiry),
        TPT_TEST(test_slot_released_on_forced_shutdown),
        TPT_TEST(test_submit_wait_times_out),
        TPT_TEST(test_submit_wait_gets_space),
        TPT_TEST(test_submit_wait_gets_space_from_cancel),
        TPT_TEST(test_submit_wait_gets_user_slot),
        TPT_TEST(test_submit_wait_woken_by_close),
        TPT_TEST(test_submit_wait_budget_spent),
        TPT_TEST(test_full_refusal_tracks_users_at_limit),
        TPT_TEST(test_empty_stats_never_full),
        TPT_TEST(test_ids_unique_nonzero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
