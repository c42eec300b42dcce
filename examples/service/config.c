/*
 * config.c -- environment settings and the strict parsers behind them.
 *
 * The duration parser is also used for the `delay` query parameter, so it is
 * written for hostile input: it reads at most what it can represent, checks
 * every multiplication and addition for overflow, and accepts nothing it does
 * not fully understand.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "taskpool.h"

static const struct {
    const char *name;
    uint64_t ns;
} units[] = {
    /* First match wins: "ms" must come before "m", or "5ms" would read as 5m + garbage. */
    {"ns", 1ull},
    {"us", 1000ull},
    {"ms", SVC_NS_PER_MS},
    {"s", SVC_NS_PER_S},
    {"m", 60ull * SVC_NS_PER_S},
    {"h", 3600ull * SVC_NS_PER_S},
};

int svc_parse_duration(const char *s, uint64_t *out_ns) {
    if (s == NULL || *s == '\0') return -1;
    if (strcmp(s, "0") == 0) {
        *out_ns = 0;
        return 0;
    }
    uint64_t total = 0;
    while (*s != '\0') {
        /* <digits>[.<digits>] -- at least one digit on one side of the dot. */
        uint64_t whole = 0, frac = 0, frac_scale = 1;
        int digits = 0;
        for (; *s >= '0' && *s <= '9'; s++, digits++) {
            unsigned d = (unsigned)(*s - '0');
            if (whole > (UINT64_MAX - d) / 10) return -1;
            whole = whole * 10 + d;
        }
        if (*s == '.') {
            s++;
            for (; *s >= '0' && *s <= '9'; s++, digits++) {
                if (frac_scale < 1000000000000000000ull) { /* 18 digits are plenty; ignore the rest */
                    frac = frac * 10 + (unsigned)(*s - '0');
                    frac_scale *= 10;
                }
            }
        }
        if (digits == 0) return -1;
        uint64_t unit = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            size_t n = strlen(units[i].name);
            if (strncmp(s, units[i].name, n) == 0) {
                unit = units[i].ns;
                s += n;
                break;
            }
        }
        if (unit == 0) return -1;
        if (whole > UINT64_MAX / unit) return -1;
        uint64_t part = whole * unit;
        /* frac / frac_scale of a unit, in long double: exact enough, cannot overflow. */
        long double f = (long double)frac * (long double)unit / (long double)frac_scale;
        if (f >= (long double)(UINT64_MAX - part)) return -1;
        part += (uint64_t)f;
        if (part > UINT64_MAX - total) return -1;
        total += part;
    }
    *out_ns = total;
    return 0;
}

int svc_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out) {
    if (s == NULL || *s == '\0') return -1;
    unsigned long long v = 0;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (unsigned)(*s - '0');
        if (v > max) return -1;
    }
    if (v < min) return -1;
    *out = (unsigned)v;
    return 0;
}

int svc_user_name_ok(const char *s, size_t n) {
    if (n == 0 || n > SVC_USER_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '@' || ch == '-'))
            return 0;
    }
    return 1;
}

/* One entry of a weight list, s[0..n): its name's length and its weight.
 * 0, or -1 if it is not user:weight. */
static int weight_entry(const char *s, size_t n, size_t *name_len, unsigned *weight) {
    const char *colon = memchr(s, ':', n);
    if (colon == NULL) return -1;
    size_t nl = (size_t)(colon - s), wl = n - nl - 1;
    char w[16];
    if (!svc_user_name_ok(s, nl) || wl == 0 || wl >= sizeof w) return -1;
    memcpy(w, colon + 1, wl);
    w[wl] = '\0';
    if (svc_parse_uint(w, 1, TP_WEIGHT_MAX, weight) != 0) return -1;
    *name_len = nl;
    return 0;
}

