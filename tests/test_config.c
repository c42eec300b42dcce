/*
 * test_config.c -- configuration and bad input for every public function
 * (header sections 2-8).
 *
 * Covers: TP_EINVAL for NULL out / pool / fn, out-of-range config values
 * (max_workers < workers also after defaults, max_retries > 100, counts and
 * capacities above the maximums, UINT_MAX capacity, long name), bad task
 * options (priority, long user); argument errors change no counter and win
 * over TP_ECLOSED; NULL pool everywhere; the defaults of tp_create(&p, NULL)
 * (4 x CPUs workers, capacity 100, 2 slots per user, 1 s submit budget);
 * elastic pools grow to max_workers and shrink back; worker start/stop hooks
 * run once per worker thread; thread names carry the configured prefix.
 */
#define _GNU_SOURCE
#include <unistd.h>

#include "tp_test.h"

static unsigned ncpu(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1u;
}

static void assert_stats_same(const tp_stats *a, const tp_stats *b, const char *what) {
    if (memcmp(a, b, sizeof *a) != 0) {
        char ja[1024], jb[1024];
        tp_stats_format(a, TP_FORMAT_JSON, ja, sizeof ja);
        tp_stats_format(b, TP_FORMAT_JSON, jb, sizeof jb);
        fail_msg("%s changed the counters:\nbefore %s\nafter  %s", what, ja, jb);
    }
}

/* ------------------------------------------------------------ tp_create */

static void test_create_null_out(void **state) {
    (void)state;
    tp_config cfg = {0};
    cfg.workers = 1;
    assert_int_equal(tp_create(NULL, NULL), TP_EINVAL);
    assert_int_equal(tp_create(NULL, &cfg), TP_EINVAL);
}

static void expect_create_einval(const tp_config *cfg, const char *what) {
    tp_pool *sentinel = (tp_pool *)(uintptr_t)0x1234;
    tp_pool *p = sentinel;
    int rc = tp_create(&p, cfg);
    if (rc != TP_EINVAL)
        fail_msg("tp_create with %s returned %d (%s), expected TP_EINVAL", what, rc, tp_err_name(rc));
    assert_ptr_equal(p, sentinel); /* out written only on TP_OK */
}

static void test_create_bad_configs(void **state) {
    (void)state;
    const unsigned def_workers = 4 * ncpu();
    tp_config c;

#define BAD(setup, what)                                                                                     \
    do {                                                                                                     \
        memset(&c, 0, sizeof c);                                                                             \
        setup;                                                                                               \
        expect_create_einval(&c, what);                                                                      \
    } while (0)

    BAD((c.workers = 3, c.max_workers = 2), "max_workers < workers");
    BAD((c.workers = 0, c.max_workers = 1), "default workers, max_workers 1");
    BAD((c.workers = 0, c.max_workers = def_workers - 1), "default workers, max_workers one below");
    BAD(c.max_retries = TP_MAX_RETRIES + 1, "max_retries 101");
    BAD(c.max_retries = UINT_MAX, "max_retries UINT_MAX");
    BAD(c.workers = TP_MAX_WORKERS + 1, "workers above TP_MAX_WORKERS");
    BAD(c.workers = UINT_MAX, "workers UINT_MAX");
    BAD((c.workers = 1, c.max_workers = TP_MAX_WORKERS + 1), "max_workers above max");
    BAD((c.workers = 1, c.max_workers = UINT_MAX), "max_workers UINT_MAX");
    BAD(c.queue_capacity = TP_MAX_QUEUE_CAPACITY + 1, "capacity above max");
    BAD(c.queue_capacity = UINT_MAX, "capacity UINT_MAX");
    BAD((c.workers = 1, c.name = "abcdefghijklmnopqrstuvwxyz0123456"), "name of 33 bytes");
    BAD((c.workers = 1, c.name = "abcdefghijklmnopqrstuvwxyz012345"), "name of 32 bytes");
#undef BAD
}

