/*
 * main.c -- taskpool-service: libtaskpool inside a small HTTP/1.1 server.
 *
 * The example users copy when they embed libtaskpool in a service. Plain C,
 * POSIX sockets and pthreads; nothing else. The pieces:
 *
 *   main.c    configuration, the listening socket, the accept loop, signals
 *             and the shutdown sequence
 *   conn.c    one connection: request loop, routes, background tasks
 *   http.c    request-head parsing and response writing
 *   config.c  environment settings and the strict duration parser
 *   log.c     one JSON line per event on stdout
 *
 * Threads: the main thread accepts; the connection pool (MAX_CONNS workers)
 * serves connections; the task pool (WORKERS workers, QUEUE_CAPACITY waiting)
 * runs POST /tasks work. SIGTERM and SIGINT are blocked in every pool thread
 * (they inherit the mask from main before it unblocks them) and handled on
 * the main thread by writing to a self-pipe, which wakes the accept loop.
 *
 * Shutdown on SIGTERM/SIGINT, one budget of SHUTDOWN_TIMEOUT for all of it:
 *   1. close the listening socket: no new connections;
 *   2. set `draining`: idle keep-alive connections close, requests in
 *      progress finish and are answered with Connection: close;
 *   3. tp_shutdown(connection pool, what is left of the budget): waits for
 *      those requests; if the budget runs out it cancels them (GET /work
 *      answers 503 at once);
 *   4. tp_shutdown(task pool, what is left): accepted tasks drain, including
 *      ones submitted by the requests of step 3; if the budget runs out,
 *      running tasks are cancelled (tp_ctx_sleep returns) and queued ones end
 *      unrun with TP_ECANCELED;
 *   5. tp_wait() up to one more second for cooperative cleanup;
 *   6. log the final statistics; exit 0 if everything drained within the
 *      budget, 1 if it had to be forced (or a thread ignored cancellation).
 * Exit status 2: invalid configuration.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "service.h"

static int sig_pipe[2] = {-1, -1};   /* signal handler -> accept loop */
static int drain_pipe[2] = {-1, -1}; /* written once at shutdown, never read */
static volatile sig_atomic_t got_signal;

static void on_signal(int signo) {
    int saved = errno;
    got_signal = signo;
    unsigned char b = (unsigned char)signo;
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* full pipe: a wake-up is already pending */
    }
    errno = saved;
}

/* "host:port", "[v6]:port" or ":port" (all interfaces) -> addrinfo list. */
static int resolve(const char *addr, struct addrinfo **out, char *err, size_t errlen) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": expected host:port", addr);
        return -1;
    }
    size_t hlen = (size_t)(colon - addr);
    const char *h = addr;
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (hlen >= sizeof host) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": host too long", addr);
        return -1;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    unsigned port;
    if (svc_parse_uint(colon + 1, 0, 65535, &port) != 0) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": port must be a number from 0 to 65535", addr);
        return -1;
    }
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    int rc = getaddrinfo(hlen > 0 ? host : NULL, portstr, &hints, out);
    if (rc != 0) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": %s", addr, gai_strerror(rc));
        return -1;
    }
    return 0;
}

static int listen_on(const struct addrinfo *ai, char *err, size_t errlen) {
    int saved = 0;
    for (; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 256) == 0)
            return fd;
        saved = errno;
        close(fd);
    }
    snprintf(err, errlen, "cannot listen: %s", strerror(saved));
    return -1;
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t len) {
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(out, len, "%s:%u", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(out, len, "[%s]:%u", ip, port);
    } else {
        snprintf(out, len, "?");
    }
}

/* Accept everything pending on the listener. */
static void accept_ready(svc *s, int lfd) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* EMFILE, ENFILE, ENOBUFS, ENOMEM: back off instead of spinning. */
            svc_log ev;
            svc_log_begin(&ev, "error", "accept_failed");
            svc_log_str(&ev, "error", strerror(errno));
            svc_log_end(&ev);
            (void)poll(NULL, 0, 50);
            return;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char peer[64];
        format_addr(&ss, peer, sizeof peer);
        svc_conn_accept(s, fd, peer);
    }
}

