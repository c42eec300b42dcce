/*
 * taskpool.h -- libtaskpool, a bounded worker pool for C services.
 *
 * The whole public contract is in this file, top to bottom:
 *   1. version and export macros        6. admission: submit, batch, wait, cancel
 *   2. error codes                      7. the running task's context
 *   3. limits and special values        8. statistics
 *   4. configuration                    9. log ids and the log hook
 *   5. lifecycle                       10. the default pool
 *  11. task groups (1.1)               12. latency histograms (1.1)
 *  13. metrics for several pools (1.1) 14. priorities, fair shares (1.2)
 *  15. completion queues (1.2)
 *
 * What the pool promises
 *   - A fixed set of worker threads (elastic between `workers` and
 *     `max_workers` when asked) takes tasks from a bounded FIFO queue (since
 *     1.2 refined by priority lanes and, on request, fair shares across
 *     users: section 14). A worker never holds tasks of its own outside the
 *     queue: a task that has not started stays where every worker,
 *     tp_cancel() and its deadline can reach it.
 *     Admission never waits in tp_submit(), never creates a thread per task and
 *     allocates no memory per task in steady state.
 *   - Every accepted task ends exactly once, and its on_done(arg, status) runs
 *     exactly once, on every path: success, failure, run timeout, deadline,
 *     cancel while queued, waiting for a retry or running, forced shutdown,
 *     retries exhausted. A refused task never gets an on_done and its arg stays
 *     the caller's.
 *   - Capacity is explicit: at most `max_workers` tasks run; admission refuses
 *     with TP_EFULL while queued + delayed >= queue_capacity, so at every moment
 *     active + queued + delayed <= max_workers + queue_capacity.
 *
 * What it does not promise
 *   - No persistence: tasks live in memory only; a crash loses them.
 *   - Cancellation is cooperative. A task sees it through tp_ctx_err(),
 *     tp_ctx_sleep() and tp_ctx_fd(); nothing is ever killed. A task function
 *     that never returns and ignores cancellation keeps its worker forever:
 *     tp_shutdown() still returns at its deadline and tp_wait() with a timeout
 *     still returns, but tp_destroy() waits for it. The process is the final
 *     boundary.
 *
 * Threads a pool owns: its workers and one service thread (retry timers,
 * deadlines of queued and retry-waiting tasks, on_done of tasks that ended
 * without running). Nothing else is created.
 *
 * Thread-safety: every function taking a tp_pool may be called from any thread
 * concurrently, except tp_destroy() (no other call on that pool may run
 * concurrently with it or after it). tp_ctx functions are called only by the
 * task that received the context, during its call.
 *
 * fork(): a pool does not survive into a child process. The child has none of
 * the pool's threads, and a pool lock may have been held by one of them at the
 * moment of the fork, so any call on an inherited pool may block forever or
 * corrupt it. After fork() the child may only exec or _exit (and call
 * async-signal-safe functions in between); it must not call any tp_ function
 * on a pool it inherited, nor tp_destroy() it (never free a pool whose threads
 * are gone). A child that needs a pool creates a new one. The parent's pools
 * are unaffected.
 *
 * Durations and deadlines are nanoseconds of CLOCK_MONOTONIC (tp_now_ns());
 * TP_FOREVER means no limit everywhere. A duration of 0 means:
 *   - "no limit" for the waits that stand alone: tp_wait() and
 *     tp_group_wait() (like TP_FOREVER);
 *   - "the configured default" for the budgets a pool has a setting for:
 *     tp_shutdown() (drain_timeout_ns) and tp_submit_wait()
 *     (submit_timeout_ns); likewise 0 in tp_config and tp_task_opts fields;
 *   - "do not wait" for tp_cq_wait() (a poll) and tp_ctx_sleep() (it returns
 *     tp_ctx_err() at once).
 * tp_wait() returns TP_ETIMEDOUT both when its own timeout ran out and when
 * the pool finished after a forced shutdown. To tell them apart, call
 * tp_wait(p, TP_FOREVER) once more when you need the outcome (a finished pool
 * answers at once, with the shutdown's result), or compare tp_now_ns() with
 * your own deadline: a wait whose timeout ran out returns only after
 * timeout_ns has passed.
 *
 * Task ids mean something only to the pool that issued them: ids of different
 * pools overlap, so tp_cancel(q, id) with an id that pool p returned cancels
 * whatever task of q has that id, if any. Keep the pool with the id.
 */
#ifndef TASKPOOL_H
#define TASKPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <limits.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- 1. version */

#define TP_VERSION_MAJOR 1
#define TP_VERSION_MINOR 2
#define TP_VERSION_PATCH 0

/* The header's version as one number, 0xMMmmpp (1.1.0 -> 0x010100), and a
 * compile-time check: `#if TP_VERSION_AT_LEAST(1, 1, 0)` guards code that
 * uses a call added in 1.1. Compare with tp_version() for the library that is
 * actually linked at run time. */
#define TP_VERSION_HEX ((TP_VERSION_MAJOR << 16) | (TP_VERSION_MINOR << 8) | TP_VERSION_PATCH)
#define TP_VERSION_AT_LEAST(major, minor, patch)                                                             \
    (TP_VERSION_HEX >= (((major) << 16) | ((minor) << 8) | (patch)))

/*
 * What "the same major version" promises (since 1.1)
 *   A program compiled against the header of version X.a and linked against
 *   libtaskpool.so.X keeps working, unchanged and without recompiling, when the
 *   shared library is replaced by any X.b with b >= a: every function keeps
 *   its name, arguments and meaning, and every public struct keeps its size
 *   and the offsets of its fields. Source written for X.a compiles against
 *   X.b and means the same. A new major version (SONAME X+1) is the only
 *   place where this may break.
 *
 * How the structs grow
 *   tp_config, tp_task_opts, tp_stats and tp_task end in a reserved tail. A later minor
 *   version adds a field by taking the place of reserved words, so the size
 *   and every earlier offset stay. Reserved words of the structs you pass in
 *   must be zero: `= {0}`, designated initialisers and memset do that, and
 *   zero keeps meaning "the default". tp_create() and the submit calls refuse
 *   a non-zero reserved word with TP_EINVAL, so a program written for a newer
 *   minor version that sets a new field is told clearly when it runs against
 *   an older library that cannot honour it. tp_stats_get() zeroes the
 *   reserved words it does not fill. 1.2 took words of the tails of
 *   tp_config (sched, prio_starve_limit, low_prio_max_running, reserved32,
 *   retry_delay_max_ns), tp_task_opts (cq) and tp_stats (oldest_wait_ns):
 *   a program built against 1.1 passes zero there, which means 1.1's
 *   behaviour.
 *   The structs of 1.0 had no tail. Programs built against 1.0 are served by
 *   versioned 1.0 entry points (symbol version TASKPOOL_1.0) that read and
 *   write exactly the 1.0 layout; programs built against 1.1 or later bind
 *   to the TASKPOOL_1.1 ones (the layouts of 1.1 and 1.2 are one), and to
 *   TASKPOOL_1.2 for the calls added in 1.2. Every exported symbol carries a
 *   version.
 *   Code that looks the calls up by name at run time (dlsym(), language
 *   bindings) gets the newest version: bindings written for the 1.0 layout
 *   must ask for dlvsym(handle, "tp_create", "TASKPOOL_1.0") and the like.
 */

/* TP_API marks the exported symbols; everything else is hidden. Define
 * TP_STATIC when linking the static library on platforms that care. */
#if defined(_WIN32) && !defined(TP_STATIC)
#ifdef TP_BUILDING
#define TP_API __declspec(dllexport)
#else
#define TP_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define TP_API __attribute__((visibility("default")))
#else
#define TP_API
#endif

/* "MAJOR.MINOR.PATCH" of the library actually linked. Static string. */
TP_API const char *tp_version(void);

/* ------------------------------------------------------------ 2. error codes */

/* XX(name, value, message). One table generates the enum, tp_strerror() and
 * tp_err_name(), so they cannot drift apart. */
#define TP_ERRNO_MAP(XX)                                                                                     \
    XX(EINVAL, -1, "invalid argument")                                                                       \
    XX(ENOMEM, -2, "out of memory or threads")                                                               \
    XX(EFULL, -3, "queue is full")                                                                           \
    XX(EUSERLIMIT, -4, "user has reached its limit of tasks")                                                \
    XX(ECLOSED, -5, "pool is closed")                                                                        \
    XX(ETIMEDOUT, -6, "timed out")                                                                           \
    XX(ECANCELED, -7, "canceled")                                                                            \
    XX(ENOTFOUND, -8, "no such task")                                                                        \
    XX(EDEADLK, -9, "would wait for the calling thread itself")                                              \
    XX(ENODEFAULT, -10, "no default pool registered")                                                        \
    XX(EBUSY, -11, "still in use")

