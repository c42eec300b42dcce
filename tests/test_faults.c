/*
 * test_faults.c -- fault injection: every allocation, thread creation,
 * descriptor creation and mutex/condition-variable initialisation the library
 * makes is made to fail, one at a time, and the library must report it with
 * the documented code, leak nothing and leave no thread running.
 *
 * How: this executable is linked with `-Wl,--wrap=<fn>` for malloc, calloc,
 * realloc, free, pthread_create, pipe, pipe2, pthread_mutex_init,
 * pthread_cond_init, pthread_condattr_init and pthread_condattr_setclock (see
 * tests/CMakeLists.txt). The static library's calls then go to __wrap_<fn>
 * below, which can fail the Nth call of a kind (or every call from the Nth on)
 * and otherwise forward to __real_<fn>. Calls made inside libc or cmocka are
 * not wrapped (they are resolved at run time), so only our own code and the
 * library's is counted. The wrappers also track every live allocation by
 * pointer in a fixed table (no malloc), so "nothing leaked" is checked
 * exactly, whatever the allocator (glibc, ASan, TSan, valgrind).
 *
 * The fault points, found by looping N = 1, 2, ... until an operation succeeds
 * without a fault being hit (the counts are printed):
 *   tp_create / tp_default_create: the pool, the worker array, the ring, the
 *     first record chunk and the id index, the user buckets and the first user
 *     chunk (allocations); the pool mutex, condattr init + setclock + cond
 *     init of 4 pool and max_workers per-worker condition variables (sync);
 *     the service thread and each of the `workers` threads (threads).
 *     Each failure: TP_ENOMEM, *out untouched, no thread, descriptor or byte
 *     left, worker start/stop hooks balanced.
 *   tp_submit: record growth past the preallocated set (TP_ENOMEM, counted in
 *     rejected_full, nothing reserved) and a failed id-index resize (accepted:
 *     longer chains, lookups still right); a new user entry chunk (TP_ENOMEM)
 *     and a failed user-bucket rehash (accepted).
 *   elastic scale-up: pthread_create failing on every spawn (from submit and
 *     from the service thread's retry path): every task still runs on the
 *     existing workers and ends exactly once, the counted workers stay right,
 *     the pool grows again once threads can be made, and shuts down cleanly;
 *     a failed spawn into the slot of an exited elastic worker (joined first)
 *     leaves the slot free for the next spawn, never joined twice.
 *   tp_ctx_fd: pipe2 failing gives TP_ENOMEM; the next call makes the pipe.
 *
 * Sanitizers: the wraps bind to the sanitizer's interceptors through
 * __real_<fn>, so the whole file runs under ASan and TSan as well.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>

#include "tp_test.h"
#include "pool.h" /* tp__tls_service: which thread a spawn comes from */

/* ------------------------------------------------------------ the injector */

enum { F_ALLOC, F_THREAD, F_FD, F_SYNC, F_KINDS };
static const char *const kind_name[F_KINDS] = {"allocation", "thread", "descriptor", "sync init"};

static atomic_int armed;               /* inject only while set */
static atomic_uint calls[F_KINDS];     /* calls of each kind while armed */
static atomic_uint fail_at[F_KINDS];   /* 0: never; n: the nth call fails */
static atomic_int fail_after[F_KINDS]; /* and, if set, every later one too */
static atomic_uint hits[F_KINDS];      /* failures injected */
static atomic_uint svc_hits;           /* thread failures on a pool's service thread */

static void inj_reset(void) {
    atomic_store(&armed, 0);
    for (int k = 0; k < F_KINDS; k++) {
        atomic_store(&calls[k], 0);
        atomic_store(&fail_at[k], 0);
        atomic_store(&fail_after[k], 0);
        atomic_store(&hits[k], 0);
    }
    atomic_store(&svc_hits, 0);
}

static unsigned hits_total(void) {
    unsigned n = 0;
    for (int k = 0; k < F_KINDS; k++) n += atomic_load(&hits[k]);
    return n;
}

static int inject(int k) {
    if (!atomic_load(&armed)) return 0;
    unsigned n = atomic_fetch_add(&calls[k], 1) + 1;
    unsigned at = atomic_load(&fail_at[k]);
    if (at == 0 || n < at || (n > at && !atomic_load(&fail_after[k]))) return 0;
    atomic_fetch_add(&hits[k], 1);
    return 1;
}

/* Live allocations, by pointer: a fixed table, since the tracker must not
 * allocate. Slots are claimed and released with compare-and-swap. */
#define TRACK_SLOTS 8192
static void *_Atomic track_tab[TRACK_SLOTS];
static atomic_int tracking;
static atomic_int track_overflow;

static void track_add(void *p) {
    if (!p || !atomic_load(&tracking)) return;
    for (int i = 0; i < TRACK_SLOTS; i++) {
        void *none = NULL;
        if (atomic_load_explicit(&track_tab[i], memory_order_relaxed) == NULL &&
            atomic_compare_exchange_strong(&track_tab[i], &none, p))
            return;
    }
    atomic_store(&track_overflow, 1);
}

static void track_del(void *p) {
    if (!p) return;
    for (int i = 0; i < TRACK_SLOTS; i++) {
        void *want = p;
        if (atomic_load_explicit(&track_tab[i], memory_order_relaxed) == p &&
            atomic_compare_exchange_strong(&track_tab[i], &want, NULL))
            return;
    }
}

static int track_live(void) {
    int n = 0;
    for (int i = 0; i < TRACK_SLOTS; i++) n += atomic_load(&track_tab[i]) != NULL;
    return n;
}

/* Start counting allocations afresh (the table must be empty). */
static void track_begin(void) {
    for (int i = 0; i < TRACK_SLOTS; i++) atomic_store(&track_tab[i], NULL);
    atomic_store(&track_overflow, 0);
    atomic_store(&tracking, 1);
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __real_pipe(int fds[2]);
int __real_pipe2(int fds[2], int flags);
int __real_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);
int __real_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __real_pthread_condattr_init(pthread_condattr_t *a);
int __real_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t id);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pipe(int fds[2]);
int __wrap_pipe2(int fds[2], int flags);
int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);
int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __wrap_pthread_condattr_init(pthread_condattr_t *a);
int __wrap_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t id);

