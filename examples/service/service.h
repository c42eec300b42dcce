/*
 * service.h -- state shared by main.c and the routes (routes.c).
 *
 * Two pools, one per resource (the book's advice): `tasks` runs the
 * background work admitted by POST /tasks, bounded by WORKERS and
 * QUEUE_CAPACITY; `conns` runs the requests, one task each, bounded by
 * MAX_CONNS (the server holds at most that many connections, each with at
 * most one request in progress). A flood of requests therefore cannot take
 * the workers that run accepted tasks, and a flood of tasks cannot stop the
 * service from answering 503 quickly. The server (`http`, httpd.h) reads
 * requests and keeps idle connections on its own thread, at no worker's cost.
 */
#ifndef SVC_SERVICE_H
#define SVC_SERVICE_H

#include <stddef.h>

#include "config.h"
#include "httpd.h"
#include "taskpool.h"
#include "tasks.h"

/* The service's own version (its HTTP interface and settings); --version
 * prints it with the library's, tp_version(). */
#define SVC_VERSION "1.2.0"

typedef struct svc {
    svc_config cfg;
    tp_pool *tasks;
    tp_pool *conns;
    svc_tasks table; /* recent tasks, for GET/DELETE /tasks/{id} */
    httpd *http;     /* the server, for its gauges (open connections, draining) */
} svc;

/* The routes, for httpd_config (routes.c). */
extern const httpd_route svc_routes[];
extern const size_t svc_nroutes;

/* httpd_config.dispatch: run the request as a task of the connection pool. */
int svc_dispatch(void *app, httpd_exchange *x);

#endif
