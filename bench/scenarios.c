/*
 * scenarios.c -- the pool scenarios of tp_bench.
 *
 * Every scenario creates its own pool (workers --workers, queue --queue, a
 * quiet log hook), warms it with BENCH_WARMUP_TASKS tasks outside the timed
 * region, measures, shuts the pool down and checks its counters against what
 * the scenario saw. Tasks signal their end through a countdown (bench.h);
 * every wait on it is bounded.
 *
 *   throughput   P producers, released together by a start flag, submit
 *                --tasks tasks in total with tp_submit(), yielding
 *                (sched_yield) and retrying on TP_EFULL -- the perf harness's
 *                workload. Time runs from the release to the end of the last
 *                task. Figures: ns/task (ratio to the bare ring; with one
 *                producer and W > 1 also to the ring of W consumers), tasks/s,
 *                refusals, and the process's context switches per 1000 tasks
 *                (getrusage): voluntary ones ("sleeps": a thread blocked on
 *                the pool lock or a condition variable, or yielded) and
 *                involuntary ones ("preempts"). A run with few sleeps is
 *                several times faster than one with many on a small machine.
 *   users        the same with per-user accounting: task i of a producer
 *                names one of --users users in turn; max_per_user is
 *                queue + workers, so no user limit is ever hit and the figure
 *                is the accounting's cost (also as a ratio to plain).
 *   submit_wait  the same with tp_submit_wait(): producers block for space
 *                instead of spinning on refusals.
 *   batch        the same with tp_submit_batch(): each call hands in --batch
 *                tasks; what a full queue refuses is handed in again (the
 *                rest of the batch, as one call) after sched_yield. Every
 *                refused call counts one refusal, as in the pool. Also as a
 *                ratio to the plain throughput of the same round.
 *   wake         one task at a time into an idle pool, after an idle gap:
 *                submit timestamp to task-start timestamp (ratio to the bare
 *                condvar wake of the same round).
 *   load         a producer paced at --load percent of the capacity just
 *                measured (an absolute schedule: when a sleep overshoots, the
 *                tasks due are submitted at once), --load-tasks tasks of
 *                --load-body; per task queue wait (submit -> start) and run
 *                time (start -> end) into preallocated arrays. Next to their
 *                p50/p99, the pool's own histograms' (tp_hist_quantile_ns of
 *                the paced run's observations: a snapshot after minus one
 *                before), and whether each lies within one bucket of the
 *                bench's figure ("hist agrees": 1 or 0).
 *   fair         one producer (the calling thread) submits --tasks tasks to a
 *                fair pool (TP_SCHED_FAIR), naming U users in turn, for U = 1,
 *                100 and 10,000; the queue holds 20,000 tasks in every case
 *                (two per user of the largest U; at least --queue), so every
 *                user stays backlogged while the producer retries on TP_EFULL. ns/task per U and its ratio to U = 1:
 *                a start is O(1) in the number of users.
 *   cancel       the workers held by tasks that run until cancelled, the
 *                queue filled; each queued task cancelled with tp_cancel()
 *                (ns per call); the queue filled again and the pool shut down
 *                with a 1 ms budget: the call's time, and the time until the
 *                last dropped task's on_done, per dropped task.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench.h"

#define WAKE_WARMUP      50 /* unrecorded samples, as the perf driver */
#define SHUTDOWN_NS      (60ull * 1000000000ull)
#define SUBMIT_WAIT_NS   (10ull * 1000000000ull)
#define FORCED_BUDGET_NS 1000000ull /* 1 ms */
#define MS               1000000ull

/* ------------------------------------------------------------ helpers */

