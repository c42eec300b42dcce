/*
 * internal.h -- the private shapes of libtaskpool, shared by src/ only.
 *
 * Layers (top to bottom). A file calls only tp__ functions of files in lower
 * layers, never of its own layer or above; tests/check_layers.sh checks it on
 * the built library. Data flows one way: the public API and the pool's
 * threads drive the task life, which uses the leaf structures.
 *
 *   0  compat.c   the 1.0 entry points of the calls whose structs grew
 *                 (shared library only; calls public functions only)
 *   1  group.c    task groups (since 1.1): create, wait, cancel, destroy;
 *                 submits through pool.c's admission, members live in life.c
 *      metrics.c  tp_metrics_format (since 1.1): public calls and tp__put
 *   2  pool.c     the public API: create/destroy, submit, cancel,
 *                 close/shutdown/wait; the resolved configuration
 *      stats.c    tp_stats_get, tp_user_active, tp_stats_format
 *      default.c  the process-wide default pool (public calls only)
 *   3  service.c  the service thread: drives endings, retry timers, queue
 *                 deadlines (life.c) and spawns a worker when one was skipped
 *   4  worker.c   worker slots, spawning, the worker loop: wait for work,
 *                 then pop, start, run, after-run, finish (life.c steps)
 *   5  life.c     the task's life and the queue, the one owner of the task
 *                 state graph: admission into the ring, start, after-run
 *                 (retry or final), finalise, end unrun, retire, cancel,
 *                 forced shutdown, the delayed and endings lists, queue expiry,
 *                 group membership (first error, cancel on error),
 *                 and the wake-ups that follow (room, work, done, service)
 *   6  ctx.c      the task context and its cancel pipe, log ids, logging,
 *                 the thread-locals
 *      tasks.c    task records: a free list grown in chunks, the id index
 *      users.c    per-user slot table
 *      ring.h     bounded FIFO of task pointers (inline functions)
 *      hist.c     latency histograms: bounds, snapshots, quantiles (since
 *                 1.1; recording is inline in hist.h, called by worker.c)
 *   7  clock.c    tp_now_ns, and the histograms' clock: TSC ticks calibrated
 *                 once per process, else CLOCK_MONOTONIC (stamps inline in
 *                 clock.h)
 *      error.c    error table, tp_strerror, version, tp__assert_fail
 *      text.c     tp__put: snprintf into a running position (the formats)
 *
 * Why the threads sit above life.c: a worker or the service thread is a
 * driver of task life (it pops, starts, finalises and retires through
 * life.c), just as the API is; life.c never calls back into them, it only
 * signals their condition variables.
 *
 * Locking
 *   One mutex per pool, `tp_pool.mu`, guards everything in the pool except the
 *   statistics (atomics), the worker's context `cancelled` flag (atomic,
 *   written under mu, read lock-free by the task) and `life.adm`, the
 *   admission word (atomic, written under mu, read lock-free by
 *   tp__admit_full_fast to refuse a full queue without the lock); besides,
 *   `fast_full` is an atomic counter that refused submitters add to without
 *   the lock, and each worker slot's histogram shard (hist.h) is written by
 *   that slot's worker alone and read lock-free by tp_hist_get. Every lock, unlock and wait
 *   goes through tp__lock/tp__unlock/tp__wait_locked; a function whose name
 *   ends in `_locked` needs mu held (asserted in debug builds) and, where it
 *   says so, releases it around user code.
 *   Lock order: the default-pool registry lock (default.c) is taken before a
 *   pool lock (tp_default_create -> tp_create) and never inside one; no pool
 *   lock is ever held while calling user code (task functions, on_done, log
 *   hook, worker hooks) or while taking another pool's lock. No other lock
 *   exists, so there is no order between pool-internal locks to keep.
 *
 *   Condition variables, one per condition, all on `mu`, all CLOCK_MONOTONIC:
 *     work_cv   a worker may have work, or may exit          (idle workers)
 *     room_cv   queue space or a user slot may be free, or closed (tp_submit_wait)
 *     done_cv   inflight reached 0 or a thread exited        (shutdown, wait)
 *     svc_cv    an ending or a retry timer for the service thread
 *     worker.sleep_cv  a running task's tp_ctx_sleep: cancelled
 *   All but sleep_cv are signalled by life.c (and done_cv by worker.c when a
 *   spawn fails, by pool.c between shutdown callers).
 *
 * Task life (state in tp__task.state, all transitions under mu, in life.c)
 *   QUEUED -> RUNNING -> (DELAYED -> QUEUED ...) -> DONE -> FREE
 *   QUEUED/DELAYED -> ENDING -> FREE (cancel, forced shutdown, deadline)
 *   QUEUED -> DONE (expired when a worker pops it)
 *   A task is *finalised* exactly once: removed from the id index, user slot
 *   released, counters updated. Then exactly one thread calls its on_done:
 *   the worker that finalised it (DONE) or the service thread (ENDING). After
 *   on_done returns, that thread retires the record (FREE) and decrements
 *   `inflight`. Each step asserts the state it comes from.
 *
 *   Ending a task may end others in the same lock hold: a failing member of a
 *   TP_GROUP_CANCEL_ON_ERROR group cancels its group at once (life.c). So
 *   code that walks the ring or the delayed list does not keep a pointer into
 *   it across a call that ends a task, and a QUEUED task taken out of the
 *   ring is ended by whoever took it out (a group's cancel passes it by).
 */
