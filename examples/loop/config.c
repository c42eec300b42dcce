/*
 * config.c -- the start shared by both loop servers: the command line, the
 * environment and the listening socket.
 *
 * Settings are read with the HTTP example's strict parsers
 * (examples/service/config.h): a misspelt value stops the server at start
 * with exit status 2 and one JSON line naming the variable, never a silent
 * default. The listening socket is made here, not by the loop, so that both
 * programs read LISTEN_ADDR alike; libuv adopts it with uv_tcp_open().
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "loop.h"

static void usage(const char *prog) {
    printf("Usage: %s [--help | --version]\n"
           "\n"
           "A line-protocol TCP server. Each WORK request runs in a libtaskpool pool and\n"
           "is answered on the event loop's thread, by its on_done run from tp_cq_drain()\n"
           "when the completion queue's descriptor turns readable.\n"
           "Configured from the environment; logs one JSON object per line on stdout;\n"
           "drains on SIGTERM or SIGINT within SHUTDOWN_TIMEOUT.\n"
           "\n"
           "Protocol: one reply line per request line; n is the request's number on its\n"
           "connection (1 for the first line).\n"
           "  WORK <ms> [<user>]  run <ms> (0..%u) of work in the pool, counted against\n"
           "                      <user> (1..%d bytes of A-Z a-z 0-9 . _ -)\n"
           "                      -> OK n <status>  when it ended (TP_OK, TP_ETIMEDOUT after\n"
           "                                        TASK_TIMEOUT, TP_ECANCELED when forced);\n"
           "                                        in the order work ends\n"
           "                      -> BUSY n         the queue is full: retry later\n"
           "                      -> LIMIT n        <user> has MAX_PER_USER requests unfinished\n"
           "                      -> CLOSED n       the server is draining\n"
           "  PING                -> PONG n\n"
           "  STATS               -> STATS n {json counters}\n"
           "  anything else       -> ERR n <reason>; a line over MAX_LINE: ERR n line too\n"
           "                         long, then the connection closes\n"
           "Over MAX_CLIENTS a connection gets \"BUSY 0 too many clients\" and is closed.\n"
           "A client that stops reading is not read from while half of OUTPUT_LIMIT is\n"
           "unread; when its replies would exceed OUTPUT_LIMIT it is disconnected.\n"
           "\n"
           "Environment (durations like 250ms, 5s, 1m30s; unset or empty = default):\n"
           "  LISTEN_ADDR       host:port, [v6]:port or :port; 0 = any port (127.0.0.1:7070)\n"
           "  WORKERS           pool workers, 1..1024 (4)\n"
           "  QUEUE_CAPACITY    requests waiting for a worker, 1..65536 (64)\n"
           "  MAX_PER_USER      unfinished requests per user, 1..1000000 or unlimited (2)\n"
           "  MAX_CLIENTS       clients served at once (lingering closes come on top), 1..100000 (256)\n"
           "  MAX_LINE          bytes of a request line, 16..65536 (256)\n"
           "  OUTPUT_LIMIT      unread reply bytes per client, 2048..16777216 (65536)\n"
           "  TASK_TIMEOUT      run timeout of each request's work (60s)\n"
           "  SHUTDOWN_TIMEOUT  budget for answering the work in flight at SIGTERM (5s)\n"
           "  IDLE_TIMEOUT      a client with nothing in flight or unread that sends\n"
           "                    nothing this long is disconnected; so is one with\n"
           "                    nothing in flight that takes none of its replies (30s)\n"
           "  LOG_LEVEL         error, warn, info or debug (info)\n"
           "\n"
           "Exit status: 0 drained in time, 1 drain forced or start failed,\n"
           "2 invalid configuration or command line.\n",
           prog, LP_WORK_MS_MAX, LP_USER_MAX);
}

/* A failure before the server runs: one JSON line at error level. */
static int startup_error(const char *msg, const char *variable, const char *error, int code) {
    svc_log ev;
    svc_log_begin(&ev, "error", msg);
    if (variable != NULL) svc_log_str(&ev, "variable", variable);
    svc_log_str(&ev, "error", error);
    svc_log_int(&ev, "exit_code", code);
    svc_log_end(&ev);
    return code;
}

/* Each check names its variable first, so that a failure reports it. */
#define CHECK(name, call)                                                                                    \
    do {                                                                                                     \
        *var = (name);                                                                                       \
        if ((call) != 0) return -1;                                                                          \
    } while (0)

