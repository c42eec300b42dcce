/*
 * pool.c -- the public API of a pool: create/destroy, submit, cancel,
 * close/shutdown/wait.
 *
 * Layer: the public API, below only group.c (which admits members through
 * tp__submit_member and makes its condition variable with tp__cond_init). It
 * calls service.c (the service thread's entry), worker.c (spawning), life.c
 * (admission, cancel, close, forced shutdown, detaching groups) and the
 * leaves; nothing else calls into it but the application (and default.c
 * through the public API).
 *
 * Admission (tp_submit, tp_submit_wait) takes the pool lock once. Under it the
 * checks run in the contract's order -- closed, user limit, space -- and only
 * after all passed is anything reserved (tp__admit_locked in life.c), so a
 * refusal leaves nothing behind but its counter. Space means
 * queued + delayed < queue_capacity; running tasks do not count. Before the
 * lock, tp_submit asks tp__admit_full_fast whether the answer is TP_EFULL
 * whatever happens under the lock; then it refuses without taking it (a
 * producer retrying on a full queue no longer competes with the workers that
 * make room) and counts the refusal in `fast_full`. tp_submit_batch admits a
 * prefix of its tasks the same way, one after the other, in one lock pass,
 * and wakes idle workers once, after the pass.
 *
 * Why the ring holds queue_capacity + max_workers: admission keeps
 * queued + delayed < capacity at the moment a task enters, and afterwards a
 * task only moves between running, delayed and queued, so
 * active + queued + delayed <= max_workers + capacity at every moment.
 *
 * Shutdown: the first tp_shutdown() fixes `shut.deadline`; every caller waits
 * on done_cv for the same state change, and the first to wake past the
 * deadline forces (tp__force_locked). The outcome is recorded in `shut.state`
 * and every later call reports it.
 *
 * Lock order: see internal.h. This file never calls user code with mu held.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#define TP__PREALLOC_MAX 16384u /* records made at create, at most (~5 MB) */
#define TP__RECORD_SLACK 65536u /* records for ended tasks awaiting on_done, at least */

static atomic_uint tp__pool_serial = 1;

/* ------------------------------------------------------------ config */

static int resolve_config(tp_pool *p, const tp_config *cfg) {
    static const tp_config zero;
    if (!cfg) cfg = &zero;

    unsigned workers = cfg->workers;
    if (workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        workers = (unsigned)(n > (long)(TP_MAX_WORKERS / 4) ? TP_MAX_WORKERS : 4 * n);
    }
    unsigned max_workers = cfg->max_workers ? cfg->max_workers : workers;
    if (workers > TP_MAX_WORKERS || max_workers > TP_MAX_WORKERS || max_workers < workers) return TP_EINVAL;
    if (cfg->queue_capacity > TP_MAX_QUEUE_CAPACITY) return TP_EINVAL;
    if (cfg->max_retries > TP_MAX_RETRIES) return TP_EINVAL;
    if (!TP__RESERVED_ZERO(cfg)) return TP_EINVAL;
    const char *name = cfg->name ? cfg->name : "tp";
    size_t nlen = strlen(name);
    if (nlen > TP_NAME_MAX) return TP_EINVAL;

    p->cfg.min_workers = workers;
    p->cfg.max_workers = max_workers;
    p->cfg.capacity = cfg->queue_capacity ? cfg->queue_capacity : 100;
    p->cfg.max_per_user = cfg->max_per_user ? cfg->max_per_user : 2;
    p->cfg.max_retries = cfg->max_retries;
    p->cfg.run_timeout = cfg->run_timeout_ns ? cfg->run_timeout_ns : 600ull * 1000000000ull;
    p->cfg.submit_timeout = cfg->submit_timeout_ns ? cfg->submit_timeout_ns : 1000000000ull;
    p->cfg.drain_timeout = cfg->drain_timeout_ns ? cfg->drain_timeout_ns : 20ull * 1000000000ull;
    p->cfg.idle_timeout = cfg->idle_timeout_ns ? cfg->idle_timeout_ns : 300ull * 1000000000ull;
    p->cfg.retry_delay = cfg->retry_delay_ns ? cfg->retry_delay_ns : 1000000000ull;
    p->cfg.log = cfg->log;
    p->cfg.log_arg = cfg->log_arg;
    p->cfg.on_worker_start = cfg->on_worker_start;
    p->cfg.on_worker_stop = cfg->on_worker_stop;
    p->cfg.hook_arg = cfg->hook_arg;
    memcpy(p->cfg.name, name, nlen + 1);
    return TP_OK;
}

/* ------------------------------------------------------------ create/destroy */

