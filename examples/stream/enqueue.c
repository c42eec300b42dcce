/*
 * enqueue.c -- taskpool-enqueue: add entries to the stream, pipelined.
 *
 *   taskpool-enqueue [--count N] [--users U] [--delay D] [--fail always|N]
 *                    [--fail-every K] [--payload-bytes B] [--pipeline P]
 *
 * Entry i gets `user u<i % U>` (no user field when U is 0), `delay D`, and,
 * when --fail is given, `fail <value>` on every K-th entry (K = --fail-every,
 * default 1: all of them). The XADDs are sent P at a time (default 256)
 * before the replies are read. REDIS_URL and STREAM as for the worker.
 * Prints one JSON line: count, seconds, entries_per_s, first and last id.
 * Exit 0, or 1 on a Redis error, 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "config.h"
#include "taskpool.h"

static void usage(void) {
    fprintf(stderr, "usage: taskpool-enqueue [--count N] [--users U] [--delay D] [--fail always|N]\n"
                    "                        [--fail-every K] [--payload-bytes B] [--pipeline P]\n");
}

static redisContext *connect_url(const char *url) {
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    char host[256], err[300];
    int port;
    if (svc_parse_redis_url(url, host, sizeof host, &port, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-enqueue: %s\n", err);
        exit(2);
    }
    redisContext *c =
        port == 0 ? redisConnectUnixWithTimeout(host, tv) : redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err) {
        fprintf(stderr, "taskpool-enqueue: cannot connect to %s: %s\n", url,
                c != NULL ? c->errstr : "no memory");
        exit(1);
    }
    return c;
}

int main(int argc, char **argv) {
    unsigned count = 1000, users = 10, fail_every = 1, payload_bytes = 0, pipeline = 256;
    const char *delay = "0", *fail = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned *num = NULL, max = 100000000;
        if (strcmp(a, "--count") == 0)
            num = &count;
        else if (strcmp(a, "--users") == 0)
            num = &users;
        else if (strcmp(a, "--fail-every") == 0)
            num = &fail_every;
        else if (strcmp(a, "--payload-bytes") == 0) {
            num = &payload_bytes;
            max = 1 << 20;
        } else if (strcmp(a, "--pipeline") == 0) {
            num = &pipeline;
            max = 100000;
        } else if (strcmp(a, "--delay") == 0 && v != NULL) {
            delay = v;
            i++;
            continue;
        } else if (strcmp(a, "--fail") == 0 && v != NULL) {
            fail = v;
            i++;
            continue;
        } else {
            usage();
            return 2;
        }
        if (v == NULL || svc_parse_uint(v,
                                        strcmp(a, "--count") == 0 || strcmp(a, "--users") == 0 ||
                                                strcmp(a, "--payload-bytes") == 0
                                            ? 0
                                            : 1,
                                        max, num) != 0) {
            fprintf(stderr, "taskpool-enqueue: %s needs a whole number\n", a);
            return 2;
        }
        i++;
    }
    uint64_t ns;
    if (svc_parse_duration(delay, &ns) != 0) {
        fprintf(stderr, "taskpool-enqueue: --delay \"%s\": expected a duration like 20ms\n", delay);
        return 2;
    }
    const char *url = getenv("REDIS_URL");
    const char *stream = getenv("STREAM");
    if (url == NULL || *url == '\0') url = "redis://127.0.0.1:6379";
    if (stream == NULL || *stream == '\0') stream = "tasks";
    char *payload = NULL;
    if (payload_bytes > 0) {
        payload = malloc(payload_bytes);
        if (payload == NULL) return 1;
        memset(payload, 'x', payload_bytes);
    }
    redisContext *c = connect_url(url);
    char first[64] = "", last[64] = "";
    uint64_t t0 = tp_now_ns();
    for (unsigned sent = 0; sent < count;) {
        unsigned n = count - sent < pipeline ? count - sent : pipeline;
        for (unsigned k = 0; k < n; k++) {
            unsigned i = sent + k;
            const char *av[12];
            size_t al[12];
            int ac = 0;
            char user[32];
#define A(s, l) (av[ac] = (s), al[ac] = (l), ac++)
            A("XADD", 4);
            A(stream, strlen(stream));
            A("*", 1);
            if (users > 0) {
                int ul = snprintf(user, sizeof user, "u%u", i % users);
                A("user", 4);
                A(user, (size_t)ul);
            }
            A("delay", 5);
            A(delay, strlen(delay));
            if (fail != NULL && i % fail_every == 0) {
                A("fail", 4);
                A(fail, strlen(fail));
            }
            if (payload != NULL) {
                A("payload", 7);
                A(payload, payload_bytes);
            }
#undef A
            if (redisAppendCommandArgv(c, ac, av, al) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
                return 1;
            }
        }
        for (unsigned k = 0; k < n; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
                return 1;
            }
            if (r->type != REDIS_REPLY_STRING) {
                fprintf(stderr, "taskpool-enqueue: XADD: %s\n",
                        r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
                freeReplyObject(r);
                return 1;
            }
            if (first[0] == '\0') snprintf(first, sizeof first, "%s", r->str);
            snprintf(last, sizeof last, "%s", r->str);
            freeReplyObject(r);
        }
        sent += n;
    }
    double secs = (double)(tp_now_ns() - t0) / 1e9;
    printf("{\"msg\":\"enqueued\",\"stream\":\"%s\",\"count\":%u,\"seconds\":%.3f,\"entries_per_s\":%.0f,"
           "\"first_id\":\"%s\",\"last_id\":\"%s\"}\n",
           stream, count, secs, secs > 0 ? count / secs : 0.0, first, last);
    redisFree(c);
    free(payload);
    return 0;
}
