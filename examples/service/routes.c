/*
 * routes.c -- the service's HTTP interface: its routes, their handlers and
 * the background tasks POST /tasks admits.
 *
 * The server (examples/common/httpd.c) reads and checks every request,
 * answers the probes (/healthz, /readyz) itself and hands every other
 * request to svc_dispatch, which runs it as one task on the connection pool
 * (`s->conns`): request handling is bounded by MAX_CONNS workers, apart from
 * the task pool, and a forced shutdown cancels it through tp_ctx_fd. Each
 * route lists the query parameters it takes (the server answers 400 for any
 * other: a typo must not pass as a default) and its methods (405, 501).
 *
 *   POST /tasks        only copies validated values into an entry of the task
 *                      table (tasks.h), which the pool owns from admission
 *                      to on_done, never the request or the connection;
 *                      ?priority= picks the task's lane (taskpool.h
 *                      section 14; SCHED, USER_WEIGHTS in main.c);
 *   GET/DELETE /tasks/{id}  read that table; DELETE calls tp_cancel and waits
 *                      (bounded) until the table shows where the cancel landed;
 *   GET /work          waits inside the request, until its client hangs up
 *                      or a forced shutdown cancels it;
 *   GET /stats, /metrics, /healthz, /readyz.
 *
 * During the drain the server answers every new request on its own thread
 * (x->on_loop): what would start work or wait answers 503 instead.
 *
 * To add a query parameter: its name in the route's list below, its parsing
 * in the handler. To add a route: a handler and a line in svc_routes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "service.h"

#define MAX_DELAY_NS     (30 * SVC_NS_PER_S) /* longest ?delay= and ?deadline= */
#define DEFAULT_DELAY_NS (100 * SVC_NS_PER_MS)
#define MAX_FAIL         100                /* largest ?fail= */
#define CANCEL_WAIT_NS   (2 * SVC_NS_PER_S) /* DELETE waits this long to see the cancel land */

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
    svc_log_int(&ev, "priority", t->priority);
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
    if (f == 0) out[0] = '\0';
    if (f < 0) return -1;
    return out[0] == '\0' || svc_user_name_ok(out, strlen(out)) ? 0 : -1;
}

/* ?priority=: absent -> 0; else exactly -2, -1, 0, 1 or 2. 0 or -1. */
static int get_priority(const http_request *req, int *out) {
    static const char *const names[] = {"-2", "-1", "0", "1", "2"};
    char v[8];
    int f = http_query_get(req->query, "priority", v, sizeof v);
    *out = 0;
    if (f == 0) return 0;
    for (int i = 0; f > 0 && i <= TP_PRIO_MAX - TP_PRIO_MIN; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = TP_PRIO_MIN + i;
            return 0;
        }
    return -1;
}

/* ?fail=N: 0..100, default 0. 0 or -1. */
static int get_fail(const http_request *req, unsigned *out) {
    char v[16];
    int f = http_query_get(req->query, "fail", v, sizeof v);
    *out = 0;
    if (f == 0) return 0;
    return f < 0 || svc_parse_uint(v, 0, MAX_FAIL, out) != 0 ? -1 : 0;
}