void *__wrap_malloc(size_t n) {
    if (inject(F_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = __real_malloc(n);
    track_add(p);
    return p;
}

void *__wrap_calloc(size_t a, size_t b) {
    if (inject(F_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = __real_calloc(a, b);
    track_add(p);
    return p;
}

void *__wrap_realloc(void *p, size_t n) {
    if (inject(F_ALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = __real_realloc(p, n);
    if (q) {
        track_del(p);
        track_add(q);
    }
    return q;
}

void __wrap_free(void *p) {
    track_del(p);
    __real_free(p);
}

/* While set, pthread_create first waits on stall_gate (after the library has
 * reserved the worker, with the pool lock released): the window in which a
 * spawn is under way becomes as long as a test needs. */
static atomic_int stall_enabled, stalled;
static tpt_latch stall_gate;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    int fail = inject(F_THREAD);
    if (atomic_load(&stall_enabled)) {
        atomic_fetch_add(&stalled, 1);
        tpt_latch_wait(&stall_gate);
    }
    if (fail) {
        if (tp__tls_service) atomic_fetch_add(&svc_hits, 1);
        return EAGAIN;
    }
    return __real_pthread_create(t, a, fn, arg);
}

int __wrap_pipe(int fds[2]) {
    if (inject(F_FD)) {
        errno = EMFILE;
        return -1;
    }
    return __real_pipe(fds);
}

int __wrap_pipe2(int fds[2], int flags) {
    if (inject(F_FD)) {
        errno = EMFILE;
        return -1;
    }
    return __real_pipe2(fds, flags);
}

int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
    if (inject(F_SYNC)) return ENOMEM;
    return __real_pthread_mutex_init(m, a);
}

int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a) {
    if (inject(F_SYNC)) return ENOMEM;
    return __real_pthread_cond_init(c, a);
}

int __wrap_pthread_condattr_init(pthread_condattr_t *a) {
    if (inject(F_SYNC)) return ENOMEM;
    return __real_pthread_condattr_init(a);
}

int __wrap_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t id) {
    if (inject(F_SYNC)) return EINVAL;
    return __real_pthread_condattr_setclock(a, id);
}

/* ------------------------------------------------------------ process state */

static int n_threads(void) { return tpt_count_dir("/proc/self/task"); }
static int n_fds(void) { return tpt_count_dir("/proc/self/fd"); } /* opendir's own fd counts each time */

typedef struct snapshot {
    int threads, fds;
} snapshot;

static snapshot snap(void) {
    /* The snapshots are taken with no pool alive, so only this thread should
     * run; a thread joined just before (the last pool's) may still be listed
     * in /proc for a moment, and counted into the baseline it made later
     * counts look one short ("1 threads, 2 before"). Let it leave first
     * (bounded: a baseline that really has more threads is kept as is). */
    (void)TPT_POLL(n_threads() == 1, TPT_MS(1000));
    snapshot s = {n_threads(), n_fds()};
    assert_true(s.threads > 0);
    assert_true(s.fds > 0);
    return s;
}

/* Threads and descriptors back at `s` (threads leave /proc a moment after
 * their join), and no tracked allocation alive. */
static void assert_back_to(const snapshot *s, const char *what) {
    if (!TPT_POLL(n_threads() == s->threads, TPT_WAIT_NS))
        fail_msg("%s: %d threads, %d before", what, n_threads(), s->threads);
    if (n_fds() != s->fds) fail_msg("%s: %d descriptors, %d before", what, n_fds(), s->fds);
    assert_int_equal(atomic_load(&track_overflow), 0);
    int live = track_live();
    if (live != 0) fail_msg("%s: %d allocation(s) leaked", what, live);
}

/* ------------------------------------------------------------ hooks */

static atomic_int hook_starts, hook_stops;

static void on_start(void *arg) {
    (void)arg;
    atomic_fetch_add(&hook_starts, 1);
}

static void on_stop(void *arg) {
    (void)arg;
    atomic_fetch_add(&hook_stops, 1);
}

/* ------------------------------------------------------------ tp_create */

typedef int (*create_fn)(tp_pool **out, const tp_config *cfg);

static int create_default(tp_pool **out, const tp_config *cfg) {
    int rc = tp_default_create(cfg);
    *out = tp_default();
    return rc;
}

/* A created pool works: one task runs and ends, then it is destroyed. */
static void use_and_destroy(tp_pool *p, int is_default) {
    tpt_done d = {0};
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    o.user = "u";
    assert_int_equal(tp_submit(p, tpt_nop_task, &d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d.calls) == 1);
    if (is_default) assert_ptr_equal(tp_default_swap(NULL), p);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 1);
}

/* Fail the nth call of `kind` for n = 1, 2, ... until the create succeeds
 * without a fault; every failed one must be clean. Returns the fault points. */
static unsigned create_faults(create_fn create, int is_default, const tp_config *cfg, int kind,
                              const char *label) {
    unsigned points = 0;
    for (unsigned n = 1;; n++) {
        assert_true(n < 10000);
        snapshot before = snap();
        atomic_store(&hook_starts, 0);
        atomic_store(&hook_stops, 0);
        inj_reset();
        track_begin();
        atomic_store(&fail_at[kind], n);
        tp_pool *sentinel = (tp_pool *)(uintptr_t)0x5a5a, *p = sentinel;
        atomic_store(&armed, 1);
        int rc = create(&p, cfg);
        atomic_store(&armed, 0);
        if (atomic_load(&hits[kind]) == 0) {
            /* every fault point passed: the create is whole */
            if (rc != TP_OK)
                fail_msg("%s: %s call %u: no fault injected, yet %s", label, kind_name[kind], n,
                         tp_err_name(rc));
            use_and_destroy(p, is_default);
            assert_back_to(&before, label);
            assert_int_equal(atomic_load(&hook_starts), atomic_load(&hook_stops));
            atomic_store(&tracking, 0);
            break;
        }
        points++;
        if (rc != TP_ENOMEM)
            fail_msg("%s: %s call %u failed: got %s, want TP_ENOMEM", label, kind_name[kind], n,
                     tp_err_name(rc));
        if (is_default)
            assert_null(tp_default());
        else
            assert_ptr_equal(p, sentinel); /* written only on TP_OK */
        char what[128];
        snprintf(what, sizeof what, "%s, %s call %u failed", label, kind_name[kind], n);
        assert_back_to(&before, what);
        /* every worker that started also stopped */
        assert_int_equal(atomic_load(&hook_starts), atomic_load(&hook_stops));
        atomic_store(&tracking, 0);
    }
    return points;
}

static void create_all_kinds(create_fn create, int is_default, const tp_config *cfg, const char *label,
                             unsigned want_threads) {
    unsigned pts[F_KINDS];
    for (int k = 0; k < F_KINDS; k++) pts[k] = create_faults(create, is_default, cfg, k, label);
    print_message("%s: fault points: %u allocation, %u thread, %u descriptor, %u sync init\n", label,
                  pts[F_ALLOC], pts[F_THREAD], pts[F_FD], pts[F_SYNC]);
    assert_true(pts[F_ALLOC] >= 5); /* pool, workers, ring, records, users at least */
    assert_int_equal(pts[F_THREAD], want_threads);
    assert_int_equal(pts[F_FD], 0); /* descriptors are made on first use only */
    assert_true(pts[F_SYNC] >= 5);  /* the mutex and four condition variables at least */
}

static void test_create_faults_fixed(void **state) {
    (void)state;
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    create_all_kinds(tp_create, 0, &cfg, "tp_create fixed 2", 3);
}

static void test_create_faults_elastic(void **state) {
    (void)state;
    tp_config cfg = {0};
    cfg.workers = 3;
    cfg.max_workers = 6;
    cfg.queue_capacity = 7;
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    create_all_kinds(tp_create, 0, &cfg, "tp_create elastic 3..6", 4);
}

static void test_create_faults_defaults(void **state) {
    (void)state;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned workers = n > 0 ? 4u * (unsigned)n : 4u;
    if (workers > 64) {
        print_message("%u default workers: the NULL-config case is covered by the others\n", workers);
        skip();
        return;
    }
    create_all_kinds(tp_create, 0, NULL, "tp_create NULL config", workers + 1);
}

static void test_default_create_faults(void **state) {
    (void)state;
    assert_null(tp_default());
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    create_all_kinds(create_default, 1, &cfg, "tp_default_create", 3);
    assert_null(tp_default());
    assert_int_equal(tp_default_submit(tpt_nop_task, NULL, NULL, NULL), TP_ENODEFAULT);
}

/* A worker that tp_create started runs no hook until every worker exists:
 * when a later one cannot be made, the create fails without waiting for
 * user code. (It waited for every started worker to exit, and each ran its
 * start hook first: a hook that waits for the application to have the
 * pool, or that calls tp_default_create -- whose lock the outer
 * tp_default_create holds across tp_create -- hung the create for good.)
 * The create runs on a thread of the test, so that a hang is a failed
 * bound here, not a stuck test. */
static tpt_latch app_has_pool;
static atomic_int waiting_starts, nested_rc;

static void start_waits_for_app(void *arg) {
    (void)arg;
    atomic_fetch_add(&waiting_starts, 1);
    tpt_latch_wait(&app_has_pool);
}

static void start_creates_default(void *arg) {
    (void)arg;
    atomic_fetch_add(&waiting_starts, 1);
    tp_config cfg = {0};
    cfg.workers = 1;
    atomic_store(&nested_rc, tp_default_create(&cfg)); /* one is registered, or being: never TP_OK */
}

typedef struct create_call {
    create_fn create;
    const tp_config *cfg;
    tp_pool *p;
    atomic_int rc, done;
} create_call;

static void *create_call_main(void *arg) {
    create_call *cc = arg;
    atomic_store(&cc->rc, cc->create(&cc->p, cc->cfg));
    atomic_store(&cc->done, 1);
    return NULL;
}

/* Create with the second worker's thread failing, on a thread of the test;
 * the answer once it returns (bounded). */
static int create_second_worker_fails(create_fn create, const tp_config *cfg) {
    static create_call cc;
    memset(&cc, 0, sizeof cc);
    cc.create = create;
    cc.cfg = cfg;
    atomic_store(&waiting_starts, 0);
    inj_reset();
    atomic_store(&fail_at[F_THREAD], 3); /* the service thread, worker 0, then worker 1 */
    atomic_store(&armed, 1);
    pthread_t th;
    assert_int_equal(__real_pthread_create(&th, NULL, create_call_main, &cc), 0);
    int returned = TPT_POLL(atomic_load(&cc.done) == 1, TPT_WAIT_NS);
    atomic_store(&armed, 0);
    if (!returned) fail_msg("tp_create never returned: its unwind waits for a start hook");
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&hits[F_THREAD]), 1);
    return atomic_load(&cc.rc);
}

