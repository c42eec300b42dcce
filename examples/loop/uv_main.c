/*
 * uv_main.c -- taskpool-loop-uv: the loop server of loop.h on libuv.
 *
 * libuv has a thread pool of its own (uv_queue_work), unbounded and
 * without users, refusals or cancellation of running work. This program
 * runs the work in a libtaskpool pool instead and still gets each result
 * back on the loop thread, as uv_queue_work's after_work_cb would come: a
 * uv_poll_t watches tp_cq_fd(), and its callback calls tp_cq_drain()
 * (through lp_server_complete), which runs the requests' on_done right
 * there, where the connections live.
 *
 * Handles: the listener (a uv_tcp_t adopting the socket config.c made), the
 * uv_poll_t of the completion queue, a uv_signal_t each for SIGTERM and
 * SIGINT, the drain budget's uv_timer_t, a uv_prepare_t that closes the
 * clients whose deadline has come (lp_server_timers: lingering closes,
 * IDLE_TIMEOUT; a uv_timer_t wakes the loop for the next one) and ends the loop once the drain is complete (it runs before
 * each poll, so after the close callbacks of the iteration before), and one
 * uv_tcp_t per client. A
 * client's output goes out of the core's ring with one uv_write() at a
 * time; libuv does not copy it, and the ring never overwrites bytes that a
 * write still holds (it only appends into free space).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "config.h"
#include "log.h"
#include "loop.h"

typedef struct uv_client {
    lp_client c; /* first: the core's lp_client * is a uv_client * */
    uv_tcp_t tcp;
    uv_write_t wr;
    uv_shutdown_t sh; /* op_half_close */
    size_t writing;   /* bytes of the write in flight; 0: none */
} uv_client;

static uv_loop_t *loop;
static lp_server srv;
static uv_tcp_t listener;
static uv_poll_t cq_watch;
static uv_signal_t sig_term, sig_int;
static uv_timer_t budget, linger_timer;
static uv_prepare_t finisher;
static bool forced, stopping;

/* The completion queue's descriptor is readable: work has ended. */
static void on_cq(uv_poll_t *h, int status, int events) {
    (void)h;
    (void)status; /* an eventfd does not fail; draining is right either way */
    (void)events;
    lp_server_complete(&srv); /* runs their on_done here, on the loop thread */
}

/* ------------------------------------------------------------------ lp_ops */

static void on_written(uv_write_t *req, int status);

static void start_write(uv_client *u) {
    const char *p;
    size_t n;
    if (u->writing != 0 || uv_is_closing((uv_handle_t *)&u->tcp) || (n = lp_client_output(&u->c, &p)) == 0)
        return;
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    int rc = uv_write(&u->wr, (uv_stream_t *)&u->tcp, &b, 1, on_written);
    if (rc < 0) {
        lp_client_failed(&u->c, uv_strerror(rc));
        return;
    }
    u->writing = n;
}

static void on_written(uv_write_t *req, int status) {
    uv_client *u = req->data;
    size_t n = u->writing;
    u->writing = 0;
    if (status == UV_ECANCELED || uv_is_closing((uv_handle_t *)&u->tcp)) return; /* see op_close */
    if (status < 0) {
        lp_client_failed(&u->c, uv_strerror(status));
        return;
    }
    lp_client_sent(&u->c, n); /* may parse more input, or close */
    start_write(u);
}

static void op_want_write(lp_client *c) { start_write((uv_client *)c); }

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    char *p;
    size_t n;
    lp_client_read_buf(&((uv_client *)h->data)->c, &p, &n);
    *buf = uv_buf_init(p, (unsigned)n);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    (void)buf; /* it is the core's input buffer */
    uv_client *u = s->data;
    if (nread > 0)
        lp_client_received(&u->c, (size_t)nread);
    else if (nread == UV_EOF)
        lp_client_eof(&u->c);
    else if (nread < 0)
        lp_client_failed(&u->c, uv_strerror((int)nread));
}

