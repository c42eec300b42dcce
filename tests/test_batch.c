/*
 * test_batch.c -- tp_submit_batch (taskpool.h section 6): prefix admission in
 * one lock pass, every refusal at the first position and in the middle of a
 * batch, what a refusal leaves behind (counters, ids, on_done, ownership),
 * FIFO adjacency against a concurrent single submitter, a close racing
 * batches, and no heap allocation per task in steady state.
 *
 * As in test_admission.c, "full" and "at the user's limit" are states the
 * test builds (workers blocked on a latch, stats.active checked) before it
 * submits. Pool threads record into atomics; only the main thread asserts.
 * Everything a pool thread touches lives in the test's fixture (tp_test.h).
 */
#define _GNU_SOURCE
#include "pool.h" /* the service thread's state, for one test */
#include "tpt_alloc.h"

#define SENTINEL 0xdeadbeefcafef00dull

/* ------------------------------------------------------------ helpers */

/* n tasks of tpt_nop_task whose on_done records into done[i]. */
static void fill_nop(tp_task *t, tp_task_opts *o, tpt_done *done, size_t n) {
    for (size_t i = 0; i < n; i++) {
        memset(&o[i], 0, sizeof o[i]);
        o[i].on_done = tpt_done_fn;
        t[i] = (tp_task){.fn = tpt_nop_task, .arg = &done[i], .opts = &o[i]};
    }
}

static void fill_ids(uint64_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) ids[i] = SENTINEL;
}

/* ids[0..k) non-zero, pairwise distinct and increasing (one batch is one
 * lock pass: its ids are handed out in order); ids[k..n) untouched. */
static void assert_ids(const uint64_t *ids, size_t k, size_t n) {
    for (size_t i = 0; i < k; i++) {
        assert_true(ids[i] != 0 && ids[i] != SENTINEL);
        if (i > 0) assert_true(ids[i] > ids[i - 1]);
    }
    for (size_t i = k; i < n; i++) assert_true(ids[i] == SENTINEL);
}

/* Exactly the first k on_done ran, once each, with status 0; the rest never.
 * (completed counts a task before its on_done runs: wait for each.) */
static void assert_done_prefix(tpt_done *done, size_t k, size_t n) {
    for (size_t i = 0; i < k; i++) {
        TPT_EVENTUALLY(atomic_load(&done[i].calls) >= 1);
        assert_int_equal(atomic_load(&done[i].calls), 1);
        assert_int_equal(atomic_load(&done[i].status), 0);
    }
    for (size_t i = k; i < n; i++) assert_int_equal(atomic_load(&done[i].calls), 0);
}

/* ------------------------------------------------------------ arguments */

static void test_bad_batch_arguments(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    tp_task t = {.fn = tpt_nop_task};
    uint64_t id = SENTINEL;
    size_t k = 77;

    assert_int_equal(tp_submit_batch(NULL, &t, 1, &id, &k), TP_EINVAL);
    assert_int_equal(k, 0);
    k = 77;
    assert_int_equal(tp_submit_batch(NULL, NULL, 0, NULL, &k), TP_EINVAL);
    assert_int_equal(k, 0);
    k = 77;
    assert_int_equal(tp_submit_batch(p, NULL, 3, &id, &k), TP_EINVAL);
    assert_int_equal(k, 0);
    assert_true(id == SENTINEL);
    assert_int_equal(tp_submit_batch(p, NULL, 3, NULL, NULL), TP_EINVAL);

    /* n == 0: TP_OK, nothing admitted, nothing counted (tasks may be NULL) */
    k = 77;
    assert_int_equal(tp_submit_batch(p, NULL, 0, NULL, &k), TP_OK);
    assert_int_equal(k, 0);
    k = 77;
    assert_int_equal(tp_submit_batch(p, &t, 0, &id, &k), TP_OK);
    assert_int_equal(k, 0);
    assert_true(id == SENTINEL);

    tp_stats s = tpt_finish(p);
    assert_int_equal(s.submitted, 0);
    assert_int_equal(s.accepted, 0);
}

