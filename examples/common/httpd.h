/*
 * httpd.h -- the small HTTP/1.1 server both examples serve from:
 * taskpool-service's whole interface and taskpool-stream-worker's /metrics.
 *
 * One thread runs the loop (httpd_run). It owns the listening socket and
 * every connection while no handler runs for it: it accepts, reads request
 * heads with poll() on non-blocking sockets, writes every answer, drops
 * request bodies and keeps idle keep-alive connections. A slow, silent or
 * non-reading client therefore costs a slot and 16 KiB, never a thread, and
 * no client can make another wait. A complete, valid request is routed
 * (404, 405 + Allow, 400 for a query parameter the route does not take, 501
 * for a method the server does not know) and then either answered on the loop
 * (routes marked HTTPD_PROBE or HTTPD_ON_LOOP, every route without a
 * dispatcher, every request during the drain) or handed to the
 * application's dispatcher, which runs the handler on a thread of its own
 * and hands the connection back with the answer for the loop to write.
 *
 * Limits and deadlines (the service's settings; the metrics endpoint uses
 * fixed ones):
 *   - a request head must be complete within header_timeout of its first
 *     byte (of the accept, for a connection's first request), in total, not
 *     per read: else 408 and close. Over HTTP_HEAD_MAX bytes: 431 and close.
 *     A head that can never be valid (bare CR or LF, a NUL) gets 400 at once.
 *   - a keep-alive connection may wait idle_timeout for its next request;
 *   - an answer must be taken by the client within write_timeout; a body
 *     (at most HTTP_BODY_MAX, else 413) must come within header_timeout of
 *     its head.
 *   - max_conns connections. At the limit a new connection first closes the
 *     oldest idle keep-alive connection; if none is idle it takes one of
 *     HTTPD_SPARE spare slots (the oldest spare gives way to the newest),
 *     where it has one second for one request: a probe route is answered,
 *     anything else gets 503 + Retry-After. Liveness probes keep working
 *     while clients hold every slot.
 *
 * A connection that ends after an answer (408, 431, 400, Connection: close,
 * the drain) closes lingering: its output ends with the answer, and what the
 * client still sends is read and dropped until it closes too, for 2 s at
 * most, so that unread input cannot turn the close into a reset that
 * destroys the answer (httpd.c). A lingering connection holds no slot.
 *
 * Drain (httpd_drain): from then on every answer carries Connection: close.
 * A connection with nothing in progress closes at once; one with part of a
 * head is answered 503 first. Requests in progress run to their end. The
 * listener stays open: each new connection gets one request, answered on the
 * loop (handlers see `draining` and `on_loop` and refuse what would block).
 * httpd_finish then closes the listener and writes out the answers made.
 *
 * Threads: httpd_create, httpd_run, httpd_drain, httpd_finish and
 * httpd_destroy on the loop thread only; httpd_exchange_run and httpd_exchange_done from any thread;
 * httpd_open_conns and httpd_draining anywhere. The one mutex guards the list
 * of connections handed back and is a leaf: nothing is called under it.
 */
#ifndef SVC_HTTPD_H
#define SVC_HTTPD_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"

#define HTTPD_BODY_CAP 8192 /* a reply body this size needs no allocation */
#define HTTPD_SPARE    16   /* connections over max_conns that may still send a probe */

typedef struct httpd httpd;

/* What a handler answers. The server formats it, adds X-Request-Id and
 * Connection, and frees `big`. */
typedef struct httpd_reply {
    int status;     /* 0: no answer (the client is gone): logged as 499, closed */
    int keep_alive; /* preset from the request; a handler may clear it */
    int head_only;  /* HEAD: the same headers, no body (preset) */
    const char *ctype;
    char extra[128]; /* extra header lines, each ending in \r\n */
    size_t len;
    char body[HTTPD_BODY_CAP];
    char *big; /* a larger body (malloc'd), or NULL */
} httpd_reply;

/* One request and its answer, as a handler sees it. */
typedef struct httpd_exchange {
    void *app; /* httpd_config.app */
    const http_request *req;
    const char *log_id; /* the client's valid X-Request-Id, else "req-N" */
    uint64_t conn_id;
    int fd;        /* the client's socket: poll it (POLLRDHUP) and peek to notice a hang-up, or write
                      an interim 1xx response before the answer; nothing else */
    int cancel_fd; /* readable when the request must stop (a forced shutdown), or -1 */
    int on_loop;   /* runs on the loop thread: must not block (answer 503 rather than wait) */
    int draining;  /* httpd_drain has begun */
    httpd_reply reply;
} httpd_exchange;