/* A budget left until deadline, never 0 (which the library reads as "the
 * default"): a spent budget is 1 ns, i.e. "force now". */
static uint64_t left(uint64_t deadline) {
    uint64_t now = tp_now_ns();
    return now + 1 >= deadline ? 1 : deadline - now;
}

static void log_stats(svc_log *ev, const char *key, tp_pool *p) {
    tp_stats st;
    char json[1024];
    tp_stats_get(p, &st);
    int n = tp_stats_format(&st, TP_FORMAT_JSON, json, sizeof json);
    svc_log_raw(ev, key, n > 0 && (size_t)n < sizeof json ? json : "null");
}

/* Did every thread of p exit? (tp_wait returns early only then.) */
static int stopped(tp_pool *p) {
    tp_stats st;
    tp_stats_get(p, &st);
    return st.workers == 0 && st.active == 0;
}

static int run_shutdown(svc *s, int lfd) {
    uint64_t t0 = tp_now_ns();
    svc_log ev;
    svc_log_begin(&ev, "info", "shutdown_started");
    svc_log_str(&ev, "signal", got_signal == SIGINT ? "SIGINT" : "SIGTERM");
    svc_log_uint(&ev, "budget_ms", s->cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "open_connections", atomic_load(&s->open_conns));
    log_stats(&ev, "stats", s->tasks);
    svc_log_end(&ev);

    close(lfd); /* 1. no new connections */
    uint64_t deadline = t0 + s->cfg.shutdown_timeout_ns;

    /* 2. idle connections close; requests in progress finish */
    atomic_store(&s->draining, 1);
    if (write(drain_pipe[1], "x", 1) < 0) {
        /* cannot fail on a fresh pipe; connections also re-check the flag within 1 s */
    }

    /* 3. and 4. */
    int rc_requests = tp_shutdown(s->conns, left(deadline));
    svc_log_begin(&ev, rc_requests == TP_OK ? "info" : "warn", "requests_drained");
    svc_log_str(&ev, "result", tp_err_name(rc_requests));
    svc_log_uint(&ev, "ms", (tp_now_ns() - t0) / SVC_NS_PER_MS);
    svc_log_end(&ev);
    int rc_tasks = tp_shutdown(s->tasks, left(deadline));

    /* 5. one more second for cancelled work to return */
    uint64_t cleanup = tp_now_ns() + SVC_NS_PER_S;
    (void)tp_wait(s->conns, left(cleanup));
    (void)tp_wait(s->tasks, left(cleanup));
    int all_stopped = stopped(s->conns) && stopped(s->tasks);

    /* 6. */
    int code = rc_requests == TP_OK && rc_tasks == TP_OK && all_stopped ? 0 : 1;
    svc_log_begin(&ev, code == 0 ? "info" : "warn", "shutdown_complete");
    svc_log_str(&ev, "result", code == 0 ? "drained" : all_stopped ? "forced" : "stuck");
    svc_log_str(&ev, "requests", tp_err_name(rc_requests));
    svc_log_str(&ev, "tasks", tp_err_name(rc_tasks));
    svc_log_uint(&ev, "ms", (tp_now_ns() - t0) / SVC_NS_PER_MS);
    svc_log_int(&ev, "exit_code", code);
    log_stats(&ev, "stats", s->tasks);
    log_stats(&ev, "connection_stats", s->conns);
    svc_log_end(&ev);

    if (all_stopped) {
        /* Every thread is gone: freeing cannot block. A stuck thread keeps
         * its pool alive; the process exit is then the final boundary. */
        tp_destroy(s->conns);
        tp_destroy(s->tasks);
    }
    return code;
}

static tp_pool *make_pool(const tp_config *cfg, const char *what) {
    tp_pool *p = NULL;
    int rc = tp_create(&p, cfg);
    if (rc != TP_OK) {
        fprintf(stderr, "taskpool-service: cannot create the %s pool: %s\n", what, tp_strerror(rc));
        exit(rc == TP_EINVAL ? 2 : 1);
    }
    return p;
}

