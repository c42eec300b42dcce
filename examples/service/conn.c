/*
 * conn.c -- one connection: read requests, route them, answer, repeat.
 *
 * Each accepted connection is one task on the connection pool (`s->conns`),
 * so connection handling is bounded by MAX_CONNS workers, separate from the
 * task pool. The task loops over requests on its keep-alive connection:
 *
 *   read a head  -- poll() on the socket, the pool's cancellation descriptor
 *                   (tp_ctx_fd: turns readable when a forced shutdown cancels
 *                   the connection) and, while idle, the drain descriptor.
 *                   A fresh connection has HEADER_TIMEOUT to send its first
 *                   head; between requests it may idle for IDLE_TIMEOUT, and
 *                   once a head has begun it must be complete within
 *                   HEADER_TIMEOUT (else 408 and close). A head over
 *                   HTTP_HEAD_MAX bytes gets 431 and close.
 *   skip a body  -- the service takes no request bodies, but a small one is
 *                   read and dropped so that keep-alive stays in step.
 *   check        -- an HTTP/1.1 request needs exactly one Host (else 400 and
 *                   close); each route lists the query parameters it takes
 *                   and answers 400 for any other (a typo must not pass as a
 *                   default); every GET route answers HEAD.
 *   route        -- the handlers below; POST /tasks only copies validated
 *                   values into an entry of the task table (tasks.h), which
 *                   the pool owns from admission to on_done, never the
 *                   request or the connection. GET/DELETE /tasks/{id} read
 *                   that table; DELETE calls tp_cancel and waits (bounded)
 *                   until the table shows where the cancel landed.
 *   answer       -- one send of head + body (head only for HEAD), bounded by
 *                   a write deadline.
 *
 * Shutdown: once `draining` is set, an idle connection closes at once, a
 * request in progress runs to its end and is answered with Connection: close.
 * If the budget runs out, the pool cancels the connection task: waits end,
 * GET /work answers 503, and the connection closes. The socket is closed by
 * the task's on_done, which runs exactly once whatever happened, also for a
 * connection the pool dropped before it ran. Connections accepted during the
 * drain never reach the (closing) connection pool: the main thread serves
 * their one request itself (svc_conn_serve_draining, `probe` set), so
 * /readyz can say 503 instead of the connection being refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"
#include "log.h"
#include "service.h"

#define WRITE_TIMEOUT_NS (10 * SVC_NS_PER_S) /* to deliver one response */
#define MAX_DELAY_NS     (30 * SVC_NS_PER_S) /* longest ?delay= and ?deadline= */
#define DEFAULT_DELAY_NS (100 * SVC_NS_PER_MS)
#define MAX_FAIL         100                /* largest ?fail= */
#define CANCEL_WAIT_NS   (2 * SVC_NS_PER_S) /* DELETE waits this long to see the cancel land */
#define PROBE_HEAD_NS    SVC_NS_PER_S       /* head timeout of a connection served while draining */
#define BODY_CAP         8192               /* largest response body (metrics) */

typedef struct conn {
    svc *s;
    int fd;
    int probe; /* accepted during the drain, served by the main thread */
    uint64_t id;
    uint64_t opened_ns;
    uint64_t head_timeout_ns;
    char peer[64];
    size_t len;              /* bytes in buf not yet consumed */
    char buf[HTTP_HEAD_MAX]; /* request head (plus whatever followed it) */
} conn;

static uint64_t ms_since(uint64_t t0) { return (tp_now_ns() - t0) / SVC_NS_PER_MS; }

/* poll() timeout in ms until deadline, at least 1 ms while time remains,
 * capped at 1 s so a missed wake-up can never stall for long. */
static int poll_ms(uint64_t deadline) {
    uint64_t now = tp_now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + SVC_NS_PER_MS - 1) / SVC_NS_PER_MS;
    return ms > 1000 ? 1000 : (int)ms;
}

/* ------------------------------------------------------------ background tasks */

/* The task's argument is its entry in the task table (tasks.h): plain values
 * copied from the request, owned by the pool from admission to on_done. */
