/*
 * tp_bench.c -- throughput of libtaskpool's admission path.
 *
 * Scenario: P producer threads submit N empty tasks in total with tp_submit()
 * to a pool of W workers and a queue of Q; a producer that gets TP_EFULL
 * yields (sched_yield) and retries. A round's wall time runs from releasing the
 * producers until the last task has run. Repeated R rounds on one pool after a
 * short warm-up; prints each round, then the median and min-max.
 *
 * Uses only the public header. Exit status: 0, 1 on an unexpected error (any
 * submit result other than TP_OK/TP_EFULL, a lost task, a statistics mismatch),
 * 2 on a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskpool.h"

#define MAX_PRODUCERS 64
#define MAX_ROUNDS    1000
#define WARMUP_TASKS  1000

typedef struct options {
    unsigned workers, producers, queue, rounds;
    unsigned long tasks;
} options;

/* ------------------------------------------------------------ completion */

/* Tasks still to run in this round. Each task decrements it once; the one that
 * takes it to zero wakes main. Tasks keep no other shared state, so a task of
 * the previous round still finishing cannot confuse the next one. relaxed:
 * the hand-over to main goes through g_mu. */
static atomic_ulong g_left;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_reached;

#define STALL_SECONDS 30 /* no task finished for this long: report, don't hang */

static int empty_task(tp_ctx *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    if (atomic_fetch_sub_explicit(&g_left, 1, memory_order_relaxed) == 1) {
        pthread_mutex_lock(&g_mu);
        g_reached = 1;
        pthread_cond_signal(&g_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return 0;
}

/* Called while no task of this pool is pending. */
static void arm(unsigned long tasks) {
    pthread_mutex_lock(&g_mu);
    atomic_store_explicit(&g_left, tasks, memory_order_relaxed);
    g_reached = 0;
    pthread_mutex_unlock(&g_mu);
}

/* Waits until every task of the round has run. Returns 0, or -1 when no task
 * finished for STALL_SECONDS (a lost task or a stuck pool). */
static int wait_reached(void) {
    int rc = 0, stalled = 0;
    unsigned long last = atomic_load_explicit(&g_left, memory_order_relaxed);
    pthread_mutex_lock(&g_mu);
    while (!g_reached) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&g_cv, &g_mu, &ts) != ETIMEDOUT)
            continue;
        unsigned long now = atomic_load_explicit(&g_left, memory_order_relaxed);
        stalled = now == last ? stalled + 1 : 0;
        last = now;
        if (stalled >= STALL_SECONDS) {
            fprintf(stderr, "tp_bench: %lu tasks never ran (none finished for %d s)\n", now,
                    STALL_SECONDS);
            rc = -1;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ------------------------------------------------------------ producers */

typedef struct producer {
    pthread_t thread;
    tp_pool *pool;
    pthread_barrier_t *start;
    unsigned long count;     /* tasks to submit */
    unsigned long submitted; /* accepted */
    unsigned long refusals;  /* TP_EFULL results */
    int error;               /* first unexpected result, 0 if none */
} producer;

/* Submits `count` tasks, retrying on TP_EFULL. Returns 0 or the unexpected code. */
static int submit_all(tp_pool *pool, unsigned long count, unsigned long *submitted,
                      unsigned long *refusals) {
    for (unsigned long i = 0; i < count; i++) {
        int rc;
        while ((rc = tp_submit(pool, empty_task, NULL, NULL, NULL)) == TP_EFULL) {
            (*refusals)++;
            sched_yield();
        }
        if (rc != TP_OK)
            return rc;
        (*submitted)++;
    }
    return 0;
}

static void *producer_main(void *arg) {
    producer *pr = arg;
    pthread_barrier_wait(pr->start);
    pr->error = submit_all(pr->pool, pr->count, &pr->submitted, &pr->refusals);
    return NULL;
}

/* ------------------------------------------------------------ rounds */

typedef struct round_result {
    uint64_t wall_ns;
    unsigned long refusals;
} round_result;

/* One round. Returns 0, or -1 after printing what went wrong. */
static int run_round(tp_pool *pool, const options *o, round_result *out) {
    producer pr[MAX_PRODUCERS];
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, o->producers + 1) != 0) {
        fprintf(stderr, "tp_bench: pthread_barrier_init failed\n");
        return -1;
    }
    arm(o->tasks);

    unsigned started = 0;
    int failed = 0;
    for (unsigned i = 0; i < o->producers; i++) {
        pr[i] = (producer){
            .pool = pool,
            .start = &start,
            .count = o->tasks / o->producers + (i < o->tasks % o->producers ? 1 : 0),
        };
        if (pthread_create(&pr[i].thread, NULL, producer_main, &pr[i]) != 0) {
            fprintf(stderr, "tp_bench: pthread_create failed\n");
            failed = 1;
            break;
        }
        started++;
    }
    if (failed) {
        /* Release the ones already started with zero work each. */
        for (unsigned i = 0; i < started; i++)
            pr[i].count = 0;
        for (unsigned i = started; i < o->producers; i++)
            pthread_barrier_wait(&start); /* stand in for the missing ones */
        for (unsigned i = 0; i < started; i++)
            pthread_join(pr[i].thread, NULL);
        pthread_barrier_destroy(&start);
        return -1;
    }

    pthread_barrier_wait(&start);
    uint64_t t0 = tp_now_ns();
    unsigned long submitted = 0, refusals = 0;
    for (unsigned i = 0; i < o->producers; i++) {
        pthread_join(pr[i].thread, NULL);
        submitted += pr[i].submitted;
        refusals += pr[i].refusals;
        if (pr[i].error != 0) {
            fprintf(stderr, "tp_bench: tp_submit: %s (%s)\n", tp_err_name(pr[i].error),
                    tp_strerror(pr[i].error));
            failed = 1;
        }
    }
    pthread_barrier_destroy(&start);
    if (failed)
        return -1; /* main shuts the pool down, which runs what was accepted */
    if (wait_reached() != 0)
        return -1;
    uint64_t t1 = tp_now_ns();
    if (submitted != o->tasks) {
        fprintf(stderr, "tp_bench: submitted %lu tasks, expected %lu\n", submitted, o->tasks);
        return -1;
    }
    out->wall_ns = t1 - t0;
    out->refusals = refusals;
    return 0;
}

