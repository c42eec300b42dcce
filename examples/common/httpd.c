/*
 * httpd.c -- the loop, the connections and the exchanges of the examples'
 * HTTP server (see httpd.h for what it promises).
 *
 * A connection is in one of four states:
 *   HEAD   the loop reads a request head, or waits (idle) for one;
 *   BUSY   an exchange runs off the loop: the connection is its own until
 *          httpd_exchange_done, and the loop neither polls nor touches it;
 *   WRITE  the loop writes an answer it made itself;
 *   BODY   the loop drops the rest of a request body;
 *   LINGER the answer is out and the connection ends (see below).
 * After an exchange the connection closes (no keep-alive, a one-request
 * connection, the drain) or goes on: the body is dropped (the buffered part
 * at once, the rest in BODY, never a byte past it), and HEAD resumes on the
 * bytes that followed, which may already hold the next, pipelined, head.
 *
 * Lingering close. Closing a socket whose client has sent more than the
 * server read (the rest of a refused head or body, a pipelined request)
 * makes the kernel send a reset, which can destroy the answer at the client
 * before it read it: "sent" only means handed to the kernel. So a
 * connection that ends after an answer first ends its output
 * (shutdown(SHUT_WR): a FIN after the answer), then reads and drops what
 * comes until the client closes too, for LINGER_NS at most. It gives its
 * slot back at once (it no longer counts against max_conns), and at most
 * max_conns connections linger; one more closes at once (so h->conns holds
 * 2 x max_conns + HTTPD_SPARE).
 *
 * Invariants: a connection is on the idle list iff it is in HEAD with no byte
 * buffered, has answered a request and may be kept (oldest first: the one
 * closed at the limit); on the spare list iff it is spare and in HEAD. Every
 * state but BUSY has a deadline, checked at the top of each round of the
 * loop, and poll() sleeps until the nearest one (at most 1 s).
 *
 * The loop is the only thread that creates, lists or frees a connection.
 * Workers hand one back through `returned` (under `mu`, a leaf) and a byte on
 * the wake pipe; the pool's submit and that mutex order the exchange's
 * writes before the loop reads them.
 */
#define _GNU_SOURCE
#include "httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "taskpool.h"

#define NS_PER_MS      1000000ull
#define NS_PER_S       1000000000ull
#define SHORT_NS       NS_PER_S /* head and write deadline of a spare or drain-time connection */
#define ACCEPT_BATCH   64       /* connections accepted per round, so that the others are served too */
#define MAX_APP_FDS    4
#define LOG_TARGET_MAX 256            /* bytes of a client's target in a log line */
#define LINGER_NS      (2 * NS_PER_S) /* the longest lingering close */

typedef enum { C_HEAD, C_BUSY, C_WRITE, C_BODY, C_LINGER } cstate;

typedef struct hconn hconn;
struct hconn {
    httpd *h;
    int fd;
    cstate state;
    int spare;    /* admitted over max_conns: probes only */
    int one_shot; /* one request, then close (spare, or accepted during the drain) */
    int keep;     /* after the answer: go on with the connection */
    int ran;      /* httpd_exchange_run was called for the dispatched exchange */
    int listed;   /* on the idle or the spare list */
    size_t slot;  /* index in h->conns */
    uint64_t id, opened_ns, deadline_ns, t0_ns;
    unsigned requests;
    hconn *prev, *next; /* idle or spare list */
    hconn *ret_next;    /* h->returned */
    const httpd_route *route;
    http_request req;
    char log_id[HTTP_REQID_MAX + 16];
    char peer[64];
    size_t head_len; /* the head being answered (consumed after the answer) */
    size_t scanned;  /* bytes of buf http_head_end has checked */
    uint64_t body_left;
    char *out; /* WRITE: the answer, out_off of out_len bytes sent */
    size_t out_len, out_off;
    httpd_exchange x;
    size_t len; /* bytes in buf */
    char buf[HTTP_HEAD_MAX];
};

typedef struct clist {
    hconn *head, *tail;
} clist;

struct httpd {
    const httpd_config *cfg;
    int lfd;
    int wake[2];         /* workers -> loop: a connection was handed back */
    pthread_mutex_t mu;  /* guards `returned`; a leaf */
    hconn *returned;     /* under mu */
    atomic_int draining; /* set once by the loop; read by workers and handlers */
    atomic_uint open;    /* connections open (a gauge for any thread) */
    /* Loop thread only from here. */
    hconn **conns;
    size_t n, cap;
    unsigned normal, spares, lingering; /* connections in each kind of slot; lingering ones hold none */
    clist idle, spare_list;
    uint64_t next_conn, next_req;
    uint64_t accept_pause_until, accept_logged_ns;
    struct pollfd *pfd;
    hconn **pconn;
};

