/*
 * test_clock.c -- the histograms' clock (src/clock.h, clock.c).
 *
 * Covers: tp__hclk_init is idempotent and picks the TSC on an x86-64 whose
 * /proc/cpuinfo lists constant_tsc and nonstop_tsc (else CLOCK_MONOTONIC,
 * identity conversion); the conversion (0 for equal or reversed stamps, no
 * overflow for differences far past the last histogram bound, monotone in
 * the difference); stamps taken in a row never go back; and a difference of
 * stamps agrees with CLOCK_MONOTONIC within 3 % over ~15 ms. The interval
 * is bracketed: each end is a stamp between two tp_now_ns() reads, so a
 * preemption at an end widens the allowed range instead of failing.
 */
#include "pool.h" /* first: it defines _GNU_SOURCE */
#include "tp_test.h"

/* /proc/cpuinfo's first flags line has both invariant-TSC flags. */
static bool cpuinfo_tsc_invariant(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    static char line[16384];
    bool ok = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        char *nl = strchr(line, '\n');
        if (nl) *nl = ' ';
        ok = strstr(line, " constant_tsc ") && strstr(line, " nonstop_tsc ");
        break;
    }
    fclose(f);
    return ok;
}

static void test_clock_mode(void **state) {
    (void)state;
    tp__hclk_init();
    uint64_t m = atomic_load(&tp__hclk_mult);
    tp__hclk_init(); /* once per process: a second call changes nothing */
    assert_true(atomic_load(&tp__hclk_mult) == m);
#if TP__HCLK_TSC
    if (cpuinfo_tsc_invariant()) assert_true(m != 0);
#else
    assert_true(m == 0);
#endif
    if (m) { /* 0.05 .. 20 ns per tick, as the calibration's own check */
        assert_true(m >= (1ull << 32) / 20);
        assert_true(m <= (1ull << 32) * 20);
    }
    print_message("histogram clock: %s, %.4f ns per tick\n", m ? "TSC" : "CLOCK_MONOTONIC",
                  m ? (double)m / 4294967296.0 : 1.0);
}

static void test_clock_conversion(void **state) {
    (void)state;
    tp__hclk_init();
    uint64_t m = atomic_load(&tp__hclk_mult);
    assert_true(tp__hclk_ns(5, 5) == 0);
    assert_true(tp__hclk_ns(6, 5) == 0); /* reversed: 0, not a wrapped value */
    assert_true(tp__hclk_ns(UINT64_MAX, 0) == 0);
    /* ~2.4 hours of ticks (or ns): past the last regular histogram bound
     * (2^42 ns), converted without overflow */
    uint64_t d = 1ull << 43;
    uint64_t ns = tp__hclk_ns(1000, 1000 + d);
    long double want = m ? (long double)d * (long double)m / 4294967296.0L : (long double)d;
    long double diff = (long double)ns - want;
    assert_true(diff <= 1.0L && diff >= -1.0L);
    /* monotone in the difference */
    uint64_t prev = 0;
    for (uint64_t x = 1; x < (1ull << 50); x = x * 3 + 1) {
        uint64_t v = tp__hclk_ns(7, 7 + x);
        assert_true(v >= prev);
        prev = v;
    }
    if (!m) assert_true(tp__hclk_ns(100, 350) == 250); /* identity on CLOCK_MONOTONIC */
}

static void test_clock_never_goes_back(void **state) {
    (void)state;
    tp__hclk_init();
    uint64_t first = tp__hclk_now(), prev = first;
    for (int i = 0; i < 200000; i++) {
        uint64_t s = tp__hclk_now();
        if (s < prev)
            fail_msg("stamp %d went back: %llu after %llu", i, (unsigned long long)s,
                     (unsigned long long)prev);
        prev = s;
    }
}

/* A stamp and the CLOCK_MONOTONIC reads just before and after it. */
typedef struct bracket {
    uint64_t before, stamp, after;
} bracket;

static bracket take(void) {
    bracket b;
    b.before = tp_now_ns();
    b.stamp = tp__hclk_now();
    b.after = tp_now_ns();
    return b;
}

static void test_clock_agrees_with_monotonic(void **state) {
    (void)state;
    tp__hclk_init();
    const uint64_t span = TPT_MS(15);
    bracket a = take();
    while (tp_now_ns() - a.after < span) sched_yield(); /* polling, no sleep */
    bracket b = take();
    uint64_t ns = tp__hclk_ns(a.stamp, b.stamp);
    /* the stamps' true distance lies between these two */
    uint64_t lo = b.before - a.after, hi = b.after - a.before;
    print_message("%llu ns by the histogram clock, %llu..%llu by CLOCK_MONOTONIC\n", (unsigned long long)ns,
                  (unsigned long long)lo, (unsigned long long)hi);
    assert_true(lo >= span);
    if ((long double)ns < (long double)lo * 0.97L || (long double)ns > (long double)hi * 1.03L)
        fail_msg("%llu ns is not within 3 %% of %llu..%llu ns", (unsigned long long)ns,
                 (unsigned long long)lo, (unsigned long long)hi);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(f) TPT_TEST(f)
        T(test_clock_mode),
        T(test_clock_conversion),
        T(test_clock_never_goes_back),
        T(test_clock_agrees_with_monotonic),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
