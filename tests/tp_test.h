/*
 * tp_test.h -- shared helpers for the libtaskpool test executables.
 *
 * Synchronisation in tests is done with latches and with counters polled
 * against a deadline, never with sleeps chosen to be "long enough". Every wait
 * has its own bound (TPT_WAIT_NS by default) so a bug fails fast with a
 * message instead of hanging CTest.
 *
 * cmocka is not thread-safe: code running on pool threads records what it saw
 * in atomics, and only the main thread calls assert_*.
 */
#ifndef TP_TEST_H
#define TP_TEST_H

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "taskpool.h"

/* Generous bound for anything that should happen "soon": sanitizers and a
 * loaded 2-core CI machine are slow, but a hang must still fail. */
#define TPT_WAIT_NS (20ull * 1000000000ull)
#define TPT_MS(x)   ((uint64_t)(x)*1000000ull)
#define TPT_S(x)    ((uint64_t)(x)*1000000000ull)

/* 1 in a sanitized build (gcc and clang announce it differently): such builds
 * are several times slower, so loop counts shrink, and they own malloc. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TPT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define TPT_SANITIZED 1
#endif
#endif
#ifndef TPT_SANITIZED
#define TPT_SANITIZED 0
#endif

/* How many times slower than a plain build this run is: TP_TEST_SLOWDOWN from
 * the environment (run.sh sets it under valgrind, which runs one thread at a
 * time), else 1. Tests multiply the time constants that stand for "a while"
 * in their scenario (a retry delay, a slow thread start) by it; waits for a
 * state are bounded by TPT_WAIT_NS and need no scaling. */
static inline unsigned tpt_slowdown(void) {
    const char *e = getenv("TP_TEST_SLOWDOWN");
    int n = e ? atoi(e) : 1;
    return n > 0 ? (unsigned)n : 1u;
}

/* ------------------------------------------------------------ yielding */

static inline void tpt_pause(void) {
    /* A short real pause between polls (not a synchronisation device). */
    struct timespec ts = {0, 200000}; /* 200 us */
    nanosleep(&ts, NULL);
}

/* Poll `expr` until true or `ns` passed; evaluates to whether it became true. */
#define TPT_POLL(expr, ns)                                                                                   \
    __extension__({                                                                                          \
        uint64_t tpt_end_ = tp_now_ns() + (ns);                                                              \
        int tpt_ok_ = 0;                                                                                     \
        for (;;) {                                                                                           \
            if (expr) {                                                                                      \
                tpt_ok_ = 1;                                                                                 \
                break;                                                                                       \
            }                                                                                                \
            if (tp_now_ns() > tpt_end_) break;                                                               \
            tpt_pause();                                                                                     \
        }                                                                                                    \
        tpt_ok_;                                                                                             \
    })

/* Sleep `ns` in full, resuming after signals. Only to make an interleaving
 * likely or to let time pass; never to wait for a state. */
static inline void tpt_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Sleep until tp_now_ns() >= t, for tests about deadlines on that clock. */
static inline void tpt_sleep_until(uint64_t t) {
    while (tp_now_ns() < t) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Assert that `expr` becomes true within TPT_WAIT_NS. Main thread only. */
#define TPT_EVENTUALLY(expr)                                                                                 \
    do {                                                                                                     \
        if (!TPT_POLL(expr, TPT_WAIT_NS)) fail_msg("condition never became true: %s", #expr);                \
    } while (0)

/* ------------------------------------------------------------ latch */

/* A one-shot gate: tasks block in tpt_latch_wait() until tpt_latch_open().
 * Waiting is bounded (TPT_WAIT_NS) so a forgotten open cannot hang a test;
 * a timed-out wait is recorded in `timeouts`. */
typedef struct tpt_latch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
    atomic_int waiting;  /* threads currently inside tpt_latch_wait */
    atomic_int timeouts; /* waits that hit the bound (a test bug) */
} tpt_latch;

static inline void tpt_latch_init(tpt_latch *l) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->open = 0;
    atomic_init(&l->waiting, 0);
    atomic_init(&l->timeouts, 0);
}

