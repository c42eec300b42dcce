/*
 * metrics.h -- GET /metrics for Prometheus, served by the examples' HTTP
 * server (examples/common/httpd.h) on a thread of its own.
 *
 * The thread runs the server's poll loop: every connection is read without
 * blocking and has a total deadline for its request head (2 s), so a slow or
 * hostile client never makes a scrape wait; keep-alive, HEAD, 405 + Allow,
 * 400 without Host and the other HTTP/1.1 rules are the server's. At most 64
 * connections (then the oldest idle one is closed) plus the server's spare
 * slots. Request lines are logged at level debug.
 */
#ifndef TPS_METRICS_H
#define TPS_METRICS_H

#include <stddef.h>

/* Writes the body into buf (like snprintf: returns the length needed). Runs
 * on the metrics thread. */
typedef int (*metrics_render_fn)(void *arg, char *buf, size_t len);

typedef struct metrics_server metrics_server;

/* Listen on `addr` ("host:port"; port 0 picks a free one, written to `bound`)
 * and start the thread. NULL with a one-line reason in err on failure. */
metrics_server *metrics_start(const char *addr, metrics_render_fn render, void *arg, char *bound,
                              size_t boundlen, char *err, size_t errlen);

/* Stop the thread, close the socket and every connection, free. NULL is fine. */
void metrics_stop(metrics_server *m);

#endif