/* A task with bad arguments is TP_EINVAL at its position: the prefix before
 * it is admitted, it and the tasks after it are not, and it counts nowhere --
 * also past the tasks whose checked arguments the batch keeps on the stack. */
static void test_einval_first_and_middle(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 48 };
    static const size_t where[] = {0, 3, 40};
    static char long_user[TP_USER_MAX + 2];
    memset(long_user, 'u', sizeof long_user - 1);
    tp_pool *p = tpt_quiet_pool(f, 2, 256, TP_UNLIMITED);
    uint64_t accepted = 0;
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        for (int kind = 0; kind < 5; kind++) {
            tp_task t[N];
            tp_task_opts o[N];
            tpt_done *done = tpt_fx_array(f, tpt_done, N);
            uint64_t ids[N];
            fill_nop(t, o, done, N);
            fill_ids(ids, N);
            size_t bad = where[w];
            if (kind == 0) t[bad].fn = NULL;
            if (kind == 1) o[bad].priority = TP_PRIO_MAX + 1;
            if (kind == 2) o[bad].user = long_user;
            if (kind == 3) t[bad].reserved[1] = 1;
            if (kind == 4) o[bad].reserved[0] = 1;
            tp_stats before = tpt_stats(p);
            size_t k = 77;
            assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_EINVAL);
            assert_int_equal(k, bad);
            assert_ids(ids, k, N);
            accepted += k;
            TPT_EVENTUALLY(tpt_stats(p).completed == accepted);
            tp_stats s = tpt_stats(p);
            assert_int_equal(s.submitted - before.submitted, bad);
            assert_int_equal(s.accepted - before.accepted, bad);
            assert_int_equal(s.rejected, 0);
            assert_done_prefix(done, k, N);
        }
    }
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.accepted, accepted);
    assert_int_equal(s.rejected, 0);
}

/* Tasks are judged in array order: an invalid task after one that is
 * refused for space is never reached. [valid, invalid] with no room is
 * TP_EFULL with k = 0 (one refusal counted); with room, TP_EINVAL with
 * k = 1 (nothing refused). Also past the tasks whose checked arguments the
 * batch keeps on the stack (32). */
static void test_refusal_before_invalid(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 40 };
    for (int full = 0; full < 2; full++) {
        for (size_t bad = 1; bad < N; bad += 37) {
            tpt_latch *l = tpt_fx_latch(f);
            tp_pool *p = tpt_quiet_pool(f, 1, 1, TP_UNLIMITED);
            tpt_fill_workers(p, l, 1, NULL);
            if (full) assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);
            tp_task t[N];
            tp_task_opts o[N];
            tpt_done *done = tpt_fx_array(f, tpt_done, N);
            uint64_t ids[N];
            fill_nop(t, o, done, N);
            fill_ids(ids, N);
            t[bad].fn = NULL;
            tp_stats before = tpt_stats(p);
            size_t k = 77;
            /* full: the first task is refused; else it takes the one place
             * and the second, if valid, would be refused for space */
            int want = full ? TP_EFULL : bad == 1 ? TP_EINVAL : TP_EFULL;
            assert_int_equal(tp_submit_batch(p, t, N, ids, &k), want);
            assert_int_equal(k, full ? 0 : 1);
            assert_ids(ids, k, N);
            tp_stats s = tpt_stats(p);
            assert_int_equal(s.accepted - before.accepted, k);
            assert_int_equal(s.rejected_full - before.rejected_full, want == TP_EFULL ? 1 : 0);
            assert_int_equal(s.submitted - before.submitted, k + (want == TP_EFULL ? 1 : 0));
            tpt_latch_open(l);
            tpt_finish(p);
            assert_done_prefix(done, k, N);
        }
    }
}

/* ------------------------------------------------------------ refusals */

/* TP_EFULL: with the workers blocked and `room` places left in the queue, a
 * batch of N admits exactly `room` and is refused at the next task: at
 * position 0 for room 0 (decided without the lock for a task without a user,
 * and with it for one whose user limit must be checked first) and in the
 * middle otherwise. One refusal is counted, not N - room. */
