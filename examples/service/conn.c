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
 *   route        -- the handlers below; POST /tasks only copies validated
 *                   values into a small heap object owned by the task pool
 *                   from admission on (freed by its on_done), never the
 *                   request or the connection.
 *   answer       -- one send of head + body, bounded by a write deadline.
 *
 * Shutdown: once `draining` is set, an idle connection closes at once, a
 * request in progress runs to its end and is answered with Connection: close.
 * If the budget runs out, the pool cancels the connection task: waits end,
 * GET /work answers 503, and the connection closes. The socket is closed by
 * the task's on_done, which runs exactly once whatever happened, also for a
 * connection the pool dropped before it ran.
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

#define WRITE_TIMEOUT_NS (10 * SVC_NS_PER_S)  /* to deliver one response */
#define MAX_DELAY_NS     (30 * SVC_NS_PER_S)  /* longest ?delay= */
#define DEFAULT_DELAY_NS (100 * SVC_NS_PER_MS)
#define USER_MAX         64
#define BODY_CAP         8192                 /* largest response body (metrics) */

typedef struct conn {
    svc     *s;
    int      fd;
    uint64_t id;
    uint64_t opened_ns;
    char     peer[64];
    size_t   len;                /* bytes in buf not yet consumed */
    char     buf[HTTP_HEAD_MAX]; /* request head (plus whatever followed it) */
} conn;

/* A background task's argument: plain values only. */
typedef struct task {
    uint64_t delay_ns;
    uint64_t accepted_ns;
    uint64_t id; /* written by the task function when it runs; 0 if it never ran */
    char     log_id[HTTP_REQID_MAX + 16];
} task;

static uint64_t ms_since(uint64_t t0) { return (tp_now_ns() - t0) / SVC_NS_PER_MS; }

/* poll() timeout in ms until deadline, at least 1 ms while time remains,
 * capped at 1 s so a missed wake-up can never stall for long. */
static int poll_ms(uint64_t deadline) {
    uint64_t now = tp_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + SVC_NS_PER_MS - 1) / SVC_NS_PER_MS;
    return ms > 1000 ? 1000 : (int)ms;
}

/* ------------------------------------------------------------ background tasks */

static int run_task(tp_ctx *ctx, void *arg) {
    task *t = arg;
    t->id = tp_ctx_id(ctx);
    svc_log ev;
    svc_log_begin(&ev, "info", "task_started");
    svc_log_uint(&ev, "task_id", t->id);
    svc_log_str(&ev, "log_id", tp_ctx_log_id(ctx));
    svc_log_uint(&ev, "attempt", tp_ctx_attempt(ctx));
    svc_log_uint(&ev, "queued_ms", ms_since(t->accepted_ns));
    svc_log_end(&ev);
    /* Returns early with TP_ECANCELED (forced shutdown) or TP_ETIMEDOUT
     * (TASK_TIMEOUT), which the pool counts as cancelled. */
    return tp_ctx_sleep(ctx, t->delay_ns);
}

/* Exactly once per accepted task, whatever its outcome: log it, free it. */
static void task_done(void *arg, int status) {
    task *t = arg;
    svc_log ev;
    svc_log_begin(&ev, status == 0 ? "info" : "warn", "task_finished");
    if (t->id != 0)
        svc_log_uint(&ev, "task_id", t->id);
    svc_log_str(&ev, "log_id", t->log_id);
    svc_log_str(&ev, "status", tp_err_name(status));
    svc_log_str(&ev, "ran", t->id != 0 ? "yes" : "no");
    svc_log_uint(&ev, "ms", ms_since(t->accepted_ns));
    svc_log_end(&ev);
    free(t);
}

/* ------------------------------------------------------------ handlers */

typedef struct reply {
    int         status;      /* 0: send nothing (the client is gone) */
    int         keep_alive;
    const char *ctype;
    char        extra[128];  /* extra header lines */
    size_t      len;
    char        body[BODY_CAP];
} reply;

static void reply_json(reply *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

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
    if (status == 503 || status == 429)
        snprintf(r->extra, sizeof r->extra, "Retry-After: 1\r\n");
}

/* ?delay=: default 100 ms, else 0..30 s. 0 or -1 (bad). */
static int get_delay(const http_request *req, uint64_t *out) {
    char v[64];
    int f = http_query_get(req->query, "delay", v, sizeof v);
    if (f == 0) {
        *out = DEFAULT_DELAY_NS;
        return 0;
    }
    if (f < 0 || svc_parse_duration(v, out) != 0 || *out > MAX_DELAY_NS)
        return -1;
    return 0;
}

/* ?user=: absent or empty -> none; else 1..64 of [A-Za-z0-9._@-]. */
static int get_user(const http_request *req, char *out, size_t cap) {
    int f = http_query_get(req->query, "user", out, cap);
    if (f == 0) {
        out[0] = '\0';
        return 0;
    }
    if (f < 0)
        return -1;
    for (const char *p = out; *p != '\0'; p++) {
        char ch = *p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '@' || ch == '-'))
            return -1;
    }
    return 0;
}

