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
#define TPT_MS(x) ((uint64_t)(x) * 1000000ull)
#define TPT_S(x)  ((uint64_t)(x) * 1000000000ull)

/* 1 in a sanitized build (gcc and clang announce it differently): such builds
 * are several times slower, so loop counts shrink, and they own malloc. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TPT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) ||                 \
    __has_feature(memory_sanitizer)
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
#define TPT_POLL(expr, ns)                                                     \
    __extension__({                                                            \
        uint64_t tpt_end_ = tp_now_ns() + (ns);                                \
        int tpt_ok_ = 0;                                                       \
        for (;;) {                                                             \
            if (expr) { tpt_ok_ = 1; break; }                                  \
            if (tp_now_ns() > tpt_end_) break;                                 \
            tpt_pause();                                                       \
        }                                                                      \
        tpt_ok_;                                                               \
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
#define TPT_EVENTUALLY(expr)                                                   \
    do {                                                                       \
        if (!TPT_POLL(expr, TPT_WAIT_NS))                                      \
            fail_msg("condition never became true: %s", #expr);                \
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

/* A task body that does nothing. */
static inline int tpt_nop_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 0;
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

/* The at-rest invariants of SPEC section 7. Call after tp_wait() returned. */
static inline void tpt_assert_at_rest(const tp_stats *s) {
    assert_int_equal(s->submitted, s->accepted + s->rejected);
    assert_int_equal(s->rejected, s->rejected_full + s->rejected_user +
                                      s->rejected_closed + s->rejected_timeout);
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

/* Shut `p` down (budget TP_FOREVER unless told), wait, check the at-rest
 * invariants and destroy it. Returns the final stats for further asserts. */
static inline tp_stats tpt_finish(tp_pool *p) {
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
    assert_int_equal(tp_destroy(p), TP_OK);
    return s;
}

/* Shut down a pool whose drain the test forced (tp_shutdown returned
 * TP_ETIMEDOUT): tp_wait reports the same, then the at-rest invariants hold
 * and the pool is destroyed. Returns the final stats. */
static inline tp_stats tpt_finish_forced(tp_pool *p) {
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_ETIMEDOUT);
    tp_stats s = tpt_stats(p);
    tpt_assert_at_rest(&s);
    assert_int_equal(s.workers, 0);
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

/* Pools made by tpt_pool_new and not yet ended by tpt_pool_finish or
 * tpt_pool_destroy, and whether a test left one running. One per executable
 * (a function-local static, so a file that does not use it pays nothing). */
typedef struct tpt_guard_state {
    atomic_int live_pools;
    atomic_int poisoned;
} tpt_guard_state;

static inline tpt_guard_state *tpt_guard_state_get(void) {
    static tpt_guard_state g;
    return &g;
}

/* tp_create(cfg) that must succeed; the pool counts as live until
 * tpt_pool_finish / tpt_pool_destroy (only the guard below reads the count). */
static inline tp_pool *tpt_pool_new(const tp_config *cfg) {
    tp_pool *p = NULL;
    assert_int_equal(tp_create(&p, cfg), TP_OK);
    assert_non_null(p);
    atomic_fetch_add(&tpt_guard_state_get()->live_pools, 1);
    return p;
}

/* tpt_finish() for a pool from tpt_pool_new: it is no longer live. */
static inline tp_stats tpt_pool_finish(tp_pool *p) {
    tp_stats s = tpt_finish(p);
    atomic_fetch_sub(&tpt_guard_state_get()->live_pools, 1);
    return s;
}

/* tp_destroy() that must succeed, for a pool from tpt_pool_new. */
static inline void tpt_pool_destroy(tp_pool *p) {
    assert_int_equal(tp_destroy(p), TP_OK);
    atomic_fetch_sub(&tpt_guard_state_get()->live_pools, 1);
}

/* Setup/teardown pair for cmocka_unit_test_setup_teardown. A failed assert
 * longjmps out of a test and leaves its pool running, its threads still
 * pointing into the dead stack frame (latches, records); the next test would
 * reuse that memory and could hang or corrupt. So the teardown notes a pool
 * still live and the next test's setup stops the executable, after cmocka
 * printed the failure. */
static inline int tpt_guard_teardown(void **state) {
    (void)state;
    tpt_guard_state *g = tpt_guard_state_get();
    if (atomic_load(&g->live_pools) != 0)
        atomic_store(&g->poisoned, 1);
    return 0;
}

static inline int tpt_guard_setup(void **state) {
    (void)state;
    if (atomic_load(&tpt_guard_state_get()->poisoned)) {
        /* cmocka has printed the previous test's failure by now */
        printf("[  ABORT   ] a failed test left its pool running; stopping here "
               "(later tests would share its threads and dead stack memory)\n");
        fflush(stdout);
        fflush(stderr);
        _exit(1);
    }
    return 0;
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
    while (!atomic_load(go) && tp_now_ns() < end)
        sched_yield();
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
    default: t->bad++; t->last_bad = rc; break;
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
    if (t->bad)
        into->last_bad = t->last_bad;
}

/* ------------------------------------------------------------ process state */

/* Entries of a directory such as /proc/self/task or /proc/self/fd ("." and
 * ".." excluded; opendir's own descriptor counts in /proc/self/fd); -1 if
 * unreadable. */
static inline int tpt_count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

#endif /* TP_TEST_H */
