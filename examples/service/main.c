/*
 * main.c -- taskpool-service: libtaskpool inside a small HTTP/1.1 server.
 *
 * The example users copy when they embed libtaskpool in a service. Plain C,
 * POSIX sockets and pthreads; nothing else. The pieces:
 *
 *   main.c    configuration, the pools, signals and the shutdown sequence
 *   routes.c  the routes and their handlers, background tasks
 *   tasks.c   the table of recent tasks
 *   config.c  environment settings and the strict duration parser
 * and, shared with taskpool-stream-worker (examples/common/):
 *   httpd.c   the HTTP/1.1 server: connections, limits, deadlines, drain
 *   http.c    request-head parsing and response writing
 *   log.c     one JSON line per event on stdout
 *
 * Threads: the main thread runs the server's loop (accepts, reads request
 * heads, keeps idle connections, answers probes); the connection pool
 * (MAX_CONNS workers) runs requests; the task pool (WORKERS workers,
 * QUEUE_CAPACITY waiting) runs POST /tasks work, in the order of its
 * priority lanes and, with SCHED=fair, in turns between users (taskpool.h
 * section 14: SCHED, USER_WEIGHTS, LOW_PRIO_MAX_RUNNING and
 * PRIO_STARVE_LIMIT go into its tp_config and tp_user_weight_set, the
 * lanes into /metrics through tp_metrics_format). SIGTERM and SIGINT are
 * blocked in every pool thread (they inherit the mask from main before it
 * unblocks them) and handled on the main thread by writing to a self-pipe,
 * which wakes the loop.
 *
 * Shutdown on SIGTERM/SIGINT, one budget of SHUTDOWN_TIMEOUT for all of it:
 *   1. httpd_drain: connections with no request in progress close at once
 *      (half a request head is answered 503 first: it has nothing in
 *      progress either), requests in progress finish and are answered with
 *      Connection: close;
 *   2. steps 3 to 5 run on a drain thread while the main thread goes on
 *      running the server's loop: the listener stays open and each new
 *      connection gets one request, answered on the loop with Connection:
 *      close: /readyz, /healthz, POST /tasks and /work get 503, /stats,
 *      /metrics and /tasks/{id} their usual answer. Probes and clients see
 *      "draining" instead of a refused connection. When the drain thread
 *      is done, httpd_finish closes the listener and writes out the answers
 *      already made (until the budget's end, at least 1 s);
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
 * Exit status 2: invalid configuration (one JSON log line says which
 * variable) or an unknown command-line option.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "service.h"

#define WRITE_TIMEOUT_NS (10 * SVC_NS_PER_S) /* for a client to take one answer */

static int sig_pipe[2] = {-1, -1};  /* signal handler -> the server's loop */
static int done_pipe[2] = {-1, -1}; /* drain thread -> main thread: finished */
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

/* Steps 3 to 5 of the shutdown (see the top of the file). */
typedef struct drain_job {
    svc *s;
    uint64_t t0, deadline;
    int rc_requests, rc_tasks, all_stopped;
} drain_job;

static void *drain_main(void *arg) {
    drain_job *j = arg;
    svc *s = j->s;
    j->rc_requests = tp_shutdown(s->conns, left(j->deadline));
    svc_log ev;
    svc_log_begin(&ev, j->rc_requests == TP_OK ? "info" : "warn", "requests_drained");
    svc_log_str(&ev, "result", tp_err_name(j->rc_requests));
    svc_log_uint(&ev, "ms", (tp_now_ns() - j->t0) / SVC_NS_PER_MS);
    svc_log_end(&ev);
    j->rc_tasks = tp_shutdown(s->tasks, left(j->deadline));

    /* one more second for cancelled work to return */
    uint64_t cleanup = tp_now_ns() + SVC_NS_PER_S;
    (void)tp_wait(s->conns, left(cleanup));
    (void)tp_wait(s->tasks, left(cleanup));
    j->all_stopped = stopped(s->conns) && stopped(s->tasks);
    if (write(done_pipe[1], "x", 1) < 0) {
        /* cannot fail: a fresh pipe, written once */
    }
    return NULL;
}

