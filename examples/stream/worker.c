/*
 * worker.c -- taskpool-stream-worker: runs the entries of a Redis stream on a
 * libtaskpool pool. Run as many copies as you like, on as many machines, with
 * the same STREAM and GROUP (see tp_stream.h for how they share the work).
 *
 * Threads: main (configuration, then sigwait for SIGTERM/SIGINT, then the
 * shutdown), the pool's workers and service thread, the consumer's Redis I/O
 * thread, and the metrics thread when METRICS_ADDR is set. SIGTERM and SIGINT
 * are blocked before any thread starts, so only sigwait() sees them.
 *
 * Shutdown, one budget of SHUTDOWN_TIMEOUT:
 *   1. stop reading and claiming; entries still waiting locally for a user
 *      slot are released (they stay pending in the group);
 *   2. tp_shutdown(pool, SHUTDOWN_TIMEOUT): running and queued tasks finish,
 *      their outcomes are written and acknowledged as they end; when the
 *      budget runs out, running tasks are cancelled and queued ones dropped:
 *      neither is acknowledged, so another worker claims them after CLAIM_IDLE;
 *   3. up to 1 s for cancelled tasks to return, then what is left of the budget
 *      (at least 2 s) to write the last outcomes;
 *   4. exit 0 when everything drained and was written, 1 otherwise.
 * Exit status 2: invalid configuration or command line (one line on stderr).
 * --help and --version print and exit 0 without touching Redis.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "taskpool.h"
#include "tp_stream.h"

#ifdef TPS_TEST_HANDLERS
/* The tests' build of this program (taskpool-stream-worker-test): TEST_HANDLER
 * names one of tests/stream/test_handlers.c's handlers. */
#include "test_handlers.h"
#endif

typedef struct wcfg {
    const char *redis_url, *redis_password, *stream, *group, *group_start, *consumer, *results, *dead,
        *metrics_addr;
    const char *user_weights; /* USER_WEIGHTS, validated; NULL = none */
    unsigned workers, queue_capacity, max_per_user, max_retries, max_deliveries, backlog, scheduled_max,
        trim_done, results_maxlen, dead_maxlen;
    unsigned sched, low_prio_max_running, prio_starve_limit; /* taskpool.h section 14 */
    uint64_t task_timeout_ns, retry_delay_ns, retry_delay_max_ns, claim_idle_ns, shutdown_timeout_ns,
        trim_interval_ns;
} wcfg;

