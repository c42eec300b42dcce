/*
 * metrics.h -- a minimal HTTP endpoint for Prometheus: GET /metrics.
 *
 * One thread accepts on the configured address and answers each connection
 * with the text produced by the render callback, then closes it. Requests are
 * read with a 1 s timeout and at most 4 KiB, so a slow or hostile client
 * costs one second at most; anything but GET /metrics gets 404.
 */
#ifndef TPS_METRICS_H
#define TPS_METRICS_H

#include <stddef.h>

/* Writes the body into buf (like snprintf: returns the length needed). */
typedef int (*metrics_render_fn)(void *arg, char *buf, size_t len);

typedef struct metrics_server metrics_server;

/* Listen on `addr` ("host:port"; port 0 picks a free one, written to `bound`)
 * and start the thread. NULL with a one-line reason in err on failure. */
metrics_server *metrics_start(const char *addr, metrics_render_fn render, void *arg, char *bound,
                              size_t boundlen, char *err, size_t errlen);

/* Stop the thread, close the socket, free. NULL is fine. */
void metrics_stop(metrics_server *m);

#endif