#ifndef TP_INTERNAL_H
#define TP_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "taskpool.h"

#define TP__UNUSED(x) ((void)(x))

/* True when the n words of a public struct's reserved tail are all zero
 * (taskpool.h, "How the structs grow"). */
static inline bool tp__reserved_zero(const uint64_t *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != 0) return false;
    return true;
}
#define TP__RESERVED_ZERO(s) tp__reserved_zero((s)->reserved, sizeof(s)->reserved / sizeof(s)->reserved[0])

/* ------------------------------------------------------------ asserts */

/*
 * TP__ASSERT(cond): checked unless NDEBUG is defined. CMake's Release and
 * RelWithDebInfo define NDEBUG, so an installed library pays nothing; Debug
 * builds, tests/run.sh (plain, tsan, asan, valgrind: it replaces the
 * RelWithDebInfo flags, dropping -DNDEBUG) and the fuzzer check them. A failed
 * one prints where and aborts: an invariant of the pool is broken and going on
 * could run a task twice or lose one.
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

/* ------------------------------------------------------------ statistics */

/*
 * Every counter is only ever modified with the pool lock held, so an update is
 * a relaxed load plus a release store (no locked read-modify-write): one writer
 * at a time, readers outside the lock see whole values.
 *
 * Reading synchronizes (SPEC section 7): every store is a release and
 * tp_stats_get() loads with acquire, so a reader that sees a counted value
 * also sees every memory effect that happened before it was counted -- in
 * particular what a completed task's function wrote. On x86 both are plain
 * moves. TP__LOAD stays relaxed for the library's own polling (the worker's
 * spin), which re-checks under the lock.
 */
/*
 * The one list of statistics fields, in the order of both text formats.
 *   C(name, help)  a counter: _Atomic uint64_t, only ever grows
 *   G(name, help)  a gauge: _Atomic uint32_t, the current value
 *   D(name, help)  a counter derived by tp_stats_get from the others (not stored)
 * Used by tp_stats_get(), tp_stats_format() (stats.c) and tp_metrics_format()
 * (metrics.c); struct tp__stats below lays the stored ones out in
 * TP__STATS_LAYOUT's order. A new field is one line here, one in
 * TP__STATS_LAYOUT, one in TP__STATS_READ_ORDER (stats.c) and its member in
 * tp_stats (the counts of the lists are asserted to match).
 */
#define TP__STATS_FIELDS(C, G, D)                                                                            \
    C(submitted, "Submit calls that passed argument checks.")                                                \
    C(accepted, "Tasks accepted.")                                                                           \
    D(rejected, "Submits refused, for any reason.")                                                          \
    C(rejected_full, "Submits refused because the queue was full.")                                          \
    C(rejected_user, "Submits refused because the user was at its limit.")                                   \
    C(rejected_closed, "Submits refused because the pool was closed.")                                       \
    C(rejected_timeout, "Blocking submits whose budget ran out.")                                            \
    C(started, "Tasks whose function was called at least once.")                                             \
    C(retried, "Extra attempts started.")                                                                    \
    C(completed, "Accepted tasks that reached their final outcome.")                                         \
    C(succeeded, "Tasks completed with status 0.")                                                           \
    C(failed, "Tasks completed with a non-zero status, cancelled included.")                                 \
    C(cancelled, "Tasks failed with TP_ECANCELED or TP_ETIMEDOUT.")                                          \
    C(expired, "Tasks whose deadline passed before their first start.")                                      \
    G(active, "Tasks running now.")                                                                          \
    G(queued, "Tasks waiting in the queue now.")                                                             \
    G(delayed, "Tasks waiting for a retry now.")                                                             \
    G(workers, "Live worker threads.")                                                                       \
    G(idle, "Workers waiting for work.")                                                                     \
    G(users, "Users holding at least one slot.")