static void test_create_boundaries_ok(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config c = {0};
    c.workers = 1;
    c.max_workers = 1;
    c.max_retries = TP_MAX_RETRIES;
    c.name = "abcdefghijklmnopqrstuvwxyz01234"; /* 31 bytes */
    c.max_per_user = TP_UNLIMITED;
    c.run_timeout_ns = TP_FOREVER;
    c.submit_timeout_ns = TP_FOREVER;
    c.drain_timeout_ns = TP_FOREVER;
    c.idle_timeout_ns = TP_FOREVER;
    c.retry_delay_ns = TP_FOREVER;
    c.queue_capacity = 1;
    tp_pool *p = tpt_fx_pool(f, &c);
    assert_non_null(p);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    tpt_finish(p);

    /* Default workers with max_workers exactly 4 x CPUs: a fixed pool. */
    memset(&c, 0, sizeof c);
    c.max_workers = 4 * ncpu();
    p = tpt_fx_pool(f, &c);
    TPT_EVENTUALLY(tpt_stats(p).workers == 4 * ncpu());
    tpt_finish(p);
}

/* ------------------------------------------------------------ tp_submit */

typedef struct urec {
    char user[TP_USER_MAX + 16];
    atomic_int done;
} urec;

static int user_task(tp_ctx *c, void *arg) {
    urec *u = arg;
    const char *s = tp_ctx_user(c);
    snprintf(u->user, sizeof u->user, "%s", s ? s : "(null)");
    atomic_store(&u->done, 1);
    return 0;
}

static void test_submit_bad_args(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    TPT_EVENTUALLY(tpt_stats(p).idle == 1);
    tp_stats before = tpt_stats(p);

    tpt_done *d = tpt_fx_new(f, tpt_done);
    char long_user[TP_USER_MAX + 2];
    memset(long_user, 'u', TP_USER_MAX + 1);
    long_user[TP_USER_MAX + 1] = '\0';
    char long_id[TP_LOG_ID_MAX + 2];
    memset(long_id, 'l', TP_LOG_ID_MAX + 1);
    long_id[TP_LOG_ID_MAX + 1] = '\0';

    tp_task_opts ok = {0};
    ok.on_done = tpt_done_fn;
    tp_task_opts bad[4];
    for (int i = 0; i < 4; i++) bad[i] = ok;
    bad[0].priority = TP_PRIO_MAX + 1;
    bad[1].priority = TP_PRIO_MIN - 1;
    bad[2].user = long_user;
    bad[3].log_id = long_id;

    for (int round = 0; round < 2; round++) {
        uint64_t id = 0;
        assert_int_equal(tp_submit(NULL, tpt_nop_task, d, &ok, &id), TP_EINVAL);
        assert_int_equal(tp_submit(p, NULL, d, &ok, &id), TP_EINVAL);
        assert_int_equal(tp_submit(p, NULL, NULL, NULL, NULL), TP_EINVAL);
        assert_int_equal(tp_submit_wait(NULL, tpt_nop_task, d, &ok, TPT_MS(5), &id), TP_EINVAL);
        assert_int_equal(tp_submit_wait(p, NULL, d, &ok, TPT_MS(5), &id), TP_EINVAL);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(tp_submit(p, tpt_nop_task, d, &bad[i], &id), TP_EINVAL);
            assert_int_equal(tp_submit_wait(p, tpt_nop_task, d, &bad[i], TPT_MS(5), &id), TP_EINVAL);
        }
        tp_stats after = tpt_stats(p);
        assert_stats_same(&before, &after, round ? "bad args after close" : "bad args");
        /* Argument errors come before the closed check. */
        if (round == 0) {
            assert_int_equal(tp_close(p), TP_OK);
            /* Let the workers leave first: their exit changes the gauges. */
            tp_stats z;
            TPT_EVENTUALLY((z = tpt_stats(p)).workers == 0 && z.idle == 0);
            before = tpt_stats(p);
        }
    }
    assert_int_equal(atomic_load(&d->calls), 0);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.submitted, 0);
    assert_int_equal(s.rejected_closed, 0);
}

static void test_submit_user_max_len_ok(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    char user[TP_USER_MAX + 1];
    memset(user, 'm', TP_USER_MAX);
    user[TP_USER_MAX] = '\0';
    tp_task_opts o = {0};
    o.user = user;
    urec *u = tpt_fx_new(f, urec);
    assert_int_equal(tp_submit(p, user_task, u, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&u->done) == 1);
    assert_string_equal(u->user, user);
    tpt_finish(p);
}

/* ------------------------------------------------------------ NULL pool etc. */