static void handle_tasks(conn *c, const http_request *req, const char *log_id, reply *r) {
    uint64_t delay;
    char user[USER_MAX + 1];
    if (get_delay(req, &delay) != 0) {
        reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
        return;
    }
    if (get_user(req, user, sizeof user) != 0) {
        reply_error(r, 400, "user must be 1 to 64 characters of A-Z a-z 0-9 . _ @ -");
        return;
    }
    task *t = calloc(1, sizeof *t);
    if (t == NULL) {
        reply_error(r, 503, "out of memory");
        return;
    }
    t->delay_ns = delay;
    t->accepted_ns = tp_now_ns();
    snprintf(t->log_id, sizeof t->log_id, "%s", log_id);
    tp_task_opts opts = {.user = user, .on_done = task_done, .log_id = t->log_id};
    uint64_t id = 0;
    int rc = tp_submit(c->s->tasks, run_task, t, &opts, &id);
    /* From here on t belongs to the pool if rc == TP_OK: do not touch it. */
    switch (rc) {
    case TP_OK: {
        reply_json(r, 202, "{\"id\":%llu}\n", (unsigned long long)id);
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
    free(t); /* refused: still ours */
}

/* GET /work: wait inside the request. Stops early when the client hangs up
 * (POLLRDHUP/POLLHUP/POLLERR on its socket: no answer, logged as 499) or when
 * a forced shutdown cancels the connection (503). A drain lets it finish. */
static void handle_work(conn *c, int cancel_fd, const http_request *req, const char *log_id,
                        reply *r) {
    uint64_t delay;
    if (get_delay(req, &delay) != 0) {
        reply_error(r, 400, "delay must be a duration from 0 to 30s, like 250ms");
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
        if (timeout == 0)
            break;
        /* POLLRDHUP, not POLLIN: a pipelined next request is not a hang-up. */
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLRDHUP}, {.fd = cancel_fd, .events = POLLIN}};
        int n = poll(pf, 2, timeout);
        if (n < 0 && errno != EINTR) {
            r->status = 0;
            return;
        }
        if (n <= 0)
            continue;
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

static void handle_stats(conn *c, reply *r) {
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

static void handle_metrics(conn *c, reply *r) {
    tp_stats st;
    tp_stats_get(c->s->tasks, &st);
    int n = tp_stats_format(&st, TP_FORMAT_PROMETHEUS, r->body, sizeof r->body);
    if (n < 0 || (size_t)n >= sizeof r->body) {
        reply_error(r, 500, "metrics do not fit");
        return;
    }
    int m = snprintf(r->body + n, sizeof r->body - (size_t)n,
                     "# HELP service_open_connections Client connections open now.\n"
                     "# TYPE service_open_connections gauge\n"
                     "service_open_connections %u\n"
                     "# HELP service_draining 1 once shutdown has begun.\n"
                     "# TYPE service_draining gauge\n"
                     "service_draining %d\n",
                     atomic_load(&c->s->open_conns), atomic_load(&c->s->draining));
    if (m < 0 || (size_t)m >= sizeof r->body - (size_t)n) {
        reply_error(r, 500, "metrics do not fit");
        return;
    }
    r->len = (size_t)n + (size_t)m;
    r->status = 200;
    r->ctype = "text/plain; version=0.0.4";
}

static const struct route {
    const char *path, *method;
} routes[] = {
    {"/tasks", "POST"}, {"/work", "GET"}, {"/stats", "GET"}, {"/metrics", "GET"}, {"/healthz", "GET"},
};

static void route(conn *c, int cancel_fd, const http_request *req, const char *log_id, reply *r) {
    const struct route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(req->path, routes[i].path) == 0)
            rt = &routes[i];
    if (rt == NULL) {
        reply_error(r, 404, "not found");
        return;
    }
    if (strcmp(req->method, rt->method) != 0) {
        reply_error(r, 405, "method not allowed");
        snprintf(r->extra, sizeof r->extra, "Allow: %s\r\n", rt->method);
        return;
    }
    switch (rt - routes) {
    case 0: handle_tasks(c, req, log_id, r); break;
    case 1: handle_work(c, cancel_fd, req, log_id, r); break;
    case 2: handle_stats(c, r); break;
    case 3: handle_metrics(c, r); break;
    default:
        if (atomic_load(&c->s->draining))
            reply_error(r, 503, "draining");
        else
            reply_json(r, 200, "{\"status\":\"ok\"}\n");
    }
}

/* ------------------------------------------------------------ connection I/O */

enum { HEAD_OK, HEAD_CLOSE, HEAD_TIMEOUT, HEAD_TOO_LARGE };

/* Read until c->buf holds a whole head. `first`: the connection's first
 * request, whose head must be complete HEADER_TIMEOUT after accept. */
static int read_head(conn *c, int cancel_fd, int first, size_t *head_len) {
    const svc_config *cfg = &c->s->cfg;
    uint64_t now = tp_now_ns();
    uint64_t idle_deadline = first ? c->opened_ns + cfg->header_timeout_ns : now + cfg->idle_timeout_ns;
    /* Bytes already here (pipelined) start the head clock now. */
    uint64_t head_deadline = first ? idle_deadline : now + cfg->header_timeout_ns;
    for (;;) {
        size_t h = http_head_length(c->buf, c->len);
        if (h != 0) {
            *head_len = h;
            return HEAD_OK;
        }
        if (c->len >= sizeof c->buf)
            return HEAD_TOO_LARGE;
        int idle = c->len == 0;
        if (idle && atomic_load(&c->s->draining))
            return HEAD_CLOSE;
        uint64_t deadline = idle ? idle_deadline : head_deadline;
        int timeout = poll_ms(deadline);
        if (timeout == 0)
            return idle ? HEAD_CLOSE : HEAD_TIMEOUT;
        struct pollfd pf[3] = {
            {.fd = c->fd, .events = POLLIN},
            {.fd = cancel_fd, .events = POLLIN},
            {.fd = idle ? c->s->drain_fd : -1, .events = POLLIN},
        };
        int n = poll(pf, 3, timeout);
        if (n < 0 && errno != EINTR)
            return HEAD_CLOSE;
        if (n <= 0)
            continue;
        if (pf[1].revents & POLLIN)
            return HEAD_CLOSE; /* forced shutdown */
        if (pf[0].revents == 0)
            continue; /* the drain flag: checked at the top */
        ssize_t got = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (got > 0) {
            if (c->len == 0 && !first)
                head_deadline = tp_now_ns() + cfg->header_timeout_ns;
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
    uint64_t deadline = tp_now_ns() + c->s->cfg.header_timeout_ns;
    char scratch[4096];
    while (n > 0) {
        int timeout = poll_ms(deadline);
        if (timeout == 0)
            return -1;
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = cancel_fd, .events = POLLIN}};
        int r = poll(pf, 2, timeout);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r <= 0)
            continue;
        if (pf[1].revents & POLLIN)
            return -1;
        ssize_t got = recv(c->fd, scratch, n < sizeof scratch ? (size_t)n : sizeof scratch, 0);
        if (got > 0)
            n -= (uint64_t)got;
        else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
            return -1;
    }
    return 0;
}

static void log_request(const conn *c, const char *method, const char *path, int status,
                        uint64_t t0, const char *log_id) {
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
    size_t n = http_format_response(out, sizeof out, r->status, r->ctype, r->body, r->len, extra,
                                    r->keep_alive, minor);
    if (n == 0)
        return -1;
    return http_send_all(c->fd, out, n, tp_now_ns() + WRITE_TIMEOUT_NS, cancel_fd);
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

static int conn_task(tp_ctx *ctx, void *arg) {
    conn *c = arg;
    int cancel_fd = tp_ctx_fd(ctx); /* negative if none could be made: poll() ignores it */
    for (int first = 1;; first = 0) {
        size_t head_len = 0;
        int h = read_head(c, cancel_fd, first, &head_len);
        uint64_t t0 = tp_now_ns();
        if (h == HEAD_CLOSE)
            return 0;
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
            snprintf(log_id, sizeof log_id, "req-%llu",
                     (unsigned long long)atomic_fetch_add(&c->s->next_req, 1));

        reply r = {.keep_alive = req.keep_alive};
        if (req.chunked) {
            reply_error(&r, 501, "chunked request bodies are not supported");
            r.keep_alive = 0;
        } else if (req.content_length > HTTP_BODY_MAX) {
            reply_error(&r, 413, "request body over 64 KiB");
            r.keep_alive = 0;
        } else {
            route(c, cancel_fd, &req, log_id, &r);
        }
        if (atomic_load(&c->s->draining))
            r.keep_alive = 0;
        if (r.status == 0) { /* the client hung up during /work */
            log_request(c, req.method, req.path, 499, t0, log_id);
            return 0;
        }
        int sent = send_reply(c, cancel_fd, &r, req.minor, log_id);
        log_request(c, req.method, req.path, r.status, t0, log_id);
        /* The parsed request points into c->buf: only now may it move. */
        if (sent != 0 || !r.keep_alive || skip_body(c, cancel_fd, head_len, req.content_length) != 0)
            return 0;
    }
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
        c->id = id;
        c->opened_ns = tp_now_ns();
        c->len = 0;
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        char log_id[32];
        snprintf(log_id, sizeof log_id, "conn-%llu", (unsigned long long)id);
        tp_task_opts opts = {.on_done = conn_done, .log_id = log_id};
        int rc = tp_submit(s->conns, conn_task, c, &opts, NULL);
        if (rc == TP_OK)
            return; /* c and fd belong to the connection task now */
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