static inline void tpt_latch_open(tpt_latch *l) {
    pthread_mutex_lock(&l->mu);
    l->open = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static inline void tpt_latch_wait(tpt_latch *l) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(TPT_WAIT_NS / 1000000000ull);
    atomic_fetch_add(&l->waiting, 1);
    pthread_mutex_lock(&l->mu);
    while (!l->open) {
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) != 0) {
            atomic_fetch_add(&l->timeouts, 1);
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    atomic_fetch_sub(&l->waiting, 1);
}

/* A latch used again (a scenario run once more): every waiter has left it
 * (asserted), it closes. */
static inline void tpt_latch_rearm(tpt_latch *l) {
    assert_int_equal(atomic_load(&l->waiting), 0);
    pthread_mutex_lock(&l->mu);
    l->open = 0;
    pthread_mutex_unlock(&l->mu);
}

static inline void tpt_latch_destroy(tpt_latch *l) {
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
}

/* A task body that blocks on the latch passed as arg, then succeeds. */
static inline int tpt_block_task(tp_ctx *c, void *arg) {
    (void)c;
    tpt_latch_wait((tpt_latch *)arg);
    return 0;
}

/* The body of an on_done that holds the thread running it (the service
 * thread, for a task that ended unrun) until `gate` opens, so that every
 * later ending on that thread keeps its record meanwhile; then counts. */
static inline void tpt_hold_ending(tpt_latch *gate, atomic_int *calls) {
    tpt_latch_wait(gate);
    atomic_fetch_add(calls, 1);
}

/* A task body that does nothing. */
static inline int tpt_nop_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 0;
}

/* A task body whose first n attempts fail (status 1), n = (uintptr_t)arg;
 * later attempts succeed: with max_retries >= n the task ends with 0. */
static inline int tpt_fail_attempts_task(tp_ctx *c, void *arg) {
    return tp_ctx_attempt(c) < (uintptr_t)arg ? 1 : 0;
}

/* tpt_fail_attempts_task with n = 1, whatever `arg` is: it stays free for
 * the task's on_done, which gets the same arg. */
static inline int tpt_fail_once_task(tp_ctx *c, void *arg) {
    (void)arg;
    return tpt_fail_attempts_task(c, (void *)(uintptr_t)1);
}

/* ------------------------------------------------------------ on_done record */

/* Counts on_done calls per task so tests can assert "exactly once". */
typedef struct tpt_done {
    atomic_int calls;
    atomic_int status;
} tpt_done;

static inline void tpt_done_fn(void *arg, int status) {
    tpt_done *d = (tpt_done *)arg;
    atomic_store(&d->status, status);
    atomic_fetch_add(&d->calls, 1);
}

/* ------------------------------------------------------------ stats */

static inline tp_stats tpt_stats(tp_pool *p) {
    tp_stats s;
    memset(&s, 0xab, sizeof s);
    tp_stats_get(p, &s);
    return s;
}

/* One expected field of a tp_stats, for tpt_assert_counts: TPT_EQ(field, value). */
typedef struct tpt_count {
    const char *name; /* the field's name; NULL ends a list */
    size_t off, size; /* where it is in tp_stats (uint64_t or uint32_t) */
    uint64_t want;
} tpt_count;

