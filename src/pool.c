/*
 * pool.c -- create/destroy, admission, cancel, close/shutdown/wait.
 *
 * Admission (tp_submit, tp_submit_wait) takes the pool lock once. Under it the
 * checks run in the contract's order -- closed, user limit, space -- and only
 * after all passed is anything reserved (a record, a user slot, an id), so a
 * refusal leaves nothing behind but its counter. Space means
 * queued + delayed < queue_capacity; running tasks do not count.
 *
 * Why the ring holds queue_capacity + max_workers: admission keeps
 * queued + delayed < capacity at the moment a task enters, and afterwards a
 * task only moves between running, delayed and queued, so
 * active + queued + delayed <= max_workers + capacity at every moment.
 *
 * Shutdown: the first tp_shutdown() fixes `shut_deadline`; every caller waits
 * on done_cv for the same state change, and the first to wake past the
 * deadline forces (tp__force_locked). The outcome is recorded in `shut_state`
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


#define TP__PREALLOC_MAX 16384u /* records made at create, at most (~4 MB) */
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
    if (workers > TP_MAX_WORKERS || max_workers > TP_MAX_WORKERS || max_workers < workers)
        return TP_EINVAL;
    if (cfg->queue_capacity > TP_MAX_QUEUE_CAPACITY) return TP_EINVAL;
    if (cfg->max_retries > TP_MAX_RETRIES) return TP_EINVAL;
    if (!TP__RESERVED_ZERO(cfg)) return TP_EINVAL;
    const char *name = cfg->name ? cfg->name : "tp";
    size_t nlen = strlen(name);
    if (nlen > TP_NAME_MAX) return TP_EINVAL;

    p->min_workers = workers;
    p->max_workers = max_workers;
    p->capacity = cfg->queue_capacity ? cfg->queue_capacity : 100;
    p->max_per_user = cfg->max_per_user ? cfg->max_per_user : 2;
    p->max_retries = cfg->max_retries;
    p->run_timeout = cfg->run_timeout_ns ? cfg->run_timeout_ns : 600ull * 1000000000ull;
    p->submit_timeout = cfg->submit_timeout_ns ? cfg->submit_timeout_ns : 1000000000ull;
    p->drain_timeout = cfg->drain_timeout_ns ? cfg->drain_timeout_ns : 20ull * 1000000000ull;
    p->idle_timeout = cfg->idle_timeout_ns ? cfg->idle_timeout_ns : 300ull * 1000000000ull;
    p->retry_delay = cfg->retry_delay_ns ? cfg->retry_delay_ns : 1000000000ull;
    p->log = cfg->log;
    p->log_arg = cfg->log_arg;
    p->on_worker_start = cfg->on_worker_start;
    p->on_worker_stop = cfg->on_worker_stop;
    p->hook_arg = cfg->hook_arg;
    memcpy(p->name, name, nlen + 1);
    return TP_OK;
}

/* ------------------------------------------------------------ create/destroy */

/* Frees a pool in any state of construction: everything not yet made is zero.
 * Threads must already be gone. */
