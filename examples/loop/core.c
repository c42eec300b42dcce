/*
 * core.c -- the loop servers' core: clients and their buffers, the task
 * pool, the completion queue, the drain (the protocol is in loop.h).
 *
 * One thread. Everything here runs on the loop thread: the loop hands in
 * bytes and readiness, and the pool hands back completions through
 * tp_cq_drain(), which the loop calls when tp_cq_fd() is readable. So a
 * request's on_done (done() below) runs where the connection lives and
 * writes the answer into the client's buffer without a lock, as libuv's
 * after_work_cb would. The only code that runs on a pool thread is work(),
 * and it reads nothing but its request's `ms`, written before tp_submit().
 *
 * Bounded, and allocated up front:
 *   - requests in flight: the completion queue has WORKERS + QUEUE_CAPACITY
 *     places, as many as the pool can hold unfinished. A request's record
 *     is taken when tp_submit() accepts it and given back by its on_done,
 *     before the drain gives the queue's place back, so records in use <=
 *     places taken. The table has one record more than the queue has
 *     places: one is always free for the next attempt, and a refusal is
 *     always the pool's own TP_EFULL (its queue, or the completion queue,
 *     is full), counted in its rejected_full.
 *   - per client: MAX_LINE + 2 bytes of input and an OUTPUT_LIMIT ring of
 *     output, allocated when it connects; at most MAX_CLIENTS clients.
 *
 * Slow readers. Lines are parsed only while less than half of OUTPUT_LIMIT
 * is unread; above it the client is paused (its socket is not read, so TCP
 * pushes back on it) until less than a quarter is. A parsed line adds at
 * most LP_REPLY_MAX bytes and OUTPUT_LIMIT >= 2 x LP_REPLY_MAX, so immediate
 * replies always fit; only answers of work already in flight can overflow.
 * A client whose answer does not fit is dropped and its other work
 * cancelled: the server neither blocks on a client nor buffers without bound.
 *
 * Hang-ups. A connection that fails (reset, write error) has its work in
 * flight cancelled with tp_cancel(); its socket closes at once, and the
 * client record stays, without its buffers, until the last completion of
 * that work is drained. Every accepted task completes exactly once through
 * the queue (a cancelled one with TP_ECANCELED), so the record is always
 * freed. End of input is not a failure: the work in flight is answered,
 * then the connection closes.
 *
 * Drain. lp_server_begin_drain() closes the pool (later WORK gets CLOSED)
 * and a client closes once nothing of it is in flight or unwritten. When
 * the last record is back, every task has ended and the pool stops at once.
 * A client that stops reading would keep its answers unwritten for ever:
 * one that has nothing in flight and output unwritten at nine tenths of the
 * budget is dropped (slow_dropped), so that only work the pool could not
 * end in time makes a drain forced, never a client's socket.
 *
 * Idle clients. A client with nothing in flight and nothing to write that
 * sends nothing for IDLE_TIMEOUT (since it connected, last sent bytes or
 * last had output written) is closed, lingering (below, reason "idle
 * timeout"), so that silent connections cannot hold the MAX_CLIENTS places
 * for ever. Work in flight is not idleness: TASK_TIMEOUT bounds it. Answers
 * not yet taken are not either, but the slow-reader rules above bound only
 * their bytes, not their time: a client that takes none of them (it does not
 * read, and while paused what it sends is not read either) would hold its
 * place for ever, even trickling bytes in. So one with nothing in flight
 * whose output has not moved (out_moved_ns) for IDLE_TIMEOUT is dropped
 * (slow_dropped; its unwritten answers are lost, as at the drain's end),
 * half-closed or not.
 *
 * Lingering close. A server that closes a socket whose peer has sent more
 * than it read (a client that pipelines requests past a protocol error or
 * into a drain) makes the kernel answer with a reset, and a reset can
 * destroy the replies at the peer before it read them: "written" only means
 * handed to the kernel. So a close the client did not ask for (a protocol
 * error, the drain) first ends the server's output (a FIN after the
 * replies), then reads and drops input until the client closes too, for
 * LINGER_NS at most (and, while draining, never past nine tenths of the
 * drain's budget, so that a client that never closes cannot turn a drain
 * into a forced one). An idle client (above) is closed the same way. A lingering client holds no MAX_CLIENTS place; at
 * most MAX_CLIENTS linger (one more closes at once).
 */
