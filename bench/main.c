/*
 * main.c -- tp_bench: what libtaskpool costs on this machine.
 *
 * Parses the options (every value validated: a bad one is a clear message and
 * exit status 2), makes every buffer the run needs, then runs R rounds. Each
 * round measures the machine's limits and then each selected scenario once
 * (see bench.h for the model, limits.c and scenarios.c for the methods).
 * Prints a table, or with --json the same figures as one JSON object.
 *
 * Exit status: 0; 1 when a scenario failed (a lost task, a counter that
 * disagrees, an unexpected result, an allocation in steady state) -- the
 * figures gathered so far are still printed; 2 on a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench.h"

bench_machine g_machine;

/* ------------------------------------------------------------ help */

static void usage(FILE *f) {
    fprintf(f,
            "usage: tp_bench [options]\n"
            "\n"
            "Measures what libtaskpool costs on this machine, next to the machine's own\n"
            "limits measured in the same process (an uncontended mutex lock/unlock pair,\n"
            "a one-way condition-variable wake, a bare mutex/condvar ring handing items\n"
            "from one thread to another, and to --workers threads), and prints the\n"
            "pool's figures also as ratios to them so that results from different\n"
            "machines compare. Every scenario runs once per round on a fresh pool; the\n"
            "table shows the median and the min-max over the rounds. Defaults finish in\n"
            "well under a minute.\n"
            "\n"
            "Scenarios (--scenario, default all):\n"
            "  throughput   P producers submit N tasks with tp_submit(), retrying with\n"
            "               sched_yield() on TP_EFULL: ns/task, tasks/s, refusals\n"
            "  users        the same with per-user accounting (tasks spread over U users)\n"
            "  submit_wait  the same with the blocking tp_submit_wait()\n"
            "  wake         one task at a time into an idle pool: submit-to-start\n"
            "               latency p50/p90/p99/max\n"
            "  load         a producer paced at a share of the measured capacity: queue\n"
            "               wait (submit->start) and run time (start->end) percentiles\n"
            "  cancel       tp_cancel() of queued tasks (ns each), and a forced shutdown\n"
            "               of a full pool (1 ms budget)\n"
            "  allocs       heap allocations per task in steady state (must be 0;\n"
            "               n/a under sanitizers), in a FIFO pool and in a fair pool\n"
            "               with every priority lane in use\n"
            "  batch        the throughput scenario with tp_submit_batch(): each producer\n"
            "               hands in B tasks per call, and on TP_EFULL retries the rest\n"
            "               after sched_yield(): ns/task, also as a ratio to the single\n"
            "               tp_submit() of the same round\n"
            "  fair         one producer into a fair pool (TP_SCHED_FAIR) of 20000\n"
            "               places, naming U = 1, 100 and 10000 users in turn, all\n"
            "               backlogged: ns/task, and as a ratio to U = 1 (the cost of a\n"
            "               start must not grow with the users)\n"
            "\n"
            "Options (--name=value or --name value):\n"
            "  --scenario=NAME[,NAME...]  scenarios to run (default: all)\n"
            "  --rounds=R           rounds, 1..%d (default 5)\n"
            "  --workers=W          worker threads, 1..%u (default 2)\n"
            "  --producers=P[,P...] producer threads of the throughput scenarios, each\n"
            "                       1..%d; each value is a separate variant (default 1,2)\n"
            "  --queue=Q            queue capacity, 1..%u (default 1024); also the size\n"
            "                       of the bare ring and the number of tasks cancelled\n"
            "  --tasks=N            tasks per throughput round, 1..1000000000 (default\n"
            "                       1000000); also the items of the bare ring\n"
            "  --users=U            distinct users of the users scenario, 1..%d\n"
            "                       (default 64)\n"
            "  --batch=B            tasks per tp_submit_batch() call of the batch\n"
            "                       scenario, 1..%d (default 64)\n"
            "  --body=BODY          what a throughput task does: empty, spin:DURATION\n"
            "                       (busy loop) or sleep:DURATION (tp_ctx_sleep)\n"
            "                       (default empty)\n"
            "  --samples=S          wake-latency samples per round, also of the bare\n"
            "                       condvar wake, 1..1000000 (default 1000)\n"
            "  --gap=DURATION       idle time before each wake sample (default 200us)\n"
            "  --load=PCT           steady load, percent of measured capacity, 1..100\n"
            "                       (default 70)\n"
            "  --load-tasks=N       tasks of the paced load run, 1..10000000 (default\n"
            "                       10000)\n"
            "  --load-body=BODY     body of the load tasks (default spin:50us)\n"
            "  --alloc-tasks=N      tasks counted by allocs, 1..100000000 (default 20000)\n"
            "  --json               print the figures as one JSON object instead of a table\n"
            "  --help, -h           this text\n"
            "\n"
            "DURATION: a whole number with a unit ns, us, ms or s (no unit: ns), up to 10 s.\n"
            "Exit status: 0; 1 if a scenario failed (a lost task, counters that disagree,\n"
            "an allocation in steady state); 2 on a usage error.\n",
            BENCH_MAX_ROUNDS, TP_MAX_WORKERS, BENCH_MAX_PRODUCERS, TP_MAX_QUEUE_CAPACITY, BENCH_MAX_USERS,
            BENCH_MAX_BATCH);
}