enum {
    TP_OK = 0,
#define TP__ERR_ENUM(name, value, msg) TP_##name = (value),
    TP_ERRNO_MAP(TP__ERR_ENUM)
#undef TP__ERR_ENUM
};

/* A static English message for any int: each TP_ code, "success" for TP_OK,
 * "unknown error" for anything else. Never NULL. Thread-safe. */
TP_API const char *tp_strerror(int err);
/* The code's name ("TP_EFULL", "TP_OK"), or "TP_UNKNOWN". Never NULL. */
TP_API const char *tp_err_name(int err);

/* ------------------------------------------------- 3. limits, special values */

#define TP_FOREVER   UINT64_MAX /* a duration or deadline with no limit */
#define TP_UNLIMITED UINT_MAX   /* max_per_user: no per-user limit */

#define TP_MAX_WORKERS        4096u      /* workers, max_workers */
#define TP_MAX_QUEUE_CAPACITY (1u << 20) /* queue_capacity */
#define TP_MAX_RETRIES        100u       /* max_retries */
#define TP_USER_MAX           127        /* bytes of a user name, NUL excluded */
#define TP_LOG_ID_MAX         127        /* bytes of a log id, NUL excluded */
#define TP_NAME_MAX           31         /* bytes of a pool name, NUL excluded */

/* Log levels of tp_log_fn. */
enum { TP_LOG_ERROR = 0, TP_LOG_WARN = 1, TP_LOG_INFO = 2, TP_LOG_DEBUG = 3 };

/* Formats of tp_stats_format(). */
enum { TP_FORMAT_JSON = 0, TP_FORMAT_PROMETHEUS = 1 };

/* Priorities of tp_task_opts.priority (since 1.2): a higher one starts first;
 * 0 (the default) is normal, below 0 background, above 0 urgent. */
#define TP_PRIO_MIN (-2)
#define TP_PRIO_MAX 2

/* Schedulers of tp_config.sched (since 1.2), and the largest user weight. */
enum { TP_SCHED_FIFO = 0, TP_SCHED_FAIR = 1 };
#define TP_WEIGHT_MAX 1000u

/* ---------------------------------------------------------- 4. configuration */

typedef struct tp_pool tp_pool; /* opaque */
typedef struct tp_ctx tp_ctx;   /* opaque, valid during one task call */

/* The log hook. Called on a pool thread without any pool lock held; it may call
 * any libtaskpool function except tp_shutdown/tp_wait/tp_destroy of the same
 * pool and tp_group_wait/tp_group_destroy of its groups (those return
 * TP_EDEADLK there). `log_id` and `msg` are valid during the
 * call only; `log_id` is never NULL. A worker may still be in the hook after
 * tp_shutdown() returned (even TP_OK), e.g. reporting the failed last attempt
 * of a task without an on_done, or a failed attempt whose retry was then
 * cancelled: the task has ended, its report comes after. Keep `log_arg` valid
 * until tp_wait() or tp_destroy() has returned (they wait for every worker
 * thread). */
typedef void (*tp_log_fn)(void *log_arg, int level, const char *log_id, const char *msg);

/*
 * Pool configuration. Zero in any field means "the default", so
 * `tp_config c = {0}` and designated initialisers work. Values outside the
 * stated ranges make tp_create() return TP_EINVAL: nothing is clamped.
 * The struct is read during tp_create() only; `name` is copied.
 */
typedef struct tp_config {
    unsigned workers;           /* 0 -> 4 x online CPUs; 1..TP_MAX_WORKERS */
    unsigned max_workers;       /* 0 -> = workers (fixed); workers..TP_MAX_WORKERS: elastic */
    unsigned queue_capacity;    /* 0 -> 100; 1..TP_MAX_QUEUE_CAPACITY; waiting tasks only */
    unsigned max_per_user;      /* 0 -> 2; TP_UNLIMITED -> no limit (slots still counted) */
    uint64_t run_timeout_ns;    /* 0 -> 10 min; TP_FOREVER -> none; per attempt, from its start */
    uint64_t submit_timeout_ns; /* 0 -> 1 s; TP_FOREVER -> none; default budget of tp_submit_wait */
    uint64_t drain_timeout_ns;  /* 0 -> 20 s; TP_FOREVER -> none; default budget of tp_shutdown */
    /* 0 -> 5 min; TP_FOREVER -> never; elastic workers above `workers` exit
     * when idle this long. Elastic workers are added while the backlog
     * exceeds the idle workers -- by any admission (tp_submit,
     * tp_submit_wait, a batch, a group's submit: one thread by the call, the
     * rest the backlog wants by the service thread, one after the other) and
     * by a retry returning to the queue -- until tp_close(); after it the
     * workers present drain what is left. */
    uint64_t idle_timeout_ns;
    unsigned max_retries; /* 0 -> no retry; 0..TP_MAX_RETRIES */
    /* 0 -> 1 s; the delay before each retry (the first one, with
     * retry_delay_max_ns) */
    uint64_t retry_delay_ns;
    /* Thread-name prefix and the metrics' pool label, copied; NULL -> "tp";
     * at most TP_NAME_MAX bytes. Any bytes are accepted, "" and control
     * characters included: thread names are cut to what the OS takes, and
     * tp_metrics_format() escapes the name (Prometheus label and JSON rules;
     * bytes that are not UTF-8 become U+FFFD). */
    const char *name;
    tp_log_fn log; /* NULL -> failed attempts are written to stderr */
    void *log_arg;
    void (*on_worker_start)(void *hook_arg); /* optional; runs first on each worker thread */
    void (*on_worker_stop)(void *hook_arg);  /* optional; runs last on each worker thread */
    void *hook_arg;
    /* Since 1.2 (taken from the reserved tail; zero keeps 1.1's behaviour). */
    /* TP_SCHED_FIFO (0): within a priority lane, tasks start in admission
     * order. TP_SCHED_FAIR: within a lane, users take turns (section 14). */
    unsigned sched;
    /* 0 -> 16; TP_UNLIMITED -> strict priority. A lane that has waited this
     * many starts of higher lanes takes the next one (section 14). */
    unsigned prio_starve_limit;
    /* 0 -> no limit; else at most this many tasks of priority < 0 run at once
     * (at most max_workers, after defaults). */
    unsigned low_prio_max_running;
    unsigned reserved32; /* must be zero */
    /* 0 -> the fixed retry_delay_ns before every retry; else the delay doubles
     * per retry up to this: retry k (k = 1 for the first) waits
     * min(retry_delay_ns x 2^(k-1), retry_delay_max_ns). At least
     * retry_delay_ns (after defaults). */
    uint64_t retry_delay_max_ns;
    uint64_t reserved[5]; /* growth room (since 1.1): must be zero */
} tp_config;

/* ------------------------------------------------------------- 5. lifecycle */

/*
 * tp_create -- make a pool and start its `workers` threads and service thread.
 *   out: receives the pool; written only on TP_OK. cfg: NULL -> all defaults.
 *   Blocks only while threads start, while it touches the memory of a full
 *   queue (about 220 bytes per task of queue_capacity + max_workers; see
 *   tp_submit, "Memory": a few ms for 100,000 tasks), and the first call of
 *   a process for about 1 ms more (it reads /proc/cpuinfo and calibrates the
 *   latency histograms' clock against CLOCK_MONOTONIC, section 12).
 *   Thread-safe.
 *   TP_OK; TP_EINVAL (out NULL, a value out of range, max_workers < workers
 *   after defaults are resolved, name too long, a reserved word not zero,
 *   sched not a TP_SCHED_* value, low_prio_max_running > max_workers,
 *   retry_delay_max_ns set below retry_delay_ns); TP_ENOMEM (memory, a
 *   thread or a thread attribute could not be obtained: nothing is leaked and
 *   no thread is left running).
 *   Worker hooks: the `workers` threads run on_worker_start only once all of
 *   them exist, and tp_create waits for no hook, so a hook may wait for the
 *   application to have the pool (hook_arg) or call tp_default_create(). A
 *   create that fails runs no hook (neither start nor stop).
 */
TP_API int tp_create(tp_pool **out, const tp_config *cfg);

/*
 * tp_close -- stop admission; the workers drain everything already accepted
 * (including retries still to come), then exit.
 *   Never blocks beyond the pool lock. Idempotent. May be called from a task.
 *   TP_OK; TP_EINVAL (p NULL).
 */
TP_API int tp_close(tp_pool *p);