static void test_create_fault_runs_no_hook(void **state) {
    (void)state;
    tpt_latch_init(&app_has_pool);
    snapshot before = snap();
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.on_worker_start = start_waits_for_app;
    cfg.on_worker_stop = on_stop;
    atomic_store(&hook_stops, 0);
    assert_int_equal(create_second_worker_fails(tp_create, &cfg), TP_ENOMEM);
    assert_int_equal(atomic_load(&waiting_starts), 0);
    assert_int_equal(atomic_load(&hook_stops), 0); /* no stop hook without its start */
    assert_back_to(&before, "a failed create whose hooks wait for the application");

    assert_null(tp_default());
    cfg.on_worker_start = start_creates_default;
    atomic_store(&nested_rc, INT_MIN);
    assert_int_equal(create_second_worker_fails(create_default, &cfg), TP_ENOMEM);
    assert_null(tp_default());
    assert_int_equal(atomic_load(&waiting_starts), 0);
    assert_int_equal(atomic_load(&nested_rc), INT_MIN);
    assert_back_to(&before, "a failed tp_default_create whose hooks call it");

    /* Without a fault the hooks run once the create has returned: they may
     * wait for the application to have the pool. */
    tp_pool *p = NULL;
    cfg.on_worker_start = start_waits_for_app;
    assert_int_equal(tp_create(&p, &cfg), TP_OK);
    TPT_EVENTUALLY(atomic_load(&waiting_starts) == 2);
    tpt_latch_open(&app_has_pool);
    use_and_destroy(p, 0);
    assert_int_equal(atomic_load(&hook_stops), 2);
    tpt_latch_destroy(&app_has_pool);
}