static int run_task(tp_ctx *ctx, void *arg) {
    svc_task *t = arg;
    svc *s = t->owner;
    uint64_t id = tp_ctx_id(ctx);
    unsigned attempt = tp_ctx_attempt(ctx);
    svc_tasks_started(&s->table, t, id, attempt);
    svc_log ev;
    svc_log_begin(&ev, "info", "task_started");
    svc_log_uint(&ev, "task_id", id);
    svc_log_str(&ev, "log_id", tp_ctx_log_id(ctx));
    svc_log_uint(&ev, "attempt", attempt);
    svc_log_uint(&ev, "queued_ms", ms_since(t->accepted_ns));
    svc_log_end(&ev);
    /* Returns early with TP_ECANCELED (DELETE, forced shutdown) or
     * TP_ETIMEDOUT (TASK_TIMEOUT, ?deadline=), which the pool counts as
     * cancelled. */
    int rc = tp_ctx_sleep(ctx, t->delay_ns);
    if (rc == 0 && attempt < t->fail_attempts) rc = SVC_TASK_EFAIL;
    /* The pool runs it again unless this was the last attempt, or it was
     * cancelled, or its deadline passed (tp_ctx_err says TP_ETIMEDOUT then,
     * as for a run timeout, which is retried: check the deadline itself). */
    int will_retry = rc != 0 && attempt < s->cfg.task_retries && tp_ctx_err(ctx) != TP_ECANCELED &&
                     (t->deadline_ns == 0 || tp_now_ns() < t->deadline_ns);
    svc_tasks_attempt_ended(&s->table, t, rc, will_retry);
    return rc;
}

/* Exactly once per accepted task, whatever its outcome: record and log it.
 * The entry stays in the table (it is recycled later, oldest first). */
static void task_done(void *arg, int status) {
    svc_task *t = arg;
    svc *s = t->owner;
    svc_task_view v;
    svc_tasks_done(&s->table, t, status, &v);
    svc_log ev;
    svc_log_begin(&ev, status == 0 ? "info" : "warn", "task_finished");
    if (v.id != 0) svc_log_uint(&ev, "task_id", v.id);
    svc_log_str(&ev, "log_id", v.log_id);
    svc_log_str(&ev, "state", svc_task_state_name(v.state));
    svc_log_str(&ev, "status", svc_task_status_name(status));
    svc_log_str(&ev, "ran", v.attempts > 0 ? "yes" : "no");
    svc_log_uint(&ev, "attempts", v.attempts);
    svc_log_uint(&ev, "ms", v.age_ns / SVC_NS_PER_MS);
    svc_log_end(&ev);
}

/* ------------------------------------------------------------ handlers */

typedef struct reply {
    int status; /* 0: send nothing (the client is gone) */
    int keep_alive;
    int head_only; /* HEAD: headers of the GET answer, no body */
    const char *ctype;
    char extra[128]; /* extra header lines */
    size_t len;
    char body[BODY_CAP];
    char *big; /* a larger body on the heap (/metrics), or NULL; send_reply frees it */
} reply;

static void reply_json(reply *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void reply_json(reply *r, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->body, sizeof r->body, fmt, ap);
    va_end(ap);
    r->status = status;
    r->ctype = "application/json";
    r->len = n < 0 ? 0 : (size_t)n >= sizeof r->body ? sizeof r->body - 1 : (size_t)n;
}

static void reply_error(reply *r, int status, const char *msg) {
    reply_json(r, status, "{\"error\":\"%s\"}\n", msg);
    if (status == 503 || status == 429) snprintf(r->extra, sizeof r->extra, "Retry-After: 1\r\n");
}

/* A duration parameter: `def` when absent, else 0..30 s. 0 or -1 (bad). */
static int get_duration(const http_request *req, const char *name, uint64_t def, uint64_t *out) {
    char v[64];
    int f = http_query_get(req->query, name, v, sizeof v);
    if (f == 0) {
        *out = def;
        return 0;
    }
    if (f < 0 || svc_parse_duration(v, out) != 0 || *out > MAX_DELAY_NS) return -1;
    return 0;
}

static int get_delay(const http_request *req, uint64_t *out) {
    return get_duration(req, "delay", DEFAULT_DELAY_NS, out);
}

/* ?user=: absent or empty -> none; else 1..64 of [A-Za-z0-9._@-]. */
static int get_user(const http_request *req, char *out, size_t cap) {
    int f = http_query_get(req->query, "user", out, cap);
    if (f == 0) {
        out[0] = '\0';
        return 0;
    }
    if (f < 0) return -1;
    for (const char *p = out; *p != '\0'; p++) {
        char ch = *p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '@' || ch == '-'))
            return -1;
    }
    return 0;
}

