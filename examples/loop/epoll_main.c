/*
 * epoll_main.c -- taskpool-loop-epoll: the loop server of loop.h on a plain
 * epoll loop. No dependency beyond libc.
 *
 * One thread runs the loop. epoll watches, level-triggered: the listener; a
 * signalfd for SIGTERM and SIGINT (blocked in every thread before the pool
 * starts); tp_cq_fd() of the completion queue, whose readiness means "work
 * has ended": lp_server_complete() then runs those requests' on_done here,
 * on this thread; and every client socket.
 *
 * Writes are gathered: a reply only marks its client, and each client
 * marked during an iteration is flushed once at its end, so the answers of
 * one drain leave in one send(). EPOLLOUT is watched only while a socket
 * refuses bytes. A close is finished at the end of the iteration too (the
 * core is told then), so no event of the same epoll_wait() batch can meet a
 * freed client: an event for a closed one finds fd -1 and is skipped.
 *
 * A close the client did not ask for lingers (core.c): op_half_close ends
 * the output with shutdown(SHUT_WR), and the loop's timeout covers the
 * clients' earliest deadline (lp_server_timers: the end of a lingering
 * close, IDLE_TIMEOUT, the drain's end for a client that does not read).
 *
 * Shutdown: on the signal the listener closes and the core drains
 * (lp_server_begin_drain); the loop ends when the core says drained (exit
 * 0), or when SHUTDOWN_TIMEOUT has passed (lp_server_force, exit 1).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "loop.h"

typedef struct ep_client {
    lp_client c; /* first: the core's lp_client * is an ep_client * */
    int fd;      /* -1 once closed */
    uint32_t events;
    bool dirty;
    struct ep_client *next_dirty, *next_closed;
} ep_client;

static lp_server srv;
static int ep = -1, lfd = -1, sfd = -1;
static ep_client *dirty_list, *closed_list;
static char tag_listen, tag_signal, tag_cq; /* epoll data of the fixed descriptors */
static uint64_t listen_resume_ns;           /* after EMFILE: when to watch the listener again */
static uint64_t accept_logged_ns;           /* the last accept_failed line: at most one a second */

static void watch(ep_client *e, uint32_t events) {
    if (e->events == events) return;
    struct epoll_event ev = {.events = events, .data.ptr = e};
    e->events = events;
    (void)epoll_ctl(ep, EPOLL_CTL_MOD, e->fd, &ev); /* cannot fail: registered, open */
}

/* ------------------------------------------------------------------ lp_ops */

static void op_want_write(lp_client *c) {
    ep_client *e = (ep_client *)c;
    if (e->dirty || e->fd < 0) return;
    e->dirty = true;
    e->next_dirty = dirty_list;
    dirty_list = e;
}

static void op_set_reading(lp_client *c, int on) {
    ep_client *e = (ep_client *)c;
    if (e->fd >= 0) watch(e, on ? e->events | EPOLLIN : e->events & ~(uint32_t)EPOLLIN);
}

static void op_close(lp_client *c) {
    ep_client *e = (ep_client *)c;
    if (e->fd < 0) return;
    const char *p;
    size_t n;
    while ((n = lp_client_output(c, &p)) > 0) { /* best effort: what the socket takes now */
        ssize_t w = send(e->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break;
        lp_client_sent(c, (size_t)w);
    }
    close(e->fd); /* also leaves the epoll set */
    e->fd = -1;
    e->next_closed = closed_list;
    closed_list = e;
}

static void op_half_close(lp_client *c) {
    ep_client *e = (ep_client *)c;
    if (e->fd >= 0) (void)shutdown(e->fd, SHUT_WR); /* on failure, the next read reports it */
}

static void op_release(lp_client *c) { free((ep_client *)c); }

/* ------------------------------------------------------------------ clients */

static void flush(ep_client *e) {
    const char *p;
    size_t n;
    while (e->fd >= 0 && (n = lp_client_output(&e->c, &p)) > 0) {
        ssize_t w = send(e->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            lp_client_sent(&e->c, (size_t)w); /* may parse more input, or close */
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            watch(e, e->events | EPOLLOUT);
            return;
        } else {
            lp_client_failed(&e->c, strerror(errno));
            return;
        }
    }
    if (e->fd >= 0) watch(e, e->events & ~(uint32_t)EPOLLOUT);
}

/* The end of an iteration: write what replies were made, then finish the
 * closes (which may free clients). */
static void end_iteration(void) {
    while (dirty_list != NULL) {
        ep_client *e = dirty_list;
        dirty_list = e->next_dirty;
        e->dirty = false;
        flush(e);
    }
    while (closed_list != NULL) {
        ep_client *e = closed_list;
        closed_list = e->next_closed;
        lp_client_closed(&e->c);
    }
}

static void on_readable(ep_client *e) {
    for (int i = 0; i < 16 && e->fd >= 0 && e->c.reading; i++) { /* then let the others have a turn */
        char *p;
        size_t n;
        lp_client_read_buf(&e->c, &p, &n);
        ssize_t r = recv(e->fd, p, n, 0);
        if (r > 0) {
            lp_client_received(&e->c, (size_t)r);
        } else if (r == 0) {
            lp_client_eof(&e->c);
            return;
        } else if (errno != EINTR) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) lp_client_failed(&e->c, strerror(errno));
            return;
        }
    }
}

