/*
 * test_default.c -- the process-wide default pool (header section 10).
 *
 * Covers: without a registered pool tp_default() is NULL and the default
 * submit/shutdown/wait return TP_ENODEFAULT; tp_default_create registers (a
 * second one, or a bad config, is TP_EINVAL); tasks run through
 * tp_default_submit; tp_default_wait does not start a shutdown; shutdown and
 * wait (drained and forced) through the default; tp_default_swap returns the
 * old pool without closing it and NULL clears; concurrent creates register
 * exactly one pool. Every test leaves no pool registered and every pool
 * destroyed.
 */
#define _GNU_SOURCE
#include "tp_test.h"

/* A pool with `workers` workers and the library's defaults otherwise. */
static tp_pool *plain_pool(tpt_fixture *f, unsigned workers) {
    tp_config cfg = {0};
    cfg.workers = workers;
    return tpt_fx_pool(f, &cfg);
}


static void test_default_none(void **state) {
    tpt_fixture *f = tpt_fx(state);
    assert_null(tp_default());
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 77;
    assert_int_equal(tp_default_submit(tpt_nop_task, d, &o, &id), TP_ENODEFAULT);
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_ENODEFAULT);
    assert_int_equal(tp_default_shutdown(0), TP_ENODEFAULT);
    assert_int_equal(tp_default_shutdown(TPT_MS(10)), TP_ENODEFAULT);
    assert_int_equal(tp_default_wait(0), TP_ENODEFAULT);
    assert_int_equal(tp_default_wait(TPT_MS(10)), TP_ENODEFAULT);
    assert_null(tp_default_swap(NULL));
    assert_null(tp_default());
    assert_int_equal(atomic_load(&d->calls), 0);
}

static void test_default_create_submit_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    /* A bad config registers nothing. */
    tp_config bad = {0};
    bad.max_retries = TP_MAX_RETRIES + 1;
    assert_int_equal(tp_default_create(&bad), TP_EINVAL);
    assert_null(tp_default());

    tp_config cfg = {0};
    cfg.workers = 2;
    assert_int_equal(tp_default_create(&cfg), TP_OK);
    tp_pool *p = tp_default();
    assert_non_null(p);
    /* A second create is refused and changes nothing. */
    assert_int_equal(tp_default_create(&cfg), TP_EINVAL);
    assert_int_equal(tp_default_create(NULL), TP_EINVAL);
    assert_ptr_equal(tp_default(), p);

    enum { N = 10 };
    tpt_done *d = tpt_fx_array(f, tpt_done, N);
    uint64_t ids[N];
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    for (int i = 0; i < N; i++) {
        ids[i] = 0;
        assert_int_equal(tp_default_submit(tpt_nop_task, &d[i], &o, &ids[i]), TP_OK);
        assert_true(ids[i] != 0);
        for (int j = 0; j < i; j++) assert_true(ids[j] != ids[i]);
    }
    for (int i = 0; i < N; i++) {
        TPT_EVENTUALLY(atomic_load(&d[i].calls) == 1);
        assert_int_equal(atomic_load(&d[i].status), 0);
    }
    assert_int_equal(tpt_stats(p).accepted, N);

    /* tp_default_wait alone starts no shutdown. */
    assert_int_equal(tp_default_wait(TPT_MS(20)), TP_ETIMEDOUT);
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_OK);

    assert_int_equal(tp_default_shutdown(TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_default_wait(TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_default_wait(0), TP_OK); /* repeatable */
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_ECLOSED);
    /* Still registered until swapped out. */
    assert_ptr_equal(tp_default(), p);

    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_assert_counts(s, TPT_EQ(accepted, N + 1), TPT_EQ(rejected_closed, 1), TPT_EQ(workers, 0));

    assert_ptr_equal(tp_default_swap(NULL), p);
    assert_null(tp_default());
    assert_int_equal(tp_destroy(p), TP_OK);
}

static void test_default_wait_for_someone_elses_close(void **state) {
    (void)state;
    tp_config cfg = {0};
    cfg.workers = 1;
    assert_int_equal(tp_default_create(&cfg), TP_OK);
    tp_pool *p = tp_default();
    assert_non_null(p);
    assert_int_equal(tp_default_wait(TPT_MS(20)), TP_ETIMEDOUT);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_default_wait(TPT_WAIT_NS), TP_OK);
    assert_ptr_equal(tp_default_swap(NULL), p);
    tpt_finish(p);
}