/* Frees a pool in any state of construction: everything not yet made is zero.
 * Threads must already be gone. */
static void pool_free(tp_pool *p, int made_sync) {
    if (p->wk.workers) {
        for (unsigned i = 0; i < p->cfg.max_workers; i++) {
            tp__worker *w = &p->wk.workers[i];
            if (w->fds[0] >= 0) close(w->fds[0]);
            if (w->fds[1] >= 0) close(w->fds[1]);
            if (made_sync) pthread_cond_destroy(&w->sleep_cv);
        }
        free(p->wk.workers);
    }
    tp__hist_free(p->wk.hist);
    tp__life_fini(p);
    if (made_sync) {
        pthread_cond_destroy(&p->svc_cv);
        pthread_cond_destroy(&p->done_cv);
        pthread_cond_destroy(&p->room_cv);
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p);
}

/* Join every worker thread that was started, and the service thread. Used by
 * tp_destroy() and by a tp_create() that failed half-way. */
static void join_all(tp_pool *p) {
    for (unsigned i = 0; i < p->cfg.max_workers; i++) {
        tp__worker *w = &p->wk.workers[i];
        if (w->state == TP__W_LIVE || w->state == TP__W_DEAD) {
            pthread_join(w->thread, NULL);
            w->state = TP__W_FREE;
        }
    }
    if (p->svc.started) {
        pthread_join(p->svc.thread, NULL);
        p->svc.started = false;
    }
}

static int make_sync(tp_pool *p) {
    if (tp__mutex_init(&p->mu) != 0) return -1;
    int n = 0;
    n += tp__cond_init(&p->work_cv) == 0;
    if (n == 1) n += tp__cond_init(&p->room_cv) == 0;
    if (n == 2) n += tp__cond_init(&p->done_cv) == 0;
    if (n == 3) n += tp__cond_init(&p->svc_cv) == 0;
    unsigned i = 0;
    if (n == 4)
        for (; i < p->cfg.max_workers; i++)
            if (tp__cond_init(&p->wk.workers[i].sleep_cv) != 0) break;
    if (n == 4 && i == p->cfg.max_workers) return 0;
    while (i-- > 0) pthread_cond_destroy(&p->wk.workers[i].sleep_cv);
    pthread_cond_t *cvs[4] = {&p->work_cv, &p->room_cv, &p->done_cv, &p->svc_cv};
    while (n-- > 0) pthread_cond_destroy(cvs[n]);
    pthread_mutex_destroy(&p->mu);
    return -1;
}

/* Records: a full pool holds `full` tasks. Tasks that ended without running
 * (cancelled, dropped, expired) and have an on_done keep theirs until the
 * service thread has run it. Four pools' worth is preallocated (up to a
 * size), which covers a service thread lagging behind ordinary cancellations,
 * so steady state allocates nothing; a cancel storm that outruns the service
 * thread grows records in chunks (kept for reuse). A hard cap far above that
 * keeps memory bounded if the service thread is stuck (an on_done that
 * blocks): admission then refuses (TP_EFULL; tp_submit_wait waits) rather
 * than grow without end. */
static int make_structures(tp_pool *p) {
    unsigned full = p->cfg.capacity + p->cfg.max_workers;
    unsigned slack = 3 * full > TP__RECORD_SLACK ? 3 * full : TP__RECORD_SLACK;
    p->cfg.max_records = full + slack;
    unsigned prealloc = 4 * full + 64 < TP__PREALLOC_MAX ? 4 * full + 64 : TP__PREALLOC_MAX;
    p->wk.workers = (tp__worker *)calloc(p->cfg.max_workers, sizeof *p->wk.workers);
    if (p->wk.workers)
        for (unsigned i = 0; i < p->cfg.max_workers; i++) {
            p->wk.workers[i].pool = p;
            p->wk.workers[i].index = i;
            p->wk.workers[i].fds[0] = p->wk.workers[i].fds[1] = -1;
            p->wk.workers[i].ctx.w = &p->wk.workers[i];
        }
    p->wk.hist = tp__hist_alloc(p->cfg.max_workers); /* the latency histograms: one shard per slot */
    if (!p->wk.workers || !p->wk.hist || tp__life_init(p, full, prealloc) != 0) return TP_ENOMEM;
    return TP_OK;
}

/* The service thread, then min_workers workers. Each spawn is reserved under
 * the lock like an elastic one. */