#define TP__ST_NONE(f, help)
/* Memory order, not text order: the fields that change with every task
 * first, in one cache line. Same fields as TP__STATS_FIELDS (asserted). */
#define TP__STATS_LAYOUT(C, G)                                                                               \
    C(submitted)                                                                                             \
    C(accepted)                                                                                              \
    C(started)                                                                                               \
    C(completed)                                                                                             \
    C(succeeded)                                                                                             \
    C(retried)                                                                                               \
    G(active)                                                                                                \
    G(queued)                                                                                                \
    G(delayed)                                                                                               \
    G(workers)                                                                                               \
    C(rejected_full)                                                                                         \
    C(rejected_user)                                                                                         \
    C(rejected_closed)                                                                                       \
    C(rejected_timeout)                                                                                      \
    C(failed)                                                                                                \
    C(cancelled)                                                                                             \
    C(expired)                                                                                               \
    G(idle)                                                                                                  \
    G(users)
#define TP__STL_COUNTER(f) _Atomic uint64_t f;
#define TP__STL_GAUGE(f)   _Atomic uint32_t f;
typedef struct tp__stats {
    TP__STATS_LAYOUT(TP__STL_COUNTER, TP__STL_GAUGE)
} tp__stats;
#undef TP__STL_COUNTER
#undef TP__STL_GAUGE
#define TP__ST_ONE(f, help) +1
#define TP__ST_ONE_L(f)     +1
_Static_assert(0 TP__STATS_FIELDS(TP__ST_ONE, TP__ST_ONE, TP__ST_NONE) ==
                   0 TP__STATS_LAYOUT(TP__ST_ONE_L, TP__ST_ONE_L),
               "TP__STATS_LAYOUT must list every stored field of TP__STATS_FIELDS");
#undef TP__ST_ONE
#undef TP__ST_ONE_L
#undef TP__ST_NONE

/* A pause in a spin loop. */
#if defined(__x86_64__) || defined(__i386__)
#define tp__cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tp__cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define tp__cpu_relax() ((void)0)
#endif

#define TP__LOAD(x)    atomic_load_explicit(&(x), memory_order_relaxed)
#define TP__SET(x, v)  atomic_store_explicit(&(x), (v), memory_order_release)
#define TP__ACQUIRE(x) atomic_load_explicit(&(x), memory_order_acquire)
#define TP__INC(x)     TP__SET(x, TP__LOAD(x) + 1)
#define TP__DEC(x)     TP__SET(x, TP__LOAD(x) - 1)

/* ------------------------------------------------------------ records */

/* A chunk of records allocated at once; freed only by tp_destroy(). */
typedef struct tp__chunk {
    struct tp__chunk *next;
    max_align_t align_[]; /* records follow */
} tp__chunk;

/* A chunk for `n` items of `size` bytes starting on an `align` boundary
 * (records and user entries: a cache line), pushed on `*list`; NULL when out
 * of memory. malloc, not aligned_alloc, so that every allocation of the
 * library goes through malloc/calloc. *items receives the first item. */
static inline tp__chunk *tp__chunk_new(tp__chunk **list, size_t n, size_t size, size_t align, void **items) {
    tp__chunk *c = (tp__chunk *)malloc(sizeof(tp__chunk) + align - 1 + n * size);
    if (!c) return NULL;
    c->next = *list;
    *list = c;
    *items = (void *)(((uintptr_t)(void *)c->align_ + align - 1) & ~(uintptr_t)(align - 1));
    return c;
}

