/*
 * ctx.c -- the running task's context, log ids, logging (see ctx.h).
 *
 * A worker slot owns one tp_ctx and reuses it for every task it runs. Its
 * `cancelled` flag is written under the pool lock (tp_cancel, forced shutdown)
 * and read without it: relaxed is enough, since the task learns nothing else
 * through it. Timeouts need no timer: tp_ctx_err() compares the clock with the
 * effective deadline, and tp_ctx_sleep() waits on the worker's sleep_cv until
 * the earlier of its end and that deadline, woken early only by a cancel.
 *
 * The cancel descriptor is a non-blocking pipe made on first use per worker.
 * A cancel writes one byte (at most one per task, tracked by fd_dirty); the
 * worker drains it, under the lock, before its next task.
 *
 * Log ids live in thread-local storage: a thread's own id (tp_log_id_set) and
 * the task the thread is running, whose id wins unless the task set its own,
 * which is kept apart and dropped at the task's end: a worker's own id (set
 * in on_worker_start, say) is its own again between and after tasks.
 * Generated ids are written only when first asked for, so a task whose id is
 * never read costs no formatting.
 *
 * Layer: a leaf (see pool.h), called by life.c (cancel), engine.c (begin,
 * end, log ids, logging) and pool.c (log ids); calls no other src/ file but
 * clock.c. Lock: takes the pool lock itself only in tp_ctx_sleep and
 * tp_ctx_fd (called by a task, which never holds it); the _locked functions
 * run under the caller's.
 */
#include "ctx.h"
#include "users.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


_Thread_local struct tp_pool *tp__tls_pool;
_Thread_local bool tp__tls_service;
static _Thread_local tp__task *tls_task;                 /* the task running (or whose on_done runs) here */
static _Thread_local char tls_log_id[TP_LOG_ID_MAX + 1]; /* the thread's own */
static _Thread_local char tls_task_log_id[TP_LOG_ID_MAX + 1]; /* set inside a task, for its rest */
static _Thread_local bool tls_override;                       /* tls_task_log_id is set */

/* ------------------------------------------------------------ context */

int tp__ctx_init(struct tp_ctx *c, tp__mutex *mu) {
    c->mu = mu;
    c->t = NULL;
    c->deadline = TP_FOREVER;
    atomic_init(&c->cancelled, 0);
    c->fds[0] = c->fds[1] = -1;
    c->fd_dirty = false;
    return tp__cond_init(&c->sleep_cv);
}

void tp__ctx_fini(struct tp_ctx *c) {
    if (c->fds[0] >= 0) close(c->fds[0]);
    if (c->fds[1] >= 0) close(c->fds[1]);
    pthread_cond_destroy(&c->sleep_cv);
}

int tp_ctx_err(const tp_ctx *c) {
    if (!c) return TP_EINVAL;
    if (atomic_load_explicit(&c->cancelled, memory_order_relaxed)) return TP_ECANCELED;
    if (c->deadline != TP_FOREVER && tp_now_ns() >= c->deadline) return TP_ETIMEDOUT;
    return 0;
}

int tp_ctx_sleep(tp_ctx *c, uint64_t ns) {
    if (!c) return TP_EINVAL;
    int err = tp_ctx_err(c);
    if (err || ns == 0) return err;
    uint64_t until = tp__deadline_after(tp_now_ns(), ns);
    uint64_t wake = until < c->deadline ? until : c->deadline;
    tp__mutex_lock(c->mu);
    for (;;) {
        err = tp_ctx_err(c);
        if (err || tp_now_ns() >= until) break;
        tp__mutex_wait(c->mu, &c->sleep_cv, wake);
    }
    tp__mutex_unlock(c->mu);
    return err;
}

int tp_ctx_fd(tp_ctx *c) {
    if (!c) return TP_EINVAL;
    int fd;
    tp__mutex_lock(c->mu);
    if (c->fds[0] < 0) {
        int fds[2];
        if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
            c->fds[0] = fds[0];
            c->fds[1] = fds[1];
        }
    }
    fd = c->fds[0];
    if (fd >= 0 && atomic_load_explicit(&c->cancelled, memory_order_relaxed) && !c->fd_dirty) {
        /* Cancelled before the descriptor existed: make it readable now. */
        char b = 1;
        ssize_t n = write(c->fds[1], &b, 1);
        (void)n;
        c->fd_dirty = true;
    }
    tp__mutex_unlock(c->mu);
    return fd >= 0 ? fd : TP_ENOMEM;
}

