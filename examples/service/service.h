/*
 * service.h -- state shared by the acceptor (main.c) and the connection
 * handlers (conn.c).
 *
 * Two pools, one per resource (the book's advice): `tasks` runs the
 * background work admitted by POST /tasks, bounded by WORKERS and
 * QUEUE_CAPACITY; `conns` runs one task per open connection, bounded by
 * MAX_CONNS. A flood of connections therefore cannot take the workers that
 * run accepted tasks, and a flood of tasks cannot stop the service from
 * answering 503 quickly.
 */
#ifndef SVC_SERVICE_H
#define SVC_SERVICE_H

#include <stdatomic.h>
#include <stdint.h>

#include "config.h"
#include "taskpool.h"
#include "tasks.h"

/* The service's own version (its HTTP interface and settings); --version
 * prints it with the library's, tp_version(). */
#define SVC_VERSION "1.1.0"

typedef struct svc {
    svc_config cfg;
    tp_pool *tasks;
    tp_pool *conns;
    svc_tasks table; /* recent tasks, for GET/DELETE /tasks/{id} */
    /* Set once by the shutdown; from then on idle keep-alive connections
     * close and every response carries Connection: close. drain_fd (the read
     * end of a pipe written once, never read) turns readable at the same
     * moment so that connections waiting in poll() notice at once. */
    atomic_int draining;
    int drain_fd;
    atomic_uint open_conns;  /* connections accepted and not yet closed */
    atomic_ullong next_conn; /* connection numbers, for the logs */
    atomic_ullong next_req;  /* request numbers: generated log ids req-N */
} svc;

/* Serve the accepted, non-blocking socket `fd` on the connection pool. Takes
 * ownership of fd in every case: on refusal (connection limit reached, pool
 * full or closed) it answers 503 and closes it. */
void svc_conn_accept(svc *s, int fd, const char *peer);

/* During the drain, on the main thread: read one request from `fd` (head
 * timeout min(HEADER_TIMEOUT, 1 s)), answer it with Connection: close --
 * 503 for /readyz, /healthz, POST /tasks and /work; the usual answer for
 * /stats, /metrics and /tasks/{id} -- and close fd. */
void svc_conn_serve_draining(svc *s, int fd, const char *peer);

#endif