/*
 * tp_shutdown -- tp_close(), then wait up to `budget_ns` for every accepted
 * task to end and its on_done to return. budget_ns: 0 -> the configured
 * drain_timeout_ns; TP_FOREVER -> no limit.
 *   The countdown starts at the first tp_shutdown() call (or tp_destroy()):
 *   later and concurrent calls neither reset nor shorten it; they wait for the
 *   same outcome and return the same result.
 *   When the budget runs out the shutdown is *forced*: running tasks see
 *   cancellation (tp_ctx_err() -> TP_ECANCELED, the cancel fd turns readable,
 *   tp_ctx_sleep() returns), queued and retry-waiting tasks end with
 *   TP_ECANCELED without running (their on_done runs on the service thread),
 *   no retry happens any more, and TP_ETIMEDOUT is returned at once, without
 *   waiting for the running tasks to return.
 *   TP_OK (every accepted task ended within the budget; every on_done has
 *   returned); TP_ETIMEDOUT (forced); TP_EINVAL (p NULL); TP_EDEADLK (called on
 *   one of this pool's own threads: a task, an on_done, a hook; nothing done).
 */
TP_API int tp_shutdown(tp_pool *p, uint64_t budget_ns);

/*
 * tp_wait -- wait until every worker thread of the pool has exited and every
 * on_done has returned. Does not start a shutdown: called alone it waits for
 * someone else's tp_close()/tp_shutdown(). timeout_ns: 0 or TP_FOREVER -> no
 * limit. Repeatable and concurrent.
 *   TP_OK (drained; a tp_close() alone also drains to TP_OK); TP_ETIMEDOUT (the
 *   shutdown had to be forced, or this call's own timeout ran out first);
 *   TP_EINVAL (p NULL); TP_EDEADLK (called on one of this pool's own threads).
 */
TP_API int tp_wait(tp_pool *p, uint64_t timeout_ns);

/*
 * tp_destroy -- if no shutdown was started, tp_shutdown(p, 0); then
 * tp_wait(p, TP_FOREVER); then join every thread and free everything.
 *   Blocks until all tasks have returned (a task that never returns blocks it
 *   forever). No other call on `p` may run concurrently with it or after it.
 *   TP_OK (the pool is freed, whether its drain finished or was forced; ask
 *   tp_shutdown()/tp_wait() for that result); TP_EINVAL (p NULL); TP_EDEADLK
 *   (called on one of this pool's own threads; nothing done, pool untouched).
 */
TP_API int tp_destroy(tp_pool *p);

/* ------------------------------------------------------------- 6. admission */

/* A task. Returns 0 for success, anything else for a failed attempt (which is
 * retried when the pool has max_retries). The context is valid during the call. */
typedef int (*tp_fn)(tp_ctx *ctx, void *arg);

/* Called exactly once per accepted task, after its final outcome, on a pool
 * thread (a worker or the service thread), never inside tp_cancel() or
 * tp_shutdown() (so never on an application thread) -- except for a task
 * bound to a completion queue (tp_task_opts.cq), whose on_done runs inside
 * tp_cq_drain() on the thread that drains it (section 15). `status`: what the function returned on its last
 * attempt (0 is success even if the task was cancelled meanwhile), or
 * TP_ETIMEDOUT / TP_ECANCELED for a task ended without running (expired,
 * cancelled while queued or waiting for a retry, dropped by a forced shutdown;
 * TP_ETIMEDOUT also when its deadline passed while it waited for a retry),
 * or TP_ENOMEM for a staged submit's task that could not have a record
 * (see tp_submit, "Since 1.2": only when memory runs out).
 * Before it runs the task's counters are updated and its user slot released.
 * It is the place to free `arg`. */
typedef void (*tp_done_fn)(void *arg, int status);

/* Per-task options; a NULL opts means all zero. Read during the submit only.
 *
 * Deadline: a task still queued when its deadline passes ends then, without
 * running, with TP_ETIMEDOUT (counted expired; on_done on the service thread,
 * promptly even while every worker is busy -- the service thread looks for
 * such tasks in batches, at most 1 ms plus 16 ns per waiting task apart, so
 * "then" may be that much late; its queue place and user slot are freed),
 * or when a worker picks it, whichever comes first. Each look visits every
 * waiting task with the pool lock held, so it costs O(waiting tasks) --
 * some 10 ms per 10^5 waiting tasks whose records are not in cache -- and
 * it happens only when the deadline of a waiting task may have passed. A
 * running task sees it in tp_ctx_err() like a run timeout; a retry is not
 * scheduled past it, and a task waiting for a retry when it passes ends with
 * TP_ETIMEDOUT (cancelled, not expired: it ran). */
typedef struct tp_cq tp_cq; /* a completion queue (section 15) */

typedef struct tp_task_opts {
    const char *user;        /* NULL or "" -> no per-user accounting; copied; at most TP_USER_MAX bytes */
    uint64_t run_timeout_ns; /* 0 -> pool default; TP_FOREVER -> none */
    uint64_t deadline_ns;    /* absolute tp_now_ns() time, queueing included; 0 -> none */
    tp_done_fn on_done;      /* optional */
    /* NULL -> inherited from the submitting thread, or generated; copied; at
     * most TP_LOG_ID_MAX bytes */
    const char *log_id;
    /* Since 1.2: TP_PRIO_MIN..TP_PRIO_MAX; 0 (the default) is normal, a higher
     * priority starts first (section 14). Out of range -> TP_EINVAL. */
    int priority;
    /* Since 1.2 (taken from the reserved tail): NULL -> on_done runs on a pool
     * thread; else on_done, which is then required, runs inside tp_cq_drain()
     * of this completion queue, on the thread that drains it (section 15).
     * (A union only so that the struct keeps its size where pointers are
     * 32 bits.) */
    union {
        tp_cq *cq;
        uint64_t cq_word_;
    };
    uint64_t reserved[3]; /* growth room (since 1.1): must be zero */
} tp_task_opts;

/*
 * tp_submit -- admit `fn(ctx, arg)` without ever waiting for space.
 *   Checks in this order: arguments (TP_EINVAL: p or fn NULL, priority out
 *   of TP_PRIO_MIN..TP_PRIO_MAX, a reserved word not zero, user or log_id
 *   too long, a cq without an on_done), closed (TP_ECLOSED), the user's
 *   limit (TP_EUSERLIMIT), space (TP_EFULL: queued + delayed >=
 *   queue_capacity, running tasks do not count; or, with opts->cq, every
 *   place of that completion queue taken). A rejection leaves no trace but its counter: no slot
 *   stays reserved, no id is consumed, on_done is not called, and the caller
 *   still owns `arg`. TP_EINVAL changes no counter at all.
 *   Memory: a task that ended without running and has an on_done keeps its
 *   record until the service thread has run that on_done. Records for
 *   4 x (queue_capacity + max_workers) + 64 tasks are preallocated (at most
 *   16384, but never fewer than queue_capacity + max_workers + 64: a full
 *   pool never allocates); a cancel storm that outruns the service thread
 *   grows them in chunks, kept for reuse (a failed allocation refuses with
 *   TP_ENOMEM). A hard cap of queue_capacity + max_workers + max(3 x that,
 *   65536) tasks in flight (accepted, and on_done not yet returned or
 *   handed to its completion queue) bounds memory if the service thread is
 *   stuck in a blocking on_done: at it, tp_submit refuses with TP_EFULL even
 *   below queue_capacity (tp_submit_wait waits until one of them is done).
 *   Plain submits (below), accepted before they get their record, may hold
 *   up to queue_capacity + 2 x max_workers more. Both refusals are counted
 *   in rejected_full. Arrays of 2 MiB or more (the ring, the records, the id
 *   index) are 2 MiB-aligned and marked for transparent huge pages
 *   (madvise, a hint).
 *   tp_create touches the preallocated records and the ring (about 192 +
 *   16..32 bytes per task of queue_capacity + max_workers: 235 MB at
 *   TP_MAX_QUEUE_CAPACITY; a FIFO pool with fixed workers adds 64 bytes
 *   per place for the plain submits' ring, at most 2 MiB), so that the
 *   first burst that fills the queue takes no page fault under the pool
 *   lock.
 *   On TP_OK `arg` belongs to the pool until on_done(arg, status) and
 *   *id_out (if not NULL) holds the task id: unique in this pool, never 0.
 *   A deadline already passed is accepted; the task then expires unrun.
 *   Nothing of the caller is borrowed after the call (user, log id copied).
 *   Blocks only on the pool lock (a plain submit, below, on its ring's
 *   put lock instead; with a cq, briefly on that queue's lock too), except
 *   that in an elastic pool it may start a worker thread.
 *   Thread-safe; may be called from a task or an on_done.
 *   Since 1.2, a plain submit -- opts NULL; or opts that set cq and
 *   on_done and nothing else; or, to tp_submit() only, opts that set a user
 *   and nothing else but, if any, an on_done with its cq; id_out NULL; from
 *   a thread with no log id (tp_log_id_get() empty: not inside a task or an
 *   on_done, no tp_log_id_set) -- to a TP_SCHED_FIFO pool with fixed workers
 *   (max_workers = workers) does not take the pool lock; nor does one of
 *   the third kind (a user) to a TP_SCHED_FAIR pool with fixed workers
 *   (the others take it there). Such a submit takes its
 *   place (and its completion queue's), hands the task to the next worker
 *   or locked call through a bounded ring under the ring's own put-side
 *   lock (the two-lock queue: submitters hold it for a few dozen
 *   instructions, workers never wait for it but to let a submit that holds
 *   it finish) and returns; the answers, the counters and one
 *   thread's start order are the locked path's (a later locked submit of any
 *   thread first admits what was handed over before it, waiting on the
 *   ring's lock for a submit that is handing over; in a fair pool the start
 *   order is the one its admission at the submit would give: a worker
 *   admits what was handed over before a start that it could change).
 *   Such a task is admitted
 *   later, so should its record then fail to be allocated (only past the
 *   preallocated records, see Memory) it ends unrun, counted as failed,
 *   instead of being refused with TP_ENOMEM: its on_done, if it has one,
 *   runs in a drain of its queue with status TP_ENOMEM.
 */