void tp__ctx_cancel_locked(struct tp_ctx *c) {
    TP__ASSERT_HELD(c->mu);
    if (atomic_load_explicit(&c->cancelled, memory_order_relaxed)) return;
    atomic_store_explicit(&c->cancelled, 1, memory_order_relaxed);
    pthread_cond_signal(&c->sleep_cv);
    if (c->fds[1] >= 0 && !c->fd_dirty) {
        char b = 1;
        ssize_t n = write(c->fds[1], &b, 1);
        (void)n; /* a non-blocking pipe with room for one byte: cannot fail */
        c->fd_dirty = true;
    }
}

void tp__ctx_drain_fd_locked(struct tp_ctx *c) {
    TP__ASSERT_HELD(c->mu);
    char buf[16];
    while (read(c->fds[0], buf, sizeof buf) > 0) {
    }
    c->fd_dirty = false;
}

uint64_t tp_ctx_deadline(const tp_ctx *c) { return c ? c->deadline : TP_FOREVER; }
uint64_t tp_ctx_id(const tp_ctx *c) { return c && c->t ? c->t->id : 0; }
const char *tp_ctx_user(const tp_ctx *c) { return c && c->t && c->t->user ? c->t->user->name : NULL; }
const char *tp_ctx_log_id(const tp_ctx *c) { return c && c->t ? tp__task_log_id(c->t) : ""; }
unsigned tp_ctx_attempt(const tp_ctx *c) { return c && c->t ? c->t->attempt : 0; }

/* ------------------------------------------------------------ log ids */

static pthread_once_t tag_once = PTHREAD_ONCE_INIT;
static uint32_t process_tag;

static void make_tag(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint32_t h = 2166136261u;
    uint64_t v[3] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 8; b++) {
            h ^= (uint8_t)(v[i] >> (8 * b));
            h *= 16777619u;
        }
    process_tag = h;
}

const char *tp__task_log_id(tp__task *t) {
    if (t->log_gen) {
        pthread_once(&tag_once, make_tag);
        snprintf(t->log_id, TP__LOG_BUF, "tp-%08x-%x-%llx", process_tag, (unsigned)t->log_gen,
                 (unsigned long long)t->id);
        t->log_gen = 0;
    }
    return t->log_id;
}

int tp__log_id_source(const char *explicit_id, const char **src, size_t *len) {
    const char *s = explicit_id;
    if (!s || !s[0]) s = tp_log_id_get();
    if (!s || !s[0]) {
        *src = NULL;
        *len = 0;
        return 0;
    }
    size_t n = strnlen(s, TP_LOG_ID_MAX + 1);
    if (n > TP_LOG_ID_MAX) return -1; /* only an explicit id can be that long */
    *src = s;
    *len = n;
    return 0;
}

void tp__tls_enter_task(tp__task *t) {
    tls_task = t;
    tls_override = false;
}

void tp__tls_leave_task(void) {
    tls_task = NULL;
    tls_override = false;
}

void tp_log_id_set(const char *log_id) {
    char *to = tls_task ? tls_task_log_id : tls_log_id;
    if (log_id) {
        size_t n = strnlen(log_id, TP_LOG_ID_MAX);
        memcpy(to, log_id, n);
        to[n] = '\0';
    } else {
        to[0] = '\0';
    }
    if (tls_task) tls_override = true;
}

const char *tp_log_id_get(void) {
    if (tls_task) {
        if (!tls_override) return tp__task_log_id(tls_task);
        return tls_task_log_id[0] ? tls_task_log_id : NULL;
    }
    return tls_log_id[0] ? tls_log_id : NULL;
}

/* ------------------------------------------------------------ logging */

static const char *level_name(int level) {
    switch (level) {
    case TP_LOG_ERROR: return "error";
    case TP_LOG_WARN: return "warn";
    case TP_LOG_INFO: return "info";
    default: return "debug";
    }
}

void tp__log(tp_log_fn fn, void *arg, const char *pool_name, int level, const char *log_id, const char *fmt,
             ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!log_id) log_id = "";
    if (fn) {
        fn(arg, level, log_id, msg);
    } else if (level <= TP_LOG_WARN) {
        /* One fprintf per line: stdio locks the stream, lines do not mix. */
        fprintf(stderr, "taskpool %s: %s [%s] %s\n", pool_name, level_name(level), log_id, msg);
    }
}