static void usage(FILE *f) {
    fprintf(f, "Usage: taskpool-stream-worker [--help | --version]\n"
               "\n"
               "Runs the entries of a Redis stream, read through a consumer group, on a\n"
               "libtaskpool pool; writes each outcome to the results or the dead stream and\n"
               "acknowledges the entry only then. Configured from the environment; logs one\n"
               "JSON object per line on stdout; drains on SIGTERM or SIGINT.\n"
               "\n"
               "Environment (durations like 250ms, 5s, 1m30s; unset or empty = default):\n"
               "  REDIS_URL         redis://[user[:password]@]host[:port] or\n"
               "                    unix://[user[:password]@]/path (redis://127.0.0.1:6379)\n"
               "  REDIS_PASSWORD    the password, kept out of the process listing (unset)\n"
               "  STREAM            the stream of entries (tasks)\n"
               "  GROUP             the consumer group (taskpool)\n"
               "  GROUP_START       where a missing group starts: $ new entries, 0 all ($)\n"
               "  CONSUMER          this worker's name in the group (<hostname>-<pid>)\n"
               "  RESULTS_STREAM    successes (tasks:done); must differ from STREAM\n"
               "  DEAD_STREAM       final failures (tasks:dead); must differ from STREAM\n"
               "  RESULTS_MAXLEN    keep about this many results, XADD MAXLEN ~ (0 = all)\n"
               "  DEAD_MAXLEN       keep about this many dead records (0 = all)\n"
               "  TRIM_DONE         1: trim STREAM below the oldest pending entry (0)\n"
               "  TRIM_INTERVAL     how often TRIM_DONE trims (5s)\n"
               "  WORKERS           pool workers, 1..1024 (4)\n"
               "  QUEUE_CAPACITY    pool queue, 1..65536 (64)\n"
               "  MAX_PER_USER      running or queued entries per user, or unlimited (2)\n"
               "  LOCAL_BACKLOG     entries held beyond the pool (WORKERS + QUEUE_CAPACITY)\n"
               "  SCHEDULED_MAX     entries waiting for not_before/defer, 1..10000000 (10000)\n"
               "  TASK_TIMEOUT      run timeout of each attempt (60s)\n"
               "  MAX_RETRIES       extra attempts after a failed one, 0..100 (2)\n"
               "  RETRY_DELAY       wait before each retry (100ms); the first one with\n"
               "                    RETRY_DELAY_MAX\n"
               "  RETRY_DELAY_MAX   exponential backoff: retry k waits RETRY_DELAY x 2^(k-1),\n"
               "                    at most this; at least RETRY_DELAY (0 = a fixed delay)\n"
               "  SCHED             fifo: read order within a priority; fair: users take\n"
               "                    turns within a priority (fifo)\n"
               "  USER_WEIGHTS      with SCHED=fair: user:weight,... e.g. alice:3,bob:1, weights\n"
               "                    1..1000 (every user 1): a turn starts up to weight entries\n"
               "  LOW_PRIO_MAX_RUNNING  background entries (priority < 0) running at once,\n"
               "                    0..WORKERS; 0 = no limit (0)\n"
               "  PRIO_STARVE_LIMIT starts a waiting priority lets higher ones take before it\n"
               "                    gets one, 1..1000000 or unlimited (strict) (16)\n"
               "  CLAIM_IDLE        claim entries pending this long elsewhere (30s)\n"
               "  MAX_DELIVERIES    more deliveries than this: dead stream (5)\n"
               "  SHUTDOWN_TIMEOUT  drain budget after SIGTERM/SIGINT (10s)\n"
               "  METRICS_ADDR      host:port of GET /metrics; port 0 = any (unset: none)\n"
               "  LOG_LEVEL         error, warn, info or debug (info)\n"
               "\n"
               "Entry fields: user, work (alias delay), fail, payload, not_before, defer,\n"
               "attempts, priority (-2..2, 0 when absent); see README.md.\n"
               "\n"
               "Exit status: 0 drained and every outcome written, 1 drain forced or\n"
               "outcomes left pending, 2 invalid configuration or command line.\n");
}

/* -1: run the worker; otherwise exit with that status. */
static int parse_args(int argc, char **argv) {
    if (argc <= 1) return -1;
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
        printf("taskpool-stream-worker (libtaskpool %s)\n", tp_version());
        return 0;
    }
    const char *bad = argv[1];
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") != 0 && strcmp(argv[i], "-h") != 0 &&
            strcmp(argv[i], "--version") != 0 && strcmp(argv[i], "-V") != 0) {
            bad = argv[i];
            break;
        }
    fprintf(stderr, "taskpool-stream-worker: unknown option or argument '%s' (try --help)\n", bad);
    return 2;
}

