/*
 * loop.h -- what the two event-loop servers share.
 *
 * taskpool-loop-uv (uv_main.c) and taskpool-loop-epoll (epoll_main.c) are the
 * same line-protocol TCP server on two event loops. Each request's work runs
 * in a libtaskpool pool; its on_done runs on the loop thread, inside
 * tp_cq_drain(), when the loop sees the completion queue's descriptor
 * readable, and writes the answer into the client's output buffer there:
 * the connection state is touched by the loop thread only, without a lock.
 *
 *   config.c  environment settings, --help/--version, the listening socket
 *   proto.c   the request parser (pure functions)
 *   core.c    clients, their buffers, the pool, the completion queue, the
 *             drain; everything except the I/O calls of one loop
 *   uv_main.c, epoll_main.c
 *             the I/O: one calls libuv, the other epoll; each hands the core
 *             its bytes and does what the core asks through lp_ops
 *
 * The protocol, one reply line per request line; <n> is the request's
 * number on its connection (1 for the first line), so that a client can
 * match replies that come out of order:
 *   WORK <ms> [<user>]  run <ms> ms of work in the pool (0..LP_WORK_MS_MAX),
 *                       counted against <user>'s MAX_PER_USER slots
 *        -> OK <n> <status>  when it ended, in the order work ends; status
 *                            TP_OK, TP_ETIMEDOUT (TASK_TIMEOUT) or
 *                            TP_ECANCELED (forced shutdown)
 *        -> BUSY <n>         TP_EFULL: the queue is full (a 503: retry later)
 *        -> LIMIT <n>        TP_EUSERLIMIT: <user> has MAX_PER_USER unfinished
 *        -> CLOSED <n>       TP_ECLOSED: the server is draining
 *   PING  -> PONG <n>
 *   STATS -> STATS <n> {json}  the server's counters
 *   anything else -> ERR <n> <reason>; a line longer than MAX_LINE bytes gets
 *   "ERR <n> line too long" and then the connection closes (lingering: the
 *   server's output ends first, and what the client sends meanwhile is read
 *   and dropped until it closes too, for 2 s at most; core.c).
 * A connection over MAX_CLIENTS gets "BUSY 0 too many clients" and is closed.
 * A client with nothing in flight and nothing unwritten that sends nothing
 * for IDLE_TIMEOUT is closed (lingering, as above).
 * A client with nothing in flight and answers unwritten that takes none of
 * them for IDLE_TIMEOUT is dropped (a slow reader).
 * End of input (a half-close) means "no more requests": the work in flight is
 * answered, then the connection closes.
 */
#ifndef LP_LOOP_H
#define LP_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "taskpool.h"

#define LP_VERSION "1.0.0"

/* ---------------------------------------------------------------- config.c */

#define LP_WORK_MS_MAX 600000u /* 10 minutes: TASK_TIMEOUT cuts it shorter */
#define LP_USER_MAX    64      /* bytes of a user name in WORK */
#define LP_REPLY_MAX   1024    /* the longest immediate reply (STATS) */

typedef struct lp_config {
    char listen_addr[256];        /* LISTEN_ADDR: host:port, port 0 picks a free one */
    unsigned workers;             /* WORKERS */
    unsigned queue_capacity;      /* QUEUE_CAPACITY */
    unsigned max_per_user;        /* MAX_PER_USER, TP_UNLIMITED for "unlimited" */
    unsigned max_clients;         /* MAX_CLIENTS: open connections */
    unsigned max_line;            /* MAX_LINE: bytes of a request line, its newline excluded */
    unsigned output_limit;        /* OUTPUT_LIMIT: unread reply bytes kept per client */
    uint64_t task_timeout_ns;     /* TASK_TIMEOUT: run timeout of each request's work */
    uint64_t shutdown_timeout_ns; /* SHUTDOWN_TIMEOUT: drain budget after SIGTERM/SIGINT */
    uint64_t idle_timeout_ns;     /* IDLE_TIMEOUT: a client silent that long, nothing in flight, is closed */
    int log_level;                /* LOG_LEVEL */
} lp_config;

