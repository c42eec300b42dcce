/*
 * metrics.c -- tp_metrics_format: one document for several pools (taskpool.h,
 * section 13).
 *
 * Prometheus text is written family by family (the exposition format wants
 * every sample of a family after its one # HELP / # TYPE pair), and within a
 * family pool by pool, so each pool is read once per family: its statistics
 * with tp_stats_get (through text.c's writer, which tp_stats_format uses
 * too), its lanes with tp_lane_stats_get, its histograms with tp_hist_get.
 * Nothing is allocated and no pool lock is taken. Each histogram family of a
 * pool is one snapshot, so its +Inf bucket equals its _count in every
 * document.
 *
 * Histograms in Prometheus text expose 24 finite `le` bounds (PROM_BOUNDS: a
 * fixed subset of the exact bucket bounds, from 1.024 us to about an hour),
 * each with the exact cumulative count up to it, plus +Inf; JSON lists every
 * non-empty bucket.
 *
 * Layer: 1 in pool.h, with group.c: it reads a pool through the public
 * calls and its read-only `cfg`, and writes with text.c.
 */
#include "pool.h"

#include <stdio.h>
#include <string.h>

#include "text.h"

/* The bucket indices whose bounds are the Prometheus `le` values: the exact
 * bounds nearest to 24 points spread evenly on a log scale from 1 us to 1 h:
 * 1.024 us, 2.56 us, 6.656 us, ... 3573.4 s. */
static const unsigned short PROM_BOUNDS[24] = {24,  34,  45,  57,  67,  79,  90,  100, 112, 122, 134, 145,
                                               156, 167, 178, 189, 200, 211, 222, 233, 244, 255, 266, 277};

/* ------------------------------------------------------------ Prometheus */

static void prom_label(tp__outbuf *o, const tp_pool *p) {
    tp__put(o, "{pool=\"");
    tp__put_escaped(o, p->cfg.name, TP__ESC_PROM);
    tp__put(o, "\"");
}

/* One histogram series: `labels` after the pool label (may be ""). */
static void prom_hist_series(tp__outbuf *o, const tp_pool *p, const char *name, const char *labels,
                             const tp_hist *h) {
    uint64_t cum = 0;
    unsigned next = 0;
    for (unsigned i = 0; i + 1 < TP_HIST_BUCKETS && next < 24; i++) {
        cum += h->buckets[i];
        if (i != PROM_BOUNDS[next]) continue;
        next++;
        tp__put(o, "%s_bucket", name);
        prom_label(o, p);
        tp__put(o, "%s,le=\"", labels);
        tp__put_seconds(o, tp_hist_bound_ns(i));
        tp__put(o, "\"} %llu\n", (unsigned long long)cum);
    }
    tp__put(o, "%s_bucket", name);
    prom_label(o, p);
    tp__put(o, "%s,le=\"+Inf\"} %llu\n%s_sum", labels, (unsigned long long)h->count, name);
    prom_label(o, p);
    tp__put(o, "%s} ", labels);
    tp__put_seconds(o, h->sum_ns);
    tp__put(o, "\n%s_count", name);
    prom_label(o, p);
    tp__put(o, "%s} %llu\n", labels, (unsigned long long)h->count);
}

static void prom_hist(tp__outbuf *o, tp_pool *const *pools, size_t n, int which, const char *name,
                      const char *help) {
    tp__prom_family(o, name, "histogram", help);
    for (size_t k = 0; k < n; k++) {
        tp_hist h;
        (void)tp_hist_get(pools[k], which, &h);
        prom_hist_series(o, pools[k], name, "", &h);
    }
}

static void prom_capacity(tp__outbuf *o, tp_pool *const *pools, size_t n, int what) {
    static const char *const names[3] = {"taskpool_workers_max", "taskpool_queue_capacity",
                                         "taskpool_max_per_user"};
    static const char *const helps[3] = {
        "Worker threads at most (max_workers).",
        "Tasks that may wait in the queue or for a retry (queue_capacity).",
        "Accepted, unfinished tasks one user may hold (max_per_user); +Inf when unlimited."};
    tp__prom_family(o, names[what], "gauge", helps[what]);
    for (size_t k = 0; k < n; k++) {
        const tp_pool *p = pools[k];
        unsigned v = what == 0 ? p->cfg.max_workers : what == 1 ? p->cfg.capacity : p->cfg.max_per_user;
        tp__put(o, "%s", names[what]);
        prom_label(o, p);
        if (what == 2 && v == TP_UNLIMITED)
            tp__put(o, "} +Inf\n");
        else
            tp__put(o, "} %u\n", v);
    }
}