static int run_shutdown(svc *s) {
    drain_job j = {.s = s, .t0 = tp_now_ns()};
    j.deadline = j.t0 + s->cfg.shutdown_timeout_ns;
    svc_log ev;
    svc_log_begin(&ev, "info", "shutdown_started");
    svc_log_str(&ev, "signal", got_signal == SIGINT ? "SIGINT" : "SIGTERM");
    svc_log_uint(&ev, "budget_ms", s->cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "open_connections", httpd_open_conns(s->http));
    log_stats(&ev, "stats", s->tasks);
    svc_log_end(&ev);

    /* 1. connections with nothing in progress close; requests in progress finish */
    httpd_drain(s->http);

    /* 2. the drain thread runs 3 to 5 (signals blocked in it, as in the
     * pools' threads); this thread runs the server meanwhile. */
    pthread_t drainer;
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, &old);
    int started = pthread_create(&drainer, NULL, drain_main, &j) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started) {
        (void)httpd_run(s->http, &done_pipe[0], 1); /* a poll() failure: join below anyway */
        pthread_join(drainer, NULL);
    } else {
        drain_main(&j); /* no thread: drain without serving new connections */
    }
    /* The listener closes; answers already made get out (at least 1 s). */
    uint64_t flush_until = tp_now_ns() + SVC_NS_PER_S;
    httpd_finish(s->http, j.deadline > flush_until ? j.deadline : flush_until);

    /* 6. */
    int code = j.rc_requests == TP_OK && j.rc_tasks == TP_OK && j.all_stopped ? 0 : 1;
    svc_log_begin(&ev, code == 0 ? "info" : "warn", "shutdown_complete");
    svc_log_str(&ev, "result", code == 0 ? "drained" : j.all_stopped ? "forced" : "stuck");
    svc_log_str(&ev, "requests", tp_err_name(j.rc_requests));
    svc_log_str(&ev, "tasks", tp_err_name(j.rc_tasks));
    svc_log_uint(&ev, "ms", (tp_now_ns() - j.t0) / SVC_NS_PER_MS);
    svc_log_int(&ev, "exit_code", code);
    log_stats(&ev, "stats", s->tasks);
    log_stats(&ev, "connection_stats", s->conns);
    svc_log_end(&ev);

    if (j.all_stopped) {
        /* Every thread is gone: freeing cannot block. A stuck thread keeps
         * its pool (and the task table and connection it may still touch)
         * alive; the process exit is then the final boundary. */
        httpd_destroy(s->http);
        tp_destroy(s->conns);
        tp_destroy(s->tasks);
        svc_tasks_destroy(&s->table);
    }
    return code;
}

/* A failure before the service runs: one JSON line (error level, so that
 * LOG_LEVEL never hides it), then the exit status. */
static int startup_error(const char *msg, const char *variable, const char *error, int code) {
    svc_log ev;
    svc_log_begin(&ev, "error", msg);
    if (variable != NULL) svc_log_str(&ev, "variable", variable);
    svc_log_str(&ev, "error", error);
    svc_log_int(&ev, "exit_code", code);
    svc_log_end(&ev);
    return code;
}

/* USER_WEIGHTS, entry by entry (svc_parse_user_weights). */
static int set_weight(void *arg, const char *user, unsigned weight) {
    int rc = tp_user_weight_set(arg, user, weight);
    if (rc != TP_OK) {
        char err[160];
        snprintf(err, sizeof err, "cannot set the weight of user %s: %s", user, tp_strerror(rc));
        exit(startup_error("startup_failed", "USER_WEIGHTS", err, 1));
    }
    return 0;
}

static tp_pool *make_pool(const tp_config *cfg, const char *what) {
    tp_pool *p = NULL;
    int rc = tp_create(&p, cfg);
    if (rc != TP_OK) {
        char err[128];
        snprintf(err, sizeof err, "cannot create the %s pool: %s", what, tp_strerror(rc));
        exit(startup_error("startup_failed", NULL, err, rc == TP_EINVAL ? 2 : 1));
    }
    return p;
}