/* The start of both programs: --help and --version, the environment, the
 * listening socket (non-blocking). Returns -1 when the server should run
 * (*cfg and *lfd filled), else the exit status (0 after --help/--version,
 * 2 for a bad option or setting, 1 when it cannot listen; the reason was
 * printed or logged). `loop` names the event loop in --version ("libuv
 * 1.44.2", "epoll"). Also ignores SIGPIPE: a client that vanished must not
 * kill the server. */
int lp_startup(int argc, char **argv, const char *prog, const char *loop, lp_config *cfg, int *lfd);

/* "ip:port" or "[ip6]:port" of a socket's local or remote address. */
void lp_sock_name(int fd, int peer, char *out, size_t len);

/* ---------------------------------------------------------------- proto.c */

enum { LP_REQ_WORK, LP_REQ_PING, LP_REQ_STATS, LP_REQ_BAD };

typedef struct lp_request {
    int kind;
    unsigned ms;                /* WORK */
    char user[LP_USER_MAX + 1]; /* WORK; "" when none */
    const char *error;          /* LP_REQ_BAD: a static reason */
} lp_request;

/* Parse one request line (without its newline; a trailing '\r' is allowed).
 * Never fails: a line it does not understand is LP_REQ_BAD with a reason. */
void lp_parse(const char *line, size_t len, lp_request *out);

/* ---------------------------------------------------------------- core.c */

typedef struct lp_server lp_server;
typedef struct lp_client lp_client;
typedef struct lp_job lp_job;

/* What the core asks of the loop. Every call comes on the loop thread. */
typedef struct lp_ops {
    /* The client's output went from empty to not empty: write it when the
     * socket takes it (lp_client_output, lp_client_sent). */
    void (*want_write)(lp_client *c);
    /* Stop (on = 0) or resume (1) reading from the client's socket. */
    void (*set_reading)(lp_client *c, int on);
    /* Close the client's socket now. Its pending output is best effort. The
     * loop calls lp_client_closed() later, never from inside this call. */
    void (*close)(lp_client *c);
    /* All output is written: end the sending side (shutdown(SHUT_WR), a FIN
     * after the replies) and keep the socket open for reading. */
    void (*half_close)(lp_client *c);
    /* Free the loop's structure that holds `c`: its socket is closed and no
     * request of it is in flight any more. `c` is not used after this. */
    void (*release)(lp_client *c);
} lp_ops;

/* One connection. The loop embeds it in its own structure (first member)
 * and treats the fields as private to core.c. */
struct lp_client {
    lp_server *srv;
    lp_client *prev, *next; /* the server's clients, open or waiting for their work */
    uint64_t id;
    char peer[64];
    char *in; /* unparsed input [in_off, in_len) */
    size_t in_off, in_len, in_cap;
    char *out; /* a ring of out_cap bytes: out_len unread from out_head */
    size_t out_head, out_len, out_cap;
    uint64_t seq; /* request lines seen */
    lp_job *jobs; /* requests in flight */
    unsigned inflight;
    bool reading;          /* what the loop was last told (set_reading) */
    bool paused;           /* too much output unread: not parsing, not reading */
    bool eof;              /* no more input: answer what is in flight, then close */
    bool finish;           /* like eof, after a protocol error */
    bool lingering;        /* ops.half_close was called: input is read and dropped until the peer closes */
    uint64_t linger_until; /* then closed at this time (tp_now_ns) at the latest */
    uint64_t active_ns;    /* when it connected, last sent bytes or last had output written (IDLE_TIMEOUT) */
    uint64_t out_moved_ns; /* when its output last became pending or had bytes written (IDLE_TIMEOUT) */
    bool closing;          /* ops.close was called */
    bool closed;           /* lp_client_closed was called */
};

/* The server's counters (STATS and the final log line). */
typedef struct lp_counters {
    uint64_t accepted, refused; /* connections */
    uint64_t requests;          /* request lines */
    uint64_t work;              /* WORK admitted to the pool */
    uint64_t busy, limit, closed, errors;
    uint64_t answered;     /* WORK answered with OK */
    uint64_t hangups;      /* connections that failed or reset with work in flight */
    uint64_t orphaned;     /* completions whose client was gone: freed unanswered */
    uint64_t slow_dropped; /* clients dropped because their output filled up */
    uint64_t paused;       /* times reading stopped for a client's unread output */
} lp_counters;