static void test_efull_first_and_middle(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 2, CAP = 8, N = 6 };
    for (unsigned room = 0; room <= 3; room++) { /* 8 latches, TPT_FX_LATCHES */
        for (int with_user = 0; with_user < 2; with_user++) {
            tpt_latch *l = tpt_fx_latch(f);
            tp_pool *p = tpt_quiet_pool(f, W, CAP, with_user ? 100 : TP_UNLIMITED);
            tpt_fill_workers(p, l, W, NULL);
            for (unsigned i = 0; i < CAP - room; i++)
                assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);

            tp_task t[N];
            tp_task_opts o[N];
            tpt_done *done = tpt_fx_array(f, tpt_done, N);
            uint64_t ids[N];
            fill_nop(t, o, done, N);
            for (int i = 0; i < N; i++) o[i].user = with_user ? "batcher" : NULL;
            fill_ids(ids, N);
            tp_stats before = tpt_stats(p);
            size_t k = 77;
            assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_EFULL);
            assert_int_equal(k, room);
            assert_ids(ids, k, N);
            tp_stats s = tpt_stats(p);
            assert_int_equal(s.submitted - before.submitted, room + 1);
            assert_int_equal(s.accepted - before.accepted, room);
            assert_int_equal(s.rejected_full - before.rejected_full, 1);
            assert_int_equal(s.rejected, before.rejected + 1);
            assert_int_equal(s.queued, CAP);
            assert_int_equal(tp_user_active(p, "batcher"), with_user ? room : 0);

            tpt_latch_open(l);
            s = tpt_finish(p);
            assert_int_equal(s.accepted, W + CAP);
            assert_int_equal(s.rejected_full, 1);
            assert_done_prefix(done, k, N);
        }
    }
}

/* TP_EUSERLIMIT: the user's slots count across the batch. At position 0 the
 * user is already at its limit; in the middle the batch itself reaches it.
 * Tasks of other users before the refused one are admitted. */
static void test_euserlimit_first_and_middle(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { LIMIT = 3, N = 6 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, LIMIT, 64, LIMIT);
    tpt_fill_workers(p, l, LIMIT, "full");

    /* at position 0 */
    tp_task t[N];
    tp_task_opts o[N];
    tpt_done *done = tpt_fx_array(f, tpt_done, N);
    uint64_t ids[N];
    fill_nop(t, o, done, N);
    for (int i = 0; i < N; i++) o[i].user = "full";
    fill_ids(ids, N);
    size_t k = 77;
    assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_EUSERLIMIT);
    assert_int_equal(k, 0);
    assert_ids(ids, 0, N);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.rejected_user, 1);
    assert_int_equal(s.submitted, LIMIT + 1);

    /* in the middle: "a" x2, "b", "a", "a" (its 4th: refused), "c" */
    static const char *const who[N] = {"a", "a", "b", "a", "a", "c"};
    tpt_done *done2 = tpt_fx_array(f, tpt_done, N);
    fill_nop(t, o, done2, N);
    for (int i = 0; i < N; i++) {
        o[i].user = who[i];
        t[i].fn = tpt_block_task;
        t[i].arg = l;
        o[i].on_done = NULL;
    }
    fill_ids(ids, N);
    k = 77;
    assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_EUSERLIMIT);
    assert_int_equal(k, 4);
    assert_ids(ids, 4, N);
    assert_int_equal(tp_user_active(p, "a"), LIMIT);
    assert_int_equal(tp_user_active(p, "b"), 1);
    assert_int_equal(tp_user_active(p, "c"), 0);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(rejected_user, 2), TPT_EQ(submitted, LIMIT + 1 + 5),
                      TPT_EQ(accepted, LIMIT + 4), TPT_EQ(queued, 4));

    tpt_latch_open(l);
    s = tpt_finish(p);
    assert_int_equal(s.accepted, LIMIT + 4);
    assert_int_equal(s.rejected, 2);
    assert_done_prefix(done, 0, N);
}

/* TP_ECLOSED at position 0: a closed pool refuses the first task and counts
 * one refusal. (A close cannot fall in the middle of a batch: it takes the
 * same lock; test_close_never_splits_a_batch checks that under a race.) */