TP_API int tp_submit(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out);

/*
 * tp_submit_wait -- like tp_submit(), but waits for space *and* for a user
 * slot, sharing one budget. budget_ns: 0 -> the pool's submit_timeout_ns;
 * TP_FOREVER -> no limit. The budget starts after the argument checks and
 * covers acquiring the pool lock: a call that finds its budget spent is
 * rejected with TP_ETIMEDOUT even if space exists at that moment.
 *   TP_OK; TP_EINVAL; TP_ECLOSED (closed before or during the wait: a close
 *   wakes every waiter at once); TP_ETIMEDOUT (budget spent); TP_ENOMEM as for
 *   tp_submit(). Never returns TP_EFULL or TP_EUSERLIMIT. Ownership as for
 *   tp_submit(). Thread-safe. From inside a task of the same pool it may wait
 *   its whole budget if that task's own worker is needed to make room. From an
 *   on_done running on the pool's service thread it never waits (it would
 *   stall the retries and endings that free room): without room at once it
 *   returns TP_ETIMEDOUT.
 *   Since 1.2, a plain task (as tp_submit's "plain submit", below it) that
 *   finds a place free at once is handed over as tp_submit hands it over,
 *   without the pool lock, with the same consequence for a record that
 *   cannot be allocated later (it ends unrun with TP_ENOMEM instead of a
 *   refusal); without a place it waits under the pool lock as above.
 */
TP_API int tp_submit_wait(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t budget_ns,
                          uint64_t *id_out);

/* One task of a batch (tp_submit_batch). Since 1.1. Zero-initialise it
 * (`= {0}`, designated initialisers, a compound literal): the reserved tail
 * must be zero, as in the other public structs. */
typedef struct tp_task {
    tp_fn fn;
    void *arg;
    const tp_task_opts *opts; /* NULL: defaults */
    uint64_t reserved[2];     /* growth room (since 1.1): must be zero */
} tp_task;

/*
 * tp_submit_batch -- admit tasks[0..k), a prefix of the n tasks, in order, in
 * one pass (under the pool lock, or see below); never waits for space. Since
 * 1.1.
 *   Each task is checked as tp_submit() would check it (arguments, closed,
 *   its user's limit, space), in array order, and the batch stops at the
 *   first task that tp_submit() would refuse; the tasks after it are not
 *   tried and not counted. Returns TP_OK when k == n, else that task's
 *   refusal: TP_EINVAL (its fn is NULL, a reserved word of it is not zero,
 *   or its opts are bad, as for tp_submit), TP_ECLOSED,
 *   TP_EUSERLIMIT, TP_EFULL (also, as for tp_submit, when task records are at
 *   their cap) or TP_ENOMEM. A batch whose own arguments are bad -- p NULL,
 *   or tasks NULL with n > 0 -- returns TP_EINVAL with k = 0.
 *   n == 0 returns TP_OK with k = 0 and changes nothing.
 *   *accepted_out (if not NULL) is set to k on every return, errors included.
 *   ids_out (if not NULL) must have room for n ids: ids_out[i] is set to the
 *   id of tasks[i] for i < k and left untouched from k on.
 *   Order: the k accepted tasks of each priority sit next to each other in
 *   their own lane (section 14), in array order, with no other submitter's
 *   task between them; in a TP_SCHED_FIFO pool those of one lane start in
 *   that order (in a TP_SCHED_FAIR pool, each user's tasks are adjacent in
 *   that user's list of the lane). Tasks admitted in one batch count
 *   against the same limits as k calls of tp_submit() would: a batch of
 *   tasks of one user is cut at that user's max_per_user, a batch larger
 *   than the free space is cut at queue_capacity.
 *   Counters: as k accepted calls of tp_submit() plus, when a task was
 *   refused for anything but TP_EINVAL, one refused call (submitted counts
 *   k + 1, the matching rejected_* counts 1). TP_EINVAL counts nowhere.
 *   Ownership: tasks[i].arg of an accepted task belongs to the pool until its
 *   on_done, as for tp_submit(); from k on every arg stays the caller's and
 *   no on_done is called for them. The array, the options and their strings
 *   are read during the call only (user and log id are copied); a task
 *   without an explicit log id inherits the calling thread's, or gets a
 *   generated one, as for tp_submit().
 *   Blocks only on the pool lock (once per call, however large n is), except
 *   that in an elastic pool it may start one worker thread (the service
 *   thread starts the others that the batch's backlog wants). Thread-safe; may
 *   be called from a task or an on_done.
 *   Since 1.2, a batch whose tasks are all plain (as tp_submit's "plain
 *   submit"; ids_out NULL) is handed over as tp_submit hands one task over,
 *   all of it under one hold of the ring's put lock instead of the pool
 *   lock (answers, counters and order as above); a record that cannot be
 *   allocated later ends such a task unrun with TP_ENOMEM, as there.
 */
TP_API int tp_submit_batch(tp_pool *p, const tp_task *tasks, size_t n, uint64_t *ids_out,
                           size_t *accepted_out);

/*
 * tp_cancel -- cancel an accepted task that has not reached its final outcome.
 *   Queued or waiting for a retry: it ends with TP_ECANCELED without running
 *   (its on_done runs on the service thread). Running: its context is
 *   cancelled and it must cooperate; it ends with whatever it returns and is
 *   not retried. Cancel and completion race: exactly one outcome wins and
 *   on_done still runs once.
 *   TP_OK; TP_ENOTFOUND (unknown id, already ended, or already cancelled while
 *   queued); TP_EINVAL (p NULL or id 0). Never blocks beyond the pool lock.
 *   Thread-safe; may be called from a task.
 *   Cost: O(1) for a running or retry-waiting task and for a queued task
 *   in a list lane: any priority of a TP_SCHED_FAIR pool, a priority other
 *   than 0 of a TP_SCHED_FIFO pool. A TP_SCHED_FIFO pool keeps its queued
 *   tasks of priority 0 in 1.1's ring: cancelling one closes the gap from
 *   the nearer end, min(tasks ahead of it, tasks behind it) moves with the
 *   pool lock held (O(1) at the head or the tail; 10 ms and more in the middle
 *   of 2^20 queued tasks, during which nothing is admitted or started). A
 *   pool that cancels queued tasks of a deep queue is better made TP_SCHED_FAIR.
 *   In a TP_SCHED_FAIR pool with fixed workers, a cancel of its user's last
 *   queued task of priority 0 first admits the plain submits handed over
 *   before it (tp_submit, "Since 1.2") if one of that user's may be among
 *   them: up to queue_capacity admissions (at most 32768), each one that a
 *   worker would otherwise make, with the pool lock held.
 *   The first call on a pool also makes the pool index its task ids from
 *   then on (a pass over its task records, with the pool lock held); a pool
 *   that never calls it keeps no index.
 */
TP_API int tp_cancel(tp_pool *p, uint64_t id);

/* ------------------------------------------------ 7. the running task's context */

/* These take the context given to the running task function and may be called
 * only by that task, during its call. With a NULL context they do nothing and
 * return: TP_EINVAL (tp_ctx_err, tp_ctx_sleep, tp_ctx_fd), TP_FOREVER
 * (tp_ctx_deadline), 0 (tp_ctx_id, tp_ctx_attempt), NULL (tp_ctx_user) or ""
 * (tp_ctx_log_id). */

/* 0, TP_ECANCELED (tp_cancel or forced shutdown; takes precedence), or
 * TP_ETIMEDOUT (the run timeout or the deadline, whichever is earlier, has
 * passed). Never blocks. */
TP_API int tp_ctx_err(const tp_ctx *c);

