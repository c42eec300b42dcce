/*
 * log.c -- JSON lines on stdout (see log.h).
 *
 * Each field is appended only if it fits whole, leaving room for the closing
 * "}\n" and a "truncated" marker, so every emitted line parses. Every string
 * goes through escape(), which also keeps the line UTF-8 when a value holds
 * bytes from a client that are not.
 */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "taskpool.h"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

/* Relaxed: the threshold is set once before any other thread exists (main),
 * and a line filtered by a stale value would be harmless anyway. */
static atomic_int log_threshold = SVC_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int svc_log_parse_level(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0) return i;
    return -1;
}

void svc_log_set_level(int level) { atomic_store_explicit(&log_threshold, level, memory_order_relaxed); }

int svc_log_enabled(const char *level) {
    int l = svc_log_parse_level(level);
    return (l < 0 ? SVC_LOG_ERROR : l) <= atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

/* Room kept free for ,"truncated":true}\n */
#define TAIL_RESERVE 24

/* Append `s` of length n if it fits; otherwise mark the line truncated. */
static int put(svc_log *ev, const char *s, size_t n) {
    if (ev->skip) return -1;
    if (ev->truncated || ev->len + n + TAIL_RESERVE > sizeof ev->buf) {
        ev->truncated = 1;
        return -1;
    }
    memcpy(ev->buf + ev->len, s, n);
    ev->len += n;
    return 0;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629: shortest form,
 * no surrogates, at most U+10FFFF; n bytes available), or 0 if there is none. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t k = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return k;
}

/* Escape the n bytes at s into out (of size cap) as the inside of a JSON
 * string; returns its length, or (size_t)-1 if it does not fit. The result
 * is UTF-8 whatever s holds (RFC 8259 section 8.1): well-formed sequences are
 * copied, every other byte >= 0x80 becomes U+FFFD, control characters (C0
 * and C1: U+009B is an 8-bit CSI, U+0085 NEL), DEL and the line and
 * paragraph separators U+2028 and U+2029 become escapes, so that no byte of
 * a logged value can move a terminal's cursor or end a line for a reader
 * that splits on Unicode line breaks. */
static size_t escape(const char *s, size_t len, char *out, size_t cap) {
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        char tmp[8];
        const char *rep = NULL;
        size_t rn = 1, take = 1;
        switch (*p) {
        case '"': rep = "\\\"", rn = 2; break;
        case '\\': rep = "\\\\", rn = 2; break;
        case '\n': rep = "\\n", rn = 2; break;
        case '\r': rep = "\\r", rn = 2; break;
        case '\t': rep = "\\t", rn = 2; break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                snprintf(tmp, sizeof tmp, "\\u%04x", *p);
                rep = tmp;
                rn = 6;
            } else if (*p >= 0x80 && (take = rn = utf8_seq(p, (size_t)(end - p))) == 0) {
                rep = "\\ufffd";
                rn = 6;
                take = 1;
            } else if (*p == 0xc2 && p[1] <= 0x9f) { /* C1 controls U+0080..U+009F: 8-bit CSI, OSC, NEL */
                snprintf(tmp, sizeof tmp, "\\u%04x", p[1]);
                rep = tmp;
                rn = 6;
            } else if (*p == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) { /* U+2028, U+2029 */
                rep = p[2] == 0xa8 ? "\\u2028" : "\\u2029";
                rn = 6;
            }
        }
        if (n + rn > cap) return (size_t)-1;
        memcpy(out + n, rep != NULL ? rep : (const char *)p, rn);
        n += rn;
        p += take;
    }
    return n;
}

/* Appends ,"key": as one unit with the value that follows, so that a cut
 * never leaves a key without its value. */
static void field(svc_log *ev, const char *key, const char *value, size_t vlen, int quote) {
    if (ev->skip) return;
    char tmp[SVC_LOG_LINE_MAX];
    size_t n = 0, cap = sizeof tmp;
    tmp[n++] = ',';
    tmp[n++] = '"';
    size_t k = escape(key, strlen(key), tmp + n, cap - n);
    if (k == (size_t)-1) {
        ev->truncated = 1;
        return;
    }
    n += k;
    if (n + 3 > cap) {
        ev->truncated = 1;
        return;
    }
    tmp[n++] = '"';
    tmp[n++] = ':';
    if (quote) {
        tmp[n++] = '"';
        size_t v = escape(value, vlen, tmp + n, cap - n);
        if (v == (size_t)-1 || n + v + 1 > cap) {
            ev->truncated = 1;
            return;
        }
        n += v;
        tmp[n++] = '"';
    } else {
        if (n + vlen > cap) {
            ev->truncated = 1;
            return;
        }
        memcpy(tmp + n, value, vlen);
        n += vlen;
    }
    put(ev, tmp, n);
}

void svc_log_begin(svc_log *ev, const char *level, const char *msg) {
    if (!svc_log_enabled(level)) {
        ev->skip = 1;
        ev->len = 0;
        ev->truncated = 0;
        return;
    }
    svc_log_begin_always(ev, level, msg);
}

void svc_log_begin_always(svc_log *ev, const char *level, const char *msg) {
    ev->skip = 0;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[40];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    ev->len = 0;
    ev->truncated = 0;
    int n = snprintf(ev->buf, sizeof ev->buf, "{\"ts\":\"%s.%03ldZ\"", stamp, ts.tv_nsec / 1000000);
    ev->len = n > 0 ? (size_t)n : 0;
    svc_log_str(ev, "level", level);
    svc_log_str(ev, "msg", msg);
}

void svc_log_str(svc_log *ev, const char *key, const char *value) {
    if (value == NULL)
        field(ev, key, "null", 4, 0);
    else
        field(ev, key, value, strlen(value), 1);
}

void svc_log_strn(svc_log *ev, const char *key, const char *value, size_t max) {
    if (value == NULL) {
        field(ev, key, "null", 4, 0);
        return;
    }
    size_t n = strnlen(value, max);
    field(ev, key, value, n, 1);
}

void svc_log_int(svc_log *ev, const char *key, long long value) {
    char num[32];
    int n = snprintf(num, sizeof num, "%lld", value);
    field(ev, key, num, (size_t)n, 0);
}

void svc_log_uint(svc_log *ev, const char *key, unsigned long long value) {
    char num[32];
    int n = snprintf(num, sizeof num, "%llu", value);
    field(ev, key, num, (size_t)n, 0);
}

void svc_log_raw(svc_log *ev, const char *key, const char *json) { field(ev, key, json, strlen(json), 0); }

void svc_log_end(svc_log *ev) {
    if (ev->skip) return;
    if (ev->truncated) {
        static const char mark[] = ",\"truncated\":true";
        memcpy(ev->buf + ev->len, mark, sizeof mark - 1); /* TAIL_RESERVE keeps room */
        ev->len += sizeof mark - 1;
    }
    ev->buf[ev->len++] = '}';
    ev->buf[ev->len++] = '\n';
    pthread_mutex_lock(&log_mu);
    size_t off = 0;
    while (off < ev->len) {
        ssize_t w = write(STDOUT_FILENO, ev->buf + off, ev->len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* stdout gone: logging must not stop the service */
        off += (size_t)w;
    }
    pthread_mutex_unlock(&log_mu);
}

void svc_log_hook(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    svc_log ev;
    svc_log_begin(&ev, level >= 0 && level <= 3 ? level_names[level] : "info", "taskpool");
    svc_log_str(&ev, "log_id", log_id);
    svc_log_str(&ev, "detail", msg);
    svc_log_end(&ev);
}
