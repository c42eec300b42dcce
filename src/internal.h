/*
 * internal.h -- the private shapes of libtaskpool, shared by src/ only.
 *
 * Files and responsibilities
 *   error.c    error table, tp_strerror, version
 *   ring.h     bounded FIFO of task pointers (no locking: the pool lock guards it)
 *   tasks.c    task records: a free list grown in chunks, and the id index
 *   users.c    per-user slot table (no locking: the pool lock guards it)
 *   pool.c     create/destroy, admission, cancel, close/shutdown/wait
 *   worker.c   the worker loop, task completion, elastic workers
 *   service.c  the service thread: retry timers and endings of unrun tasks
 *   ctx.c      the task context, log ids, tp_now_ns
 *   stats.c    statistics snapshot and formatting
 *   default.c  the process-wide default pool
 *
 * Locking
 *   One mutex per pool, `tp_pool.mu`, guards everything in the pool except the
 *   statistics (atomics) and the worker's context `cancelled` flag (atomic,
 *   written under mu, read lock-free by the task). Lock order: the default-pool
 *   registry lock (default.c) is never held while a pool lock is taken; no
 *   pool lock is ever held while calling user code (task functions, on_done,
 *   log hook, worker hooks) or while taking another pool's lock.
 *
 *   Condition variables, one per condition, all on `mu`, all CLOCK_MONOTONIC:
 *     work_cv   a worker may have work, or may exit          (idle workers)
 *     room_cv   queue space or a user slot may be free, or closed (tp_submit_wait)
 *     done_cv   inflight reached 0 or a thread exited        (shutdown, wait)
 *     svc_cv    an ending or a retry timer for the service thread
 *     worker.sleep_cv  a running task's tp_ctx_sleep: cancelled
 *
 * Task life (state in tp__task.state, all transitions under mu)
 *   QUEUED -> RUNNING -> (DELAYED -> QUEUED ...) -> DONE
 *   QUEUED/DELAYED -> ENDING (cancel, forced shutdown, deadline while delayed)
 *   QUEUED -> DONE (expired when a worker picks it)
 *   A task is *finalised* exactly once (tp__task_finalise): removed from the id
 *   index, user slot released, counters updated. Then exactly one thread calls
 *   its on_done: the worker that finalised it (DONE) or the service thread
 *   (ENDING). After on_done returns, that thread retires the record and
 *   decrements `inflight`. Every path funnels through these two functions.
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

#include "taskpool.h"

#define TP__UNUSED(x) ((void)(x))

/* True when the n words of a public struct's reserved tail are all zero
 * (taskpool.h, "How the structs grow"). */
static inline bool tp__reserved_zero(const uint64_t *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != 0) return false;
    return true;
}
#define TP__RESERVED_ZERO(s) tp__reserved_zero((s)->reserved, sizeof (s)->reserved / sizeof (s)->reserved[0])

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
typedef struct tp__stats {
    _Atomic uint64_t submitted, accepted;
    _Atomic uint64_t rejected_full, rejected_user, rejected_closed, rejected_timeout;
    _Atomic uint64_t started, retried, completed, succeeded, failed, cancelled, expired;
    _Atomic uint32_t active, queued, delayed, workers, idle, users;
} tp__stats;

/* A pause in a spin loop. */
#if defined(__x86_64__) || defined(__i386__)
#define tp__cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tp__cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define tp__cpu_relax() ((void)0)
#endif

#define TP__LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define TP__SET(x, v) atomic_store_explicit(&(x), (v), memory_order_release)
#define TP__ACQUIRE(x) atomic_load_explicit(&(x), memory_order_acquire)
#define TP__INC(x) TP__SET(x, TP__LOAD(x) + 1)
#define TP__DEC(x) TP__SET(x, TP__LOAD(x) - 1)

/* ------------------------------------------------------------ records */

/* A chunk of records allocated at once; freed only by tp_destroy(). */
typedef struct tp__chunk {
    struct tp__chunk *next;
    max_align_t align_[]; /* records follow */
} tp__chunk;

typedef struct tp__user {
    struct tp__user *next; /* hash chain, or free list */
    uint32_t hash;
    unsigned count;        /* slots held: accepted, unfinished tasks */
    char name[TP_USER_MAX + 1];
} tp__user;