/* Sleep `ns`, returning early on cancellation or when the task's effective
 * deadline passes. 0 after the full time, else the tp_ctx_err() value; returns
 * at once when that is already non-zero. */
TP_API int tp_ctx_sleep(tp_ctx *c, uint64_t ns);

/* A descriptor that becomes readable (POLLIN) when the task is cancelled
 * (tp_cancel, forced shutdown) -- not when a timeout passes: bound your poll()
 * timeout by tp_ctx_deadline(). The pool owns it: never read, write or close
 * it. It is clean again for the next task. Created on first use per worker;
 * returns TP_ENOMEM (negative) if no descriptor could be made. */
TP_API int tp_ctx_fd(tp_ctx *c);

/* Effective absolute deadline (the earlier of start + run timeout and the task
 * deadline), TP_FOREVER if none. */
TP_API uint64_t tp_ctx_deadline(const tp_ctx *c);
TP_API uint64_t tp_ctx_id(const tp_ctx *c);
/* The task's user, NULL if none. Valid during the call. */
TP_API const char *tp_ctx_user(const tp_ctx *c);
/* The task's log id, never NULL. Valid during the call. */
TP_API const char *tp_ctx_log_id(const tp_ctx *c);
/* 0 on the first run, n on the n-th retry. */
TP_API unsigned tp_ctx_attempt(const tp_ctx *c);

/* CLOCK_MONOTONIC in nanoseconds: the clock of deadlines. */
TP_API uint64_t tp_now_ns(void);

/* ------------------------------------------------------------- 8. statistics */

typedef struct tp_stats {
    uint64_t submitted; /* calls that passed argument checks */
    uint64_t accepted;
    uint64_t rejected; /* sum of the four below */
    uint64_t rejected_full, rejected_user, rejected_closed, rejected_timeout;
    uint64_t started;   /* tasks whose function was called at least once */
    uint64_t retried;   /* extra attempts started */
    uint64_t completed; /* accepted tasks that reached their final outcome */
    uint64_t succeeded;
    uint64_t failed;    /* completed with a non-zero status, cancelled included */
    uint64_t cancelled; /* failed with TP_ECANCELED or TP_ETIMEDOUT, expired included */
    uint64_t expired;   /* deadline passed before the first start: never ran */
    uint32_t active;    /* running now */
    uint32_t queued;    /* waiting in the queue now */
    uint32_t delayed;   /* waiting for a retry now */
    uint32_t workers;   /* live worker threads */
    uint32_t idle;      /* workers waiting for work */
    uint32_t users;     /* users holding at least one slot */
    /* Since 1.2: how long the task that has waited longest among those queued
     * now (every lane; a retry counts from its return to the queue; tasks
     * waiting for their retry delay are not queued) has waited, as of the
     * snapshot; 0 when none is queued. */
    uint64_t oldest_wait_ns;
    uint64_t reserved[15]; /* growth room (since 1.1): written as zero */
} tp_stats;

/*
 * tp_stats_get -- a snapshot of the counters, read without blocking admission.
 * While the pool runs the fields are not one instant: each is exact when read,
 * but they are read one after another while tasks move. The counters are read
 * in an order that keeps these true in every snapshot (since 1.1):
 *   submitted >= accepted + rejected, accepted >= completed,
 *   accepted >= started, completed >= succeeded + failed,
 *   failed >= cancelled >= expired.
 * Sums across the gauges can be off by the tasks that moved meanwhile -- e.g. active + queued +
 * delayed may show more than max_workers + queue_capacity when a task is
 * counted in `active` and, after its attempt failed, again in `delayed` or
 * `queued` read a moment later. (Separately, queued + delayed
 * itself may exceed queue_capacity for a moment: a failed attempt that waits
 * for its retry enters `delayed` whatever the queue holds; the bound of the
 * pool is on active + queued + delayed, which that move does not change.)
 * Reading synchronizes (since 1.1): counters are stored with release and read
 * with acquire, so after reading completed >= n (or succeeded, failed,
 * cancelled, expired) the caller sees everything the counted tasks' functions
 * wrote. Not what their on_done wrote: on_done runs after the task is
 * counted; wait for it with tp_wait() or a task group. At rest (after tp_wait()
 * returned TP_OK or TP_ETIMEDOUT with every task ended) these hold exactly:
 *   submitted == accepted + rejected, accepted == completed,
 *   completed == succeeded + failed, cancelled <= failed, expired <= cancelled,
 *   active == queued == delayed == users == 0.
 * Does nothing if p or out is NULL.
 */
TP_API void tp_stats_get(tp_pool *p, tp_stats *out);

/* Slots `user` holds now (accepted, unfinished tasks). 0 for NULL/""/unknown
 * users and for a NULL pool. Takes the pool lock briefly. */
TP_API unsigned tp_user_active(tp_pool *p, const char *user);

/*
 * tp_stats_format -- write `s` as TP_FORMAT_JSON (one object whose keys are the
 * field names) or TP_FORMAT_PROMETHEUS (text exposition format with # HELP and
 * # TYPE lines; counters taskpool_<field>_total, gauges taskpool_<field>,
 * except oldest_wait_ns, written in seconds as the gauge
 * taskpool_oldest_wait_seconds since 1.2).
 * Behaves like snprintf: returns the length needed, NUL excluded, writes at
 * most `len` bytes and always NUL-terminates a non-empty buffer. buf may be
 * NULL when len is 0. TP_EINVAL: s NULL, buf NULL with len > 0, unknown format.
 */
TP_API int tp_stats_format(const tp_stats *s, int format, char *buf, size_t len);

/* ------------------------------------------------------ 9. log ids, logging */

/*
 * Every accepted task carries a log id: opts->log_id, else the submitting
 * thread's current one (tp_log_id_get()), else a freshly generated one, unique
 * in the process: "tp-" then three hex fields joined by '-' (a per-process
 * tag, the pool's serial, the task id), e.g. "tp-5f3a9c01-1-2a". Retries keep it. While a task (or its
 * on_done) runs, the worker thread's current log id is the task's, so work it
 * submits inherits it.
 *
 * Every failed attempt is reported to the pool's log hook (default: stderr)
 * with the task id, log id, attempt and status: TP_LOG_WARN when a retry
 * follows, TP_LOG_ERROR when it was the last.
 */

/* Set this thread's current log id (copied, truncated to TP_LOG_ID_MAX bytes);
 * NULL or "" clears it. Inside a task (or an on_done the pool runs) it replaces
 * the task's id for the rest of the call only: the thread's own id, such as one
 * a worker set in on_worker_start, is untouched and current again once the
 * call returns. */
TP_API void tp_log_id_set(const char *log_id);
/* This thread's current log id, or NULL if none. Inside a task: the task's.
 * Valid until the next tp_log_id_set() on this thread or the task's end. */
TP_API const char *tp_log_id_get(void);

/* ------------------------------------------------------ 10. the default pool */

/* One process-wide pool registered for convenience. All are thread-safe; the
 * registration itself is atomic, but the caller keeps a pool alive while others
 * may still use it through tp_default(). */

/* Create a pool with `cfg` and register it. TP_EINVAL when one is already
 * registered (use tp_default_swap() to replace it) or cfg is invalid;
 * TP_ENOMEM as tp_create(). */
TP_API int tp_default_create(const tp_config *cfg);
/* The registered pool, or NULL. */
TP_API tp_pool *tp_default(void);
/* Register `p` (NULL clears); returns the previous one, which is not closed:
 * its owner still shuts it down and destroys it. */
TP_API tp_pool *tp_default_swap(tp_pool *p);
/* tp_submit / tp_shutdown / tp_wait on the registered pool; TP_ENODEFAULT
 * when none is registered. */
TP_API int tp_default_submit(tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out);
TP_API int tp_default_shutdown(uint64_t budget_ns);
TP_API int tp_default_wait(uint64_t timeout_ns);

/* ------------------------------------------------- 11. task groups (Since 1.1) */