static void test_eclosed_first(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 5 };
    tp_pool *p = tpt_quiet_pool(f, 1, 16, TP_UNLIMITED);
    assert_int_equal(tp_close(p), TP_OK);
    tp_task t[N];
    tp_task_opts o[N];
    tpt_done *done = tpt_fx_array(f, tpt_done, N);
    uint64_t ids[N];
    fill_nop(t, o, done, N);
    fill_ids(ids, N);
    size_t k = 77;
    assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_ECLOSED);
    assert_int_equal(k, 0);
    assert_ids(ids, 0, N);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(submitted, 1), TPT_EQ(rejected_closed, 1), TPT_EQ(accepted, 0));
    assert_done_prefix(done, 0, N);
}

/* A full pool that is then closed: the refusal is TP_ECLOSED (closed is
 * checked before space, also by the lock-free refusal of a full queue). */
static void test_closed_and_full_is_eclosed(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { W = 1, CAP = 2 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, W, CAP, TP_UNLIMITED);
    tpt_fill_workers(p, l, W, NULL);
    for (int i = 0; i < CAP; i++) assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK);
    tp_task t = {.fn = tpt_nop_task};
    size_t k = 77;
    assert_int_equal(tp_submit_batch(p, &t, 1, NULL, &k), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_submit_batch(p, &t, 1, NULL, &k), TP_ECLOSED);
    assert_int_equal(k, 0);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 2), TPT_EQ(rejected_closed, 2),
                      TPT_EQ(submitted, W + CAP + 4));
}

/* ------------------------------------------------------------ order */

enum { ORDER_MAX = 1 << 14 };
typedef struct order_log {
    atomic_uint n;
    uint32_t tag[ORDER_MAX]; /* written by the one worker, read after the drain */
} order_log;
static order_log g_order;

/* arg encodes the tag: bit 31 single submitter, else batch << 8 | index */
static int log_task(tp_ctx *c, void *arg) {
    (void)c;
    unsigned i = atomic_fetch_add_explicit(&g_order.n, 1, memory_order_relaxed);
    if (i < ORDER_MAX) g_order.tag[i] = (uint32_t)(uintptr_t)arg;
    return 0;
}

typedef struct single_arg {
    tp_pool *p;
    atomic_int go, stop;
    unsigned sent;
    int bad;
} single_arg;

static void *single_submitter(void *a) {
    single_arg *x = a;
    tpt_wait_go(&x->go);
    while (!atomic_load(&x->stop) && x->sent < 3000) {
        int rc = tp_submit(x->p, log_task, (void *)(uintptr_t)(0x80000000u | x->sent), NULL, NULL);
        if (rc == TP_OK) {
            x->sent++;
        } else if (rc != TP_EFULL) {
            x->bad++; /* also the pool closed by a failed test's teardown: stop */
            break;
        } else {
            sched_yield();
        }
    }
    return NULL;
}

/* One worker runs tasks in queue order, so the start log is the queue order.
 * Batches of 8 race a thread submitting single tasks into a small queue: a
 * batch cut short by TP_EFULL hands in its rest as a new call. Each call's
 * accepted tasks start next to each other, in array order: a single task may
 * start inside a batch only where one of its calls began. Both streams keep
 * their own order. */
enum { CUT_B = 8, CUT_BATCHES = 400 };
static unsigned char g_call_start[CUT_BATCHES][CUT_B];