struct lp_server {
    lp_config cfg;
    lp_ops ops;
    tp_pool *pool;
    tp_cq *cq;
    lp_job *job_table, *free_jobs;
    unsigned njobs, jobs_in_use;
    lp_client *clients;
    unsigned open_clients;    /* sockets open, lingering ones included */
    unsigned lingering;       /* of those, lingering (core.c): they hold no MAX_CLIENTS place */
    unsigned waiting_clients; /* sockets closed, work still in flight */
    uint64_t next_client;
    bool draining;
    uint64_t drain_started_ns;
    lp_counters n;
};

/* Create the pool, the completion queue (WORKERS + QUEUE_CAPACITY places:
 * one per request the pool can hold) and the request records, all once. SIGTERM and SIGINT are blocked while the pool
 * starts, so that its threads never take them. 0, or -1 with a reason. */
int lp_server_init(lp_server *s, const lp_config *cfg, const lp_ops *ops, char *err, size_t errlen);

/* The completion queue's descriptor: watch it for reading, level-triggered,
 * and call lp_server_complete() when it is readable. */
int lp_server_cq_fd(const lp_server *s);

/* Run waiting completions: their on_done answers the clients. */
void lp_server_complete(lp_server *s);

/* May one more connection be served? (Else answer LP_TOO_MANY, close it
 * and call lp_server_refused.) */
bool lp_server_has_room(const lp_server *s);
#define LP_TOO_MANY "BUSY 0 too many clients\n"
void lp_server_refused(lp_server *s);

/* The first log line, which tests and scripts read the address from. */
void lp_server_log_listening(const lp_server *s, int lfd, const char *loop);

/* SIGTERM: the loop has closed its listener; admission stops (WORK gets
 * CLOSED), idle clients close, the others once their work is answered and
 * written (one that leaves it unread is dropped: lp_server_timers). */
void lp_server_begin_drain(lp_server *s, const char *signal_name);

/* The clients' deadlines (core.c): close those idle for IDLE_TIMEOUT, those
 * whose lingering close has run out of time, and, while draining, those
 * that leave their answers unread at nine tenths of the budget. Returns the
 * earliest time (tp_now_ns) at which another one is due, 0 if none: the loop
 * must call again by then, and after every iteration. */
uint64_t lp_server_timers(lp_server *s, uint64_t now);

/* Draining, and every client closed and every request freed. */
bool lp_server_drained(const lp_server *s);

/* The drain budget ran out: force the pool's shutdown (running work is
 * cancelled, queued work ends with TP_ECANCELED), wait up to a second for
 * it, run every completion (the answers are best effort) and close every
 * client. Blocks the loop thread for that second at most. */
void lp_server_force(lp_server *s);

/* After the loop has stopped and every client was released: log the outcome,
 * free the pool, the queue and the records. Returns the exit status: 0
 * drained, 1 forced or stuck. */
int lp_server_finish(lp_server *s, bool forced);

/* A new connection: buffers allocated, reading on. 0, or -1 (out of memory:
 * close the socket and free `c`). */
int lp_client_open(lp_server *s, lp_client *c, const char *peer);

/* Where the next read goes: never empty while the client is reading. */
void lp_client_read_buf(lp_client *c, char **buf, size_t *len);
/* `len` bytes were read into that place. */
void lp_client_received(lp_client *c, size_t len);
/* The peer closed its sending side. */
void lp_client_eof(lp_client *c);
/* The connection failed (reset, write error): the work in flight is
 * cancelled, the socket closed; its completions are still drained, freed,
 * unanswered. `why` is logged. */
void lp_client_failed(lp_client *c, const char *why);

/* The next contiguous unread output (0 when none). */
size_t lp_client_output(const lp_client *c, const char **buf);
/* `len` bytes of it were written. */
void lp_client_sent(lp_client *c, size_t len);

/* The socket is closed (after ops.close, or after a failure the loop saw
 * itself and reported with lp_client_failed). */
void lp_client_closed(lp_client *c);

#endif
