/*
 * text.h -- text output (text.c): snprintf semantics over many calls,
 * escaping, and the statistics families shared by tp_stats_format and
 * tp_metrics_format.
 */
#ifndef TP_TEXT_H
#define TP_TEXT_H

#include "base.h"
#include "stats.h"

/* Writes what fits into buf (always NUL-terminated when len > 0) and keeps
 * counting in pos past the end, so pos is the length the whole text needs. */
typedef struct tp__outbuf {
    char *buf;
    size_t len, pos;
} tp__outbuf;

void tp__put(tp__outbuf *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

enum { TP__ESC_PROM, TP__ESC_JSON };
/* `name` escaped as a Prometheus label value or a JSON string (no quotes). */
void tp__put_escaped(tp__outbuf *o, const char *name, int how);
/* ns as exact decimal seconds: "0.000000128", "1", "4398.046511104". */
void tp__put_seconds(tp__outbuf *o, uint64_t ns);
/* "# HELP name help\n# TYPE name type\n". */
void tp__prom_family(tp__outbuf *o, const char *name, const char *type, const char *help);

/* Where the statistics of n pools come from: get(ctx, k, out) reads pool k;
 * label(ctx, k) is its pool label, or NULL for samples without a label
 * (label itself may be NULL: no labels). */
typedef struct tp__stats_src {
    size_t n;
    void (*get)(const void *ctx, size_t k, tp_stats *out);
    const char *(*label)(const void *ctx, size_t k);
    const void *ctx;
} tp__stats_src;

/* Every statistics family (the fields of TP__STATS_FIELDS and
 * taskpool_oldest_wait_seconds), each with its # HELP and # TYPE and one
 * sample per pool. */
void tp__prom_stats(tp__outbuf *o, const tp__stats_src *src);
/* `{"submitted":N,...,"oldest_wait_ns":N` -- the object is left open for the
 * caller to add fields and close. */
void tp__json_stats(tp__outbuf *o, const tp_stats *s);

#endif /* TP_TEXT_H */