static void test_fifo_adjacent_against_single_submitter(void **state) {
    tpt_fixture *f = tpt_fx(state);
    atomic_store(&g_order.n, 0);
    memset(g_call_start, 0, sizeof g_call_start);
    tp_pool *p = tpt_quiet_pool(f, 1, 64, TP_UNLIMITED);
    single_arg *x = tpt_fx_new(f, single_arg);
    x->p = p;
    tpt_fx_thr *th = tpt_fx_thread(f, single_submitter, x);
    atomic_store(&x->go, 1);
    for (unsigned b = 0; b < CUT_BATCHES; b++) {
        tp_task t[CUT_B];
        for (unsigned i = 0; i < CUT_B; i++)
            t[i] = (tp_task){.fn = log_task, .arg = (void *)(uintptr_t)(b << 8 | i)};
        size_t off = 0;
        uint64_t until = tp_now_ns() + TPT_WAIT_NS;
        while (off < CUT_B) {
            if (tp_now_ns() > until) fail_msg("batch %u: no room for %u ns", b, (unsigned)TPT_WAIT_NS);
            size_t k = 77;
            int rc = tp_submit_batch(p, t + off, CUT_B - off, NULL, &k);
            assert_true(rc == TP_OK || rc == TP_EFULL);
            assert_true(rc == TP_OK ? k == CUT_B - off : k < CUT_B - off);
            if (k > 0) g_call_start[b][off] = 1;
            if (rc == TP_EFULL) sched_yield();
            off += k;
        }
    }
    atomic_store(&x->stop, 1);
    tpt_fx_join(th);
    assert_int_equal(x->bad, 0);
    unsigned total = CUT_BATCHES * CUT_B + x->sent;
    tp_stats s = tpt_finish(p); /* every task has run: the log is complete */
    assert_int_equal(s.accepted, total);
    assert_int_equal(atomic_load(&g_order.n), total);

    unsigned next_single = 0, next_batch = 0, next_index = 0;
    for (unsigned i = 0; i < total; i++) {
        uint32_t tag = g_order.tag[i];
        if (tag & 0x80000000u) {
            assert_int_equal(tag & 0x7fffffffu, next_single);
            next_single++;
            if (next_index != 0 && !g_call_start[next_batch][next_index])
                fail_msg("single task %u started inside batch %u at %u, where no call began",
                         tag & 0x7fffffffu, next_batch, next_index);
        } else {
            assert_int_equal(tag >> 8, next_batch);
            assert_int_equal(tag & 0xffu, next_index);
            if (++next_index == CUT_B) {
                next_index = 0;
                next_batch++;
            }
        }
    }
    assert_int_equal(next_batch, CUT_BATCHES);
    assert_int_equal(next_single, x->sent);
}

/* The same with no refusals possible (the worker held until every task is
 * in): then every batch is one call, and no single task may sit inside one. */
static void test_fifo_adjacent_uncut(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { B = 16, BATCHES = 100 };
    atomic_store(&g_order.n, 0);
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 8192, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    single_arg *x = tpt_fx_new(f, single_arg);
    x->p = p;
    tpt_fx_thr *th = tpt_fx_thread(f, single_submitter, x);
    atomic_store(&x->go, 1);
    for (unsigned b = 0; b < BATCHES; b++) {
        tp_task t[B];
        for (unsigned i = 0; i < B; i++)
            t[i] = (tp_task){.fn = log_task, .arg = (void *)(uintptr_t)(b << 8 | i)};
        size_t k = 0;
        assert_int_equal(tp_submit_batch(p, t, B, NULL, &k), TP_OK);
        assert_int_equal(k, B);
        if (b % 8 == 0) sched_yield(); /* let the single submitter in between batches */
    }
    atomic_store(&x->stop, 1);
    tpt_fx_join(th);
    assert_int_equal(x->bad, 0);
    tpt_latch_open(l);
    unsigned total = BATCHES * B + x->sent;
    tp_stats s = tpt_finish(p); /* every task has run: the log is complete */
    assert_int_equal(s.accepted, total + 1);
    assert_int_equal(atomic_load(&g_order.n), total);
    unsigned next_single = 0, next_batch = 0, next_index = 0;
    for (unsigned i = 0; i < total; i++) {
        uint32_t tag = g_order.tag[i];
        if (tag & 0x80000000u) {
            assert_int_equal(next_index, 0); /* never inside a batch */
            assert_int_equal(tag & 0x7fffffffu, next_single);
            next_single++;
        } else {
            assert_int_equal(tag >> 8, next_batch);
            assert_int_equal(tag & 0xffu, next_index);
            if (++next_index == B) {
                next_index = 0;
                next_batch++;
            }
        }
    }
    assert_int_equal(next_batch, BATCHES);
    assert_int_equal(next_single, x->sent);
}

