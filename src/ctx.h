/*
 * ctx.h -- the running task's context, log ids, logging and the
 * thread-locals of pool threads (ctx.c).
 *
 * A worker slot owns one tp_ctx (engine.c embeds it) and reuses it for every
 * task it runs. ctx.c owns its fields: `cancelled` is written under the pool
 * lock (tp_cancel, forced shutdown: tp__ctx_cancel_locked) and read without
 * it by the task; `deadline` is written by the worker before the task
 * function is called and read by the task; the cancel pipe and the sleep
 * condition variable are ctx.c's, on the pool lock `mu`.
 */
#ifndef TP_CTX_H
#define TP_CTX_H

#include "base.h"
#include "task.h"

struct tp_ctx {
    tp__mutex *mu;           /* the pool lock: tp_ctx_sleep and tp_ctx_fd take it */
    tp__task *t;             /* the running task, NULL between tasks */
    uint64_t deadline;       /* effective: min(start + run timeout, task deadline) */
    atomic_int cancelled;    /* set under mu; read lock-free by the task */
    pthread_cond_t sleep_cv; /* tp_ctx_sleep waits here, on mu */
    int fds[2];              /* cancel pipe, -1 until tp_ctx_fd() first asks */
    bool fd_dirty;           /* a byte was written for the current task */
};

/* 0, or -1 when the condition variable could not be made. fini closes the
 * pipe too. */
int tp__ctx_init(struct tp_ctx *c, tp__mutex *mu);
void tp__ctx_fini(struct tp_ctx *c);

/* A task starts on this context (mu held). */
static inline void tp__ctx_begin(struct tp_ctx *c, tp__task *t) {
    c->t = t;
    c->deadline = t->deadline;
    atomic_store_explicit(&c->cancelled, 0, memory_order_relaxed);
}

/* The attempt starts `now` (CLOCK_MONOTONIC): its effective deadline is the
 * earlier of the task deadline and now + run timeout. Without mu: only this
 * worker writes its ctx, before the task function is called. */
static inline void tp__ctx_arm_run_timeout(struct tp_ctx *c, const tp__task *t, uint64_t now) {
    if (t->run_timeout == TP_FOREVER) return;
    uint64_t d = tp__deadline_after(now, t->run_timeout);
    if (d < c->deadline) c->deadline = d;
}

/* A running task's context is cancelled: the flag, the sleep, the pipe. mu
 * held. Idempotent. */
void tp__ctx_cancel_locked(struct tp_ctx *c);
/* Empty the cancel pipe so the next task starts clean (mu held). */
void tp__ctx_drain_fd_locked(struct tp_ctx *c);

/* The attempt returned (mu held): was it cancelled? The cancel pipe is
 * emptied so the next task starts clean. */
static inline bool tp__ctx_end_locked(struct tp_ctx *c) {
    bool cancelled = atomic_load_explicit(&c->cancelled, memory_order_relaxed) != 0;
    c->t = NULL;
    if (c->fd_dirty) tp__ctx_drain_fd_locked(c);
    return cancelled;
}

/* ------------------------------------------------------------ log ids, logging */

/* The task's log id; a generated one is written on first use. Called only by
 * the thread that owns `t` at that moment (its worker, or the thread running
 * its on_done), or under the pool lock. */
const char *tp__task_log_id(tp__task *t);
/* Resolve the log id a new task gets: opts' id, else this thread's current
 * one, else none (*src NULL: generate). -1 if opts' id is too long. */
int tp__log_id_source(const char *explicit_id, const char **src, size_t *len);
/* A task's function or on_done runs on this thread from now until leave. */
void tp__tls_enter_task(tp__task *t);
void tp__tls_leave_task(void);

/* One log line to `fn` (NULL: stderr for TP_LOG_WARN and worse, prefixed
 * with the pool's name). Called without any lock. */
void tp__log(tp_log_fn fn, void *arg, const char *pool_name, int level, const char *log_id, const char *fmt,
             ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* The pool whose thread this is (a worker or the service thread), NULL
 * elsewhere. Set by engine.c; read by the calls that must not wait for
 * their own thread (TP_EDEADLK). */
extern _Thread_local struct tp_pool *tp__tls_pool;
/* True on a pool's service thread. */
extern _Thread_local bool tp__tls_service;

#endif /* TP_CTX_H */
