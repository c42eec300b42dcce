/*
 * test_alloc.c -- no heap allocation per task in steady state (taskpool.h, "What the pool promises",
 * header "What the pool promises").
 *
 * Allocations are counted by the interposer of tpt_alloc_count.h (malloc,
 * calloc, realloc, free and the aligned variants, forwarding to glibc's
 * __libc_* entry points), through tpt_alloc.h. The pool is warmed up first
 * (users, on_done, explicit / inherited / generated log ids, a retry, the
 * cancel fd); then, armed, 10000 tasks of every kind go through submit -> run
 * -> on_done, and the count must be 0. So must group members (submit into a
 * group, wait, cancel on error, tp_group_cancel), and the first fill of a
 * queue of 20000 tasks.
 *
 * The counting must not silently stop working: the checks are skipped only
 * where something else is known to own malloc -- a sanitizer (ASan/TSan/MSan:
 * the interposer is not compiled), valgrind (its vgpreload library shows in
 * /proc/self/maps; it replaces malloc even in the executable), or a C library
 * without glibc's __libc_* entry points. Anywhere else an interposer that
 * does not count is a failure, and test_alloc_interposer_counts proves that
 * each allocation function, and the library's own calls, move the counter.
 */
#define _GNU_SOURCE
#include "tpt_alloc.h"

/* ------------------------------------------------------------ workload */

static atomic_long ran;
static atomic_long done_calls;
static atomic_long done_bad;

static int count_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add_explicit(&ran, 1, memory_order_relaxed);
    return 0;
}

static void count_done(void *arg, int status) {
    (void)arg;
    if (status != 0) atomic_fetch_add_explicit(&done_bad, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&done_calls, 1, memory_order_relaxed);
}

/* Touches the cancel fd and the context getters. */
static int ctx_task(tp_ctx *c, void *arg) {
    (void)arg;
    (void)tp_ctx_fd(c);
    (void)tp_ctx_err(c);
    (void)tp_ctx_deadline(c);
    (void)tp_ctx_user(c);
    (void)tp_ctx_log_id(c);
    (void)tp_log_id_get();
    atomic_fetch_add_explicit(&ran, 1, memory_order_relaxed);
    return 0;
}

static const char *const users[] = {"alice", "bob", "carol", "dave"};
static const char *const log_ids[] = {"req-1", "req-2", "req-3"};

/* Submits n tasks of every kind, round robin, and waits (bounded) for all of
 * them to complete; returns how many were not admitted or did not complete
 * (must be 0). Tasks without opts.log_id get the calling thread's log id if
 * one is set (inherited), else a generated one. */
static long run_mix(tp_pool *p, int n, long base_completed) {
    long failures = 0;
    for (int i = 0; i < n; i++) {
        tp_task_opts o = {0};
        tp_fn fn = count_task;
        switch (i % 6) {
        case 0: /* plain */ break;
        case 1: o.user = users[i % 4]; break;
        case 2: o.on_done = count_done; break;
        case 3: o.log_id = log_ids[i % 3]; break;
        case 4:
            o.user = users[(i / 6) % 4];
            o.log_id = log_ids[(i / 6) % 3];
            break;
        case 5:
            o.user = users[(i / 6) % 4];
            o.on_done = count_done;
            o.deadline_ns = tp_now_ns() + TPT_S(60);
            o.run_timeout_ns = TPT_S(30);
            fn = ctx_task;
            break;
        }
        if (tp_submit_wait(p, fn, NULL, &o, TPT_WAIT_NS, NULL) != TP_OK) failures++;
    }
    uint64_t want = (uint64_t)(base_completed + n);
    if (!TPT_POLL(tpt_stats(p).completed >= want, TPT_WAIT_NS)) failures++;
    return failures;
}