/* ------------------------------------------------------------ records */

#define NREC 4096
static tpt_done recs[NREC]; /* static: no allocation by the test while armed */
static tpt_latch *svc_gate; /* the running test's, from its fixture */
static atomic_int gate_done_calls;

/* on_done of the first cancelled task (tpt_hold_ending) */
static void gate_done(void *arg, int status) {
    (void)arg;
    (void)status;
    tpt_hold_ending(svc_gate, &gate_done_calls);
}

static int count_calls(int from, int to, int want_calls, int want_status) {
    int bad = 0;
    for (int i = from; i < to; i++)
        if (atomic_load(&recs[i].calls) != want_calls ||
            (want_calls && atomic_load(&recs[i].status) != want_status))
            bad++;
    return bad;
}

/* A pool of one worker and 4 places whose worker waits on *work_gate and
 * whose service thread is held in the first ending's on_done (svc_gate):
 * from then on, cancelled tasks with an on_done keep their records. */
static tp_pool *pool_with_held_service(tpt_fixture *f, tpt_latch **work_gate) {
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.queue_capacity = 4;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    *work_gate = tpt_fx_latch(f);
    svc_gate = tpt_fx_latch(f);
    tpt_fill_workers(p, *work_gate, 1, NULL);
    tpt_hold_service(p, svc_gate, gate_done);
    return p;
}

/* Submit (with on_done, recs[n] as arg) and cancel until a submit fails
 * (the caller armed the injector): the number accepted; *rc its answer. */
static int submit_cancel_until_refused(tp_pool *p, int *rc) {
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    int n = 0;
    *rc = TP_OK;
    for (; n < NREC - 8; n++) {
        *rc = tp_submit(p, tpt_nop_task, &recs[n], &o, &id);
        if (*rc != TP_OK) break;
        assert_int_equal(tp_cancel(p, id), TP_OK);
    }
    return n;
}

/* The preallocated records run out (submit_cancel_until_refused) with every
 * allocation failing from then on (armed: the caller disarms); returns the
 * records used, as submit_cancel_until_refused. */
static int records_run_out(tp_pool *p) {
    int rc;
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&fail_after[F_ALLOC], 1);
    atomic_store(&armed, 1);
    int n = submit_cancel_until_refused(p, &rc);
    assert_int_equal(rc, TP_ENOMEM);
    return n;
}

static void test_submit_record_growth_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(recs, 0, sizeof recs);
    atomic_store(&gate_done_calls, 0);
    snapshot before = snap();
    inj_reset();
    track_begin();
    tpt_latch *work_gate;
    tp_pool *p = pool_with_held_service(f, &work_gate);

    /* Cancelled tasks with an on_done now keep their records. Submit and
     * cancel until the preallocated records run out and the first growth
     * fails: TP_ENOMEM, counted as rejected_full, nothing reserved. */
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    int rc;
    tp_stats s0 = tpt_stats(p);
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&armed, 1);
    int n = submit_cancel_until_refused(p, &rc);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_ENOMEM);
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);
    assert_true(n >= 60); /* the preallocated records (4 x 5 + 64, less those in use) */
    tp_stats s1 = tpt_stats(p);
    tpt_assert_counts(s1, TPT_EQ(submitted, s0.submitted + (uint64_t)n + 1),
                      TPT_EQ(accepted, s0.accepted + (uint64_t)n),
                      TPT_EQ(rejected_full, s0.rejected_full + 1), TPT_EQ(queued, 0));
    assert_int_equal(atomic_load(&recs[n].calls), 0); /* refused: no on_done, ever */
    /* The same refusal from tp_submit_wait: TP_ENOMEM at once, not a wait. */
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&armed, 1);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, &recs[n], &o, TPT_WAIT_NS, NULL), TP_ENOMEM);
    atomic_store(&armed, 0);
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);

    /* Growth whose id-index resize fails: accepted, with longer chains. */
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 2);
    atomic_store(&armed, 1);
    rc = tp_submit(p, tpt_nop_task, &recs[n], &o, &id);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_OK);
    assert_int_equal(atomic_load(&calls[F_ALLOC]), 2); /* chunk, then index */
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);
    /* Lookups still find every task: cancel this one and queue more by id. */
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_ENOTFOUND);
    n++;
    int queued_from = n;
    uint64_t ids[4];
    for (int k = 0; k < 4; k++, n++)
        assert_int_equal(tp_submit(p, tpt_nop_task, &recs[n], &o, &ids[k]), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_EFULL);
    assert_int_equal(tp_cancel(p, ids[1]), TP_OK);
    assert_int_equal(tp_cancel(p, ids[3]), TP_OK);

    /* Release everything: every accepted task ends exactly once. */
    tpt_latch_open(svc_gate);
    tpt_latch_open(work_gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&gate_done_calls), 1);
    assert_int_equal(count_calls(0, queued_from, 1, TP_ECANCELED), 0);
    assert_int_equal(count_calls(queued_from, queued_from + 1, 1, 0), 0);
    assert_int_equal(count_calls(queued_from + 1, queued_from + 2, 1, TP_ECANCELED), 0);
    assert_int_equal(count_calls(queued_from + 2, queued_from + 3, 1, 0), 0);
    assert_int_equal(count_calls(queued_from + 3, queued_from + 4, 1, TP_ECANCELED), 0);
    tpt_assert_counts(s, TPT_EQ(rejected_full, 3), /* two ENOMEM, one EFULL */
                      TPT_EQ(succeeded, 3),        /* the blocker and two queued */
                      TPT_EQ(cancelled, (uint64_t)queued_from + 1 + 2));
    assert_int_equal(atomic_load(&work_gate->timeouts) + atomic_load(&svc_gate->timeouts), 0);
    assert_back_to(&before, "record growth");
    atomic_store(&tracking, 0);
}

/* A staged submit (src/stage.h: no lock; a plain one, and one whose only
 * options are an on_done bound to a completion queue) is accepted before
 * its record exists. When the records then cannot grow, it ends unrun,
 * counted as failed; the bound one's on_done gets TP_ENOMEM through its
 * queue, exactly once; its places come back. */
static atomic_int staged_runs;

static int staged_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add(&staged_runs, 1);
    return 0;
}