int main(void) {
    static svc s; /* static: conn tasks point at it until the pools are destroyed */
    char err[512];
    if (svc_config_load(&s.cfg, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-service: %s\n", err);
        return 2;
    }
    struct addrinfo *ai = NULL;
    if (resolve(s.cfg.listen_addr, &ai, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-service: %s\n", err);
        return 2;
    }
    if (pipe2(sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0 || pipe2(drain_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        fprintf(stderr, "taskpool-service: pipe: %s\n", strerror(errno));
        return 1;
    }
    s.drain_fd = drain_pipe[0];
    atomic_init(&s.draining, 0);
    atomic_init(&s.open_conns, 0);
    atomic_init(&s.next_conn, 1);
    atomic_init(&s.next_req, 1);

    /* Peers that vanish must not kill us (sends also use MSG_NOSIGNAL). */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Blocked while the pools start, so that every pool thread inherits a
     * mask without them and the handler only ever runs on this thread. */
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, &old);

    tp_config tcfg = {
        .workers = s.cfg.workers,
        .queue_capacity = s.cfg.queue_capacity,
        .max_per_user = s.cfg.max_per_user,
        .run_timeout_ns = s.cfg.task_timeout_ns,
        .drain_timeout_ns = s.cfg.shutdown_timeout_ns,
        .name = "task",
        .log = svc_log_hook,
    };
    tp_config ccfg = {
        .workers = s.cfg.max_conns,
        .queue_capacity = s.cfg.max_conns, /* open_conns is the real cap; this absorbs the
                                              moment between a task's end and its worker's return */
        .max_per_user = TP_UNLIMITED,
        .run_timeout_ns = TP_FOREVER,      /* connections keep their own timeouts */
        .drain_timeout_ns = s.cfg.shutdown_timeout_ns,
        .name = "conn",
        .log = svc_log_hook,
    };
    s.tasks = make_pool(&tcfg, "task");
    s.conns = make_pool(&ccfg, "connection");

    int lfd = listen_on(ai, err, sizeof err);
    freeaddrinfo(ai);
    if (lfd < 0) {
        fprintf(stderr, "taskpool-service: LISTEN_ADDR=\"%s\": %s\n", s.cfg.listen_addr, err);
        tp_destroy(s.conns);
        tp_destroy(s.tasks);
        return 1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char addr[80] = "?";
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) == 0)
        format_addr(&ss, addr, sizeof addr);

    /* The first line: tests and scripts read the actual address from it. */
    svc_log ev;
    svc_log_begin(&ev, "info", "listening");
    svc_log_str(&ev, "address", addr);
    svc_log_int(&ev, "pid", (long long)getpid());
    svc_log_uint(&ev, "workers", s.cfg.workers);
    svc_log_uint(&ev, "queue_capacity", s.cfg.queue_capacity);
    if (s.cfg.max_per_user == TP_UNLIMITED)
        svc_log_str(&ev, "max_per_user", "unlimited");
    else
        svc_log_uint(&ev, "max_per_user", s.cfg.max_per_user);
    svc_log_uint(&ev, "max_conns", s.cfg.max_conns);
    svc_log_uint(&ev, "task_timeout_ms", s.cfg.task_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "shutdown_timeout_ms", s.cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "header_timeout_ms", s.cfg.header_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "idle_timeout_ms", s.cfg.idle_timeout_ns / SVC_NS_PER_MS);
    svc_log_str(&ev, "taskpool_version", tp_version());
    svc_log_end(&ev);

    pthread_sigmask(SIG_SETMASK, &old, NULL);
    while (!got_signal) {
        struct pollfd pf[2] = {{.fd = lfd, .events = POLLIN}, {.fd = sig_pipe[0], .events = POLLIN}};
        int n = poll(pf, 2, 1000);
        if (n < 0 && errno != EINTR) {
            svc_log_begin(&ev, "error", "poll_failed");
            svc_log_str(&ev, "error", strerror(errno));
            svc_log_end(&ev);
            break;
        }
        if (n > 0 && (pf[0].revents & POLLIN))
            accept_ready(&s, lfd);
    }
    int code = run_shutdown(&s, lfd);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    close(drain_pipe[0]);
    close(drain_pipe[1]);
    return code;
}
