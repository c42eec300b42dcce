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

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <cmocka.h>

#include "taskpool.h"

/* Generous bound for anything that should happen "soon": sanitizers and a
 * loaded 2-core CI machine are slow, but a hang must still fail. */
#define TPT_WAIT_NS (20ull * 1000000000ull)
#define TPT_MS(x) ((uint64_t)(x) * 1000000ull)
#define TPT_S(x)  ((uint64_t)(x) * 1000000000ull)

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

#endif /* TP_TEST_H */