/* POST /tasks: admit a background task, answer 202 with its id. */
static void handle_tasks(httpd_exchange *x) {
    svc *s = x->app;
    const http_request *req = x->req;
    httpd_reply *r = &x->reply;
    const char *log_id = x->log_id;
    uint64_t delay, deadline_in;
    unsigned fail;
    int priority;
    char user[SVC_USER_MAX + 1];
    if (get_delay(req, &delay) != 0) {
        httpd_reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (get_user(req, user, sizeof user) != 0) {
        httpd_reply_error(r, 400, "user must be 1 to 64 characters of A-Z a-z 0-9 . _ @ -");
        return;
    }
    if (get_duration(req, "deadline", 0, &deadline_in) != 0) {
        httpd_reply_error(r, 400, "deadline must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (get_fail(req, &fail) != 0) {
        httpd_reply_error(r, 400, "fail must be a whole number from 0 to 100");
        return;
    }
    if (get_priority(req, &priority) != 0) {
        httpd_reply_error(r, 400, "priority must be -2, -1, 0, 1 or 2 (2 most urgent, below 0 background)");
        return;
    }
    if (x->draining) {
        httpd_reply_error(r, 503, "shutting down");
        return;
    }
    /* ?deadline=0 (or absent) means none; else it counts from now, queueing included. */
    uint64_t deadline = deadline_in != 0 ? tp_now_ns() + deadline_in : 0;
    svc_task_spec spec = {.delay_ns = delay,
                          .deadline_ns = deadline,
                          .fail_attempts = fail,
                          .priority = priority,
                          .log_id = log_id,
                          .user = user};
    svc_task *t = svc_tasks_reserve(&s->table, s, &spec);
    if (t == NULL) {
        httpd_reply_error(r, 503, "task table full");
        return;
    }
    tp_task_opts opts = {
        .user = user, .on_done = task_done, .log_id = log_id, .deadline_ns = deadline, .priority = priority};
    uint64_t id = 0;
    int rc = tp_submit(s->tasks, run_task, t, &opts, &id);
    /* On TP_OK the pool owns t until on_done (which may already have run);
     * on a refusal t is ours and goes back to the table. */
    svc_tasks_submitted(&s->table, t, rc, id);
    switch (rc) {
    case TP_OK: {
        httpd_reply_json(r, 202, "{\"id\":%llu}\n", (unsigned long long)id);
        snprintf(r->extra, sizeof r->extra, "Location: /tasks/%llu\r\n", (unsigned long long)id);
        svc_log ev;
        svc_log_begin(&ev, "info", "task_accepted");
        svc_log_uint(&ev, "task_id", id);
        svc_log_str(&ev, "log_id", log_id);
        svc_log_str(&ev, "user", user[0] != '\0' ? user : NULL);
        svc_log_int(&ev, "priority", priority);
        svc_log_uint(&ev, "delay_ms", delay / SVC_NS_PER_MS);
        svc_log_end(&ev);
        return;
    }
    case TP_EFULL: httpd_reply_error(r, 503, "queue is full"); break;
    case TP_ECLOSED: httpd_reply_error(r, 503, "shutting down"); break;
    case TP_EUSERLIMIT: httpd_reply_error(r, 429, "too many unfinished tasks for this user"); break;
    case TP_ENOMEM: httpd_reply_error(r, 503, "out of memory"); break;
    default: httpd_reply_error(r, 500, tp_err_name(rc)); break;
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

static void reply_task(httpd_reply *r, int status, const svc_task_view *v) {
    int final = svc_task_state_final(v->state);
    char st[48] = "null", wait[24] = "null";
    if (final || v->state == SVC_TASK_RETRYING)
        snprintf(st, sizeof st, "\"%s\"", svc_task_status_name(v->status));
    if (v->started) snprintf(wait, sizeof wait, "%llu", (unsigned long long)(v->wait_ns / SVC_NS_PER_MS));
    /* log_id and user are validated to JSON-safe characters on the way in. */
    httpd_reply_json(
        r, status,
        "{\"id\":%llu,\"state\":\"%s\",\"finished\":%s,\"status\":%s,\"attempts\":%u,"
        "\"cancel_requested\":%s,\"priority\":%d,\"delay_ms\":%llu,\"age_ms\":%llu,\"wait_ms\":%s,"
        "\"started_ahead\":%llu,\"log_id\":\"%s\",\"user\":%s%s%s}\n",
        (unsigned long long)v->id, svc_task_state_name(v->state), final ? "true" : "false", st, v->attempts,
        v->cancel_requested ? "true" : "false", v->priority,
        (unsigned long long)(v->delay_ns / SVC_NS_PER_MS), (unsigned long long)(v->age_ns / SVC_NS_PER_MS),
        wait, (unsigned long long)v->started_ahead, v->log_id, v->user[0] != '\0' ? "\"" : "",
        v->user[0] != '\0' ? v->user : "null", v->user[0] != '\0' ? "\"" : "");
}

/* GET, HEAD and DELETE /tasks/{id}. */
static void handle_task(httpd_exchange *x) {
    svc *s = x->app;
    const http_request *req = x->req;
    httpd_reply *r = &x->reply;
    uint64_t id;
    if (parse_task_id(req->path + strlen("/tasks/"), &id) != 0) {
        httpd_reply_error(r, 400, "task id must be a positive decimal number");
        return;
    }
    svc_tasks *table = &s->table;
    svc_task_view v;
    if (strcmp(req->method, "DELETE") != 0) {
        if (!svc_tasks_get(table, id, &v))
            httpd_reply_error(r, 404, "no such task (never issued, or finished and forgotten)");
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
        httpd_reply_error(r, 404, "no such task (never issued, or finished and forgotten)");
        return;
    }
    if (svc_task_state_final(before.state)) {
        reply_task(r, 409, &before);
        return;
    }
    int rc = tp_cancel(s->tasks, id);
    if (!svc_tasks_wait_settled(table, id, &before, tp_now_ns() + CANCEL_WAIT_NS, &v)) {
        httpd_reply_error(r, 404, "no such task (finished and forgotten)");
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
    svc_log_str(&ev, "log_id", x->log_id);
    svc_log_str(&ev, "result", tp_err_name(rc));
    svc_log_str(&ev, "was", svc_task_state_name(before.state));
    svc_log_str(&ev, "now", svc_task_state_name(v.state));
    svc_log_int(&ev, "http_status", status);
    svc_log_end(&ev);
}

/* The client's end of input (POLLRDHUP): 1 if it is gone, 0 if it only
 * half-closed and may still read the answer. A reset shows as an error of
 * recv(); a FIN as 0 bytes, which is all a client that closed its socket
 * (gone) and one that only ended its output (nc -N) send. To tell them
 * apart, an HTTP/1.1 client is sent an interim "100 Continue", which every
 * HTTP/1.1 client must accept before the answer (RFC 9110 section 15.2): a
 * closed socket answers it with a reset, seen as POLLERR/POLLHUP by the next
 * poll(). An HTTP/1.0 client may not be sent one: its answer is written and
 * dropped by the kernel if it is gone (the delay is bounded anyway). */
static int client_gone_at_eof(httpd_exchange *x) {
    char b;
    ssize_t n = recv(x->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1; /* a reset */
    if (x->req->minor < 1) return 0;
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ssize_t w = send(x->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w != (ssize_t)(sizeof cont - 1); /* EPIPE, ECONNRESET; a full buffer cannot be, at the start */
}

/* GET /work: wait inside the request. Stops early when the client hangs up
 * (a reset, POLLHUP/POLLERR on its socket, or its end of input after which
 * it is found gone: client_gone_at_eof; no answer, logged as 499) or when a
 * forced shutdown cancels the connection (503). A client that only
 * half-closed (shutdown(SHUT_WR) after its request, as nc -N does) is
 * answered, like on every other route. A drain lets a request in progress
 * finish; one that arrives during the drain gets 503. */
static void handle_work(httpd_exchange *x) {
    const http_request *req = x->req;
    httpd_reply *r = &x->reply;
    uint64_t delay;
    if (get_delay(req, &delay) != 0) {
        httpd_reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (x->on_loop) { /* during the drain: waiting here would hold up the server */
        httpd_reply_error(r, 503, "shutting down");
        return;
    }
    svc_log ev;
    svc_log_begin(&ev, "info", "work_started");
    svc_log_str(&ev, "log_id", x->log_id);
    svc_log_uint(&ev, "conn", x->conn_id);
    svc_log_uint(&ev, "delay_ms", delay / SVC_NS_PER_MS);
    svc_log_end(&ev);
    uint64_t end = tp_now_ns() + delay;
    short watch = POLLRDHUP; /* 0 after the client's end of input: POLLHUP and POLLERR are always reported */
    for (;;) {
        int timeout = poll_ms(end);
        if (timeout == 0) break;
        /* POLLRDHUP, not POLLIN: a pipelined next request is not a hang-up. */
        struct pollfd pf[2] = {{.fd = x->fd, .events = watch}, {.fd = x->cancel_fd, .events = POLLIN}};
        int n = poll(pf, 2, timeout);
        if (n < 0 && errno != EINTR) {
            r->status = 0;
            return;
        }
        if (n <= 0) continue;
        if (pf[1].revents & POLLIN) {
            httpd_reply_error(r, 503, "shutting down");
            r->keep_alive = 0;
            return;
        }
        if ((pf[0].revents & (POLLHUP | POLLERR)) || ((pf[0].revents & POLLRDHUP) && client_gone_at_eof(x))) {
            r->status = 0; /* the client is gone: nobody to answer */
            return;
        }
        if (pf[0].revents & POLLRDHUP) watch = 0; /* a half-close: answer it */
    }
    httpd_reply_json(r, 200, "{\"status\":\"done\",\"delay_ms\":%llu}\n",
                     (unsigned long long)(delay / SVC_NS_PER_MS));
}

static void handle_stats(httpd_exchange *x) {
    svc *s = x->app;
    httpd_reply *r = &x->reply;
    tp_stats st;
    tp_stats_get(s->tasks, &st);
    int n = tp_stats_format(&st, TP_FORMAT_JSON, r->body, sizeof r->body - 1);
    if (n < 0 || (size_t)n >= sizeof r->body - 1) {
        httpd_reply_error(r, 500, "stats do not fit");
        return;
    }
    r->body[n] = '\n';
    r->len = (size_t)n + 1;
    r->status = 200;
    r->ctype = "application/json";
}

/* GET /metrics. All of the Prometheus text is written here (one place to
 * change when it moves to tp_metrics_format). */
static void handle_metrics(httpd_exchange *x) {
    svc *s = x->app;
    httpd_reply *r = &x->reply;
    /* Both pools in one document (tp_metrics_format: pool="task" and
     * pool="conn" labels, capacity gauges, latency histograms, the priority
     * lanes' taskpool_lane_* families, taskpool_oldest_wait_seconds), then the
     * service's own gauges. The document outgrows the fixed body, so it goes
     * on the heap; counters may grow between sizing and writing, so the
     * buffer gets slack and the call is repeated if it still fell short. */
    tp_pool *const pools[2] = {s->tasks, s->conns};
    char own[512];
    int m = snprintf(own, sizeof own,
                     "# HELP service_open_connections Client connections open now.\n"
                     "# TYPE service_open_connections gauge\n"
                     "service_open_connections %u\n"
                     "# HELP service_draining 1 once shutdown has begun.\n"
                     "# TYPE service_draining gauge\n"
                     "service_draining %d\n",
                     httpd_open_conns(s->http), httpd_draining(s->http));
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
    httpd_reply_error(r, 500, "metrics could not be written");
}

/* GET /healthz (liveness) and GET /readyz (readiness): 200, or 503 once the
 * drain has begun, so that a load balancer stops sending new work while
 * requests and tasks in progress finish. */
static void handle_health(httpd_exchange *x) {
    httpd_reply *r = &x->reply;
    int ready = strcmp(x->req->path, "/readyz") == 0;
    if (x->draining)
        httpd_reply_error(r, 503, "draining");
    else
        httpd_reply_json(r, 200, "{\"status\":\"%s\"}\n", ready ? "ready" : "ok");
}

static const char *const no_params[] = {NULL};
static const char *const task_params[] = {"delay", "user", "deadline", "fail", "priority", NULL};
static const char *const work_params[] = {"delay", NULL};

/* The routes. A path ending in '/' matches that prefix followed by one
 * segment. Every GET route also answers HEAD. */
const httpd_route svc_routes[] = {
    {"/tasks", "POST", task_params, handle_tasks, 0},
    {"/tasks/", "GET DELETE", no_params, handle_task, 0},
    {"/work", "GET", work_params, handle_work, 0},
    {"/stats", "GET", no_params, handle_stats, 0},
    {"/metrics", "GET", no_params, handle_metrics, 0},
    {"/healthz", "GET", no_params, handle_health, HTTPD_PROBE},
    {"/readyz", "GET", no_params, handle_health, HTTPD_PROBE},
};
const size_t svc_nroutes = sizeof svc_routes / sizeof svc_routes[0];

/* ------------------------------------------------------------ the connection pool */

static int request_task(tp_ctx *ctx, void *arg) {
    /* tp_ctx_fd turns readable when a forced shutdown cancels the request;
     * negative if none could be made, which poll() ignores. */
    httpd_exchange_run(arg, tp_ctx_fd(ctx));
    return 0;
}

/* Exactly once per request task, also one the pool dropped unrun. */
static void request_done(void *arg, int status) {
    (void)status;
    httpd_exchange_done(arg);
}

int svc_dispatch(void *app, httpd_exchange *x) {
    svc *s = app;
    tp_task_opts opts = {.on_done = request_done, .log_id = x->log_id};
    return tp_submit(s->conns, request_task, x, &opts, NULL) == TP_OK ? 0 : -1;
}
