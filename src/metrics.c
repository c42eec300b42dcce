/*
 * metrics.c -- tp_metrics_format: one document for several pools (SPEC 11.5).
 *
 * Prometheus text is written family by family (the exposition format wants
 * every sample of a family after its one # HELP / # TYPE pair), and within a
 * family pool by pool, so each pool is read once per family: its statistics
 * with tp_stats_get, its histograms with tp_hist_get. Nothing is allocated
 * and no pool lock is taken. Each histogram family of a pool is one snapshot,
 * so its +Inf bucket equals its _count in every document.
 *
 * Numbers are written exactly: counters as integers, seconds as the decimal
 * expansion of an integer count of nanoseconds (bucket bounds and sums), so
 * `le` values are distinct and ascending as the bounds are.
 *
 * Names are user data: the pool label is escaped per the exposition format
 * (\\, \", \n) and JSON strings per RFC 8259; bytes that do not form UTF-8
 * become U+FFFD, so the document always parses.
 *
 * Layer: 1 in internal.h, with group.c: it reads a pool through the public
 * calls (tp_stats_get, tp_hist_get) and its read-only `cfg`, and calls only
 * text.c's tp__put below it. The field list is internal.h's TP__STATS_FIELDS,
 * the one tp_stats_format uses.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------ escaping */

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (len > n) return 0;
    unsigned cp = c & (0x7fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

enum { ESC_PROM, ESC_JSON };

static void put_escaped(tp__outbuf *o, const char *name, int how) {
    const unsigned char *s = (const unsigned char *)name;
    size_t n = strlen(name);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = utf8_len(s + i, n - i);
        if (k == 0) {
            tp__put(o, "%s", how == ESC_JSON ? "\\ufffd" : "\xef\xbf\xbd");
            i++;
            continue;
        }
        if (k > 1) {
            tp__put(o, "%.*s", (int)k, (const char *)s + i);
        } else if (c == '\\' || c == '"') {
            tp__put(o, "\\%c", c);
        } else if (c == '\n') {
            tp__put(o, "\\n");
        } else if (how == ESC_JSON && c < 0x20) {
            tp__put(o, "\\u%04x", c);
        } else {
            tp__put(o, "%c", c);
        }
        i += k;
    }
}

/* ns as exact decimal seconds: "0.000000128", "1", "4398.046511104". */
static void put_seconds(tp__outbuf *o, uint64_t ns) {
    uint64_t whole = ns / 1000000000ull, frac = ns % 1000000000ull;
    if (frac == 0) {
        tp__put(o, "%llu", (unsigned long long)whole);
        return;
    }
    int digits = 9;
    while (frac % 10 == 0) frac /= 10, digits--;
    tp__put(o, "%llu.%0*llu", (unsigned long long)whole, digits, (unsigned long long)frac);
}

/* ------------------------------------------------------------ Prometheus */

