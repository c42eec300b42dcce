/*
 * report.c -- the figures of every round, and their table and JSON output.
 *
 * A metric is (scenario, variant, name), e.g. ("throughput", "P=2",
 * "ns/task"); the name carries its unit. Metrics live in a fixed table filled
 * in first-use order, which is also the order of the report, so the output
 * follows the order the scenarios ran in. Recording never allocates: it may
 * be called right after a timed region without disturbing the next one.
 *
 * Summary of a metric over the rounds: median (mean of the middle two for an
 * even count), min and max. Its ratio, when it has a reference, is computed
 * per round against the reference measured in that same round, and the
 * summary of those per-round ratios is reported: on a shared, noisy machine a
 * slow round slows the pool and its reference alike, so the ratio is steadier
 * than either figure.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_METRICS 160

typedef struct metric {
    const char *scenario, *name; /* static strings */
    char variant[24];
    double v[BENCH_MAX_ROUNDS];
    unsigned char have[BENCH_MAX_ROUNDS];
    int has_ref;
    bench_ref ref;
    const char *na; /* reason when not available, else NULL */
} metric;

static metric g_metrics[MAX_METRICS];
static unsigned g_n_metrics;

static int same(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static metric *find(const char *scenario, const char *variant, const char *name) {
    for (unsigned i = 0; i < g_n_metrics; i++) {
        metric *m = &g_metrics[i];
        if (same(m->scenario, scenario) && same(m->variant, variant) && same(m->name, name)) return m;
    }
    return NULL;
}

static metric *find_or_add(const char *scenario, const char *variant, const char *name) {
    metric *m = find(scenario, variant, name);
    if (m != NULL) return m;
    if (g_n_metrics == MAX_METRICS) {
        fprintf(stderr, "tp_bench: too many metrics (raise MAX_METRICS)\n");
        abort(); /* a bug of the tool, not of its input */
    }
    m = &g_metrics[g_n_metrics++];
    m->scenario = scenario;
    m->name = name;
    snprintf(m->variant, sizeof m->variant, "%s", variant ? variant : "");
    return m;
}

void bench_record(unsigned round, const char *scenario, const char *variant, const char *name, double value,
                  const bench_ref *ref) {
    metric *m = find_or_add(scenario, variant, name);
    if (round >= BENCH_MAX_ROUNDS || !isfinite(value)) return;
    m->v[round] = value;
    m->have[round] = 1;
    if (ref != NULL) {
        m->has_ref = 1;
        m->ref = *ref;
    }
}

void bench_record_na(const char *scenario, const char *variant, const char *name, const char *why) {
    find_or_add(scenario, variant, name)->na = why;
}

double bench_value(unsigned round, const char *scenario, const char *variant, const char *name) {
    metric *m = find(scenario, variant, name);
    return m != NULL && round < BENCH_MAX_ROUNDS && m->have[round] ? m->v[round] : -1.0;
}

/* ------------------------------------------------------------ summaries */

typedef struct summary {
    unsigned n;
    double median, min, max;
} summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static summary summarize(const double *v, unsigned n) {
    summary s = {0};
    double tmp[BENCH_MAX_ROUNDS];
    if (n == 0) return s;
    memcpy(tmp, v, n * sizeof tmp[0]);
    qsort(tmp, n, sizeof tmp[0], cmp_double);
    s.n = n;
    s.min = tmp[0];
    s.max = tmp[n - 1];
    s.median = n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2.0;
    return s;
}

static summary values_of(const metric *m) {
    double v[BENCH_MAX_ROUNDS];
    unsigned n = 0;
    for (unsigned r = 0; r < BENCH_MAX_ROUNDS; r++)
        if (m->have[r]) v[n++] = m->v[r];
    return summarize(v, n);
}

/* Per-round ratios to the reference; n == 0 when there is none. */
static summary ratios_of(const metric *m) {
    summary none = {0};
    if (!m->has_ref || m->na != NULL) return none;
    const metric *ref = find(m->ref.scenario, m->ref.variant, m->ref.name);
    if (ref == NULL) return none;
    double v[BENCH_MAX_ROUNDS];
    unsigned n = 0;
    for (unsigned r = 0; r < BENCH_MAX_ROUNDS; r++)
        if (m->have[r] && ref->have[r] && ref->v[r] > 0) v[n++] = m->v[r] / ref->v[r];
    return summarize(v, n);
}

/* ------------------------------------------------------------ table */

/* Whole numbers as they are, from 100 up rounded, then more decimals the smaller the figure. */
static const char *num(char *buf, size_t len, double x) {
    double a = x < 0 ? -x : x;
    if (x == (double)(long long)x && a < 1e15)
        snprintf(buf, len, "%lld", (long long)x); /* counts stay whole */
    else if (a >= 100)
        snprintf(buf, len, "%.0f", x);
    else if (a >= 10)
        snprintf(buf, len, "%.1f", x);
    else if (a >= 0.1)
        snprintf(buf, len, "%.2f", x);
    else
        snprintf(buf, len, "%.4f", x);
    return buf;
}

static void scenario_list(unsigned bits, char *buf, size_t len);

static void options_line(const bench_opts *o, char *buf, size_t len) {
    char body[48], lbody[48], plist[64] = "", sc[160];
    describe_body(&o->body, body, sizeof body);
    describe_body(&o->load_body, lbody, sizeof lbody);
    for (unsigned i = 0; i < o->n_producers; i++) {
        size_t at = strlen(plist);
        snprintf(plist + at, sizeof plist - at, "%s%u", i ? "," : "", o->producers[i]);
    }
    scenario_list(o->scenarios, sc, sizeof sc);
    snprintf(buf, len,
             "rounds %u, workers %u, producers %s, queue %u, tasks %lu, users %u, batch %u, body %s,\n"
             "wake samples %u (gap %" PRIu64 " us), load %u%% x %lu tasks of %s, "
             "alloc tasks %lu\nscenarios: %s",
             o->rounds, o->workers, plist, o->queue, o->tasks, o->users, o->batch, body, o->samples,
             o->gap_ns / 1000, o->load_pct, o->load_tasks, lbody, o->alloc_tasks, sc);
}

static void scenario_list(unsigned bits, char *buf, size_t len) {
    buf[0] = '\0';
    for (unsigned i = 0; i < BENCH_N_SCENARIOS; i++) {
        if (!(bits & (1u << i))) continue;
        size_t at = strlen(buf);
        snprintf(buf + at, len - at, "%s%s", at ? "," : "", bench_scenario_names[i]);
    }
}

void report_table(const bench_opts *o) {
    char opts[512];
    options_line(o, opts, sizeof opts);
    printf("tp_bench: libtaskpool %s (header %d.%d.%d)\n", g_machine.lib_version, TP_VERSION_MAJOR,
           TP_VERSION_MINOR, TP_VERSION_PATCH);
    printf("machine: %ld CPUs online, %s, %s, %s\n", g_machine.nproc, g_machine.kernel, g_machine.compiler,
           g_machine.build);
    printf("%s\n\n", opts);

    printf("%-18s %-24s %11s %11s %11s %8s  %s\n", "scenario", "metric", "median", "min", "max", "ratio",
           "ratio is to");
    const char *last = "";
    for (unsigned i = 0; i < g_n_metrics; i++) {
        const metric *m = &g_metrics[i];
        char label[64], a[32], b[32], c[32], d[32];
        snprintf(label, sizeof label, "%s%s%s", m->scenario, m->variant[0] ? " " : "", m->variant);
        if (strcmp(m->scenario, last) != 0 && i > 0) printf("\n");
        last = m->scenario;
        if (m->na != NULL) {
            printf("%-18s %-24s %11s %11s %11s %8s  (%s)\n", label, m->name, "n/a", "n/a", "n/a", "", m->na);
            continue;
        }
        summary s = values_of(m);
        if (s.n == 0) continue;
        summary r = ratios_of(m);
        printf("%-18s %-24s %11s %11s %11s %8s  %s\n", label, m->name, num(a, sizeof a, s.median),
               num(b, sizeof b, s.min), num(c, sizeof c, s.max), r.n ? num(d, sizeof d, r.median) : "",
               r.n ? m->ref.label : "");
    }
    printf("\nmedian and min-max over %u round%s; ratio: median of per-round ratios to the\n"
           "figure named, measured in the same round (lower is better for times).\n",
           o->rounds, o->rounds == 1 ? "" : "s");
}

/* ------------------------------------------------------------ JSON */

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void json_num(double x) {
    if (isfinite(x))
        printf("%.10g", x);
    else
        printf("null");
}

static void json_summary(const summary *s) {
    printf("\"median\": ");
    json_num(s->median);
    printf(", \"min\": ");
    json_num(s->min);
    printf(", \"max\": ");
    json_num(s->max);
}

void report_json(const bench_opts *o, int ok) {
    char body[48], lbody[48];
    describe_body(&o->body, body, sizeof body);
    describe_body(&o->load_body, lbody, sizeof lbody);

    printf("{\n  \"tool\": \"tp_bench\",\n  \"ok\": %s,\n  \"libtaskpool\": ", ok ? "true" : "false");
    json_str(g_machine.lib_version);
    printf(",\n  \"header_version\": \"%d.%d.%d\",\n", TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH);
    printf("  \"machine\": {\"nproc\": %ld, \"kernel\": ", g_machine.nproc);
    json_str(g_machine.kernel);
    printf(", \"compiler\": ");
    json_str(g_machine.compiler);
    printf(", \"build\": ");
    json_str(g_machine.build);
    printf("},\n  \"options\": {\"rounds\": %u, \"workers\": %u, \"producers\": [", o->rounds, o->workers);
    for (unsigned i = 0; i < o->n_producers; i++) printf("%s%u", i ? ", " : "", o->producers[i]);
    printf("], \"queue\": %u, \"tasks\": %lu, \"users\": %u, \"batch\": %u, \"body\": ", o->queue, o->tasks,
           o->users, o->batch);
    json_str(body);
    printf(", \"samples\": %u, \"gap_ns\": %" PRIu64 ", \"load_pct\": %u, \"load_tasks\": %lu, "
           "\"load_body\": ",
           o->samples, o->gap_ns, o->load_pct, o->load_tasks);
    json_str(lbody);
    printf(", \"alloc_tasks\": %lu, \"scenarios\": [", o->alloc_tasks);
    for (unsigned i = 0, k = 0; i < BENCH_N_SCENARIOS; i++) {
        if (o->scenarios & (1u << i)) {
            printf("%s", k++ ? ", " : "");
            json_str(bench_scenario_names[i]);
        }
    }
    printf("]},\n  \"results\": [");

    int first = 1;
    for (unsigned i = 0; i < g_n_metrics; i++) {
        const metric *m = &g_metrics[i];
        summary s = values_of(m);
        if (m->na == NULL && s.n == 0) continue;
        printf("%s\n    {\"scenario\": ", first ? "" : ",");
        first = 0;
        json_str(m->scenario);
        printf(", \"variant\": ");
        json_str(m->variant);
        printf(", \"metric\": ");
        json_str(m->name);
        if (m->na != NULL) {
            printf(", \"median\": null, \"min\": null, \"max\": null, \"rounds\": [], "
                   "\"note\": ");
            json_str(m->na);
            printf("}");
            continue;
        }
        printf(", ");
        json_summary(&s);
        printf(", \"rounds\": [");
        int f = 1;
        for (unsigned r = 0; r < BENCH_MAX_ROUNDS; r++) {
            if (!m->have[r]) continue;
            printf("%s", f ? "" : ", ");
            f = 0;
            json_num(m->v[r]);
        }
        printf("]");
        summary rs = ratios_of(m);
        if (rs.n) {
            char to[96];
            snprintf(to, sizeof to, "%s%s%s: %s", m->ref.scenario, m->ref.variant[0] ? " " : "",
                     m->ref.variant, m->ref.name);
            printf(", \"ratio\": {\"to\": ");
            json_str(to);
            printf(", ");
            json_summary(&rs);
            printf("}");
        }
        printf("}");
    }
    printf("\n  ]\n}\n");
}