#define TPT_EQ(field, value)                                                                                 \
    { #field, offsetof(tp_stats, field), sizeof(((tp_stats *)0)->field), (uint64_t)(value) }

static inline void tpt_assert_counts_(const tp_stats *s, const char *expr, const tpt_count *want,
                                      const char *file, int line) {
    int bad = 0;
    for (; want->name != NULL; want++) {
        uint64_t v = 0;
        if (want->size == sizeof(uint32_t)) {
            uint32_t v32;
            memcpy(&v32, (const char *)s + want->off, sizeof v32);
            v = v32;
        } else if (want->size == sizeof(uint64_t)) {
            memcpy(&v, (const char *)s + want->off, sizeof v);
        } else {
            fail_msg("TPT_EQ(%s, ...): not a counter of tp_stats", want->name);
        }
        if (v != want->want) {
            print_error("%s.%s is %llu, expected %llu\n", expr, want->name, (unsigned long long)v,
                        (unsigned long long)want->want);
            bad = 1;
        }
    }
    if (bad) _fail(file, line);
}

/* Assert several fields of one stats snapshot `s` (a tp_stats value):
 *   tpt_assert_counts(s, TPT_EQ(accepted, 4), TPT_EQ(succeeded, 3), TPT_EQ(failed, 1));
 * Fields not named are not checked. Every field that differs is reported by
 * name with both values, then the test fails at the caller's line. Values
 * compare as uint64_t, as assert_int_equal compares them. */
#define tpt_assert_counts(s, ...)                                                                            \
    do {                                                                                                     \
        const tp_stats tpt_counts_s_ = (s);                                                                  \
        tpt_assert_counts_(&tpt_counts_s_, #s, (const tpt_count[]){__VA_ARGS__, {NULL, 0, 0, 0}}, __FILE__,  \
                           __LINE__);                                                                        \
    } while (0)

/* The at-rest invariants of taskpool.h section 8 (tp_stats_get). Call after tp_wait() returned. */
static inline void tpt_assert_at_rest(const tp_stats *s) {
    assert_int_equal(s->submitted, s->accepted + s->rejected);
    assert_int_equal(s->rejected,
                     s->rejected_full + s->rejected_user + s->rejected_closed + s->rejected_timeout);
    assert_int_equal(s->accepted, s->completed);
    assert_int_equal(s->completed, s->succeeded + s->failed);
    assert_true(s->cancelled <= s->failed);
    assert_true(s->expired <= s->cancelled);
    assert_true(s->started <= s->accepted);
    assert_int_equal(s->active, 0);
    assert_int_equal(s->queued, 0);
    assert_int_equal(s->delayed, 0);
    assert_int_equal(s->users, 0);
}

static inline void tpt_fx_forget(tp_pool *p); /* fixtures, below */

/* Shut `p` down, wait, check the at-rest invariants and destroy it (a
 * fixture that owned it no longer does). Returns the final stats for further
 * asserts. */
static inline tp_stats tpt_finish(tp_pool *p) {
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    tpt_fx_forget(p);
    assert_int_equal(tp_destroy(p), TP_OK);
    return s;
}

/* Shut down a pool whose drain the test forced (tp_shutdown returned
 * TP_ETIMEDOUT): tp_wait reports the same, then the at-rest invariants hold
 * and the pool is destroyed (and no longer owned by a fixture). Returns the
 * final stats. */
static inline tp_stats tpt_finish_forced(tp_pool *p) {
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    tpt_fx_forget(p);
    assert_int_equal(tp_destroy(p), TP_OK);
    return s;
}

/* ------------------------------------------------------------ pools */

/* A log hook that drops everything: failed and cancelled attempts are expected
 * in many tests and would only clutter stderr. */
static inline void tpt_quiet_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    (void)level;
    (void)log_id;
    (void)msg;
}

/* ------------------------------------------------------------ fixtures */

/*
 * The fixture of a test: everything a pool thread may touch lives here, on
 * the heap, never in the test function's stack frame. A failed assert_*
 * longjmps out of the test and leaves its frame dead while the pool's threads
 * still run; the teardown then ends them before the next test starts:
 *
 *   static void test_x(void **state) {
 *       tpt_fixture *f = tpt_fx(state);
 *       tpt_latch *l = tpt_fx_latch(f);         // closed; opened by the teardown
 *       tpt_done *d = tpt_fx_new(f, tpt_done);  // zeroed, freed by the teardown
 *       tp_pool *p = tpt_fx_pool(f, &cfg);      // tp_create that must succeed
 *       ...
 *       tp_stats s = tpt_finish(p);             // the normal end: asserts and frees
 *   }
 *   ... TPT_TEST(test_x), ...
 *
 * tpt_fixture_teardown always runs (cmocka calls it after a failed test too):
 * it opens every latch, closes every pool still owned, joins the threads the
 * test started with tpt_fx_thread and did not join (bounded), forces a
 * shutdown of the pools (budget TPT_FX_SHUTDOWN_NS), waits for their threads
 * (f->wait_ns), destroys them and frees the latches, the blocks and the
 * fixture. If a pool's threads do
 * not exit in time (a task that ignores cancellation), nothing is freed (the
 * threads may still use it), the teardown prints which pool and returns -1:
 * cmocka reports the test as failed instead of hanging, and later tests run.
 * The teardown may be called again once the task returned.
 *
 * Every test uses this style: TPT_TEST() to register, tpt_fx() for the
 * fixture, tpt_fx_latch / tpt_fx_new / tpt_fx_pool for anything the pool
 * touches, tpt_fx_thread / tpt_fx_join for a thread that races the pool, and
 * tpt_finish / tpt_finish_forced / tpt_destroy to end a pool (the fixture no
 * longer owns it then).
 */