void bench_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void sleep_until(uint64_t deadline) {
    struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

void bench_spin_until(uint64_t deadline) {
    while (bench_now() < deadline) {
    }
}

int bench_run_body(tp_ctx *ctx, const bench_body *b) {
    switch (b->kind) {
    case BODY_SPIN: bench_spin_until(bench_now() + b->ns); break;
    case BODY_SLEEP: (void)tp_ctx_sleep(ctx, b->ns); break;
    default: break;
    }
    return 0;
}

static atomic_ulong g_log_calls; /* failed attempts reported by any bench pool */

void bench_quiet_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    (void)level;
    (void)log_id;
    (void)msg;
    atomic_fetch_add_explicit(&g_log_calls, 1, memory_order_relaxed);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void bench_sort(uint64_t *v, unsigned long n) { qsort(v, n, sizeof v[0], cmp_u64); }

uint64_t bench_pct(const uint64_t *sorted, unsigned long n, double p) {
    if (n == 0) return 0;
    double rank = p / 100.0 * (double)n; /* nearest rank: ceil(p% of n) */
    unsigned long k = (unsigned long)rank;
    if ((double)k < rank) k++;
    if (k < 1) k = 1;
    if (k > n) k = n;
    return sorted[k - 1];
}

int bench_wait_active(tp_pool *p, unsigned n) {
    uint64_t end = bench_now() + 10000 * MS;
    for (;;) {
        tp_stats s;
        tp_stats_get(p, &s);
        if (s.active == n) return 0;
        if (bench_now() > end) {
            fprintf(stderr, "tp_bench: %u of %u tasks running after 10 s\n", s.active, n);
            return -1;
        }
        bench_sleep_ns(100000);
    }
}

/* ------------------------------------------------------------ countdown */

void countdown_init(bench_countdown *c) {
    atomic_init(&c->left, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->reached = 1;
}

void countdown_destroy(bench_countdown *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

void countdown_arm(bench_countdown *c, unsigned long n) {
    pthread_mutex_lock(&c->mu);
    atomic_store_explicit(&c->left, n, memory_order_relaxed);
    c->reached = n == 0;
    pthread_mutex_unlock(&c->mu);
}

void countdown_hit(bench_countdown *c) {
    /* acq_rel: what a task wrote before its hit (timestamps) reaches the last
     * hitter through the chain of RMWs, and from it the waiter through mu. */
    if (atomic_fetch_sub_explicit(&c->left, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&c->mu);
        c->reached = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
}

int countdown_wait(bench_countdown *c, const char *what) {
    int rc = 0;
    unsigned long last = atomic_load_explicit(&c->left, memory_order_relaxed);
    uint64_t progress = bench_now();
    pthread_mutex_lock(&c->mu);
    while (!c->reached) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000; /* re-check progress every 100 ms */
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) continue;
        unsigned long now = atomic_load_explicit(&c->left, memory_order_relaxed);
        if (now != last) {
            last = now;
            progress = bench_now();
        } else if (bench_now() - progress > BENCH_STALL_NS) {
            fprintf(stderr, "tp_bench: %s: %lu tasks never ended (none ended for %llu s)\n", what, now,
                    (unsigned long long)(BENCH_STALL_NS / 1000000000u));
            rc = -1;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ------------------------------------------------------------ shared state */

static bench_countdown g_done;
static char (*g_user_names)[16];                      /* --users names */
static uint64_t *g_wake_lat;                          /* --samples */
static uint64_t *g_submit_at, *g_start_at, *g_end_at; /* --load-tasks each */
static uint64_t *g_ids;                               /* --queue + --workers */
static tp_task *g_batch;                              /* --batch, all alike, read-only */

int scenarios_setup(const bench_opts *o) {
    countdown_init(&g_done);
    g_user_names = calloc(o->users, sizeof g_user_names[0]);
    g_wake_lat = calloc(o->samples, sizeof g_wake_lat[0]);
    g_submit_at = calloc(o->load_tasks, sizeof(uint64_t));
    g_start_at = calloc(o->load_tasks, sizeof(uint64_t));
    g_end_at = calloc(o->load_tasks, sizeof(uint64_t));
    g_ids = calloc((size_t)o->queue + o->workers, sizeof(uint64_t));
    g_batch = calloc(o->batch, sizeof g_batch[0]);
    if (!g_user_names || !g_wake_lat || !g_submit_at || !g_start_at || !g_end_at || !g_ids || !g_batch) {
        fprintf(stderr, "tp_bench: out of memory for the scenario buffers\n");
        return -1;
    }
    for (unsigned i = 0; i < o->users; i++) snprintf(g_user_names[i], sizeof g_user_names[i], "user-%u", i);
    return 0;
}

void scenarios_teardown(void) {
    countdown_destroy(&g_done);
    free(g_user_names);
    free(g_wake_lat);
    free(g_submit_at);
    free(g_start_at);
    free(g_end_at);
    free(g_ids);
    free(g_batch);
}

static int make_pool(const bench_opts *o, unsigned max_per_user, tp_pool **out) {
    tp_config cfg = {
        .workers = o->workers,
        .queue_capacity = o->queue,
        .max_per_user = max_per_user,
        .run_timeout_ns = TP_FOREVER,
        .name = "bench",
        .log = bench_quiet_log,
    };
    int rc = tp_create(out, &cfg);
    if (rc != TP_OK) fprintf(stderr, "tp_bench: tp_create: %s\n", tp_strerror(rc));
    return rc == TP_OK ? 0 : -1;
}

/* Shuts the pool down (bounded) and destroys it. `want` is the expected
 * result of tp_shutdown. Fills *s with the final counters. */
static int end_pool(tp_pool *p, int want, tp_stats *s) {
    int rc = tp_shutdown(p, SHUTDOWN_NS);
    if (rc != want) {
        fprintf(stderr, "tp_bench: tp_shutdown: %s, expected %s\n", tp_err_name(rc), tp_err_name(want));
        return -1; /* tp_destroy() could wait for whatever is stuck: leak it */
    }
    if (want != TP_OK && (rc = tp_wait(p, SHUTDOWN_NS)) != TP_ETIMEDOUT) {
        fprintf(stderr, "tp_bench: tp_wait after a forced shutdown: %s\n", tp_err_name(rc));
        return -1;
    }
    tp_stats_get(p, s);
    tp_destroy(p);
    return 0;
}

/* Every task ended, none failed, the refusals seen match the pool's count. */
static int check_clean(const tp_stats *s, unsigned long long tasks, unsigned long long refusals,
                       const char *what) {
    if (s->accepted == tasks && s->completed == tasks && s->succeeded == tasks && s->rejected == refusals &&
        s->rejected_full == refusals)
        return 0;
    fprintf(stderr,
            "tp_bench: %s: the pool's counters disagree: accepted %llu, completed %llu, "
            "succeeded %llu, rejected %llu (full %llu); expected %llu tasks, %llu refusals\n",
            what, (unsigned long long)s->accepted, (unsigned long long)s->completed,
            (unsigned long long)s->succeeded, (unsigned long long)s->rejected,
            (unsigned long long)s->rejected_full, tasks, refusals);
    return -1;
}

/* ------------------------------------------------------------ throughput */

static bench_body g_body; /* body of the throughput tasks, set per run */

static int tput_task(tp_ctx *ctx, void *arg) {
    (void)arg;
    int rc = bench_run_body(ctx, &g_body);
    countdown_hit(&g_done);
    return rc;
}

typedef struct producer {
    pthread_t thread;
    tp_pool *pool;
    atomic_int *go;      /* set to 1 once every producer exists (or creation failed) */
    int kind;            /* TPUT_* */
    unsigned first_user; /* users: where this producer starts its round robin */
    unsigned users;
    unsigned batch;      /* TPUT_BATCH: tasks per call */
    unsigned long count; /* tasks to submit */
    unsigned long refusals;
    int error; /* first unexpected result */
} producer;

/* TPUT_BATCH: pr->count tasks in calls of pr->batch; the rest of a call
 * refused for space is handed in again. 0 or the unexpected result code. */
static int produce_batches(producer *pr) {
    unsigned long left = pr->count;
    while (left > 0) {
        size_t n = left < pr->batch ? (size_t)left : pr->batch;
        while (n > 0) {
            size_t k = 0;
            int rc = tp_submit_batch(pr->pool, g_batch, n, NULL, &k);
            n -= k;
            left -= k;
            if (rc == TP_EFULL) {
                pr->refusals++;
                sched_yield();
            } else if (rc != TP_OK) {
                return rc;
            }
        }
    }
    return 0;
}

/* Submits pr->count tasks; 0 or the unexpected result code. */
static int produce(producer *pr) {
    if (pr->kind == TPUT_BATCH) return produce_batches(pr);
    tp_task_opts opts = {0};
    unsigned u = pr->first_user;
    for (unsigned long i = 0; i < pr->count; i++) {
        int rc;
        switch (pr->kind) {
        case TPUT_WAIT: rc = tp_submit_wait(pr->pool, tput_task, NULL, NULL, SUBMIT_WAIT_NS, NULL); break;
        case TPUT_USERS:
            opts.user = g_user_names[u];
            u = u + 1 == pr->users ? 0 : u + 1;
            while ((rc = tp_submit(pr->pool, tput_task, NULL, &opts, NULL)) == TP_EFULL) {
                pr->refusals++;
                sched_yield();
            }
            break;
        default:
            while ((rc = tp_submit(pr->pool, tput_task, NULL, NULL, NULL)) == TP_EFULL) {
                pr->refusals++;
                sched_yield();
            }
            break;
        }
        if (rc != TP_OK) return rc;
    }
    return 0;
}

static void *producer_main(void *arg) {
    producer *pr = arg;
    while (!atomic_load_explicit(pr->go, memory_order_acquire)) sched_yield();
    pr->error = produce(pr);
    return NULL;
}

static const char *const g_tput_names[] = {"throughput", "users", "submit_wait", "batch"};

int scenario_throughput(const bench_opts *o, unsigned round, int kind, unsigned nprod) {
    const char *name = g_tput_names[kind];
    tp_pool *pool;
    unsigned per_user = kind == TPUT_USERS ? o->queue + o->workers : TP_UNLIMITED;
    if (make_pool(o, per_user, &pool) != 0) return -1;

    /* Warm-up: one producer, inline, the same kind of submit. */
    g_body = o->body;
    for (unsigned i = 0; i < o->batch; i++)
        g_batch[i] = (tp_task){.fn = tput_task, .arg = NULL, .opts = NULL};
    countdown_arm(&g_done, BENCH_WARMUP_TASKS);
    producer warm = {
        .pool = pool, .kind = kind, .users = o->users, .batch = o->batch, .count = BENCH_WARMUP_TASKS};
    int rc = produce(&warm);
    if (rc != 0) {
        fprintf(stderr, "tp_bench: %s warm-up: %s\n", name, tp_err_name(rc));
        tp_stats s;
        end_pool(pool, TP_OK, &s);
        return -1;
    }
    if (countdown_wait(&g_done, name) != 0) return -1;

    producer pr[BENCH_MAX_PRODUCERS];
    atomic_int go = 0;
    countdown_arm(&g_done, o->tasks);
    unsigned started = 0;
    for (unsigned i = 0; i < nprod; i++) {
        pr[i] = (producer){
            .pool = pool,
            .go = &go,
            .kind = kind,
            .first_user = (unsigned)((unsigned long long)i * o->users / nprod),
            .users = o->users,
            .batch = o->batch,
            .count = o->tasks / nprod + (i < o->tasks % nprod ? 1 : 0),
        };
        if (pthread_create(&pr[i].thread, NULL, producer_main, &pr[i]) != 0) break;
        started++;
    }
    if (started < nprod) {
        fprintf(stderr, "tp_bench: pthread_create failed\n");
        for (unsigned i = 0; i < started; i++) pr[i].count = 0; /* not read before `go` releases them */
    }
    /* Context switches of the whole process (every thread) over the run:
     * voluntary ones are sleeps (on the pool lock, a condition variable, or
     * a sched_yield that gave the CPU away), involuntary ones preemptions. */
    struct rusage ru0, ru1;
    int have_ru = getrusage(RUSAGE_SELF, &ru0) == 0;
    atomic_store_explicit(&go, 1, memory_order_release);
    uint64_t t0 = bench_now();

    unsigned long refusals = 0;
    int failed = started < nprod;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(pr[i].thread, NULL);
        refusals += pr[i].refusals;
        if (pr[i].error != 0) {
            fprintf(stderr, "tp_bench: %s: submit: %s\n", name, tp_err_name(pr[i].error));
            failed = 1;
        }
    }
    if (failed) return -1;
    if (countdown_wait(&g_done, name) != 0) return -1;
    uint64_t t1 = bench_now();
    have_ru = have_ru && getrusage(RUSAGE_SELF, &ru1) == 0;

    tp_stats s;
    if (end_pool(pool, TP_OK, &s) != 0 ||
        check_clean(&s, o->tasks + BENCH_WARMUP_TASKS, refusals + warm.refusals, name) != 0)
        return -1;

    char variant[16];
    snprintf(variant, sizeof variant, "P=%u", nprod);
    double ns = (double)(t1 - t0) / (double)o->tasks;
    static const bench_ref to_ring = {"limits", "", "ring ns/item", "x bare ring ns/item"};
    bench_record(round, name, variant, "ns/task", ns, &to_ring);
    /* With one producer, also against the ring of the pool's own shape (one
     * producer, W consumers; measured when W > 1). */
    double ring_w = nprod == 1 ? bench_value(round, "limits", "", "ring 1:W ns/item") : -1;
    if (ring_w > 0) bench_record(round, name, variant, "ns/task / ring 1:W", ns / ring_w, NULL);
    bench_record(round, name, variant, "tasks/s", 1e9 / ns, NULL);
    if (kind != TPUT_WAIT) bench_record(round, name, variant, "EFULL refusals", (double)refusals, NULL);
    if (have_ru) {
        double per_k = 1000.0 / (double)o->tasks;
        bench_record(round, name, variant, "sleeps/1k tasks", (double)(ru1.ru_nvcsw - ru0.ru_nvcsw) * per_k,
                     NULL);
        bench_record(round, name, variant, "preempts/1k tasks",
                     (double)(ru1.ru_nivcsw - ru0.ru_nivcsw) * per_k, NULL);
    }
    if (kind == TPUT_USERS || kind == TPUT_BATCH) {
        double plain = bench_value(round, "throughput", variant, "ns/task");
        if (plain > 0)
            bench_record(round, name, variant,
                         kind == TPUT_USERS ? "ns/task / plain" : "ns/task / single submit", ns / plain,
                         NULL);
    }
    return 0;
}

/* ------------------------------------------------------------ wake latency */

typedef struct wake_state {
    atomic_ullong start;
    atomic_int flag;
} wake_state;

static int wake_task(tp_ctx *ctx, void *arg) {
    (void)ctx;
    wake_state *w = arg;
    atomic_store_explicit(&w->start, bench_now(), memory_order_relaxed);
    /* release: the stamp is visible to whoever sees the flag */
    atomic_store_explicit(&w->flag, 1, memory_order_release);
    return 0;
}

int scenario_wake(const bench_opts *o, unsigned round) {
    tp_pool *pool;
    if (make_pool(o, TP_UNLIMITED, &pool) != 0) return -1;
    g_body = (bench_body){BODY_EMPTY, 0};
    countdown_arm(&g_done, BENCH_WARMUP_TASKS);
    producer warm = {.pool = pool, .kind = TPUT_PLAIN, .count = BENCH_WARMUP_TASKS};
    int rc = produce(&warm);
    if (rc != 0 || countdown_wait(&g_done, "wake warm-up") != 0) {
        fprintf(stderr, "tp_bench: wake warm-up failed: %s\n", tp_err_name(rc));
        return -1;
    }

    wake_state w;
    atomic_init(&w.start, 0);
    atomic_init(&w.flag, 0);
    unsigned long refusals = warm.refusals;
    for (long s = -WAKE_WARMUP; s < (long)o->samples; s++) {
        atomic_store_explicit(&w.flag, 0, memory_order_relaxed);
        bench_sleep_ns(o->gap_ns);
        uint64_t ts = bench_now();
        while ((rc = tp_submit(pool, wake_task, &w, NULL, NULL)) == TP_EFULL) {
            refusals++;
            sched_yield();
        }
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: wake: tp_submit: %s\n", tp_err_name(rc));
            return -1;
        }
        uint64_t give_up = ts + BENCH_STALL_NS;
        while (!atomic_load_explicit(&w.flag, memory_order_acquire)) {
            sched_yield();
            if (bench_now() > give_up) {
                fprintf(stderr, "tp_bench: wake: a task never started\n");
                return -1;
            }
        }
        uint64_t st = atomic_load_explicit(&w.start, memory_order_relaxed);
        if (s >= 0) g_wake_lat[s] = st > ts ? st - ts : 0;
    }

    tp_stats s;
    unsigned long long total = BENCH_WARMUP_TASKS + WAKE_WARMUP + (unsigned long long)o->samples;
    if (end_pool(pool, TP_OK, &s) != 0 || check_clean(&s, total, refusals, "wake") != 0) return -1;

    unsigned n = o->samples;
    bench_sort(g_wake_lat, n);
    static const bench_ref to_p50 = {"limits", "", "wake p50 ns", "x bare condvar wake p50"};
    static const bench_ref to_p99 = {"limits", "", "wake p99 ns", "x bare condvar wake p99"};
    bench_record(round, "wake", "", "p50 ns", (double)bench_pct(g_wake_lat, n, 50), &to_p50);
    bench_record(round, "wake", "", "p90 ns", (double)bench_pct(g_wake_lat, n, 90), NULL);
    bench_record(round, "wake", "", "p99 ns", (double)bench_pct(g_wake_lat, n, 99), &to_p99);
    bench_record(round, "wake", "", "max ns", (double)g_wake_lat[n - 1], NULL);
    return 0;
}

/* ------------------------------------------------------------ steady load */

/* Whether histogram quantile `hv` (a bucket bound) lies within one bucket of
 * the exact value `v`: v's bucket is the first whose bound is >= v. */
static int within_one_bucket(uint64_t hv, uint64_t v) {
    unsigned iv = 0, ih = 0;
    while (iv + 1 < TP_HIST_BUCKETS && tp_hist_bound_ns(iv) < v) iv++;
    while (ih + 1 < TP_HIST_BUCKETS && tp_hist_bound_ns(ih) < hv) ih++;
    return iv > ih ? iv - ih <= 1 : ih - iv <= 1;
}

static bench_body g_load_body;

static int load_task(tp_ctx *ctx, void *arg) {
    uintptr_t i = (uintptr_t)arg;
    g_start_at[i] = bench_now();
    bench_run_body(ctx, &g_load_body);
    g_end_at[i] = bench_now();
    countdown_hit(&g_done); /* publishes the stamps (see countdown_hit) */
    return 0;
}

/* Submits tasks [from, to): paced at `period` ns from `t0` with tp_submit()
 * (counting refusals), or with period 0 flat out with tp_submit_wait(), so
 * that a producer waiting for space sleeps instead of taking CPU time from
 * the workers whose capacity is being measured. Returns 0 or -1. */
static int load_submit(tp_pool *pool, unsigned long from, unsigned long to, uint64_t t0, double period,
                       unsigned long *refusals) {
    for (unsigned long i = from; i < to; i++) {
        if (period > 0) {
            uint64_t due = t0 + (uint64_t)((double)(i - from) * period);
            if (bench_now() < due) sleep_until(due);
        }
        int rc;
        for (;;) {
            g_submit_at[i] = bench_now();
            if (period <= 0) {
                rc = tp_submit_wait(pool, load_task, (void *)(uintptr_t)i, NULL, SUBMIT_WAIT_NS, NULL);
                break;
            }
            rc = tp_submit(pool, load_task, (void *)(uintptr_t)i, NULL, NULL);
            if (rc != TP_EFULL) break;
            (*refusals)++;
            sched_yield();
        }
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: load: tp_submit: %s\n", tp_err_name(rc));
            return -1;
        }
    }
    return 0;
}

int scenario_load(const bench_opts *o, unsigned round) {
    tp_pool *pool;
    if (make_pool(o, TP_UNLIMITED, &pool) != 0) return -1;
    g_load_body = o->load_body;
    unsigned long n = o->load_tasks, refusals = 0;

    /* Capacity: a quarter of the tasks flat out, after an eighth to warm the
     * pool up. */
    unsigned long warm = n / 8 + 1, cap_n = n / 4 + 1;
    if (warm + cap_n > n) warm = cap_n = n / 2;
    countdown_arm(&g_done, warm);
    if (load_submit(pool, 0, warm, 0, 0, &refusals) != 0 || countdown_wait(&g_done, "load warm-up") != 0)
        return -1;
    countdown_arm(&g_done, cap_n);
    uint64_t t0 = bench_now();
    if (load_submit(pool, 0, cap_n, 0, 0, &refusals) != 0 || countdown_wait(&g_done, "load capacity") != 0)
        return -1;
    uint64_t t1 = bench_now();
    double capacity = cap_n > 0 && t1 > t0 ? (double)cap_n * 1e9 / (double)(t1 - t0) : 0;

    /* The paced run. Its histogram observations: after minus before. */
    static tp_hist h0[2], h1[2];
    if (tp_hist_get(pool, TP_HIST_QUEUE_WAIT, &h0[0]) != TP_OK ||
        tp_hist_get(pool, TP_HIST_RUN, &h0[1]) != TP_OK)
        return -1;
    double period = capacity > 0 ? 1e9 / (capacity * o->load_pct / 100.0) : 0;
    countdown_arm(&g_done, n);
    t0 = bench_now();
    if (load_submit(pool, 0, n, t0, period, &refusals) != 0 || countdown_wait(&g_done, "load") != 0)
        return -1;
    t1 = bench_now();

    /* the last task's countdown_hit comes before its attempt is recorded:
     * wait for every attempt of the run to be counted */
    for (uint64_t until = bench_now() + BENCH_STALL_NS;;) {
        if (tp_hist_get(pool, TP_HIST_QUEUE_WAIT, &h1[0]) != TP_OK ||
            tp_hist_get(pool, TP_HIST_RUN, &h1[1]) != TP_OK)
            return -1;
        if (h1[1].count - h0[1].count >= n) break;
        if (bench_now() > until) {
            fprintf(stderr, "tp_bench: load: %llu of %lu attempts in the run histogram\n",
                    (unsigned long long)(h1[1].count - h0[1].count), n);
            return -1;
        }
        sched_yield();
    }
    tp_stats s;
    if (end_pool(pool, TP_OK, &s) != 0 ||
        check_clean(&s, (unsigned long long)n + warm + cap_n, refusals, "load") != 0)
        return -1;
    for (int k = 0; k < 2; k++) {
        h1[k].count -= h0[k].count;
        h1[k].sum_ns -= h0[k].sum_ns;
        for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) h1[k].buckets[i] -= h0[k].buckets[i];
    }

    /* g_submit_at becomes the queue waits, g_start_at the run times. */
    for (unsigned long i = 0; i < n; i++) {
        uint64_t wait = g_start_at[i] > g_submit_at[i] ? g_start_at[i] - g_submit_at[i] : 0;
        uint64_t run = g_end_at[i] > g_start_at[i] ? g_end_at[i] - g_start_at[i] : 0;
        g_submit_at[i] = wait;
        g_start_at[i] = run;
    }
    bench_sort(g_submit_at, n);
    bench_sort(g_start_at, n);
    static const bench_ref to_wake = {"limits", "", "wake p50 ns", "x bare condvar wake p50"};
    bench_record(round, "load", "", "capacity tasks/s", capacity, NULL);
    bench_record(round, "load", "", "offered tasks/s", (double)n * 1e9 / (double)(t1 - t0), NULL);
    bench_record(round, "load", "", "wait p50 ns", (double)bench_pct(g_submit_at, n, 50), &to_wake);
    bench_record(round, "load", "", "wait p90 ns", (double)bench_pct(g_submit_at, n, 90), NULL);
    bench_record(round, "load", "", "wait p99 ns", (double)bench_pct(g_submit_at, n, 99), NULL);
    bench_record(round, "load", "", "wait max ns", (double)g_submit_at[n - 1], NULL);
    bench_record(round, "load", "", "run p50 ns", (double)bench_pct(g_start_at, n, 50), NULL);
    bench_record(round, "load", "", "run p99 ns", (double)bench_pct(g_start_at, n, 99), NULL);
    bench_record(round, "load", "", "run max ns", (double)g_start_at[n - 1], NULL);
    bench_record(round, "load", "", "EFULL refusals", (double)refusals, NULL);
    /* The pool's histograms against the bench's own figures. */
    static const char *const hname[2][2] = {{"hist wait p50 ns", "hist wait p99 ns"},
                                            {"hist run p50 ns", "hist run p99 ns"}};
    const uint64_t *own[2] = {g_submit_at, g_start_at};
    static const double q[2] = {0.50, 0.99};
    int agree = 1;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++) {
            uint64_t hv = tp_hist_quantile_ns(&h1[k], q[j]);
            uint64_t bv = bench_pct(own[k], n, q[j] * 100);
            bench_record(round, "load", "", hname[k][j], (double)hv, NULL);
            if (!within_one_bucket(hv, bv)) agree = 0;
        }
    bench_record(round, "load", "", "hist agrees", agree, NULL);
    return 0;
}