typedef void httpd_handler(httpd_exchange *x);

#define HTTPD_ON_LOOP 1u /* cheap and non-blocking: answered on the loop thread */
#define HTTPD_PROBE   3u /* a probe: on the loop, and answered even over max_conns */

typedef struct httpd_route {
    const char *path;          /* "/x", or "/x/": that prefix and one more segment */
    const char *methods;       /* space-separated, case-sensitive; GET implies HEAD */
    const char *const *params; /* the query parameters it takes (NULL-terminated; NULL: none) */
    httpd_handler *fn;
    unsigned flags; /* HTTPD_ON_LOOP, HTTPD_PROBE or 0 (dispatched) */
} httpd_route;

typedef struct httpd_config {
    const char *listen_addr; /* host:port, [v6]:port or :port; port 0 picks one */
    const char *addr_name;   /* the setting it came from, for errors ("LISTEN_ADDR") */
    unsigned max_conns;
    uint64_t header_timeout_ns, idle_timeout_ns, write_timeout_ns;
    const httpd_route *routes;
    size_t nroutes;
    void *app;
    /* Run x off the loop: 0 if taken, and then httpd_exchange_run(x, ...)
     * at most once and httpd_exchange_done(x) exactly once, in that order,
     * from any thread; -1 if refused (x gets 503). NULL: every request is
     * answered on the loop. Called on the loop thread; must not block. */
    int (*dispatch)(void *app, httpd_exchange *x);
    const char *log_level; /* of "request" lines below 500 ("info"; 5xx are "warn") */
} httpd_config;

enum { HTTPD_OK = 0, HTTPD_EADDR = -1, HTTPD_ELISTEN = -2, HTTPD_ENOMEM = -3 };

/* Resolve cfg->listen_addr and listen on it (the actual address, port 0
 * resolved, goes to `bound`). cfg and the route table must outlive the
 * server. HTTPD_OK, or HTTPD_EADDR (the address does not parse or resolve),
 * HTTPD_ELISTEN (bind/listen failed) or HTTPD_ENOMEM, with one line in err
 * that names cfg->addr_name. */
int httpd_create(httpd **out, const httpd_config *cfg, char *bound, size_t boundlen, char *err,
                 size_t errlen);

/* Serve until one of fds[0..nfds) (at most 4) turns readable, and return its
 * index; -1 if poll() fails for good. Call again to go on. */
int httpd_run(httpd *h, const int *fds, size_t nfds);

/* Begin the drain (see above). Loop thread, between httpd_run calls. */
void httpd_drain(httpd *h);

/* The end of the drain: close the listener and every connection waiting
 * for a request, and serve until the answers already made (also those of
 * exchanges handed back meanwhile) are written, or deadline_ns (tp_now_ns
 * clock) has passed. Connections of exchanges still running stay open. */
void httpd_finish(httpd *h, uint64_t deadline_ns);

/* Close the listener and every connection, free h. Only once no dispatched
 * exchange is outstanding (every httpd_exchange_done has been called). */
void httpd_destroy(httpd *h);

/* Open connections (gauge), and whether the drain has begun. Any thread. */
unsigned httpd_open_conns(httpd *h);
int httpd_draining(httpd *h);

/* On the dispatcher's thread: run the handler (cancel_fd: x->cancel_fd for
 * it) and format its answer, which the loop writes and logs. */
void httpd_exchange_run(httpd_exchange *x, int cancel_fd);

/* Hand the connection back to the loop: exactly once per dispatched
 * exchange, after httpd_exchange_run or instead of it (then the client gets
 * 503). x must not be touched afterwards. */
void httpd_exchange_done(httpd_exchange *x);

/* Reply helpers: a JSON body, and {"error":msg} (with Retry-After: 1 for 503
 * and 429). msg must need no JSON escaping. */
void httpd_reply_json(httpd_reply *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void httpd_reply_error(httpd_reply *r, int status, const char *msg);

#endif
