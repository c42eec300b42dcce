/*
 * base.h -- what every file of src/ uses: feature macros, asserts, the atomic
 * helpers of the statistics, time arithmetic, the lock wrapper and chunked
 * allocation. No state, no pool: everything here is inline or a macro (and
 * tp__assert_fail, in error.c).
 *
 * The files of src/ and who owns what are listed in pool.h, which also
 * holds the lock order.
 */
#ifndef TP_BASE_H
#define TP_BASE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "taskpool.h"

#define TP__UNUSED(x) ((void)(x))

/* ------------------------------------------------------------ asserts */

/*
 * TP__ASSERT(cond): checked unless NDEBUG is defined. CMake's Release and
 * RelWithDebInfo define NDEBUG, so an installed library pays nothing; Debug
 * builds, tests/run.sh (every mode replaces the RelWithDebInfo flags, dropping
 * -DNDEBUG) and the fuzzer check them. A failed one prints where and aborts:
 * an invariant of the pool is broken and going on could run a task twice or
 * lose one.
 */
#if !defined(NDEBUG)
#define TP__DEBUG 1
#endif

#if defined(TP__DEBUG)
void tp__assert_fail(const char *cond, const char *file, int line)
#if defined(__GNUC__)
    __attribute__((noreturn, cold))
#endif
    ;
#define TP__ASSERT(cond) ((cond) ? (void)0 : tp__assert_fail(#cond, __FILE__, __LINE__))
#else
#define TP__ASSERT(cond) ((void)0)
#endif

/* True when the n words of a public struct's reserved tail are all zero
 * (taskpool.h, "How the structs grow"). */
static inline bool tp__reserved_zero(const uint64_t *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != 0) return false;
    return true;
}
#define TP__RESERVED_ZERO(s) tp__reserved_zero((s)->reserved, sizeof(s)->reserved / sizeof(s)->reserved[0])

/* ------------------------------------------------------------ atomics */

/*
 * Statistics are written with the pool lock held, one writer at a time, so an
 * update is a relaxed load plus a release store (no locked read-modify-write);
 * readers load with acquire (TP__ACQUIRE) and so see every memory effect that
 * happened before the value they read was stored (taskpool.h, section 8).
 * TP__LOAD stays relaxed for the library's own polling, which re-checks under
 * the lock. On x86 all of them are plain moves.
 */
#define TP__LOAD(x)    atomic_load_explicit(&(x), memory_order_relaxed)
#define TP__SET(x, v)  atomic_store_explicit(&(x), (v), memory_order_release)
#define TP__ACQUIRE(x) atomic_load_explicit(&(x), memory_order_acquire)
#define TP__INC(x)     TP__SET(x, TP__LOAD(x) + 1)
#define TP__DEC(x)     TP__SET(x, TP__LOAD(x) - 1)

/* A pause in a spin loop. */
#if defined(__x86_64__) || defined(__i386__)
#define tp__cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tp__cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define tp__cpu_relax() ((void)0)
#endif

/* ------------------------------------------------------------ time */

/* now + ns, saturating; TP_FOREVER stays. */
static inline uint64_t tp__deadline_after(uint64_t now, uint64_t ns) {
    if (ns == TP_FOREVER || ns >= TP_FOREVER - now) return TP_FOREVER;
    return now + ns;
}

/* ------------------------------------------------------------ the lock */

/*
 * A mutex that knows, in debug builds, which thread holds it, so that a
 * function whose name ends in `_locked` can assert that its caller does
 * (TP__ASSERT_HELD). In release builds these are the bare pthread calls.
 * Every lock, unlock and condition wait of a pool goes through them.
 */
typedef struct tp__mutex {
    pthread_mutex_t m;
#if defined(TP__DEBUG)
    pthread_t owner; /* valid while held */
    bool held;
#endif
} tp__mutex;

/* Debug builds: record that this thread now holds mu (just locked, or
 * woken from a condition wait). */
