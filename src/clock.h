/*
 * clock.h -- the clock of the latency histograms (taskpool.h, section 12): cheap stamps
 * whose differences convert to ns. Deadlines, run timeouts, retry delays and
 * the idle clock stay on CLOCK_MONOTONIC (tp_now_ns); only the histogram
 * stamps (task admission, attempt start and end) use this clock, and only
 * differences of two of its stamps are ever used (tp__hclk_ns). A stamp taken
 * on one CPU and compared on another may be off by the CPUs' TSC skew: fine
 * for a histogram, not for a deadline.
 *
 * On x86-64 with an invariant TSC (constant_tsc and nonstop_tsc in
 * /proc/cpuinfo) a stamp is the TSC (one rdtsc, some 8 ns where a vDSO
 * clock_gettime costs ~20), converted with a multiplier calibrated once per
 * process against CLOCK_MONOTONIC (clock.c). Elsewhere, or when the
 * calibration looks wrong, a stamp is tp_now_ns() and the conversion is the
 * identity. tp__hclk_init() picks the mode once (thread-safe, at the first
 * tp_create, before any stamp is taken); the mode never changes after, so
 * two stamps of one process always share a clock.
 *
 * A difference that would be negative (a stamp taken on another CPU whose
 * TSC is a few cycles behind) reads 0.
 */
#ifndef TP_CLOCK_H
#define TP_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#include "taskpool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TP__HCLK_TSC 1
#include <x86intrin.h>
__extension__ typedef unsigned __int128 tp__hclk_u128;
#else
#define TP__HCLK_TSC 0
#endif

/* clock.c: 0 until tp__hclk_init chose the TSC, then ns per tick in 32.32
 * fixed point, never changed again. Read relaxed: every stamp is taken by a
 * thread that tp_create's return (or a pool's lock) already orders after
 * the one store. */
extern _Atomic uint64_t tp__hclk_mult;

/* Choose the clock, once per process (pthread_once); before any stamp. */
void tp__hclk_init(void);

/* A stamp: TSC ticks, or CLOCK_MONOTONIC ns. */
static inline uint64_t tp__hclk_now(void) {
#if TP__HCLK_TSC
    if (atomic_load_explicit(&tp__hclk_mult, memory_order_relaxed)) return __rdtsc();
#endif
    return tp_now_ns();
}

/* Nanoseconds from stamp `from` to stamp `to`, 0 if `to` is not later. */
static inline uint64_t tp__hclk_ns(uint64_t from, uint64_t to) {
    if (to <= from) return 0;
    uint64_t d = to - from;
#if TP__HCLK_TSC
    uint64_t m = atomic_load_explicit(&tp__hclk_mult, memory_order_relaxed);
    if (m) return (uint64_t)(((tp__hclk_u128)d * m) >> 32); /* one mul */
#endif
    return d;
}

/*
 * The start of an attempt on CLOCK_MONOTONIC, for its run timeout (engine.c),
 * from the stamp that starts its histograms: no clock read of its own. On
 * the fifth machine (docs/performance.md) one more read per task, a TSC
 * read or a precise clock_gettime (vDSO: an ordered TSC read), cost 20-35 %
 * of a saturated pool's time per task, as much as a cache miss.
 *
 * The stamp (engine.c): one taken after the task left the queue, or, when
 * its worker comes straight from the end of another attempt, that end (as
 * the histograms count it, hist.h): the hand-off between the two, the
 * worker's lock hold (some 100 ns), counts as run time.
 *
 * Each worker keeps an anchor: a CLOCK_MONOTONIC reading and a TSC bracket
 * [a, b] around it no wider than TP__RUN_MARGIN_NS / 8 (the reading was
 * taken at a tick in it; `tsc` = a). For a stamp `now_h` at most
 * TP__RUN_ANCHOR_NS after the anchor, and at least TP__RUN_MARGIN_NS after
 * the task's admission stamp (queued_at, clock.h; read before the task was
 * accepted, or when a retry returned to the queue), the start is
 *     ns + (now_h - tsc) converted - TP__RUN_BIAS_NS.
 * Its error: the bracket (at most margin / 8 = 250 ns, late), the rate
 * (the calibration's ~2e-5 and an NTP slew of up to 5e-4 over 64 us: 33 ns
 * either way) and the TSCs' skew between CPUs (a migrated worker; the
 * producer that stamped queued_at). Less the bias, the start is never
 * after the stamp (so never after the task function is entered) unless
 * the skew passes ~200 ns, and never before the admission unless it passes
 * ~1.4 us: the kernel keeps invariant TSCs in step to a few cycles, or
 * does not use them. Otherwise -- no anchor, an anchor too old, a bracket
 * too wide, a task admitted less than 2 us before the stamp -- the start is
 * one precise read, now, which becomes the anchor. Without the TSC the
 * stamps are CLOCK_MONOTONIC readings: the start is the stamp, or the
 * admission stamp if later.
 */
#define TP__RUN_MARGIN_NS 2000u
#define TP__RUN_BIAS_NS   500u
#define TP__RUN_ANCHOR_NS 65536u

typedef struct tp__run_clock {
    uint64_t tsc; /* the anchor's bracket start; 0: no anchor */
    uint64_t ns;  /* its CLOCK_MONOTONIC reading */
} tp__run_clock;

/* clock.c: TP__RUN_MARGIN_NS in TSC ticks, set with tp__hclk_mult. */
extern _Atomic uint64_t tp__run_margin;

/* A precise read (tp_now_ns) that becomes `rc`'s anchor if its bracket is
 * tight. Returns the reading. */
uint64_t tp__run_clock_read(tp__run_clock *rc);

/* The CLOCK_MONOTONIC start of an attempt, for its run timeout, from its
 * start on the histograms' clock, `now_h`: a stamp taken after its task
 * left the queue, or the end of the attempt that its worker came straight
 * from (hist.h). The task's admission stamp is `queued_at`. `rc`: the
 * worker's anchor (only it uses it). */
static inline uint64_t tp__run_start_ns(tp__run_clock *rc, uint64_t queued_at, uint64_t now_h) {
#if TP__HCLK_TSC
    uint64_t m = atomic_load_explicit(&tp__hclk_mult, memory_order_relaxed);
    if (m) {
        uint64_t margin = atomic_load_explicit(&tp__run_margin, memory_order_relaxed);
        uint64_t since = now_h - rc->tsc; /* huge if the TSC read behind the anchor */
        if (rc->tsc && since <= margin * (TP__RUN_ANCHOR_NS / TP__RUN_MARGIN_NS) &&
            (int64_t)(now_h - queued_at) >= (int64_t)margin)
            return rc->ns + (uint64_t)(((tp__hclk_u128)since * m) >> 32) - TP__RUN_BIAS_NS;
        return tp__run_clock_read(rc);
    }
#endif
    (void)rc;
    return now_h > queued_at ? now_h : queued_at; /* CLOCK_MONOTONIC stamps */
}

#endif /* TP_CLOCK_H */
