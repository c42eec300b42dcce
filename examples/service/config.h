/*
 * config.h -- the service's configuration, read from the environment.
 *
 * Every setting has a default, so the service starts with no environment at
 * all. Values are parsed strictly: a number is plain decimal digits within its
 * range, a duration is one or more <number><unit> pairs ("250ms", "1.5s",
 * "1m30s"; units ns, us, ms, s, m, h; a bare "0" is zero). Signs, spaces,
 * trailing garbage and overflow are errors, never clamped or ignored: a
 * misspelt setting must stop the service at start (exit status 2), not
 * surface as odd behaviour under load.
 */
#ifndef SVC_CONFIG_H
#define SVC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define SVC_NS_PER_MS 1000000ull
#define SVC_NS_PER_S  1000000000ull

/* A user name (?user=, USER_WEIGHTS): 1 to SVC_USER_MAX of [A-Za-z0-9._@-]. */
#define SVC_USER_MAX    64
/* USER_WEIGHTS holds at most this many users. */
#define SVC_WEIGHTS_MAX 1024

typedef struct svc_config {
    char listen_addr[256];         /* LISTEN_ADDR, host:port; port 0 picks a free one */
    unsigned workers;              /* WORKERS: task pool workers */
    unsigned queue_capacity;       /* QUEUE_CAPACITY: waiting tasks */
    unsigned max_per_user;         /* MAX_PER_USER: unfinished tasks per user ("unlimited" allowed) */
    unsigned max_conns;            /* MAX_CONNS: open connections, one connection-pool worker each */
    uint64_t task_timeout_ns;      /* TASK_TIMEOUT: run timeout of each task */
    uint64_t shutdown_timeout_ns;  /* SHUTDOWN_TIMEOUT: budget for draining requests and tasks */
    uint64_t header_timeout_ns;    /* HEADER_TIMEOUT: time to send a whole request head */
    uint64_t idle_timeout_ns;      /* IDLE_TIMEOUT: keep-alive wait for the next request */
    int log_level;                 /* LOG_LEVEL: SVC_LOG_ERROR..SVC_LOG_DEBUG (log.h) */
    unsigned task_history;         /* TASK_HISTORY: finished tasks GET /tasks/{id} still shows */
    unsigned task_retries;         /* TASK_RETRIES: max_retries of the task pool */
    uint64_t retry_delay_ns;       /* RETRY_DELAY: retry_delay_ns of the task pool */
    unsigned sched;                /* SCHED: TP_SCHED_FIFO ("fifo") or TP_SCHED_FAIR ("fair") */
    const char *user_weights;      /* USER_WEIGHTS, validated; NULL = none (points into the environment) */
    unsigned low_prio_max_running; /* LOW_PRIO_MAX_RUNNING: 0 = no limit, else at most WORKERS */
    unsigned prio_starve_limit;    /* PRIO_STARVE_LIMIT: 1..1000000 or TP_UNLIMITED ("unlimited") */
} svc_config;

/* Parse a duration into nanoseconds. 0 on success, -1 on any error. */
int svc_parse_duration(const char *s, uint64_t *out_ns);

/* Parse a plain decimal unsigned in [min, max]. 0 on success, -1 on error. */
int svc_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out);

/* Is s[0..n) a user name (SVC_USER_MAX above)? 1 or 0. */
int svc_user_name_ok(const char *s, size_t n);

/* Parse a list of user weights, "alice:3,bob:1": one or more entries
 * separated by single commas, each a user name (svc_user_name_ok), a colon
 * and a whole number from 1 to TP_WEIGHT_MAX; at most SVC_WEIGHTS_MAX
 * entries, no name twice, no spaces. When `fn` is not NULL it is called
 * for each entry in order (the name NUL-terminated, valid during the call)
 * once the whole list has been checked; a non-zero return stops the walk
 * and is returned. 0; -1 with a one-line explanation naming USER_WEIGHTS in
 * `err` if the list is malformed. Shared with taskpool-stream-worker. */
typedef int (*svc_weight_fn)(void *arg, const char *user, unsigned weight);
int svc_parse_user_weights(const char *s, svc_weight_fn fn, void *arg, char *err, size_t errlen);

/* Read SCHED into *out when it is set: "fifo" -> TP_SCHED_FIFO, "fair" ->
 * TP_SCHED_FAIR (exactly, lower case). 0, or -1 with a one-line explanation
 * in `err`. Shared with taskpool-stream-worker. */
int svc_load_sched(unsigned *out, char *err, size_t errlen);

/* Read LOW_PRIO_MAX_RUNNING (0..workers; 0 = no limit) and PRIO_STARVE_LIMIT
 * (1..1000000, or "unlimited" -> TP_UNLIMITED) into *out when set. 0, or -1
 * with a one-line explanation naming the variable in `err`. Shared with
 * taskpool-stream-worker. */
int svc_load_low_prio_max_running(unsigned workers, unsigned *out, char *err, size_t errlen);
int svc_load_prio_starve_limit(unsigned *out, char *err, size_t errlen);

/* An environment variable's value; NULL when unset or empty. */
const char *svc_env(const char *name);

/* Read variable `name` into *out when it is set: a whole number in [min,
 * max], or a duration (svc_parse_duration) in [min, max] ns. An unset
 * variable leaves *out alone. 0, or -1 with a one-line explanation naming
 * the variable in `err`. */
int svc_load_uint(const char *name, unsigned min, unsigned max, unsigned *out, char *err, size_t errlen);
int svc_load_duration(const char *name, uint64_t min, uint64_t max, uint64_t *out, char *err, size_t errlen);

/* Fill `cfg` from the environment (defaults for unset or empty variables).
 * 0 on success; -1 with a one-line explanation in `err` and the name of the
 * offending variable in *var otherwise. */
int svc_config_load(svc_config *cfg, char *err, size_t errlen, const char **var);

#endif
