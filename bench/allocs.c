/*
 * allocs.c -- heap allocations per task in steady state (the pool promises 0).
 *
 * Counting: this executable defines malloc, calloc, realloc, free and the
 * aligned variants, forwarding to glibc's __libc_* entry points. The bench
 * links libtaskpool statically, and glibc lets an executable's definitions
 * interpose every caller's (a shared libtaskpool would be counted too), so
 * while `g_armed` is set every allocation in the process is counted, with the
 * size and caller of the first one to help whoever has to find it. The
 * interposer forwards to __libc_malloc directly: no dlsym(), so nothing
 * allocates while resolving the real functions.
 *
 * Where it cannot work the figure is "n/a", never a crash or a false 0:
 * sanitizers own malloc (the interposer is not compiled under them), other
 * C libraries lack __libc_malloc, and valgrind replaces malloc even in the
 * executable. A runtime probe checks that an armed malloc, called through
 * its symbol as the library calls it, is really seen, and that tp_create's
 * allocations are. If not, and none of those reasons applies (valgrind is
 * recognised by its preload library in /proc/self/maps), the interposer is
 * broken: the figure is n/a and the run fails, rather than pass by counting
 * nothing.
 *
 * The scenario: a pool warmed up with every kind of task first (plain, named
 * user, on_done, explicit log id, tp_submit_wait, cancelled while queued, the
 * context getters and cancel fd, tp_ctx_sleep); then, armed, --alloc-tasks
 * tasks of the same mix run to completion. Tasks cancelled while queued carry
 * no on_done: with one, the record waits for the service thread, and a cancel
 * storm that outruns it grows the records (documented, and not steady state).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static atomic_int g_armed;
static atomic_long g_count;
static _Atomic size_t g_first_size;
static void *_Atomic g_first_caller;

#if !BENCH_SANITIZED && defined(__GLIBC__)
#define BENCH_INTERPOSE 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

static inline void count(size_t size, void *caller) {
    /* relaxed: the arming thread reads the count after the pool's own
     * synchronisation (every task ended) has ordered the counting threads. */
    if (atomic_load_explicit(&g_armed, memory_order_relaxed) &&
        atomic_fetch_add_explicit(&g_count, 1, memory_order_relaxed) == 0) {
        atomic_store_explicit(&g_first_size, size, memory_order_relaxed);
        atomic_store_explicit(&g_first_caller, caller, memory_order_relaxed);
    }
}

void *malloc(size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    count(a * b, __builtin_return_address(0));
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
int posix_memalign(void **r, size_t a, size_t n) {
    if (a < sizeof(void *) || (a & (a - 1)) != 0) return EINVAL;
    count(n, __builtin_return_address(0));
    void *p = __libc_memalign(a, n);
    if (p == NULL) return ENOMEM;
    *r = p;
    return 0;
}
void *valloc(size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_valloc(n);
}
void *pvalloc(size_t n) {
    count(n, __builtin_return_address(0));
    return __libc_pvalloc(n);
}
#else
#define BENCH_INTERPOSE 0
#endif

static void arm(void) {
    atomic_store(&g_count, 0);
    atomic_store(&g_armed, 1);
}

static long disarm(void) {
    atomic_store(&g_armed, 0);
    return atomic_load(&g_count);
}

/* The allocation functions as the library reaches them: through the symbol.
 * A direct call from this file may be inlined into the definition above and
 * never reach the symbol (which valgrind, for one, replaces). */
static void *(*volatile sym_malloc)(size_t) = malloc;
static void *(*volatile sym_calloc)(size_t, size_t) = calloc;
static void (*volatile sym_free)(void *) = free;

/* Whether our malloc really is the one called. The volatile pointers keep the
 * compiler from pairing malloc with free and dropping both. */
static int interposer_active(void) {
    if (!BENCH_INTERPOSE) return 0;
    arm();
    void *volatile x = sym_malloc(40);
    char *volatile y = sym_calloc(2, 8);
    long n = disarm();
    sym_free(x);
    sym_free(y);
    return n >= 2;
}

/* Whether valgrind runs this process: its preload library is mapped. */
static int under_valgrind(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    if (m == NULL) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, m) != NULL) found = strstr(line, "vgpreload") != NULL;
    fclose(m);
    return found;
}

/* Why allocations cannot be counted here, or NULL if they must be. */
static const char *counting_unavailable(void) {
    if (BENCH_SANITIZED) return "a sanitizer owns malloc";
    if (!BENCH_INTERPOSE) return "malloc cannot be interposed here";
    if (under_valgrind()) return "valgrind replaces malloc";
    return NULL;
}

/* The interposer should count and does not: a broken measurement. */
static int counting_broken(const char *what) {
    fprintf(stderr,
            "tp_bench: allocs: the malloc interposer counts nothing (%s): a 0 would "
            "mean nothing\n",
            what);
    bench_record_na("allocs", "", "allocs/task", "the malloc interposer is broken");
    return 1; /* reported, the run goes on, exit status 1 */
}

/* ------------------------------------------------------------ the mix */

static atomic_ulong g_mix_done_bad; /* on_done with a status other than 0 */

static int mix_task(tp_ctx *ctx, void *arg) {
    (void)arg;
    return bench_run_body(ctx, &(bench_body){BODY_EMPTY, 0});
}

static int ctx_task(tp_ctx *ctx, void *arg) {
    (void)arg;
    (void)tp_ctx_fd(ctx);
    (void)tp_ctx_err(ctx);
    (void)tp_ctx_deadline(ctx);
    (void)tp_ctx_id(ctx);
    (void)tp_ctx_user(ctx);
    (void)tp_ctx_log_id(ctx);
    (void)tp_ctx_attempt(ctx);
    (void)tp_log_id_get();
    (void)tp_ctx_sleep(ctx, 1000); /* 1 us */
    return 0;
}