/*
 * A group is a set of tasks of one pool, in the manner of Go's errgroup: wait
 * for all of them, learn the first failure, cancel the rest. Members are
 * ordinary tasks: every promise of section 6 holds for them (one ending each,
 * on_done exactly once, the start order of every task of the pool (section
 * 14: a member waits in the lane of its own priority), the same counters,
 * users and options). A member costs no allocation: the group is allocated
 * once by tp_group_create(), and the links are part of the task record.
 *
 * The group's error is the final status of the first member to fail, in the
 * order members ended (0 until one fails). It is sticky: a group used again
 * after a wait keeps it, as does its cancellation. A member that succeeds
 * after being cancelled (it returned 0) is a success.
 *
 * A cancelled or expired member has failed like any other, so in a
 * TP_GROUP_CANCEL_ON_ERROR group one member ended by tp_cancel() with its id,
 * or by its own deadline, cancels the whole group, and the group's error is
 * that member's status: TP_ECANCELED when cancelled by id while queued or
 * waiting for a retry; what it returns when cancelled by id while running
 * (0 is a success and cancels nothing); TP_ETIMEDOUT when its deadline passed
 * while queued (expired) or while it waited for a retry. To cancel one member
 * alone, use a group without TP_GROUP_CANCEL_ON_ERROR.
 *
 * Lifetime: destroy a pool's groups before the pool. If a pool is destroyed
 * first (which waits for every member, like every task), its groups are
 * detached, not freed: on a detached group tp_group_submit() counts nothing
 * and answers in the order of an attached group -- TP_EINVAL for bad
 * arguments (a NULL g or fn, bad options), then TP_ECANCELED if the group was
 * cancelled, else TP_ECLOSED --, tp_group_wait() returns the group's result at
 * once, tp_group_cancel() returns TP_OK and does nothing, and
 * tp_group_destroy() frees it. Those calls must not run concurrently with
 * tp_destroy() of the pool (as no call on the pool may).
 *
 * Thread-safety: every tp_group_* call may run concurrently with any other
 * call on the same group or pool, except tp_group_destroy() (no call on the
 * group may start once it has started; calls already waiting in
 * tp_group_wait() are allowed and return first). All take the pool lock.
 */
typedef struct tp_group tp_group; /* opaque */

#define TP_GROUP_CANCEL_ON_ERROR 1u /* the first failed member cancels the others */

/*
 * tp_group_create -- make an empty group of pool `p`. Since 1.1.
 *   flags: 0 or TP_GROUP_CANCEL_ON_ERROR. *out receives the group (written
 *   only on TP_OK). A group may be created on a closed pool (its submits are
 *   then refused with TP_ECLOSED). Blocks only on the pool lock. Thread-safe;
 *   may be called from a task or an on_done.
 *   TP_OK; TP_EINVAL (p or out NULL, an unknown flag); TP_ENOMEM.
 */
TP_API int tp_group_create(tp_pool *p, unsigned flags, tp_group **out);

/*
 * tp_group_submit -- tp_submit() into the group's pool, the task becoming a
 * member if it is accepted. Since 1.1.
 *   Admission is exactly tp_submit()'s: the same checks in the same order, the
 *   same refusals and counters, never waits; ownership of `arg` as for
 *   tp_submit() (on_done(arg, status) exactly once for an accepted member; a
 *   refused task is not a member and its arg stays the caller's).
 *   After tp_group_cancel(), or after a TP_GROUP_CANCEL_ON_ERROR group's first
 *   failure, it returns TP_ECANCELED and counts nothing (no stats counter
 *   moves); argument errors are still TP_EINVAL first.
 *   TP_OK (*id_out, if not NULL, holds the id: tp_cancel() works on members);
 *   TP_EINVAL (g or fn NULL, bad opts as tp_submit()); TP_ECANCELED;
 *   TP_ECLOSED (the pool is closed, counted as tp_submit() does; or the pool
 *   was destroyed, counting nothing); TP_EUSERLIMIT; TP_EFULL; TP_ENOMEM.
 *   Thread-safe; may be called from a task or an on_done (also a member's).
 */
TP_API int tp_group_submit(tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out);

/*
 * tp_group_wait -- wait until the group has no unfinished member: every
 * member has ended and its on_done has returned (a member bound to a
 * completion queue: its completion is queued, section 15), members submitted
 * while it waits included (as Go's WaitGroup). Since 1.1.
 *   timeout_ns: 0 or TP_FOREVER -> no limit. A group with no member returns at
 *   once. Several threads may wait at once; a wait that times out changes
 *   nothing (no member is cancelled, the group stays usable).
 *   TP_OK (every member that ended succeeded); the group's error (the final
 *   status of the first member to fail, e.g. TP_ECANCELED after
 *   tp_group_cancel(); never a TP_ECANCELED caused by TP_GROUP_CANCEL_ON_ERROR);
 *   TP_ETIMEDOUT (the timeout passed first -- a member whose final status was
 *   TP_ETIMEDOUT also makes the group's error TP_ETIMEDOUT: a caller that must
 *   tell them apart compares tp_now_ns() with its own deadline, since a wait
 *   that times out returns only after timeout_ns has passed); TP_EINVAL (g
 *   NULL); TP_EDEADLK (called on a thread of the group's pool: a task, an
 *   on_done or a worker hook; returns at once).
 *   Blocks; never holds the pool lock while it sleeps.
 */
TP_API int tp_group_wait(tp_group *g, uint64_t timeout_ns);

/*
 * tp_group_cancel -- cancel every unfinished member as tp_cancel() would, and
 * refuse later submits with TP_ECANCELED. Since 1.1.
 *   Queued and retry-waiting members end with TP_ECANCELED without running
 *   (their on_done runs on the pool's service thread); running members see
 *   cancellation through their context and end with what they return, not
 *   retried. Idempotent. Never blocks beyond the pool lock (held for all the
 *   members, each at tp_cancel()'s cost); does not wait for the members to
 *   end (tp_group_wait() does). Thread-safe; may be called from a task or an
 *   on_done.
 *   TP_OK; TP_EINVAL (g NULL).
 */
TP_API int tp_group_cancel(tp_group *g);

/*
 * tp_group_destroy -- wait as tp_group_wait(g, TP_FOREVER) does (every member
 * ended and its on_done returned), and for the threads already inside
 * tp_group_wait(g) to leave it, then free the group. Since 1.1.
 *   It does not cancel: call tp_group_cancel() first to end early. No call on
 *   `g` may start once it has started, or after it.
 *   TP_OK (freed); TP_EINVAL (g NULL); TP_EDEADLK (called on a thread of the
 *   group's pool; nothing done, the group untouched).
 */
TP_API int tp_group_destroy(tp_group *g);

/* ------------------------------------------ 12. latency histograms (Since 1.1) */

/*
 * Every pool records two latency histograms:
 *   TP_HIST_QUEUE_WAIT  per attempt that starts: the time from the task's
 *                       admission (or, for a retry, its return to the queue)
 *                       to the start of the attempt;
 *   TP_HIST_RUN         per attempt: its run time, from its start to the
 *                       return of the task function.
 * Tasks that end without running (expired, cancelled while waiting, dropped by
 * a forced shutdown) record nothing. At rest (after tp_wait()) the count of
 * each equals stats.started + stats.retried.
 *
 * Buckets are log-linear: bucket 0 holds 0..128 ns; above it every power of
 * two is split into 8 equal buckets, up to 2^42 ns (73 minutes); the last
 * bucket holds everything above. Upper bounds are inclusive and rise strictly;
 * from 128 ns on each is at most 12.5 % above the one before, so a quantile
 * read from them is off by at most one bucket's width. tp_hist_bound_ns() gives
 * them.
 *
 * Recording takes no lock and allocates nothing: each worker slot of the pool
 * owns its counters (allocated once by tp_create(): max_workers x about 4.6 KB,
 * touched only by the slots that run) and is their only writer. The clock is
 * read at admission (before the pool lock) and at the end of each attempt;
 * the start of an attempt is read too, except when its worker comes straight
 * from ending another attempt that had no on_done and did not fail: that end
 * (or the task's admission, if later) is then the start, so the worker's
 * hand-off between the two (some 100 ns) counts as run time of the new attempt
 * rather than as its queue wait. (The run timeout does not use these stamps:
 * it counts from the attempt's start on CLOCK_MONOTONIC, never from a moment
 * before the task was admitted.)
 */
enum { TP_HIST_QUEUE_WAIT = 0, TP_HIST_RUN = 1 };
/* Since 1.2: tp_hist_get()'s `which` for the queue-wait histogram of one
 * priority lane (TP_PRIO_MIN..TP_PRIO_MAX): one observation per attempt that
 * starts in that lane, so at rest its count equals the lane's `started`; the
 * five lanes' counts sum to TP_HIST_QUEUE_WAIT's. */
#define TP_HIST_QUEUE_WAIT_PRIO(prio) (16 - TP_PRIO_MIN + (prio))
#define TP_HIST_BUCKETS               282

typedef struct tp_hist {
    uint64_t count;                    /* observations: always the sum of buckets[] */
    uint64_t sum_ns;                   /* their sum, in ns */
    uint64_t buckets[TP_HIST_BUCKETS]; /* non-cumulative counts; bucket i holds (bound(i-1), bound(i)] */
    uint64_t reserved[4];              /* growth room: written as zero by tp_hist_get() */
} tp_hist;