#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "loop.h"

/* Completions run per readiness of the queue's descriptor: the rest wait
 * for the next loop iteration (the descriptor stays readable), so a burst
 * of answers cannot starve the sockets. */
#define DRAIN_BATCH 256

/* The longest lingering close (see the top of the file). */
#define LINGER_NS (2 * SVC_NS_PER_S)

struct lp_job {
    lp_client *client;   /* NULL while free */
    lp_job *prev, *next; /* the client's requests in flight; `next` links the free list */
    uint64_t task_id;
    uint64_t seq; /* the request's number on its connection */
    unsigned ms;  /* read by work() on a pool thread; written before tp_submit() */
};

/* ------------------------------------------------------------------ the work */

/* Runs on a pool thread. tp_ctx_sleep() returns early, with the reason, when
 * the request is cancelled (its client hung up, or a forced shutdown) or
 * TASK_TIMEOUT passes; that status is the answer. */
static int work(tp_ctx *ctx, void *arg) {
    const lp_job *j = arg;
    return tp_ctx_sleep(ctx, (uint64_t)j->ms * SVC_NS_PER_MS);
}

/* ------------------------------------------------------------------ output */

static bool paused_by_output(const lp_client *c) { return c->out_len >= c->out_cap / 2; }

static void close_now(lp_client *c) {
    c->closing = true;
    c->reading = false;
    c->srv->ops.close(c);
}

static void cancel_work(lp_client *c) {
    for (lp_job *j = c->jobs; j != NULL; j = j->next)
        (void)tp_cancel(c->srv->pool, j->task_id); /* TP_ENOTFOUND: it has ended; its completion waits */
}

static void log_client(const char *level, const char *msg, const lp_client *c, const char *why) {
    svc_log ev;
    svc_log_begin(&ev, level, msg);
    svc_log_uint(&ev, "client", c->id);
    svc_log_str(&ev, "peer", c->peer);
    if (why != NULL) svc_log_str(&ev, "reason", why);
    svc_log_uint(&ev, "inflight", c->inflight);
    svc_log_uint(&ev, "unwritten", c->out_len);
    svc_log_end(&ev);
}