#define TPT_FX_POOLS       8
#define TPT_FX_LATCHES     8
#define TPT_FX_THREADS     16
/* A failed test's pools are forced after this: cleanup, not a drain. */
#define TPT_FX_SHUTDOWN_NS TPT_MS(100)

typedef struct tpt_fx_block {
    struct tpt_fx_block *next;
    max_align_t data[]; /* the caller's zeroed memory */
} tpt_fx_block;

/* A thread the test started with tpt_fx_thread (a racing submitter, a
 * thread blocked in tp_shutdown ...): `done` tells the teardown it may join. */
typedef struct tpt_fx_thr {
    void *(*fn)(void *);
    void *arg;
    atomic_int done;
    int joined;
    pthread_t id;
} tpt_fx_thr;

typedef struct tpt_fixture {
    tp_pool *pools[TPT_FX_POOLS];        /* owned until finished; NULL: free slot */
    tpt_fx_thr *threads[TPT_FX_THREADS]; /* started by the test, in order */
    unsigned threads_used;
    tpt_latch latches[TPT_FX_LATCHES]; /* all initialised, closed */
    unsigned latches_used;             /* handed out by tpt_fx_latch */
    tpt_fx_block *blocks;              /* from tpt_fx_alloc */
    uint64_t wait_ns;                  /* teardown's bound on a pool's threads */
} tpt_fixture;

/* The fixture of the test running now (NULL between tests): tpt_finish,
 * tpt_finish_forced and tpt_destroy take their pool out of it, so that ending
 * a pool needs only the pool. One per executable. */
static inline tpt_fixture **tpt_fx_current_slot(void) {
    static tpt_fixture *current;
    return &current;
}

/* The fixture cmocka passes to a test registered with TPT_TEST. */
static inline tpt_fixture *tpt_fx(void **state) {
    tpt_fixture *f = (tpt_fixture *)*state;
    if (f == NULL) fail_msg("no fixture: register the test with TPT_TEST()");
    return f;
}

/* Zeroed memory that lives until the teardown has ended every pool. */
static inline void *tpt_fx_alloc(tpt_fixture *f, size_t size) {
    tpt_fx_block *b = (tpt_fx_block *)calloc(1, sizeof *b + size);
    assert_non_null(b);
    b->next = f->blocks;
    f->blocks = b;
    return b->data;
}
#define tpt_fx_new(f, T)      ((T *)tpt_fx_alloc((f), sizeof(T)))
#define tpt_fx_array(f, T, n) ((T *)tpt_fx_alloc((f), sizeof(T) * (size_t)(n)))

/* The next closed latch of the fixture. */
static inline tpt_latch *tpt_fx_latch(tpt_fixture *f) {
    if (f->latches_used >= TPT_FX_LATCHES) fail_msg("more than %d latches in one test", TPT_FX_LATCHES);
    return &f->latches[f->latches_used++];
}

static inline void *tpt_fx_thr_main(void *a) {
    tpt_fx_thr *t = (tpt_fx_thr *)a;
    void *r = t->fn(t->arg);
    atomic_store(&t->done, 1);
    return r;
}

/* pthread_create(fn, arg) that must succeed; the teardown joins the thread
 * (bounded) if the test did not, before it ends the pools the thread may
 * still be calling. `arg` must outlive the test: fixture memory. */
