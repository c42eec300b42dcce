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

#endif /* TP_CLOCK_H */