typedef struct tp__user {
    /* own cache lines: `count` changes with every submit and end of the
     * user's tasks, on both sides of the queue */
    _Alignas(64) struct tp__user *next; /* hash chain, or free list */
    uint32_t hash;
    unsigned count; /* slots held: accepted, unfinished tasks */
    char name[TP_USER_MAX + 1];
} tp__user;

enum { TP__QUEUED = 1, TP__RUNNING, TP__DELAYED, TP__ENDING, TP__DONE, TP__FREE };

struct tp__worker;
struct tp_group;

typedef struct tp__task {
    /* First cache line: written by admission, read by the worker. */
    _Alignas(64) uint64_t id;
    tp_fn fn;
    void *arg;
    tp_done_fn on_done;
    uint64_t run_timeout; /* resolved, ns; TP_FOREVER for none */
    uint64_t deadline;    /* absolute; TP_FOREVER for none */
    uint64_t
        queued_at; /* admission, or return to the queue for a retry: a clock.h stamp (queue-wait histogram) */
    tp__user *user; /* slot holder, NULL without a user */
    /* Second: the links and the state, written on both sides. */
    struct tp__task *next;     /* free list, delayed list, endings list */
    struct tp__task *id_next;  /* id index chain */
    struct tp_group *group;    /* NULL, or its group until it is retired */
    struct tp__worker *worker; /* while RUNNING */
    unsigned attempt;
    int state;
    int status;            /* final status once finalised */
    uint32_t ring_pos;     /* while QUEUED: its ring index (see ring.h) */
    struct tp__task *prev; /* delayed list */
    /* The rest: retries, groups, log ids. */
    uint64_t due;                     /* while DELAYED: when the retry is queued */
    struct tp__task *g_next, *g_prev; /* the group's members not yet finalised */
    uint32_t log_gen; /* non-zero: log_id not yet written; the pool serial to generate it from */
    char log_id[TP_LOG_ID_MAX + 1];
} tp__task;

/* Task records and the id index. No locking: the pool lock guards it. */
typedef struct tp__tasks {
    tp__task *free;
    tp__task **index; /* id -> task, chained, power-of-two buckets */
    uint32_t index_mask;
    unsigned total; /* records allocated */
    tp__chunk *chunks;
} tp__tasks;

int tp__tasks_init(tp__tasks *ts, unsigned prealloc);
void tp__tasks_fini(tp__tasks *ts);
/* A free record: TP_OK, TP_EFULL (`limit` records are in use), TP_ENOMEM. */
int tp__tasks_get(tp__tasks *ts, unsigned limit, tp__task **out);
void tp__tasks_put(tp__tasks *ts, tp__task *t);

/* The id index (grown by tasks.c): inline, like ring.h, so that the lookups
 * of admission, finalise and cancel stay in the caller's file. */
static inline void tp__tasks_index(tp__tasks *ts, tp__task *t) {
    tp__task **b = &ts->index[t->id & ts->index_mask];
    t->id_next = *b;
    *b = t;
}

static inline void tp__tasks_unindex(tp__tasks *ts, tp__task *t) {
    for (tp__task **pp = &ts->index[t->id & ts->index_mask]; *pp; pp = &(*pp)->id_next) {
        if (*pp == t) {
            *pp = t->id_next;
            t->id_next = NULL;
            return;
        }
    }
    TP__ASSERT(!"tp__tasks_unindex: task not in the index");
}

static inline tp__task *tp__tasks_find(const tp__tasks *ts, uint64_t id) {
    for (tp__task *t = ts->index[id & ts->index_mask]; t; t = t->id_next)
        if (t->id == id) return t;
    return NULL;
}

/* Per-user slots. No locking: the pool lock guards it. */
typedef struct tp__users {
    tp__user **buckets;
    uint32_t mask;
    unsigned live;  /* entries holding at least one slot */
    unsigned total; /* entries allocated */
    tp__user *free;
    tp__chunk *chunks;
} tp__users;

int tp__users_init(tp__users *us, unsigned prealloc);
void tp__users_fini(tp__users *us);
uint32_t tp__users_hash(const char *name, size_t len);
tp__user *tp__users_find(const tp__users *us, const char *name, size_t len, uint32_t h);
/* Take one slot for `name`, creating its entry; NULL: out of memory. */
tp__user *tp__users_acquire(tp__users *us, const char *name, size_t len, uint32_t h);
/* The same when the caller has just looked the name up: `found` is what
 * tp__users_find() returned for it (NULL: no entry), so admission looks the
 * name up once. */