static int start_threads(tp_pool *p) {
    int rc = TP_OK;
    tp__lock(p);
    p->svc.started = pthread_create(&p->svc.thread, NULL, tp__service_main, p) == 0;
    if (!p->svc.started) rc = TP_ENOMEM;
    tp__unlock(p);
    for (unsigned i = 0; rc == TP_OK && i < p->cfg.min_workers; i++) {
        tp__worker *w;
        pthread_t old;
        bool join_old;
        tp__lock(p);
        tp__spawn_start_locked(p, &w, &old, &join_old);
        tp__unlock(p);
        rc = tp__spawn_finish(p, w, old, join_old);
    }
    return rc;
}

/* A failed start unwinds through the normal close path so that the threads
 * already started exit; then the pool is freed. */
static void unwind_start(tp_pool *p) {
    tp__lock(p);
    tp__close_locked(p);
    /* then no thread writes w->state */
    while (p->wk.threads > 0) tp__wait_locked(p, &p->done_cv, TP_FOREVER);
    tp__unlock(p);
    join_all(p);
    pool_free(p, 1);
}

int tp_create(tp_pool **out, const tp_config *cfg) {
    if (!out) return TP_EINVAL;
    tp__hclk_init(); /* the histograms' clock, once per process (clock.h) */
    tp_pool *p = (tp_pool *)calloc(1, sizeof *p);
    if (!p) return TP_ENOMEM;
    int rc = resolve_config(p, cfg);
    if (rc != TP_OK) {
        free(p);
        return rc;
    }
    do /* never 0: 0 marks a log id already written */
        p->cfg.serial = atomic_fetch_add_explicit(&tp__pool_serial, 1, memory_order_relaxed);
    while (p->cfg.serial == 0);
    p->shut.deadline = TP_FOREVER;
    if (make_structures(p) != TP_OK || make_sync(p) != 0) {
        pool_free(p, 0);
        return TP_ENOMEM;
    }
    if (start_threads(p) != TP_OK) {
        unwind_start(p);
        return TP_ENOMEM;
    }
    *out = p;
    return TP_OK;
}

/* ------------------------------------------------------------ admission */

/* The checks of a task's arguments that need no pool: fn, the options'
 * values and lengths (of the user, the explicit log id). tp_group_submit on a
 * detached group answers TP_EINVAL from these before anything else. */
int tp__task_args_check(tp_fn fn, const tp_task_opts *opts) {
    if (!fn) return TP_EINVAL;
    if (!opts) return TP_OK;
    if (opts->priority != 0 || !TP__RESERVED_ZERO(opts)) return TP_EINVAL;
    if (opts->user && strnlen(opts->user, TP_USER_MAX + 1) > TP_USER_MAX) return TP_EINVAL;
    if (opts->log_id && strnlen(opts->log_id, TP_LOG_ID_MAX + 1) > TP_LOG_ID_MAX) return TP_EINVAL;
    return TP_OK;
}

static int check_args(tp_pool *p, tp_fn fn, const tp_task_opts *opts, tp__admit_args *a) {
    if (!p || !fn) return TP_EINVAL;
    memset(a, 0, sizeof *a);
    a->fn = fn;
    a->run_timeout = p->cfg.run_timeout;
    a->deadline = TP_FOREVER;
    const char *explicit_log = NULL;
    if (opts) {
        if (opts->priority != 0 || !TP__RESERVED_ZERO(opts)) return TP_EINVAL;
        if (opts->user && opts->user[0]) {
            a->user_len = strnlen(opts->user, TP_USER_MAX + 1);
            if (a->user_len > TP_USER_MAX) return TP_EINVAL;
            a->user = opts->user;
            a->user_hash = tp__users_hash(a->user, a->user_len);
        }
        if (opts->run_timeout_ns) a->run_timeout = opts->run_timeout_ns;
        if (opts->deadline_ns) a->deadline = opts->deadline_ns;
        a->on_done = opts->on_done;
        explicit_log = opts->log_id;
    }
    if (tp__log_id_source(explicit_log, &a->log_src, &a->log_len) != 0) return TP_EINVAL;
    return TP_OK;
}

static void count_reject_locked(tp_pool *p, int rc) {
    switch (rc) {
    case TP_ECLOSED: TP__INC(p->st.rejected_closed); break;
    case TP_EUSERLIMIT: TP__INC(p->st.rejected_user); break;
    case TP_ETIMEDOUT: TP__INC(p->st.rejected_timeout); break;
    default: TP__INC(p->st.rejected_full); break; /* TP_EFULL, TP_ENOMEM */
    }
}