enum { TP__QUEUED = 1, TP__RUNNING, TP__DELAYED, TP__ENDING, TP__DONE, TP__FREE };

struct tp__worker;

typedef struct tp__task {
    uint64_t id;
    tp_fn fn;
    void *arg;
    tp_done_fn on_done;
    uint64_t run_timeout;   /* resolved, ns; TP_FOREVER for none */
    uint64_t deadline;      /* absolute; TP_FOREVER for none */
    uint64_t due;           /* while DELAYED: when the retry is queued */
    struct tp__task *next;  /* free list, delayed list, endings list */
    struct tp__task *prev;  /* delayed list */
    struct tp__task *id_next; /* id index chain */
    tp__user *user;         /* slot holder, NULL without a user */
    struct tp__worker *worker; /* while RUNNING */
    unsigned attempt;
    int state;
    int status;             /* final status once finalised */
    uint32_t log_gen;       /* non-zero: log_id not yet written; the pool serial to generate it from */
    uint32_t ring_pos;      /* while QUEUED: its ring index (see ring.h) */
    char log_id[TP_LOG_ID_MAX + 1];
} tp__task;

/* Task records and the id index. No locking: the pool lock guards it. */
typedef struct tp__tasks {
    tp__task *free;
    unsigned total;          /* records allocated */
    tp__chunk *chunks;
    tp__task **index;        /* id -> task, chained, power-of-two buckets */
    uint32_t index_mask;
} tp__tasks;

int tp__tasks_init(tp__tasks *ts, unsigned prealloc);
void tp__tasks_fini(tp__tasks *ts);
/* A free record: TP_OK, TP_EFULL (`limit` records are in use), TP_ENOMEM. */
int tp__tasks_get(tp__tasks *ts, unsigned limit, tp__task **out);
void tp__tasks_put(tp__tasks *ts, tp__task *t);
void tp__tasks_index(tp__tasks *ts, tp__task *t);
void tp__tasks_unindex(tp__tasks *ts, tp__task *t);
tp__task *tp__tasks_find(const tp__tasks *ts, uint64_t id);

/* Per-user slots. No locking: the pool lock guards it. */
typedef struct tp__users {
    tp__user **buckets;
    uint32_t mask;
    unsigned live;           /* entries holding at least one slot */
    unsigned total;          /* entries allocated */
    tp__user *free;
    tp__chunk *chunks;
} tp__users;

int tp__users_init(tp__users *us, unsigned prealloc);
void tp__users_fini(tp__users *us);
uint32_t tp__users_hash(const char *name, size_t len);
tp__user *tp__users_find(const tp__users *us, const char *name, size_t len, uint32_t h);
/* Take one slot for `name`, creating its entry; NULL: out of memory. */
tp__user *tp__users_acquire(tp__users *us, const char *name, size_t len, uint32_t h);
/* Give one slot back; the entry is recycled when its count reaches 0. */
void tp__users_release(tp__users *us, tp__user *u);

#include "ring.h"

/* ------------------------------------------------------------ pool */

struct tp_ctx {
    struct tp__worker *w;
    tp__task *t;
    uint64_t deadline;       /* effective: min(start + run timeout, task deadline) */
    atomic_int cancelled;    /* set under mu; read lock-free by the task */
};

enum { TP__W_FREE = 0, TP__W_LIVE, TP__W_DEAD };

typedef struct tp__worker {
    tp_pool *pool;
    pthread_t thread;
    int state;               /* TP__W_*: FREE never started, DEAD exited and joinable */
    unsigned index;
    tp__task *cur;           /* the running task, NULL between tasks */
    pthread_cond_t sleep_cv; /* tp_ctx_sleep waits here on pool mu */
    int fds[2];              /* cancel pipe, -1 until tp_ctx_fd() first asks */
    bool fd_dirty;           /* a byte was written for the current task */
    struct tp_ctx ctx;
} tp__worker;

enum { TP__SHUT_NONE = 0, TP__SHUT_RUNNING, TP__SHUT_OK, TP__SHUT_FORCED };