/* ------------------------------------------------------------ close race */

typedef struct closer_arg {
    tp_pool *p;
    atomic_int go;
} closer_arg;

static void *closer(void *a) {
    closer_arg *x = a;
    tpt_wait_go(&x->go);
    for (int i = 0; i < 200; i++) sched_yield();
    (void)tp_close(x->p);
    return NULL;
}

/* A close racing a stream of batches: each batch is admitted whole (TP_OK)
 * or not at all (TP_ECLOSED, k == 0) -- never cut by the close -- and the
 * counters add up at rest. */
static void test_close_never_splits_a_batch(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { B = 12 };
    int raced = 0;                             /* rounds where batches went in before the close */
    for (int round = 0; round < 12; round++) { /* one thread each: TPT_FX_THREADS */
        tp_pool *p = tpt_quiet_pool(f, 2, 1 << 16, TP_UNLIMITED);
        closer_arg *x = tpt_fx_new(f, closer_arg);
        x->p = p;
        tpt_fx_thr *th = tpt_fx_thread(f, closer, x);
        tp_task t[B];
        for (int i = 0; i < B; i++) t[i] = (tp_task){.fn = tpt_nop_task};
        atomic_store(&x->go, 1);
        uint64_t accepted = 0, full = 0;
        uint64_t until = tp_now_ns() + TPT_WAIT_NS;
        for (;;) {
            if (tp_now_ns() > until) fail_msg("round %d: the pool never closed", round);
            size_t k = 77;
            int rc = tp_submit_batch(p, t, B, NULL, &k);
            accepted += k;
            if (rc == TP_ECLOSED) {
                assert_int_equal(k, 0);
                break;
            }
            if (rc == TP_EFULL) { /* the queue filled before the close came: a cut, but not by the close */
                full++;
                sched_yield();
                continue;
            }
            assert_int_equal(rc, TP_OK);
            assert_int_equal(k, B);
        }
        tpt_fx_join(th);
        tp_stats s = tpt_finish(p);
        tpt_assert_counts(s, TPT_EQ(accepted, accepted), TPT_EQ(rejected_closed, 1),
                          TPT_EQ(rejected_full, full), TPT_EQ(submitted, accepted + 1 + full));
        raced += accepted > 0;
    }
    assert_true(raced > 0); /* else no batch ever met the close */
}

/* ------------------------------------------------------------ ids, options */

static atomic_ullong g_seen_id[64];

static int id_task(tp_ctx *c, void *arg) {
    atomic_store(&g_seen_id[(uintptr_t)arg], tp_ctx_id(c));
    return 0;
}

static const char *g_seen_user[64];
static const char *g_seen_log[64];
static atomic_int g_seen_ok[64];

/* Copies of user and log id: the task sees the values, not the caller's
 * buffers, which the caller overwrote right after the call. */
static int opts_task(tp_ctx *c, void *arg) {
    uintptr_t i = (uintptr_t)arg;
    int ok = tp_ctx_user(c) && strcmp(tp_ctx_user(c), g_seen_user[i]) == 0 &&
             strcmp(tp_ctx_log_id(c), g_seen_log[i]) == 0;
    atomic_store(&g_seen_ok[i], ok ? 1 : -1);
    return 0;
}

/* ids_out[i] is tasks[i]'s id (tp_ctx_id agrees), ids of later batches are
 * larger; NULL ids_out and accepted_out work; options are copied. */
