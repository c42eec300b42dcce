/*
 * stats.h -- the statistics of a pool: the one list of their fields, and the
 * atomics that hold them.
 *
 * Writers and readers. Every field is written with the pool lock held, by the
 * file that owns the change it counts: engine.c the calls (submitted and the
 * rejected_* counters) and the workers / idle gauges, life.c every other
 * counter and the queued / delayed / active / users gauges. stats.c reads them all without the lock (tp_stats_get) and
 * metrics.c through it. Updates are a relaxed load and a release store (one
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
 * (metrics.c); struct tp__stats below lays the stored ones out in
 * TP__STATS_LAYOUT's order. A new field is one line here, one in
 * TP__STATS_LAYOUT, one in TP__STATS_READ_ORDER (stats.c) and its member in
 * tp_stats (the counts of the lists are asserted to match). oldest_wait_ns
 * (since 1.2) is no counter: stats.c computes it from the scheduler's lane
 * heads and writes it apart.
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

#endif /* TP_STATS_H */