static void test_alloc_zero_per_task(void **state) {
    tpt_fixture *f = tpt_fx(state);
    if (!tpt_alloc_counting_or_skip()) return;
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 256;
    cfg.max_per_user = TP_UNLIMITED;
    cfg.max_retries = 1;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    TPT_EVENTUALLY(tpt_stats(p).idle == 2);

    /* Warm up: every path once and many times, including a retry per round
     * and the ctx/fd path on each worker. */
    long completed = 0;
    for (int round = 0; round < 4; round++) {
        tp_log_id_set(round % 2 ? "inherited-id" : NULL);
        assert_int_equal(run_mix(p, 2000, completed), 0);
        completed += 2000;
        tp_task_opts o = {0};
        o.on_done = count_done;
        o.user = users[0];
        for (int k = 0; k < 4; k++)
            assert_int_equal(tp_submit_wait(p, tpt_fail_once_task, NULL, &o, TPT_WAIT_NS, NULL), TP_OK);
        completed += 4;
        TPT_EVENTUALLY(tpt_stats(p).completed >= (uint64_t)completed);
    }
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.retried, 16);

    /* Measure: 5000 tasks with generated log ids, then (the thread's log id
     * set outside the measured region) 5000 that inherit it. */
    tp_log_id_set(NULL);
    tpt_alloc_arm();
    long failures = run_mix(p, 5000, completed);
    tpt_alloc_disarm();
    completed += 5000;
    assert_int_equal(failures, 0);
    tpt_alloc_assert_none("5000 steady-state tasks with generated log ids");
    tp_log_id_set("inherited-id");
    tpt_alloc_arm();
    failures = run_mix(p, 5000, completed);
    tpt_alloc_disarm();
    completed += 5000;
    tp_log_id_set(NULL);
    assert_int_equal(failures, 0);
    tpt_alloc_assert_none("5000 steady-state tasks with an inherited log id");

    s = tpt_finish(p);
    assert_int_equal(s.completed, (uint64_t)completed);
    assert_int_equal(s.failed, 0);
    assert_int_equal(atomic_load(&done_bad), 0);
}

/* Every allocation function, called through its symbol, is counted once per
 * call, only while armed; free is not; and the library's own calls (tp_create) are seen too, so a
 * steady-state count of 0 means something. */
static void test_alloc_interposer_counts(void **state) {
    (void)state;
    if (!tpt_alloc_counting_or_skip()) return;
    void *volatile a = NULL, *volatile b = NULL, *volatile c = NULL, *volatile d = NULL;
    void *volatile e = NULL, *volatile g = NULL, *pm = NULL;

    tpt_alloc_arm();
    a = tpt_sym_malloc(24);
    long after_malloc = tpt_alloc_count();
    b = tpt_sym_calloc(3, 16);
    long after_calloc = tpt_alloc_count();
    a = tpt_sym_realloc(a, 4096);
    long after_realloc = tpt_alloc_count();
    c = tpt_sym_aligned_alloc(64, 128);
    long after_aligned = tpt_alloc_count();
    int pm_rc = tpt_sym_posix_memalign(&pm, 64, 100);
    d = pm;
    long after_posix = tpt_alloc_count();
    e = tpt_sym_memalign(32, 48);
    long after_memalign = tpt_alloc_count();
    tpt_sym_free(b);
    b = NULL;
    long after_free = tpt_alloc_count();
    tpt_alloc_disarm();
    g = tpt_sym_malloc(8); /* disarmed: not counted */
    long disarmed = tpt_alloc_count();
    tpt_sym_free(a);
    tpt_sym_free(c);
    tpt_sym_free(d);
    tpt_sym_free(e);
    tpt_sym_free(g);

    assert_int_equal(pm_rc, 0);
    assert_int_equal(after_malloc, 1);
    assert_int_equal(after_calloc, 2);
    assert_int_equal(after_realloc, 3);
    assert_int_equal(after_aligned, 4);
    assert_int_equal(after_posix, 5);
    assert_int_equal(after_memalign, 6);
    assert_int_equal(after_free, 6);
    assert_int_equal(disarmed, 6);
    /* the first armed allocation is the one recorded */
    tpt_alloc_first first = tpt_alloc_first_get();
    assert_int_equal(first.kind, TPT_ALLOC_MALLOC);
    assert_int_equal(first.size, 24);

    /* The static library calls the same malloc: creating a pool allocates. */
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.log = tpt_quiet_log;
    tp_pool *p = NULL;
    tpt_alloc_arm();
    int rc = tp_create(&p, &cfg);
    long by_create = tpt_alloc_disarm();
    assert_int_equal(rc, TP_OK);
    tpt_fx_adopt(tpt_fx(state), p);
    if (by_create < 1)
        fail_msg("tp_create allocated nothing the interposer saw: the library's "
                 "allocations are not counted");
    tpt_finish(p);
}

/* Steady state with tasks that end without running: cancelled while queued
 * and expired. Those carry no on_done here, so the pool retires their records
 * at once (with an on_done, a record waits for the service thread, and a
 * cancel storm that outruns it grows the records -- not steady state); the
 * tasks that run do carry one. */
static long churn(tp_pool *p, int n) {
    long bad = 0;
    for (int i = 0; i < n; i++) {
        tp_task_opts o = {0};
        int ends_unrun = i % 7 == 0 || i % 11 == 0;
        if (!ends_unrun) o.on_done = count_done;
        if (i % 11 == 0) o.deadline_ns = 1; /* long gone: expires unrun */
        uint64_t id = 0;
        if (tp_submit_wait(p, count_task, NULL, &o, TPT_WAIT_NS, &id) != TP_OK) bad++;
        if (i % 7 == 0) {
            int rc = tp_cancel(p, id);
            if (rc != TP_OK && rc != TP_ENOTFOUND) bad++;
        }
    }
    return bad;
}