static void test_ids_and_options(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 40 }; /* more than the stack-checked prefix */
    tp_pool *p = tpt_quiet_pool(f, 2, 256, TP_UNLIMITED);
    tp_task t[N];
    uint64_t ids[N];
    for (uintptr_t i = 0; i < N; i++) {
        atomic_store(&g_seen_id[i], 0);
        t[i] = (tp_task){.fn = id_task, .arg = (void *)i};
    }
    fill_ids(ids, N);
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_OK);
    assert_int_equal(k, N);
    assert_ids(ids, N, N);
    TPT_EVENTUALLY(tpt_stats(p).completed == N);
    for (int i = 0; i < N; i++) assert_int_equal(atomic_load(&g_seen_id[i]), ids[i]);
    uint64_t last = ids[N - 1];
    assert_int_equal(tp_submit_batch(p, t, 3, NULL, NULL), TP_OK);
    uint64_t one = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, &one), TP_OK);
    assert_true(one > last);

    /* options: users, log ids (explicit, inherited), copied */
    static char ubuf[N][16], lbuf[N][16];
    static char expect_u[N][16], expect_l[N][16];
    tp_task_opts o[N];
    tp_log_id_set("inherited");
    for (uintptr_t i = 0; i < N; i++) {
        snprintf(ubuf[i], sizeof ubuf[i], "u%02u", (unsigned)(i % 5));
        snprintf(lbuf[i], sizeof lbuf[i], "log-%02u", (unsigned)i);
        memcpy(expect_u[i], ubuf[i], sizeof ubuf[i]);
        snprintf(expect_l[i], sizeof expect_l[i], "%s", i % 2 ? lbuf[i] : "inherited");
        g_seen_user[i] = expect_u[i];
        g_seen_log[i] = expect_l[i];
        atomic_store(&g_seen_ok[i], 0);
        memset(&o[i], 0, sizeof o[i]);
        o[i].user = ubuf[i];
        o[i].log_id = i % 2 ? lbuf[i] : NULL;
        t[i] = (tp_task){.fn = opts_task, .arg = (void *)i, .opts = &o[i]};
    }
    tpt_latch *l = tpt_fx_latch(f);
    tpt_fill_workers(p, l, 2, NULL); /* the batch waits in the queue */
    assert_int_equal(tp_submit_batch(p, t, N, NULL, &k), TP_OK);
    assert_int_equal(k, N);
    tp_log_id_set(NULL);
    memset(ubuf, 'x', sizeof ubuf); /* the caller reuses its buffers */
    memset(lbuf, 'y', sizeof lbuf);
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == N + 3 + 1 + 2 + N);
    for (int i = 0; i < N; i++) assert_int_equal(atomic_load(&g_seen_ok[i]), 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.accepted, 2 * N + 3 + 1 + 2);
}

/* Queued batch tasks are ordinary queued tasks: cancel one in the middle and
 * the others still run, in order; a forced shutdown ends the rest unrun;
 * every on_done once. */
static void test_batch_tasks_cancel_and_force(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { N = 10 };
    tpt_latch *l = tpt_fx_latch(f);
    tp_pool *p = tpt_quiet_pool(f, 1, 32, TP_UNLIMITED);
    tpt_fill_workers(p, l, 1, NULL);
    tp_task t[N];
    tp_task_opts o[N];
    tpt_done *done = tpt_fx_array(f, tpt_done, N);
    uint64_t ids[N];
    fill_nop(t, o, done, N);
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, N, ids, &k), TP_OK);
    assert_int_equal(tp_cancel(p, ids[4]), TP_OK);
    assert_int_equal(tp_cancel(p, ids[4]), TP_ENOTFOUND);
    TPT_EVENTUALLY(atomic_load(&done[4].calls) == 1);
    assert_int_equal(atomic_load(&done[4].status), TP_ECANCELED);
    assert_int_equal(tpt_stats(p).queued, N - 1);
    /* force: the blocked worker holds everything; 1 ms budget */
    assert_int_equal(tp_shutdown(p, TPT_MS(1)), TP_ETIMEDOUT);
    tpt_latch_open(l);
    tp_stats s = tpt_finish_forced(p);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&done[i].calls), 1);
        assert_int_equal(atomic_load(&done[i].status), TP_ECANCELED);
    }
    assert_int_equal(s.cancelled, N);
}

/* ------------------------------------------------------------ allocations */

static atomic_long g_ran;
static int count_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add_explicit(&g_ran, 1, memory_order_relaxed);
    return 0;
}
static void count_done(void *arg, int status) {
    (void)arg;
    (void)status;
}

/* Batches of every kind of task (plain, user, on_done, log ids, deadline):
 * after a warm-up, 10000 tasks through tp_submit_batch allocate nothing. */
