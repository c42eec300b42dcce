/*
 * allocs.c -- heap allocations per task in steady state (the pool promises 0).
 *
 * Counting: tests/tpt_alloc_count.h, the malloc interposer the tests use too
 * (see its top comment for why it lives there). This executable defines
 * malloc, calloc, realloc, free and the aligned variants with it; the bench
 * links libtaskpool statically, and glibc lets an executable's definitions
 * interpose every caller's, so while armed every allocation in the process
 * is counted, with the kind, size and caller of the first one.
 *
 * Where it cannot work the figure is "n/a", never a crash or a false 0:
 * sanitizers own malloc, other C libraries lack __libc_malloc, and valgrind
 * replaces malloc even in the executable (tpt_alloc_unavailable says which).
 * A runtime probe checks that an armed malloc, called through its symbol as
 * the library calls it, is really seen, and that tp_create's allocations
 * are. If not, and none of those reasons applies, the interposer is broken:
 * the figure is n/a and the run fails, rather than pass by counting nothing.
 *
 * The scenario: a pool warmed up with every kind of task first (plain, named
 * user, on_done, explicit log id, tp_submit_wait, cancelled while queued, the
 * context getters and cancel fd, tp_ctx_sleep); then, armed, --alloc-tasks
 * tasks of the same mix run to completion. Tasks cancelled while queued carry
 * no on_done: with one, the record waits for the service thread, and a cancel
 * storm that outruns it grows the records (documented, and not steady state).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/tpt_alloc_count.h"
#include "bench.h"

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

/* Submits n tasks of the mix (with `lanes`, every priority in turn); 0 or
 * -1. Refusals are retried. */
static int run_mix(tp_pool *p, unsigned long n, int lanes) {
    for (unsigned long i = 0; i < n; i++) {
        tp_task_opts o = {0};
        if (lanes) o.priority = (int)(i % 5) - 2;
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

/* One pool: FIFO with the 1.1 mix (variant ""), or fair with every lane in
 * use ("fair"). 0, 1 (allocations seen: reported) or -1. */
static int allocs_pool(const bench_opts *o, unsigned round, int fair) {
    tp_config cfg = {
        .workers = o->workers,
        .queue_capacity = o->queue,
        .max_per_user = TP_UNLIMITED,
        .name = "bench",
        .log = bench_quiet_log,
        .sched = fair ? TP_SCHED_FAIR : TP_SCHED_FIFO,
    };
    const char *variant = fair ? "fair" : "";
    tp_pool *p;
    tpt_alloc_arm();
    int rc = tp_create(&p, &cfg);
    long by_create = tpt_alloc_disarm();
    if (rc != TP_OK) {
        fprintf(stderr, "tp_bench: tp_create: %s\n", tp_strerror(rc));
        return -1;
    }
    if (by_create == 0) { /* the library's own calls must be seen */
        tp_destroy(p);
        return counting_broken("tp_create");
    }
    if (fair && tp_user_weight_set(p, "alice", 3) != TP_OK) {
        tp_destroy(p);
        return -1;
    }
    atomic_store(&g_mix_done_bad, 0);

    /* Warm-up: the mix, with the thread's log id unset and set (generated and
     * inherited log ids), twice over. */
    uint64_t done = 0;
    unsigned long warm = BENCH_WARMUP_TASKS * 2ul;
    for (int k = 0; k < 4; k++) {
        tp_log_id_set(k % 2 ? "inherited" : NULL);
        if (run_mix(p, warm, fair) != 0 || wait_completed(p, done += warm) != 0) return -1;
    }
    tp_log_id_set(NULL);

    tpt_alloc_arm();
    if (run_mix(p, o->alloc_tasks, fair) != 0 || wait_completed(p, done += o->alloc_tasks) != 0) {
        tpt_alloc_disarm();
        return -1;
    }
    long allocs = tpt_alloc_disarm();

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

    bench_record(round, "allocs", variant, "allocs/task", (double)allocs / (double)o->alloc_tasks, NULL);
    if (allocs != 0) {
        tpt_alloc_first first = tpt_alloc_first_get();
        fprintf(stderr,
                "tp_bench: allocs%s%s: %ld heap allocation(s) during %lu steady-state tasks (the "
                "pool promises none); first: %s of %zu bytes, called from %p\n",
                fair ? " " : "", variant, allocs, o->alloc_tasks, tpt_alloc_kind_name(first.kind), first.size,
                first.caller);
        return 1; /* a broken promise: reported, the run goes on, exit status 1 */
    }
    return 0;
}

int scenario_allocs(const bench_opts *o, unsigned round) {
    if (!tpt_alloc_probe()) {
        const char *why = tpt_alloc_unavailable();
        if (why == NULL) return counting_broken("probe");
        bench_record_na("allocs", "", "allocs/task", why);
        bench_record_na("allocs", "fair", "allocs/task", why);
        return 0;
    }
    int a = allocs_pool(o, round, 0);
    if (a < 0) return -1;
    int b = allocs_pool(o, round, 1);
    if (b < 0) return -1;
    return a || b;
}