static void test_staged_record_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(recs, 0, sizeof recs);
    atomic_store(&gate_done_calls, 0);
    atomic_store(&staged_runs, 0);
    snapshot before = snap();
    inj_reset();
    track_begin();
    tp_cq *q = NULL;
    assert_int_equal(tp_cq_create(&q, 8), TP_OK);
    tpt_latch *work_gate;
    tp_pool *p = pool_with_held_service(f, &work_gate);

    /* The preallocated records run out (as above), and every allocation
     * fails from then on. */
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    int rc;
    int n = records_run_out(p);
    tp_stats s0 = tpt_stats(p);

    /* Accepted without the lock (nothing allocated yet). */
    assert_int_equal(tp_submit(p, staged_task, NULL, NULL, NULL), TP_OK);
    tp_task_opts bo = {0};
    bo.on_done = tpt_done_fn;
    bo.cq = q;
    assert_int_equal(tp_submit(p, staged_task, &recs[n + 1], &bo, NULL), TP_OK);
    tp_stats s1 = tpt_stats(p);
    tpt_assert_counts(s1, TPT_EQ(accepted, s0.accepted + 2), TPT_EQ(queued, 2));
    /* A locked submit admits them first: their records fail, they end. */
    rc = tp_submit(p, tpt_nop_task, &recs[n + 2], &o, &id);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_ENOMEM);
    assert_true(atomic_load(&hits[F_ALLOC]) >= 3);
    tp_stats s2 = tpt_stats(p);
    tpt_assert_counts(s2, TPT_EQ(accepted, s0.accepted + 2), TPT_EQ(queued, 0),
                      TPT_EQ(completed, s0.completed + 2), TPT_EQ(failed, s0.failed + 2),
                      TPT_EQ(cancelled, s0.cancelled), TPT_EQ(rejected_full, s0.rejected_full + 1));
    /* The bound one's on_done, through its queue, once, with TP_ENOMEM. */
    assert_int_equal(tp_cq_drain(q, 0), 1);
    assert_int_equal(atomic_load(&recs[n + 1].calls), 1);
    assert_int_equal(atomic_load(&recs[n + 1].status), TP_ENOMEM);
    assert_int_equal(tp_cq_drain(q, 0), 0);
    assert_int_equal(atomic_load(&recs[n + 2].calls), 0); /* refused */

    tpt_latch_open(svc_gate);
    tpt_latch_open(work_gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&staged_runs), 0);
    assert_int_equal(atomic_load(&recs[n + 1].calls), 1);
    tpt_assert_counts(s, TPT_EQ(failed, s.cancelled + 2), TPT_EQ(completed, s.accepted));
    assert_int_equal(tp_cq_destroy(q), TP_OK); /* every place came back */
    assert_int_equal(atomic_load(&work_gate->timeouts) + atomic_load(&svc_gate->timeouts), 0);
    assert_back_to(&before, "staged record growth");
    atomic_store(&tracking, 0);
}

/* A staged submit with a user whose record cannot be made when a worker
 * admits it (src/life.c, tp__life_staged_lost): it ends unrun, and its user
 * slot is given back -- the users gauge and tp_user_active say 0. The user
 * "x" has an idle entry first (a locked submit, cancelled), so that the
 * submit is staged. */
static void test_staged_user_record_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(recs, 0, sizeof recs);
    atomic_store(&gate_done_calls, 0);
    atomic_store(&staged_runs, 0);
    inj_reset();
    tpt_latch *work_gate;
    tp_pool *p = pool_with_held_service(f, &work_gate);
    tp_task_opts xo = {0};
    xo.user = "x";
    xo.on_done = tpt_done_fn;
    uint64_t xid = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, &recs[NREC - 1], &xo, &xid), TP_OK);
    assert_int_equal(tp_cancel(p, xid), TP_OK);
    assert_int_equal(tp_user_active(p, "x"), 0);
    int n = records_run_out(p);
    tp_task_opts uo = {0};
    uo.user = "x";
    assert_int_equal(tp_submit(p, staged_task, NULL, &uo, NULL), TP_OK); /* staged: no record needed yet */
    assert_int_equal(tpt_stats(p).users, 1);
    /* the locked submit admits the staged task first: its record fails */
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    uint64_t id = 0;
    int rc = tp_submit(p, tpt_nop_task, &recs[n + 2], &o, &id);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_ENOMEM);
    assert_int_equal(tpt_stats(p).users, 0);
    assert_int_equal(tp_user_active(p, "x"), 0);
    tpt_latch_open(svc_gate);
    tpt_latch_open(work_gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&staged_runs), 0);
    tpt_assert_counts(s, TPT_EQ(users, 0), TPT_EQ(completed, s.accepted));
}

/* ------------------------------------------------------------ users */

static int user_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 0;
}

static void test_submit_user_growth_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(recs, 0, sizeof recs);
    snapshot before = snap();
    inj_reset();
    track_begin();
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.queue_capacity = 64;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 1, NULL);

    /* 32 user entries are preallocated; hold them all with queued tasks. */
    char names[40][16];
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    for (int i = 0; i < 40; i++) snprintf(names[i], sizeof names[i], "user%02d", i);
    for (int i = 0; i < 32; i++) {
        o.user = names[i];
        assert_int_equal(tp_submit(p, user_task, &recs[i], &o, NULL), TP_OK);
    }
    assert_int_equal(tpt_stats(p).users, 32);

    /* The 33rd user needs a new chunk of entries: that failure refuses. */
    tp_stats s0 = tpt_stats(p);
    o.user = names[32];
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&armed, 1);
    int rc = tp_submit(p, user_task, &recs[32], &o, NULL);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_ENOMEM);
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);
    tp_stats s1 = tpt_stats(p);
    tpt_assert_counts(s1, TPT_EQ(submitted, s0.submitted + 1), TPT_EQ(accepted, s0.accepted),
                      TPT_EQ(rejected_full, s0.rejected_full + 1), TPT_EQ(queued, s0.queued),
                      TPT_EQ(users, 32));
    assert_int_equal(tp_user_active(p, names[32]), 0);
    /* An existing user needs no allocation: accepted while faults are armed. */
    o.user = names[0];
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&fail_after[F_ALLOC], 1);
    atomic_store(&armed, 1);
    rc = tp_submit(p, user_task, &recs[33], &o, NULL);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_OK);
    assert_int_equal(atomic_load(&calls[F_ALLOC]), 0);
    assert_int_equal(tp_user_active(p, names[0]), 2);

    /* The chunk is made but the bucket rehash fails: accepted, and every
     * user is still found (longer chains). */
    o.user = names[32];
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 2);
    atomic_store(&armed, 1);
    rc = tp_submit(p, user_task, &recs[34], &o, NULL);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_OK);
    assert_int_equal(atomic_load(&calls[F_ALLOC]), 2);
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);
    for (int i = 33; i < 40; i++) {
        o.user = names[i];
        assert_int_equal(tp_submit(p, user_task, &recs[i + 2], &o, NULL), TP_OK);
    }
    assert_int_equal(tpt_stats(p).users, 40);
    for (int i = 0; i < 40; i++) assert_int_equal(tp_user_active(p, names[i]), i == 0 ? 2u : 1u);
    o.user = names[0];
    assert_int_equal(tp_submit(p, user_task, NULL, &o, NULL), TP_EUSERLIMIT);

    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(count_calls(0, 32, 1, 0), 0);
    assert_int_equal(atomic_load(&recs[32].calls), 0); /* the refused one */
    assert_int_equal(count_calls(33, 42, 1, 0), 0);
    tpt_assert_counts(s, TPT_EQ(succeeded, 1 + 32 + 1 + 1 + 7), TPT_EQ(rejected_full, 1),
                      TPT_EQ(rejected_user, 1));
    assert_back_to(&before, "user growth");
    atomic_store(&tracking, 0);
}