/*
 * tp_hist_get -- a snapshot of histogram `which` of pool `p`. Since 1.1.
 *   Lock-free and never blocks: it sums the counters of every worker slot
 *   (O(max_workers x TP_HIST_BUCKETS) relaxed loads). Every snapshot, also one
 *   taken while tasks run, has count == the sum of buckets[]; sum_ns covers
 *   only observations that are counted, and may lag behind them by those in
 *   flight. Thread-safe; may be called from a task.
 *   TP_OK; TP_EINVAL (p or out NULL, `which` not TP_HIST_QUEUE_WAIT,
 *   TP_HIST_RUN or TP_HIST_QUEUE_WAIT_PRIO(prio) of a valid prio; *out is
 *   then untouched).
 */
TP_API int tp_hist_get(tp_pool *p, int which, tp_hist *out);

/* The inclusive upper bound of `bucket`, in ns: 128 for bucket 0, UINT64_MAX
 * for the last (TP_HIST_BUCKETS - 1), 0 for an index out of range. Since 1.1. */
TP_API uint64_t tp_hist_bound_ns(unsigned bucket);

/*
 * tp_hist_quantile_ns -- the smallest bucket bound b such that at least
 * q x h->count observations are <= b: the upper bound of the bucket holding
 * quantile q. Since 1.1.
 *   q is clamped to [0, 1] (NaN counts as 0); q = 0 gives the first bound. 0
 *   for a NULL or empty histogram. UINT64_MAX when the quantile lies in the
 *   last bucket (or h->count exceeds the sum of its buckets). Pure function.
 */
TP_API uint64_t tp_hist_quantile_ns(const tp_hist *h, double q);

/* ---------------------------------------- 13. metrics for several pools (Since 1.1) */

/*
 * tp_metrics_format -- one document with the statistics, capacity, both
 * histograms and (since 1.2) the priority lanes of `n` pools. Since 1.1.
 *
 * TP_FORMAT_PROMETHEUS (text exposition format 0.0.4): each family has one
 * "# HELP" and one "# TYPE" line, then its samples, one per pool in the order
 * given, each labelled pool="<tp_config.name>" (backslash, double quote and
 * newline escaped as \\, \" and \n; bytes that are not UTF-8 become U+FFFD).
 *   taskpool_<field>_total   counters of section 8 (submitted, ..., expired)
 *   taskpool_<field>         gauges of section 8 (active, ..., users)
 *   taskpool_oldest_wait_seconds
 *                            since 1.2: oldest_wait_ns, in seconds
 *   taskpool_workers_max, taskpool_queue_capacity, taskpool_max_per_user
 *                            the resolved configuration (max_per_user of an
 *                            unlimited pool is +Inf)
 *   taskpool_queue_wait_seconds, taskpool_run_seconds
 *                            histograms in seconds: 24 finite `le` bounds
 *                            (since 1.2; 1.1 wrote all 281), ascending, then
 *                            le="+Inf", _sum and _count; +Inf equals _count
 *                            (each is one snapshot)
 *   taskpool_lane_started_total, taskpool_lane_queued, taskpool_lane_running,
 *   taskpool_lane_queue_wait_seconds
 *                            since 1.2, per pool and lane, labelled also
 *                            priority="-2".."2": tp_lane_stats_get() and the
 *                            lane's queue-wait histogram
 *                            (TP_HIST_QUEUE_WAIT_PRIO)
 *   taskpool_build_info{version="<tp_version()>"} 1   (no pool label)
 * Every histogram series has the same 24 finite `le` bounds: a fixed subset
 * of the exact bucket bounds (tp_hist_bound_ns() of buckets 24, 34, 45, ...,
 * 277), spread evenly on a log scale from 1.024 us to about an hour
 * (3573.41 s), each with the exact cumulative count up to it.
 * The output passes `promtool check metrics` without findings.
 *
 * TP_FORMAT_JSON: {"version":"<tp_version()>","pools":{"<name>":{...},...}},
 * each pool object holding the section 8 fields by name, "workers_max",
 * "queue_capacity", "max_per_user" (null when unlimited), and
 * "queue_wait" / "run": {"count":N,"sum_ns":S,"buckets":[[bound_ns,count],...]}
 * listing the non-empty buckets in ascending order (non-cumulative counts;
 * every bucket, not the subset of the Prometheus text; the last bound is
 * 18446744073709551615). Since 1.2 also "oldest_wait_ns" (with the section 8
 * fields) and "lanes": {"-2":{"started":N,"queued":N,"running":N,
 * "queue_wait":{...}},...,"2":{...}}. Names are JSON-escaped.
 *
 * Each pool is read as tp_stats_get(), tp_lane_stats_get() and tp_hist_get()
 * read it, without its lock: while pools run, the figures of one pool are not one instant.
 * Behaves like snprintf: returns the length needed (NUL excluded), writes at
 * most `len` bytes and NUL-terminates a non-empty buffer; buf may be NULL when
 * len is 0. Since the pools keep running, a second call may need more room
 * than the first one said: leave some slack or retry. n == 0 gives a document
 * with no pool (in Prometheus text, every family's # HELP and # TYPE lines
 * and one sample: build_info's).
 *   >= 0 (length); TP_EINVAL (pools NULL with n > 0, a NULL pool, buf NULL
 *   with len > 0, an unknown format, two pools whose names are written the
 *   same -- the same name, the same pool twice, or names that differ only in
 *   bytes that are not UTF-8, each written as U+FFFD: name your pools);
 *   TP_ENOMEM (the document would exceed INT_MAX bytes).
 *   Thread-safe; may be called from a task.
 */
TP_API int tp_metrics_format(tp_pool *const *pools, size_t n, int format, char *buf, size_t len);

/* ------------------------------------- 14. priorities and fair shares (Since 1.2) */

/*
 * Priority lanes. tp_task_opts.priority picks one of five lanes, TP_PRIO_MIN
 * (-2, background) to TP_PRIO_MAX (2, urgent). A lane is *ready* when it has
 * a waiting task that may start now; a lane below 0 only while fewer than
 * tp_config.low_prio_max_running tasks of priority < 0 run (when that is set).
 * Whenever a worker takes a task it takes it from the highest ready lane, with
 * one exception against starvation: each ready lane counts the starts that
 * went to a higher lane while it stayed ready (its count returns to 0 when it
 * starts a task or stops being ready), and a ready lane whose count has
 * reached prio_starve_limit takes the next start instead (the highest such
 * lane if there are several). So under a steady stream of urgent work a ready
 * lane still gets at least one start in every prio_starve_limit + 1; with
 * TP_UNLIMITED the priority is strict. low_prio_max_running keeps workers free
 * for normal and urgent work while long background tasks wait.
 *
 * Within a lane: admission order in a TP_SCHED_FIFO pool; fair shares in a
 * TP_SCHED_FAIR pool. A retry returns to the back of its own lane (and of its
 * user's list there). Lanes share everything else: queue_capacity counts the
 * waiting tasks of all lanes, per-user slots count across lanes, and
 * deadlines, cancel, retries, groups, batches (the accepted tasks of a batch
 * are adjacent in their own lane) and forced shutdown work in every lane as
 * in section 6.
 *
 * Fair shares (TP_SCHED_FAIR). Within each lane, waiting tasks are kept per
 * user in admission order; tasks without a user count as one more user, the
 * anonymous one. The users that have waiting tasks in a lane form a round, in
 * the order in which they got their first waiting task there. The lane's next
 * start goes to the user at the head of the round; a user starts up to
 * `weight` tasks in a row (default 1), then moves to the back of the round,
 * or leaves it as soon as it has no waiting task left in the lane (its last
 * one started, was cancelled or expired). A user that gets a waiting task
 * while it is not in the round joins at the back (so does a retry's user).
 * This is deficit round robin with a quantum of `weight` tasks. Starts taken
 * by other lanes do not move a lane's round. Fairness decides order only:
 * admission, the per-user limit, the bound and every refusal stay as in
 * section 6.
 *
 * The scheduler is exact: with one worker, the order in which waiting tasks
 * start is fully determined by these rules and the order of admission.
 * Admission, start and cancel cost O(1) in the number of users and of
 * waiting tasks, and nothing is allocated per task -- except that a
 * TP_SCHED_FIFO pool, with or without lanes, keeps its waiting tasks of
 * priority 0 in 1.1's ring and its costs: a cancel of one of them costs up
 * to half the ring's length (tp_cancel, "Cost"), and that a pool with fixed
 * workers admits the plain submits handed over to it in batches, in a fair
 * pool also before a start or a cancel that one of them could change.
 * Expiry is batched in every
 * pool: each look of the service thread visits every waiting task of every
 * lane (tp_task_opts, "Deadline").
 *
 * Example, one worker, a fair pool (max_per_user at least 4), weights alice
 * 2 and bob 1, every task admitted while the worker is busy, in this order:
 * a1 a2 a3 a4 (alice) b1 b2 (bob) n1 (no user), all priority 0, then u1
 * (priority 2): the worker, once free, starts u1 first, then
 * a1 a2 b1 n1 a3 a4 b2.
 */