static void mix_done(void *arg, int status) {
    (void)arg;
    if (status != 0) atomic_fetch_add_explicit(&g_mix_done_bad, 1, memory_order_relaxed);
}

static const char *const g_mix_users[] = {"alice", "bob", "carol", "dave"};
static const char *const g_mix_log_ids[] = {"req-1", "req-2", "req-3"};

/* Submits n tasks of the mix; 0 or -1. Refusals are retried. */
static int run_mix(tp_pool *p, unsigned long n) {
    for (unsigned long i = 0; i < n; i++) {
        tp_task_opts o = {0};
        tp_fn fn = mix_task;
        int wait = 0, cancel = 0;
        switch (i % 8) {
        case 0: break;
        case 1: o.user = g_mix_users[i % 4]; break;
        case 2: o.on_done = mix_done; break;
        case 3: o.log_id = g_mix_log_ids[i % 3]; break;
        case 4:
            wait = 1;
            o.user = g_mix_users[(i / 8) % 4];
            break;
        case 5: cancel = 1; break;
        case 6:
            fn = ctx_task;
            o.user = g_mix_users[(i / 8) % 4];
            o.on_done = mix_done;
            o.deadline_ns = tp_now_ns() + 60000 * 1000000ull;
            break;
        default: wait = 1; break;
        }
        uint64_t id = 0;
        int rc;
        if (wait) {
            rc = tp_submit_wait(p, fn, NULL, &o, 10000 * 1000000ull, &id);
        } else {
            while ((rc = tp_submit(p, fn, NULL, &o, &id)) == TP_EFULL) sched_yield();
        }
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: allocs: submit: %s\n", tp_err_name(rc));
            return -1;
        }
        if (cancel && (rc = tp_cancel(p, id)) != TP_OK && rc != TP_ENOTFOUND) {
            fprintf(stderr, "tp_bench: allocs: tp_cancel: %s\n", tp_err_name(rc));
            return -1;
        }
    }
    return 0;
}

/* Waits (bounded) until `want` tasks have completed. */
static int wait_completed(tp_pool *p, uint64_t want) {
    uint64_t end = bench_now() + BENCH_STALL_NS;
    for (;;) {
        tp_stats s;
        tp_stats_get(p, &s);
        if (s.completed >= want) return 0;
        if (bench_now() > end) {
            fprintf(stderr, "tp_bench: allocs: %llu of %llu tasks completed after %llu s\n",
                    (unsigned long long)s.completed, (unsigned long long)want,
                    (unsigned long long)(BENCH_STALL_NS / 1000000000u));
            return -1;
        }
        bench_sleep_ns(50000);
    }
}

int scenario_allocs(const bench_opts *o, unsigned round) {
    if (!interposer_active()) {
        const char *why = counting_unavailable();
        if (why == NULL) return counting_broken("probe");
        bench_record_na("allocs", "", "allocs/task", why);
        return 0;
    }
    tp_config cfg = {
        .workers = o->workers,
        .queue_capacity = o->queue,
        .max_per_user = TP_UNLIMITED,
        .name = "bench",
        .log = bench_quiet_log,
    };
    tp_pool *p;
    arm();
    int rc = tp_create(&p, &cfg);
    long by_create = disarm();
    if (rc != TP_OK) {
        fprintf(stderr, "tp_bench: tp_create: %s\n", tp_strerror(rc));
        return -1;
    }
    if (by_create == 0) { /* the library's own calls must be seen */
        tp_destroy(p);
        return counting_broken("tp_create");
    }
    atomic_store(&g_mix_done_bad, 0);

    /* Warm-up: the mix, with the thread's log id unset and set (generated and
     * inherited log ids), twice over. */
    uint64_t done = 0;
    unsigned long warm = BENCH_WARMUP_TASKS * 2ul;
    for (int k = 0; k < 4; k++) {
        tp_log_id_set(k % 2 ? "inherited" : NULL);
        if (run_mix(p, warm) != 0 || wait_completed(p, done += warm) != 0) return -1;
    }
    tp_log_id_set(NULL);

    arm();
    if (run_mix(p, o->alloc_tasks) != 0 || wait_completed(p, done += o->alloc_tasks) != 0) {
        disarm();
        return -1;
    }
    long allocs = disarm();

    tp_stats s;
    rc = tp_shutdown(p, 60000 * 1000000ull);
    tp_stats_get(p, &s);
    tp_destroy(p);
    if (rc != TP_OK || s.completed != done || s.accepted != done || atomic_load(&g_mix_done_bad) != 0) {
        fprintf(stderr, "tp_bench: allocs: shutdown %s, completed %llu of %llu, %lu bad on_done\n",
                tp_err_name(rc), (unsigned long long)s.completed, (unsigned long long)done,
                atomic_load(&g_mix_done_bad));
        return -1;
    }

    bench_record(round, "allocs", "", "allocs/task", (double)allocs / (double)o->alloc_tasks, NULL);
    if (allocs != 0) {
        fprintf(stderr,
                "tp_bench: allocs: %ld heap allocation(s) during %lu steady-state tasks (the "
                "pool promises none); first: %zu bytes, called from %p\n",
                allocs, o->alloc_tasks, atomic_load(&g_first_size), atomic_load(&g_first_caller));
        return 1; /* a broken promise: reported, the run goes on, exit status 1 */
    }
    return 0;
}