static int load_config(wcfg *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->redis_url = svc_env("REDIS_URL");
    c->redis_password = svc_env("REDIS_PASSWORD");
    c->stream = svc_env("STREAM");
    c->group = svc_env("GROUP");
    c->group_start = svc_env("GROUP_START");
    c->consumer = svc_env("CONSUMER");
    c->results = svc_env("RESULTS_STREAM");
    c->dead = svc_env("DEAD_STREAM");
    c->metrics_addr = svc_env("METRICS_ADDR");
    c->workers = 4;
    c->queue_capacity = 64;
    c->max_per_user = 2;
    c->max_retries = 2;
    c->max_deliveries = 5;
    c->task_timeout_ns = 60 * SVC_NS_PER_S;
    c->retry_delay_ns = 100 * SVC_NS_PER_MS;
    c->claim_idle_ns = 30 * SVC_NS_PER_S;
    c->shutdown_timeout_ns = 10 * SVC_NS_PER_S;
    c->trim_interval_ns = 5 * SVC_NS_PER_S;
    c->sched = TP_SCHED_FIFO;
    c->prio_starve_limit = 16; /* the library's default, stated */
    const char *lvl = svc_env("LOG_LEVEL");
    int level = lvl != NULL ? svc_log_parse_level(lvl) : SVC_LOG_INFO;
    if (level < 0) {
        snprintf(err, errlen, "LOG_LEVEL=\"%s\": expected error, warn, info or debug", lvl);
        return -1;
    }
    svc_log_set_level(level);
    const char *mpu = svc_env("MAX_PER_USER");
    if (mpu != NULL && strcmp(mpu, "unlimited") == 0)
        c->max_per_user = TP_UNLIMITED;
    else if (svc_load_uint("MAX_PER_USER", 1, 1000000, &c->max_per_user, err, errlen) != 0)
        return -1;
    const uint64_t ms = SVC_NS_PER_MS, day = 86400ull * SVC_NS_PER_S;
    if (svc_load_uint("WORKERS", 1, 1024, &c->workers, err, errlen) != 0 ||
        svc_load_uint("QUEUE_CAPACITY", 1, 65536, &c->queue_capacity, err, errlen) != 0 ||
        svc_load_uint("MAX_RETRIES", 0, TP_MAX_RETRIES, &c->max_retries, err, errlen) != 0 ||
        svc_load_uint("MAX_DELIVERIES", 1, 1000000, &c->max_deliveries, err, errlen) != 0 ||
        svc_load_uint("LOCAL_BACKLOG", 1, 65536, &c->backlog, err, errlen) != 0 ||
        svc_load_duration("TASK_TIMEOUT", 1 * ms, day, &c->task_timeout_ns, err, errlen) != 0 ||
        svc_load_duration("RETRY_DELAY", 1 * ms, 3600 * SVC_NS_PER_S, &c->retry_delay_ns, err, errlen) != 0 ||
        svc_load_duration("CLAIM_IDLE", 10 * ms, day, &c->claim_idle_ns, err, errlen) != 0 ||
        svc_load_duration("SHUTDOWN_TIMEOUT", 1 * ms, day, &c->shutdown_timeout_ns, err, errlen) != 0 ||
        svc_load_uint("SCHEDULED_MAX", 1, 10000000, &c->scheduled_max, err, errlen) != 0 ||
        svc_load_uint("TRIM_DONE", 0, 1, &c->trim_done, err, errlen) != 0 ||
        svc_load_duration("TRIM_INTERVAL", 100 * ms, day, &c->trim_interval_ns, err, errlen) != 0 ||
        svc_load_uint("RESULTS_MAXLEN", 0, 4000000000u, &c->results_maxlen, err, errlen) != 0 ||
        svc_load_uint("DEAD_MAXLEN", 0, 4000000000u, &c->dead_maxlen, err, errlen) != 0)
        return -1;
    /* Exponential backoff (tp_config.retry_delay_max_ns): 0 keeps the fixed
     * RETRY_DELAY; anything else must be at least RETRY_DELAY, as the pool
     * requires. */
    if (svc_load_duration("RETRY_DELAY_MAX", 0, day, &c->retry_delay_max_ns, err, errlen) != 0) return -1;
    if (c->retry_delay_max_ns != 0 && c->retry_delay_max_ns < c->retry_delay_ns) {
        snprintf(err, errlen,
                 "RETRY_DELAY_MAX=\"%s\": must be at least RETRY_DELAY (%llu ms), or 0 for a fixed delay",
                 svc_env("RETRY_DELAY_MAX"), (unsigned long long)(c->retry_delay_ns / ms));
        return -1;
    }
    /* Scheduling (taskpool.h section 14), read as taskpool-service reads it. */
    if (svc_load_sched(&c->sched, err, errlen) != 0) return -1;
    c->user_weights = svc_env("USER_WEIGHTS");
    if (c->user_weights != NULL) {
        if (svc_parse_user_weights(c->user_weights, NULL, NULL, err, errlen) != 0) return -1;
        if (c->sched != TP_SCHED_FAIR) {
            snprintf(err, errlen,
                     "USER_WEIGHTS is set but SCHED is not fair: weights are shares of a fair pool");
            return -1;
        }
    }
    if (svc_load_low_prio_max_running(c->workers, &c->low_prio_max_running, err, errlen) != 0 ||
        svc_load_prio_starve_limit(&c->prio_starve_limit, err, errlen) != 0)
        return -1;
    if (c->backlog == 0) c->backlog = c->workers + c->queue_capacity;
    return 0;
}