/*
 * tp_user_weight_set -- set `user`'s weight in a fair pool: it starts up to
 * `weight` tasks in a row when its turn comes. Since 1.2.
 *   user NULL or "" sets the anonymous user's weight. weight 1..TP_WEIGHT_MAX
 *   (the default of every user is 1). A weight holds for the pool's life,
 *   whether or not the user has tasks now, and applies from that user's next
 *   turn (a turn under way keeps the quantum it started with). The name is
 *   copied. May allocate (once per new name; nothing per task). Blocks only
 *   on the pool lock. Thread-safe; may be called from a task.
 *   TP_OK; TP_EINVAL (p NULL, weight out of range, user longer than
 *   TP_USER_MAX, or a pool that is not TP_SCHED_FAIR); TP_ENOMEM.
 */
TP_API int tp_user_weight_set(tp_pool *p, const char *user, unsigned weight);

/* One lane's figures (tp_lane_stats_get). Since 1.2. */
typedef struct tp_lane_stats {
    uint64_t started;     /* attempts of this lane's tasks that started (first attempts and retries) */
    uint32_t queued;      /* waiting in this lane now */
    uint32_t running;     /* running now */
    uint64_t reserved[6]; /* growth room: written as zero */
} tp_lane_stats;

/*
 * tp_lane_stats_get -- a snapshot of lane `priority` of pool `p`, read
 * without the lock, as tp_stats_get() reads (acquire loads; the fields are
 * not one instant while tasks move). At rest (after tp_wait()) the five
 * lanes' `started` sum to stats.started + stats.retried, and queued ==
 * running == 0. Since 1.2. Thread-safe; may be called from a task.
 *   TP_OK; TP_EINVAL (p or out NULL, priority out of range; *out untouched).
 */
TP_API int tp_lane_stats_get(tp_pool *p, int priority, tp_lane_stats *out);

/* ------------------------------------------- 15. completion queues (Since 1.2) */

/*
 * A completion queue brings on_done back to the application's own thread, as
 * libuv runs after_work_cb on its loop: submit with tp_task_opts.cq set (an
 * on_done is then required), watch tp_cq_fd() in the event loop, and call
 * tp_cq_drain() when it is readable; on_done(arg, status) then runs inside
 * that call, never on a pool thread.
 *
 * When a bound task ends, its completion is queued first; then its counters
 * count it and its user slot is released, and from then on tp_wait(),
 * tp_shutdown() and groups treat it as ended: none of them waits for
 * completions that sit in a queue (tp_wait() and tp_group_wait() return while
 * they are undrained), and once tp_wait() has returned (or a counter read
 * shows a task completed) its completion is in its queue. Everything else
 * about the task is as in section 6; in particular, an on_done that submits
 * its own user's next task finds the ended task's user slot free (the slot is
 * released in the same locked step that queued the completion, or kept to be
 * released with others later, and a submit that would be refused for it, as
 * tp_user_active(), takes that lock and releases kept slots before it
 * counts). Only the lock-free tp_stats_get() may still show the task unfinished
 * for a moment inside a drained on_done.
 *
 * Exactly once: every accepted task bound to a queue has its on_done run
 * exactly once, inside one tp_cq_drain() call, in the order the tasks ended
 * as that queue saw them; also a task cancelled, expired or dropped by a
 * forced shutdown (status TP_ECANCELED or TP_ETIMEDOUT, as in section 6).
 *
 * Bounded, never lossy: a task bound to a queue takes one of its `capacity`
 * places at admission and gives it back when its on_done has run in a drain.
 * With every place taken, admission refuses with TP_EFULL (counted in
 * rejected_full); tp_submit_wait() waits for a place. So a queue never
 * overflows, and nothing is allocated per task.
 *
 * A queue may serve several pools and is independent of their lifetimes: a
 * pool may be destroyed while its completions still wait in a queue. Its
 * order is the order in which workers queued the completions, and a drain
 * stops at one whose queuing is still under way: with several pools on one
 * queue, a completion of one pool can wait behind one that a worker of
 * another pool is queuing at that moment (it is in the queue once tp_wait()
 * returned, but neither a drain nor the descriptor sees it until the other
 * completion is in too, a moment later; the descriptor then wakes). A
 * completion's on_done may free `arg`, submit again (also to the same queue)
 * and drain the queue itself. It runs as application code on the draining
 * thread: tp_log_id_get() there is that thread's own log id (the task's is
 * not carried over; pass it in `arg` if you need it), and tp_shutdown() and
 * friends work there as on any application thread (a drain called inside a
 * task or an on_done of a pool runs on that pool's thread: there, that
 * pool's tp_shutdown(), tp_wait() and tp_destroy() answer TP_EDEADLK as
 * anywhere on it). A completion's place
 * comes back as soon as its on_done has returned (the next on_done of the
 * same drain may submit into it), not while it runs: so an on_done that
 * calls tp_submit_wait() bound to its own full queue waits its whole budget
 * unless another thread drains; use tp_submit() there, and retry after the
 * drain.
 *
 * Cost: a worker queues a completion without a lock (an atomic add and a
 * store) and wakes the descriptor only when the queue goes from empty to
 * non-empty (wake-ups coalesce); a drain takes the queue's lock once per 64
 * completions it runs (it copies them out, then runs them without the lock),
 * and, only while a tp_submit_wait() caller waits for a place, once more per
 * place it gives back.
 *
 * Thread-safety: every call may be made from any thread concurrently, except
 * tp_cq_destroy() (no call on the queue may run concurrently with it or
 * after it, and no submit may name it any more).
 */

/*
 * tp_cq_create -- make a completion queue with `capacity` places. Since 1.2.
 *   capacity 1..TP_MAX_QUEUE_CAPACITY. Allocates the queue and its ring of
 *   `capacity` completions once, and one descriptor (an eventfd on Linux, a
 *   pipe elsewhere). *out is written only on TP_OK.
 *   TP_OK; TP_EINVAL (out NULL, capacity out of range); TP_ENOMEM (memory or
 *   a descriptor could not be obtained).
 */
TP_API int tp_cq_create(tp_cq **out, unsigned capacity);

/*
 * tp_cq_fd -- a descriptor that is readable (POLLIN) whenever at least one
 * completion waits in `cq`, and not readable after a drain that emptied the
 * queue, until the next completion. Poll it level-triggered (poll, epoll
 * without EPOLLET, uv_poll_t). The queue owns it: never read, write or close
 * it. Since 1.2.
 *   >= 0; TP_EINVAL (cq NULL).
 */
TP_API int tp_cq_fd(const tp_cq *cq);

/*
 * tp_cq_drain -- run up to `max` waiting completions (0 -> all that wait
 * now) on the calling thread, in the order the tasks ended, and give their
 * places back. Since 1.2.
 *   Never blocks (beyond the queue's lock and the on_done calls themselves).
 *   Several threads may drain one queue at once; each completion runs once.
 *   It may be called from inside an on_done it runs: that call first runs
 *   the completions the enclosing drain on this thread took and has not run
 *   yet (which the enclosing call then skips), then what waits then, so one
 *   thread runs them in the order the tasks ended; the calls count what
 *   each ran. Completions that arrive while it runs wait for the next
 *   call, also when another drain took some of those that waited at its
 *   start (it does not run later ones in their stead).
 *   >= 0, the number of on_done calls made (0..max); TP_EINVAL (cq NULL).
 */
TP_API int tp_cq_drain(tp_cq *cq, unsigned max);

/*
 * tp_cq_wait -- block until at least one completion waits in `cq`, or
 * `timeout_ns` passes (0 -> return at once; TP_FOREVER -> no limit). It runs
 * nothing: call tp_cq_drain() after it. For threads without an event loop.
 * Only a call that sleeps asks the next completion to wake it: a poll (0), or
 * a call that finds one waiting, leaves the workers' pushes lock-free.
 * Since 1.2.
 *   TP_OK (a completion waits, possibly already taken by another drainer);
 *   TP_ETIMEDOUT; TP_EINVAL (cq NULL).
 */
TP_API int tp_cq_wait(tp_cq *cq, uint64_t timeout_ns);

/*
 * tp_cq_destroy -- free the queue and its descriptor. Since 1.2.
 *   TP_OK (freed); TP_EBUSY (still in use: a task bound to it is unfinished,
 *   or a completion waits or is being run; nothing done); TP_EINVAL (cq NULL).
 *   Drain until it returns TP_OK: after tp_wait() of every pool that used it
 *   and a drain that emptied it, it succeeds.
 */
TP_API int tp_cq_destroy(tp_cq *cq);

#ifdef __cplusplus
}
#endif
#endif /* TASKPOOL_H */