/* ------------------------------------------------------------ cancellation */

static atomic_ulong g_cancel_ran;    /* queued tasks that ran: must stay 0 */
static atomic_ulong g_cancel_status; /* on_done with a status other than TP_ECANCELED */

/* Holds a worker until cancelled (tp_cancel or the forced shutdown). */
static int blocker_task(tp_ctx *ctx, void *arg) {
    (void)arg;
    while (tp_ctx_sleep(ctx, 1000 * MS) == 0) {
    }
    return 0;
}

static int queued_task(tp_ctx *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    atomic_fetch_add_explicit(&g_cancel_ran, 1, memory_order_relaxed);
    return 0;
}

static void queued_done(void *arg, int status) {
    (void)arg;
    if (status != TP_ECANCELED) atomic_fetch_add_explicit(&g_cancel_status, 1, memory_order_relaxed);
    countdown_hit(&g_done);
}

/* Fills the queue with --queue tasks whose ids go to g_ids. */
static int fill_queue(tp_pool *pool, const bench_opts *o) {
    tp_task_opts opts = {.on_done = queued_done};
    for (unsigned i = 0; i < o->queue; i++) {
        int rc = tp_submit(pool, queued_task, NULL, &opts, &g_ids[i]);
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: cancel: filling the queue: %s at task %u\n", tp_err_name(rc), i);
            return -1;
        }
    }
    return 0;
}