static inline tpt_fx_thr *tpt_fx_thread(tpt_fixture *f, void *(*fn)(void *), void *arg) {
    if (f->threads_used >= TPT_FX_THREADS) fail_msg("more than %d threads in one test", TPT_FX_THREADS);
    tpt_fx_thr *t = tpt_fx_new(f, tpt_fx_thr);
    t->fn = fn;
    t->arg = arg;
    assert_int_equal(pthread_create(&t->id, NULL, tpt_fx_thr_main, t), 0);
    f->threads[f->threads_used++] = t;
    return t;
}

/* pthread_join for a thread from tpt_fx_thread. */
static inline void tpt_fx_join(tpt_fx_thr *t) {
    assert_false(t->joined);
    t->joined = 1;
    assert_int_equal(pthread_join(t->id, NULL), 0);
}

/* The fixture owns `p` from now on (its teardown ends it if the test does not). */
static inline void tpt_fx_adopt(tpt_fixture *f, tp_pool *p) {
    for (int i = 0; i < TPT_FX_POOLS; i++) {
        if (f->pools[i] == NULL) {
            f->pools[i] = p;
            return;
        }
    }
    (void)tp_destroy(p);
    fail_msg("more than %d pools in one test", TPT_FX_POOLS);
}

/* tp_create(cfg) that must succeed, owned by the fixture. */
static inline tp_pool *tpt_fx_pool(tpt_fixture *f, const tp_config *cfg) {
    tp_pool *p = NULL;
    assert_int_equal(tp_create(&p, cfg), TP_OK);
    assert_non_null(p);
    tpt_fx_adopt(f, p);
    return p;
}

/* A configuration whose log hook drops everything (tpt_quiet_log): `workers`
 * workers, room for `cap` waiting tasks, `per_user` slots per user, each 0
 * for the library's default. For a test that sets more fields itself. */
static inline tp_config tpt_quiet_config(unsigned workers, unsigned cap, unsigned per_user) {
    tp_config c = {0};
    c.log = tpt_quiet_log; /* cancelled and failed attempts are expected */
    c.workers = workers;
    c.queue_capacity = cap;
    c.max_per_user = per_user;
    return c;
}

/* tpt_fx_pool of tpt_quiet_config(workers, cap, per_user). */
static inline tp_pool *tpt_quiet_pool(tpt_fixture *f, unsigned workers, unsigned cap, unsigned per_user) {
    tp_config c = tpt_quiet_config(workers, cap, per_user);
    return tpt_fx_pool(f, &c);
}

/* The test is about to end `p` itself: the fixture of the running test (if
 * any) no longer owns it. */
static inline void tpt_fx_forget(tp_pool *p) {
    tpt_fixture *f = *tpt_fx_current_slot();
    if (f == NULL) return;
    for (int i = 0; i < TPT_FX_POOLS; i++)
        if (f->pools[i] == p) f->pools[i] = NULL;
}

static inline int tpt_fixture_setup(void **state) {
    if (tp_default() != NULL) { /* the previous teardown clears it */
        printf("[  ERROR   ] setup: a default pool is registered before the test\n");
        return -1;
    }
    tpt_fixture *f = (tpt_fixture *)calloc(1, sizeof *f);
    if (f == NULL) return -1;
    for (int i = 0; i < TPT_FX_LATCHES; i++) tpt_latch_init(&f->latches[i]);
    /* longer than a latch's own bound: a task on a latch the fixture does
     * not own still returns in time */
    f->wait_ns = 2 * TPT_WAIT_NS;
    *state = f;
    *tpt_fx_current_slot() = f;
    return 0;
}

/* Ends one pool the test left behind; 0, or -1 if its threads still run. */
static inline int tpt_fx_end_pool(tpt_fixture *f, tp_pool *p) {
    (void)tp_shutdown(p, TPT_FX_SHUTDOWN_NS); /* OK, or TP_ETIMEDOUT: forced */
    (void)tp_wait(p, f->wait_ns);             /* forced reads TP_ETIMEDOUT too */
    tp_stats s = tpt_stats(p);
    if (s.workers != 0 || s.active != 0) {
        printf("[  LEAK    ] teardown: pool %p still has %llu worker(s), %llu task(s) "
               "running after %llu ms (a task ignores cancellation?); not freed\n",
               (void *)p, (unsigned long long)s.workers, (unsigned long long)s.active,
               (unsigned long long)(f->wait_ns / 1000000u));
        fflush(stdout);
        return -1;
    }
    return tp_destroy(p) == TP_OK ? 0 : -1;
}

