/*
 * text.c -- writing text into a caller's buffer with snprintf semantics
 * across many calls: the one helper behind tp_stats_format (stats.c) and
 * tp_metrics_format (metrics.c).
 *
 * Layer 7 (internal.h), a leaf: no lock, no state, calls nothing of ours.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdarg.h>
#include <stdio.h>

void tp__put(tp__outbuf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->pos < o->len ? o->len - o->pos : 0;
    int n = vsnprintf(room ? o->buf + o->pos : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->pos += (size_t)n;
}