static void on_client_event(ep_client *e, uint32_t events) {
    if (e->fd < 0) return; /* closed earlier in this batch */
    if (events & EPOLLERR) {
        int err = 0;
        socklen_t len = sizeof err;
        (void)getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        lp_client_failed(&e->c, err != 0 ? strerror(err) : "socket error");
        return;
    }
    if (events & EPOLLIN)
        on_readable(e);
    else if (events & EPOLLHUP) /* both directions shut, and we were not reading */
        lp_client_failed(&e->c, "hang-up");
    if (e->fd >= 0 && (events & EPOLLOUT)) op_want_write(&e->c);
}

static void on_listener(void) {
    if (lfd < 0) return; /* closed by a signal earlier in this batch */
    for (int i = 0; i < 64; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* EMFILE, ENFILE, ENOBUFS, ENOMEM: pause the listener, don't
             * spin; logged once a second at most (the pause is 100 ms) */
            uint64_t now = tp_now_ns();
            if (accept_logged_ns == 0 || now - accept_logged_ns >= SVC_NS_PER_S) {
                accept_logged_ns = now;
                svc_log ev;
                svc_log_begin(&ev, "error", "accept_failed");
                svc_log_str(&ev, "error", strerror(errno));
                svc_log_end(&ev);
            }
            (void)epoll_ctl(ep, EPOLL_CTL_DEL, lfd, NULL);
            listen_resume_ns = now + 100 * SVC_NS_PER_MS;
            return;
        }
        if (!lp_server_has_room(&srv)) {
            (void)send(fd, LP_TOO_MANY, sizeof LP_TOO_MANY - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            close(fd);
            lp_server_refused(&srv);
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char peer[64];
        lp_sock_name(fd, 1, peer, sizeof peer);
        ep_client *e = calloc(1, sizeof *e);
        if (e == NULL || lp_client_open(&srv, &e->c, peer) != 0) {
            free(e);
            close(fd);
            continue;
        }
        e->fd = fd;
        e->events = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = e};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) lp_client_failed(&e->c, strerror(errno));
    }
}

/* ------------------------------------------------------------------ main */

static int add_fixed(int fd, void *tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static int ms_until(uint64_t when, uint64_t now) {
    if (when <= now) return 0;
    uint64_t ms = (when - now + SVC_NS_PER_MS - 1) / SVC_NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int fatal(const char *msg, const char *error) {
    svc_log ev;
    svc_log_begin(&ev, "error", msg);
    svc_log_str(&ev, "error", error);
    svc_log_int(&ev, "exit_code", 1);
    svc_log_end(&ev);
    return 1;
}

int main(int argc, char **argv) {
    lp_config cfg;
    int rc = lp_startup(argc, argv, "taskpool-loop-epoll", "epoll", &cfg, &lfd);
    if (rc >= 0) return rc;
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, NULL); /* before any thread: only the signalfd sees them */
    sfd = signalfd(-1, &term, SFD_NONBLOCK | SFD_CLOEXEC);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (sfd < 0 || ep < 0) return fatal("startup_failed", strerror(errno));
    static const lp_ops ops = {op_want_write, op_set_reading, op_close, op_half_close, op_release};
    char err[256];
    if (lp_server_init(&srv, &cfg, &ops, err, sizeof err) != 0) return fatal("startup_failed", err);
    if (add_fixed(lfd, &tag_listen) != 0 || add_fixed(sfd, &tag_signal) != 0 ||
        add_fixed(lp_server_cq_fd(&srv), &tag_cq) != 0)
        return fatal("startup_failed", strerror(errno));
    lp_server_log_listening(&srv, lfd, "epoll");

    uint64_t deadline = 0, linger_next = 0;
    bool forced = false;
    for (;;) {
        uint64_t now = tp_now_ns();
        int timeout = srv.draining ? ms_until(deadline, now) : -1;
        if (listen_resume_ns != 0) {
            int t = ms_until(listen_resume_ns, now);
            if (timeout < 0 || t < timeout) timeout = t;
        }
        if (linger_next != 0) {
            int t = ms_until(linger_next, now);
            if (timeout < 0 || t < timeout) timeout = t;
        }
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, timeout);
        if (n < 0 && errno != EINTR) { /* cannot happen with a valid set: stop at once */
            (void)fatal("epoll_wait_failed", strerror(errno));
            if (!srv.draining) lp_server_begin_drain(&srv, "none");
            deadline = 0;
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &tag_cq) {
                lp_server_complete(&srv); /* the on_done of ended work run here, answering clients */
            } else if (tag == &tag_listen) {
                on_listener();
            } else if (tag == &tag_signal) {
                struct signalfd_siginfo si;
                if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si || srv.draining) continue;
                (void)epoll_ctl(ep, EPOLL_CTL_DEL, lfd, NULL); /* stop accepting */
                close(lfd);
                lfd = -1;
                listen_resume_ns = 0;
                deadline = tp_now_ns() + cfg.shutdown_timeout_ns;
                lp_server_begin_drain(&srv, si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
            } else {
                on_client_event(tag, evs[i].events);
            }
        }
        end_iteration();
        /* after every change of this iteration (a flush may begin one) */
        linger_next = lp_server_timers(&srv, tp_now_ns()); /* closes those whose time is up */
        end_iteration();                                   /* and finishes those closes */
        if (listen_resume_ns != 0 && tp_now_ns() >= listen_resume_ns) {
            listen_resume_ns = 0;
            (void)add_fixed(lfd, &tag_listen);
        }
        if (lp_server_drained(&srv)) break;
        if (srv.draining && tp_now_ns() >= deadline) {
            lp_server_force(&srv); /* closes every client */
            end_iteration();
            forced = true;
            break;
        }
    }
    rc = lp_server_finish(&srv, forced);
    close(ep);
    close(sfd);
    return rc;
}