/* ------------------------------------------------------------ elastic scale-up */

typedef struct erec {
    atomic_int calls, ran, status;
} erec;

static erec erecs[512];
static tpt_latch *egate; /* the running test's, from its fixture */

static tp_pool *epool;
static atomic_int blocker_rc;

static void elastic_done(void *arg, int status) {
    erec *r = arg;
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
}

/* erecs[1] fails its first attempt, after queueing erecs[0], which then keeps
 * the only worker busy: when the retry comes back to the queue, the service
 * thread finds a backlog and no idle worker, and tries to add one. */
static int elastic_task(tp_ctx *c, void *arg) {
    erec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    if (r == &erecs[0]) {
        tpt_latch_wait(egate);
    } else if (r == &erecs[1] && tp_ctx_attempt(c) == 0) {
        tp_task_opts o = {0};
        o.on_done = elastic_done;
        atomic_store(&blocker_rc, tp_submit(epool, elastic_task, &erecs[0], &o, NULL));
        return 1;
    }
    return 0;
}

static void test_elastic_spawn_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(erecs, 0, sizeof erecs);
    snapshot before = snap();
    inj_reset();
    track_begin();
    atomic_store(&hook_starts, 0);
    atomic_store(&hook_stops, 0);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 4;
    cfg.queue_capacity = 512;
    cfg.idle_timeout_ns = TP_FOREVER;
    cfg.max_retries = 1;
    cfg.retry_delay_ns = TPT_MS(5);
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    epool = p;
    atomic_store(&blocker_rc, 1);
    TPT_EVENTUALLY(tpt_stats(p).idle == 1);
    egate = tpt_fx_latch(f);

    /* From here every pthread_create fails: the service thread (a retry back
     * to a backlog) and submits try to add workers and cannot. */
    inj_reset();
    atomic_store(&fail_at[F_THREAD], 1);
    atomic_store(&fail_after[F_THREAD], 1);
    atomic_store(&armed, 1);
    tp_task_opts o = {0};
    o.on_done = elastic_done;
    assert_int_equal(tp_submit(p, elastic_task, &erecs[1], &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&egate->waiting) == 1);
    assert_int_equal(atomic_load(&blocker_rc), TP_OK);
    TPT_EVENTUALLY(atomic_load(&svc_hits) >= 1); /* the retry is back, no worker added */
    TPT_EVENTUALLY(tpt_stats(p).queued == 1);
    int n = 200;
    unsigned before_submits = atomic_load(&hits[F_THREAD]);
    for (int i = 2; i < n; i++) assert_int_equal(tp_submit(p, elastic_task, &erecs[i], &o, NULL), TP_OK);
    assert_true(atomic_load(&hits[F_THREAD]) >= before_submits + (unsigned)n - 2);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(workers, 1), TPT_EQ(active, 1), TPT_EQ(queued, (uint32_t)n - 1));
    /* The single worker drains everything, retries included. */
    tpt_latch_open(egate);
    TPT_EVENTUALLY(tpt_stats(p).completed == (uint64_t)n);
    /* A task is counted before its on_done runs (taskpool.h, tp_stats_get):
     * wait for the last on_done calls too, then check each ran once. */
    for (int i = 0; i < n; i++) TPT_EVENTUALLY(atomic_load(&erecs[i].calls) >= 1);
    unsigned failed_spawns = atomic_load(&hits[F_THREAD]);
    atomic_store(&armed, 0);
    s = tpt_stats(p);
    assert_int_equal(s.workers, 1);
    assert_int_equal(s.retried, 1);
    assert_int_equal(atomic_load(&hook_starts), 1);
    for (int i = 0; i < n; i++) {
        if (atomic_load(&erecs[i].calls) != 1 || atomic_load(&erecs[i].status) != 0)
            fail_msg("task %d: on_done %d times, status %d", i, atomic_load(&erecs[i].calls),
                     atomic_load(&erecs[i].status));
    }

    /* Threads can be made again: the pool grows to its maximum. */
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 4, NULL);
    assert_int_equal(tpt_stats(p).workers, 4);
    tpt_latch_open(gate);
    s = tpt_finish(p);
    assert_int_equal(s.completed, (uint64_t)n + 4);
    assert_int_equal(s.failed, 0);
    assert_int_equal(atomic_load(&hook_starts), 4);
    assert_int_equal(atomic_load(&hook_stops), 4);
    assert_back_to(&before, "elastic spawn faults");
    atomic_store(&tracking, 0);
    print_message("elastic: %u failed spawns (%u on the service thread), %d tasks on the one "
                  "worker\n",
                  failed_spawns, atomic_load(&svc_hits), n);
}

/* A worker slot whose elastic thread exited is joined before reuse; when the
 * new thread then cannot be made the slot must become free, not joined again
 * later (a double join), and the next spawn reuses it. */