static void test_null_pool_everywhere(void **state) {
    tpt_fixture *f = tpt_fx(state);
    assert_int_equal(tp_close(NULL), TP_EINVAL);
    assert_int_equal(tp_shutdown(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_shutdown(NULL, TPT_MS(1)), TP_EINVAL);
    assert_int_equal(tp_wait(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_wait(NULL, TPT_MS(1)), TP_EINVAL);
    assert_int_equal(tp_destroy(NULL), TP_EINVAL);
    assert_int_equal(tp_cancel(NULL, 1), TP_EINVAL);
    assert_int_equal(tp_cancel(NULL, 0), TP_EINVAL);
    assert_int_equal(tp_submit_wait(NULL, tpt_nop_task, NULL, NULL, 0, NULL), TP_EINVAL);
    assert_int_equal(tp_user_active(NULL, "u"), 0);
    assert_int_equal(tp_user_active(NULL, NULL), 0);

    tp_stats s;
    memset(&s, 0xab, sizeof s);
    tp_stats_get(NULL, &s);
    tp_stats t;
    memset(&t, 0xab, sizeof t);
    assert_memory_equal(&s, &t, sizeof s); /* does nothing */
    tp_stats_get(NULL, NULL);

    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    TPT_EVENTUALLY(tpt_stats(p).idle == 1);
    tp_stats before = tpt_stats(p);
    tp_stats_get(p, NULL);
    assert_int_equal(tp_cancel(p, 0), TP_EINVAL);
    assert_int_equal(tp_cancel(p, 987654321), TP_ENOTFOUND);
    assert_int_equal(tp_cancel(p, UINT64_MAX), TP_ENOTFOUND);
    assert_int_equal(tp_user_active(p, NULL), 0);
    assert_int_equal(tp_user_active(p, ""), 0);
    assert_int_equal(tp_user_active(p, "nobody"), 0);
    tp_stats after = tpt_stats(p);
    assert_stats_same(&before, &after, "cancel/user_active/stats_get");
    tpt_finish(p);
}

/* ------------------------------------------------------------ defaults */

static void test_create_defaults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    const unsigned W = 4 * ncpu();
    for (int variant = 0; variant < 2; variant++) {
        tp_pool *p = NULL;
        tp_config zero = {0};
        p = tpt_fx_pool(f, variant ? &zero : NULL);
        assert_non_null(p);
        tp_stats s;
        TPT_EVENTUALLY((s = tpt_stats(p)).workers == W && s.idle == W);
        if (variant == 1) {
            tpt_finish(p);
            continue;
        }
        /* max_per_user 2: a third task of one user is refused. */
        tpt_latch *gate = tpt_fx_latch(f);
        tp_task_opts o = {0};
        o.user = "u";
        assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_OK);
        assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_OK);
        assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_EUSERLIMIT);
        /* Fill every worker, then the queue of 100. */
        for (unsigned i = 2; i < W; i++)
            assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&gate->waiting) == (int)W);
        for (int i = 0; i < 100; i++) assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
        /* submit_timeout_ns 1 s is the budget when 0 is passed. */
        uint64_t t0 = tp_now_ns();
        assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, NULL, 0, NULL), TP_ETIMEDOUT);
        uint64_t el = tp_now_ns() - t0;
        assert_true(el >= TPT_MS(990));
        assert_true(el < TPT_S(10));
        tpt_latch_open(gate);
        s = tpt_finish(p);
        tpt_assert_counts(s, TPT_EQ(accepted, W + 100), TPT_EQ(rejected_user, 1), TPT_EQ(rejected_full, 1),
                          TPT_EQ(rejected_timeout, 1));
        assert_int_equal(atomic_load(&gate->timeouts), 0);
    }
}

/* ------------------------------------------------------------ hooks */

typedef struct hooks {
    pthread_mutex_t mu;
    int starts, stops;
    int bad_arg;
    pthread_t started[64];
    pthread_t stopped[64];
    int live; /* starts - stops */
    int max_live;
} hooks;

static hooks H;

static void hooks_reset(void) {
    pthread_mutex_lock(&H.mu);
    H.starts = H.stops = H.bad_arg = H.live = H.max_live = 0;
    pthread_mutex_unlock(&H.mu);
}

static void on_start(void *arg) {
    pthread_mutex_lock(&H.mu);
    if (arg != &H) H.bad_arg++;
    if (H.starts < 64) H.started[H.starts] = pthread_self();
    H.starts++;
    H.live++;
    if (H.live > H.max_live) H.max_live = H.live;
    pthread_mutex_unlock(&H.mu);
}