static void pool_free(tp_pool *p, int made_sync) {
    if (p->workers) {
        for (unsigned i = 0; i < p->max_workers; i++) {
            tp__worker *w = &p->workers[i];
            if (w->fds[0] >= 0) close(w->fds[0]);
            if (w->fds[1] >= 0) close(w->fds[1]);
            if (made_sync) pthread_cond_destroy(&w->sleep_cv);
        }
        free(p->workers);
    }
    tp__users_fini(&p->users);
    tp__tasks_fini(&p->tasks);
    tp__ring_fini(&p->ring);
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
    for (unsigned i = 0; i < p->max_workers; i++) {
        tp__worker *w = &p->workers[i];
        if (w->state == TP__W_LIVE || w->state == TP__W_DEAD) {
            pthread_join(w->thread, NULL);
            w->state = TP__W_FREE;
        }
    }
    if (p->svc_started) {
        pthread_join(p->svc_thread, NULL);
        p->svc_started = false;
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
        for (; i < p->max_workers; i++)
            if (tp__cond_init(&p->workers[i].sleep_cv) != 0) break;
    if (n == 4 && i == p->max_workers) return 0;
    while (i-- > 0) pthread_cond_destroy(&p->workers[i].sleep_cv);
    pthread_cond_t *cvs[4] = {&p->work_cv, &p->room_cv, &p->done_cv, &p->svc_cv};
    while (n-- > 0) pthread_cond_destroy(cvs[n]);
    pthread_mutex_destroy(&p->mu);
    return -1;
}

int tp_create(tp_pool **out, const tp_config *cfg) {
    if (!out) return TP_EINVAL;
    tp_pool *p = (tp_pool *)calloc(1, sizeof *p);
    if (!p) return TP_ENOMEM;
    int rc = resolve_config(p, cfg);
    if (rc != TP_OK) {
        free(p);
        return rc;
    }
    do /* never 0: 0 marks a log id already written */
        p->serial = atomic_fetch_add_explicit(&tp__pool_serial, 1, memory_order_relaxed);
    while (p->serial == 0);
    p->shut_deadline = TP_FOREVER;
    p->queued_deadline_min = TP_FOREVER;

    /* Records: a full pool holds `full` tasks. Tasks that ended without
     * running (cancelled, dropped, expired) and have an on_done keep theirs
     * until the service thread has run it. Four pools' worth is preallocated
     * (up to a size), which covers a service thread lagging behind ordinary
     * cancellations, so steady state allocates nothing; a cancel storm that
     * outruns the service thread grows records in chunks (kept for reuse). A
     * hard cap far above that keeps memory bounded if the service thread is
     * stuck (an on_done that blocks): admission then refuses (TP_EFULL;
     * tp_submit_wait waits) rather than grow without end. */
    unsigned full = p->capacity + p->max_workers;
    unsigned slack = 3 * full > TP__RECORD_SLACK ? 3 * full : TP__RECORD_SLACK;
    p->max_records = full + slack;
    unsigned prealloc = 4 * full + 64 < TP__PREALLOC_MAX ? 4 * full + 64 : TP__PREALLOC_MAX;
    p->workers = (tp__worker *)calloc(p->max_workers, sizeof *p->workers);
    if (p->workers)
        for (unsigned i = 0; i < p->max_workers; i++) {
            p->workers[i].pool = p;
            p->workers[i].index = i;
            p->workers[i].fds[0] = p->workers[i].fds[1] = -1;
            p->workers[i].ctx.w = &p->workers[i];
        }
    if (!p->workers || tp__ring_init(&p->ring, full) != 0 || tp__tasks_init(&p->tasks, prealloc) != 0 ||
        tp__users_init(&p->users, 32) != 0) {
        pool_free(p, 0);
        return TP_ENOMEM;
    }
    if (make_sync(p) != 0) {
        pool_free(p, 0);
        return TP_ENOMEM;
    }

    /* Threads. Each spawn is reserved under the lock like an elastic one; a
     * failure unwinds through the normal close path so started threads exit. */
    rc = TP_OK;
    pthread_mutex_lock(&p->mu);
    p->svc_started = pthread_create(&p->svc_thread, NULL, tp__service_main, p) == 0;
    if (!p->svc_started) rc = TP_ENOMEM;
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; rc == TP_OK && i < p->min_workers; i++) {
        tp__worker *w;
        pthread_t old;
        bool join_old;
        pthread_mutex_lock(&p->mu);
        tp__spawn_start(p, &w, &old, &join_old);
        pthread_mutex_unlock(&p->mu);
        rc = tp__spawn_finish(p, w, old, join_old);
    }
    if (rc != TP_OK) {
        pthread_mutex_lock(&p->mu);
        tp__close_locked(p);
        while (p->threads > 0) pthread_cond_wait(&p->done_cv, &p->mu); /* then no thread writes w->state */
        pthread_mutex_unlock(&p->mu);
        join_all(p);
        pool_free(p, 1);
        return TP_ENOMEM;
    }
    *out = p;
    return TP_OK;
}