int svc_parse_user_weights(const char *s, svc_weight_fn fn, void *arg, char *err, size_t errlen) {
    /* First pass: check everything, so that a bad list applies nothing. */
    size_t count = 0;
    for (const char *p = s;;) {
        size_t n = strcspn(p, ","), nl;
        unsigned w;
        if (weight_entry(p, n, &nl, &w) != 0) {
            snprintf(err, errlen,
                     "USER_WEIGHTS: \"%.*s\" is not user:weight (a user of 1 to %d characters of "
                     "A-Z a-z 0-9 . _ @ -, a weight from 1 to %u; entries separated by single commas)",
                     (int)(n < 80 ? n : 80), p, SVC_USER_MAX, TP_WEIGHT_MAX);
            return -1;
        }
        if (++count > SVC_WEIGHTS_MAX) {
            snprintf(err, errlen, "USER_WEIGHTS: more than %d users", SVC_WEIGHTS_MAX);
            return -1;
        }
        for (const char *q = s; q < p; q += strcspn(q, ",") + 1) /* a name given twice */
            if (strncmp(q, p, nl + 1) == 0) {
                snprintf(err, errlen, "USER_WEIGHTS: user \"%.*s\" is given twice", (int)nl, p);
                return -1;
            }
        if (p[n] == '\0') break;
        p += n + 1;
    }
    for (const char *p = s; fn != NULL;) {
        size_t n = strcspn(p, ","), nl = 0;
        unsigned w = 0;
        char name[SVC_USER_MAX + 1];
        (void)weight_entry(p, n, &nl, &w);
        memcpy(name, p, nl);
        name[nl] = '\0';
        int rc = fn(arg, name, w);
        if (rc != 0) return rc;
        if (p[n] == '\0') break;
        p += n + 1;
    }
    return 0;
}

int svc_load_sched(unsigned *out, char *err, size_t errlen) {
    const char *v = svc_env("SCHED");
    if (v == NULL) return 0;
    if (strcmp(v, "fifo") == 0) {
        *out = TP_SCHED_FIFO;
    } else if (strcmp(v, "fair") == 0) {
        *out = TP_SCHED_FAIR;
    } else {
        snprintf(err, errlen, "SCHED=\"%s\": expected fifo or fair", v);
        return -1;
    }
    return 0;
}

int svc_load_low_prio_max_running(unsigned workers, unsigned *out, char *err, size_t errlen) {
    const char *v = svc_env("LOW_PRIO_MAX_RUNNING");
    if (v != NULL && svc_parse_uint(v, 0, workers, out) != 0) {
        snprintf(err, errlen,
                 "LOW_PRIO_MAX_RUNNING=\"%s\": expected a whole number from 0 (no limit) to WORKERS (%u)", v,
                 workers);
        return -1;
    }
    return 0;
}

int svc_load_prio_starve_limit(unsigned *out, char *err, size_t errlen) {
    const char *v = svc_env("PRIO_STARVE_LIMIT");
    if (v != NULL && strcmp(v, "unlimited") == 0) {
        *out = TP_UNLIMITED;
    } else if (v != NULL && svc_parse_uint(v, 1, 1000000, out) != 0) {
        snprintf(err, errlen,
                 "PRIO_STARVE_LIMIT=\"%s\": expected a whole number from 1 to 1000000, or unlimited", v);
        return -1;
    }
    return 0;
}

/* The variable's value, or NULL when unset or empty (= use the default). */
const char *svc_env(const char *name) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : NULL;
}

int svc_load_uint(const char *name, unsigned min, unsigned max, unsigned *out, char *err, size_t errlen) {
    const char *v = svc_env(name);
    if (v == NULL) return 0;
    if (svc_parse_uint(v, min, max, out) != 0) {
        snprintf(err, errlen, "%s=\"%s\": expected a whole number from %u to %u", name, v, min, max);
        return -1;
    }
    return 0;
}

int svc_load_duration(const char *name, uint64_t min, uint64_t max, uint64_t *out, char *err, size_t errlen) {
    const char *v = svc_env(name);
    if (v == NULL) return 0;
    uint64_t ns;
    if (svc_parse_duration(v, &ns) != 0 || ns < min || ns > max) {
        snprintf(err, errlen, "%s=\"%s\": expected a duration like 250ms or 5s, from %llu ms to %llu s", name,
                 v, (unsigned long long)(min / SVC_NS_PER_MS), (unsigned long long)(max / SVC_NS_PER_S));
        return -1;
    }
    *out = ns;
    return 0;
}

/* Each check below names its variable first, so a failure reports it. */
#define CHECK(name, call)                                                                                    \
    do {                                                                                                     \
        *var = (name);                                                                                       \
        if ((call) != 0) return -1;                                                                          \
    } while (0)