static void prom_family(tp__outbuf *o, const char *name, const char *type, const char *help) {
    tp__put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_label(tp__outbuf *o, const tp_pool *p) {
    tp__put(o, "{pool=\"");
    put_escaped(o, p->cfg.name, ESC_PROM);
    tp__put(o, "\"");
}

static void prom_hist(tp__outbuf *o, tp_pool *const *pools, size_t n, int which, const char *name,
                      const char *help) {
    prom_family(o, name, "histogram", help);
    for (size_t k = 0; k < n; k++) {
        tp_hist h;
        (void)tp_hist_get(pools[k], which, &h);
        uint64_t cum = 0;
        for (unsigned i = 0; i + 1 < TP_HIST_BUCKETS; i++) {
            cum += h.buckets[i];
            tp__put(o, "%s_bucket", name);
            prom_label(o, pools[k]);
            tp__put(o, ",le=\"");
            put_seconds(o, tp_hist_bound_ns(i));
            tp__put(o, "\"} %llu\n", (unsigned long long)cum);
        }
        TP__ASSERT(cum + h.buckets[TP_HIST_BUCKETS - 1] == h.count);
        tp__put(o, "%s_bucket", name);
        prom_label(o, pools[k]);
        tp__put(o, ",le=\"+Inf\"} %llu\n%s_sum", (unsigned long long)h.count, name);
        prom_label(o, pools[k]);
        tp__put(o, "} ");
        put_seconds(o, h.sum_ns);
        tp__put(o, "\n%s_count", name);
        prom_label(o, pools[k]);
        tp__put(o, "} %llu\n", (unsigned long long)h.count);
    }
}

static void prom_capacity(tp__outbuf *o, tp_pool *const *pools, size_t n, int what) {
    static const char *const names[3] = {"taskpool_workers_max", "taskpool_queue_capacity",
                                         "taskpool_max_per_user"};
    static const char *const helps[3] = {
        "Worker threads at most (max_workers).",
        "Tasks that may wait in the queue or for a retry (queue_capacity).",
        "Accepted, unfinished tasks one user may hold (max_per_user); +Inf when unlimited."};
    prom_family(o, names[what], "gauge", helps[what]);
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

static void prometheus(tp__outbuf *o, tp_pool *const *pools, size_t n) {
    tp_stats s;
#define TP__PROM_FAMILY(f, help, name, type)                                                                 \
    prom_family(o, name, type, help);                                                                        \
    for (size_t k = 0; k < n; k++) {                                                                         \
        tp_stats_get(pools[k], &s);                                                                          \
        tp__put(o, "%s", name);                                                                              \
        prom_label(o, pools[k]);                                                                             \
        tp__put(o, "} %llu\n", (unsigned long long)s.f);                                                     \
    }
#define TP__PROM_COUNTER(f, help) TP__PROM_FAMILY(f, help, "taskpool_" #f "_total", "counter")
#define TP__PROM_GAUGE(f, help)   TP__PROM_FAMILY(f, help, "taskpool_" #f, "gauge")
    TP__STATS_FIELDS(TP__PROM_COUNTER, TP__PROM_GAUGE, TP__PROM_COUNTER)
#undef TP__PROM_COUNTER
#undef TP__PROM_GAUGE
#undef TP__PROM_FAMILY
    for (int what = 0; what < 3; what++) prom_capacity(o, pools, n, what);
    prom_hist(o, pools, n, TP_HIST_QUEUE_WAIT, "taskpool_queue_wait_seconds",
              "Time from admission (or return to the queue for a retry) to the start of each attempt.");
    prom_hist(o, pools, n, TP_HIST_RUN, "taskpool_run_seconds", "Run time of each attempt.");
    prom_family(o, "taskpool_build_info", "gauge", "The libtaskpool version in use; always 1.");
    tp__put(o, "taskpool_build_info{version=\"");
    put_escaped(o, tp_version(), ESC_PROM);
    tp__put(o, "\"} 1\n");
}

/* ------------------------------------------------------------ JSON */

static void json_hist(tp__outbuf *o, tp_pool *p, int which, const char *key) {
    tp_hist h;
    (void)tp_hist_get(p, which, &h);
    tp__put(o, ",\"%s\":{\"count\":%llu,\"sum_ns\":%llu,\"buckets\":[", key, (unsigned long long)h.count,
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
    put_escaped(o, tp_version(), ESC_JSON);
    tp__put(o, "\",\"pools\":{");
    for (size_t k = 0; k < n; k++) {
        tp_pool *p = pools[k];
        tp_stats s;
        tp_stats_get(p, &s);
        tp__put(o, "%s\"", k ? "," : "");
        put_escaped(o, p->cfg.name, ESC_JSON);
        tp__put(o, "\":");
        const char *sep = "{";
#define TP__JSON_FIELD(f, help)                                                                              \
    tp__put(o, "%s\"" #f "\":%llu", sep, (unsigned long long)s.f);                                           \
    sep = ",";
        TP__STATS_FIELDS(TP__JSON_FIELD, TP__JSON_FIELD, TP__JSON_FIELD)
#undef TP__JSON_FIELD
        tp__put(o, ",\"workers_max\":%u,\"queue_capacity\":%u,\"max_per_user\":", p->cfg.max_workers,
                p->cfg.capacity);
        if (p->cfg.max_per_user == TP_UNLIMITED)
            tp__put(o, "null");
        else
            tp__put(o, "%u", p->cfg.max_per_user);
        json_hist(o, p, TP_HIST_QUEUE_WAIT, "queue_wait");
        json_hist(o, p, TP_HIST_RUN, "run");
        tp__put(o, "}");
    }
    tp__put(o, "}}");
}

/* ------------------------------------------------------------ entry */

int tp_metrics_format(tp_pool *const *pools, size_t n, int format, char *buf, size_t len) {
    if ((!pools && n > 0) || (!buf && len > 0)) return TP_EINVAL;
    if (format != TP_FORMAT_JSON && format != TP_FORMAT_PROMETHEUS) return TP_EINVAL;
    for (size_t k = 0; k < n; k++) {
        if (!pools[k]) return TP_EINVAL;
        for (size_t j = 0; j < k; j++)
            if (strcmp(pools[j]->cfg.name, pools[k]->cfg.name) == 0)
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