tp__user *tp__users_take(tp__users *us, tp__user *found, const char *name, size_t len, uint32_t h);
/* Give one slot back; the entry is recycled when its count reaches 0. */
void tp__users_release(tp__users *us, tp__user *u);

#include "ring.h"
#include "clock.h"
#include "hist.h"

/* ------------------------------------------------------------ pool */

struct tp_ctx {
    struct tp__worker *w;
    tp__task *t;
    uint64_t deadline;    /* effective: min(start + run timeout, task deadline) */
    atomic_int cancelled; /* set under mu; read lock-free by the task */
};

enum { TP__W_FREE = 0, TP__W_LIVE, TP__W_DEAD };

typedef struct tp__worker {
    tp_pool *pool;
    pthread_t thread;
    int state; /* TP__W_*: FREE never started, DEAD exited and joinable */
    unsigned index;
    tp__task *cur;           /* the running task, NULL between tasks */
    pthread_cond_t sleep_cv; /* tp_ctx_sleep waits here on pool mu */
    int fds[2];              /* cancel pipe, -1 until tp_ctx_fd() first asks */
    bool fd_dirty;           /* a byte was written for the current task */
    struct tp_ctx ctx;
} tp__worker;

enum { TP__SHUT_NONE = 0, TP__SHUT_RUNNING, TP__SHUT_OK, TP__SHUT_FORCED };

/* Each part of the pool says which file writes it (after tp_create, which
 * builds them all); others may read it under `mu`. Everything but `st`,
 * `life.adm`, `fast_full`, the histogram shards (see Locking at the top) and
 * the read-only `cfg` is guarded by `mu`. */
struct tp_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, room_cv, done_cv, svc_cv; /* see Locking at the top */

    /* pool.c: the resolved configuration, read-only after tp_create */
    struct tp__config {
        unsigned min_workers, max_workers, capacity, max_per_user, max_retries;
        unsigned max_records; /* task records in use at most (see pool.c) */
        uint64_t run_timeout, submit_timeout, drain_timeout, idle_timeout, retry_delay;
        tp_log_fn log;
        void *log_arg;
        void (*on_worker_start)(void *);
        void (*on_worker_stop)(void *);
        void *hook_arg;
        char name[TP_NAME_MAX + 1];
        uint32_t serial; /* process-unique pool number, for generated log ids */
    } cfg;

    /* life.c: the tasks, the queue and their state */
    _Alignas(64) struct tp__life {
        /* first cache line: what every submit and every pop writes */
        tp__ring ring;
        tp__tasks tasks;
        unsigned active;   /* tasks running */
        unsigned inflight; /* accepted tasks whose on_done has not returned */
        /* second: the admission word, and what both sides read */
        _Alignas(64) _Atomic uint64_t adm; /* see below */
        uint64_t next_id;
        unsigned delayed;        /* tasks in the delayed list */
        unsigned with_deadline;  /* unfinished tasks that carry a deadline */
        unsigned room_waiters;   /* tp_submit_wait callers in room_cv */
        unsigned users_at_limit; /* users holding max_per_user slots */
        bool closed;             /* tp__close_locked: no more admissions */
        bool forced;             /* tp__force_locked: no more retries */
        /* the rest: used when a task has a user, a deadline, a group, a retry */
        _Alignas(64) tp__users users;
        tp__task *delayed_head, *delayed_tail; /* due order (fixed delay) */
        tp__task *endings_head, *endings_tail; /* ended unrun, on_done pending */
        uint64_t queued_deadline_min;          /* lower bound of the deadlines in the ring */
        uint64_t expiry_scan_at;               /* the service thread scans the ring no earlier */
        struct tp_group *groups;               /* this pool's groups (linked by group.c through life.c) */
        /* `adm`: what admission needs to refuse a full queue without the lock
         * (tp__admit_full_fast), stored under mu after every change as one
         * word, so that one load gives the values of one moment: queued +
         * delayed (bits 0-31), users_at_limit (bits 32-62), closed (bit 63). */
    } life;

    /* worker.c: worker slots and thread counts */
    struct tp__workers {
        tp__worker *workers;   /* max_workers slots */
        unsigned live_workers; /* workers counted in stats.workers */
        unsigned starting;     /* spawned threads that have not yet taken mu */
        unsigned threads;      /* worker threads not yet finished (incl. stop hook) */
        unsigned idle_waiters; /* workers in work_cv */
        unsigned spinners;     /* idle workers polling for work before they wait (0 or 1) */
        tp__hist_shard *hist;  /* max_workers shards: slot i's worker is the only writer of hist[i] */
    } wk;

    /* service.c: the service thread (started by pool.c) */
    struct tp__service {
        uint64_t next; /* when the waiting service thread wakes by itself */
        bool waiting;  /* the service thread is in svc_cv */
        bool started;  /* `thread` is joinable */
        pthread_t thread;
    } svc;

    /* pool.c: shutdown */
    struct tp__shutdown {
        int state;         /* TP__SHUT_* */
        uint64_t deadline; /* fixed by the first tp_shutdown */
    } shut;

    /* statistics: atomics, written under mu by the owner of each counter */
    _Alignas(64) tp__stats st;
    /* pool.c: submits refused by tp__admit_full_fast, without the lock. Each
     * counts in both submitted and rejected_full (tp_stats_get adds it in).
     * A read-modify-write, as no lock orders the writers; its own cache line,
     * which only refused submitters write. */
    _Alignas(64) _Atomic uint64_t fast_full;