static void on_stop(void *arg) {
    pthread_mutex_lock(&H.mu);
    if (arg != &H) H.bad_arg++;
    if (H.stops < 64) H.stopped[H.stops] = pthread_self();
    H.stops++;
    H.live--;
    pthread_mutex_unlock(&H.mu);
}

static int hooks_get(int *starts, int *stops, int *max_live) {
    pthread_mutex_lock(&H.mu);
    *starts = H.starts;
    *stops = H.stops;
    if (max_live) *max_live = H.max_live;
    int bad = H.bad_arg;
    pthread_mutex_unlock(&H.mu);
    return bad;
}

/* A task that checks its thread already ran on_worker_start. */
typedef struct hook_task {
    tpt_latch *gate;
    atomic_int seen_started; /* 1: found, -1: not found */
    char name[32];
    atomic_int done;
} hook_task;

static int hook_check_task(tp_ctx *c, void *arg) {
    (void)c;
    hook_task *h = arg;
    pthread_t me = pthread_self();
    int found = 0;
    pthread_mutex_lock(&H.mu);
    for (int i = 0; i < H.starts && i < 64; i++)
        if (pthread_equal(H.started[i], me)) found = 1;
    pthread_mutex_unlock(&H.mu);
    char nm[32] = {0};
    if (pthread_getname_np(me, nm, sizeof nm) != 0) strcpy(nm, "?getname-failed");
    snprintf(h->name, sizeof h->name, "%s", nm);
    atomic_store(&h->seen_started, found ? 1 : -1);
    if (h->gate) tpt_latch_wait(h->gate);
    atomic_store(&h->done, 1);
    return 0;
}

static void test_worker_hooks_once_per_thread(void **state) {
    tpt_fixture *f = tpt_fx(state);
    hooks_reset();
    tp_config cfg = {0};
    cfg.workers = 3;
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    cfg.hook_arg = &H;
    tp_pool *p = tpt_fx_pool(f, &cfg);

    /* Occupy all three workers at once: each task is on a distinct worker. */
    tpt_latch *gate = tpt_fx_latch(f);
    hook_task *t = tpt_fx_array(f, hook_task, 3);
    for (int i = 0; i < 3; i++) {
        t[i].gate = gate;
        assert_int_equal(tp_submit(p, hook_check_task, &t[i], NULL, NULL), TP_OK);
    }
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 3);
    tpt_latch_open(gate);
    for (int i = 0; i < 3; i++) {
        TPT_EVENTUALLY(atomic_load(&t[i].done) == 1);
        assert_int_equal(atomic_load(&t[i].seen_started), 1);
    }
    tpt_finish(p);

    int starts, stops, max_live;
    assert_int_equal(hooks_get(&starts, &stops, &max_live), 0);
    assert_int_equal(starts, 3);
    assert_int_equal(stops, 3);
    assert_int_equal(max_live, 3);
    /* Three distinct threads, and each that started also stopped. */
    pthread_mutex_lock(&H.mu);
    int distinct = 1, matched = 1;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < i; j++)
            if (pthread_equal(H.started[i], H.started[j])) distinct = 0;
        int m = 0;
        for (int j = 0; j < 3; j++)
            if (pthread_equal(H.started[i], H.stopped[j])) m = 1;
        matched &= m;
    }
    pthread_mutex_unlock(&H.mu);
    assert_true(distinct);
    assert_true(matched);
}

/* ------------------------------------------------------------ elastic */

static uint32_t max_workers_seen;

static tp_stats observe(tp_pool *p) {
    tp_stats s = tpt_stats(p);
    if (s.workers > max_workers_seen) max_workers_seen = s.workers;
    return s;
}