struct tp_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, room_cv, done_cv, svc_cv;

    /* resolved configuration (read-only after create) */
    unsigned min_workers, max_workers, capacity, max_per_user, max_retries;
    unsigned max_records;    /* task records in use at most (see pool.c) */
    uint64_t run_timeout, submit_timeout, drain_timeout, idle_timeout, retry_delay;
    tp_log_fn log;
    void *log_arg;
    void (*on_worker_start)(void *);
    void (*on_worker_stop)(void *);
    void *hook_arg;
    char name[TP_NAME_MAX + 1];
    uint32_t serial;         /* process-unique pool number, for generated log ids */

    /* guarded by mu */
    tp__ring ring;
    tp__tasks tasks;
    tp__users users;
    tp__task *delayed_head, *delayed_tail; /* due order (fixed delay) */
    tp__task *endings_head, *endings_tail; /* ended unrun, on_done pending */
    uint64_t next_id;
    unsigned delayed;        /* tasks in the delayed list */
    unsigned active;         /* tasks running */
    unsigned inflight;       /* accepted tasks whose on_done has not returned */
    unsigned with_deadline;  /* unfinished tasks that carry a deadline */
    uint64_t queued_deadline_min; /* lower bound of the deadlines in the ring */
    uint64_t expiry_scan_at; /* the service thread scans the ring no earlier */
    uint64_t svc_next;       /* when the waiting service thread wakes by itself */
    unsigned live_workers;   /* workers counted in stats.workers */
    unsigned starting;       /* spawned threads that have not yet taken mu */
    unsigned threads;        /* worker threads not yet finished (incl. stop hook) */
    unsigned idle_waiters;   /* workers in work_cv */
    unsigned spinners;       /* idle workers polling for work before they wait (0 or 1) */
    unsigned room_waiters;   /* callers in room_cv */
    bool svc_waiting;        /* the service thread is in svc_cv */
    bool closed, forced;
    int shut_state;          /* TP__SHUT_* */
    uint64_t shut_deadline;
    tp__worker *workers;     /* max_workers slots */
    pthread_t svc_thread;
    bool svc_started;

    tp__stats st;
};

/* The pool whose thread this is (worker or service), NULL elsewhere. */
extern _Thread_local tp_pool *tp__tls_pool;
/* True on a pool's service thread. */
extern _Thread_local bool tp__tls_service;
/* The task running (or whose on_done runs) on this thread, NULL elsewhere. */
extern _Thread_local tp__task *tp__tls_task;

/* time */
uint64_t tp__deadline_after(uint64_t now, uint64_t ns); /* saturating, TP_FOREVER stays */
int tp__mutex_init(pthread_mutex_t *mu); /* the pool mutex (adaptive where glibc has it) */
/* Wait on cv until the absolute monotonic deadline; TP_FOREVER waits unbounded.
 * Returns 0 or ETIMEDOUT (errno value). */
int tp__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline);
int tp__cond_init(pthread_cond_t *cv);

/* pool.c: under mu */
void tp__close_locked(tp_pool *p);
void tp__signal_room(tp_pool *p);
void tp__drained_check(tp_pool *p);
bool tp__want_spawn(const tp_pool *p);

/* worker.c */
int tp__spawn_start(tp_pool *p, tp__worker **slot, pthread_t *old, bool *join_old); /* under mu */
int tp__spawn_finish(tp_pool *p, tp__worker *w, pthread_t old, bool join_old);      /* no lock */
void tp__task_finalise(tp_pool *p, tp__task *t, int status, bool expired);          /* under mu */
void tp__task_end_unrun(tp_pool *p, tp__task *t, int status, bool expired);         /* under mu */
void tp__task_retire(tp_pool *p, tp__task *t);                                      /* under mu */
void tp__ctx_cancel_locked(tp__worker *w);
void tp__wake_exiters(tp_pool *p);

/* service.c */
void *tp__service_main(void *arg);
void tp__delayed_remove(tp_pool *p, tp__task *t);
void tp__svc_wake(tp_pool *p);

/* ctx.c: log ids */
const char *tp__task_log_id(tp__task *t);     /* generates on demand */
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

#endif /* TP_INTERNAL_H */
