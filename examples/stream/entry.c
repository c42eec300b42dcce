/*
 * entry.c -- parsing of a stream entry's fields (see entry.h).
 *
 * Values are copied into a small NUL-terminated buffer before the strict
 * parsers of examples/service/config.c see them, so a value with an embedded
 * NUL or trailing bytes never parses by accident.
 */
#define _GNU_SOURCE
#include "entry.h"

#include <string.h>
#include <time.h>

#include "config.h" /* svc_parse_duration, svc_parse_uint */

enum {
    F_USER = 1,
    F_WORK = 2,
    F_FAIL = 4,
    F_PAYLOAD = 8,
    F_NOT_BEFORE = 16,
    F_DEFER = 32,
    F_ATTEMPTS = 64,
    F_PRIORITY = 128
};

void tps_entry_init(tps_entry *e) { memset(e, 0, sizeof *e); }

static int is(const char *name, size_t len, const char *want) {
    return len == strlen(want) && memcmp(name, want, len) == 0;
}

/* The value as a C string in buf; -1 when too long or with a NUL inside. */
static int cstr(char *buf, size_t cap, const char *val, size_t len) {
    if (len >= cap || memchr(val, '\0', len) != NULL) return -1;
    memcpy(buf, val, len);
    buf[len] = '\0';
    return 0;
}

/* A plain decimal uint64 (Unix ms). */
static int parse_u64(const char *s, uint64_t *out) {
    if (*s == '\0') return -1;
    uint64_t v = 0;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

/* "-2" .. "2": an optional minus and one digit, nothing else ("+1", "01",
 * "-0" and " 1" are refused, so a value reads one way only). */
static int parse_priority(const char *val, size_t len, int *out) {
    int neg = len == 2 && val[0] == '-';
    if (len != 1u + (unsigned)neg) return -1;
    char d = val[neg];
    if (d < '0' || d > '0' + TP_PRIO_MAX || (neg && d == '0')) return -1;
    *out = neg ? -(d - '0') : d - '0';
    return 0;
}

const char *tps_entry_field(tps_entry *e, const char *name, size_t nlen, const char *val, size_t vlen) {
    char buf[64];
    if (is(name, nlen, "user")) {
        if (e->seen & F_USER) return "user: repeated";
        e->seen |= F_USER;
        if (vlen > TP_USER_MAX) return "user: longer than 127 bytes";
        if (memchr(val, '\0', vlen) != NULL) return "user: contains a NUL byte";
        memcpy(e->user, val, vlen);
        e->user[vlen] = '\0';
    } else if (is(name, nlen, "work") || is(name, nlen, "delay")) {
        if (e->seen & F_WORK) return "work: repeated (delay is its alias)";
        e->seen |= F_WORK;
        if (cstr(buf, sizeof buf, val, vlen) != 0 || svc_parse_duration(buf, &e->work_ns) != 0)
            return "work: not a duration (like 20ms, 1.5s)";
        if (e->work_ns > TPS_WORK_MAX_NS) return "work: over 1h";
    } else if (is(name, nlen, "fail")) {
        unsigned n;
        if (e->seen & F_FAIL) return "fail: repeated";
        e->seen |= F_FAIL;
        if (vlen == 6 && memcmp(val, "always", 6) == 0) {
            e->fail = TPS_FAIL_ALWAYS;
        } else {
            if (cstr(buf, sizeof buf, val, vlen) != 0 || svc_parse_uint(buf, 0, 1000, &n) != 0)
                return "fail: expected always or a number from 0 to 1000";
            e->fail = n;
        }
    } else if (is(name, nlen, "payload")) {
        if (e->seen & F_PAYLOAD) return "payload: repeated";
        e->seen |= F_PAYLOAD;
        if (vlen > TPS_PAYLOAD_MAX) return "payload: over 1024 bytes";
        e->payload = val;
        e->payload_len = vlen;
    } else if (is(name, nlen, "not_before")) {
        if (e->seen & F_NOT_BEFORE) return "not_before: repeated";
        e->seen |= F_NOT_BEFORE;
        if (cstr(buf, sizeof buf, val, vlen) != 0 || parse_u64(buf, &e->not_before) != 0)
            return "not_before: expected Unix time in milliseconds";
    } else if (is(name, nlen, "defer")) {
        uint64_t ns;
        if (e->seen & F_DEFER) return "defer: repeated";
        e->seen |= F_DEFER;
        if (cstr(buf, sizeof buf, val, vlen) != 0 || svc_parse_duration(buf, &ns) != 0)
            return "defer: not a duration (like 500ms, 10m)";
        if (ns / 1000000u > TPS_SCHED_AHEAD_MAX) return "defer: over 366 days";
        e->defer_ms = ns / 1000000u;
    } else if (is(name, nlen, "attempts")) {
        if (e->seen & F_ATTEMPTS) return "attempts: repeated";
        e->seen |= F_ATTEMPTS;
        if (cstr(buf, sizeof buf, val, vlen) != 0 ||
            svc_parse_uint(buf, 1, TPS_ATTEMPTS_MAX, &e->attempts) != 0)
            return "attempts: expected a number from 1 to 101";
    } else if (is(name, nlen, "priority")) {
        if (e->seen & F_PRIORITY) return "priority: repeated";
        e->seen |= F_PRIORITY;
        if (parse_priority(val, vlen, &e->priority) != 0)
            return "priority: expected a whole number from -2 to 2";
    } /* other names: the producer's own fields, ignored */
    return NULL;
}

const char *tps_entry_finish(const tps_entry *e) {
    if ((e->seen & F_NOT_BEFORE) && (e->seen & F_DEFER))
        return "not_before: give not_before or defer, not both";
    if (e->not_before > tps_unix_ms() + TPS_SCHED_AHEAD_MAX) return "not_before: more than 366 days ahead";
    return NULL;
}

uint64_t tps_entry_due_ms(const tps_entry *e, uint64_t enqueued_ms) {
    if (e->not_before != 0) return e->not_before;
    if (e->defer_ms != 0) return enqueued_ms + e->defer_ms;
    return 0;
}

uint64_t tps_id_ms(const char *id, size_t len) {
    uint64_t v = 0;
    size_t i = 0;
    for (; i < len && id[i] >= '0' && id[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(id[i] - '0');
    }
    return i > 0 && i < len && id[i] == '-' ? v : 0;
}

uint64_t tps_enqueued_ms(const char *id, size_t len, uint64_t now_ms) {
    uint64_t at = tps_id_ms(id, len);
    return at == 0 || at > now_ms ? now_ms : at;
}

uint64_t tps_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