int svc_config_load(svc_config *cfg, char *err, size_t errlen, const char **var) {
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->listen_addr, "127.0.0.1:8080");
    cfg->workers = 4;
    cfg->queue_capacity = 64;
    cfg->max_per_user = 2;
    cfg->max_conns = 64;
    cfg->task_timeout_ns = 60 * SVC_NS_PER_S;
    cfg->shutdown_timeout_ns = 5 * SVC_NS_PER_S;
    cfg->header_timeout_ns = 5 * SVC_NS_PER_S;
    cfg->idle_timeout_ns = 30 * SVC_NS_PER_S;
    cfg->log_level = SVC_LOG_INFO;
    cfg->task_history = 256;
    cfg->task_retries = 0;
    cfg->retry_delay_ns = 1 * SVC_NS_PER_S;
    cfg->sched = TP_SCHED_FIFO;
    cfg->prio_starve_limit = 16; /* the library's default, stated */

    /* First, so that the errors below are already logged at the right level. */
    const char *lvl = svc_env("LOG_LEVEL");
    *var = "LOG_LEVEL";
    if (lvl != NULL && (cfg->log_level = svc_log_parse_level(lvl)) < 0) {
        cfg->log_level = SVC_LOG_INFO;
        snprintf(err, errlen, "LOG_LEVEL=\"%s\": expected error, warn, info or debug", lvl);
        return -1;
    }
    const char *addr = svc_env("LISTEN_ADDR");
    *var = "LISTEN_ADDR";
    if (addr != NULL) {
        if (strlen(addr) >= sizeof cfg->listen_addr) {
            snprintf(err, errlen, "LISTEN_ADDR is too long");
            return -1;
        }
        strcpy(cfg->listen_addr, addr);
    }
    const char *mpu = svc_env("MAX_PER_USER");
    if (mpu != NULL && strcmp(mpu, "unlimited") == 0)
        cfg->max_per_user = TP_UNLIMITED;
    else
        CHECK("MAX_PER_USER", svc_load_uint("MAX_PER_USER", 1, 1000000, &cfg->max_per_user, err, errlen));
    /* QUEUE_CAPACITY and TASK_HISTORY are bounded so that the task table
     * (WORKERS + QUEUE_CAPACITY + MAX_CONNS + TASK_HISTORY entries) stays small. */
    CHECK("WORKERS", svc_load_uint("WORKERS", 1, 1024, &cfg->workers, err, errlen));
    CHECK("QUEUE_CAPACITY", svc_load_uint("QUEUE_CAPACITY", 1, 65536, &cfg->queue_capacity, err, errlen));
    CHECK("MAX_CONNS", svc_load_uint("MAX_CONNS", 1, 1024, &cfg->max_conns, err, errlen));
    CHECK("TASK_HISTORY", svc_load_uint("TASK_HISTORY", 1, 65536, &cfg->task_history, err, errlen));
    CHECK("TASK_RETRIES", svc_load_uint("TASK_RETRIES", 0, TP_MAX_RETRIES, &cfg->task_retries, err, errlen));
    const uint64_t ms = SVC_NS_PER_MS, hour = 3600 * SVC_NS_PER_S, day = 24 * hour;
    CHECK("TASK_TIMEOUT", svc_load_duration("TASK_TIMEOUT", 1 * ms, day, &cfg->task_timeout_ns, err, errlen));
    CHECK("SHUTDOWN_TIMEOUT",
          svc_load_duration("SHUTDOWN_TIMEOUT", 1 * ms, day, &cfg->shutdown_timeout_ns, err, errlen));
    CHECK("HEADER_TIMEOUT",
          svc_load_duration("HEADER_TIMEOUT", 1 * ms, hour, &cfg->header_timeout_ns, err, errlen));
    CHECK("IDLE_TIMEOUT",
          svc_load_duration("IDLE_TIMEOUT", 1 * ms, hour, &cfg->idle_timeout_ns, err, errlen));
    CHECK("RETRY_DELAY", svc_load_duration("RETRY_DELAY", 1 * ms, hour, &cfg->retry_delay_ns, err, errlen));

    /* Scheduling (taskpool.h section 14). */
    CHECK("SCHED", svc_load_sched(&cfg->sched, err, errlen));
    const char *uw = svc_env("USER_WEIGHTS");
    *var = "USER_WEIGHTS";
    if (uw != NULL) {
        if (svc_parse_user_weights(uw, NULL, NULL, err, errlen) != 0) return -1;
        if (cfg->sched != TP_SCHED_FAIR) {
            snprintf(err, errlen,
                     "USER_WEIGHTS is set but SCHED is not fair: weights are shares of a fair pool");
            return -1;
        }
        cfg->user_weights = uw;
    }
    CHECK("LOW_PRIO_MAX_RUNNING",
          svc_load_low_prio_max_running(cfg->workers, &cfg->low_prio_max_running, err, errlen));
    CHECK("PRIO_STARVE_LIMIT", svc_load_prio_starve_limit(&cfg->prio_starve_limit, err, errlen));
    *var = NULL;
    return 0;
}