static inline int tpt_fx_pools_left(const tpt_fixture *f) {
    for (int i = 0; i < TPT_FX_POOLS; i++)
        if (f->pools[i] != NULL) return 1;
    return 0;
}

static inline int tpt_fixture_teardown(void **state) {
    tpt_fixture *f = (tpt_fixture *)*state;
    if (f == NULL) return 0;
    for (int i = 0; i < TPT_FX_LATCHES; i++) tpt_latch_open(&f->latches[i]);
    /* A default pool still registered is this test's too (tests start without
     * one): unregister it, end it with the others, and report it. */
    tp_pool *dflt = tp_default_swap(NULL);
    int owned = dflt == NULL;
    for (int i = 0; i < TPT_FX_POOLS && !owned; i++) owned = f->pools[i] == dflt;
    for (int i = 0; i < TPT_FX_POOLS && !owned; i++) {
        if (f->pools[i] == NULL) {
            f->pools[i] = dflt;
            owned = 1;
        }
    }
    if (!owned) /* no free slot: leak it rather than lose track of threads */
        printf("[  LEAK    ] teardown: no slot for the default pool %p\n", (void *)dflt);
    /* Closing wakes the test's threads blocked in tp_submit_wait and refuses
     * their submits: join them (bounded) before any pool is destroyed. */
    for (int i = 0; i < TPT_FX_POOLS; i++)
        if (f->pools[i] != NULL) (void)tp_close(f->pools[i]);
    int rc = 0;
    for (unsigned i = 0; i < f->threads_used; i++) {
        tpt_fx_thr *t = f->threads[i];
        if (t->joined) continue;
        if (TPT_POLL(atomic_load(&t->done), f->wait_ns)) {
            t->joined = 1;
            (void)pthread_join(t->id, NULL);
        } else {
            printf("[  LEAK    ] teardown: a thread of the test still runs after %llu ms; "
                   "its pools are left alone\n",
                   (unsigned long long)(f->wait_ns / 1000000u));
            rc = -1;
        }
    }
    if (rc != 0) return -1; /* it may still call a pool: keep everything */
    for (int i = 0; i < TPT_FX_POOLS; i++) {
        if (f->pools[i] == NULL) continue;
        if (tpt_fx_end_pool(f, f->pools[i]) == 0)
            f->pools[i] = NULL;
        else
            rc = -1;
    }
    if (dflt != NULL) {
        printf("[  ERROR   ] teardown: the test left a default pool registered\n");
        rc = -1;
    }
    if (rc != 0 && (!owned || tpt_fx_pools_left(f)))
        return -1; /* threads may still use the fixture: keep all of it */
    for (int i = 0; i < TPT_FX_LATCHES; i++) tpt_latch_destroy(&f->latches[i]);
    while (f->blocks != NULL) {
        tpt_fx_block *b = f->blocks;
        f->blocks = b->next;
        free(b);
    }
    if (*tpt_fx_current_slot() == f) *tpt_fx_current_slot() = NULL;
    free(f);
    *state = NULL;
    return rc;
}

/* ------------------------------------------------------------ timed scenarios */

/* A scenario that needs the pool to reach a state within a short time -- a
 * task that starts before a deadline a few hundred milliseconds away, two
 * tasks that wait for their retries at once -- cannot hold on a machine that
 * stalls the process longer (a sanitizer on a loaded CI runner). Such a
 * scenario looks: when the state was not reached in time it lets everything
 * end, finishes its pool and returns false, and runs again on a fresh pool
 * with twice the time, five times at most. What it asserts once the state
 * was reached does not depend on the machine's speed. `arg` is the test's
 * (latches to rearm, records to reset). */
typedef bool (*tpt_timed_fn)(tpt_fixture *f, uint64_t span, void *arg);

