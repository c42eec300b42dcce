/*
 * bench.h -- what the files of tp_bench share.
 *
 * tp_bench measures what libtaskpool costs on this machine, through the public
 * header only. Files:
 *   main.c       options, the round loop, machine information
 *   limits.c     the machine's own limits: a mutex pair, a one-way condvar
 *                wake, a bare mutex/condvar ring (as the perf harness's limits.c)
 *   scenarios.c  the pool scenarios: throughput (plain, per-user, blocking
 *                submit, batch submit), wake latency, steady load, cancellation
 *   allocs.c     the allocations-per-task scenario, counted by the malloc
 *                interposer it shares with the tests (tests/tpt_alloc_count.h)
 *   report.c     the figures of every round, and their table and JSON output
 *
 * Measurement model. A run is R rounds; each round measures the machine limits
 * and then every selected scenario once, each on a fresh pool, so slow drift
 * on a shared machine hits every figure of a round alike. A scenario records
 * one value per metric per round (bench_record). The report shows, per metric,
 * the median and min-max over rounds, and a ratio to a machine limit measured
 * in the same round (the median of the per-round ratios).
 *
 * Rules the code keeps: nothing is allocated inside a timed region except by
 * the subject measured (every buffer is sized from the options up front); every
 * wait is bounded (a lost task or a stuck pool is reported, never hangs the
 * tool); a scenario checks the pool's own counters after each round.
 */
#ifndef TP_BENCH_H
#define TP_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "taskpool.h"

#define BENCH_MAX_PRODUCERS 64
#define BENCH_MAX_PLIST     8 /* values in --producers=P[,P...] */
#define BENCH_MAX_ROUNDS    100
#define BENCH_MAX_USERS     100000
#define BENCH_MAX_BATCH     4096                    /* --batch */
#define BENCH_WARMUP_TASKS  1000                    /* per pool, before its timed region (as perf's driver) */
#define BENCH_STALL_NS      (30ull * 1000000000ull) /* no progress this long: give up */

/* 1 in a sanitized build: the sanitizer owns malloc, and everything is slower. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define BENCH_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define BENCH_SANITIZED 1
#endif
#endif
#ifndef BENCH_SANITIZED
#define BENCH_SANITIZED 0
#endif

/* ------------------------------------------------------------ options */

/* What a task does. */
enum { BODY_EMPTY = 0, BODY_SPIN = 1, BODY_SLEEP = 2 };
typedef struct bench_body {
    int kind;
    uint64_t ns; /* spin or sleep time; 0 for BODY_EMPTY */
} bench_body;

/* Scenario bits of --scenario. */
enum {
    SC_THROUGHPUT = 1 << 0,
    SC_USERS = 1 << 1,
    SC_SUBMIT_WAIT = 1 << 2,
    SC_WAKE = 1 << 3,
    SC_LOAD = 1 << 4,
    SC_CANCEL = 1 << 5,
    SC_ALLOCS = 1 << 6,
    SC_BATCH = 1 << 7,
    SC_FAIR = 1 << 8,
    SC_ALL = (1 << 9) - 1,
};

typedef struct bench_opts {
    unsigned scenarios; /* SC_* bits */
    unsigned rounds;
    unsigned workers;
    unsigned producers[BENCH_MAX_PLIST];
    unsigned n_producers;
    unsigned queue;
    unsigned long tasks; /* per throughput round */
    unsigned users;      /* distinct users of the per-user scenario */
    unsigned batch;      /* tasks per tp_submit_batch call of the batch scenario */
    bench_body body;     /* body of the throughput tasks */
    unsigned samples;    /* wake-latency samples per round */
    uint64_t gap_ns;     /* idle time before each wake sample */
    unsigned load_pct;   /* steady load, percent of measured capacity */
    unsigned long load_tasks;
    bench_body load_body;
    unsigned long alloc_tasks;
    int json;
} bench_opts;

/* ------------------------------------------------------------ clock */

/* CLOCK_MONOTONIC, like tp_now_ns(); read the same way for pool and limits. */
static inline uint64_t bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void bench_sleep_ns(uint64_t ns);
/* Spins (no syscall) until the clock reaches `deadline`. */
void bench_spin_until(uint64_t deadline);

