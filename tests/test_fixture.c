/*
 * test_fixture.c -- the test harness itself: what tpt_fixture_teardown does
 * with what a failed test leaves behind (tests/tp_test.h, "fixtures").
 *
 * Each test runs a second, inner fixture by hand (setup, pools left in the
 * state a failed assert would leave them, teardown) and checks the outcome:
 * latched tasks released and ended exactly once, the pools' threads gone, a
 * task that ignores cancellation reported (-1) within the bound instead of a
 * hang, a leftover default pool ended and reported, a thread of the test
 * blocked in tp_submit_wait woken and joined before its pool is destroyed. Records the inner
 * teardown must not free live in the outer fixture.
 */
#include "tp_test.h"

#include <dirent.h>

/* A hand-made inner fixture; the outer one is current again after it. */
typedef struct inner {
    void *state;
    tpt_fixture *outer;
} inner;

static tpt_fixture *inner_setup(inner *in, void **outer_state) {
    in->outer = tpt_fx(outer_state);
    in->state = NULL;
    assert_int_equal(tpt_fixture_setup(&in->state), 0);
    assert_non_null(in->state);
    assert_ptr_equal(*tpt_fx_current_slot(), in->state);
    return (tpt_fixture *)in->state;
}

static int inner_teardown(inner *in) {
    int rc = tpt_fixture_teardown(&in->state);
    *tpt_fx_current_slot() = in->outer;
    return rc;
}

/* Threads of this process whose name starts with the inner pools' name
 * (other threads, a sanitizer's for one, may come and go). */
#define FX_NAME "fxt"
static int pool_threads(void) {
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *fp = fopen(path, "r");
        if (fp == NULL) continue; /* exited meanwhile */
        if (fgets(comm, sizeof comm, fp) != NULL && strncmp(comm, FX_NAME, 3) == 0) n++;
        fclose(fp);
    }
    closedir(d);
    return n;
}

/* A task blocked on a latch with its own on_done record. */
typedef struct job {
    tpt_latch *l;
    tpt_done d;
} job;

static int job_task(tp_ctx *c, void *arg) {
    (void)c;
    tpt_latch_wait(((job *)arg)->l);
    return 0;
}

static void job_done(void *arg, int status) { tpt_done_fn(&((job *)arg)->d, status); }

static tp_pool *inner_pool(tpt_fixture *fx, unsigned workers, unsigned cap) {
    tp_config c = {0};
    c.workers = workers;
    c.queue_capacity = cap;
    c.log = tpt_quiet_log;
    c.name = FX_NAME;
    return tpt_fx_pool(fx, &c);
}

/* Two pools with every worker and every queue slot taken by latched tasks,
 * the state of a test that failed between filling them and opening the
 * latches: the teardown opens the latches, every task ends exactly once, and
 * the pools' threads are gone when it returns 0. */
static void test_teardown_ends_full_pools(void **state) {
    enum { W = 2, CAP = 3, N = 2 * (W + CAP) };
    assert_int_equal(pool_threads(), 0);
    inner in;
    tpt_fixture *fx = inner_setup(&in, state);
    job *jobs = tpt_fx_array(in.outer, job, N); /* outlives the inner fixture */
    tp_pool *p[2] = {inner_pool(fx, W, CAP), inner_pool(fx, W, CAP)};
    tpt_latch *l[2] = {tpt_fx_latch(fx), tpt_fx_latch(fx)};
    tp_task_opts o = {0};
    o.on_done = job_done;
    for (int i = 0; i < N; i++) {
        int k = i / (W + CAP), n = i % (W + CAP);
        jobs[i].l = l[k];
        assert_int_equal(tp_submit(p[k], job_task, &jobs[i], &o, NULL), TP_OK);
        if (n < W) /* one at a time: the queue holds only CAP */
            TPT_EVENTUALLY(atomic_load(&l[k]->waiting) == n + 1);
    }
    for (int k = 0; k < 2; k++) {
        tp_stats s = tpt_stats(p[k]);
        assert_int_equal(s.active, W);
        assert_int_equal(s.queued, CAP);
        assert_int_equal(tp_submit(p[k], tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    }
    TPT_EVENTUALLY(pool_threads() == 2 * W + 2); /* workers, service threads (named at start) */

    uint64_t t0 = tp_now_ns();
    assert_int_equal(inner_teardown(&in), 0);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS);
    assert_null(in.state);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&jobs[i].d.calls), 1);
        int st = atomic_load(&jobs[i].d.status);
        assert_true(st == 0 || st == TP_ECANCELED);
    }
    /* the threads were joined; /proc may list them a moment longer */
    TPT_EVENTUALLY(pool_threads() == 0);
}

/* Spins, ignoring cancellation, until `release` is set (at most TPT_WAIT_NS). */
static atomic_int release;
static atomic_int stubborn_running;

static int stubborn_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_store(&stubborn_running, 1);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&release) && tp_now_ns() < end) tpt_pause();
    return 0;
}

/* A task that ignores cancellation keeps its worker: the teardown gives up
 * after its bound and returns -1, keeping the fixture (the thread may still
 * use it) instead of hanging; once the task returned, a second teardown
 * ends the pool and frees everything. */
