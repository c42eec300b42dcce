/*
 * stats.h -- the statistics of a pool: the one list of their fields, and the
 * atomics that hold them.
 *
 * Writers and readers. Every field is written with the pool lock held, by the
 * file that owns the change it counts (below); stats.c reads them all
 * without the lock (tp_stats_get) and metrics.c through it. Updates are a relaxed load and a release store (one
 * writer at a time: no read-modify-write); reads are acquire loads, so a
 * reader that sees a counted value also sees what happened before it was
 * counted (taskpool.h, section 8).
 */
#ifndef TP_STATS_H
#define TP_STATS_H

#include "base.h"

/*
 * The fields, in the order of both text formats.
 *   C(name, help)  a counter: _Atomic uint64_t, only ever grows
 *   G(name, help)  a gauge: _Atomic uint32_t, the current value
 *   D(name, help)  a counter derived by tp_stats_get from the others (not stored)
 * Used by tp_stats_get(), tp_stats_format() (stats.c) and tp_metrics_format()
 * (metrics.c). A new counter is one line here, one in TP__STATS_CALLS or
 * TP__STATS_RUNS below, one in TP__STATS_READ_ORDER (stats.c) and its member
 * in tp_stats (the counts of the lists are asserted to match).
 * oldest_wait_ns (since 1.2) is no counter: stats.c computes it from the
 * scheduler's lane heads and writes it apart.
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

/* Where the stored fields live, by writer, so that a task's submitter and
 * its worker do not write one cache line of counters between them:
 *   calls   the submitting threads (engine.c; life.c for `accepted`): one
 *           set per pool, on its own line;
 *   runs    what happens to tasks once accepted: one set per worker slot,
 *           written only by that slot's worker, plus one set (`misc`) for
 *           every other thread that ends tasks (tp_cancel's caller, the
 *           service thread, a forced shutdown) -- each on its own line; the
 *           reader sums them. `active` is per set too (a worker's is 0 or
 *           1: an attempt starts and ends on the same worker);
 *   gauges  delayed, users (life.c) and workers, idle (engine.c): one set.
 * `queued` is life.c's count of waiting tasks, published next to the
 * admission word (life.h). */
#define TP__STATS_CALLS(X)                                                                                   \
    X(submitted)                                                                                             \
    X(accepted)                                                                                              \
    X(rejected_full)                                                                                         \
    X(rejected_user)                                                                                         \
    X(rejected_closed)                                                                                       \
    X(rejected_timeout)
#define TP__STATS_RUNS(X)                                                                                    \
    X(started)                                                                                               \
    X(retried)                                                                                               \
    X(completed)                                                                                             \
    X(succeeded)                                                                                             \
    X(failed)                                                                                                \
    X(cancelled)                                                                                             \
    X(expired)

#define TP__ST_COUNTER(f) _Atomic uint64_t f;
typedef struct tp__st_calls {
    _Alignas(64) TP__STATS_CALLS(TP__ST_COUNTER)
} tp__st_calls;
typedef struct tp__st_runs {
    /* the line its worker writes for every task */
    _Alignas(64) _Atomic uint64_t started, retried, completed, succeeded, failed;
    _Atomic uint64_t ring_started; /* FIFO pools: attempts started from lane 0, the ring (tp_lane_stats) */
    _Atomic uint32_t active;       /* attempts running now */
    /* a line written only when a task is cancelled or expires */
    _Alignas(64) _Atomic uint64_t cancelled, expired;
} tp__st_runs;
#define TP__ST_IN_RUNS(f) _Static_assert(offsetof(tp__st_runs, f) < sizeof(tp__st_runs), #f " is a member");
TP__STATS_RUNS(TP__ST_IN_RUNS)
#undef TP__ST_IN_RUNS
#undef TP__ST_COUNTER
typedef struct tp__st_gauges {
    _Alignas(64) _Atomic uint32_t delayed, users, workers, idle;
} tp__st_gauges;

#define TP__ST_ONE(f, help) +1
#define TP__ST_NONE(f, help)
#define TP__ST_ONE_X(f) +1
_Static_assert(0 TP__STATS_FIELDS(TP__ST_ONE, TP__ST_NONE, TP__ST_NONE) == 0 TP__STATS_CALLS(TP__ST_ONE_X)
                                                                               TP__STATS_RUNS(TP__ST_ONE_X),
               "every counter of TP__STATS_FIELDS is in TP__STATS_CALLS or TP__STATS_RUNS");
#undef TP__ST_ONE
#undef TP__ST_NONE
#undef TP__ST_ONE_X

#endif /* TP_STATS_H */
