/*
 * hist.c -- the latency histograms: bounds, snapshots, quantiles (taskpool.h,
 * section 12).
 *
 * Recording is inline in hist.h (the worker's hot path); this file holds what
 * readers call. A snapshot sums the shards of every worker slot without any
 * lock: sum_ns first (acquire, pairing with the writer's release, so it never
 * covers an observation the buckets below miss), then the buckets; count is
 * the sum of the buckets read, so sum(buckets) == count holds in every
 * snapshot. At rest every worker has exited, which tp_wait() orders before
 * its return, so the snapshot is then exact.
 *
 * The shards are allocated once per pool (tp_create) and freed with it.
 *
 * TP_HIST_QUEUE_WAIT is the sum of the five lanes' queue-wait histograms,
 * shard by shard, each lane's sum read before its buckets as above.
 *
 * Layer: a leaf (see pool.h): engine.c allocates the shards and records
 * through hist.h's inline functions; this file calls nothing of
 * libtaskpool's. tp_hist_get itself is in stats.c, which reads the pool.
 */
#include "hist.h"

#include <stdlib.h>
#include <string.h>

tp__hist_shard *tp__hist_alloc(unsigned slots) {
    /* calloc: zero counters without writing them, so the pages of an elastic
     * pool's slots that never run are never touched. */
    return (tp__hist_shard *)calloc(slots, sizeof(tp__hist_shard));
}

void tp__hist_free(tp__hist_shard *s) { free(s); }

uint64_t tp_hist_bound_ns(unsigned bucket) {
    if (bucket >= TP_HIST_BUCKETS) return 0;
    if (bucket == 0) return 1ull << TP__HIST_E0;
    if (bucket == TP_HIST_BUCKETS - 1) return UINT64_MAX;
    unsigned i = bucket - 1;
    unsigned e = TP__HIST_E0 + i / TP__HIST_SUB, sub = i % TP__HIST_SUB;
    return (uint64_t)(TP__HIST_SUB + 1 + sub) << (e - 3);
}

/* Add histogram `which` of `n` shards into out (count not yet set). */
static void add_one(const tp__hist *h, tp_hist *out) {
    out->sum_ns += atomic_load_explicit(&h->sum, memory_order_acquire);
    for (unsigned i = 0; i < TP_HIST_BUCKETS; i++)
        out->buckets[i] += atomic_load_explicit(&h->b[i], memory_order_relaxed);
}

int tp__hist_snapshot(const tp__hist_shard *shards, unsigned n, int which, tp_hist *out) {
    /* compared before subtracting: `which` may be any int */
    bool one_lane =
        which >= TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MIN) && which <= TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MAX);
    int lane = one_lane ? which - TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MIN) : 0;
    if (which != TP_HIST_QUEUE_WAIT && which != TP_HIST_RUN && !one_lane) return TP_EINVAL;
    memset(out, 0, sizeof *out);
    for (unsigned w = 0; w < n; w++) {
        const tp__hist_shard *s = &shards[w];
        if (which == TP_HIST_RUN)
            add_one(&s->run, out);
        else if (one_lane)
            add_one(&s->wait[lane], out);
        else
            for (unsigned l = 0; l < TP__HIST_LANES; l++) add_one(&s->wait[l], out);
    }
    for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) out->count += out->buckets[i];
    return TP_OK;
}

uint64_t tp_hist_quantile_ns(const tp_hist *h, double q) {
    if (!h || h->count == 0) return 0;
    if (!(q > 0)) q = 0; /* NaN too */
    if (q > 1) q = 1;
    double need = q * (double)h->count;
    uint64_t cum = 0;
    for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) {
        cum += h->buckets[i];
        if ((double)cum >= need) return tp_hist_bound_ns(i);
    }
    return UINT64_MAX; /* count above the sum of the buckets: not a snapshot of ours */
}