static void test_teardown_reports_a_stuck_task(void **state) {
    assert_int_equal(pool_threads(), 0);
    inner in;
    tpt_fixture *fx = inner_setup(&in, state);
    fx->wait_ns = TPT_MS(200) * tpt_slowdown();
    atomic_store(&release, 0);
    atomic_store(&stubborn_running, 0);
    tp_pool *p = inner_pool(fx, 1, 4);
    assert_int_equal(tp_submit(p, stubborn_task, NULL, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&stubborn_running) == 1);
    assert_true(pool_threads() >= 1);

    uint64_t t0 = tp_now_ns();
    assert_int_equal(inner_teardown(&in), -1);
    uint64_t took = tp_now_ns() - t0;
    assert_true(took >= fx->wait_ns);
    assert_true(took < TPT_WAIT_NS);
    assert_ptr_equal(in.state, fx); /* kept: its pool is still alive */
    assert_ptr_equal(fx->pools[0], p);
    assert_int_equal(tpt_stats(p).workers, 1);

    atomic_store(&release, 1);
    assert_int_equal(inner_teardown(&in), 0);
    assert_null(in.state);
    TPT_EVENTUALLY(pool_threads() == 0);
}

/* A default pool a test left registered is unregistered and ended, and the
 * teardown reports it. */
static void test_teardown_ends_a_leftover_default(void **state) {
    assert_int_equal(pool_threads(), 0);
    inner in;
    (void)inner_setup(&in, state);
    tp_config c = {0};
    c.workers = 2;
    c.name = FX_NAME;
    assert_int_equal(tp_default_create(&c), TP_OK);
    TPT_EVENTUALLY(pool_threads() == 3);
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_OK);
    assert_int_equal(inner_teardown(&in), -1);
    assert_null(in.state); /* the pool ended: nothing kept */
    assert_null(tp_default());
    TPT_EVENTUALLY(pool_threads() == 0);
}

/* A thread of the test blocked in tp_submit_wait on a full pool, as a
 * failed assert would leave it: the teardown's close wakes it, the teardown
 * joins it, and only then ends the pool. */
typedef struct waiter {
    tp_pool *p;
    atomic_int entered;
    atomic_int rc;
} waiter;

static void *waiter_main(void *a) {
    waiter *w = a;
    atomic_store(&w->entered, 1);
    atomic_store(&w->rc, tp_submit_wait(w->p, tpt_nop_task, NULL, NULL, TPT_WAIT_NS, NULL));
    return NULL;
}

static void test_teardown_joins_the_tests_threads(void **state) {
    assert_int_equal(pool_threads(), 0);
    inner in;
    tpt_fixture *fx = inner_setup(&in, state);
    waiter *w = tpt_fx_new(in.outer, waiter); /* outlives fx */
    atomic_store(&w->rc, 1);
    tp_pool *p = inner_pool(fx, 1, 1);
    tpt_latch *l = tpt_fx_latch(fx);
    tpt_fill_workers(p, l, 1, NULL);
    assert_int_equal(tp_submit(p, tpt_block_task, l, NULL, NULL), TP_OK); /* full */
    w->p = p;
    (void)tpt_fx_thread(fx, waiter_main, w); /* not joined: the teardown's job */
    TPT_EVENTUALLY(atomic_load(&w->entered) == 1);

    uint64_t t0 = tp_now_ns();
    assert_int_equal(inner_teardown(&in), 0);
    assert_true(tp_now_ns() - t0 < TPT_WAIT_NS / 2); /* woken, not timed out */
    assert_null(in.state);
    /* closed while waiting, or admitted when the latch opened just before */
    int rc = atomic_load(&w->rc);
    assert_true(rc == TP_ECLOSED || rc == TP_OK);
    TPT_EVENTUALLY(pool_threads() == 0);
}

/* The fixture owns a pool from tpt_fx_pool until the test ends it itself:
 * tpt_finish and tpt_destroy take it back. */
static void test_fixture_owns_pools_until_ended(void **state) {
    tpt_fixture *f = tpt_fx(state);
    assert_ptr_equal(*tpt_fx_current_slot(), f);
    tp_config c = {0};
    c.workers = 1;
    tp_pool *a = tpt_fx_pool(f, &c);
    tp_pool *b = tpt_fx_pool(f, &c);
    int owned_a = 0, owned_b = 0;
    for (int i = 0; i < TPT_FX_POOLS; i++) {
        owned_a += f->pools[i] == a;
        owned_b += f->pools[i] == b;
    }
    assert_int_equal(owned_a, 1);
    assert_int_equal(owned_b, 1);
    tp_stats s = tpt_finish(a);
    assert_int_equal(s.workers, 0);
    tpt_destroy(b);
    for (int i = 0; i < TPT_FX_POOLS; i++) assert_null(f->pools[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_teardown_ends_full_pools),         TPT_TEST(test_teardown_reports_a_stuck_task),
        TPT_TEST(test_teardown_ends_a_leftover_default), TPT_TEST(test_teardown_joins_the_tests_threads),
        TPT_TEST(test_fixture_owns_pools_until_ended),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