/* Append a reply. When it does not fit, the client is too slow: dropped. */
static bool reply(lp_client *c, const char *fmt, ...) {
    char line[LP_REPLY_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    assert(n > 0 && (size_t)n < sizeof line);
    if ((size_t)n > c->out_cap - c->out_len) {
        c->srv->n.slow_dropped++;
        log_client("warn", "client_dropped", c, "slow reader: output limit reached");
        cancel_work(c);
        close_now(c);
        return false;
    }
    bool was_empty = c->out_len == 0;
    size_t tail = (c->out_head + c->out_len) % c->out_cap, first = c->out_cap - tail;
    if (first > (size_t)n) first = (size_t)n;
    memcpy(c->out + tail, line, first);
    memcpy(c->out, line + first, (size_t)n - first);
    c->out_len += (size_t)n;
    if (was_empty) {
        c->out_moved_ns = tp_now_ns();
        c->srv->ops.want_write(c);
    }
    return true;
}

static int format_counters(const lp_server *s, char *buf, size_t len) {
    tp_stats st;
    tp_stats_get(s->pool, &st);
    const lp_counters *n = &s->n;
    unsigned paused_now = 0;
    for (const lp_client *c = s->clients; c != NULL; c = c->next) paused_now += c->paused && !c->closing;
    return snprintf(
        buf, len,
        "{\"clients\":%u,\"waiting_clients\":%u,\"inflight\":%u,\"accepted\":%llu,"
        "\"refused\":%llu,\"requests\":%llu,\"work\":%llu,\"answered\":%llu,\"busy\":%llu,"
        "\"limit\":%llu,\"closed\":%llu,\"errors\":%llu,\"hangups\":%llu,\"orphaned\":%llu,"
        "\"slow_dropped\":%llu,\"paused\":%llu,\"paused_now\":%u,\"active\":%u,\"queued\":%u,\"draining\":%"
        "s}",
        s->open_clients, s->waiting_clients, s->jobs_in_use, (unsigned long long)n->accepted,
        (unsigned long long)n->refused, (unsigned long long)n->requests, (unsigned long long)n->work,
        (unsigned long long)n->answered, (unsigned long long)n->busy, (unsigned long long)n->limit,
        (unsigned long long)n->closed, (unsigned long long)n->errors, (unsigned long long)n->hangups,
        (unsigned long long)n->orphaned, (unsigned long long)n->slow_dropped, (unsigned long long)n->paused,
        paused_now, st.active, st.queued, s->draining ? "true" : "false");
}

/* ------------------------------------------------------------------ requests */

static void unlink_client(lp_client *c) {
    lp_server *s = c->srv;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->clients = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
}

static void refresh(lp_client *c);

/* on_done of every request, run by tp_cq_drain() on the loop thread. */
static void done(void *arg, int status) {
    lp_job *j = arg;
    lp_client *c = j->client;
    lp_server *s = c->srv;
    if (j->prev != NULL)
        j->prev->next = j->next;
    else
        c->jobs = j->next;
    if (j->next != NULL) j->next->prev = j->prev;
    uint64_t seq = j->seq;
    j->client = NULL;
    j->prev = NULL;
    j->next = s->free_jobs;
    s->free_jobs = j;
    s->jobs_in_use--;
    c->inflight--;
    if (c->closing) { /* hung up or dropped: nobody to answer */
        s->n.orphaned++;
        if (c->closed && c->inflight == 0) {
            s->waiting_clients--;
            unlink_client(c);
            s->ops.release(c);
        }
        return;
    }
    if (!reply(c, "OK %llu %s\n", (unsigned long long)seq, tp_err_name(status))) return;
    s->n.answered++;
    refresh(c);
}

static void submit(lp_client *c, uint64_t seq, const lp_request *r) {
    lp_server *s = c->srv;
    lp_job *j = s->free_jobs;
    assert(j != NULL); /* one more record than places (see the top) */
    int rc = TP_ENOMEM;
    if (j != NULL) {
        char log_id[64];
        snprintf(log_id, sizeof log_id, "c%llu-%llu", (unsigned long long)c->id, (unsigned long long)seq);
        j->ms = r->ms;
        tp_task_opts o = {.user = r->user, .on_done = done, .log_id = log_id, .cq = s->cq};
        rc = tp_submit(s->pool, work, j, &o, &j->task_id);
    }
    const unsigned long long n = seq;
    switch (rc) {
    case TP_OK:
        /* on_done runs only in a drain on this thread: filling the record in
         * after the submit is safe even if the work has already ended */
        s->free_jobs = j->next;
        j->client = c;
        j->seq = seq;
        j->prev = NULL;
        j->next = c->jobs;
        if (c->jobs != NULL) c->jobs->prev = j;
        c->jobs = j;
        c->inflight++;
        s->jobs_in_use++;
        s->n.work++;
        return;
    case TP_EFULL:
        s->n.busy++;
        reply(c, "BUSY %llu\n", n);
        return;
    case TP_EUSERLIMIT:
        s->n.limit++;
        reply(c, "LIMIT %llu\n", n);
        return;
    case TP_ECLOSED:
        s->n.closed++;
        reply(c, "CLOSED %llu\n", n);
        return;
    default:
        s->n.errors++;
        reply(c, "ERR %llu %s\n", n, tp_strerror(rc));
        return;
    }
}

static void handle_line(lp_client *c, const char *line, size_t len) {
    lp_server *s = c->srv;
    const uint64_t seq = ++c->seq;
    const unsigned long long n = seq;
    s->n.requests++;
    size_t body = len > 0 && line[len - 1] == '\r' ? len - 1 : len;
    if (body > s->cfg.max_line) {
        s->n.errors++;
        c->finish = true;
        reply(c, "ERR %llu line too long\n", n);
        return;
    }
    lp_request r;
    lp_parse(line, len, &r);
    switch (r.kind) {
    case LP_REQ_WORK: submit(c, seq, &r); return;
    case LP_REQ_PING: reply(c, "PONG %llu\n", n); return;
    case LP_REQ_STATS: {
        char json[LP_REPLY_MAX - 32];
        int k = format_counters(s, json, sizeof json);
        reply(c, "STATS %llu %s\n", n, k > 0 && (size_t)k < sizeof json ? json : "{}");
        return;
    }
    default:
        s->n.errors++;
        reply(c, "ERR %llu %s\n", n, r.error);
        return;
    }
}

/* Parse the complete lines received, while the output has room. */
static void process_lines(lp_client *c) {
    while (!c->closing && !c->finish && !c->lingering && !paused_by_output(c)) {
        char *line = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off, len;
        char *nl = memchr(line, '\n', avail);
        if (nl != NULL) {
            len = (size_t)(nl - line);
            c->in_off += len + 1;
        } else if (c->eof && avail > 0) { /* the last line, without its newline */
            len = avail;
            c->in_off += len;
        } else {
            if (c->in_off == 0 && avail == c->in_cap) { /* the buffer holds a part of one line */
                c->in_off = c->in_len;
                handle_line(c, line, avail); /* too long: answered, then closed */
            }
            break;
        }
        handle_line(c, line, len);
    }
    if (c->closing) return;
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
}

/* Nine tenths of the drain's budget: lingering closes and clients that
 * leave their answers unread end by then. */
static uint64_t drain_end(const lp_server *s) {
    return s->drain_started_ns + s->cfg.shutdown_timeout_ns / 10 * 9;
}

/* While draining, a lingering close ends by nine tenths of the budget. */
static void linger_within_drain(lp_client *c, uint64_t now) {
    uint64_t end = drain_end(c->srv);
    if (end < c->linger_until) c->linger_until = end > now ? end : now;
}

/* Output ended (ops.half_close); input read and dropped until the peer
 * closes, or until linger_until (lp_server_timers). */
static void begin_linger(lp_client *c, const char *why) {
    lp_server *s = c->srv;
    if (s->lingering >= s->cfg.max_clients) {
        log_client("debug", "client_done", c, why);
        close_now(c); /* too many linger already */
        return;
    }
    uint64_t now = tp_now_ns();
    c->linger_until = now + LINGER_NS;
    if (s->draining) linger_within_drain(c, now);
    s->lingering++;
    c->lingering = true;
    c->in_len = c->in_off = 0;
    log_client("debug", "client_done", c, why);
    s->ops.half_close(c);
}

/* After every change: pause or resume, parse, read or not, close when done. */
static void refresh(lp_client *c) {
    lp_server *s = c->srv;
    if (c->closing) return;
    if (c->paused && c->out_len <= c->out_cap / 4) c->paused = false;
    if (!c->paused) process_lines(c);
    if (c->closing) return;
    if (!c->paused && paused_by_output(c)) {
        c->paused = true;
        s->n.paused++;
    }
    /* Everything answered and written: close after end of input; after a
     * protocol error or during the drain, close lingering (see the top of
     * the file): output ends now, the socket closes at the peer's end of
     * input or when the lingering runs out. */
    bool done = c->inflight == 0 && c->out_len == 0 && (c->eof || c->finish || s->draining);
    if (done && !c->eof && !c->lingering) {
        begin_linger(c, c->finish ? "protocol error" : "drain");
        if (c->closing) return;
    }
    /* After a protocol error, and while lingering, input is still read, and
     * dropped: closing with unread input would send a reset that can
     * destroy the answers at the peer. */
    bool want = !c->eof && (c->finish || c->lingering || !c->paused);
    if (want != c->reading) {
        c->reading = want;
        s->ops.set_reading(c, want);
        if (c->closing) return; /* the loop could not (lp_client_failed) */
    }
    if (done && c->eof) {
        if (!c->lingering) log_client("debug", "client_done", c, "end of input");
        close_now(c);
    }
}

/* ------------------------------------------------------------------ clients */

int lp_client_open(lp_server *s, lp_client *c, const char *peer) {
    memset(c, 0, sizeof *c);
    c->srv = s;
    c->in_cap = (size_t)s->cfg.max_line + 2; /* the line, '\r', '\n' */
    c->out_cap = s->cfg.output_limit;
    c->in = malloc(c->in_cap);
    c->out = malloc(c->out_cap);
    if (c->in == NULL || c->out == NULL) {
        free(c->in);
        free(c->out);
        return -1;
    }
    c->id = s->next_client++;
    c->active_ns = tp_now_ns();
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->reading = true;
    c->next = s->clients;
    if (s->clients != NULL) s->clients->prev = c;
    s->clients = c;
    s->open_clients++;
    s->n.accepted++;
    log_client("debug", "client_open", c, NULL);
    return 0;
}

void lp_client_read_buf(lp_client *c, char **buf, size_t *len) {
    assert(c->reading && c->in_len < c->in_cap); /* refresh() stops reading before it fills */
    *buf = c->in + c->in_len;
    *len = c->in_cap - c->in_len;
}

void lp_client_received(lp_client *c, size_t len) {
    if (c->closing) return;
    c->active_ns = tp_now_ns();
    c->in_len += len;
    if (c->finish || c->lingering) c->in_len = c->in_off = 0; /* see refresh() */
    refresh(c);
}

void lp_client_eof(lp_client *c) {
    if (c->closing) return;
    c->eof = true;
    refresh(c);
}

void lp_client_failed(lp_client *c, const char *why) {
    if (c->closing) return;
    if (c->inflight > 0) c->srv->n.hangups++;
    log_client("info", "client_failed", c, why);
    cancel_work(c);
    close_now(c);
}

size_t lp_client_output(const lp_client *c, const char **buf) {
    if (c->closed || c->out_len == 0) return 0;
    size_t run = c->out_cap - c->out_head;
    *buf = c->out + c->out_head;
    return run < c->out_len ? run : c->out_len;
}

void lp_client_sent(lp_client *c, size_t len) {
    assert(len <= c->out_len);
    c->out_len -= len;
    c->out_head = c->out_len == 0 ? 0 : (c->out_head + len) % c->out_cap;
    c->active_ns = c->out_moved_ns = tp_now_ns();
    refresh(c);
}

void lp_client_closed(lp_client *c) {
    lp_server *s = c->srv;
    assert(!c->closed);
    c->closing = c->closed = true;
    free(c->in);
    free(c->out);
    c->in = c->out = NULL;
    c->in_len = c->in_off = c->out_len = 0;
    s->open_clients--;
    if (c->lingering) s->lingering--;
    log_client("debug", "client_closed", c, NULL);
    if (c->inflight > 0) { /* released by the last done() */
        s->waiting_clients++;
        return;
    }
    unlink_client(c);
    s->ops.release(c);
}

/* ------------------------------------------------------------------ the server */

int lp_server_init(lp_server *s, const lp_config *cfg, const lp_ops *ops, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->ops = *ops;
    s->next_client = 1;
    unsigned places = cfg->workers + cfg->queue_capacity;
    s->njobs = places + 1; /* see the top of the file */
    s->job_table = calloc(s->njobs, sizeof *s->job_table);
    if (s->job_table == NULL) {
        snprintf(err, errlen, "out of memory for %u request records", s->njobs);
        return -1;
    }
    for (unsigned i = 0; i + 1 < s->njobs; i++) s->job_table[i].next = &s->job_table[i + 1];
    s->free_jobs = s->job_table;
    int rc = tp_cq_create(&s->cq, places);
    if (rc != TP_OK) {
        snprintf(err, errlen, "cannot create the completion queue: %s", tp_strerror(rc));
        free(s->job_table);
        return -1;
    }
    tp_config pc = {
        .workers = cfg->workers,
        .queue_capacity = cfg->queue_capacity,
        .max_per_user = cfg->max_per_user,
        .run_timeout_ns = cfg->task_timeout_ns,
        .drain_timeout_ns = cfg->shutdown_timeout_ns,
        .name = "loop",
        .log = svc_log_hook,
    };
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, &old); /* the pool's threads inherit it */
    rc = tp_create(&s->pool, &pc);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != TP_OK) {
        snprintf(err, errlen, "cannot create the pool: %s", tp_strerror(rc));
        (void)tp_cq_destroy(s->cq);
        free(s->job_table);
        return -1;
    }
    return 0;
}