/* ------------------------------------------------------------ parsing */

static int parse_ulong(const char *s, unsigned long min, unsigned long max, unsigned long *out) {
    if (s == NULL || *s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) return -1;
    *out = v;
    return 0;
}

#define MAX_DURATION_NS (10ull * 1000000000ull)

/* "250", "250ns", "20us", "5ms", "1s" -> ns in 1..10 s. */
static int parse_duration(const char *s, uint64_t *out) {
    if (s == NULL || *s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) return -1;
    uint64_t scale;
    if (*end == '\0' || strcmp(end, "ns") == 0)
        scale = 1;
    else if (strcmp(end, "us") == 0)
        scale = 1000;
    else if (strcmp(end, "ms") == 0)
        scale = 1000000;
    else if (strcmp(end, "s") == 0)
        scale = 1000000000;
    else
        return -1;
    if (v == 0 || v > MAX_DURATION_NS / scale) return -1;
    *out = v * scale;
    return 0;
}

static int parse_body(const char *s, bench_body *b) {
    if (s == NULL) return -1;
    if (strcmp(s, "empty") == 0) {
        *b = (bench_body){BODY_EMPTY, 0};
        return 0;
    }
    if (strncmp(s, "spin:", 5) == 0) {
        b->kind = BODY_SPIN;
        return parse_duration(s + 5, &b->ns);
    }
    if (strncmp(s, "sleep:", 6) == 0) {
        b->kind = BODY_SLEEP;
        return parse_duration(s + 6, &b->ns);
    }
    return -1;
}

void describe_body(const bench_body *b, char *buf, unsigned len) {
    static const char *const kinds[] = {"empty", "spin", "sleep"};
    if (b->kind == BODY_EMPTY)
        snprintf(buf, len, "empty");
    else if (b->ns % 1000000 == 0)
        snprintf(buf, len, "%s:%llums", kinds[b->kind], (unsigned long long)(b->ns / 1000000));
    else if (b->ns % 1000 == 0)
        snprintf(buf, len, "%s:%lluus", kinds[b->kind], (unsigned long long)(b->ns / 1000));
    else
        snprintf(buf, len, "%s:%lluns", kinds[b->kind], (unsigned long long)b->ns);
}

const char *const bench_scenario_names[BENCH_N_SCENARIOS] = {
    "throughput", "users", "submit_wait", "wake", "load", "cancel", "allocs", "batch", "fair"};
#define g_scenarios bench_scenario_names
#define N_SCENARIOS BENCH_N_SCENARIOS

/* "a,b,c": each must be a scenario name. */
static int parse_scenarios(const char *s, unsigned *bits) {
    if (s == NULL || *s == '\0') return -1;
    *bits = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        unsigned i = 0;
        while (i < N_SCENARIOS && !(strlen(g_scenarios[i]) == len && strncmp(g_scenarios[i], s, len) == 0))
            i++;
        if (i == N_SCENARIOS) {
            if (len == 3 && strncmp(s, "all", 3) == 0)
                *bits |= SC_ALL;
            else
                return -1;
        } else {
            *bits |= 1u << i;
        }
        s += len;
        if (*s == ',' && *++s == '\0') return -1; /* trailing comma */
    }
    return 0;
}

static int parse_plist(const char *s, bench_opts *o) {
    if (s == NULL || *s == '\0') return -1;
    o->n_producers = 0;
    char buf[128];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        unsigned long v;
        if (o->n_producers == BENCH_MAX_PLIST || parse_ulong(tok, 1, BENCH_MAX_PRODUCERS, &v) != 0) return -1;
        o->producers[o->n_producers++] = (unsigned)v;
    }
    size_t n = strlen(s);
    return o->n_producers > 0 && s[0] != ',' && s[n - 1] != ',' && !strstr(s, ",,") ? 0 : -1;
}

