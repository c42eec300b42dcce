/*
 * proto.c -- the request parser of the loop servers (the protocol is in
 * loop.h).
 *
 * Strict and small: upper-case commands, fields separated by single spaces,
 * decimal numbers without sign, a bounded user name. Anything else is
 * refused with a reason, never guessed at, so that a client bug shows at
 * once. Pure functions: no state, no allocation.
 */
#include <string.h>

#include "loop.h"

static int user_char(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
}

static int bad(lp_request *out, const char *why) {
    out->error = why;
    return LP_REQ_BAD;
}

static int is(const char *f, size_t n, const char *word) {
    return n == strlen(word) && memcmp(f, word, n) == 0;
}

/* The request's kind; its fields in *out. */
static int parse(const char *line, size_t len, lp_request *out) {
    if (len > 0 && line[len - 1] == '\r') len--;
    if (len == 0) return bad(out, "empty line");
    const char *f[3], *p = line, *end = line + len;
    size_t fl[3];
    int nf = 0;
    for (;;) { /* split on single spaces; an empty field is an error */
        const char *e = memchr(p, ' ', (size_t)(end - p));
        if (e == NULL) e = end;
        if (e == p) return bad(out, "fields are separated by one space");
        if (nf == 3) return bad(out, "too many fields");
        f[nf] = p;
        fl[nf++] = (size_t)(e - p);
        if (e == end) break;
        p = e + 1;
    }
    if (is(f[0], fl[0], "PING") || is(f[0], fl[0], "STATS")) {
        if (nf > 1) return bad(out, "no arguments expected");
        return fl[0] == 4 ? LP_REQ_PING : LP_REQ_STATS;
    }
    if (!is(f[0], fl[0], "WORK")) return bad(out, "unknown command (WORK, PING or STATS)");
    if (nf < 2) return bad(out, "usage: WORK <ms> [<user>]");
    unsigned long ms = 0;
    for (size_t i = 0; i < fl[1]; i++) {
        if (f[1][i] < '0' || f[1][i] > '9') return bad(out, "ms: expected a whole number");
        ms = ms * 10 + (unsigned long)(f[1][i] - '0');
        if (ms > LP_WORK_MS_MAX) return bad(out, "ms: at most 600000");
    }
    if (nf == 3) {
        if (fl[2] > LP_USER_MAX) return bad(out, "user: at most 64 bytes");
        for (size_t i = 0; i < fl[2]; i++)
            if (!user_char((unsigned char)f[2][i])) return bad(out, "user: only A-Z a-z 0-9 . _ -");
        memcpy(out->user, f[2], fl[2]);
        out->user[fl[2]] = '\0';
    }
    out->ms = (unsigned)ms;
    return LP_REQ_WORK;
}

void lp_parse(const char *line, size_t len, lp_request *out) {
    memset(out, 0, sizeof *out);
    out->kind = parse(line, len, out);
}
