/*
 * hist.h -- recording into the latency histograms (taskpool.h, section 12).
 * Inline: it runs twice per attempt on the worker's hot path.
 *
 * Shape. Log-linear buckets with inclusive upper bounds: bucket 0 holds
 * 0..2^E0 ns (E0 = 7, 128 ns); above it every power of two (2^e, 2^(e+1)] is
 * split into 8 equal buckets whose bounds are (9 + s) * 2^(e-3), s = 0..7, up
 * to 2^42 ns; the last bucket holds the rest (bound UINT64_MAX). Consecutive
 * bounds differ by a factor (k + 1) / k with k >= 8, so never more than
 * 12.5 %. The index of a value v is that of w = v - 1 in the classic scheme
 * "exponent, then the 3 bits after the leading one", which puts v exactly at
 * its inclusive bound: one count-leading-zeros and two shifts.
 *
 * Since 1.2 the queue wait is recorded per priority lane: one histogram per
 * lane, and TP_HIST_QUEUE_WAIT is their sum, made by the reader (hist.c), so
 * an attempt still records into two histograms.
 *
 * No lock, no read-modify-write. Each worker slot owns one shard (every
 * histogram) and is its only writer: the worker thread of that slot, and a
 * thread that reuses the slot starts only after the previous one has exited
 * (worker.c joins it), so a plain relaxed load + store is an increment. Readers
 * (hist.c) sum the shards. The bucket is written before the sum, the sum with
 * release and read with acquire first, so a snapshot's sum never includes an
 * observation its buckets miss; count is derived from the buckets at read
 * time, so sum(buckets) == count in every snapshot by construction.
 *
 * Shards end with a cache line of padding, so that two workers never write
 * one line whatever the alignment calloc gives the array.
 */
#ifndef TP_HIST_H
#define TP_HIST_H

#include "base.h"
#include "clock.h"

#define TP__HIST_E0   7u  /* bucket 0: 0..2^7 ns */
#define TP__HIST_EMAX 42u /* the last regular bound is 2^42 ns */
#define TP__HIST_SUB  8u  /* buckets per power of two */

/* The layout above gives exactly this many buckets. */
_Static_assert(TP_HIST_BUCKETS == 1 + (TP__HIST_EMAX - TP__HIST_E0) * TP__HIST_SUB + 1,
               "TP_HIST_BUCKETS does not match the bucket layout");

typedef struct tp__hist {
    _Atomic uint64_t b[TP_HIST_BUCKETS];
    _Atomic uint64_t sum;
} tp__hist;

#define TP__HIST_LANES 5 /* TP_PRIO_MIN..TP_PRIO_MAX, as scheduler.h's lanes */

typedef struct tp__hist_shard {
    tp__hist run;                  /* TP_HIST_RUN */
    tp__hist wait[TP__HIST_LANES]; /* TP_HIST_QUEUE_WAIT_PRIO(prio), by lane */
    char pad_[64];                 /* keeps the next slot's counters off this slot's last line */
} tp__hist_shard;

/* hist.c: one shard per worker slot, zeroed; NULL when out of memory. */
tp__hist_shard *tp__hist_alloc(unsigned slots);
void tp__hist_free(tp__hist_shard *s);
/* tp_hist_get's work on a pool's `n` shards: TP_OK, or TP_EINVAL for an
 * unknown `which` (out untouched). */
int tp__hist_snapshot(const tp__hist_shard *shards, unsigned n, int which, tp_hist *out);

static inline unsigned tp__hist_index(uint64_t v) {
    if (v <= (1ull << TP__HIST_E0)) return 0;
    uint64_t w = v - 1;
    unsigned e = 63u - (unsigned)__builtin_clzll(w); /* w >= 2^E0, so e >= E0 */
    if (e >= TP__HIST_EMAX) return TP_HIST_BUCKETS - 1;
    unsigned sub = (unsigned)(w >> (e - 3)) & (TP__HIST_SUB - 1);
    return 1u + (e - TP__HIST_E0) * TP__HIST_SUB + sub;
}

/* One observation by the shard's only writer. */
static inline void tp__hist_record(tp__hist *h, uint64_t ns) {
    _Atomic uint64_t *b = &h->b[tp__hist_index(ns)];
    atomic_store_explicit(b, atomic_load_explicit(b, memory_order_relaxed) + 1, memory_order_relaxed);
    /* release: a reader that sees this sum sees the bucket count above */
    atomic_store_explicit(&h->sum, atomic_load_explicit(&h->sum, memory_order_relaxed) + ns,
                          memory_order_release);
}

/* Stamps, on the histograms' own clock (clock.h: the TSC where it is
 * invariant, ~9 ns a read, else CLOCK_MONOTONIC): one at admission
 * (tp_submit, before taking the lock; a waiting submit takes it under the
 * lock after its budget check), one when a retry returns to the queue (the
 * service thread's), one at the end of each attempt, and one at its start --
 * except in a busy pool: a worker that goes straight from the end of one
 * attempt to the next (no wait, no on_done, no failure log in between) takes
 * that end, or the new task's admission if later, as the start. The worker's
 * hand-off between two tasks (its lock hold: finalise, pop, some 100 ns) then
 * counts as run time of the next attempt instead of queue wait (queue waits
 * read that much shorter, never negative).
 *
 * CLOCK_MONOTONIC (deadlines, run timeouts, the idle clock) is read apart
 * from the stamps, and only when something uses it: at the start of an
 * attempt that has a run timeout (after the task left the queue, so never
 * before its admission), and when a worker finds the queue empty. So, per
 * attempt in a busy pool,
 * the histograms add one stamp at admission and one at the end of the
 * attempt, and the recording (two index computations, four stores into
 * lines only this worker writes).
 *
 * The hooks of the worker loop. `queued_at` and the other stamps are of the
 * histograms' own clock (clock.h: the TSC where it is invariant, else
 * CLOCK_MONOTONIC), never mixed with the CLOCK_MONOTONIC times of deadlines
 * and run timeouts; tp__hclk_ns converts a difference to ns and makes one
 * that would be negative a zero. */
static inline void tp__hist_attempt_started(tp__hist_shard *s, unsigned lane, uint64_t queued_at,
                                            uint64_t started_at) {
    tp__hist_record(&s->wait[lane], tp__hclk_ns(queued_at, started_at));
}

static inline void tp__hist_attempt_ended(tp__hist_shard *s, uint64_t started_at, uint64_t ended_at) {
    tp__hist_record(&s->run, tp__hclk_ns(started_at, ended_at));
}

#endif /* TP_HIST_H */
