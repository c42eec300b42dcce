/*
 * redis_conn.c -- REDIS_URL parsing and an authenticating connect (see
 * redis_conn.h). The password is kept only in tps_redis_addr.password and the
 * AUTH command; every message and the `shown` URL leave it out.
 */
#define _GNU_SOURCE
#include "redis_conn.h"

#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "config.h" /* svc_parse_uint */

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Percent-decode s[0..n) into out (NUL-terminated); -1 when malformed or too long. */
static int decode(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '%') {
            if (i + 2 >= n) return -1;
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0) return -1;
            ch = (char)(h * 16 + l);
            i += 2;
        }
        if (ch == '\0' || o + 1 >= cap) return -1;
        out[o++] = ch;
    }
    out[o] = '\0';
    return 0;
}

/* Split "user:password@" off *p (which ends at `end`); 0 when there is none. */
static int userinfo(const char **p, const char *end, tps_redis_addr *a) {
    const char *at = memchr(*p, '@', (size_t)(end - *p));
    if (at == NULL) return 0;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    const char *uend = colon != NULL ? colon : at;
    if (decode(*p, (size_t)(uend - *p), a->user, sizeof a->user) != 0) return -1;
    if (colon != NULL) {
        if (decode(colon + 1, (size_t)(at - colon - 1), a->password, sizeof a->password) != 0) return -1;
        a->has_password = 1;
    }
    *p = at + 1;
    return 0;
}

int tps_redis_parse(const char *url, const char *env_password, tps_redis_addr *a, char *err, size_t errlen) {
    static const char expect[] =
        "expected redis://[user[:password]@]host[:port] or unix://[user[:password]@]/path";
    memset(a, 0, sizeof *a);
    if (url == NULL || *url == '\0') url = "redis://127.0.0.1:6379";
    int is_unix = strncmp(url, "unix://", 7) == 0;
    if (!is_unix && strncmp(url, "redis://", 8) != 0) {
        snprintf(err, errlen, "REDIS_URL: %s", expect);
        return -1;
    }
    const char *p = url + (is_unix ? 7 : 8);
    /* the userinfo ends at the last '@' before the path (unix) or the end */
    const char *end = is_unix ? strstr(p, "@/") : strrchr(p, '@');
    if (end != NULL) {
        end++;
        if (userinfo(&p, end, a) != 0) {
            snprintf(err, errlen, "REDIS_URL: malformed user or password (percent-encode %%, @ and :)");
            return -1;
        }
    }
    if (is_unix) {
        if (p[0] != '/' || strlen(p) >= sizeof a->host) {
            snprintf(err, errlen, "REDIS_URL: expected unix://[user[:password]@]/absolute/path");
            return -1;
        }
        strcpy(a->host, p);
        a->port = 0;
    } else {
        const char *h = p, *hend, *rest;
        if (h[0] == '[') { /* [v6 address] */
            hend = strchr(h, ']');
            rest = hend != NULL ? hend + 1 : NULL;
            h++;
        } else {
            hend = h + strcspn(h, ":");
            rest = hend;
        }
        unsigned port = 6379;
        size_t hlen = hend != NULL ? (size_t)(hend - h) : 0;
        if (rest == NULL || hlen == 0 || hlen >= sizeof a->host || memchr(h, '/', hlen) != NULL ||
            memchr(h, '@', hlen) != NULL || (rest[0] != '\0' && rest[0] != ':') ||
            (rest[0] == ':' && svc_parse_uint(rest + 1, 1, 65535, &port) != 0)) {
            snprintf(err, errlen, "REDIS_URL: %s", expect);
            return -1;
        }
        memcpy(a->host, h, hlen);
        a->host[hlen] = '\0';
        a->port = (int)port;
    }
    if (env_password != NULL && *env_password != '\0') {
        if (a->has_password) {
            snprintf(err, errlen, "REDIS_PASSWORD is set and REDIS_URL has a password too: give it once");
            return -1;
        }
        if (strlen(env_password) >= sizeof a->password) {
            snprintf(err, errlen, "REDIS_PASSWORD is longer than %zu bytes", sizeof a->password - 1);
            return -1;
        }
        strcpy(a->password, env_password);
        a->has_password = 1;
    }
    const char *cred = a->has_password ? ":***@" : a->user[0] != '\0' ? "@" : "";
    if (a->port == 0)
        snprintf(a->shown, sizeof a->shown, "unix://%s%s%s", a->user, cred, a->host);
    else
        snprintf(a->shown, sizeof a->shown,
                 strchr(a->host, ':') != NULL ? "redis://%s%s[%s]:%d" : "redis://%s%s%s:%d", a->user, cred,
                 a->host, a->port);
    return 0;
}

redisContext *tps_redis_connect(const tps_redis_addr *a, int connect_timeout_ms, int command_timeout_ms,
                                char *err, size_t errlen) {
    struct timeval tv = {.tv_sec = connect_timeout_ms / 1000, .tv_usec = (connect_timeout_ms % 1000) * 1000};
    redisContext *r = a->port == 0 ? redisConnectUnixWithTimeout(a->host, tv)
                                   : redisConnectWithTimeout(a->host, a->port, tv);
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (r->err) {
        snprintf(err, errlen, "%s", r->errstr);
        redisFree(r);
        return NULL;
    }
    struct timeval ct = {.tv_sec = command_timeout_ms / 1000, .tv_usec = (command_timeout_ms % 1000) * 1000};
    (void)redisSetTimeout(r, ct);
    if (a->port != 0) (void)redisEnableKeepAlive(r);
    if (a->has_password || a->user[0] != '\0') {
        const char *argv[3] = {"AUTH", a->user, a->password};
        size_t argvlen[3] = {4, strlen(a->user), strlen(a->password)};
        redisReply *rep = a->user[0] != '\0' ? redisCommandArgv(r, 3, argv, argvlen)
                                             : redisCommandArgv(r, 2, (const char *[]){"AUTH", a->password},
                                                                (size_t[]){4, strlen(a->password)});
        if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "AUTH: %s", rep == NULL ? r->errstr : rep->str);
            if (rep != NULL) freeReplyObject(rep);
            redisFree(r);
            return NULL;
        }
        freeReplyObject(rep);
    }
    return r;
}