static void test_elastic_respawn_fault(void **state) {
    tpt_fixture *f = tpt_fx(state);
    /* before tracking and arming: the test's own allocation is not the pool's */
    tpt_done *d = tpt_fx_array(f, tpt_done, 2);
    snapshot before = snap();
    inj_reset();
    track_begin();
    atomic_store(&hook_starts, 0);
    atomic_store(&hook_stops, 0);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TPT_MS(1);
    cfg.on_worker_start = on_start;
    cfg.on_worker_stop = on_stop;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *g1 = tpt_fx_latch(f);
    tpt_latch *g2 = tpt_fx_latch(f);
    tpt_fill_workers(p, g1, 2, NULL); /* grows to 2 */
    tpt_latch_open(g1);
    TPT_EVENTUALLY(atomic_load(&hook_stops) == 1); /* the elastic one idled out */
    TPT_EVENTUALLY(tpt_stats(p).workers == 1 && tpt_stats(p).idle == 1);

    tpt_fill_workers(p, g2, 1, NULL);
    inj_reset();
    atomic_store(&fail_at[F_THREAD], 1);
    atomic_store(&fail_after[F_THREAD], 1);
    atomic_store(&armed, 1);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[0], &o, NULL), TP_OK); /* join old, fail */
    atomic_store(&armed, 0);
    assert_int_equal(atomic_load(&hits[F_THREAD]), 1);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.workers, 1);
    assert_int_equal(s.queued, 1);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[1], &o, NULL), TP_OK); /* reuses the slot */
    TPT_EVENTUALLY(atomic_load(&d[0].calls) == 1 && atomic_load(&d[1].calls) == 1);
    assert_int_equal(atomic_load(&hook_starts), 3);
    tpt_latch_open(g2);
    s = tpt_finish(p);
    assert_int_equal(s.succeeded, 5);
    assert_int_equal(atomic_load(&hook_starts), 3);
    assert_int_equal(atomic_load(&hook_stops), 3);
    assert_back_to(&before, "respawn fault");
    atomic_store(&tracking, 0);
}

/* stats.workers counts live worker threads: not a spawn still under way (the
 * thread may never exist), nor one that failed. Regression: the reservation
 * was counted at once, so a reader saw 2 workers in a pool that never had
 * more than 1 thread. */
typedef struct spawn_sub {
    tp_pool *p;
    atomic_int rc, done;
} spawn_sub;

static void *spawn_submitter(void *arg) {
    spawn_sub *x = arg;
    atomic_store(&x->rc, tp_submit(x->p, tpt_nop_task, NULL, NULL, NULL)); /* wants a worker */
    atomic_store(&x->done, 1);
    return NULL;
}

/* A submit on a thread of its own that wants a worker; the spawn (failing
 * when `fail`) stalls in pthread_create until stall_spawn_end. */
static spawn_sub *stall_spawn_begin(tpt_fixture *f, tp_pool *p, int fail, pthread_t *th) {
    inj_reset();
    if (fail) {
        atomic_store(&fail_at[F_THREAD], 1);
        atomic_store(&armed, 1);
    }
    tpt_latch_init(&stall_gate);
    atomic_store(&stalled, 0);
    atomic_store(&stall_enabled, 1);
    spawn_sub *x = tpt_fx_new(f, spawn_sub);
    x->p = p;
    assert_int_equal(__real_pthread_create(th, NULL, spawn_submitter, x), 0);
    TPT_EVENTUALLY(atomic_load(&stalled) == 1); /* the spawn is under way */
    return x;
}

/* Let a stalled pthread_create go on, and stop stalling and failing later
 * ones. Also the file's teardown: a failed assert must not leave every later
 * pthread_create of the file stalled. */
static void stall_release(void) {
    atomic_store(&armed, 0); /* the stalled call decided whether to fail before it stalled */
    if (atomic_exchange(&stall_enabled, 0)) tpt_latch_open(&stall_gate);
}

static void stall_spawn_end(pthread_t th) {
    stall_release();
    pthread_join(th, NULL);
    tpt_latch_destroy(&stall_gate);
}

static int faults_teardown(void **state) {
    stall_release();
    return tpt_fixture_teardown(state);
}

static void stalled_spawn(tpt_fixture *f, tp_pool *p, int fail) {
    pthread_t th;
    spawn_sub *x = stall_spawn_begin(f, p, fail, &th);
    tp_stats s = tpt_stats(p);
    stall_spawn_end(th);
    assert_int_equal(atomic_load(&x->rc), TP_OK);
    assert_int_equal(atomic_load(&hits[F_THREAD]), fail ? 1u : 0u);
    if (s.workers != 1)
        fail_msg("%s spawn under way: stats.workers %u, but 1 worker thread exists", fail ? "a failing" : "a",
                 s.workers);
}

static void test_stats_workers_during_spawn(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TP_FOREVER;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 1, NULL);
    stalled_spawn(f, p, 1); /* fails: never a second thread */
    assert_int_equal(tpt_stats(p).workers, 1);
    stalled_spawn(f, p, 0); /* succeeds: counted once it runs */
    TPT_EVENTUALLY(tpt_stats(p).workers == 2 && tpt_stats(p).completed == 2);
    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 3);
}

/* An idle worker of an elastic pool must not count a spawn still under way
 * as one of the minimum: if that spawn then fails, the pool would be left
 * with no worker at all while tasks wait (found in review: workers=0 and a
 * queued task that only a forced shutdown ended). */
static void test_elastic_min_kept_while_spawn_fails(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TPT_MS(1); /* an idle elastic worker leaves at once */
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 1, NULL); /* worker A busy */

    /* A submit reserves worker B; its pthread_create stalls, then fails. */
    pthread_t th;
    spawn_sub *x = stall_spawn_begin(f, p, 1, &th);

    /* A runs out of work (its task, then the one that wanted B) and idles
     * while B is still "starting". Once A waits for work, give it 50 idle
     * timeouts to (wrongly) leave, checking all along: the absence of an
     * event can only be given a window. */
    tpt_latch_open(gate);
    TPT_EVENTUALLY(tpt_stats(p).completed == 2 && tpt_stats(p).idle == 1);
    uint64_t until = tp_now_ns() + 50 * cfg.idle_timeout_ns;
    while (tp_now_ns() < until) {
        assert_int_equal(tpt_stats(p).workers, 1);
        tpt_pause();
    }

    /* The spawn fails; a new task must still run. */
    stall_spawn_end(th);
    assert_int_equal(atomic_load(&x->rc), TP_OK);
    assert_int_equal(atomic_load(&hits[F_THREAD]), 1u);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(tpt_stats(p).completed == 3);
    assert_int_equal(tpt_stats(p).workers, 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 3);
}