static inline void tp__mutex_mark_held(tp__mutex *mu) {
#if defined(TP__DEBUG)
    TP__ASSERT(!mu->held);
    mu->owner = pthread_self();
    mu->held = true;
#else
    (void)mu;
#endif
}

static inline void tp__mutex_lock(tp__mutex *mu) {
    pthread_mutex_lock(&mu->m);
    tp__mutex_mark_held(mu);
}

static inline void tp__mutex_unlock(tp__mutex *mu) {
#if defined(TP__DEBUG)
    TP__ASSERT(mu->held && pthread_equal(mu->owner, pthread_self()));
    mu->held = false;
#endif
    pthread_mutex_unlock(&mu->m);
}

/* tp__mutex_lock after trying the lock up to `tries` times, a pause
 * between tries: for a lock whose holder keeps it for a system call or
 * less and whose waiter would otherwise sleep at once, so that the holder's
 * unlock must wake it (a futex system call on each side and a context
 * switch). Bounded: a holder that was preempted costs the waiter `tries`
 * pauses, then it sleeps as with tp__mutex_lock. */
static inline void tp__mutex_lock_spin(tp__mutex *mu, unsigned tries) {
    for (unsigned i = 0; i < tries; i++) {
        if (pthread_mutex_trylock(&mu->m) == 0) {
            tp__mutex_mark_held(mu);
            return;
        }
        tp__cpu_relax();
    }
    tp__mutex_lock(mu);
}

/* Only the holder reads `owner` here, so the check is race-free whenever it
 * passes. */
#if defined(TP__DEBUG)
#define TP__ASSERT_HELD(mu) TP__ASSERT((mu)->held &&pthread_equal((mu)->owner, pthread_self()))
#else
#define TP__ASSERT_HELD(mu) ((void)0)
#endif

/* Wait on cv (a condition of this mutex) until the absolute CLOCK_MONOTONIC
 * deadline; TP_FOREVER waits unbounded. Returns 0 or ETIMEDOUT (errno value).
 * The condition variables are made with tp__cond_init (CLOCK_MONOTONIC). */
static inline int tp__mutex_wait(tp__mutex *mu, pthread_cond_t *cv, uint64_t deadline) {
    TP__ASSERT_HELD(mu);
#if defined(TP__DEBUG)
    mu->held = false;
#endif
    int rc;
    if (deadline == TP_FOREVER) {
        rc = pthread_cond_wait(cv, &mu->m);
    } else {
        struct timespec ts;
        ts.tv_sec = (time_t)(deadline / 1000000000ull);
        ts.tv_nsec = (long)(deadline % 1000000000ull);
        rc = pthread_cond_timedwait(cv, &mu->m, &ts);
    }
    tp__mutex_mark_held(mu);
    return rc;
}

/* With `adaptive`, the mutex spins briefly before it sleeps (glibc's
 * adaptive mutex): only the staged submits' put lock (stage.h), held for a
 * dozen instructions by submitters and taken by a worker only to wait for
 * one; a plain put lock measured 1.3-1.9x slower per task in 1P W1 and
 * 2P W2 on the fifth machine (docs/performance.md). The pool's and a
 * completion queue's locks are plain (engine.c, make_sync). 0 or -1. */
static inline int tp__mutex_init(tp__mutex *mu, bool adaptive) {
#if defined(TP__DEBUG)
    mu->held = false;
#endif
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    if (adaptive) {
        pthread_mutexattr_t a;
        if (pthread_mutexattr_init(&a) != 0) return -1;
        int rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
        if (rc == 0) rc = pthread_mutex_init(&mu->m, &a);
        pthread_mutexattr_destroy(&a);
        return rc == 0 ? 0 : -1;
    }
#else
    (void)adaptive;
#endif
    return pthread_mutex_init(&mu->m, NULL) == 0 ? 0 : -1;
}

static inline void tp__mutex_destroy(tp__mutex *mu) { pthread_mutex_destroy(&mu->m); }

/* A condition variable on CLOCK_MONOTONIC. 0 or -1. */
static inline int tp__cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ large arrays */