#if defined(TP__DEBUG)
    pthread_t mu_owner; /* valid while mu_held; see tp__lock */
    bool mu_held;
#endif
};

/*
 * A task group (SPEC 11.3). Allocated by group.c, which owns its lifetime
 * and its waiters; its members are life.c's, all under the pool's mu.
 */
struct tp_group {
    tp_pool *pool;     /* NULL once detached (tp_destroy of the pool, life.c) */
    unsigned flags;    /* TP_GROUP_*, read-only */
    pthread_cond_t cv; /* life.c: no unfinished member; group.c: a waiter left while destroying */
    /* life.c */
    tp__task *head, *tail;            /* members not yet finalised, in admission order */
    unsigned long unfinished;         /* accepted members whose on_done has not returned */
    int err;                          /* the first failed member's final status, 0 until then */
    bool cancelled;                   /* tp_group_cancel, or cancel on error fired: refuse submits */
    struct tp_group *p_next, *p_prev; /* life.groups */
    /* group.c */
    unsigned waiters; /* threads in tp_group_wait or tp_group_destroy */
    bool destroying;  /* tp_group_destroy waits for the waiters to leave */
};

/* time */
/* now + ns, saturating; TP_FOREVER stays. */
static inline uint64_t tp__deadline_after(uint64_t now, uint64_t ns) {
    if (ns == TP_FOREVER || ns >= TP_FOREVER - now) return TP_FOREVER;
    return now + ns;
}
int tp__mutex_init(pthread_mutex_t *mu); /* the pool mutex (adaptive where glibc has it) */
/* Wait on cv until the absolute monotonic deadline; TP_FOREVER waits unbounded.
 * Returns 0 or ETIMEDOUT (errno value). */
static inline int tp__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline) {
    if (deadline == TP_FOREVER) return pthread_cond_wait(cv, mu);
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline / 1000000000ull);
    ts.tv_nsec = (long)(deadline % 1000000000ull);
    return pthread_cond_timedwait(cv, mu, &ts);
}
int tp__cond_init(pthread_cond_t *cv);

/*
 * The pool lock. Every lock, unlock and condition wait on `mu` goes through
 * these, so that debug builds know which thread holds it and a `_locked`
 * function can assert that its caller does (TP__ASSERT_LOCKED). In release
 * builds they are the bare pthread calls.
 */
static inline void tp__lock(tp_pool *p) {
    pthread_mutex_lock(&p->mu);
#if defined(TP__DEBUG)
    TP__ASSERT(!p->mu_held);
    p->mu_owner = pthread_self();
    p->mu_held = true;
#endif
}

static inline void tp__unlock(tp_pool *p) {
#if defined(TP__DEBUG)
    TP__ASSERT(p->mu_held && pthread_equal(p->mu_owner, pthread_self()));
    p->mu_held = false;
#endif
    pthread_mutex_unlock(&p->mu);
}

/* Only the holder reads mu_owner here, so the check is race-free whenever it
 * passes. */