/* ?fail=N: 0..100, default 0. 0 or -1. */
static int get_fail(const http_request *req, unsigned *out) {
    char v[16];
    int f = http_query_get(req->query, "fail", v, sizeof v);
    *out = 0;
    if (f == 0) return 0;
    return f < 0 || svc_parse_uint(v, 0, MAX_FAIL, out) != 0 ? -1 : 0;
}

typedef void handler_fn(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r);

/* POST /tasks: admit a background task, answer 202 with its id. */
static void handle_tasks(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    (void)cancel_fd;
    uint64_t delay, deadline_in;
    unsigned fail;
    char user[SVC_USER_MAX + 1];
    if (get_delay(req, &delay) != 0) {
        reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (get_user(req, user, sizeof user) != 0) {
        reply_error(r, 400, "user must be 1 to 64 characters of A-Z a-z 0-9 . _ @ -");
        return;
    }
    if (get_duration(req, "deadline", 0, &deadline_in) != 0) {
        reply_error(r, 400, "deadline must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (get_fail(req, &fail) != 0) {
        reply_error(r, 400, "fail must be a whole number from 0 to 100");
        return;
    }
    if (atomic_load(&c->s->draining)) {
        reply_error(r, 503, "shutting down");
        return;
    }
    /* ?deadline=0 (or absent) means none; else it counts from now, queueing included. */
    uint64_t deadline = deadline_in != 0 ? tp_now_ns() + deadline_in : 0;
    svc_task *t = svc_tasks_reserve(&c->s->table, c->s, delay, deadline, fail, log_id, user);
    if (t == NULL) {
        reply_error(r, 503, "task table full");
        return;
    }
    tp_task_opts opts = {.user = user, .on_done = task_done, .log_id = log_id, .deadline_ns = deadline};
    uint64_t id = 0;
    int rc = tp_submit(c->s->tasks, run_task, t, &opts, &id);
    /* On TP_OK the pool owns t until on_done (which may already have run);
     * on a refusal t is ours and goes back to the table. */
    svc_tasks_submitted(&c->s->table, t, rc, id);
    switch (rc) {
    case TP_OK: {
        reply_json(r, 202, "{\"id\":%llu}\n", (unsigned long long)id);
        snprintf(r->extra, sizeof r->extra, "Location: /tasks/%llu\r\n", (unsigned long long)id);
        svc_log ev;
        svc_log_begin(&ev, "info", "task_accepted");
        svc_log_uint(&ev, "task_id", id);
        svc_log_str(&ev, "log_id", log_id);
        svc_log_str(&ev, "user", user[0] != '\0' ? user : NULL);
        svc_log_uint(&ev, "delay_ms", delay / SVC_NS_PER_MS);
        svc_log_end(&ev);
        return;
    }
    case TP_EFULL: reply_error(r, 503, "queue is full"); break;
    case TP_ECLOSED: reply_error(r, 503, "shutting down"); break;
    case TP_EUSERLIMIT: reply_error(r, 429, "too many unfinished tasks for this user"); break;
    case TP_ENOMEM: reply_error(r, 503, "out of memory"); break;
    default: reply_error(r, 500, tp_err_name(rc)); break;
    }
}

/* The id in /tasks/{id}: canonical decimal, 1..UINT64_MAX. 0 or -1. */
static int parse_task_id(const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (*s < '1' || *s > '9') return -1; /* empty, 0, a leading zero or sign */
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9') return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static void reply_task(reply *r, int status, const svc_task_view *v) {
    int final = svc_task_state_final(v->state);
    char st[48] = "null";
    if (final || v->state == SVC_TASK_RETRYING)
        snprintf(st, sizeof st, "\"%s\"", svc_task_status_name(v->status));
    /* log_id and user are validated to JSON-safe characters on the way in. */
    reply_json(r, status,
               "{\"id\":%llu,\"state\":\"%s\",\"finished\":%s,\"status\":%s,\"attempts\":%u,"
               "\"cancel_requested\":%s,\"delay_ms\":%llu,\"age_ms\":%llu,\"log_id\":\"%s\","
               "\"user\":%s%s%s}\n",
               (unsigned long long)v->id, svc_task_state_name(v->state), final ? "true" : "false", st,
               v->attempts, v->cancel_requested ? "true" : "false",
               (unsigned long long)(v->delay_ns / SVC_NS_PER_MS),
               (unsigned long long)(v->age_ns / SVC_NS_PER_MS), v->log_id, v->user[0] != '\0' ? "\"" : "",
               v->user[0] != '\0' ? v->user : "null", v->user[0] != '\0' ? "\"" : "");
}

/* GET, HEAD and DELETE /tasks/{id}. */
static void handle_task(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    (void)cancel_fd;
    uint64_t id;
    if (parse_task_id(req->path + strlen("/tasks/"), &id) != 0) {
        reply_error(r, 400, "task id must be a positive decimal number");
        return;
    }
    svc_tasks *table = &c->s->table;
    svc_task_view v;
    if (strcmp(req->method, "DELETE") != 0) {
        if (!svc_tasks_get(table, id, &v))
            reply_error(r, 404, "no such task (never issued, or finished and forgotten)");
        else
            reply_task(r, 200, &v);
        return;
    }
    /* DELETE: tp_cancel, then wait (bounded) until the cancel has visibly
     * reached the task, so that the answer says what it did:
     *   200  the task was queued (or waiting for a retry) and ended unrun;
     *   202  the cancel was delivered to a running attempt, which stops at
     *        its next tp_ctx_sleep (the body shows the state so far);
     *   409  it had already finished (the body shows the outcome). */
    svc_task_view before;
    if (!svc_tasks_mark_cancel(table, id, &before)) {
        reply_error(r, 404, "no such task (never issued, or finished and forgotten)");
        return;
    }
    if (svc_task_state_final(before.state)) {
        reply_task(r, 409, &before);
        return;
    }
    int rc = tp_cancel(c->s->tasks, id);
    if (!svc_tasks_wait_settled(table, id, &before, tp_now_ns() + CANCEL_WAIT_NS, &v)) {
        reply_error(r, 404, "no such task (finished and forgotten)");
        return;
    }
    int status;
    if (rc != TP_OK)
        status = 409; /* TP_ENOTFOUND: it ended on its own (or was already cancelled) */
    else if (svc_task_state_final(v.state) && v.attempts == before.attempts &&
             before.state != SVC_TASK_RUNNING)
        status = 200;
    else
        status = 202;
    reply_task(r, status, &v);
    svc_log ev;
    svc_log_begin(&ev, "info", "task_cancel");
    svc_log_uint(&ev, "task_id", id);
    svc_log_str(&ev, "log_id", log_id);
    svc_log_str(&ev, "result", tp_err_name(rc));
    svc_log_str(&ev, "was", svc_task_state_name(before.state));
    svc_log_str(&ev, "now", svc_task_state_name(v.state));
    svc_log_int(&ev, "http_status", status);
    svc_log_end(&ev);
}

/* GET /work: wait inside the request. Stops early when the client hangs up
 * (POLLRDHUP/POLLHUP/POLLERR on its socket: no answer, logged as 499) or when
 * a forced shutdown cancels the connection (503). A drain lets a request in
 * progress finish; one that arrives during the drain gets 503. */
static void handle_work(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    uint64_t delay;
    if (get_delay(req, &delay) != 0) {
        reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (c->probe) {
        reply_error(r, 503, "shutting down");
        return;
    }
    svc_log ev;
    svc_log_begin(&ev, "info", "work_started");
    svc_log_str(&ev, "log_id", log_id);
    svc_log_uint(&ev, "conn", c->id);
    svc_log_uint(&ev, "delay_ms", delay / SVC_NS_PER_MS);
    svc_log_end(&ev);
    uint64_t end = tp_now_ns() + delay;
    for (;;) {
        int timeout = poll_ms(end);
        if (timeout == 0) break;
        /* POLLRDHUP, not POLLIN: a pipelined next request is not a hang-up. */
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLRDHUP}, {.fd = cancel_fd, .events = POLLIN}};
        int n = poll(pf, 2, timeout);
        if (n < 0 && errno != EINTR) {
            r->status = 0;
            return;
        }
        if (n <= 0) continue;
        if (pf[1].revents & POLLIN) {
            reply_error(r, 503, "shutting down");
            r->keep_alive = 0;
            return;
        }
        if (pf[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            r->status = 0; /* the client is gone: nobody to answer */
            return;
        }
    }
    reply_json(r, 200, "{\"status\":\"done\",\"delay_ms\":%llu}\n",
               (unsigned long long)(delay / SVC_NS_PER_MS));
}

static void handle_stats(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    (void)cancel_fd, (void)req, (void)log_id;
    tp_stats st;
    tp_stats_get(c->s->tasks, &st);
    int n = tp_stats_format(&st, TP_FORMAT_JSON, r->body, sizeof r->body - 1);
    if (n < 0 || (size_t)n >= sizeof r->body - 1) {
        reply_error(r, 500, "stats do not fit");
        return;
    }
    r->body[n] = '\n';
    r->len = (size_t)n + 1;
    r->status = 200;
    r->ctype = "application/json";
}

/* GET /metrics. All of the Prometheus text is written here (one place to
 * change when it moves to tp_metrics_format). */
static void handle_metrics(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    (void)cancel_fd, (void)req, (void)log_id;
    /* Both pools in one document (tp_metrics_format: pool="task" and
     * pool="conn" labels, capacity gauges, latency histograms), then the
     * service's own gauges. The document outgrows the fixed body, so it goes
     * on the heap; counters may grow between sizing and writing, so the
     * buffer gets slack and the call is repeated if it still fell short. */
    tp_pool *const pools[2] = {c->s->tasks, c->s->conns};
    char own[512];
    int m = snprintf(own, sizeof own,
                     "# HELP service_open_connections Client connections open now.\n"
                     "# TYPE service_open_connections gauge\n"
                     "service_open_connections %u\n"
                     "# HELP service_draining 1 once shutdown has begun.\n"
                     "# TYPE service_draining gauge\n"
                     "service_draining %d\n",
                     atomic_load(&c->s->open_conns), atomic_load(&c->s->draining));
    int need = tp_metrics_format(pools, 2, TP_FORMAT_PROMETHEUS, NULL, 0);
    for (int tries = 0; need >= 0 && m >= 0 && (size_t)m < sizeof own && tries < 4; tries++) {
        size_t cap = (size_t)need + 4096 + (size_t)m + 1;
        char *buf = malloc(cap);
        if (buf == NULL) break;
        int n = tp_metrics_format(pools, 2, TP_FORMAT_PROMETHEUS, buf, cap - (size_t)m);
        if (n >= 0 && (size_t)n < cap - (size_t)m) {
            memcpy(buf + n, own, (size_t)m + 1);
            r->big = buf;
            r->len = (size_t)n + (size_t)m;
            r->status = 200;
            r->ctype = "text/plain; version=0.0.4; charset=utf-8";
            return;
        }
        free(buf);
        need = n;
    }
    reply_error(r, 500, "metrics could not be written");
}

/* GET /healthz (liveness) and GET /readyz (readiness): 200, or 503 once the
 * drain has begun, so that a load balancer stops sending new work while
 * requests and tasks in progress finish. */
static void handle_health(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    (void)cancel_fd, (void)log_id;
    int ready = strcmp(req->path, "/readyz") == 0;
    if (atomic_load(&c->s->draining))
        reply_error(r, 503, "draining");
    else
        reply_json(r, 200, "{\"status\":\"%s\"}\n", ready ? "ready" : "ok");
}

static const char *const no_params[] = {NULL};
static const char *const task_params[] = {"delay", "user", "deadline", "fail", NULL};
static const char *const work_params[] = {"delay", NULL};

/* The routes. A path ending in '/' matches that prefix followed by one
 * segment. Every GET route also answers HEAD. */
static const struct route {
    const char *path;
    const char *methods;       /* space-separated, HEAD implied by GET */
    const char *allow;         /* the Allow header of a 405 */
    const char *const *params; /* the query parameters it accepts */
    handler_fn *fn;
} routes[] = {
    {"/tasks", "POST", "POST", task_params, handle_tasks},
    {"/tasks/", "GET DELETE", "GET, HEAD, DELETE", no_params, handle_task},
    {"/work", "GET", "GET, HEAD", work_params, handle_work},
    {"/stats", "GET", "GET, HEAD", no_params, handle_stats},
    {"/metrics", "GET", "GET, HEAD", no_params, handle_metrics},
    {"/healthz", "GET", "GET, HEAD", no_params, handle_health},
    {"/readyz", "GET", "GET, HEAD", no_params, handle_health},
};

static int route_matches(const struct route *rt, const char *path) {
    size_t n = strlen(rt->path);
    if (rt->path[n - 1] != '/') return strcmp(path, rt->path) == 0;
    return strncmp(path, rt->path, n) == 0 && strchr(path + n, '/') == NULL;
}

static int method_allowed(const struct route *rt, const char *method) {
    const char *m = strcmp(method, "HEAD") == 0 ? "GET" : method;
    size_t n = strlen(m);
    for (const char *p = rt->methods; *p != '\0'; p += strcspn(p, " "), p += *p == ' ')
        if (strncmp(p, m, n) == 0 && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

static void route(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    const struct route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && rt == NULL; i++)
        if (route_matches(&routes[i], req->path)) rt = &routes[i];
    if (rt == NULL) {
        reply_error(r, 404, "not found");
        return;
    }
    if (!method_allowed(rt, req->method)) {
        reply_error(r, 405, "method not allowed");
        snprintf(r->extra, sizeof r->extra, "Allow: %s\r\n", rt->allow);
        return;
    }
    char bad[40], msg[96];
    if (http_query_check(req->query, rt->params, bad, sizeof bad) != 0) {
        /* The name goes into JSON: keep only characters that need no escape. */
        for (char *p = bad; *p != '\0'; p++)
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
        snprintf(msg, sizeof msg, "unknown, repeated or empty query parameter '%s'", bad);
        reply_error(r, 400, msg);
        return;
    }
    rt->fn(c, cancel_fd, req, log_id, r);
}

/* ------------------------------------------------------------ connection I/O */

enum { HEAD_OK, HEAD_CLOSE, HEAD_TIMEOUT, HEAD_TOO_LARGE };

/* Read until c->buf holds a whole head. `first`: the connection's first
 * request, whose head must be complete HEADER_TIMEOUT after accept. */
static int read_head(conn *c, int cancel_fd, int first, size_t *head_len) {
    const svc_config *cfg = &c->s->cfg;
    uint64_t now = tp_now_ns();
    uint64_t idle_deadline = first ? c->opened_ns + c->head_timeout_ns : now + cfg->idle_timeout_ns;
    /* Bytes already here (pipelined) start the head clock now. */
    uint64_t head_deadline = first ? idle_deadline : now + c->head_timeout_ns;
    for (;;) {
        size_t h = http_head_length(c->buf, c->len);
        if (h != 0) {
            *head_len = h;
            return HEAD_OK;
        }
        if (c->len >= sizeof c->buf) return HEAD_TOO_LARGE;
        int idle = c->len == 0;
        /* Draining: an idle connection closes, except the probe connection
         * the drain accepted in order to answer (its one request). */
        if (idle && !c->probe && atomic_load(&c->s->draining)) return HEAD_CLOSE;
        uint64_t deadline = idle ? idle_deadline : head_deadline;
        int timeout = poll_ms(deadline);
        if (timeout == 0) return idle ? HEAD_CLOSE : HEAD_TIMEOUT;
        struct pollfd pf[3] = {
            {.fd = c->fd, .events = POLLIN},
            {.fd = cancel_fd, .events = POLLIN},
            {.fd = idle && !c->probe ? c->s->drain_fd : -1, .events = POLLIN},
        };
        int n = poll(pf, 3, timeout);
        if (n < 0 && errno != EINTR) return HEAD_CLOSE;
        if (n <= 0) continue;
        if (pf[1].revents & POLLIN) return HEAD_CLOSE; /* forced shutdown */
        if (pf[0].revents == 0) continue;              /* the drain flag: checked at the top */
        ssize_t got = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (got > 0) {
            if (c->len == 0 && !first) head_deadline = tp_now_ns() + c->head_timeout_ns;
            c->len += (size_t)got;
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
            return HEAD_CLOSE; /* EOF or error */
        }
    }
}

/* Drop `n` body bytes: those already in the buffer after the head, then read
 * (never past the body, so a pipelined request stays in the socket). On
 * return c->buf holds only what follows the body. 0, or -1 (close). */
static int skip_body(conn *c, int cancel_fd, size_t head_len, uint64_t n) {
    size_t have = c->len - head_len;
    size_t take = n < have ? (size_t)n : have;
    memmove(c->buf, c->buf + head_len + take, have - take);
    c->len = have - take;
    n -= take;
    uint64_t deadline = tp_now_ns() + c->head_timeout_ns;
    char scratch[4096];
    while (n > 0) {
        int timeout = poll_ms(deadline);
        if (timeout == 0) return -1;
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = cancel_fd, .events = POLLIN}};
        int r = poll(pf, 2, timeout);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        if (pf[1].revents & POLLIN) return -1;
        ssize_t got = recv(c->fd, scratch, n < sizeof scratch ? (size_t)n : sizeof scratch, 0);
        if (got > 0)
            n -= (uint64_t)got;
        else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
            return -1;
    }
    return 0;
}

static void log_request(const conn *c, const char *method, const char *path, int status, uint64_t t0,
                        const char *log_id) {
    svc_log ev;
    svc_log_begin(&ev, status >= 500 ? "warn" : "info", "request");
    svc_log_uint(&ev, "conn", c->id);
    svc_log_str(&ev, "peer", c->peer);
    svc_log_str(&ev, "method", method);
    svc_log_str(&ev, "path", path);
    svc_log_int(&ev, "status", status);
    svc_log_uint(&ev, "ms", ms_since(t0));
    svc_log_str(&ev, "log_id", log_id);
    svc_log_end(&ev);
}

/* Send r (status != 0) on c. 0 or -1. */
static int send_reply(conn *c, int cancel_fd, reply *r, int minor, const char *log_id) {
    char out[BODY_CAP + 512];
    char extra[sizeof r->extra + HTTP_REQID_MAX + 64];
    snprintf(extra, sizeof extra, "%sX-Request-Id: %s\r\n", r->extra, log_id);
    /* A heap body is sent after the head, not copied into `out`. */
    const char *body = r->big != NULL ? r->big : r->body;
    size_t n = http_format_response(out, sizeof out, r->status, r->ctype, body, r->len, extra, r->keep_alive,
                                    minor, r->head_only || r->big != NULL);
    /* A probe is served on the main thread: keep its write short too. */
    uint64_t deadline = tp_now_ns() + (c->probe ? PROBE_HEAD_NS : WRITE_TIMEOUT_NS);
    int rc = n == 0 ? -1 : http_send_all(c->fd, out, n, deadline, cancel_fd);
    if (rc == 0 && r->big != NULL && !r->head_only)
        rc = http_send_all(c->fd, r->big, r->len, deadline, cancel_fd);
    free(r->big);
    r->big = NULL;
    return rc;
}

/* Answer a request we could not parse or accept, then close. */
static void refuse(conn *c, int cancel_fd, int status, const char *msg, uint64_t t0) {
    reply r = {.keep_alive = 0};
    reply_error(&r, status, msg);
    char log_id[32];
    snprintf(log_id, sizeof log_id, "req-%llu", (unsigned long long)atomic_fetch_add(&c->s->next_req, 1));
    (void)send_reply(c, cancel_fd, &r, 1, log_id);
    log_request(c, "-", "-", status, t0, log_id);
}

/* Read, route and answer one request on c. 1 to go on with the next
 * request on the same connection, 0 to close it. */
static int serve_one(conn *c, int cancel_fd, int first) {
    size_t head_len = 0;
    int h = read_head(c, cancel_fd, first, &head_len);
    uint64_t t0 = tp_now_ns();
    if (h == HEAD_CLOSE) return 0;
    if (h == HEAD_TIMEOUT) {
        refuse(c, cancel_fd, 408, "request head not received in time", t0);
        return 0;
    }
    if (h == HEAD_TOO_LARGE) {
        refuse(c, cancel_fd, 431, "request head over 16 KiB", t0);
        return 0;
    }
    http_request req;
    int bad = http_parse_head(c->buf, head_len, &req);
    if (bad != 0) {
        refuse(c, cancel_fd, bad, bad == 505 ? "HTTP/1.0 or HTTP/1.1 only" : "malformed request", t0);
        return 0;
    }
    char log_id[HTTP_REQID_MAX + 16];
    if (req.request_id != NULL)
        snprintf(log_id, sizeof log_id, "%s", req.request_id);
    else
        snprintf(log_id, sizeof log_id, "req-%llu", (unsigned long long)atomic_fetch_add(&c->s->next_req, 1));

    reply r = {.keep_alive = req.keep_alive, .head_only = strcmp(req.method, "HEAD") == 0};
    if (req.minor >= 1 && req.host_count != 1) {
        /* RFC 9112 section 3.2: exactly one Host in an HTTP/1.1 request. */
        reply_error(&r, 400, req.host_count == 0 ? "missing Host header" : "more than one Host header");
        r.keep_alive = 0;
    } else if (req.minor == 0 && req.host_count > 1) {
        reply_error(&r, 400, "more than one Host header");
        r.keep_alive = 0;
    } else if (req.chunked) {
        reply_error(&r, 501, "chunked request bodies are not supported");
        r.keep_alive = 0;
    } else if (req.content_length > HTTP_BODY_MAX) {
        reply_error(&r, 413, "request body over 64 KiB");
        r.keep_alive = 0;
    } else {
        route(c, cancel_fd, &req, log_id, &r);
    }
    if (atomic_load(&c->s->draining)) r.keep_alive = 0;
    if (r.status == 0) { /* the client hung up during /work */
        log_request(c, req.method, req.path, 499, t0, log_id);
        return 0;
    }
    int sent = send_reply(c, cancel_fd, &r, req.minor, log_id);
    log_request(c, req.method, req.path, r.status, t0, log_id);
    /* The parsed request points into c->buf: only now may it move. */
    return sent == 0 && r.keep_alive && skip_body(c, cancel_fd, head_len, req.content_length) == 0;
}

static int conn_task(tp_ctx *ctx, void *arg) {
    conn *c = arg;
    int cancel_fd = tp_ctx_fd(ctx); /* negative if none could be made: poll() ignores it */
    unsigned requests = 0;
    for (int first = 1; serve_one(c, cancel_fd, first); first = 0) requests++;
    svc_log ev;
    svc_log_begin(&ev, "debug", "connection_closed");
    svc_log_uint(&ev, "conn", c->id);
    svc_log_str(&ev, "peer", c->peer);
    svc_log_uint(&ev, "keep_alive_requests", requests);
    svc_log_uint(&ev, "ms", ms_since(c->opened_ns));
    svc_log_end(&ev);
    return 0;
}

void svc_conn_serve_draining(svc *s, int fd, const char *peer) {
    /* Only the main thread calls this, one connection at a time: one buffer. */
    static conn c;
    c.s = s;
    c.fd = fd;
    c.probe = 1;
    c.id = atomic_fetch_add(&s->next_conn, 1);
    c.opened_ns = tp_now_ns();
    c.head_timeout_ns = s->cfg.header_timeout_ns < PROBE_HEAD_NS ? s->cfg.header_timeout_ns : PROBE_HEAD_NS;
    c.len = 0;
    snprintf(c.peer, sizeof c.peer, "%s", peer);
    (void)serve_one(&c, -1, 1);
    close(fd);
}

/* Exactly once per connection task, also one the pool dropped unrun. */
static void conn_done(void *arg, int status) {
    (void)status;
    conn *c = arg;
    close(c->fd);
    atomic_fetch_sub(&c->s->open_conns, 1);
    free(c);
}

/* Best-effort 503 on a connection we will not serve, then close it. */
static void reject(int fd) {
    static const char resp[] = "HTTP/1.1 503 Service Unavailable\r\n"
                               "Content-Type: application/json\r\n"
                               "Content-Length: 33\r\n"
                               "Retry-After: 1\r\n"
                               "Connection: close\r\n"
                               "\r\n"
                               "{\"error\":\"too many connections\"}\n";
    (void)send(fd, resp, sizeof resp - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
}

void svc_conn_accept(svc *s, int fd, const char *peer) {
    uint64_t id = atomic_fetch_add(&s->next_conn, 1);
    const char *why = NULL;
    conn *c = NULL;
    if (atomic_fetch_add(&s->open_conns, 1) >= s->cfg.max_conns) {
        why = "connection limit";
    } else if ((c = malloc(sizeof *c)) == NULL) {
        why = "out of memory";
    } else {
        c->s = s;
        c->fd = fd;
        c->probe = 0;
        c->id = id;
        c->opened_ns = tp_now_ns();
        c->head_timeout_ns = s->cfg.header_timeout_ns;
        c->len = 0;
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        char log_id[32];
        snprintf(log_id, sizeof log_id, "conn-%llu", (unsigned long long)id);
        tp_task_opts opts = {.on_done = conn_done, .log_id = log_id};
        int rc = tp_submit(s->conns, conn_task, c, &opts, NULL);
        if (rc == TP_OK) return; /* c and fd belong to the connection task now */
        why = tp_err_name(rc);
        free(c);
    }
    atomic_fetch_sub(&s->open_conns, 1);
    reject(fd);
    svc_log ev;
    svc_log_begin(&ev, "warn", "connection_rejected");
    svc_log_uint(&ev, "conn", id);
    svc_log_str(&ev, "peer", peer);
    svc_log_str(&ev, "reason", why);
    svc_log_end(&ev);
}