/* Arrays of 2 MiB or more (the records of a large queue, its ring, the id
 * index, a completion queue's ring) start on a 2 MiB boundary and are marked
 * for transparent huge pages (madvise MADV_HUGEPAGE, where the system has
 * it): memory first touched under load (a deep queue reaching records and
 * slots it never used before) then costs one page fault per 2 MiB, not per
 * 4 KiB, and fewer TLB misses after. A page fault is a trap into the kernel,
 * dear on any machine and far dearer in a virtual machine: with a queue of
 * 300,000 the faults were most of the time per task. Nothing more is
 * touched: the padding (at most 2 MiB of address space) and pages never
 * reached stay unbacked; a huge page only forms where a whole aligned 2 MiB
 * lies inside the array, and the system falls back to small pages when it
 * has no huge one (or THP is off: then the hint does nothing). Smaller
 * arrays are only aligned. Memory still comes from malloc/calloc (the tests
 * interpose them). */
#define TP__HUGE ((size_t)2 << 20)

/* Bytes to add to an array of `len` bytes so that tp__big_place can align it
 * (to `align`, a power of two, or to 2 MiB for a large one). */
static inline size_t tp__big_pad(size_t len, size_t align) {
    return len >= TP__HUGE ? TP__HUGE - 1 : align - 1;
}

/* Where an array of `len` bytes starts inside `raw` (allocated with
 * tp__big_pad more bytes); marks a large one's whole 2 MiB pages. */
static inline void *tp__big_place(void *raw, size_t len, size_t align) {
    size_t to = len >= TP__HUGE ? TP__HUGE : align;
    uintptr_t at = ((uintptr_t)raw + to - 1) & ~(uintptr_t)(to - 1);
#if defined(MADV_HUGEPAGE)
    if (len >= TP__HUGE) (void)madvise((void *)at, len & ~(TP__HUGE - 1), MADV_HUGEPAGE); /* a hint only */
#endif
    return (void *)at;
}

/* `n` zeroed items of `size` bytes, on a cache line (2 MiB when large): the
 * pool, a queue, per-worker lines that must not share one, rings; *raw
 * receives what to free. NULL when out of memory (or n * size overflows). */
static inline void *tp__calloc_big(size_t n, size_t size, void **raw) {
    if (size && n > (SIZE_MAX - TP__HUGE) / size) return *raw = NULL;
    size_t len = n * size;
    *raw = calloc(1, len + tp__big_pad(len, 64));
    return *raw ? tp__big_place(*raw, len, 64) : NULL;
}

/* ------------------------------------------------------------ chunks */

/* Memory allocated in chunks and freed only with its owner (task records,
 * user entries). */
typedef struct tp__chunk {
    struct tp__chunk *next;
    void *items;          /* the first item */
    size_t n;             /* items */
    max_align_t align_[]; /* items follow */
} tp__chunk;

/* A chunk for `n` items of `size` bytes starting on an `align` boundary (a
 * cache line; 2 MiB for a large chunk, see tp__big_place), pushed on
 * `*list`; NULL when out of memory. malloc, not aligned_alloc, so that every
 * allocation of the library goes through malloc/calloc (the tests interpose
 * them). Not zeroed. *items receives the first item. */
static inline tp__chunk *tp__chunk_new(tp__chunk **list, size_t n, size_t size, size_t align, void **items) {
    if (size && n > (SIZE_MAX - sizeof(tp__chunk) - TP__HUGE) / size) return NULL;
    size_t len = n * size;
    tp__chunk *c = (tp__chunk *)malloc(sizeof(tp__chunk) + tp__big_pad(len, align) + len);
    if (!c) return NULL;
    c->next = *list;
    *list = c;
    c->items = tp__big_place(c->align_, len, align);
    c->n = n;
    *items = c->items;
    return c;
}

static inline void tp__chunks_free(tp__chunk **list) {
    while (*list) {
        tp__chunk *c = *list;
        *list = c->next;
        free(c);
    }
}

#endif /* TP_BASE_H */