/* ------------------------------------------------------------ report */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_ulong(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    return (x > y) - (x < y);
}

/* Median of sorted values: the mean of the middle two for an even count. */
static double median_u64(const uint64_t *v, unsigned n) {
    return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2.0;
}

static double median_ulong(const unsigned long *v, unsigned n) {
    return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2.0;
}

#define ROW_HEAD "%-8s %12s %12s %14s %16s\n"
#define ROW_FMT  "%-8s %12.1f %12.1f %14.0f %16.0f\n"

static void print_row(const char *label, double wall_ns, double tasks, double refusals) {
    printf(ROW_FMT, label, wall_ns / 1e6, wall_ns / tasks, tasks * 1e9 / wall_ns, refusals);
}

/* Median, then min and max of each column on its own (the fastest round has
 * the smallest ns/task and the largest tasks/s). */
static void report(const options *o, const round_result *r) {
    uint64_t wall[MAX_ROUNDS];
    unsigned long ref[MAX_ROUNDS];
    unsigned n = o->rounds;
    for (unsigned i = 0; i < n; i++) {
        wall[i] = r[i].wall_ns;
        ref[i] = r[i].refusals;
    }
    qsort(wall, n, sizeof wall[0], cmp_u64);
    qsort(ref, n, sizeof ref[0], cmp_ulong);
    double tasks = (double)o->tasks;
    double lo = (double)wall[0], hi = (double)wall[n - 1];

    printf("\n");
    print_row("median", median_u64(wall, n), tasks, median_ulong(ref, n));
    printf(ROW_FMT, "min", lo / 1e6, lo / tasks, tasks * 1e9 / hi, (double)ref[0]);
    printf(ROW_FMT, "max", hi / 1e6, hi / tasks, tasks * 1e9 / lo, (double)ref[n - 1]);
}

/* ------------------------------------------------------------ options */

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [options]\n"
            "Throughput: P producers submit N empty tasks in total with tp_submit(),\n"
            "retrying with sched_yield() on TP_EFULL; repeated R rounds.\n"
            "  --workers W     worker threads (default 2)\n"
            "  --producers P   producer threads, 1..%d (default 1)\n"
            "  --tasks N       tasks per round (default 1000000)\n"
            "  --queue Q       queue capacity (default 1024)\n"
            "  --rounds R      rounds, 1..%d (default 5)\n"
            "  --help          this text\n",
            prog, MAX_PRODUCERS, MAX_ROUNDS);
}