/* ------------------------------------------------------------ helpers under mu */

/* Room for a tp_submit_wait caller may have appeared. Broadcast, not signal:
 * waiters wait for different things (space, their user's slot), so one wake
 * could go to a caller that still cannot proceed while another could. */
void tp__signal_room(tp_pool *p) {
    if (p->room_waiters) pthread_cond_broadcast(&p->room_cv);
}

void tp__close_locked(tp_pool *p) {
    if (p->closed) return;
    p->closed = true;
    pthread_cond_broadcast(&p->room_cv);
    pthread_cond_broadcast(&p->work_cv);
    tp__svc_wake(p);
    tp__drained_check(p);
}

/* Wake whoever waits for the end: shutdown/wait callers and the service
 * thread, once the pool is closed and nothing is in flight. */
void tp__drained_check(tp_pool *p) {
    if (p->closed && p->inflight == 0) {
        pthread_cond_broadcast(&p->done_cv);
        tp__svc_wake(p);
        tp__wake_exiters(p);
    }
}

/* Forced shutdown: cancel running tasks, end queued and delayed ones unrun. */
static void force_locked(tp_pool *p) {
    p->forced = true;
    for (unsigned i = 0; i < p->max_workers; i++)
        if (p->workers[i].cur) tp__ctx_cancel_locked(&p->workers[i]);
    while (tp__ring_len(&p->ring) > 0) {
        tp__task *t = tp__ring_pop(&p->ring);
        TP__SET(p->st.queued, tp__ring_len(&p->ring));
        tp__task_end_unrun(p, t, TP_ECANCELED, false);
    }
    while (p->delayed_head) {
        tp__task *t = p->delayed_head;
        tp__delayed_remove(p, t);
        tp__task_end_unrun(p, t, TP_ECANCELED, false);
    }
    tp__wake_exiters(p);
    tp__signal_room(p);
}

/* ------------------------------------------------------------ admission */

typedef struct admit_args {
    tp_fn fn;
    void *arg;
    tp_done_fn on_done;
    uint64_t run_timeout, deadline;
    const char *user;
    size_t user_len;
    uint32_t user_hash;
    const char *log_src; /* NULL: generate */
    size_t log_len;
} admit_args;

