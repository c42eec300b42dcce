/*
 * log.h -- one JSON object per line on stdout, one line per event.
 *
 *   svc_log ev;
 *   svc_log_begin(&ev, "info", "request");
 *   svc_log_str(&ev, "path", path);
 *   svc_log_int(&ev, "status", 200);
 *   svc_log_end(&ev);            -> {"ts":"...","level":"info","msg":"request","path":"/x","status":200}
 *
 * Shared by both examples (examples/common/). The line is built in a fixed
 * buffer on the caller's stack (no allocation) and written with one write()
 * under a mutex, so lines from different threads never interleave. Strings
 * are JSON-escaped and kept UTF-8 (bytes that are not become U+FFFD; C0 and
 * C1 controls, DEL, U+2028 and U+2029 become \uXXXX escapes), so a value
 * from a client can neither break a line, for a reader that splits on any
 * Unicode line break either, nor forge one, nor send a terminal escape
 * sequence; a line that
 * would not fit is cut at a field boundary and marked "truncated":true, never
 * emitted as invalid JSON. Logging never fails the caller: a write error is
 * ignored.
 *
 * LOG_LEVEL filters by the level given to svc_log_begin(): an event below the
 * threshold is marked `skip` at once and costs one relaxed atomic load.
 * The log mutex is a leaf lock: nothing else is locked or called under it.
 */
#ifndef SVC_LOG_H
#define SVC_LOG_H

#include <stddef.h>
#include <stdint.h>

#define SVC_LOG_LINE_MAX 2048

typedef struct svc_log {
    char buf[SVC_LOG_LINE_MAX];
    size_t len;
    int truncated;
    int skip; /* below LOG_LEVEL: every call on this event does nothing */
} svc_log;

/* Levels, in the order of TP_LOG_*: a line is written when its level is at or
 * above the threshold (error < warn < info < debug in verbosity). */
enum { SVC_LOG_ERROR = 0, SVC_LOG_WARN = 1, SVC_LOG_INFO = 2, SVC_LOG_DEBUG = 3 };

/* "error" | "warn" | "info" | "debug" -> SVC_LOG_*, or -1. */
int svc_log_parse_level(const char *name);

/* Set the threshold (LOG_LEVEL; SVC_LOG_INFO until called). Thread-safe. */
void svc_log_set_level(int level);

/* Would a line at `level` ("error", "warn", ...) be written now? */
int svc_log_enabled(const char *level);

/* Start an event that is written whatever LOG_LEVEL says: only the
 * `listening` line, which scripts and tests read the address from. */
void svc_log_begin_always(svc_log *ev, const char *level, const char *msg);

void svc_log_begin(svc_log *ev, const char *level, const char *msg);
void svc_log_str(svc_log *ev, const char *key, const char *value); /* NULL value -> null */
/* At most `max` bytes of value (a client's input: a long one must not push
 * the other fields out of the line). */
void svc_log_strn(svc_log *ev, const char *key, const char *value, size_t max);
void svc_log_int(svc_log *ev, const char *key, long long value);
void svc_log_uint(svc_log *ev, const char *key, unsigned long long value);
void svc_log_raw(svc_log *ev, const char *key, const char *json); /* already valid JSON */
void svc_log_end(svc_log *ev);

/* The log hook given to the task pool: failed attempts become JSON lines. */
void svc_log_hook(void *arg, int level, const char *log_id, const char *msg);

#endif