static hconn *conn_of(httpd_exchange *x) { return (hconn *)(void *)((char *)x - offsetof(hconn, x)); }

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static uint64_t head_timeout(const hconn *c) {
    uint64_t t = c->h->cfg->header_timeout_ns;
    return c->one_shot ? min_u64(t, SHORT_NS) : t;
}

static uint64_t write_timeout(const hconn *c) {
    uint64_t t = c->h->cfg->write_timeout_ns;
    return c->one_shot ? min_u64(t, SHORT_NS) : t;
}

/* ------------------------------------------------------------ lists */

static void list_push(clist *l, hconn *c) {
    c->prev = l->tail;
    c->next = NULL;
    if (l->tail != NULL)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    c->listed = 1;
}

static void unlist(httpd *h, hconn *c) {
    if (!c->listed) return;
    clist *l = c->spare ? &h->spare_list : &h->idle;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    c->prev = c->next = NULL;
    c->listed = 0;
}

/* ------------------------------------------------------------ replies and logs */

void httpd_reply_json(httpd_reply *r, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->body, sizeof r->body, fmt, ap);
    va_end(ap);
    r->status = status;
    r->ctype = "application/json";
    r->len = n < 0 ? 0 : (size_t)n >= sizeof r->body ? sizeof r->body - 1 : (size_t)n;
}

void httpd_reply_error(httpd_reply *r, int status, const char *msg) {
    httpd_reply_json(r, status, "{\"error\":\"%s\"}\n", msg);
    if (status == 503 || status == 429) snprintf(r->extra, sizeof r->extra, "Retry-After: 1\r\n");
}

static void reset_reply(hconn *c, int keep_alive, int head_only) {
    httpd_reply *r = &c->x.reply;
    free(r->big);
    r->big = NULL;
    r->status = 0;
    r->keep_alive = keep_alive;
    r->head_only = head_only;
    r->ctype = "application/json";
    r->extra[0] = '\0';
    r->len = 0;
}

static void new_log_id(httpd *h, hconn *c) {
    if (c->req.request_id != NULL)
        snprintf(c->log_id, sizeof c->log_id, "%s", c->req.request_id);
    else
        snprintf(c->log_id, sizeof c->log_id, "req-%llu", (unsigned long long)h->next_req++);
}

/* One "request" line. Method and path are the client's bytes, so they are
 * capped; log.c keeps them valid JSON and UTF-8 whatever they hold. A
 * refused request logs its target as sent, when it got that far. */
static void log_request(const hconn *c, int status) {
    const http_request *req = &c->req;
    svc_log ev;
    svc_log_begin(&ev, status >= 500 ? "warn" : c->h->cfg->log_level, "request");
    svc_log_uint(&ev, "conn", c->id);
    svc_log_str(&ev, "peer", c->peer);
    svc_log_strn(&ev, "method", req->method != NULL ? req->method : "-", 32);
    const char *path = req->path != NULL ? req->path : req->target != NULL ? req->target : "-";
    svc_log_strn(&ev, "path", path, LOG_TARGET_MAX);
    svc_log_int(&ev, "status", status);
    svc_log_uint(&ev, "ms", (tp_now_ns() - c->t0_ns) / NS_PER_MS);
    svc_log_str(&ev, "log_id", c->log_id);
    svc_log_end(&ev);
}