int lp_server_cq_fd(const lp_server *s) { return tp_cq_fd(s->cq); }

void lp_server_complete(lp_server *s) { (void)tp_cq_drain(s->cq, DRAIN_BATCH); }

bool lp_server_has_room(const lp_server *s) {
    return !s->draining && s->open_clients - s->lingering < s->cfg.max_clients;
}

void lp_server_refused(lp_server *s) { s->n.refused++; }

void lp_server_log_listening(const lp_server *s, int lfd, const char *loop) {
    char addr[80];
    lp_sock_name(lfd, 0, addr, sizeof addr);
    const lp_config *c = &s->cfg;
    svc_log ev;
    svc_log_begin_always(&ev, "info", "listening");
    svc_log_str(&ev, "address", addr);
    svc_log_str(&ev, "loop", loop);
    svc_log_int(&ev, "pid", (long long)getpid());
    svc_log_uint(&ev, "workers", c->workers);
    svc_log_uint(&ev, "queue_capacity", c->queue_capacity);
    if (c->max_per_user == TP_UNLIMITED)
        svc_log_str(&ev, "max_per_user", "unlimited");
    else
        svc_log_uint(&ev, "max_per_user", c->max_per_user);
    svc_log_uint(&ev, "max_clients", c->max_clients);
    svc_log_uint(&ev, "max_line", c->max_line);
    svc_log_uint(&ev, "output_limit", c->output_limit);
    svc_log_uint(&ev, "task_timeout_ms", c->task_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "shutdown_timeout_ms", c->shutdown_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "idle_timeout_ms", c->idle_timeout_ns / SVC_NS_PER_MS);
    svc_log_str(&ev, "version", LP_VERSION);
    svc_log_str(&ev, "taskpool_version", tp_version());
    svc_log_end(&ev);
}