/* A failed spawn while the pool closes: the reservation is undone and the
 * shutdown does not wait for a thread that never existed. */
static void test_elastic_spawn_fault_then_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    /* before tracking and arming: the test's own allocation is not the pool's */
    tpt_done *d = tpt_fx_array(f, tpt_done, 8);
    snapshot before = snap();
    inj_reset();
    track_begin();
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 3;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 1, NULL);
    inj_reset();
    atomic_store(&fail_at[F_THREAD], 1);
    atomic_store(&fail_after[F_THREAD], 1);
    atomic_store(&armed, 1);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    for (int i = 0; i < 7; i++) {
        o.user = i == 1 || i == 3 ? "odd" : NULL;
        assert_int_equal(tp_submit(p, tpt_nop_task, &d[i], &o, NULL), TP_OK);
    }
    o.user = "odd";
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[7], &o, NULL), TP_EUSERLIMIT);
    atomic_store(&armed, 0);
    assert_true(atomic_load(&hits[F_THREAD]) >= 2);
    assert_int_equal(tp_close(p), TP_OK);
    tpt_latch_open(gate);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 8);
    for (int i = 0; i < 7; i++) assert_int_equal(atomic_load(&d[i].calls), 1);
    assert_int_equal(atomic_load(&d[7].calls), 0);
    assert_back_to(&before, "spawn fault then shutdown");
    atomic_store(&tracking, 0);
}

/* ------------------------------------------------------------ tp_ctx_fd */

typedef struct fdrec {
    atomic_int first, second, third;
    atomic_int readable;
    tpt_latch *gate;
} fdrec;

static int fd_task(tp_ctx *c, void *arg) {
    fdrec *r = arg;
    atomic_store(&r->first, tp_ctx_fd(c)); /* the injected failure */
    atomic_store(&r->second, tp_ctx_fd(c));
    atomic_store(&r->third, tp_ctx_fd(c));
    if (r->gate) {
        tpt_latch_wait(r->gate);
        /* cancelled meanwhile: the descriptor made on retry reports it */
        struct pollfd pfd = {tp_ctx_fd(c), POLLIN, 0};
        atomic_store(&r->readable, pfd.fd >= 0 && poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN) &&
                                       tp_ctx_err(c) == TP_ECANCELED);
    }
    return 0;
}

static void test_ctx_fd_faults(void **state) {
    tpt_fixture *f = tpt_fx(state);
    fdrec *r = tpt_fx_new(f, fdrec); /* before tracking: not the pool's */
    snapshot before = snap();
    inj_reset();
    track_begin();
    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tpt_latch *gate = tpt_fx_latch(f);
    r->gate = gate;
    inj_reset();
    atomic_store(&fail_at[F_FD], 1);
    atomic_store(&armed, 1);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, fd_task, r, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    atomic_store(&armed, 0);
    assert_int_equal(atomic_load(&hits[F_FD]), 1);
    assert_int_equal(atomic_load(&r->first), TP_ENOMEM);
    assert_true(atomic_load(&r->second) >= 0);
    assert_int_equal(atomic_load(&r->third), atomic_load(&r->second));
    assert_int_equal(tp_cancel(p, id), TP_OK);
    tpt_latch_open(gate);
    TPT_EVENTUALLY(tpt_stats(p).completed == 1);
    assert_int_equal(atomic_load(&r->readable), 1);
    tpt_finish(p);
    assert_back_to(&before, "tp_ctx_fd faults"); /* the pipe is closed with the pool */
    atomic_store(&tracking, 0);
}

/* The wrappers really are in the path: a guard against a build that lost the
 * --wrap options (everything above would then pass vacuously). */
static void test_wrappers_active(void **state) {
    (void)state;
    inj_reset();
    atomic_store(&fail_at[F_ALLOC], 1);
    atomic_store(&fail_at[F_THREAD], 1);
    atomic_store(&fail_at[F_FD], 1);
    atomic_store(&fail_at[F_SYNC], 1);
    atomic_store(&armed, 1);
    tp_pool *p = NULL;
    int rc = tp_create(&p, NULL);
    atomic_store(&armed, 0);
    assert_int_equal(rc, TP_ENOMEM);
    assert_int_equal(atomic_load(&hits[F_ALLOC]), 1);
    assert_int_equal(hits_total(), 1); /* the first failure ends the create */
    inj_reset();
}

/* Runtimes may start helper threads lazily (ThreadSanitizer's background
 * thread comes with the first pthread_create): make one pool first, so that
 * the thread counts compared later are the test's alone. */
static int warm_up(void **state) {
    (void)state;
    tp_pool *p = NULL;
    if (tp_create(&p, NULL) != TP_OK) return -1;
    return tp_destroy(p) == TP_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_wrappers_active),
        TPT_TEST(test_create_faults_fixed),
        TPT_TEST(test_create_faults_elastic),
        TPT_TEST(test_create_faults_defaults),
        TPT_TEST(test_default_create_faults),
        TPT_TEST(test_create_fault_runs_no_hook),
        TPT_TEST(test_submit_record_growth_faults),
        TPT_TEST(test_staged_record_faults),
        TPT_TEST(test_staged_user_record_faults),
        TPT_TEST(test_submit_user_growth_faults),
        TPT_TEST(test_elastic_spawn_faults),
        TPT_TEST(test_elastic_respawn_fault),
        TPT_TEST(test_elastic_spawn_fault_then_shutdown),
        cmocka_unit_test_setup_teardown(test_stats_workers_during_spawn, tpt_fixture_setup, faults_teardown),
        cmocka_unit_test_setup_teardown(test_elastic_min_kept_while_spawn_fails, tpt_fixture_setup,
                                        faults_teardown),
        TPT_TEST(test_ctx_fd_faults),
    };
    return cmocka_run_group_tests(tests, warm_up, NULL);
}