/* The answer as bytes (head, and the body unless HEAD), or NULL. */
static char *format_reply(const hconn *c, const httpd_reply *r, size_t *len) {
    char extra[sizeof r->extra + HTTP_REQID_MAX + 64];
    snprintf(extra, sizeof extra, "%sX-Request-Id: %s\r\n", r->extra, c->log_id);
    size_t cap = 256 + strlen(extra) + strlen(r->ctype) + (r->head_only ? 0 : r->len);
    char *out = malloc(cap);
    if (out == NULL) return NULL;
    *len = http_format_response(out, cap, r->status, r->ctype, r->big != NULL ? r->big : r->body, r->len,
                                extra, r->keep_alive, c->req.minor, r->head_only);
    if (*len == 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------------ connections */

static void conn_close(httpd *h, hconn *c) {
    unlist(h, c);
    svc_log ev;
    svc_log_begin(&ev, "debug", "connection_closed");
    svc_log_uint(&ev, "conn", c->id);
    svc_log_str(&ev, "peer", c->peer);
    svc_log_uint(&ev, "keep_alive_requests", c->requests);
    svc_log_uint(&ev, "ms", (tp_now_ns() - c->opened_ns) / NS_PER_MS);
    svc_log_end(&ev);
    close(c->fd);
    free(c->out);
    free(c->x.reply.big);
    h->conns[c->slot] = h->conns[--h->n];
    h->conns[c->slot]->slot = c->slot;
    if (c->state == C_LINGER)
        h->lingering--;
    else if (c->spare)
        h->spares--;
    else
        h->normal--;
    atomic_fetch_sub(&h->open, 1);
    free(c);
}

/* The answer is out and c ends: its output ends now, and it is closed when
 * the client closes too, or at its deadline (see the top of the file). */
static void linger(httpd *h, hconn *c) {
    unlist(h, c);
    if (h->lingering >= h->cfg->max_conns || shutdown(c->fd, SHUT_WR) != 0) {
        conn_close(h, c);
        return;
    }
    if (c->spare)
        h->spares--;
    else
        h->normal--;
    h->lingering++;
    c->state = C_LINGER;
    c->deadline_ns = tp_now_ns() + LINGER_NS;
}

/* HEAD again after an exchange or a body: idle if nothing is buffered. */
static void to_head(httpd *h, hconn *c, uint64_t now) {
    c->state = C_HEAD;
    if (c->len == 0) {
        c->deadline_ns = now + h->cfg->idle_timeout_ns;
        list_push(&h->idle, c);
    } else {
        c->deadline_ns = now + head_timeout(c); /* pipelined: the head clock starts now */
    }
}

/* The exchange is over (answer sent, or not). 1 if c goes on, 0 if closed. */
static int after_exchange(httpd *h, hconn *c, int keep) {
    free(c->out);
    c->out = NULL;
    if (!keep || c->one_shot || atomic_load(&h->draining)) {
        linger(h, c);
        return 0;
    }
    /* The parsed request points into buf: only now may its bytes move. */
    size_t have = c->len - c->head_len;
    uint64_t length = c->req.content_length;
    size_t take = length < have ? (size_t)length : have;
    memmove(c->buf, c->buf + c->head_len + take, have - take);
    c->len = have - take;
    c->head_len = c->scanned = 0;
    c->body_left = length - take;
    uint64_t now = tp_now_ns();
    if (c->body_left > 0) {
        c->state = C_BODY;
        c->deadline_ns = now + head_timeout(c);
    } else {
        to_head(h, c, now);
    }
    return 1;
}

/* Queue c's reply for writing by the loop (formatted here, unless the
 * exchange off the loop already did). 1, or 0 if c was closed. */
static int answer(httpd *h, hconn *c) {
    httpd_reply *r = &c->x.reply;
    if ((c->one_shot || atomic_load(&h->draining)) && r->keep_alive) {
        r->keep_alive = 0;
        free(c->out); /* formatted keep-alive off the loop: say Connection: close */
        c->out = NULL;
    }
    if (r->status == 0) {
        log_request(c, 499);
        conn_close(h, c);
        return 0;
    }
    if (c->out == NULL) c->out = format_reply(c, r, &c->out_len);
    free(r->big);
    r->big = NULL;
    if (c->out == NULL) {
        log_request(c, 500);
        conn_close(h, c);
        return 0;
    }
    c->out_off = 0;
    c->keep = r->keep_alive;
    c->state = C_WRITE;
    c->deadline_ns = tp_now_ns() + write_timeout(c);
    return 1;
}

/* Refuse what is in c's buffer before a request could be read from it. */
static int refuse_head(httpd *h, hconn *c, int status, const char *msg) {
    unlist(h, c);
    memset(&c->req, 0, sizeof c->req);
    c->t0_ns = tp_now_ns();
    new_log_id(h, c);
    reset_reply(c, 0, 0);
    httpd_reply_error(&c->x.reply, status, msg);
    return answer(h, c);
}

static int token_in(const char *list, const char *tok) {
    size_t n = strlen(tok);
    for (const char *p = list; *p != '\0'; p += strcspn(p, " "), p += *p == ' ')
        if (strncmp(p, tok, n) == 0 && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

static int method_allowed(const httpd_route *rt, const char *method) {
    return token_in(rt->methods, strcmp(method, "HEAD") == 0 ? "GET" : method);
}

/* A method the server knows: the standard ones (RFC 9110 section 9, and
 * PATCH) get 405 + Allow where a route does not take them; any other (they
 * are case-sensitive: "get" is not GET) gets 501, unless a route implements
 * it (RFC 9110 sections 9.1, 15.5.6, 15.6.2). CONNECT is a proxy's: 501. */
static int known_method(const httpd *h, const char *method) {
    if (token_in("GET HEAD POST PUT DELETE OPTIONS TRACE PATCH", method)) return 1;
    for (size_t i = 0; i < h->cfg->nroutes; i++)
        if (method_allowed(&h->cfg->routes[i], method)) return 1;
    return 0;
}

static const httpd_route *find_route(const httpd *h, const char *path) {
    for (size_t i = 0; i < h->cfg->nroutes; i++) {
        const httpd_route *rt = &h->cfg->routes[i];
        size_t n = strlen(rt->path);
        if (rt->path[n - 1] != '/' ? strcmp(path, rt->path) == 0
                                   : strncmp(path, rt->path, n) == 0 && strchr(path + n, '/') == NULL)
            return rt;
    }
    return NULL;
}

/* "Allow: GET, HEAD, DELETE\r\n" for a 405. */
static void allow_header(const httpd_route *rt, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "Allow: ");
    for (const char *p = rt->methods; *p != '\0' && n < cap;) {
        size_t k = strcspn(p, " ");
        int get = k == 3 && strncmp(p, "GET", 3) == 0;
        n += (size_t)snprintf(out + n, cap - n, "%s%.*s%s", p == rt->methods ? "" : ", ", (int)k, p,
                              get ? ", HEAD" : "");
        p += k;
        p += *p == ' ';
    }
    if (n < cap) snprintf(out + n, cap - n, "\r\n");
}

static void log_rejected(const char *why, uint64_t id, const char *peer) {
    svc_log ev;
    svc_log_begin(&ev, "warn", "connection_rejected");
    svc_log_uint(&ev, "conn", id);
    svc_log_str(&ev, "peer", peer);
    svc_log_str(&ev, "reason", why);
    svc_log_end(&ev);
}

/* Read, check and route the head buf[0..hlen); answer it here or dispatch
 * it. 1 if c is still the loop's, 0 if it was closed or dispatched. */
static int serve_head(httpd *h, hconn *c, size_t hlen) {
    unlist(h, c);
    c->t0_ns = tp_now_ns();
    c->head_len = hlen;
    c->requests++;
    http_request *req = &c->req;
    int bad = http_parse_head(c->buf, hlen, req);
    new_log_id(h, c);
    int draining = atomic_load(&h->draining);
    httpd_exchange *x = &c->x;
    x->app = h->cfg->app;
    x->req = req;
    x->log_id = c->log_id;
    x->conn_id = c->id;
    x->fd = c->fd;
    x->cancel_fd = -1;
    x->on_loop = 1;
    x->draining = draining;
    reset_reply(c, req->keep_alive, req->method != NULL && strcmp(req->method, "HEAD") == 0);
    httpd_reply *r = &x->reply;
    const httpd_route *rt = NULL;
    char msg[96], bad_name[40];
    if (bad != 0) {
        httpd_reply_error(r, bad, req->error);
        r->keep_alive = 0;
    } else if (req->chunked) {
        httpd_reply_error(r, 501, "chunked request bodies are not supported");
        r->keep_alive = 0;
    } else if (req->content_length > HTTP_BODY_MAX) {
        httpd_reply_error(r, 413, "request body over 64 KiB");
        r->keep_alive = 0;
    } else if (!known_method(h, req->method)) {
        httpd_reply_error(r, 501, "method not implemented");
    } else if (req->form == HTTP_FORM_AUTHORITY ||
               (req->form == HTTP_FORM_ASTERISK && strcmp(req->method, "OPTIONS") != 0)) {
        httpd_reply_error(r, 400, "request target form not allowed with this method");
    } else if ((rt = find_route(h, req->path)) == NULL) {
        httpd_reply_error(r, 404, "not found");
    } else if (!method_allowed(rt, req->method)) {
        httpd_reply_error(r, 405, "method not allowed");
        allow_header(rt, r->extra, sizeof r->extra);
    } else if (http_query_check(req->query, rt->params, bad_name, sizeof bad_name) != 0) {
        /* The name goes into JSON: keep only characters that need no escape. */
        for (char *p = bad_name; *p != '\0'; p++)
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
        snprintf(msg, sizeof msg, "unknown, repeated or empty query parameter '%s'", bad_name);
        httpd_reply_error(r, 400, msg);
    } else if (c->spare && (rt->flags & HTTPD_PROBE) != HTTPD_PROBE) {
        httpd_reply_error(r, 503, "too many connections");
        log_rejected("connection limit", c->id, c->peer);
    } else if ((rt->flags & HTTPD_ON_LOOP) || draining || c->one_shot || h->cfg->dispatch == NULL) {
        rt->fn(x);
    } else {
        c->route = rt;
        c->ran = 0;
        c->state = C_BUSY;
        x->on_loop = 0;
        if (h->cfg->dispatch(h->cfg->app, x) == 0) return 0; /* the exchange's until httpd_exchange_done */
        c->state = C_HEAD;
        x->on_loop = 1;
        httpd_reply_error(r, 503, "no capacity for the request");
        r->keep_alive = 0;
    }
    return answer(h, c);
}

/* Drop the CRLFs a client may send between requests (RFC 9112 section 2.2).
 * They may come split across reads: while nothing but a lone CR is buffered
 * (crlf_pending), the head is not scanned (scanned stays 0, so this runs
 * again on the next read) until a byte after the CR shows what it was. */
static void strip_crlf(hconn *c) {
    size_t k = 0;
    while (k + 1 < c->len && c->buf[k] == '\r' && c->buf[k + 1] == '\n') k += 2;
    if (k == 0) return;
    memmove(c->buf, c->buf + k, c->len - k);
    c->len -= k;
}

static int crlf_pending(const hconn *c) { return c->scanned == 0 && c->len == 1 && c->buf[0] == '\r'; }

/* Send what c->out still holds. 1 all sent, 0 the socket is full, -1 failed. */
static int flush(hconn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 1;
}

/* Move c on as far as it goes without waiting for the client. */
static void advance(httpd *h, hconn *c) {
    for (;;) {
        if (c->state == C_WRITE) {
            int f = flush(c);
            if (f == 0) return;
            log_request(c, c->x.reply.status);
            if (f < 0) {
                conn_close(h, c);
                return;
            }
            if (!after_exchange(h, c, c->keep)) return;
            continue;
        }
        if (c->state != C_HEAD) return;
        if (c->scanned == 0) strip_crlf(c);
        if (crlf_pending(c)) return; /* wait for the LF */
        int bad = 0;
        size_t hlen = http_head_end(c->buf, c->len, &c->scanned, &bad);
        int alive;
        if (bad)
            alive = refuse_head(h, c, 400, "malformed request head (a NUL, or CR and LF not paired)");
        else if (hlen == 0 && c->len >= sizeof c->buf)
            alive = refuse_head(h, c, 431, "request head over 16 KiB");
        else if (hlen == 0)
            return; /* wait for more */
        else
            alive = serve_head(h, c, hlen);
        if (!alive) return;
    }
}

static void on_event(httpd *h, hconn *c, short revents) {
    if (revents & (POLLERR | POLLNVAL)) {
        if (c->state == C_WRITE) log_request(c, c->x.reply.status);
        conn_close(h, c);
        return;
    }
    if (c->state == C_WRITE) {
        advance(h, c);
        return;
    }
    char scratch[4096];
    if (c->state == C_LINGER) {
        ssize_t got = recv(c->fd, scratch, sizeof scratch, 0); /* dropped */
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (got <= 0) conn_close(h, c); /* the client closed too (or failed) */
        return;
    }
    char *dst = c->state == C_BODY ? scratch : c->buf + c->len;
    size_t room = c->state == C_BODY ? (size_t)min_u64(c->body_left, sizeof scratch) : sizeof c->buf - c->len;
    if (room == 0) return; /* cannot happen: a full buffer was answered 431 */
    ssize_t got = recv(c->fd, dst, room, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) { /* EOF or an error: nothing in progress here, so just close */
        conn_close(h, c);
        return;
    }
    uint64_t now = tp_now_ns();
    if (c->state == C_BODY) {
        c->body_left -= (uint64_t)got;
        if (c->body_left > 0) return;
        to_head(h, c, now);
    } else {
        int was_empty = c->len == 0;
        c->len += (size_t)got;
        if (c->scanned == 0) strip_crlf(c);
        if (was_empty && c->len > 0 && c->requests > 0) {
            unlist(h, c); /* no longer idle: the head must now come within head_timeout */
            c->deadline_ns = now + head_timeout(c);
        } else if (!was_empty && c->len == 0 && c->requests > 0) {
            to_head(h, c, now); /* a CR, then its LF: idle again */
        }
    }
    advance(h, c);
}

/* Deadlines passed: 408 for half a head; close anything else. */
static void expire(httpd *h, uint64_t now) {
    /* Downwards: closing c moves the last connection, already seen, into its slot. */
    for (size_t i = h->n; i-- > 0;) {
        hconn *c = h->conns[i];
        if (c->state == C_BUSY || c->deadline_ns > now) continue;
        if (c->state == C_HEAD && c->len > 0) {
            if (refuse_head(h, c, 408, "request head not received in time")) advance(h, c);
        } else {
            if (c->state == C_WRITE) log_request(c, c->x.reply.status);
            conn_close(h, c); /* idle, silent, a body or an answer not taken in time */
        }
    }
}

/* Connections handed back by httpd_exchange_done, answered here: the loop
 * writes every answer, so that a connection is idle (and evictable) from the
 * moment its answer is out, and no worker waits for a slow reader. */
static void take_returned(httpd *h) {
    char drain[64];
    while (read(h->wake[0], drain, sizeof drain) > 0) {
    }
    pthread_mutex_lock(&h->mu);
    hconn *c = h->returned;
    h->returned = NULL;
    pthread_mutex_unlock(&h->mu);
    while (c != NULL) {
        hconn *next = c->ret_next;
        c->state = C_HEAD;
        if (!c->ran) { /* dropped unrun (a forced shutdown): say so */
            reset_reply(c, 0, c->x.reply.head_only);
            httpd_reply_error(&c->x.reply, 503, "shutting down");
        }
        if (answer(h, c)) advance(h, c);
        c = next;
    }
}

/* ------------------------------------------------------------ accepting */

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t len) {
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, len, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, len, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, len, "?");
    }
}