/* ------------------------------------------------------------------ logging, metrics */

static const char *level_name(int level) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    return level >= 0 && level <= 3 ? names[level] : "info";
}

static void stream_log(void *arg, int level, const char *event, const char *const *kv, size_t nkv) {
    (void)arg;
    svc_log ev;
    svc_log_begin(&ev, level_name(level), event);
    for (size_t i = 0; i < nkv; i++) svc_log_str(&ev, kv[2 * i], kv[2 * i + 1]);
    svc_log_end(&ev);
}

typedef struct worker {
    tp_pool *pool;
    tps_consumer *consumer;
} worker;

static int render_metrics(void *arg, char *buf, size_t len) {
    worker *w = arg;
    tp_stats ps;
    tps_stats ss;
    tp_stats_get(w->pool, &ps);
    tps_stats_get(w->consumer, &ss);
    int a = tp_stats_format(&ps, TP_FORMAT_PROMETHEUS, buf, len);
    if (a < 0) return a;
    size_t off = (size_t)a < len ? (size_t)a : len;
    int b = tps_stats_format(&ss, buf + off, len - off);
    return b < 0 ? b : a + b;
}

static void log_stats(svc_log *ev, worker *w) {
    tp_stats ps;
    tps_stats ss;
    char json[1024];
    tp_stats_get(w->pool, &ps);
    int n = tp_stats_format(&ps, TP_FORMAT_JSON, json, sizeof json);
    svc_log_raw(ev, "pool", n > 0 && (size_t)n < sizeof json ? json : "null");
    tps_stats_get(w->consumer, &ss);
    snprintf(json, sizeof json,
             "{\"read\":%llu,\"claimed\":%llu,\"acked\":%llu,\"succeeded\":%llu,\"dead\":%llu,"
             "\"malformed\":%llu,\"deleted\":%llu,\"ack_missed\":%llu,\"abandoned\":%llu,\"user_waits\":%llu,"
             "\"low_prio_waits\":%llu,"
             "\"reconnects\":%llu,\"scheduled\":%llu,\"write_failures\":%llu,\"trimmed\":%llu,"
             "\"held\":%llu,\"backlog\":%llu,\"unwritten\":%llu,\"waiting\":%llu}",
             (unsigned long long)ss.read, (unsigned long long)ss.claimed, (unsigned long long)ss.acked,
             (unsigned long long)ss.succeeded, (unsigned long long)ss.dead, (unsigned long long)ss.malformed,
             (unsigned long long)ss.deleted, (unsigned long long)ss.ack_missed,
             (unsigned long long)ss.abandoned, (unsigned long long)ss.user_waits,
             (unsigned long long)ss.low_prio_waits, (unsigned long long)ss.reconnects,
             (unsigned long long)ss.scheduled, (unsigned long long)ss.write_failures,
             (unsigned long long)ss.trimmed, (unsigned long long)ss.held, (unsigned long long)ss.backlog,
             (unsigned long long)ss.unwritten, (unsigned long long)ss.waiting);
    svc_log_raw(ev, "stream", json);
}

/* USER_WEIGHTS, entry by entry (svc_parse_user_weights calls it). */
static int set_weight(void *arg, const char *user, unsigned weight) {
    int rc = tp_user_weight_set(arg, user, weight);
    if (rc != TP_OK)
        fprintf(stderr, "taskpool-stream-worker: cannot set the weight of user %s: %s\n", user,
                tp_strerror(rc));
    return rc;
}

static uint64_t left(uint64_t deadline) {
    uint64_t now = tp_now_ns();
    return now + 1 >= deadline ? 1 : deadline - now;
}