static void log_counters(svc_log *ev, const lp_server *s) {
    char json[LP_REPLY_MAX];
    int n = format_counters(s, json, sizeof json);
    svc_log_raw(ev, "counters", n > 0 && (size_t)n < sizeof json ? json : "null");
}

void lp_server_begin_drain(lp_server *s, const char *signal_name) {
    if (s->draining) return;
    s->draining = true;
    s->drain_started_ns = tp_now_ns();
    (void)tp_close(s->pool);
    svc_log ev;
    svc_log_begin(&ev, "info", "shutdown_started");
    svc_log_str(&ev, "signal", signal_name);
    svc_log_uint(&ev, "budget_ms", s->cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    log_counters(&ev, s);
    svc_log_end(&ev);
    /* closes the idle ones (lingering); close is deferred, so the list
     * stays intact. Those that linger already end within the budget too. */
    uint64_t now = tp_now_ns();
    for (lp_client *c = s->clients; c != NULL; c = c->next) {
        if (c->lingering && !c->closing) linger_within_drain(c, now);
        refresh(c);
    }
}

/* The time at which `c` is next due (0: none), after closing it if it is
 * due now: idle, lingering too long, or unread at the drain's end. */
static uint64_t client_timer(lp_client *c, uint64_t now) {
    lp_server *s = c->srv;
    if (!s->draining && !c->lingering && c->inflight == 0 && c->out_len > 0) { /* answers untaken: top */
        uint64_t stall_end = c->out_moved_ns + s->cfg.idle_timeout_ns;
        if (now < stall_end) return stall_end;
        s->n.slow_dropped++;
        log_client("warn", "client_dropped", c, "slow reader: no answer taken for IDLE_TIMEOUT");
        close_now(c);
        return 0;
    }
    if (!s->draining && !c->lingering && !c->eof && c->inflight == 0 && c->out_len == 0) {
        uint64_t idle_end = c->active_ns + s->cfg.idle_timeout_ns;
        if (now < idle_end) return idle_end;
        begin_linger(c, "idle timeout");
        if (c->closing) return 0;
        refresh(c); /* reading on, to drop what it sends while lingering */
    }
    if (c->closing) return 0;
    if (c->lingering) {
        if (now < c->linger_until) return c->linger_until;
        log_client("debug", "client_linger_ended", c, NULL);
        close_now(c);
        return 0;
    }
    if (s->draining && c->out_len > 0) { /* answers unread: see the drain at the top */
        if (now < drain_end(s)) return drain_end(s);
        if (c->inflight > 0) return 0; /* its work's end wakes the loop */
        s->n.slow_dropped++;
        log_client("warn", "client_dropped", c, "slow reader: answers unread at the end of the drain");
        close_now(c);
    }
    return 0;
}

uint64_t lp_server_timers(lp_server *s, uint64_t now) {
    uint64_t next = 0;
    for (lp_client *c = s->clients; c != NULL; c = c->next) { /* close is deferred: the list stays intact */
        if (c->closing) continue;
        uint64_t when = client_timer(c, now);
        if (when != 0 && (next == 0 || when < next)) next = when;
    }
    return next;
}

bool lp_server_drained(const lp_server *s) {
    return s->draining && s->clients == NULL && s->jobs_in_use == 0;
}

void lp_server_force(lp_server *s) {
    svc_log ev;
    svc_log_begin(&ev, "warn", "shutdown_forced");
    log_counters(&ev, s);
    svc_log_end(&ev);
    /* The countdown starts here (tp_close() alone started none): 1 ns forces
     * at once. Running work sees the cancellation in tp_ctx_sleep(); queued
     * work ends unrun with TP_ECANCELED. Every completion still comes
     * through the queue; wait for them with tp_cq_wait(), as a thread
     * without a loop would. */
    (void)tp_shutdown(s->pool, 1);
    uint64_t deadline = tp_now_ns() + SVC_NS_PER_S;
    for (;;) {
        while (tp_cq_drain(s->cq, 0) > 0) {
        }
        uint64_t now = tp_now_ns();
        if (s->jobs_in_use == 0 || now >= deadline) break;
        (void)tp_cq_wait(s->cq, deadline - now);
    }
    for (lp_client *c = s->clients; c != NULL; c = c->next)
        if (!c->closing) close_now(c);
}

int lp_server_finish(lp_server *s, bool forced) {
    /* Drained: every record is back, so every task has ended and this returns
     * at once. Forced: it returns the forced result at once. */
    int rc = tp_shutdown(s->pool, SVC_NS_PER_S);
    bool stuck = s->jobs_in_use > 0 || s->clients != NULL;
    int code = !forced && rc == TP_OK && !stuck ? 0 : 1;
    svc_log ev;
    svc_log_begin(&ev, code == 0 ? "info" : "warn", "shutdown_complete");
    svc_log_str(&ev, "result", stuck ? "stuck" : code == 0 ? "drained" : "forced");
    svc_log_str(&ev, "pool", tp_err_name(rc));
    svc_log_uint(&ev, "ms", s->draining ? (tp_now_ns() - s->drain_started_ns) / SVC_NS_PER_MS : 0);
    svc_log_int(&ev, "exit_code", code);
    log_counters(&ev, s);
    tp_stats st;
    char json[1024];
    tp_stats_get(s->pool, &st);
    int n = tp_stats_format(&st, TP_FORMAT_JSON, json, sizeof json);
    svc_log_raw(&ev, "stats", n > 0 && (size_t)n < sizeof json ? json : "null");
    svc_log_end(&ev);
    if (stuck) return code; /* a task ignoring cancellation holds its record: the exit frees it */
    tp_destroy(s->pool);
    rc = tp_cq_destroy(s->cq); /* every task ended and every completion ran: TP_OK */
    if (rc != TP_OK) {
        svc_log_begin(&ev, "error", "cq_destroy_failed");
        svc_log_str(&ev, "error", tp_err_name(rc));
        svc_log_end(&ev);
        return 1;
    }
    free(s->job_table);
    return code;
}