static void test_elastic_grow_and_shrink(void **state) {
    tpt_fixture *f = tpt_fx(state);
    hooks_reset();
    max_workers_seen = 0;
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 4;
    cfg.idle_timeout_ns = TPT_MS(50);
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    cfg.hook_arg = &H;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tp_stats s;
    TPT_EVENTUALLY((s = observe(p)).workers == 1 && s.idle == 1);

    for (int burst = 0; burst < 2; burst++) {
        tpt_latch *gate = tpt_fx_latch(f);
        for (int i = 0; i < 6; i++) assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&gate->waiting) == 4 && (s = observe(p)).workers == 4 && s.active == 4 &&
                       s.queued == 2);
        /* Never more than max_workers, however long the backlog stays. */
        for (int i = 0; i < 100; i++) {
            s = observe(p);
            tpt_pause();
        }
        assert_int_equal(s.workers, 4);
        assert_int_equal(atomic_load(&gate->waiting), 4);
        assert_int_equal(max_workers_seen, 4);
        int starts, stops, max_live;
        assert_int_equal(hooks_get(&starts, &stops, &max_live), 0);
        assert_int_equal(starts - stops, 4);
        assert_true(max_live <= 4);

        tpt_latch_open(gate);
        /* Idle extra workers leave; the minimum stays. */
        TPT_EVENTUALLY((s = observe(p)).workers == 1 && s.idle == 1 && s.completed == 6u * (burst + 1));
        assert_int_equal(hooks_get(&starts, &stops, &max_live), 0);
        TPT_EVENTUALLY((hooks_get(&starts, &stops, NULL), starts - stops == 1));
        /* And it stays at the minimum. */
        for (int i = 0; i < 50; i++) {
            s = observe(p);
            assert_true(s.workers >= 1);
            tpt_pause();
        }
        assert_int_equal(max_workers_seen, 4);
        assert_int_equal(atomic_load(&gate->timeouts), 0);
    }
    tpt_finish(p);
    int starts, stops, max_live;
    assert_int_equal(hooks_get(&starts, &stops, &max_live), 0);
    assert_int_equal(starts, stops);
    assert_true(max_live <= 4);
    assert_true(starts >= 7); /* 1 + 3 per burst */
}

static void test_elastic_idle_forever_keeps_workers(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TP_FOREVER;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    for (int i = 0; i < 3; i++) assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    tp_stats s;
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 2 && (s = tpt_stats(p)).workers == 2);
    tpt_latch_open(gate);
    TPT_EVENTUALLY((s = tpt_stats(p)).completed == 3 && s.idle == 2);
    /* TP_FOREVER: idle extra workers never leave (sampled for a while). */
    for (int i = 0; i < 200; i++) {
        assert_int_equal(tpt_stats(p).workers, 2);
        tpt_pause();
    }
    tpt_finish(p);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

/* ------------------------------------------------------------ thread names */

static void check_thread_name(tpt_fixture *f, const char *name, const char *expect_prefix) {
    char buf[TP_NAME_MAX + 1];
    tp_config cfg = {0};
    cfg.workers = 2;
    if (name) {
        snprintf(buf, sizeof buf, "%s", name);
        cfg.name = buf;
    }
    tp_pool *p = tpt_fx_pool(f, &cfg);
    memset(buf, 'X', sizeof buf - 1); /* the name was copied */
    buf[sizeof buf - 1] = '\0';
    hook_task *t = tpt_fx_new(f, hook_task);
    assert_int_equal(tp_submit(p, hook_check_task, t, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&t->done) == 1);
    tpt_finish(p);
    if (strncmp(t->name, expect_prefix, strlen(expect_prefix)) != 0)
        fail_msg("worker thread name \"%s\" does not start with \"%s\"", t->name, expect_prefix);
}

static void test_thread_names(void **state) {
    tpt_fixture *f = tpt_fx(state);
    check_thread_name(f, "cfgpool", "cfgpool");
    check_thread_name(f, NULL, "tp");
    /* Linux thread names hold 15 bytes: a long prefix is cut, not refused. */
    check_thread_name(f, "abcdefghijklmnopqrstuvwxyz01234", "abcdefgh");
}

int main(void) {
    pthread_mutex_init(&H.mu, NULL);
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_create_null_out),
        TPT_TEST(test_create_bad_configs),
        TPT_TEST(test_create_boundaries_ok),
        TPT_TEST(test_submit_bad_args),
        TPT_TEST(test_submit_user_max_len_ok),
        TPT_TEST(test_null_pool_everywhere),
        TPT_TEST(test_create_defaults),
        TPT_TEST(test_worker_hooks_once_per_thread),
        TPT_TEST(test_elastic_grow_and_shrink),
        TPT_TEST(test_elastic_idle_forever_keeps_workers),
        TPT_TEST(test_thread_names),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pthread_mutex_destroy(&H.mu);
    return rc;
}