int scenario_cancel(const bench_opts *o, unsigned round) {
    tp_pool *pool;
    if (make_pool(o, TP_UNLIMITED, &pool) != 0) return -1;
    atomic_store(&g_cancel_ran, 0);
    atomic_store(&g_cancel_status, 0);

    for (unsigned i = 0; i < o->workers; i++) {
        int rc = tp_submit(pool, blocker_task, NULL, NULL, NULL);
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: cancel: blocker: %s\n", tp_err_name(rc));
            return -1;
        }
    }
    if (bench_wait_active(pool, o->workers) != 0) return -1;

    /* tp_cancel of each queued task. */
    countdown_arm(&g_done, o->queue);
    if (fill_queue(pool, o) != 0) return -1;
    uint64_t t0 = bench_now();
    for (unsigned i = 0; i < o->queue; i++) {
        int rc = tp_cancel(pool, g_ids[i]);
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: cancel: tp_cancel of a queued task: %s\n", tp_err_name(rc));
            return -1;
        }
    }
    uint64_t t1 = bench_now();
    if (countdown_wait(&g_done, "cancelled tasks' on_done") != 0) return -1;
    uint64_t t2 = bench_now();

    /* A forced shutdown of the full pool. */
    countdown_arm(&g_done, o->queue);
    if (fill_queue(pool, o) != 0) return -1;
    uint64_t t3 = bench_now();
    int rc = tp_shutdown(pool, FORCED_BUDGET_NS);
    uint64_t t4 = bench_now();
    if (rc != TP_ETIMEDOUT) {
        fprintf(stderr, "tp_bench: cancel: forced tp_shutdown: %s, expected TP_ETIMEDOUT\n", tp_err_name(rc));
        return -1;
    }
    if (countdown_wait(&g_done, "dropped tasks' on_done") != 0) return -1;
    uint64_t t5 = bench_now();

    tp_stats s;
    if (end_pool(pool, TP_ETIMEDOUT, &s) != 0) return -1;
    unsigned long long want = 2ull * o->queue + o->workers;
    if (s.accepted != want || s.completed != want || s.cancelled < 2ull * o->queue ||
        atomic_load(&g_cancel_ran) != 0 || atomic_load(&g_cancel_status) != 0) {
        fprintf(stderr,
                "tp_bench: cancel: accepted %llu, completed %llu, cancelled %llu (expected "
                "%llu, %llu, >= %llu); %lu queued tasks ran, %lu ended other than cancelled\n",
                (unsigned long long)s.accepted, (unsigned long long)s.completed,
                (unsigned long long)s.cancelled, want, want, 2ull * o->queue, atomic_load(&g_cancel_ran),
                atomic_load(&g_cancel_status));
        return -1;
    }

    static const bench_ref to_mutex = {"limits", "", "mutex pair ns", "x mutex pair"};
    double q = (double)o->queue;
    bench_record(round, "cancel", "", "tp_cancel ns", (double)(t1 - t0) / q, &to_mutex);
    bench_record(round, "cancel", "", "cancel->on_done ns/task", (double)(t2 - t0) / q, NULL);
    bench_record(round, "cancel", "", "shutdown(1ms) us", (double)(t4 - t3) / 1e3, NULL);
    uint64_t drop = t5 - t3 > FORCED_BUDGET_NS ? t5 - t3 - FORCED_BUDGET_NS : 0;
    bench_record(round, "cancel", "", "forced drop ns/task", (double)drop / q, NULL);
    return 0;
}