#if defined(TP__DEBUG)
#define TP__ASSERT_LOCKED(p) TP__ASSERT((p)->mu_held &&pthread_equal((p)->mu_owner, pthread_self()))
#else
#define TP__ASSERT_LOCKED(p) ((void)0)
#endif

/* Wait on cv (a condition of this pool's mu) until the absolute monotonic
 * deadline; TP_FOREVER waits unbounded. Returns 0 or ETIMEDOUT. */
static inline int tp__wait_locked(tp_pool *p, pthread_cond_t *cv, uint64_t deadline) {
    TP__ASSERT_LOCKED(p);
#if defined(TP__DEBUG)
    p->mu_held = false;
#endif
    int rc = tp__cond_wait_until(cv, &p->mu, deadline);
#if defined(TP__DEBUG)
    TP__ASSERT(!p->mu_held);
    p->mu_owner = pthread_self();
    p->mu_held = true;
#endif
    return rc;
}

#if defined(TP__DEBUG)
/* A test hook of debug builds (tests/test_ctx.c): when set, a worker calls it
 * right after an attempt returned, without the lock, before it takes the
 * lock again to end the attempt. It holds open the window in which a task
 * can be admitted between one attempt's end and the next attempt's start. */
extern void (*volatile tp__test_attempt_returned)(tp_pool *p);
#endif

/* The pool whose thread this is (worker or service), NULL elsewhere. */
extern _Thread_local tp_pool *tp__tls_pool;
/* True on a pool's service thread. */
extern _Thread_local bool tp__tls_service;
/* The task running (or whose on_done runs) on this thread, NULL elsewhere. */
extern _Thread_local tp__task *tp__tls_task;


/*
 * Functions by file, top layer first. A file calls only files below it
 * (tests/check_layers.sh). `_locked`: the caller holds p->mu (asserted in
 * debug builds); functions that release it around user code say so.
 */

/* ---- pool.c: what group.c builds on */
/* The argument checks of a submit that need no pool: TP_OK or TP_EINVAL. */
int tp__task_args_check(tp_fn fn, const tp_task_opts *opts);
/* tp_submit with the task joining group g (pool.c's checks and admission). */
int tp__submit_member(tp_pool *p, struct tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts,
                      uint64_t *id_out);

/* ---- service.c: the service thread */
void *tp__service_main(void *arg);

/* ---- worker.c: worker slots and threads */
/* Reserve a worker slot (mu held); then create the thread without mu. */
int tp__spawn_start_locked(tp_pool *p, tp__worker **slot, pthread_t *old, bool *join_old);
int tp__spawn_finish(tp_pool *p, tp__worker *w, pthread_t old, bool join_old); /* no lock */

/* ---- life.c: the task's life and the queue (see the top of life.c) */

/* A submit's checked arguments (pool.c fills it in before taking mu). */
typedef struct tp__admit_args {
    struct tp_group *group; /* NULL: not a group member */
    tp_fn fn;
    tp_done_fn on_done;
    uint64_t run_timeout, deadline;
    const char *user;
    size_t user_len;
    uint32_t user_hash;
    const char *log_src; /* NULL: generate */
    size_t log_len;
    uint64_t now; /* clock.h stamp just before admission, where the queue wait starts; 0: take it under mu */
} tp__admit_args;

/* The queue, the records and the user table for `full` tasks, `prealloc`
 * records made now (-1: out of memory); fini also after a failed init. */
int tp__life_init(tp_pool *p, unsigned full, unsigned prealloc);
void tp__life_fini(tp_pool *p);
/* The admission checks after "closed"; on TP_OK the task is queued and, if
 * `wake`, an idle worker signalled for it. */
int tp__admit_locked(tp_pool *p, const tp__admit_args *a, void *arg, uint64_t *id_out, bool wake);
/* Wake idle workers for `n` tasks just queued (one each, none while one spins). */
void tp__work_signal_locked(tp_pool *p, size_t n);
/* Without the lock: true when the locked path would refuse this task with
 * TP_EFULL (not closed, queue full, its user if any below its limit) at the
 * moment of one atomic load; false means "ask under the lock". */
bool tp__admit_full_fast(tp_pool *p, bool has_user);
bool tp__want_spawn_locked(const tp_pool *p);
/* After a submit's own spawn: wake the service thread if the backlog wants
 * still more workers. */
