/*
 * stats.c -- the statistics snapshot and its text formats.
 *
 * tp_stats_get() reads each atomic with an acquire load (the writers store
 * with release, see internal.h) and never takes the pool lock, so it cannot
 * slow admission. The fields are one table below,
 * used by both formats, so JSON keys and Prometheus names cannot drift.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>


void tp_stats_get(tp_pool *p, tp_stats *out) {
    if (!p || !out) return;
    const tp__stats *s = &p->st;
    memset(out, 0, sizeof *out);
    out->submitted = TP__ACQUIRE(s->submitted);
    out->accepted = TP__ACQUIRE(s->accepted);
    out->rejected_full = TP__ACQUIRE(s->rejected_full);
    out->rejected_user = TP__ACQUIRE(s->rejected_user);
    out->rejected_closed = TP__ACQUIRE(s->rejected_closed);
    out->rejected_timeout = TP__ACQUIRE(s->rejected_timeout);
    out->rejected = out->rejected_full + out->rejected_user + out->rejected_closed + out->rejected_timeout;
    out->started = TP__ACQUIRE(s->started);
    out->retried = TP__ACQUIRE(s->retried);
    out->completed = TP__ACQUIRE(s->completed);
    out->succeeded = TP__ACQUIRE(s->succeeded);
    out->failed = TP__ACQUIRE(s->failed);
    out->cancelled = TP__ACQUIRE(s->cancelled);
    out->expired = TP__ACQUIRE(s->expired);
    out->active = TP__ACQUIRE(s->active);
    out->queued = TP__ACQUIRE(s->queued);
    out->delayed = TP__ACQUIRE(s->delayed);
    out->workers = TP__ACQUIRE(s->workers);
    out->idle = TP__ACQUIRE(s->idle);
    out->users = TP__ACQUIRE(s->users);
}

unsigned tp_user_active(tp_pool *p, const char *user) {
    if (!p || !user || !user[0]) return 0;
    size_t len = strnlen(user, TP_USER_MAX + 1);
    if (len > TP_USER_MAX) return 0;
    uint32_t h = tp__users_hash(user, len);
    pthread_mutex_lock(&p->mu);
    tp__user *u = tp__users_find(&p->users, user, len, h);
    unsigned n = u ? u->count : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

#define TP__FIELDS(XX)                                                               \
    XX(submitted, 1, "Submit calls that passed argument checks.")                    \
    XX(accepted, 1, "Tasks accepted.")                                               \
    XX(rejected, 1, "Submits refused, for any reason.")                              \
    XX(rejected_full, 1, "Submits refused because the queue was full.")              \
    XX(rejected_user, 1, "Submits refused because the user was at its limit.")       \
    XX(rejected_closed, 1, "Submits refused because the pool was closed.")           \
    XX(rejected_timeout, 1, "Blocking submits whose budget ran out.")                \
    XX(started, 1, "Tasks whose function was called at least once.")                 \
    XX(retried, 1, "Extra attempts started.")                                        \
    XX(completed, 1, "Accepted tasks that reached their final outcome.")             \
    XX(succeeded, 1, "Tasks completed with status 0.")                               \
    XX(failed, 1, "Tasks completed with a non-zero status, cancelled included.")     \
    XX(cancelled, 1, "Tasks failed with TP_ECANCELED or TP_ETIMEDOUT.")              \
    XX(expired, 1, "Tasks whose deadline passed before their first start.")          \
    XX(active, 0, "Tasks running now.")                                              \
    XX(queued, 0, "Tasks waiting in the queue now.")                                 \
    XX(delayed, 0, "Tasks waiting for a retry now.")                                 \
    XX(workers, 0, "Live worker threads.")                                           \
    XX(idle, 0, "Workers waiting for work.")                                         \
    XX(users, 0, "Users holding at least one slot.")

/* snprintf into a running position; keeps counting past the end of buf. */
typedef struct outbuf {
    char *buf;
    size_t len, pos;
} outbuf;

static void put(outbuf *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void put(outbuf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->pos < o->len ? o->len - o->pos : 0;
    int n = vsnprintf(room ? o->buf + o->pos : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->pos += (size_t)n;
}

int tp_stats_format(const tp_stats *s, int format, char *buf, size_t len) {
    if (!s || (!buf && len > 0)) return TP_EINVAL;
    if (format != TP_FORMAT_JSON && format != TP_FORMAT_PROMETHEUS) return TP_EINVAL;
    outbuf o = {buf, len, 0};
    if (len) buf[0] = '\0';
    if (format == TP_FORMAT_JSON) {
        const char *sep = "{";
#define TP__JSON(f, counter, help)                                                   \
    put(&o, "%s\"" #f "\":%llu", sep, (unsigned long long)s->f);                     \
    sep = ",";
        TP__FIELDS(TP__JSON)
#undef TP__JSON
        put(&o, "}");
    } else {
#define TP__PROM(f, counter, help)                                                   \
    if (counter)                                                                     \
        put(&o, "# HELP taskpool_" #f "_total " help "\n# TYPE taskpool_" #f         \
                "_total counter\ntaskpool_" #f "_total %llu\n",                      \
            (unsigned long long)s->f);                                               \
    else                                                                             \
        put(&o, "# HELP taskpool_" #f " " help "\n# TYPE taskpool_" #f               \
                " gauge\ntaskpool_" #f " %llu\n",                                    \
            (unsigned long long)s->f);
        TP__FIELDS(TP__PROM)
#undef TP__PROM
    }
    if (o.pos > (size_t)INT_MAX) return TP_ENOMEM;
    return (int)o.pos;
}