/* The lanes' families: one sample per pool and priority. */
static void prom_lanes(tp__outbuf *o, tp_pool *const *pools, size_t n) {
    static const struct {
        const char *name, *type, *help;
    } fam[3] = {
        {"taskpool_lane_started_total", "counter", "Attempts started from this priority lane."},
        {"taskpool_lane_queued", "gauge", "Tasks waiting in this priority lane now."},
        {"taskpool_lane_running", "gauge", "Tasks of this priority lane running now."},
    };
    for (int f = 0; f < 3; f++) {
        tp__prom_family(o, fam[f].name, fam[f].type, fam[f].help);
        for (size_t k = 0; k < n; k++)
            for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
                tp_lane_stats l;
                (void)tp_lane_stats_get(pools[k], prio, &l);
                uint64_t v = f == 0 ? l.started : f == 1 ? l.queued : l.running;
                tp__put(o, "%s", fam[f].name);
                prom_label(o, pools[k]);
                tp__put(o, ",priority=\"%d\"} %llu\n", prio, (unsigned long long)v);
            }
    }
    const char *name = "taskpool_lane_queue_wait_seconds";
    tp__prom_family(
        o, name, "histogram",
        "Time from admission (or return to the queue for a retry) to the start of each attempt, by "
        "priority lane.");
    for (size_t k = 0; k < n; k++)
        for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
            tp_hist h;
            char labels[24];
            (void)tp_hist_get(pools[k], TP_HIST_QUEUE_WAIT_PRIO(prio), &h);
            snprintf(labels, sizeof labels, ",priority=\"%d\"", prio);
            prom_hist_series(o, pools[k], name, labels, &h);
        }
}

static void pool_stats(const void *ctx, size_t k, tp_stats *out) {
    tp_stats_get(((tp_pool *const *)ctx)[k], out);
}
static const char *pool_label(const void *ctx, size_t k) { return ((tp_pool *const *)ctx)[k]->cfg.name; }

static void prometheus(tp__outbuf *o, tp_pool *const *pools, size_t n) {
    tp__stats_src src = {n, pool_stats, pool_label, pools};
    tp__prom_stats(o, &src);
    for (int what = 0; what < 3; what++) prom_capacity(o, pools, n, what);
    prom_hist(o, pools, n, TP_HIST_QUEUE_WAIT, "taskpool_queue_wait_seconds",
              "Time from admission (or return to the queue for a retry) to the start of each attempt.");
    prom_hist(o, pools, n, TP_HIST_RUN, "taskpool_run_seconds", "Run time of each attempt.");
    prom_lanes(o, pools, n);
    tp__prom_family(o, "taskpool_build_info", "gauge", "The libtaskpool version in use; always 1.");
    tp__put(o, "taskpool_build_info{version=\"");
    tp__put_escaped(o, tp_version(), TP__ESC_PROM);
    tp__put(o, "\"} 1\n");
}

/* ------------------------------------------------------------ JSON */

/* "key":{"count":N,"sum_ns":S,"buckets":[[bound,count],...]} (key NULL:
 * the object alone). */
static void json_hist(tp__outbuf *o, tp_pool *p, int which, const char *key) {
    tp_hist h;
    (void)tp_hist_get(p, which, &h);
    if (key) tp__put(o, "\"%s\":", key);
    tp__put(o, "{\"count\":%llu,\"sum_ns\":%llu,\"buckets\":[", (unsigned long long)h.count,
            (unsigned long long)h.sum_ns);
    const char *sep = "";
    for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) {
        if (!h.buckets[i]) continue;
        tp__put(o, "%s[%llu,%llu]", sep, (unsigned long long)tp_hist_bound_ns(i),
                (unsigned long long)h.buckets[i]);
        sep = ",";
    }
    tp__put(o, "]}");
}

