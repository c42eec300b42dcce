/*
 * stats.c -- the lock-free reads of a pool: tp_stats_get, tp_lane_stats_get,
 * tp_hist_get; and tp_user_active, tp_stats_format.
 *
 * tp_stats_get() reads each atomic with an acquire load (the writers store
 * with release, see stats.h) and never takes the pool lock, so it cannot
 * slow admission. The fields are one table, TP__STATS_FIELDS in stats.h,
 * used by the snapshot and both formats; the struct's memory order
 * (TP__STATS_LAYOUT) and the read order below list the same fields again,
 * and their counts are asserted equal (a misspelt name does not compile).
 * The lanes' figures and oldest_wait_ns come from the scheduler's published
 * atomics (scheduler.h), the histograms from the worker slots' shards (hist.c).
 *
 * Layer: the public API (2 in pool.h), next to pool.c; calls users.c,
 * hist.c, text.c and metrics' writer. Lock: tp_user_active takes the pool
 * lock; nothing else here does.
 */
#include "pool.h"

#include <stdio.h>
#include <string.h>

#include "text.h"


/* The counters, read downstream first. Every task is counted upstream before
 * downstream (submitted before accepted or rejected_*, accepted before
 * started and completed, completed before succeeded or failed, failed before
 * cancelled before expired), each store a release; reading in the opposite
 * order, each load an acquire, keeps these true in every snapshot, also while
 * tasks move: submitted >= accepted + rejected, accepted >= completed,
 * accepted >= started, completed >= succeeded + failed, failed >= cancelled
 * >= expired. (Read in table order, a snapshot could show completed >
 * accepted.) The gauges follow; they have no order. */
/* One counter a line, downstream first. */
/* clang-format off */
#define TP__STATS_READ_ORDER(X) \
    X(expired)                  \
    X(cancelled)                \
    X(failed)                   \
    X(succeeded)                \
    X(completed)                \
    X(retried)                  \
    X(started)                  \
    X(rejected_timeout)         \
    X(rejected_closed)          \
    X(rejected_user)            \
    X(rejected_full)            \
    X(accepted)                 \
    X(submitted)
/* clang-format on */

/* Where each counter is kept: TP__STATS_IS_RUN_<f>(RUN, CALL, f) expands to
 * RUN(f) for the per-worker sets, CALL(f) for the calls set (stats.h). */
#define TP__STATS_IS_RUN_expired(R, C, f)          R(f)
#define TP__STATS_IS_RUN_cancelled(R, C, f)        R(f)
#define TP__STATS_IS_RUN_failed(R, C, f)           R(f)
#define TP__STATS_IS_RUN_succeeded(R, C, f)        R(f)
#define TP__STATS_IS_RUN_completed(R, C, f)        R(f)
#define TP__STATS_IS_RUN_retried(R, C, f)          R(f)
#define TP__STATS_IS_RUN_started(R, C, f)          R(f)
#define TP__STATS_IS_RUN_rejected_timeout(R, C, f) C(f)
#define TP__STATS_IS_RUN_rejected_closed(R, C, f)  C(f)
#define TP__STATS_IS_RUN_rejected_user(R, C, f)    C(f)
#define TP__STATS_IS_RUN_rejected_full(R, C, f)    C(f)
#define TP__STATS_IS_RUN_accepted(R, C, f)         C(f)
#define TP__STATS_IS_RUN_submitted(R, C, f)        C(f)

/* Every counter of TP__STATS_FIELDS is in the read order exactly once. */
#define TP__ONE(f, help) +1
#define TP__NONE(f, help)
#define TP__ONE_READ(f) +1
_Static_assert(0 TP__STATS_FIELDS(TP__ONE, TP__NONE, TP__NONE) == 0 TP__STATS_READ_ORDER(TP__ONE_READ),
               "TP__STATS_READ_ORDER must list every counter of TP__STATS_FIELDS");
#undef TP__ONE
#undef TP__NONE
#undef TP__ONE_READ

/* A run counter summed over every set (the misc set and each worker
 * slot's), each load an acquire. */
static uint64_t sum_runs(const tp_pool *p, size_t off) {
    uint64_t v = TP__ACQUIRE(*(const _Atomic uint64_t *)((const char *)&p->misc + off));
    for (unsigned i = 0; i < p->cfg.max_workers; i++)
        v += TP__ACQUIRE(*(const _Atomic uint64_t *)((const char *)&p->wk.runs[i] + off));
    return v;
}

/* Running attempts: the sets' `active` summed (every attempt starts and
 * ends in its worker's set). */
static uint32_t sum_active(const tp_pool *p) {
    uint32_t v = TP__ACQUIRE(p->misc.active);
    for (unsigned i = 0; i < p->cfg.max_workers; i++) v += TP__ACQUIRE(p->wk.runs[i].active);
    return v;
}