static int submit_common(tp_pool *p, tp__admit_args *a, void *arg, uint64_t *id_out, bool wait,
                         uint64_t deadline) {
    tp__worker *w = NULL;
    pthread_t old;
    bool join_old = false;

    /* The admission stamp of the queue-wait histogram (clock.h): taken
     * before the lock, not under it. A waiting submit takes it under the
     * lock each turn, after its budget check (which covers the lock
     * acquisition). */
    a->now = wait ? 0 : tp__hclk_now();
    tp__lock(p);
    if (a->group && a->group->cancelled) { /* a cancelled group: counts nothing */
        tp__unlock(p);
        return TP_ECANCELED;
    }
    TP__INC(p->st.submitted);
    int rc;
    for (;;) {
        if (p->life.closed) {
            rc = TP_ECLOSED;
            break;
        }
        if (wait) {
            if (tp_now_ns() >= deadline) {
                rc = TP_ETIMEDOUT;
                break;
            }
            a->now = tp__hclk_now();
        }
        rc = tp__admit_locked(p, a, arg, id_out, true);
        if (!wait || (rc != TP_EFULL && rc != TP_EUSERLIMIT)) break;
        if (tp__tls_service && tp__tls_pool == p) {
            /* An on_done on this pool's service thread: waiting would stall
             * the retry timers and endings that may be what frees room. */
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__wait_room_locked(p, deadline); /* the loop re-checks closed and the budget */
    }
    if (rc == TP_OK) {
        if (tp__want_spawn_locked(p)) tp__spawn_start_locked(p, &w, &old, &join_old);
    } else {
        count_reject_locked(p, rc);
    }
    tp__unlock(p);
    if (w) (void)tp__spawn_finish(p, w, old, join_old); /* a failure leaves the task queued for the others */
    return rc;
}

/* A full queue refused without the lock (see the top of this file). */
static bool refuse_full_fast(tp_pool *p, const tp__admit_args *a) {
    if (!tp__admit_full_fast(p, a->user != NULL)) return false;
    /* release, like every counter update (SPEC section 7) */
    atomic_fetch_add_explicit(&p->fast_full, 1, memory_order_release);
    return true;
}

int tp__submit_member(tp_pool *p, struct tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts,
                      uint64_t *id_out) {
    tp__admit_args a;
    int rc = check_args(p, fn, opts, &a);
    if (rc != TP_OK) return rc;
    a.group = g;
    /* A group's submit takes the lock: a cancelled group answers
     * TP_ECANCELED before anything else, and counts nothing. */
    if (!g && refuse_full_fast(p, &a)) return TP_EFULL;
    return submit_common(p, &a, arg, id_out, false, TP_FOREVER);
}

int tp_submit(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    return tp__submit_member(p, NULL, fn, arg, opts, id_out);
}

/* Tasks of a batch whose checked arguments stay on the stack; the arguments
 * of later ones are checked again under the lock (same inputs, same result). */
#define TP__BATCH_ARGS 32

int tp_submit_batch(tp_pool *p, const tp_task *tasks, size_t n, uint64_t *ids_out, size_t *accepted_out) {
    if (accepted_out) *accepted_out = 0;
    if (!p || (n > 0 && !tasks)) return TP_EINVAL;
    if (n == 0) return TP_OK;

    /* Arguments first, without the lock: tasks[0..valid) pass. The first one
     * that does not is refused with its TP_EINVAL only if every task before it
     * is admitted, and, like tp_submit's TP_EINVAL, counts nowhere. */
    tp__admit_args a[TP__BATCH_ARGS];
    size_t valid = 0;
    int arg_rc = TP_OK;
    for (; valid < n; valid++) {
        tp__admit_args spare;
        arg_rc = !TP__RESERVED_ZERO(&tasks[valid]) ? TP_EINVAL
                                                   : check_args(p, tasks[valid].fn, tasks[valid].opts,
                                                                valid < TP__BATCH_ARGS ? &a[valid] : &spare);
        if (arg_rc != TP_OK) break;
    }
    if (valid == 0) return arg_rc;
    if (refuse_full_fast(p, &a[0])) return TP_EFULL;

    /* The queue wait of every task starts now: one stamp on the histograms'
     * clock (clock.h), before the lock, for the whole batch (as tp_submit
     * takes one for its task). */
    uint64_t now = tp__hclk_now();
    for (size_t i = 0; i < valid && i < TP__BATCH_ARGS; i++) a[i].now = now;

    /* One lock pass: the accepted prefix is adjacent in the ring (FIFO). */
    tp__worker *w = NULL;
    pthread_t old;
    bool join_old = false;
    size_t k = 0;
    int rc = TP_OK;
    tp__lock(p);
    for (; k < valid; k++) {
        tp__admit_args spare;
        const tp__admit_args *ak = &spare;
        if (k < TP__BATCH_ARGS)
            ak = &a[k];
        else {
            (void)check_args(p, tasks[k].fn, tasks[k].opts, &spare); /* passed above */
            spare.now = now;
        }
        TP__INC(p->st.submitted);
        rc = p->life.closed ? TP_ECLOSED
                            : tp__admit_locked(p, ak, tasks[k].arg, ids_out ? &ids_out[k] : NULL, false);
        if (rc != TP_OK) {
            count_reject_locked(p, rc);
            break;
        }
    }
    if (k > 0) {
        tp__work_signal_locked(p, k);
        if (tp__want_spawn_locked(p)) tp__spawn_start_locked(p, &w, &old, &join_old);
        tp__want_more_workers_locked(p); /* k tasks may want up to k new workers */
    }
    tp__unlock(p);
    if (w) (void)tp__spawn_finish(p, w, old, join_old); /* a failure leaves the tasks queued for the others */
    if (accepted_out) *accepted_out = k;
    if (rc != TP_OK) return rc;
    return k < n ? arg_rc : TP_OK;
}

int tp_submit_wait(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t budget_ns,
                   uint64_t *id_out) {
    tp__admit_args a;
    int rc = check_args(p, fn, opts, &a);
    if (rc != TP_OK) return rc;
    uint64_t deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->cfg.submit_timeout);
    return submit_common(p, &a, arg, id_out, true, deadline);
}