/* Parses a decimal in [min, max]; returns 0 or -1. */
static int parse_num(const char *s, unsigned long min, unsigned long max, unsigned long *out) {
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.workers = 2, .producers = 1, .tasks = 1000000, .queue = 1024, .rounds = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout, argv[0]);
            exit(0);
        }
        /* "--name value" or "--name=value" */
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        static const struct {
            const char *name;
            unsigned long min, max;
        } opt[] = {
            {"--workers", 1, TP_MAX_WORKERS},
            {"--producers", 1, MAX_PRODUCERS},
            {"--tasks", 1, ULONG_MAX / 2},
            {"--queue", 1, TP_MAX_QUEUE_CAPACITY},
            {"--rounds", 1, MAX_ROUNDS},
        };
        size_t k = 0;
        while (k < sizeof opt / sizeof opt[0] &&
               !(strlen(opt[k].name) == len && strncmp(opt[k].name, a, len) == 0))
            k++;
        if (k == sizeof opt / sizeof opt[0]) {
            fprintf(stderr, "%s: unknown option '%s'\n", argv[0], a);
            return -1;
        }
        val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        unsigned long v;
        if (parse_num(val, opt[k].min, opt[k].max, &v) != 0) {
            fprintf(stderr, "%s: %s needs a number in %lu..%lu\n", argv[0], opt[k].name, opt[k].min,
                    opt[k].max);
            return -1;
        }
        switch (k) {
        case 0: o->workers = (unsigned)v; break;
        case 1: o->producers = (unsigned)v; break;
        case 2: o->tasks = v; break;
        case 3: o->queue = (unsigned)v; break;
        default: o->rounds = (unsigned)v; break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) {
        usage(stderr, argv[0]);
        return 2;
    }

    tp_config cfg = {
        .workers = o.workers,
        .queue_capacity = o.queue,
        .max_per_user = TP_UNLIMITED,
        .name = "bench",
    };
    tp_pool *pool = NULL;
    int rc = tp_create(&pool, &cfg);
    if (rc != TP_OK) {
        fprintf(stderr, "tp_bench: tp_create: %s\n", tp_strerror(rc));
        return 1;
    }

    printf("tp_bench: libtaskpool %s, throughput of empty tasks\n", tp_version());
    printf("workers %u, producers %u, queue %u, %lu tasks per round, %u rounds\n\n", o.workers,
           o.producers, o.queue, o.tasks, o.rounds);

    int failed = 0;
    unsigned long warm_refusals = 0, warm_submitted = 0;
    arm(WARMUP_TASKS);
    rc = submit_all(pool, WARMUP_TASKS, &warm_submitted, &warm_refusals);
    if (rc != 0) {
        fprintf(stderr, "tp_bench: warm-up tp_submit: %s\n", tp_strerror(rc));
        failed = 1;
    } else if (wait_reached() != 0) {
        failed = 1;
    }

    round_result res[MAX_ROUNDS];
    unsigned long total_refusals = warm_refusals;
    unsigned long long total_tasks = warm_submitted;
    printf(ROW_HEAD, "round", "wall ms", "ns/task", "tasks/s", "EFULL refusals");
    for (unsigned r = 0; r < o.rounds && !failed; r++) {
        if (run_round(pool, &o, &res[r]) != 0) {
            failed = 1;
            break;
        }
        total_refusals += res[r].refusals;
        total_tasks += o.tasks;
        char label[16];
        snprintf(label, sizeof label, "%u", r + 1);
        print_row(label, (double)res[r].wall_ns, (double)o.tasks, (double)res[r].refusals);
        fflush(stdout);
    }
    if (!failed)
        report(&o, res);

    /* Empty tasks drain at once; a bound keeps a broken pool from hanging us. */
    rc = tp_shutdown(pool, 60ull * 1000000000ull);
    if (rc != TP_OK) {
        fprintf(stderr, "tp_bench: tp_shutdown: %s\n", tp_strerror(rc));
        return 1; /* tp_destroy() would wait for whatever is stuck */
    }
    /* The pool's own counters must agree with what the producers saw. */
    tp_stats s;
    tp_stats_get(pool, &s);
    if (!failed && (s.accepted != total_tasks || s.succeeded != total_tasks ||
                    s.completed != total_tasks || s.rejected_full != total_refusals ||
                    s.rejected != total_refusals)) {
        fprintf(stderr,
                "tp_bench: statistics disagree: accepted %" PRIu64 ", completed %" PRIu64
                ", succeeded %" PRIu64 ", rejected %" PRIu64 ", rejected_full %" PRIu64
                "; expected %llu tasks and %lu refusals\n",
                s.accepted, s.completed, s.succeeded, s.rejected, s.rejected_full, total_tasks,
                total_refusals);
        failed = 1;
    }
    rc = tp_destroy(pool);
    if (rc != TP_OK) {
        fprintf(stderr, "tp_bench: tp_destroy: %s\n", tp_strerror(rc));
        failed = 1;
    }
    return failed;
}