void tp_stats_get(tp_pool *p, tp_stats *out) {
    if (!p || !out) return;
    memset(out, 0, sizeof *out);
#define TP__GET_RUNS(f)    out->f = sum_runs(p, offsetof(tp__st_runs, f));
#define TP__GET_CALLS(f)   out->f = TP__ACQUIRE(p->calls.f);
#define TP__GET_COUNTER(f) TP__STATS_IS_RUN_##f(TP__GET_RUNS, TP__GET_CALLS, f)
    TP__STATS_READ_ORDER(TP__GET_COUNTER)
#undef TP__GET_COUNTER
#undef TP__GET_RUNS
#undef TP__GET_CALLS
    /* Staged submits (stage.h) are submitted and accepted at once; read
     * after the counters above (which they cause), like them. */
    uint64_t staged = TP__ACQUIRE(p->stage.staged);
    out->submitted += staged;
    out->accepted += staged;
    out->active = sum_active(p);
    out->queued = tp__pool_queued(p);
    out->delayed = TP__ACQUIRE(p->gauges.delayed);
    out->workers = TP__ACQUIRE(p->gauges.workers);
    out->idle = TP__ACQUIRE(p->gauges.idle);
    out->users = TP__ACQUIRE(p->gauges.users);
    /* Submits refused without the lock (pool.c) count in two fields: one load,
     * added to both, so the inequalities above still hold. */
    uint64_t fast_full = TP__ACQUIRE(p->fast_full);
    out->submitted += fast_full;
    out->rejected_full += fast_full;
    out->rejected = out->rejected_full + out->rejected_user + out->rejected_closed + out->rejected_timeout;
    uint64_t oldest = tp__sched_oldest_at(&p->life.sched);
    /* the ring's oldest entry may be older than the scheduler's (a retry
     * back in the queue takes a new stamp): the older of the two */
    uint64_t staged_at = tp__stage_oldest_at(&p->stage);
    if (staged_at && (!oldest || staged_at < oldest)) oldest = staged_at;
    out->oldest_wait_ns = oldest ? tp__hclk_ns(oldest, tp__hclk_now()) : 0;
}

int tp_lane_stats_get(tp_pool *p, int priority, tp_lane_stats *out) {
    if (!p || !out || priority < TP_PRIO_MIN || priority > TP_PRIO_MAX) return TP_EINVAL;
    const tp__sched *s = &p->life.sched;
    memset(out, 0, sizeof *out);
    if (priority != 0) {
        const tp__lane *l = &s->lane[tp__lane_of(priority)];
        out->started = TP__ACQUIRE(l->started_pub);
        out->queued = TP__ACQUIRE(l->waiting_pub);
        out->running = TP__ACQUIRE(l->running_pub);
        return TP_OK;
    }
    /* The default lane publishes no waiting count (scheduler.h, tp__lane),
     * and in a FIFO pool (the ring) no running or started figures either (so
     * that its hot path stores no more than 1.1's): what it does not
     * publish is the pool's total less the other lanes'. Exact at rest; while tasks move
     * the two reads are not one instant, and a difference below 0 reads 0.
     * The ring's `started` is a counter (taskpool_lane_started_total) and
     * must never go back: each worker counts the ring's starts on its own
     * line (ring_started), and the sum of those is read, as tp_stats_get()
     * reads. */
    uint32_t queued = 0, running = 0;
    for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
        if (prio == 0) continue;
        const tp__lane *l = &s->lane[tp__lane_of(prio)];
        queued += TP__ACQUIRE(l->waiting_pub);
        running += TP__ACQUIRE(l->running_pub);
    }
    uint32_t all_queued = tp__pool_queued(p);
    out->queued = all_queued > queued ? all_queued - queued : 0;
    if (s->fair) {
        const tp__lane *l = &s->lane[tp__lane_of(0)];
        out->started = TP__ACQUIRE(l->started_pub);
        out->running = TP__ACQUIRE(l->running_pub);
        return TP_OK;
    }
    uint32_t all_running = sum_active(p);
    out->started = sum_runs(p, offsetof(tp__st_runs, ring_started));
    out->running = all_running > running ? all_running - running : 0;
    return TP_OK;
}

int tp_hist_get(tp_pool *p, int which, tp_hist *out) {
    if (!p || !out) return TP_EINVAL;
    return tp__hist_snapshot(p->wk.hist, p->cfg.max_workers, which, out);
}

unsigned tp_user_active(tp_pool *p, const char *user) {
    if (!p || !user || !user[0]) return 0;
    size_t len = strnlen(user, TP_USER_MAX + 1);
    if (len > TP_USER_MAX) return 0;
    uint32_t h = tp__users_hash(user, len);
    tp__lock(p);
    tp__life_users_flush(&p->life); /* slots kept back are not counted (life.h) */
    if (p->life.users_put) tp__mutex_lock(p->life.users_put);
    tp__user *u = tp__users_find(&p->life.users, user, len, h);
    unsigned n = u ? tp__user_count(u) : 0;
    if (p->life.users_put) tp__mutex_unlock(p->life.users_put);
    tp__unlock(p);
    return n;
}

/* One pool's statistics for tp__prom_stats: the snapshot itself, no label. */
static void one_stats(const void *ctx, size_t k, tp_stats *out) {
    TP__UNUSED(k);
    *out = *(const tp_stats *)ctx;
}

int tp_stats_format(const tp_stats *s, int format, char *buf, size_t len) {
    if (!s || (!buf && len > 0)) return TP_EINVAL;
    if (format != TP_FORMAT_JSON && format != TP_FORMAT_PROMETHEUS) return TP_EINVAL;
    tp__outbuf o = {buf, len, 0};
    if (len) buf[0] = '\0';
    if (format == TP_FORMAT_JSON) {
        tp__json_stats(&o, s);
        tp__put(&o, "}");
    } else {
        /* the writer of tp_metrics_format, for one pool without a label */
        tp__stats_src src = {1, one_stats, NULL, s};
        tp__prom_stats(&o, &src);
    }
    if (o.pos > (size_t)INT_MAX) return TP_ENOMEM;
    return (int)o.pos;
}