void tp__want_more_workers_locked(tp_pool *p);
/* tp_submit_wait: wait on room_cv until woken or `deadline` (0, ETIMEDOUT). */
int tp__wait_room_locked(tp_pool *p, uint64_t deadline);
int tp__cancel_locked(tp_pool *p, uint64_t id); /* TP_OK or TP_ENOTFOUND */
/* Groups: a new group joins the pool's list, a destroyed one leaves it;
 * cancel every unfinished member (and refuse later submits); at tp_destroy,
 * with every task retired, the pool's groups lose their pool (no lock: no
 * other call may run then). */
void tp__group_link_locked(tp_pool *p, struct tp_group *g);
void tp__group_unlink_locked(tp_pool *p, struct tp_group *g);
void tp__group_cancel_locked(tp_pool *p, struct tp_group *g);
void tp__groups_detach(tp_pool *p);
void tp__close_locked(tp_pool *p);
void tp__force_locked(tp_pool *p);
/* Worker steps: pop the head; end it if its deadline passed (true); start
 * it; after its attempt, retry (true) or finalise; run on_done and retire. */
tp__task *tp__queue_pop_locked(tp_pool *p);
bool tp__task_expired_locked(tp_pool *p, tp__task *t);
void tp__task_start_locked(tp_pool *p, tp__worker *w, tp__task *t);
bool tp__task_after_run_locked(tp_pool *p, tp__worker *w, tp__task *t, int rc);
void tp__task_finish_locked(tp_pool *p, tp__task *t); /* releases mu around on_done */
void tp__task_retire_locked(tp_pool *p, tp__task *t);
/* A worker thread is gone (threads already decremented). */
void tp__signal_worker_gone_locked(tp_pool *p);
/* Service steps: endings (releases mu around on_done), retry timers and
 * queue deadlines (both return when to look again). */
bool tp__endings_pending_locked(const tp_pool *p);
void tp__endings_run_locked(tp_pool *p);
uint64_t tp__delayed_run_locked(tp_pool *p, uint64_t now);
uint64_t tp__queue_expire_locked(tp_pool *p, uint64_t now);

/* ---- ctx.c: the task context, the cancel pipe, log ids, logging */
void tp__ctx_cancel_locked(tp__worker *w);
void tp__ctx_drain_fd_locked(tp__worker *w);

/* A task starts on this context (mu held). */
static inline void tp__ctx_begin(struct tp_ctx *c, tp__task *t) {
    c->t = t;
    c->deadline = t->deadline;
    atomic_store_explicit(&c->cancelled, 0, memory_order_relaxed);
}

/* The attempt starts `now`: its effective deadline is the earlier of the task
 * deadline and now + run timeout. Without mu: only this worker writes its
 * ctx, before the task function is called. */
static inline void tp__ctx_arm_run_timeout(struct tp_ctx *c, const tp__task *t, uint64_t now) {
    if (t->run_timeout == TP_FOREVER) return;
    uint64_t d = tp__deadline_after(now, t->run_timeout);
    if (d < c->deadline) c->deadline = d;
}

/* The attempt returned (mu held): was it cancelled? The cancel pipe is
 * emptied so the next task starts clean. */
static inline bool tp__ctx_end_locked(struct tp_ctx *c) {
    bool cancelled = atomic_load_explicit(&c->cancelled, memory_order_relaxed) != 0;
    c->t = NULL;
    if (c->w->fd_dirty) tp__ctx_drain_fd_locked(c->w);
    return cancelled;
}

const char *tp__task_log_id(tp__task *t); /* generates on demand */
void tp__log(tp_pool *p, int level, const char *log_id, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void tp__tls_enter_task(tp__task *t);
void tp__tls_leave_task(void);
/* Resolve the log id a new task gets: copy into dst, or 0 -> generate.
 * Returns the length copied, or -1 if opts' id is too long. */
int tp__log_id_source(const char *explicit_id, const char **src, size_t *len);

/* text.c: text output for tp_stats_format and tp_metrics_format. snprintf
 * semantics over several calls: writes what fits into buf (always
 * NUL-terminated when len > 0) and keeps counting in pos past the end, so pos
 * is the length the whole text needs. */
typedef struct tp__outbuf {
    char *buf;
    size_t len, pos;
} tp__outbuf;
void tp__put(tp__outbuf *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif /* TP_INTERNAL_H */