/* ------------------------------------------------------------ cancel */

int tp_cancel(tp_pool *p, uint64_t id) {
    if (!p || id == 0) return TP_EINVAL;
    int rc = TP_OK;
    tp__lock(p);
    rc = tp__cancel_locked(p, id);
    tp__unlock(p);
    return rc;
}

/* ------------------------------------------------------------ lifecycle */

int tp_close(tp_pool *p) {
    if (!p) return TP_EINVAL;
    tp__lock(p);
    tp__close_locked(p);
    tp__unlock(p);
    return TP_OK;
}

int tp_shutdown(tp_pool *p, uint64_t budget_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    tp__lock(p);
    tp__close_locked(p);
    if (p->shut.state == TP__SHUT_NONE) {
        p->shut.state = TP__SHUT_RUNNING;
        p->shut.deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->cfg.drain_timeout);
    }
    while (p->shut.state == TP__SHUT_RUNNING) {
        if (p->life.inflight == 0) {
            p->shut.state = TP__SHUT_OK;
        } else if (p->shut.deadline != TP_FOREVER && tp_now_ns() >= p->shut.deadline) {
            p->shut.state = TP__SHUT_FORCED;
            tp__force_locked(p);
        } else {
            tp__wait_locked(p, &p->done_cv, p->shut.deadline);
            continue;
        }
        pthread_cond_broadcast(&p->done_cv); /* the other shutdown callers */
    }
    int rc = p->shut.state == TP__SHUT_OK ? TP_OK : TP_ETIMEDOUT;
    tp__unlock(p);
    return rc;
}

/* mu held. Everything accepted has ended and every worker thread is gone. */
static bool finished_locked(const tp_pool *p) {
    return p->life.closed && p->life.inflight == 0 && p->wk.threads == 0;
}

int tp_wait(tp_pool *p, uint64_t timeout_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    uint64_t deadline = timeout_ns == 0 ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__lock(p);
    while (!finished_locked(p)) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__wait_locked(p, &p->done_cv, deadline);
    }
    if (rc == TP_OK && p->shut.state == TP__SHUT_FORCED) rc = TP_ETIMEDOUT;
    tp__unlock(p);
    return rc;
}

int tp_destroy(tp_pool *p) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    tp__lock(p);
    bool started = p->shut.state != TP__SHUT_NONE;
    tp__unlock(p);
    if (!started) (void)tp_shutdown(p, 0);
    (void)tp_wait(p, TP_FOREVER);
    join_all(p);
    tp__groups_detach(p); /* groups that outlive their pool (taskpool.h) */
    pool_free(p, 1);
    return TP_OK;
}

/* ------------------------------------------------------------ time */

/* The pool mutex spins briefly before it sleeps (glibc's adaptive mutex):
 * its critical sections are a few dozen instructions, and a futex sleep and
 * wake costs far more than waiting them out. */
int tp__mutex_init(pthread_mutex_t *mu) {
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0) return -1;
    int rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    if (rc == 0) rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    return rc == 0 ? 0 : -1;
#else
    return pthread_mutex_init(mu, NULL) == 0 ? 0 : -1;
#endif
}

int tp__cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc == 0 ? 0 : -1;
}