static void usage(FILE *f) {
    fprintf(f, "Usage: taskpool-service [--help | --version]\n"
               "\n"
               "An HTTP/1.1 service whose background work runs in a libtaskpool pool.\n"
               "Configured from the environment; logs one JSON object per line on stdout;\n"
               "drains on SIGTERM or SIGINT within SHUTDOWN_TIMEOUT.\n"
               "\n"
               "Endpoints (every GET endpoint also answers HEAD):\n"
               "  POST   /tasks?delay=D&user=U&deadline=D&fail=N&priority=P\n"
               "                     admit a task that waits D (default 100ms): 202 {\"id\":N};\n"
               "                     P is -2..2 (default 0; 2 starts first, below 0 is background);\n"
               "                     503 queue full or draining, 429 user limit, 400 bad input\n"
               "  GET    /tasks/{id} the task's state (queued, running, retrying, succeeded,\n"
               "                     failed, cancelled, expired), status, attempts, priority,\n"
               "                     wait_ms and started_ahead (tasks started while it waited);\n"
               "                     404 if unknown or forgotten, 400 for a malformed id\n"
               "  DELETE /tasks/{id} tp_cancel: 200 ended while queued, 202 delivered to the\n"
               "                     running task, 409 already finished, 404, 400\n"
               "  GET    /work?delay=D  wait D inside the request, then 200\n"
               "  GET    /stats      task-pool statistics, JSON\n"
               "  GET    /metrics    Prometheus text\n"
               "  GET    /healthz    liveness: 200; 503 while draining\n"
               "  GET    /readyz     readiness: 200; 503 while draining\n"
               "Unknown query parameters and HTTP/1.1 requests without Host get 400;\n"
               "unknown methods 501. /healthz and /readyz answer even over MAX_CONNS.\n"
               "\n"
               "Environment (durations like 250ms, 5s, 1m30s; unset or empty = default):\n"
               "  LISTEN_ADDR       host:port, [v6]:port or :port; 0 = any port (127.0.0.1:8080)\n"
               "  WORKERS           task-pool workers, 1..1024 (4)\n"
               "  QUEUE_CAPACITY    tasks waiting for a worker, 1..65536 (64)\n"
               "  MAX_PER_USER      unfinished tasks per user, 1..1000000 or unlimited (2)\n"
               "  TASK_TIMEOUT      run timeout of each attempt (60s)\n"
               "  TASK_RETRIES      extra attempts after a failed one, 0..100 (0)\n"
               "  RETRY_DELAY       wait before each retry (1s)\n"
               "  TASK_HISTORY      finished tasks GET /tasks/{id} still shows, 1..65536 (256)\n"
               "  SHUTDOWN_TIMEOUT  budget for draining requests and tasks (5s)\n"
               "  MAX_CONNS         connections served at once (the oldest idle one gives way;\n"
               "                    16 spares for probes and lingering closes come on top), 1..1024 (64)\n"
               "  HEADER_TIMEOUT    time to send a request head (5s)\n"
               "  IDLE_TIMEOUT      keep-alive wait for the next request (30s)\n"
               "  LOG_LEVEL         error, warn, info or debug (info)\n"
               "  SCHED             fifo: admission order within a priority; fair: users take\n"
               "                    turns within a priority (fifo)\n"
               "  USER_WEIGHTS      with SCHED=fair: user:weight,... e.g. alice:3,bob:1, weights\n"
               "                    1..1000 (every user 1): a turn starts up to weight tasks\n"
               "  LOW_PRIO_MAX_RUNNING  background tasks (priority < 0) running at once,\n"
               "                    0..WORKERS; 0 = no limit (0)\n"
               "  PRIO_STARVE_LIMIT starts a waiting priority lets higher ones take before it\n"
               "                    gets one, 1..1000000 or unlimited (strict) (16)\n"
               "\n"
               "Exit status: 0 drained in time, 1 drain forced or start failed,\n"
               "2 invalid configuration or command line.\n");
}

/* -1: run the service; otherwise exit with that status. */
static int parse_args(int argc, char **argv) {
    if (argc <= 1) return -1;
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
        printf("taskpool-service %s (libtaskpool %s)\n", SVC_VERSION, tp_version());
        return 0;
    }
    const char *bad = argv[1];
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") != 0 && strcmp(argv[i], "-h") != 0 &&
            strcmp(argv[i], "--version") != 0 && strcmp(argv[i], "-V") != 0) {
            bad = argv[i];
            break;
        }
    fprintf(stderr, "taskpool-service: unknown option or argument '%s' (try --help)\n", bad);
    return 2;
}