static void json(tp__outbuf *o, tp_pool *const *pools, size_t n) {
    tp__put(o, "{\"version\":\"");
    tp__put_escaped(o, tp_version(), TP__ESC_JSON);
    tp__put(o, "\",\"pools\":{");
    for (size_t k = 0; k < n; k++) {
        tp_pool *p = pools[k];
        tp_stats s;
        tp_stats_get(p, &s);
        tp__put(o, "%s\"", k ? "," : "");
        tp__put_escaped(o, p->cfg.name, TP__ESC_JSON);
        tp__put(o, "\":");
        tp__json_stats(o, &s);
        tp__put(o, ",\"workers_max\":%u,\"queue_capacity\":%u,\"max_per_user\":", p->cfg.max_workers,
                p->cfg.capacity);
        if (p->cfg.max_per_user == TP_UNLIMITED)
            tp__put(o, "null");
        else
            tp__put(o, "%u", p->cfg.max_per_user);
        tp__put(o, ",");
        json_hist(o, p, TP_HIST_QUEUE_WAIT, "queue_wait");
        tp__put(o, ",");
        json_hist(o, p, TP_HIST_RUN, "run");
        tp__put(o, ",\"lanes\":{");
        for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
            tp_lane_stats l;
            (void)tp_lane_stats_get(p, prio, &l);
            tp__put(o, "%s\"%d\":{\"started\":%llu,\"queued\":%u,\"running\":%u,\"queue_wait\":",
                    prio == TP_PRIO_MIN ? "" : ",", prio, (unsigned long long)l.started, l.queued, l.running);
            json_hist(o, p, TP_HIST_QUEUE_WAIT_PRIO(prio), NULL);
            tp__put(o, "}");
        }
        tp__put(o, "}}");
    }
    tp__put(o, "}}");
}

/* ------------------------------------------------------------ entry */

/* Whether two names are written the same (taskpool.h: a byte that is not
 * UTF-8 is written as U+FFFD, so "a\xff" and "a\xfe" are one name in the
 * document, as are "a\xff" and "a" U+FFFD). The Prometheus form compares:
 * it writes U+FFFD as itself and keeps every other name apart, as the
 * JSON form does once decoded. */
static bool ascii(const char *s) {
    while (*s && (unsigned char)*s < 0x80) s++;
    return *s == '\0';
}

static bool same_written_name(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return true;
    if (ascii(a) || ascii(b)) return false;                /* U+FFFD comes from bytes >= 0x80 only */
    char ea[3 * TP_NAME_MAX + 1], eb[3 * TP_NAME_MAX + 1]; /* at most 3 bytes out per byte in */
    tp__outbuf oa = {ea, sizeof ea, 0}, ob = {eb, sizeof eb, 0};
    tp__put_escaped(&oa, a, TP__ESC_PROM);
    tp__put_escaped(&ob, b, TP__ESC_PROM);
    TP__ASSERT(oa.pos < sizeof ea && ob.pos < sizeof eb);
    return oa.pos == ob.pos && memcmp(ea, eb, oa.pos) == 0;
}

int tp_metrics_format(tp_pool *const *pools, size_t n, int format, char *buf, size_t len) {
    if ((!pools && n > 0) || (!buf && len > 0)) return TP_EINVAL;
    if (format != TP_FORMAT_JSON && format != TP_FORMAT_PROMETHEUS) return TP_EINVAL;
    for (size_t k = 0; k < n; k++) {
        if (!pools[k]) return TP_EINVAL;
        for (size_t j = 0; j < k; j++)
            if (same_written_name(pools[j]->cfg.name, pools[k]->cfg.name))
                return TP_EINVAL; /* the same pool twice too */
    }
    tp__outbuf o = {buf, len, 0};
    if (len) buf[0] = '\0';
    if (format == TP_FORMAT_JSON)
        json(&o, pools, n);
    else
        prometheus(&o, pools, n);
    if (o.pos > (size_t)INT_MAX) return TP_ENOMEM;
    return (int)o.pos;
}