static int load(lp_config *c, char *err, size_t errlen, const char **var) {
    memset(c, 0, sizeof *c);
    strcpy(c->listen_addr, "127.0.0.1:7070");
    c->workers = 4;
    c->queue_capacity = 64;
    c->max_per_user = 2;
    c->max_clients = 256;
    c->max_line = 256;
    c->output_limit = 65536;
    c->task_timeout_ns = 60 * SVC_NS_PER_S;
    c->shutdown_timeout_ns = 5 * SVC_NS_PER_S;
    c->idle_timeout_ns = 30 * SVC_NS_PER_S;
    c->log_level = SVC_LOG_INFO;

    const char *v = svc_env("LOG_LEVEL");
    *var = "LOG_LEVEL";
    if (v != NULL && (c->log_level = svc_log_parse_level(v)) < 0) {
        c->log_level = SVC_LOG_INFO;
        snprintf(err, errlen, "LOG_LEVEL=\"%s\": expected error, warn, info or debug", v);
        return -1;
    }
    *var = "LISTEN_ADDR";
    if ((v = svc_env("LISTEN_ADDR")) != NULL) {
        if (strlen(v) >= sizeof c->listen_addr) {
            snprintf(err, errlen, "LISTEN_ADDR is too long");
            return -1;
        }
        strcpy(c->listen_addr, v);
    }
    const char *mpu = svc_env("MAX_PER_USER");
    if (mpu != NULL && strcmp(mpu, "unlimited") == 0)
        c->max_per_user = TP_UNLIMITED;
    else
        CHECK("MAX_PER_USER", svc_load_uint("MAX_PER_USER", 1, 1000000, &c->max_per_user, err, errlen));
    const uint64_t ms = SVC_NS_PER_MS, day = 86400 * SVC_NS_PER_S;
    CHECK("WORKERS", svc_load_uint("WORKERS", 1, 1024, &c->workers, err, errlen));
    CHECK("QUEUE_CAPACITY", svc_load_uint("QUEUE_CAPACITY", 1, 65536, &c->queue_capacity, err, errlen));
    CHECK("MAX_CLIENTS", svc_load_uint("MAX_CLIENTS", 1, 100000, &c->max_clients, err, errlen));
    CHECK("MAX_LINE", svc_load_uint("MAX_LINE", 16, 65536, &c->max_line, err, errlen));
    /* at least twice the longest immediate reply: see the pause rule in core.c */
    CHECK("OUTPUT_LIMIT",
          svc_load_uint("OUTPUT_LIMIT", 2 * LP_REPLY_MAX, 16u << 20, &c->output_limit, err, errlen));
    CHECK("TASK_TIMEOUT", svc_load_duration("TASK_TIMEOUT", 1 * ms, day, &c->task_timeout_ns, err, errlen));
    CHECK("SHUTDOWN_TIMEOUT",
          svc_load_duration("SHUTDOWN_TIMEOUT", 1 * ms, day, &c->shutdown_timeout_ns, err, errlen));
    CHECK("IDLE_TIMEOUT", svc_load_duration("IDLE_TIMEOUT", 1 * ms, day, &c->idle_timeout_ns, err, errlen));
    *var = NULL;
    return 0;
}

/* "host:port", "[v6]:port" or ":port" (every interface) -> a listening socket. */
static int listen_on(const char *addr, char *err, size_t errlen) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    unsigned port;
    if (colon == NULL || svc_parse_uint(colon + 1, 0, 65535, &port) != 0) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": expected host:port with a port from 0 to 65535", addr);
        return -2;
    }
    size_t hlen = (size_t)(colon - addr);
    const char *h = addr;
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    memcpy(host, h, hlen); /* hlen < sizeof listen_addr == sizeof host */
    host[hlen] = '\0';
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(hlen > 0 ? host : NULL, portstr, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "LISTEN_ADDR=\"%s\": %s", addr, gai_strerror(rc));
        return -2;
    }
    int saved = 0;
    for (const struct addrinfo *a = ai; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 512) == 0) {
            freeaddrinfo(ai);
            return fd;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(saved));
    return -1;
}

int lp_startup(int argc, char **argv, const char *prog, const char *loop, lp_config *cfg, int *lfd) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(prog);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("%s %s (libtaskpool %s, %s)\n", prog, LP_VERSION, tp_version(), loop);
            return 0;
        }
        fprintf(stderr, "%s: unknown option or argument '%s' (try --help)\n", prog, argv[i]);
        return 2;
    }
    char err[512];
    const char *var = NULL;
    int loaded = load(cfg, err, sizeof err, &var);
    svc_log_set_level(cfg->log_level);
    if (loaded != 0) return startup_error("config_error", var, err, 2);
    signal(SIGPIPE, SIG_IGN);
    *lfd = listen_on(cfg->listen_addr, err, sizeof err);
    if (*lfd == -2) return startup_error("config_error", "LISTEN_ADDR", err, 2);
    if (*lfd < 0) return startup_error("listen_failed", "LISTEN_ADDR", err, 1);
    return -1;
}

void lp_sock_name(int fd, int peer, char *out, size_t len) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    int rc =
        peer ? getpeername(fd, (struct sockaddr *)&ss, &sl) : getsockname(fd, (struct sockaddr *)&ss, &sl);
    if (rc == 0 && ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, len, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    } else if (rc == 0 && ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, len, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, len, "?");
    }
}