int main(int argc, char **argv) {
    int rc_args = parse_args(argc, argv);
    if (rc_args >= 0) return rc_args;
    wcfg cfg;
    char err[512];
    if (load_config(&cfg, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-stream-worker: %s\n", err);
        return 2;
    }
    tps_handler handler = NULL; /* tps_default_handler */
#ifdef TPS_TEST_HANDLERS
    if (tps_test_handler(getenv("TEST_HANDLER"), &handler) != 0) {
        fprintf(stderr, "taskpool-stream-worker: TEST_HANDLER: unknown handler\n");
        return 2;
    }
#endif
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, NULL); /* every thread started below inherits it */
    signal(SIGPIPE, SIG_IGN);

    static worker w;
    tp_config pc = {
        .workers = cfg.workers,
        .queue_capacity = cfg.queue_capacity,
        .max_per_user = cfg.max_per_user,
        .run_timeout_ns = cfg.task_timeout_ns,
        .drain_timeout_ns = cfg.shutdown_timeout_ns,
        .max_retries = cfg.max_retries,
        .retry_delay_ns = cfg.retry_delay_ns,
        .retry_delay_max_ns = cfg.retry_delay_max_ns,
        .sched = cfg.sched,
        .prio_starve_limit = cfg.prio_starve_limit,
        .low_prio_max_running = cfg.low_prio_max_running,
        .name = "stream",
        .log = svc_log_hook,
    };
    int rc = tp_create(&w.pool, &pc);
    if (rc != TP_OK) {
        fprintf(stderr, "taskpool-stream-worker: cannot create the pool: %s\n", tp_strerror(rc));
        return rc == TP_EINVAL ? 2 : 1;
    }
    /* validated by load_config: only tp_user_weight_set's memory can fail */
    if (cfg.user_weights != NULL &&
        svc_parse_user_weights(cfg.user_weights, set_weight, w.pool, err, sizeof err) != 0) {
        tp_destroy(w.pool);
        return 1;
    }
    tps_config sc = {
        .handler = handler,
        .redis_url = cfg.redis_url,
        .redis_password = cfg.redis_password,
        .stream = cfg.stream,
        .group = cfg.group,
        .group_start = cfg.group_start,
        .consumer = cfg.consumer,
        .results_stream = cfg.results,
        .dead_stream = cfg.dead,
        .results_maxlen = cfg.results_maxlen,
        .dead_maxlen = cfg.dead_maxlen,
        .trim_interval_ns = cfg.trim_done ? cfg.trim_interval_ns : 0,
        .scheduled_max = cfg.scheduled_max,
        .max_retries = cfg.max_retries,
        .pool = w.pool,
        .pool_capacity = cfg.workers + cfg.queue_capacity,
        .queue_capacity = cfg.queue_capacity,
        .backlog = cfg.backlog,
        .low_prio_max_running = cfg.low_prio_max_running,
        .claim_idle_ns = cfg.claim_idle_ns,
        .max_deliveries = cfg.max_deliveries,
        .log = stream_log,
    };
    if (tps_create(&w.consumer, &sc, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-stream-worker: %s\n", err);
        tp_destroy(w.pool);
        return 2;
    }
    metrics_server *ms = NULL;
    char bound[128] = "";
    if (cfg.metrics_addr != NULL) {
        ms = metrics_start(cfg.metrics_addr, render_metrics, &w, bound, sizeof bound, err, sizeof err);
        if (ms == NULL) {
            fprintf(stderr, "taskpool-stream-worker: %s\n", err);
            tps_destroy(w.consumer);
            tp_destroy(w.pool);
            return 2;
        }
    }
    svc_log ev;
    svc_log_begin_always(&ev, "info", "started"); /* scripts read the metrics address from it */
    svc_log_int(&ev, "pid", (long long)getpid());
    svc_log_str(&ev, "consumer", tps_consumer_name(w.consumer));
    svc_log_str(&ev, "redis_url", tps_redis_shown(w.consumer));
    svc_log_str(&ev, "stream", cfg.stream != NULL ? cfg.stream : "tasks");
    svc_log_str(&ev, "group", cfg.group != NULL ? cfg.group : "taskpool");
    svc_log_str(&ev, "group_start", cfg.group_start != NULL ? cfg.group_start : "$");
    svc_log_uint(&ev, "results_maxlen", cfg.results_maxlen);
    svc_log_uint(&ev, "dead_maxlen", cfg.dead_maxlen);
    svc_log_uint(&ev, "trim_interval_ms", cfg.trim_done ? cfg.trim_interval_ns / SVC_NS_PER_MS : 0);
    svc_log_uint(&ev, "workers", cfg.workers);
    svc_log_uint(&ev, "queue_capacity", cfg.queue_capacity);
    if (cfg.max_per_user == TP_UNLIMITED)
        svc_log_str(&ev, "max_per_user", "unlimited");
    else
        svc_log_uint(&ev, "max_per_user", cfg.max_per_user);
    svc_log_uint(&ev, "local_backlog", cfg.backlog);
    svc_log_uint(&ev, "claim_idle_ms", cfg.claim_idle_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "max_deliveries", cfg.max_deliveries);
    svc_log_uint(&ev, "max_retries", cfg.max_retries);
    svc_log_uint(&ev, "retry_delay_ms", cfg.retry_delay_ns / SVC_NS_PER_MS);
    svc_log_uint(&ev, "retry_delay_max_ms", cfg.retry_delay_max_ns / SVC_NS_PER_MS);
    svc_log_str(&ev, "sched", cfg.sched == TP_SCHED_FAIR ? "fair" : "fifo");
    if (cfg.user_weights != NULL) svc_log_str(&ev, "user_weights", cfg.user_weights);
    svc_log_uint(&ev, "low_prio_max_running", cfg.low_prio_max_running);
    if (cfg.prio_starve_limit == TP_UNLIMITED)
        svc_log_str(&ev, "prio_starve_limit", "unlimited");
    else
        svc_log_uint(&ev, "prio_starve_limit", cfg.prio_starve_limit);
    svc_log_uint(&ev, "scheduled_max", cfg.scheduled_max != 0 ? cfg.scheduled_max : 10000);
    svc_log_uint(&ev, "shutdown_timeout_ms", cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    if (ms != NULL) svc_log_str(&ev, "metrics_address", bound);
    svc_log_str(&ev, "taskpool_version", tp_version());
    svc_log_end(&ev);

    if (tps_start(w.consumer) != 0) {
        fprintf(stderr, "taskpool-stream-worker: cannot start the I/O thread\n");
        return 1;
    }
    int sig = 0;
    while (sigwait(&term, &sig) != 0) {
    }

    uint64_t t0 = tp_now_ns(), deadline = t0 + cfg.shutdown_timeout_ns;
    svc_log_begin(&ev, "info", "shutdown_started");
    svc_log_str(&ev, "signal", sig == SIGINT ? "SIGINT" : "SIGTERM");
    svc_log_uint(&ev, "budget_ms", cfg.shutdown_timeout_ns / SVC_NS_PER_MS);
    log_stats(&ev, &w);
    svc_log_end(&ev);

    tps_stop_reading(w.consumer);
    int rc_pool = tp_shutdown(w.pool, left(deadline));
    (void)tp_wait(w.pool, SVC_NS_PER_S);
    tp_stats ps;
    tp_stats_get(w.pool, &ps);
    int stopped = ps.workers == 0 && ps.active == 0;
    uint64_t write_budget = left(deadline);
    if (write_budget < 2 * SVC_NS_PER_S) write_budget = 2 * SVC_NS_PER_S;
    int rc_write = tps_finish(w.consumer, write_budget);

    int code = rc_pool == TP_OK && rc_write == 0 ? 0 : 1;
    svc_log_begin(&ev, code == 0 ? "info" : "warn", "shutdown_complete");
    svc_log_str(&ev, "result", code == 0 ? "drained" : rc_pool != TP_OK ? "forced" : "unwritten");
    svc_log_str(&ev, "pool_result", tp_err_name(rc_pool));
    svc_log_str(&ev, "outcomes", rc_write == 0 ? "written" : "left pending");
    svc_log_uint(&ev, "ms", (tp_now_ns() - t0) / SVC_NS_PER_MS);
    svc_log_int(&ev, "exit_code", code);
    log_stats(&ev, &w);
    svc_log_end(&ev);

    metrics_stop(ms);
    if (stopped) { /* a task ignoring cancellation keeps its slot: then the exit frees it */
        tps_destroy(w.consumer);
        tp_destroy(w.pool);
    }
    return code;
}
