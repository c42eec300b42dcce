/*
 * metrics.c -- GET /metrics on the examples' HTTP server (see metrics.h).
 *
 * One route, answered on the server's loop thread (HTTPD_ON_LOOP, no
 * dispatcher): rendering is a few counters into a buffer, cheaper than a
 * thread hand-off. The body grows on the heap when the render asks for more.
 */
#define _GNU_SOURCE
#include "metrics.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "httpd.h"

#define METRICS_CONNS    64
#define METRICS_HEAD_NS  (2 * 1000000000ull)  /* a scraper sends its head at once */
#define METRICS_IDLE_NS  (90 * 1000000000ull) /* longer than a usual scrape interval */
#define METRICS_WRITE_NS (10 * 1000000000ull)
#define METRICS_FIRST    (64 * 1024) /* first guess at the body's size */

struct metrics_server {
    httpd *http;
    httpd_config cfg;
    int stop[2];
    pthread_t thread;
    metrics_render_fn render;
    void *arg;
};

static void handle_metrics(httpd_exchange *x) {
    metrics_server *m = x->app;
    httpd_reply *r = &x->reply;
    size_t cap = METRICS_FIRST;
    for (int tries = 0; tries < 3; tries++) { /* counters may grow between sizing and writing */
        char *buf = malloc(cap);
        if (buf == NULL) break;
        int n = m->render(m->arg, buf, cap);
        if (n >= 0 && (size_t)n < cap) {
            r->big = buf;
            r->len = (size_t)n;
            r->status = 200;
            r->ctype = "text/plain; version=0.0.4; charset=utf-8";
            return;
        }
        free(buf);
        if (n < 0) break;
        cap = (size_t)n + 4096;
    }
    httpd_reply_error(r, 500, "metrics could not be written");
}

static const char *const no_params[] = {NULL};
static const httpd_route routes[] = {
    {"/metrics", "GET", no_params, handle_metrics, HTTPD_ON_LOOP},
};

static void *loop(void *arg) {
    metrics_server *m = arg;
    /* Returns 0 once stop is readable; -1 only if poll() fails for good. */
    (void)httpd_run(m->http, &m->stop[0], 1);
    return NULL;
}

metrics_server *metrics_start(const char *addr, metrics_render_fn render, void *arg, char *bound,
                              size_t boundlen, char *err, size_t errlen) {
    metrics_server *m = calloc(1, sizeof *m);
    if (m == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->render = render;
    m->arg = arg;
    m->cfg = (httpd_config){
        .listen_addr = addr,
        .addr_name = "METRICS_ADDR",
        .max_conns = METRICS_CONNS,
        .header_timeout_ns = METRICS_HEAD_NS,
        .idle_timeout_ns = METRICS_IDLE_NS,
        .write_timeout_ns = METRICS_WRITE_NS,
        .routes = routes,
        .nroutes = sizeof routes / sizeof routes[0],
        .app = m,
        .log_level = "debug",
    };
    if (httpd_create(&m->http, &m->cfg, bound, boundlen, err, errlen) != HTTPD_OK) {
        free(m);
        return NULL;
    }
    if (pipe2(m->stop, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "cannot start the metrics thread");
        httpd_destroy(m->http);
        free(m);
        return NULL;
    }
    if (pthread_create(&m->thread, NULL, loop, m) != 0) {
        snprintf(err, errlen, "cannot start the metrics thread");
        close(m->stop[0]);
        close(m->stop[1]);
        httpd_destroy(m->http);
        free(m);
        return NULL;
    }
    return m;
}

void metrics_stop(metrics_server *m) {
    if (m == NULL) return;
    if (write(m->stop[1], "x", 1) < 0) {
        /* a fresh pipe cannot be full */
    }
    pthread_join(m->thread, NULL);
    httpd_destroy(m->http);
    close(m->stop[0]);
    close(m->stop[1]);
    free(m);
}