static void test_default_forced_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    assert_int_equal(tp_default_create(&cfg), TP_OK);
    tp_pool *p = tp_default();
    assert_non_null(p);

    tpt_latch *gate = tpt_fx_latch(f);
    tpt_done *queued = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    /* The blocker ignores cancellation: only the latch ends it. */
    assert_int_equal(tp_default_submit(tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    assert_int_equal(tp_default_submit(tpt_nop_task, queued, &o, NULL), TP_OK);

    assert_int_equal(tp_default_shutdown(TPT_MS(30)), TP_ETIMEDOUT);
    /* The queued task was dropped without running. */
    TPT_EVENTUALLY(atomic_load(&queued->calls) == 1);
    assert_int_equal(atomic_load(&queued->status), TP_ECANCELED);
    /* Later calls get the same outcome. */
    assert_int_equal(tp_default_shutdown(TPT_WAIT_NS), TP_ETIMEDOUT);
    /* The blocker is still running: a bounded wait times out. */
    assert_int_equal(tp_default_wait(TPT_MS(20)), TP_ETIMEDOUT);
    assert_true(tpt_stats(p).workers >= 1);

    tpt_latch_open(gate);
    assert_int_equal(tp_default_wait(TPT_WAIT_NS), TP_ETIMEDOUT); /* forced */
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    tpt_assert_counts(s, TPT_EQ(workers, 0), TPT_EQ(succeeded, 1), TPT_EQ(cancelled, 1));

    assert_ptr_equal(tp_default_swap(NULL), p);
    assert_int_equal(tp_destroy(p), TP_OK);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

static void test_default_swap(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *a = plain_pool(f, 1);
    tp_pool *b = plain_pool(f, 1);

    assert_null(tp_default_swap(a));
    assert_ptr_equal(tp_default(), a);
    tpt_done *d1 = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_default_submit(tpt_nop_task, d1, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d1->calls) == 1);
    assert_int_equal(tpt_stats(a).accepted, 1);

    /* Swapping returns the old pool, still open. */
    assert_ptr_equal(tp_default_swap(b), a);
    assert_ptr_equal(tp_default(), b);
    tpt_done *d2 = tpt_fx_new(f, tpt_done), *d3 = tpt_fx_new(f, tpt_done);
    assert_int_equal(tp_submit(a, tpt_nop_task, d2, &o, NULL), TP_OK);
    assert_int_equal(tp_default_submit(tpt_nop_task, d3, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d2->calls) == 1 && atomic_load(&d3->calls) == 1);
    assert_int_equal(atomic_load(&d2->status), 0);
    assert_int_equal(tpt_stats(a).accepted, 2);
    assert_int_equal(tpt_stats(b).accepted, 1);

    /* Swapping a pool with itself keeps it registered. */
    assert_ptr_equal(tp_default_swap(b), b);
    assert_ptr_equal(tp_default(), b);

    /* NULL clears. */
    assert_ptr_equal(tp_default_swap(NULL), b);
    assert_null(tp_default());
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_ENODEFAULT);

    /* The owner still shuts both down. */
    tp_stats sa = tpt_finish(a);
    tp_stats sb = tpt_finish(b);
    assert_int_equal(sa.succeeded, 2);
    assert_int_equal(sb.succeeded, 1);
}

/* Concurrent creates: exactly one registers; the others get TP_EINVAL and
 * leave nothing behind (LSan/valgrind would see a leaked pool). */
static pthread_barrier_t create_barrier;
static atomic_int create_ok, create_einval, create_other;

static void *create_main(void *arg) {
    (void)arg;
    tp_config cfg = {0};
    cfg.workers = 1;
    pthread_barrier_wait(&create_barrier);
    int rc = tp_default_create(&cfg);
    if (rc == TP_OK)
        atomic_fetch_add(&create_ok, 1);
    else if (rc == TP_EINVAL)
        atomic_fetch_add(&create_einval, 1);
    else
        atomic_fetch_add(&create_other, 1);
    return NULL;
}

static void test_default_concurrent_create(void **state) {
    (void)state;
    enum { T = 6 };
    for (int round = 0; round < 5; round++) {
        atomic_store(&create_ok, 0);
        atomic_store(&create_einval, 0);
        atomic_store(&create_other, 0);
        assert_int_equal(pthread_barrier_init(&create_barrier, NULL, T), 0);
        pthread_t th[T];
        for (int i = 0; i < T; i++) assert_int_equal(pthread_create(&th[i], NULL, create_main, NULL), 0);
        for (int i = 0; i < T; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
        pthread_barrier_destroy(&create_barrier);
        assert_int_equal(atomic_load(&create_ok), 1);
        assert_int_equal(atomic_load(&create_einval), T - 1);
        assert_int_equal(atomic_load(&create_other), 0);
        tp_pool *p = tp_default_swap(NULL);
        assert_non_null(p);
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
        tpt_finish(p);
    }
}

/* tp_default_create() racing tp_default_swap(q): whichever comes first, q
 * ends up registered -- a swap after the create replaces the new pool (and
 * returns it), a swap before the create's registration makes the create fail
 * with TP_EINVAL. Never may the create overwrite q. Checked over many races;
 * the window (thread creation inside tp_create) is wide. Regression: create
 * used to check, build, then store blindly. */
static tp_pool *race_q;
static pthread_barrier_t race_barrier;
static tp_pool *race_old;
static uint64_t race_delay_ns;

static void *race_swap(void *arg) {
    (void)arg;
    pthread_barrier_wait(&race_barrier);
    /* spread the swap over the create's duration, iteration by iteration */
    uint64_t until = tp_now_ns() + race_delay_ns;
    while (tp_now_ns() < until) {
    }
    race_old = tp_default_swap(race_q);
    return NULL;
}

static void test_default_create_does_not_overwrite_swap(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 2;
    for (int i = 0; i < 100; i++) {
        race_q = plain_pool(f, 1);
        race_old = NULL;
        race_delay_ns = (uint64_t)(i % 50) * 4000; /* 0..200 us */
        pthread_barrier_init(&race_barrier, NULL, 2);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, race_swap, NULL), 0);
        pthread_barrier_wait(&race_barrier);
        int rc = tp_default_create(&cfg);
        pthread_join(th, NULL);
        pthread_barrier_destroy(&race_barrier);
        assert_ptr_equal(tp_default(), race_q);
        if (race_old) {
            assert_int_equal(rc, TP_OK); /* the swap replaced the created pool */
            tpt_finish(race_old);
        } else {
            assert_int_equal(rc, TP_EINVAL); /* the swap came first */
        }
        assert_ptr_equal(tp_default_swap(NULL), race_q);
        tpt_finish(race_q);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_default_none),
        TPT_TEST(test_default_create_submit_shutdown),
        TPT_TEST(test_default_wait_for_someone_elses_close),
        TPT_TEST(test_default_forced_shutdown),
        TPT_TEST(test_default_swap),
        TPT_TEST(test_default_concurrent_create),
        TPT_TEST(test_default_create_does_not_overwrite_swap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