int main(int argc, char **argv) {
    int rc_args = parse_args(argc, argv);
    if (rc_args >= 0) return rc_args;
    static svc s; /* static: request tasks point at it until the pools are destroyed */
    char err[512];
    const char *var = NULL;
    int loaded = svc_config_load(&s.cfg, err, sizeof err, &var);
    svc_log_set_level(s.cfg.log_level);
    if (loaded != 0) return startup_error("config_error", var, err, 2);
    /* Listening first: a bad address is a configuration error (exit 2),
     * and connections wait in the backlog until the loop runs. */
    static httpd_config hcfg;
    hcfg = (httpd_config){
        .listen_addr = s.cfg.listen_addr,
        .addr_name = "LISTEN_ADDR",
        .max_conns = s.cfg.max_conns,
        .header_timeout_ns = s.cfg.header_timeout_ns,
        .idle_timeout_ns = s.cfg.idle_timeout_ns,
        .write_timeout_ns = WRITE_TIMEOUT_NS,
        .routes = svc_routes,
        .nroutes = svc_nroutes,
        .app = &s,
        .dispatch = svc_dispatch,
        .log_level = "info",
    };
    char addr[80];
    int hrc = httpd_create(&s.http, &hcfg, addr, sizeof addr, err, sizeof err);
    if (hrc == HTTPD_EADDR) return startup_error("config_error", "LISTEN_ADDR", err, 2);
    if (hrc != HTTPD_OK) return startup_error("listen_failed", "LISTEN_ADDR", err, 1);
    if (pipe2(sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0 || pipe2(done_pipe, O_CLOEXEC) != 0) {
        snprintf(err, sizeof err, "pipe: %s", strerror(errno));
        return startup_error("startup_failed", NULL, err, 1);
    }
    /* Every task that can be unfinished, every handler that can hold a
     * reservation, and TASK_HISTORY more (tasks.h). */
    size_t entries = (size_t)s.cfg.workers + s.cfg.queue_capacity + s.cfg.max_conns + s.cfg.task_history;
    if (svc_tasks_init(&s.table, entries) != 0)
        return startup_error("startup_failed", NULL, "out of memory for the task table", 1);

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
        .max_retries = s.cfg.task_retries,
        .retry_delay_ns = s.cfg.retry_delay_ns,
        .name = "task",
        .log = svc_log_hook,
        .sched = s.cfg.sched,
        .prio_starve_limit = s.cfg.prio_starve_limit,
        .low_prio_max_running = s.cfg.low_prio_max_running,
    };
    tp_config ccfg = {
        .workers = s.cfg.max_conns,
        .queue_capacity = s.cfg.max_conns, /* the server's max_conns is the real cap; this absorbs
                                              the moment between a task's end and its worker's return */
        .max_per_user = TP_UNLIMITED,
        .run_timeout_ns = TP_FOREVER, /* the server keeps its own deadlines */
        .drain_timeout_ns = s.cfg.shutdown_timeout_ns,
        .name = "conn",
        .log = svc_log_hook,
    };
    s.tasks = make_pool(&tcfg, "task");
    s.conns = make_pool(&ccfg, "connection");
    if (s.cfg.user_weights != NULL) /* validated by svc_config_load: only tp_user_weight_set can fail */
        (void)svc_parse_user_weights(s.cfg.user_weights, set_weight, s.tasks, err, sizeof err);

    /* The first line: tests and scripts read the actual address from it. */
    svc_log ev;
    svc_log_begin_always(&ev, "info", "listening");
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
    svc_log_uint(&ev, "task_retries", s.cfg.task_retries);
    svc_log_uint(&ev, "task_history", s.cfg.task_history);
    svc_log_str(&ev, "sched", s.cfg.sched == TP_SCHED_FAIR ? "fair" : "fifo");
    svc_log_uint(&ev, "low_prio_max_running", s.cfg.low_prio_max_running);
    if (s.cfg.prio_starve_limit == TP_UNLIMITED)
        svc_log_str(&ev, "prio_starve_limit", "unlimited");
    else
        svc_log_uint(&ev, "prio_starve_limit", s.cfg.prio_starve_limit);
    svc_log_str(&ev, "log_level", (const char *[]){"error", "warn", "info", "debug"}[s.cfg.log_level]);
    svc_log_str(&ev, "service_version", SVC_VERSION);
    svc_log_str(&ev, "taskpool_version", tp_version());
    svc_log_strn(&ev, "user_weights", s.cfg.user_weights, 512); /* last: a long list is cut, nothing else */
    svc_log_end(&ev);

    pthread_sigmask(SIG_SETMASK, &old, NULL);
    while (!got_signal) {
        if (httpd_run(s.http, &sig_pipe[0], 1) < 0) {
            svc_log_begin(&ev, "error", "poll_failed");
            svc_log_str(&ev, "error", strerror(errno));
            svc_log_end(&ev);
            break;
        }
    }
    int code = run_shutdown(&s);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    close(done_pipe[0]);
    close(done_pipe[1]);
    return code;
}