enum { OPT_FLAG, OPT_NUM, OPT_BODY, OPT_DURATION, OPT_PLIST, OPT_SCENARIO };

typedef struct opt_def {
    const char *name;
    int type;
    unsigned long min, max; /* OPT_NUM */
    const char *want;       /* for the error message */
} opt_def;

static const opt_def g_opts[] = {
    {"--json", OPT_FLAG, 0, 0, ""},
    {"--scenario", OPT_SCENARIO, 0, 0,
     "a comma-separated list of: throughput, users, submit_wait, wake, load, cancel, allocs, batch, all"},
    {"--rounds", OPT_NUM, 1, BENCH_MAX_ROUNDS, NULL},
    {"--workers", OPT_NUM, 1, TP_MAX_WORKERS, NULL},
    {"--producers", OPT_PLIST, 0, 0, "a comma-separated list of at most 8 numbers in 1..64"},
    {"--queue", OPT_NUM, 1, TP_MAX_QUEUE_CAPACITY, NULL},
    {"--tasks", OPT_NUM, 1, 1000000000ul, NULL},
    {"--users", OPT_NUM, 1, BENCH_MAX_USERS, NULL},
    {"--batch", OPT_NUM, 1, BENCH_MAX_BATCH, NULL},
    {"--body", OPT_BODY, 0, 0, "empty, spin:DURATION or sleep:DURATION (e.g. spin:2us)"},
    {"--samples", OPT_NUM, 1, 1000000, NULL},
    {"--gap", OPT_DURATION, 0, 0, "a duration such as 200us (1ns..10s)"},
    {"--load", OPT_NUM, 1, 100, NULL},
    {"--load-tasks", OPT_NUM, 1, 10000000, NULL},
    {"--load-body", OPT_BODY, 0, 0, "empty, spin:DURATION or sleep:DURATION (e.g. spin:50us)"},
    {"--alloc-tasks", OPT_NUM, 1, 100000000, NULL},
};
#define N_OPTS (sizeof g_opts / sizeof g_opts[0])

static void set_num(bench_opts *o, const char *name, unsigned long v) {
    if (!strcmp(name, "--rounds"))
        o->rounds = (unsigned)v;
    else if (!strcmp(name, "--workers"))
        o->workers = (unsigned)v;
    else if (!strcmp(name, "--queue"))
        o->queue = (unsigned)v;
    else if (!strcmp(name, "--tasks"))
        o->tasks = v;
    else if (!strcmp(name, "--users"))
        o->users = (unsigned)v;
    else if (!strcmp(name, "--batch"))
        o->batch = (unsigned)v;
    else if (!strcmp(name, "--samples"))
        o->samples = (unsigned)v;
    else if (!strcmp(name, "--load"))
        o->load_pct = (unsigned)v;
    else if (!strcmp(name, "--load-tasks"))
        o->load_tasks = v;
    else if (!strcmp(name, "--alloc-tasks"))
        o->alloc_tasks = v;
}

/* 0, 1 for --help, -1 after printing the error. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){
        .scenarios = SC_ALL,
        .rounds = 5,
        .workers = 2,
        .producers = {1, 2},
        .n_producers = 2,
        .queue = 1024,
        .tasks = 1000000,
        .users = 64,
        .batch = 64,
        .body = {BODY_EMPTY, 0},
        .samples = 1000,
        .gap_ns = 200000,
        .load_pct = 70,
        .load_tasks = 10000,
        .load_body = {BODY_SPIN, 50000},
        .alloc_tasks = 20000,
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const opt_def *d = NULL;
        for (size_t k = 0; k < N_OPTS; k++)
            if (strlen(g_opts[k].name) == len && !strncmp(g_opts[k].name, a, len)) d = &g_opts[k];
        if (d == NULL) {
            fprintf(stderr, "tp_bench: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (d->type == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "tp_bench: %s takes no value\n", d->name);
                return -1;
            }
            o->json = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        int bad;
        unsigned long v = 0;
        switch (d->type) {
        case OPT_NUM: bad = parse_ulong(val, d->min, d->max, &v); break;
        case OPT_BODY: bad = parse_body(val, !strcmp(d->name, "--body") ? &o->body : &o->load_body); break;
        case OPT_DURATION: bad = parse_duration(val, &o->gap_ns); break;
        case OPT_PLIST: bad = parse_plist(val, o); break;
        default: bad = parse_scenarios(val, &o->scenarios); break;
        }
        if (bad) {
            if (d->type == OPT_NUM)
                fprintf(stderr, "tp_bench: %s needs a whole number in %lu..%lu, not '%s'\n", d->name, d->min,
                        d->max, val ? val : "");
            else
                fprintf(stderr, "tp_bench: %s needs %s, not '%s'\n", d->name, d->want, val ? val : "");
            return -1;
        }
        if (d->type == OPT_NUM) set_num(o, d->name, v);
    }
    return 0;
}

/* ------------------------------------------------------------ machine */