static inline void tpt_with_time_to_spare(tpt_fixture *f, uint64_t span, tpt_timed_fn run, void *arg) {
    for (int i = 0; i < 5; i++, span *= 2)
        if (run(f, span, arg)) return;
    fail_msg("the scenario's state was never reached in time (%llu ms at last)",
             (unsigned long long)(span / 2 / TPT_MS(1)));
}

/* The time left until `t` on tp_now_ns()'s clock, 0 once it passed: the
 * bound of a poll for a state that only counts before `t`. */
static inline uint64_t tpt_left_until(uint64_t t) {
    uint64_t now = tp_now_ns();
    return t > now ? t - now : 0;
}

/* Register a test with the fixture. */
#define TPT_TEST(fn) cmocka_unit_test_setup_teardown(fn, tpt_fixture_setup, tpt_fixture_teardown)

/* tp_destroy() that must succeed, for a pool the test ended itself (or one
 * whose destroy is under test); the fixture no longer owns `p`. */
static inline void tpt_destroy(tp_pool *p) {
    tpt_fx_forget(p);
    assert_int_equal(tp_destroy(p), TP_OK);
}

/* Submit `n` tasks blocked on `l` (as `user`, or none if NULL) and wait until
 * they all run: stats.active == n and each is inside the latch, so "workers
 * busy" is a state the test built, not an interleaving it hoped for. */
static inline void tpt_fill_workers(tp_pool *p, tpt_latch *l, unsigned n, const char *user) {
    int before = atomic_load(&l->waiting);
    for (unsigned i = 0; i < n; i++) {
        tp_task_opts o = {0};
        o.user = user;
        assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
        /* one at a time: the queue may be smaller than n */
        TPT_EVENTUALLY(atomic_load(&l->waiting) == before + (int)i + 1);
    }
    TPT_EVENTUALLY(tpt_stats(p).active == n && tpt_stats(p).queued == 0);
}

/* Hold the thread that runs the endings of unrun tasks (the service thread)
 * in `done`, an on_done that waits on `gate` (tpt_hold_ending): a task
 * submitted with it is cancelled while queued (every worker must be held,
 * so that it is) and the call returns once the thread waits on the gate.
 * Until it opens, every later ending keeps its record. */
static inline void tpt_hold_service(tp_pool *p, tpt_latch *gate, tp_done_fn done) {
    tp_task_opts o = {0};
    o.on_done = done;
    uint64_t id = 0;
    int before = atomic_load(&gate->waiting);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, &id), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == before + 1);
}

/* ------------------------------------------------------------ racing threads */

/* A small deterministic PRNG for per-thread choices (never returns 0). */
static inline uint32_t tpt_xorshift(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x ? x : 0x9e3779b9u;
}

/* Spin until `go` is set (a start line for racing threads), at most
 * TPT_WAIT_NS; the caller's checks fail if the race never started. */
static inline void tpt_wait_go(atomic_int *go) {
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(go) && tp_now_ns() < end) sched_yield();
}

/* What submitting threads saw, by return code, to compare with the stats. */
typedef struct tpt_tally {
    uint64_t ok, full, user, closed, timedout, bad, total;
    int last_bad;
} tpt_tally;

static inline void tpt_tally_add(tpt_tally *t, int rc) {
    t->total++;
    switch (rc) {
    case TP_OK: t->ok++; break;
    case TP_EFULL: t->full++; break;
    case TP_EUSERLIMIT: t->user++; break;
    case TP_ECLOSED: t->closed++; break;
    case TP_ETIMEDOUT: t->timedout++; break;
    default:
        t->bad++;
        t->last_bad = rc;
        break;
    }
}

static inline void tpt_tally_merge(tpt_tally *into, const tpt_tally *t) {
    into->ok += t->ok;
    into->full += t->full;
    into->user += t->user;
    into->closed += t->closed;
    into->timedout += t->timedout;
    into->bad += t->bad;
    into->total += t->total;
    if (t->bad) into->last_bad = t->last_bad;
}

/* ------------------------------------------------------------ process state */

/* Entries of a directory such as /proc/self/task or /proc/self/fd ("." and
 * ".." excluded; opendir's own descriptor counts in /proc/self/fd); -1 if
 * unreadable. */
static inline int tpt_count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

#endif /* TP_TEST_H */
