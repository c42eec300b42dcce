/*
 * hist.c -- the latency histograms: bounds, snapshots, quantiles (SPEC 11.4).
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
 * Layer: a leaf (6 in internal.h): pool.c allocates the shards, worker.c
 * records through hist.h's inline functions; this file calls nothing of
 * libtaskpool's.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
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

int tp_hist_get(tp_pool *p, int which, tp_hist *out) {
    if (!p || !out || (which != TP_HIST_QUEUE_WAIT && which != TP_HIST_RUN)) return TP_EINVAL;
    memset(out, 0, sizeof *out);
    for (unsigned w = 0; w < p->cfg.max_workers; w++) {
        const tp__hist *h = &p->wk.hist[w].h[which];
        out->sum_ns += atomic_load_explicit(&h->sum, memory_order_acquire);
        for (unsigned i = 0; i < TP_HIST_BUCKETS; i++)
            out->buckets[i] += atomic_load_explicit(&h->b[i], memory_order_relaxed);
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