static long run_batches(tp_pool *p, int n, long base) {
    static const char *const users[] = {"alice", "bob", "carol"};
    enum { B = 50 };
    long bad = 0;
    for (int done = 0; done < n;) {
        tp_task t[B];
        tp_task_opts o[B];
        for (int i = 0; i < B; i++) {
            memset(&o[i], 0, sizeof o[i]);
            switch ((done + i) % 5) {
            case 1: o[i].user = users[i % 3]; break;
            case 2: o[i].on_done = count_done; break;
            case 3: o[i].log_id = "req"; break;
            case 4: o[i].deadline_ns = tp_now_ns() + TPT_S(60); break;
            default: break;
            }
            t[i] = (tp_task){.fn = count_task, .opts = &o[i]};
        }
        size_t off = 0;
        uint64_t until = tp_now_ns() + TPT_WAIT_NS;
        while (off < B) {
            size_t k = 0;
            int rc = tp_submit_batch(p, t + off, B - off, NULL, &k);
            off += k;
            if (rc == TP_EFULL) {
                if (tp_now_ns() > until) return bad + 1;
                sched_yield();
            } else if (rc != TP_OK) {
                return bad + 1;
            }
        }
        done += B;
    }
    if (!TPT_POLL(tpt_stats(p).completed >= (uint64_t)(base + n), TPT_WAIT_NS)) bad++;
    return bad;
}

/* A batch into an elastic pool grows it as far as its tasks want workers,
 * as the same tasks submitted one by one would. (Found in review: a batch
 * spawned one worker itself and left the rest to a service thread that
 * nothing woke: with it asleep first, the pool stayed at two workers.) Each task blocks on the
 * latch, so all four can only run at once on four workers. */
static bool service_waiting(tp_pool *p) {
    tp__lock(p);
    bool w = p->waiting.svc;
    tp__unlock(p);
    return w;
}

static void test_batch_grows_elastic_pool(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 4;
    cfg.queue_capacity = 16;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    TPT_EVENTUALLY(service_waiting(p)); /* asleep: only a wake-up brings it to the backlog */
    tp_task t[4];
    for (int i = 0; i < 4; i++) t[i] = (tp_task){.fn = tpt_block_task, .arg = l};
    size_t k = 0;
    assert_int_equal(tp_submit_batch(p, t, 4, NULL, &k), TP_OK);
    assert_int_equal(k, 4);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 4 && tpt_stats(p).workers == 4);
    tpt_latch_open(l);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 4);
}

static void test_batch_zero_allocations(void **state) {
    tpt_fixture *f = tpt_fx(state);
    if (!tpt_alloc_counting_or_skip()) return;
    tp_pool *p = tpt_quiet_pool(f, 2, 256, TP_UNLIMITED);
    long completed = 0;
    for (int round = 0; round < 4; round++) {
        assert_int_equal(run_batches(p, 2000, completed), 0);
        completed += 2000;
    }
    tpt_alloc_arm();
    long bad = run_batches(p, 10000, completed);
    tpt_alloc_disarm();
    completed += 10000;
    assert_int_equal(bad, 0);
    tpt_alloc_assert_none("10000 batched tasks");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.completed, (uint64_t)completed);
    assert_int_equal(atomic_load(&g_ran), completed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_bad_batch_arguments),
        TPT_TEST(test_einval_first_and_middle),
        TPT_TEST(test_refusal_before_invalid),
        TPT_TEST(test_efull_first_and_middle),
        TPT_TEST(test_euserlimit_first_and_middle),
        TPT_TEST(test_eclosed_first),
        TPT_TEST(test_closed_and_full_is_eclosed),
        TPT_TEST(test_fifo_adjacent_against_single_submitter),
        TPT_TEST(test_fifo_adjacent_uncut),
        TPT_TEST(test_close_never_splits_a_batch),
        TPT_TEST(test_ids_and_options),
        TPT_TEST(test_batch_tasks_cancel_and_force),
        TPT_TEST(test_batch_grows_elastic_pool),
        TPT_TEST(test_batch_zero_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