/* Best-effort 503 on a connection that gets no slot at all, then close. */
static void reject_now(int fd) {
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

/* A new connection: a slot below max_conns, else the slot of the oldest
 * idle keep-alive connection, else a spare slot (the oldest spare that is
 * still reading gives way). */
static void admit(httpd *h, int fd, const char *peer) {
    uint64_t id = h->next_conn++, now = tp_now_ns();
    int spare = 0;
    if (h->normal >= h->cfg->max_conns) {
        if (h->idle.head != NULL) {
            hconn *old = h->idle.head;
            svc_log ev;
            svc_log_begin(&ev, "info", "connection_evicted");
            svc_log_uint(&ev, "conn", old->id);
            svc_log_str(&ev, "peer", old->peer);
            svc_log_uint(&ev, "idle_ms", (now + h->cfg->idle_timeout_ns - old->deadline_ns) / NS_PER_MS);
            svc_log_uint(&ev, "for_conn", id);
            svc_log_end(&ev);
            conn_close(h, old);
        } else {
            spare = 1;
            if (h->spares >= HTTPD_SPARE) {
                if (h->spare_list.head == NULL) {
                    reject_now(fd);
                    log_rejected("connection limit", id, peer);
                    return;
                }
                hconn *old = h->spare_list.head;
                log_rejected("spare slots taken by newer connections", old->id, old->peer);
                conn_close(h, old);
            }
        }
    }
    hconn *c = calloc(1, sizeof *c);
    if (c == NULL) {
        reject_now(fd);
        log_rejected("out of memory", id, peer);
        return;
    }
    c->h = h;
    c->fd = fd;
    c->id = id;
    c->spare = spare;
    c->one_shot = spare || atomic_load(&h->draining);
    c->state = C_HEAD;
    c->opened_ns = now;
    c->deadline_ns = now + head_timeout(c); /* the first head counts from the accept */
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->slot = h->n;
    h->conns[h->n++] = c;
    if (spare) {
        h->spares++;
        list_push(&h->spare_list, c);
    } else {
        h->normal++;
    }
    atomic_fetch_add(&h->open, 1);
    /* Read at once what came with the connection. In a burst accepted in one
     * round, a spare whose probe has already arrived is answered now, before
     * a newer connection can take its slot (it would be closed unread, with
     * a reset), and a request refused at the limit gets its 503. */
    on_event(h, c, POLLIN);
}

static void accept_some(httpd *h) {
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(h->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* EMFILE, ENFILE, ENOBUFS, ENOMEM: pause accepting instead of spinning. */
            uint64_t now = tp_now_ns();
            h->accept_pause_until = now + 50 * NS_PER_MS;
            if (now - h->accept_logged_ns >= NS_PER_S) {
                h->accept_logged_ns = now;
                svc_log ev;
                svc_log_begin(&ev, "error", "accept_failed");
                svc_log_str(&ev, "error", strerror(errno));
                svc_log_end(&ev);
            }
            return;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char peer[64];
        format_addr(&ss, peer, sizeof peer);
        admit(h, fd, peer);
    }
}

/* ------------------------------------------------------------ the loop */

/* One round: deadlines, poll() (until `until` at the latest), events. The
 * index of a readable fds[i]; -2 if none; -1 if poll() failed for good. */
static int round_once(httpd *h, const int *fds, size_t nfds, uint64_t until) {
    uint64_t now = tp_now_ns();
    expire(h, now);
    /* In httpd_finish, once its last connection has expired here, nothing
     * is left to wait for (no listener, no connection, no descriptor of the
     * caller's; with no connection no exchange can come back): it ends now,
     * not a poll timeout (up to 1 s) later. (httpd_run always passes the
     * caller's descriptor.) */
    if (h->lfd < 0 && h->n == 0 && nfds == 0) return -2;
    size_t np = 0;
    for (size_t i = 0; i < nfds; i++) h->pfd[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    h->pfd[np++] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
    int listening = h->lfd >= 0 && now >= h->accept_pause_until;
    h->pfd[np++] = (struct pollfd){.fd = listening ? h->lfd : -1, .events = POLLIN};
    uint64_t next = min_u64(until, listening || h->lfd < 0 ? now + NS_PER_S : h->accept_pause_until);
    size_t first = np;
    for (size_t i = 0; i < h->n; i++) {
        hconn *c = h->conns[i];
        if (c->state == C_BUSY) continue;
        h->pconn[np - first] = c;
        h->pfd[np++] = (struct pollfd){.fd = c->fd, .events = c->state == C_WRITE ? POLLOUT : POLLIN};
        next = min_u64(next, c->deadline_ns);
    }
    int timeout = next <= now ? 0 : (int)min_u64((next - now + NS_PER_MS - 1) / NS_PER_MS, 1000);
    int n = poll(h->pfd, (nfds_t)np, timeout);
    if (n < 0 && errno != EINTR) return -1;
    if (n <= 0) return -2;
    if (h->pfd[nfds].revents) take_returned(h);
    /* Only c itself can close while its event is handled: the others in
     * pconn stay valid. Accepting (which may close an idle one) comes last. */
    for (size_t i = first; i < np; i++)
        if (h->pfd[i].revents) on_event(h, h->pconn[i - first], h->pfd[i].revents);
    if (h->pfd[nfds + 1].revents) accept_some(h);
    for (size_t i = 0; i < nfds; i++)
        if (h->pfd[i].revents) return (int)i;
    return -2;
}

int httpd_run(httpd *h, const int *fds, size_t nfds) {
    if (nfds > MAX_APP_FDS) return -1;
    for (;;) {
        int rc = round_once(h, fds, nfds, UINT64_MAX);
        if (rc != -2) return rc;
    }
}

void httpd_finish(httpd *h, uint64_t deadline_ns) {
    if (h->lfd >= 0) close(h->lfd);
    h->lfd = -1;
    if (!atomic_load(&h->draining)) httpd_drain(h);
    for (;;) {
        take_returned(h);
        int writing = 0;
        for (size_t i = h->n; i-- > 0;) { /* downwards, as in expire() */
            hconn *c = h->conns[i];
            if (c->state == C_HEAD || c->state == C_BODY)
                conn_close(h, c); /* accepted during the drain, no head yet */
            else if (c->state == C_WRITE || c->state == C_LINGER)
                writing = 1; /* (a lingering one ends by its own deadline) */
        }
        if (!writing || tp_now_ns() >= deadline_ns || round_once(h, NULL, 0, deadline_ns) == -1) return;
    }
}

void httpd_drain(httpd *h) {
    atomic_store(&h->draining, 1);
    for (size_t i = h->n; i-- > 0;) { /* downwards, as in expire() */
        hconn *c = h->conns[i];
        if (c->state == C_BODY)
            linger(h, c); /* its answer is out; unread body: close lingering, not with a reset */
        else if (c->state == C_HEAD && c->len == 0)
            conn_close(h, c); /* nothing in progress */
        else if (c->state == C_HEAD && refuse_head(h, c, 503, "shutting down"))
            advance(h, c); /* half a head: nothing to wait for either */
    }
}

/* ------------------------------------------------------------ the exchange off the loop */

void httpd_exchange_run(httpd_exchange *x, int cancel_fd) {
    hconn *c = conn_of(x);
    httpd *h = c->h;
    x->cancel_fd = cancel_fd;
    x->draining = atomic_load(&h->draining);
    c->route->fn(x);
    httpd_reply *r = &x->reply;
    if (atomic_load(&h->draining)) r->keep_alive = 0;
    if (r->status != 0) c->out = format_reply(c, r, &c->out_len); /* the loop writes it */
    c->ran = 1;
}

void httpd_exchange_done(httpd_exchange *x) {
    hconn *c = conn_of(x);
    httpd *h = c->h;
    pthread_mutex_lock(&h->mu);
    c->ret_next = h->returned;
    h->returned = c;
    pthread_mutex_unlock(&h->mu);
    if (write(h->wake[1], "x", 1) < 0) {
        /* full: a wake-up is pending anyway */
    }
}

unsigned httpd_open_conns(httpd *h) { return atomic_load(&h->open); }

int httpd_draining(httpd *h) { return atomic_load(&h->draining); }

/* ------------------------------------------------------------ create and destroy */

/* "host:port", "[v6]:port" or ":port" (all interfaces) -> a listening socket. */
static int listen_on(const httpd_config *cfg, int *out, char *err, size_t errlen) {
    const char *addr = cfg->listen_addr, *var = cfg->addr_name;
    const char *colon = strrchr(addr, ':');
    char host[256], portstr[8];
    size_t hlen = colon != NULL ? (size_t)(colon - addr) : 0;
    const char *hp = addr;
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') {
        hp++;
        hlen -= 2;
    }
    unsigned port = 0;
    const char *p = colon != NULL ? colon + 1 : "";
    for (; *p >= '0' && *p <= '9' && port <= 65535; p++) port = port * 10 + (unsigned)(*p - '0');
    if (colon == NULL || colon[1] == '\0' || *p != '\0' || port > 65535 || hlen >= sizeof host) {
        snprintf(err, errlen, "%s=\"%s\": expected host:port, [v6]:port or :port (port 0 to 65535)", var,
                 addr);
        return HTTPD_EADDR;
    }
    memcpy(host, hp, hlen);
    host[hlen] = '\0';
    snprintf(portstr, sizeof portstr, "%u", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(hlen > 0 ? host : NULL, portstr, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "%s=\"%s\": %s", var, addr, gai_strerror(rc));
        return HTTPD_EADDR;
    }
    int saved = 0;
    for (struct addrinfo *a = ai; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 256) == 0) {
            freeaddrinfo(ai);
            *out = fd;
            return HTTPD_OK;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    snprintf(err, errlen, "%s=\"%s\": cannot listen: %s", var, addr, strerror(saved));
    return HTTPD_ELISTEN;
}

int httpd_create(httpd **out, const httpd_config *cfg, char *bound, size_t boundlen, char *err,
                 size_t errlen) {
    *out = NULL;
    httpd *h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return HTTPD_ENOMEM;
    }
    h->cfg = cfg;
    h->lfd = h->wake[0] = h->wake[1] = -1;
    h->cap = 2 * (size_t)cfg->max_conns + HTTPD_SPARE; /* slots, spare slots, and as many lingering */
    h->conns = calloc(h->cap, sizeof *h->conns);
    h->pconn = calloc(h->cap, sizeof *h->pconn);
    h->pfd = calloc(h->cap + MAX_APP_FDS + 2, sizeof *h->pfd);
    h->next_conn = h->next_req = 1;
    atomic_init(&h->draining, 0);
    atomic_init(&h->open, 0);
    int rc = HTTPD_ENOMEM;
    if (h->conns == NULL || h->pconn == NULL || h->pfd == NULL ||
        pipe2(h->wake, O_NONBLOCK | O_CLOEXEC) != 0 || pthread_mutex_init(&h->mu, NULL) != 0) {
        snprintf(err, errlen, "out of memory");
    } else if ((rc = listen_on(cfg, &h->lfd, err, errlen)) == HTTPD_OK) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        snprintf(bound, boundlen, "?");
        if (getsockname(h->lfd, (struct sockaddr *)&ss, &sl) == 0) format_addr(&ss, bound, boundlen);
        *out = h;
        return HTTPD_OK;
    } else {
        pthread_mutex_destroy(&h->mu);
    }
    if (h->wake[0] >= 0) close(h->wake[0]);
    if (h->wake[1] >= 0) close(h->wake[1]);
    free(h->conns);
    free(h->pconn);
    free(h->pfd);
    free(h);
    return rc;
}

void httpd_destroy(httpd *h) {
    if (h == NULL) return;
    pthread_mutex_lock(&h->mu);
    hconn *c = h->returned;
    h->returned = NULL;
    pthread_mutex_unlock(&h->mu);
    for (; c != NULL; c = c->ret_next) c->state = C_HEAD; /* back with the loop, to be closed below */
    for (size_t i = h->n; i-- > 0;)
        if (h->conns[i]->state != C_BUSY) conn_close(h, h->conns[i]);
    if (h->lfd >= 0) close(h->lfd);
    close(h->wake[0]);
    close(h->wake[1]);
    pthread_mutex_destroy(&h->mu);
    free(h->conns);
    free(h->pconn);
    free(h->pfd);
    free(h);
}