static void op_set_reading(lp_client *c, int on) {
    uv_stream_t *s = (uv_stream_t *)&((uv_client *)c)->tcp;
    int rc = on ? uv_read_start(s, on_alloc, on_read) : uv_read_stop(s);
    if (rc < 0) lp_client_failed(c, uv_strerror(rc));
}

static void on_closed(uv_handle_t *h) { lp_client_closed(&((uv_client *)h->data)->c); }

static void op_close(lp_client *c) {
    uv_client *u = (uv_client *)c;
    if (uv_is_closing((uv_handle_t *)&u->tcp)) return;
    uv_stream_t *s = (uv_stream_t *)&u->tcp;
    const char *p;
    size_t n;
    /* Best effort (a forced shutdown): what the socket takes now. A write
     * in flight that libuv has wholly handed to the kernel counts as sent;
     * its callback, which comes after this close, is then ignored. */
    if (u->writing != 0 && uv_stream_get_write_queue_size(s) == 0) {
        n = u->writing;
        u->writing = 0;
        lp_client_sent(c, n);
    }
    while (u->writing == 0 && (n = lp_client_output(c, &p)) > 0) {
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
        int w = uv_try_write(s, &b, 1);
        if (w <= 0) break;
        lp_client_sent(c, (size_t)w);
    }
    uv_close((uv_handle_t *)&u->tcp, on_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    (void)req;
    (void)status; /* a failure shows in the next read; UV_ECANCELED: closed meanwhile */
}

static void op_half_close(lp_client *c) {
    uv_client *u = (uv_client *)c;
    if (uv_is_closing((uv_handle_t *)&u->tcp)) return;
    (void)uv_shutdown(&u->sh, (uv_stream_t *)&u->tcp, on_shutdown); /* after the writes in flight */
}

static void op_release(lp_client *c) { free((uv_client *)c); }

/* ------------------------------------------------------------------ connections */

static void free_data(uv_handle_t *h) { free(h->data); }

static void on_connection(uv_stream_t *server, int status) {
    if (status < 0) {
        svc_log ev;
        svc_log_begin(&ev, "error", "accept_failed");
        svc_log_str(&ev, "error", uv_strerror(status));
        svc_log_end(&ev);
        return;
    }
    uv_client *u = calloc(1, sizeof *u);
    if (u == NULL) return; /* libuv calls again while the connection waits */
    uv_tcp_init(loop, &u->tcp);
    u->tcp.data = u;
    u->wr.data = u;
    if (uv_accept(server, (uv_stream_t *)&u->tcp) != 0) {
        uv_close((uv_handle_t *)&u->tcp, free_data);
        return;
    }
    if (!lp_server_has_room(&srv)) {
        uv_buf_t b = uv_buf_init(LP_TOO_MANY, sizeof LP_TOO_MANY - 1);
        (void)uv_try_write((uv_stream_t *)&u->tcp, &b, 1);
        lp_server_refused(&srv);
        uv_close((uv_handle_t *)&u->tcp, free_data);
        return;
    }
    uv_os_fd_t fd;
    char peer[64] = "?";
    if (uv_fileno((uv_handle_t *)&u->tcp, &fd) == 0) lp_sock_name(fd, 1, peer, sizeof peer);
    (void)uv_tcp_nodelay(&u->tcp, 1);
    if (lp_client_open(&srv, &u->c, peer) != 0) {
        uv_close((uv_handle_t *)&u->tcp, free_data);
        return;
    }
    op_set_reading(&u->c, 1);
}

/* ------------------------------------------------------------------ shutdown */

static void stop_loop(void) {
    if (stopping) return;
    stopping = true;
    uv_handle_t *hs[] = {(uv_handle_t *)&listener,    (uv_handle_t *)&cq_watch, (uv_handle_t *)&sig_term,
                         (uv_handle_t *)&sig_int,     (uv_handle_t *)&budget,   (uv_handle_t *)&finisher,
                         (uv_handle_t *)&linger_timer};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    /* uv_run() returns once the client handles have closed too */
}

static void on_budget(uv_timer_t *t) {
    (void)t;
    forced = true;
    lp_server_force(&srv); /* blocks up to a second; closes every client */
    stop_loop();
}

static void on_signal(uv_signal_t *h, int signum) {
    (void)h;
    if (srv.draining) return;
    uv_close((uv_handle_t *)&listener, NULL); /* stop accepting */
    uint64_t ms = (srv.cfg.shutdown_timeout_ns + SVC_NS_PER_MS - 1) / SVC_NS_PER_MS;
    uv_timer_start(&budget, on_budget, ms, 0);
    lp_server_begin_drain(&srv, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void on_linger(uv_timer_t *t) { (void)t; /* on_prepare runs next and closes them */ }

static void on_prepare(uv_prepare_t *h) {
    (void)h;
    if (stopping) return;
    /* The clients' deadlines (core.c: lingering closes, IDLE_TIMEOUT, the
     * drain's end): those whose time is up close now; the timer keeps the
     * loop from sleeping past the next one's. */
    uint64_t now = tp_now_ns(), next = lp_server_timers(&srv, now);
    if (next != 0)
        uv_timer_start(&linger_timer, on_linger, (next - now + SVC_NS_PER_MS - 1) / SVC_NS_PER_MS, 0);
    else
        uv_timer_stop(&linger_timer);
    if (lp_server_drained(&srv)) stop_loop();
}

/* ------------------------------------------------------------------ main */

static int fatal(const char *msg, const char *error) {
    svc_log ev;
    svc_log_begin(&ev, "error", msg);
    svc_log_str(&ev, "error", error);
    svc_log_int(&ev, "exit_code", 1);
    svc_log_end(&ev);
    return 1;
}

int main(int argc, char **argv) {
    char loop_name[64];
    snprintf(loop_name, sizeof loop_name, "libuv %s", uv_version_string());
    lp_config cfg;
    int lfd = -1;
    int rc = lp_startup(argc, argv, "taskpool-loop-uv", loop_name, &cfg, &lfd);
    if (rc >= 0) return rc;
    loop = uv_default_loop();
    static const lp_ops ops = {op_want_write, op_set_reading, op_close, op_half_close, op_release};
    char err[256];
    if (lp_server_init(&srv, &cfg, &ops, err, sizeof err) != 0) return fatal("startup_failed", err);
    if ((rc = uv_tcp_init(loop, &listener)) < 0 || (rc = uv_tcp_open(&listener, lfd)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&listener, 512, on_connection)) < 0 ||
        (rc = uv_poll_init(loop, &cq_watch, lp_server_cq_fd(&srv))) < 0 ||
        (rc = uv_poll_start(&cq_watch, UV_READABLE, on_cq)) < 0 ||
        (rc = uv_signal_init(loop, &sig_term)) < 0 ||
        (rc = uv_signal_start(&sig_term, on_signal, SIGTERM)) < 0 ||
        (rc = uv_signal_init(loop, &sig_int)) < 0 ||
        (rc = uv_signal_start(&sig_int, on_signal, SIGINT)) < 0 || (rc = uv_timer_init(loop, &budget)) < 0 ||
        (rc = uv_timer_init(loop, &linger_timer)) < 0 || (rc = uv_prepare_init(loop, &finisher)) < 0 ||
        (rc = uv_prepare_start(&finisher, on_prepare)) < 0)
        return fatal("startup_failed", uv_strerror(rc));
    lp_server_log_listening(&srv, lfd, loop_name);

    uv_run(loop, UV_RUN_DEFAULT);
    rc = lp_server_finish(&srv, forced);
    (void)uv_loop_close(loop);
    return rc;
}