static void test_alloc_zero_with_cancels(void **state) {
    tpt_fixture *f = tpt_fx(state);
    if (!tpt_alloc_counting_or_skip()) return;
    tp_pool *p = tpt_quiet_pool(f, 2, 64, 0);
    assert_int_equal(churn(p, 4000), 0);
    TPT_EVENTUALLY(tpt_stats(p).completed == 4000);

    tpt_alloc_arm();
    long bad = churn(p, 20000);
    tpt_alloc_disarm();
    assert_int_equal(bad, 0);
    tpt_alloc_assert_none("20000 tasks with cancels and expiries");
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.completed, 24000);
    assert_true(s.cancelled > 0 && s.expired > 0);
}

/* A queue of more than 16384 tasks (the cap on the four pools' worth of
 * records made at create): its first fill allocates nothing either
 * (taskpool.h, tp_submit, "Memory": tp_create makes at least a full pool's
 * records). The one worker is held on a latch, so every admitted task waits
 * in the queue at once. */
static void test_alloc_none_filling_a_large_queue(void **state) {
    enum { CAP = 20000 };
    tpt_fixture *f = tpt_fx(state);
    if (!tpt_alloc_counting_or_skip()) return;
    tp_pool *p = tpt_quiet_pool(f, 1, CAP, TP_UNLIMITED);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).active == 1);

    tpt_alloc_arm();
    long refused = 0;
    for (int i = 0; i < CAP; i++)
        if (tp_submit(p, count_task, NULL, NULL, NULL) != TP_OK) refused++;
    int over = tp_submit(p, count_task, NULL, NULL, NULL); /* one more: the queue is full */
    tpt_alloc_disarm();
    assert_int_equal(refused, 0);
    assert_int_equal(over, TP_EFULL);
    assert_int_equal(tpt_stats(p).queued, CAP);
    tpt_alloc_assert_none("a first fill of a 20000-task queue");

    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.completed, CAP + 1);
    assert_int_equal(s.rejected_full, 1);
}

/* Group members in steady state: submitting into a group, waiting for it,
 * cancel on error cancelling queued members, tp_group_cancel -- nothing is
 * allocated per member (the group itself is made once, before). */
static int group_task(tp_ctx *c, void *arg) {
    (void)c;
    atomic_fetch_add_explicit(&ran, 1, memory_order_relaxed);
    return (int)(intptr_t)arg;
}

static long group_rounds(tp_group *g, tp_group *coe, int rounds) {
    long bad = 0;
    for (int r = 0; r < rounds; r++) {
        tp_task_opts o = {0};
        o.on_done = count_done;
        o.user = users[r % 4];
        for (int i = 0; i < 8; i++)
            if (tp_group_submit(g, group_task, NULL, &o, NULL) != TP_OK) bad++;
        if (tp_group_wait(g, TPT_WAIT_NS) != TP_OK) bad++;
    }
    /* cancel on error: the first member fails, the queued ones are cancelled */
    for (int i = 0; i < 16; i++) {
        int rc = tp_group_submit(coe, group_task, (void *)(intptr_t)(i == 0 ? 5 : 0), NULL, NULL);
        if (rc != TP_OK && rc != TP_ECANCELED) bad++;
    }
    if (tp_group_wait(coe, TPT_WAIT_NS) != 5) bad++;
    return bad;
}

static void test_alloc_zero_per_group_member(void **state) {
    tpt_fixture *f = tpt_fx(state);
    if (!tpt_alloc_counting_or_skip()) return;
    tp_pool *p = tpt_quiet_pool(f, 2, 64, TP_UNLIMITED);
    tp_group *g, *coe[2];
    assert_int_equal(tp_group_create(p, 0, &g), TP_OK);
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &coe[0]), TP_OK);
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &coe[1]), TP_OK);
    assert_int_equal(group_rounds(g, coe[0], 500), 0); /* warm up */

    tpt_alloc_arm();
    long bad = group_rounds(g, coe[1], 2000);
    assert_int_equal(tp_group_cancel(g), TP_OK);
    tpt_alloc_disarm();
    assert_int_equal(bad, 0);
    tpt_alloc_assert_none("16000 group members");
    assert_int_equal(tp_group_destroy(g), TP_OK);
    assert_int_equal(tp_group_destroy(coe[0]), TP_OK);
    assert_int_equal(tp_group_destroy(coe[1]), TP_OK);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_alloc_interposer_counts),          TPT_TEST(test_alloc_zero_per_task),
        TPT_TEST(test_alloc_zero_with_cancels),          TPT_TEST(test_alloc_zero_per_group_member),
        TPT_TEST(test_alloc_none_filling_a_large_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