/* ------------------------------------------------------------ countdown */

/* Tasks still to end in a run. Each task takes one; the one that reaches zero
 * wakes the waiter. Arm only while no task that counts on it is pending. */
typedef struct bench_countdown {
    atomic_ulong left;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int reached; /* under mu */
} bench_countdown;

void countdown_init(bench_countdown *c);
void countdown_destroy(bench_countdown *c);
void countdown_arm(bench_countdown *c, unsigned long n);
void countdown_hit(bench_countdown *c);
/* Waits for zero. 0, or -1 (with a message naming `what`) after no progress
 * for BENCH_STALL_NS. */
int countdown_wait(bench_countdown *c, const char *what);

/* ------------------------------------------------------------ figures */

/* Reference of a ratio: which machine limit (or other figure) a metric is
 * divided by. The reference is looked up by scenario/variant/name. */
typedef struct bench_ref {
    const char *scenario, *variant, *name;
    const char *label; /* shown in the table's "vs" column */
} bench_ref;

/* Records `value` for round `round` of the metric (created on first use, in
 * first-use order, which is the table's order). The name carries the unit
 * ("ns/task", "p50 ns"). `ref` may be NULL. Never allocates. */
void bench_record(unsigned round, const char *scenario, const char *variant, const char *name, double value,
                  const bench_ref *ref);
/* Marks a metric "n/a" (e.g. allocations under a sanitizer), with a reason. */
void bench_record_na(const char *scenario, const char *variant, const char *name, const char *why);
/* The value of a metric in a round, or -1 if not recorded. */
double bench_value(unsigned round, const char *scenario, const char *variant, const char *name);

void report_table(const bench_opts *o);
/* `ok`: whether every scenario succeeded (the JSON "ok" member). */
void report_json(const bench_opts *o, int ok);

/* Names of the SC_* bits, bit i -> name i. */
extern const char *const bench_scenario_names[];
#define BENCH_N_SCENARIOS 9

/* ------------------------------------------------------------ machine facts */

typedef struct bench_machine {
    long nproc;
    char kernel[208];
    char compiler[96];
    const char *build; /* "optimized, no assertions", "sanitized: thread", ... */
    const char *lib_version;
} bench_machine;
extern bench_machine g_machine;
void describe_body(const bench_body *b, char *buf, unsigned len);

/* ------------------------------------------------------------ measurements */

/* Each returns 0, or -1 after printing what went wrong. */
int limits_round(const bench_opts *o, unsigned round);
int scenario_throughput(const bench_opts *o, unsigned round, int kind, unsigned producers);
int scenario_wake(const bench_opts *o, unsigned round);
int scenario_load(const bench_opts *o, unsigned round);
int scenario_cancel(const bench_opts *o, unsigned round);
int scenario_allocs(const bench_opts *o, unsigned round);
int scenario_fair(const bench_opts *o, unsigned round);

/* Buffers sized from the options, made once before the first round. */
int scenarios_setup(const bench_opts *o);
void scenarios_teardown(void);
int limits_setup(const bench_opts *o);
void limits_teardown(void);

/* Shared task helpers (scenarios.c), used by allocs.c too. */
int bench_run_body(tp_ctx *ctx, const bench_body *b);
/* The log hook of every bench pool: failures are counted, never printed mid-table. */
void bench_quiet_log(void *arg, int level, const char *log_id, const char *msg);
/* Percentile (0 < p <= 100) of sorted values, nearest rank. */
uint64_t bench_pct(const uint64_t *sorted, unsigned long n, double p);
void bench_sort(uint64_t *v, unsigned long n);
/* Polls tp_stats until `active` reaches `n`; 0 or -1 after 10 s. */
int bench_wait_active(tp_pool *p, unsigned n);

/* Kinds of scenario_throughput. */
enum { TPUT_PLAIN = 0, TPUT_USERS = 1, TPUT_WAIT = 2, TPUT_BATCH = 3 };

#endif /* TP_BENCH_H */
