/*
 * clock.c -- the clocks: tp_now_ns (CLOCK_MONOTONIC), and choosing and
 * calibrating the histograms' clock (see clock.h).
 *
 * Once per process, at the first tp_create: on x86-64, when /proc/cpuinfo
 * lists constant_tsc and nonstop_tsc (the TSC ticks at one rate in every
 * P- and C-state, and the kernel keeps the CPUs' TSCs in step), measure the
 * TSC against CLOCK_MONOTONIC over ~1 ms and keep ns per tick in 32.32
 * fixed point. Each end of the interval is the TSC read between two
 * CLOCK_MONOTONIC reads, the narrowest bracket of a few tries, so a
 * preemption there cannot skew it; the error is then some 20 ns in 1 ms
 * (0.002 %), far inside a histogram bucket (12.5 %). A rate outside
 * 50 MHz..20 GHz means something is off (a migrating VM, a TSC that stops):
 * then, and on any other machine, the histograms keep CLOCK_MONOTONIC.
 *
 * Layer: a leaf (6 in pool.h): pool.c initialises it; pool.c, life.c,
 * engine.c and stats.c take stamps through the inline functions of clock.h;
 * every file may call tp_now_ns.
 */
#include "base.h" /* first: it defines _GNU_SOURCE */
#include "clock.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The pool's clock (public): deadlines, timeouts, retry delays, idle time. */
uint64_t tp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

_Atomic uint64_t tp__hclk_mult;

#if TP__HCLK_TSC

#define CALIB_NS 1000000ull /* the calibration interval */

/* The first "flags" line of /proc/cpuinfo (the first CPU's, within its
 * first 16 KiB) has both invariant-TSC flags. open/read, not stdio: no heap
 * allocation, so tp_create's allocations stay what they were. */
static int tsc_invariant(void) {
    static const char key[] = "\nflags";
    char buf[16384];
    size_t n = 0;
    int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - 2 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
        if (n == sizeof buf - 2) break;
    }
    close(fd);
    buf[n] = '\0';
    char *flags = strstr(buf, key);
    if (!flags) return 0;
    char *eol = strchr(flags + 1, '\n');
    if (!eol) return 0; /* cut off: do not guess */
    eol[0] = ' ';       /* every flag is " name " now */
    eol[1] = '\0';
    return strstr(flags, " constant_tsc ") && strstr(flags, " nonstop_tsc ");
}

/* One TSC reading and the CLOCK_MONOTONIC time it was taken at: the middle
 * of the narrowest of a few brackets. */
static void paired_read(uint64_t *tsc, uint64_t *ns) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = tp_now_ns();
        uint64_t c = __rdtsc();
        uint64_t b = tp_now_ns();
        if (b - a < best) {
            best = b - a;
            *tsc = c;
            *ns = a + (b - a) / 2;
        }
    }
}

/* ns per tick in 32.32 fixed point, or 0 if the TSC looks unusable. */
static uint64_t calibrate(void) {
    uint64_t c0 = 0, n0 = 0, c1 = 0, n1 = 0;
    paired_read(&c0, &n0);
    while (tp_now_ns() - n0 < CALIB_NS) {
    }
    paired_read(&c1, &n1);
    if (c1 <= c0 || n1 <= n0) return 0;
    uint64_t mult = (uint64_t)((((tp__hclk_u128)(n1 - n0)) << 32) / (c1 - c0));
    /* 20 GHz .. 50 MHz: 0.05 .. 20 ns per tick */
    if (mult < (1ull << 32) / 20 || mult > (1ull << 32) * 20) return 0;
    return mult;
}

static void hclk_choose(void) {
    if (tsc_invariant()) atomic_store_explicit(&tp__hclk_mult, calibrate(), memory_order_relaxed);
}

#else

static void hclk_choose(void) {}

#endif

void tp__hclk_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hclk_choose);
}