/* ------------------------------------------------------------ fair shares */

#define FAIR_USERS_MAX 10000u
static char g_fair_names[FAIR_USERS_MAX][16];

int scenario_fair(const bench_opts *o, unsigned round) {
    static const unsigned users[3] = {1, 100, FAIR_USERS_MAX};
    for (unsigned i = 0; i < FAIR_USERS_MAX; i++)
        if (!g_fair_names[i][0]) snprintf(g_fair_names[i], sizeof g_fair_names[i], "fair-%u", i);
    for (int v = 0; v < 3; v++) {
        /* one queue size for every U, so that only the users differ */
        unsigned u = users[v], queue = 2 * FAIR_USERS_MAX > o->queue ? 2 * FAIR_USERS_MAX : o->queue;
        tp_config cfg = {
            .workers = o->workers,
            .queue_capacity = queue,
            .max_per_user = TP_UNLIMITED,
            .run_timeout_ns = TP_FOREVER,
            .name = "bench",
            .log = bench_quiet_log,
            .sched = TP_SCHED_FAIR,
        };
        tp_pool *pool;
        int rc = tp_create(&pool, &cfg);
        if (rc != TP_OK) {
            fprintf(stderr, "tp_bench: fair: tp_create: %s\n", tp_strerror(rc));
            return -1;
        }
        g_body = o->body;
        /* warm-up: every user once backlogged (their entries made) */
        unsigned long warm = BENCH_WARMUP_TASKS > 2ul * u ? BENCH_WARMUP_TASKS : 2ul * u;
        unsigned long refusals = 0, n = warm + o->tasks;
        unsigned next = 0;
        uint64_t t0 = 0;
        countdown_arm(&g_done, warm);
        for (unsigned long k = 0; k < n; k++) {
            if (k == warm) {
                if (countdown_wait(&g_done, "fair") != 0) return -1;
                countdown_arm(&g_done, o->tasks);
                t0 = bench_now();
            }
            tp_task_opts opts = {.user = g_fair_names[next]};
            next = next + 1 == u ? 0 : next + 1;
            while ((rc = tp_submit(pool, tput_task, NULL, &opts, NULL)) == TP_EFULL) {
                refusals++;
                sched_yield();
            }
            if (rc != TP_OK) {
                fprintf(stderr, "tp_bench: fair: submit: %s\n", tp_err_name(rc));
                return -1;
            }
        }
        if (countdown_wait(&g_done, "fair") != 0) return -1;
        uint64_t t1 = bench_now();
        tp_stats s;
        if (end_pool(pool, TP_OK, &s) != 0 || check_clean(&s, n, refusals, "fair") != 0) return -1;
        char variant[16];
        snprintf(variant, sizeof variant, "U=%u", u);
        double ns = (double)(t1 - t0) / (double)o->tasks;
        bench_record(round, "fair", variant, "ns/task", ns, NULL);
        double one = bench_value(round, "fair", "U=1", "ns/task");
        if (v > 0 && one > 0) bench_record(round, "fair", variant, "ns/task / U=1", ns / one, NULL);
    }
    return 0;
}