static void describe_machine(void) {
    g_machine.nproc = sysconf(_SC_NPROCESSORS_ONLN);
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(g_machine.kernel, sizeof g_machine.kernel, "%s %s %s", u.sysname, u.release, u.machine);
    else
        snprintf(g_machine.kernel, sizeof g_machine.kernel, "unknown kernel");
#if defined(__clang__)
    snprintf(g_machine.compiler, sizeof g_machine.compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
    snprintf(g_machine.compiler, sizeof g_machine.compiler, "gcc %s", __VERSION__);
#else
    snprintf(g_machine.compiler, sizeof g_machine.compiler, "unknown compiler");
#endif
#if defined(__SANITIZE_THREAD__)
    g_machine.build = "sanitized (thread): figures not representative";
#elif BENCH_SANITIZED
    g_machine.build = "sanitized: figures not representative";
#elif !defined(__OPTIMIZE__)
    g_machine.build = "not optimized (-O0): figures not representative";
#elif defined(NDEBUG)
    g_machine.build = "optimized, assertions off";
#else
    g_machine.build = "optimized, assertions on";
#endif
    size_t n = strlen(g_machine.compiler); /* clang's version ends in a space */
    while (n > 0 && g_machine.compiler[n - 1] == ' ') g_machine.compiler[--n] = '\0';
    g_machine.lib_version = tp_version();
}

/* ------------------------------------------------------------ rounds */

static void progress(const char *what, unsigned round, unsigned rounds) {
    static int tty = -1;
    if (tty < 0) tty = isatty(STDERR_FILENO);
    if (tty) {
        fprintf(stderr, "\rtp_bench: round %u/%u: %-24s", round + 1, rounds, what);
        fflush(stderr);
    }
}

/* Runs one round; 0, 1 (a figure broke a promise, go on) or -1 (stop). */
static int run_round(const bench_opts *o, unsigned r) {
    static const struct {
        unsigned bit;
        int kind;
        const char *name;
    } tput[] = {{SC_THROUGHPUT, TPUT_PLAIN, "throughput"},
                {SC_USERS, TPUT_USERS, "users"},
                {SC_SUBMIT_WAIT, TPUT_WAIT, "submit_wait"},
                {SC_BATCH, TPUT_BATCH, "batch"}};
    static const struct {
        unsigned bit;
        const char *name;
        int (*fn)(const bench_opts *, unsigned);
    } other[] = {
        {SC_WAKE, "wake", scenario_wake},       {SC_LOAD, "load", scenario_load},
        {SC_CANCEL, "cancel", scenario_cancel}, {SC_ALLOCS, "allocs", scenario_allocs},
        {SC_FAIR, "fair", scenario_fair},
    };
    int status = 0;
    progress("machine limits", r, o->rounds);
    if (limits_round(o, r) != 0) return -1;
    for (size_t k = 0; k < sizeof tput / sizeof tput[0]; k++) {
        if (!(o->scenarios & tput[k].bit)) continue;
        for (unsigned i = 0; i < o->n_producers; i++) {
            progress(tput[k].name, r, o->rounds);
            if (scenario_throughput(o, r, tput[k].kind, o->producers[i]) != 0) return -1;
        }
    }
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
        if (!(o->scenarios & other[k].bit)) continue;
        progress(other[k].name, r, o->rounds);
        int rc = other[k].fn(o, r);
        if (rc < 0) return -1;
        if (rc > 0) status = 1;
    }
    return status;
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc > 0) {
        usage(stdout);
        return 0;
    }
    if (rc < 0) return 2;

    describe_machine();
    if (limits_setup(&o) != 0 || scenarios_setup(&o) != 0) return 1;

    int failed = 0;
    for (unsigned r = 0; r < o.rounds; r++) {
        rc = run_round(&o, r);
        if (rc != 0) failed = 1;
        if (rc < 0) break;
    }
    progress("done", o.rounds - 1, o.rounds);
    if (isatty(STDERR_FILENO)) fprintf(stderr, "\r%60s\r", "");

    if (o.json)
        report_json(&o, !failed);
    else
        report_table(&o);
    if (failed) fprintf(stderr, "tp_bench: FAILED (see the messages above)\n");
    limits_teardown();
    scenarios_teardown();
    return failed;
}
