/*
 * text.c -- writing text into a caller's buffer with snprintf semantics
 * across many calls, escaping names, and the statistics families that
 * tp_stats_format (one pool, stats.c) and tp_metrics_format (several pools,
 * metrics.c) both write, so that the two documents name and describe every
 * field the same way.
 *
 * Numbers are written exactly: counters as integers, seconds as the decimal
 * expansion of an integer count of nanoseconds.
 *
 * Names are user data: a Prometheus label value is escaped per the exposition
 * format (\\, \", \n) and a JSON string per RFC 8259; bytes that do not form
 * UTF-8 become U+FFFD, so the document always parses.
 *
 * Layer: a leaf (6 in pool.h): no lock, no state; it reads pools only through
 * the callbacks its callers pass.
 */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void tp__put(tp__outbuf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->pos < o->len ? o->len - o->pos : 0;
    int n = vsnprintf(room ? o->buf + o->pos : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->pos += (size_t)n;
}

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

void tp__put_escaped(tp__outbuf *o, const char *name, int how) {
    const unsigned char *s = (const unsigned char *)name;
    size_t n = strlen(name);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = utf8_len(s + i, n - i);
        if (k == 0) {
            tp__put(o, "%s", how == TP__ESC_JSON ? "\\ufffd" : "\xef\xbf\xbd");
            i++;
            continue;
        }
        if (k > 1) {
            tp__put(o, "%.*s", (int)k, (const char *)s + i);
        } else if (c == '\\' || c == '"') {
            tp__put(o, "\\%c", c);
        } else if (c == '\n') {
            tp__put(o, "\\n");
        } else if (how == TP__ESC_JSON && c < 0x20) {
            tp__put(o, "\\u%04x", c);
        } else {
            tp__put(o, "%c", c);
        }
        i += k;
    }
}

void tp__put_seconds(tp__outbuf *o, uint64_t ns) {
    uint64_t whole = ns / 1000000000ull, frac = ns % 1000000000ull;
    if (frac == 0) {
        tp__put(o, "%llu", (unsigned long long)whole);
        return;
    }
    int digits = 9;
    while (frac % 10 == 0) frac /= 10, digits--;
    tp__put(o, "%llu.%0*llu", (unsigned long long)whole, digits, (unsigned long long)frac);
}

/* ------------------------------------------------------------ the statistics families */

void tp__prom_family(tp__outbuf *o, const char *name, const char *type, const char *help) {
    tp__put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `name` and the pool label of sample k ({pool="..."} or nothing), then a
 * space: the value follows. */
static void prom_sample(tp__outbuf *o, const char *name, const tp__stats_src *src, size_t k) {
    const char *label = src->label ? src->label(src->ctx, k) : NULL;
    tp__put(o, "%s", name);
    if (label) {
        tp__put(o, "{pool=\"");
        tp__put_escaped(o, label, TP__ESC_PROM);
        tp__put(o, "\"}");
    }
    tp__put(o, " ");
}

void tp__prom_stats(tp__outbuf *o, const tp__stats_src *src) {
    tp_stats s;
#define TP__PROM_FAMILY(f, help, name, type)                                                                 \
    tp__prom_family(o, name, type, help);                                                                    \
    for (size_t k = 0; k < src->n; k++) {                                                                    \
        src->get(src->ctx, k, &s);                                                                           \
        prom_sample(o, name, src, k);                                                                        \
        tp__put(o, "%llu\n", (unsigned long long)s.f);                                                       \
    }
#define TP__PROM_COUNTER(f, help) TP__PROM_FAMILY(f, help, "taskpool_" #f "_total", "counter")
#define TP__PROM_GAUGE(f, help)   TP__PROM_FAMILY(f, help, "taskpool_" #f, "gauge")
    TP__STATS_FIELDS(TP__PROM_COUNTER, TP__PROM_GAUGE, TP__PROM_COUNTER)
#undef TP__PROM_COUNTER
#undef TP__PROM_GAUGE
#undef TP__PROM_FAMILY
    tp__prom_family(o, "taskpool_oldest_wait_seconds", "gauge",
                    "How long the task that has waited longest among those queued now has waited.");
    for (size_t k = 0; k < src->n; k++) {
        src->get(src->ctx, k, &s);
        prom_sample(o, "taskpool_oldest_wait_seconds", src, k);
        tp__put_seconds(o, s.oldest_wait_ns);
        tp__put(o, "\n");
    }
}

void tp__json_stats(tp__outbuf *o, const tp_stats *s) {
    const char *sep = "{";
#define TP__JSON_FIELD(f, help)                                                                              \
    tp__put(o, "%s\"" #f "\":%llu", sep, (unsigned long long)s->f);                                          \
    sep = ",";
    TP__STATS_FIELDS(TP__JSON_FIELD, TP__JSON_FIELD, TP__JSON_FIELD)
#undef TP__JSON_FIELD
    tp__put(o, ",\"oldest_wait_ns\":%llu", (unsigned long long)s->oldest_wait_ns);
}