static int check_args(tp_pool *p, tp_fn fn, const tp_task_opts *opts, admit_args *a) {
    if (!p || !fn) return TP_EINVAL;
    memset(a, 0, sizeof *a);
    a->fn = fn;
    a->run_timeout = p->run_timeout;
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

/* The admission checks after "closed"; on TP_OK the task is queued. mu held. */
static int admit_locked(tp_pool *p, const admit_args *a, void *arg, uint64_t *id_out) {
    if (a->user && p->max_per_user != TP_UNLIMITED) {
        tp__user *u = tp__users_find(&p->users, a->user, a->user_len, a->user_hash);
        if (u && u->count >= p->max_per_user) return TP_EUSERLIMIT;
    }
    if (tp__ring_len(&p->ring) + p->delayed >= p->capacity) return TP_EFULL;

    /* Reserve. Refused with nothing reserved when the records are at their
     * cap (TP_EFULL) or cannot grow (TP_ENOMEM); see tp_create(). */
    tp__task *t = NULL;
    int rc = tp__tasks_get(&p->tasks, p->max_records, &t);
    if (rc != TP_OK) return rc;
    tp__user *u = NULL;
    if (a->user) {
        u = tp__users_acquire(&p->users, a->user, a->user_len, a->user_hash);
        if (!u) {
            tp__tasks_put(&p->tasks, t);
            return TP_ENOMEM;
        }
        TP__SET(p->st.users, p->users.live);
    }
    t->id = ++p->next_id;
    t->fn = a->fn;
    t->arg = arg;
    t->on_done = a->on_done;
    t->run_timeout = a->run_timeout;
    t->deadline = a->deadline;
    t->user = u;
    t->worker = NULL;
    t->attempt = 0;
    t->status = 0;
    t->state = TP__QUEUED;
    if (a->log_src) {
        memcpy(t->log_id, a->log_src, a->log_len);
        t->log_id[a->log_len] = '\0';
        t->log_gen = 0;
    } else {
        t->log_id[0] = '\0';
        t->log_gen = p->serial; /* non-zero: generate from pool serial + id */
    }
    tp__tasks_index(&p->tasks, t);
    tp__ring_push(&p->ring, t);
    if (t->deadline != TP_FOREVER) {
        /* The service thread ends it at its deadline if no worker picked it
         * by then; wake it if this deadline comes before its own wake-up. */
        p->with_deadline++;
        if (t->deadline < p->queued_deadline_min) p->queued_deadline_min = t->deadline;
        if (t->deadline < p->svc_next) tp__svc_wake(p);
    }
    p->inflight++;
    TP__INC(p->st.accepted);
    TP__SET(p->st.queued, tp__ring_len(&p->ring));
    /* A spinning worker takes this task without a wake-up; it wakes a
     * sleeper itself if more work is left (worker.c). */
    if (p->idle_waiters && !p->spinners) pthread_cond_signal(&p->work_cv);
    if (id_out) *id_out = t->id;
    return TP_OK;
}

/* After work entered the ring, with mu held: should a worker be added?
 * Only while the backlog exceeds the idle workers plus those still starting
 * (not yet waiting, but about to take work), and the pool is below its
 * maximum; a fixed pool never spawns here. */
bool tp__want_spawn(const tp_pool *p) {
    return p->live_workers < p->max_workers && tp__ring_len(&p->ring) > p->idle_waiters + p->spinners + p->starting;
}

static void count_reject(tp_pool *p, int rc) {
    switch (rc) {
    case TP_ECLOSED: TP__INC(p->st.rejected_closed); break;
    case TP_EUSERLIMIT: TP__INC(p->st.rejected_user); break;
    case TP_ETIMEDOUT: TP__INC(p->st.rejected_timeout); break;
    default: TP__INC(p->st.rejected_full); break; /* TP_EFULL, TP_ENOMEM */
    }
}

static int submit_common(tp_pool *p, const admit_args *a, void *arg, uint64_t *id_out, bool wait,
                         uint64_t deadline) {
    tp__worker *w = NULL;
    pthread_t old;
    bool join_old = false;

    pthread_mutex_lock(&p->mu);
    TP__INC(p->st.submitted);
    int rc;
    for (;;) {
        if (p->closed) {
            rc = TP_ECLOSED;
            break;
        }
        if (wait && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        rc = admit_locked(p, a, arg, id_out);
        if (!wait || (rc != TP_EFULL && rc != TP_EUSERLIMIT)) break;
        if (tp__tls_service && tp__tls_pool == p) {
            /* An on_done on this pool's service thread: waiting would stall
             * the retry timers and endings that may be what frees room. */
            rc = TP_ETIMEDOUT;
            break;
        }
        p->room_waiters++;
        int e = tp__cond_wait_until(&p->room_cv, &p->mu, deadline);
        p->room_waiters--;
        TP__UNUSED(e); /* the loop re-checks closed and the budget */
    }
    if (rc == TP_OK) {
        if (tp__want_spawn(p)) tp__spawn_start(p, &w, &old, &join_old);
    } else {
        count_reject(p, rc);
    }
    pthread_mutex_unlock(&p->mu);
    if (w) (void)tp__spawn_finish(p, w, old, join_old); /* a failure leaves the task queued for the others */
    return rc;
}

int tp_submit(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    admit_args a;
    int rc = check_args(p, fn, opts, &a);
    if (rc != TP_OK) return rc;
    return submit_common(p, &a, arg, id_out, false, TP_FOREVER);
}

int tp_submit_wait(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t budget_ns,
                   uint64_t *id_out) {
    admit_args a;
    int rc = check_args(p, fn, opts, &a);
    if (rc != TP_OK) return rc;
    uint64_t deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->submit_timeout);
    return submit_common(p, &a, arg, id_out, true, deadline);
}

/* ------------------------------------------------------------ cancel */

int tp_cancel(tp_pool *p, uint64_t id) {
    if (!p || id == 0) return TP_EINVAL;
    int rc = TP_OK;
    pthread_mutex_lock(&p->mu);
    tp__task *t = tp__tasks_find(&p->tasks, id);
    if (!t) {
        rc = TP_ENOTFOUND;
    } else if (t->state == TP__QUEUED) {
        tp__ring_remove(&p->ring, t);
        TP__SET(p->st.queued, tp__ring_len(&p->ring));
        tp__task_end_unrun(p, t, TP_ECANCELED, false);
        tp__wake_exiters(p);
        tp__signal_room(p);
    } else if (t->state == TP__DELAYED) {
        tp__delayed_remove(p, t);
        tp__task_end_unrun(p, t, TP_ECANCELED, false);
        tp__wake_exiters(p);
        tp__signal_room(p);
    } else if (t->state == TP__RUNNING) {
        tp__ctx_cancel_locked(t->worker);
    } else {
        rc = TP_ENOTFOUND; /* not reachable: finalised tasks leave the index */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ------------------------------------------------------------ lifecycle */

int tp_close(tp_pool *p) {
    if (!p) return TP_EINVAL;
    pthread_mutex_lock(&p->mu);
    tp__close_locked(p);
    pthread_mutex_unlock(&p->mu);
    return TP_OK;
}

int tp_shutdown(tp_pool *p, uint64_t budget_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    pthread_mutex_lock(&p->mu);
    tp__close_locked(p);
    if (p->shut_state == TP__SHUT_NONE) {
        p->shut_state = TP__SHUT_RUNNING;
        p->shut_deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->drain_timeout);
    }
    while (p->shut_state == TP__SHUT_RUNNING) {
        if (p->inflight == 0) {
            p->shut_state = TP__SHUT_OK;
        } else if (p->shut_deadline != TP_FOREVER && tp_now_ns() >= p->shut_deadline) {
            p->shut_state = TP__SHUT_FORCED;
            force_locked(p);
        } else {
            tp__cond_wait_until(&p->done_cv, &p->mu, p->shut_deadline);
            continue;
        }
        pthread_cond_broadcast(&p->done_cv); /* the other shutdown callers */
    }
    int rc = p->shut_state == TP__SHUT_OK ? TP_OK : TP_ETIMEDOUT;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* mu held. Everything accepted has ended and every worker thread is gone. */
static bool finished(const tp_pool *p) {
    return p->closed && p->inflight == 0 && p->threads == 0;
}

int tp_wait(tp_pool *p, uint64_t timeout_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    uint64_t deadline = timeout_ns == 0 ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    pthread_mutex_lock(&p->mu);
    while (!finished(p)) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__cond_wait_until(&p->done_cv, &p->mu, deadline);
    }
    if (rc == TP_OK && p->shut_state == TP__SHUT_FORCED) rc = TP_ETIMEDOUT;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int tp_destroy(tp_pool *p) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    pthread_mutex_lock(&p->mu);
    bool started = p->shut_state != TP__SHUT_NONE;
    pthread_mutex_unlock(&p->mu);
    if (!started) (void)tp_shutdown(p, 0);
    (void)tp_wait(p, TP_FOREVER);
    join_all(p);
    pool_free(p, 1);
    return TP_OK;
}

/* ------------------------------------------------------------ time */

uint64_t tp__deadline_after(uint64_t now, uint64_t ns) {
    if (ns == TP_FOREVER || ns >= TP_FOREVER - now) return TP_FOREVER;
    return now + ns;
}

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

int tp__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline) {
    if (deadline == TP_FOREVER) return pthread_cond_wait(cv, mu);
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline / 1000000000ull);
    ts.tv_nsec = (long)(deadline % 1000000000ull);
    return pthread_cond_timedwait(cv, mu, &ts);
}
