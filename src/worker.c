/*
 * worker.c -- the worker loop, task completion, elastic workers.
 *
 * The loop (invariant: it starts each turn with mu held and no current task):
 *   1. wait on work_cv until the ring has a task, or until it may exit:
 *      closed with nothing queued or delayed (a task still running elsewhere
 *      keeps its own worker for its retries), or, above min_workers, idle for
 *      idle_timeout;
 *   2. pop the head (FIFO). A task whose deadline has passed ends here with
 *      TP_ETIMEDOUT without running;
 *   3. mark it running, release mu, call it, take mu again;
 *   4. decide: retry (failed, not cancelled, not forced, deadline not passed,
 *      attempts left) -> the delayed list, or final -> finalise;
 *   5. release mu for the log hook and on_done, take it again, retire.
 *
 * Exactly once: tp__task_finalise() is the only place that ends a task, and
 * every caller reaches it from a state (QUEUED, RUNNING, DELAYED) that it
 * leaves under the same lock; then exactly one thread -- the one that
 * finalised it, or the service thread for ENDING tasks -- calls on_done and
 * retires the record.
 *
 * Elastic workers: a submit that leaves more queued tasks than idle workers
 * reserves a worker slot under mu (tp__spawn_start) and creates the thread
 * after unlocking (tp__spawn_finish). A slot whose thread exited is joined
 * before reuse. If pthread_create fails the reservation is undone; the queued
 * tasks are still served by the workers that exist (at least min_workers).
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


static void *worker_main(void *arg);

/* ------------------------------------------------------------ spawning */

int tp__spawn_start(tp_pool *p, tp__worker **slot, pthread_t *old, bool *join_old) {
    *slot = NULL;
    for (unsigned i = 0; i < p->max_workers; i++) {
        tp__worker *w = &p->workers[i];
        if (w->state == TP__W_LIVE) continue;
        *join_old = w->state == TP__W_DEAD;
        *old = w->thread;
        w->state = TP__W_LIVE;
        p->live_workers++;
        p->threads++;
        p->starting++; /* counted in stats.workers once it runs (worker_main) */
        *slot = w;
        return TP_OK;
    }
    /* Every slot is taken: some exiting worker has left the counted set but
     * still runs its stop hook. Skip this spawn; the next one will find it. */
    return TP_ENOMEM;
}

int tp__spawn_finish(tp_pool *p, tp__worker *w, pthread_t old, bool join_old) {
    if (!w) return TP_ENOMEM;
    if (join_old) pthread_join(old, NULL); /* it marked itself DEAD as its last locked act */
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc == 0) return TP_OK;
    tp__lock(p);
    w->state = TP__W_FREE;
    p->live_workers--;
    p->threads--;
    p->starting--;
    pthread_cond_broadcast(&p->done_cv);
    tp__unlock(p);
    return TP_ENOMEM;
}

/* "<name>-w<index>", the name cut so the whole fits Linux's 15 characters. */
static void set_thread_name(const tp_pool *p, const char *what, unsigned index) {
#if defined(__linux__)
    char suffix[16], buf[16];
    int n = snprintf(suffix, sizeof suffix, "-%s%u", what, index);
    if (n < 0 || n >= 15) return;
    size_t keep = strlen(p->name);
    if (keep > (size_t)(15 - n)) keep = (size_t)(15 - n);
    memcpy(buf, p->name, keep);
    memcpy(buf + keep, suffix, (size_t)n + 1);
    pthread_setname_np(pthread_self(), buf);
#else
    (void)p, (void)what, (void)index;
#endif
}

/* ------------------------------------------------------------ endings */

static bool is_cancel_status(int status) { return status == TP_ECANCELED || status == TP_ETIMEDOUT; }

void tp__task_finalise(tp_pool *p, tp__task *t, int status, bool expired) {
    tp__tasks_unindex(&p->tasks, t);
    if (t->deadline != TP_FOREVER) p->with_deadline--;
    if (t->user) {
        tp__users_release(&p->users, t->user);
        TP__SET(p->st.users, p->users.live);
        tp__signal_room(p);
    }
    t->status = status;
    t->state = TP__DONE;
    TP__INC(p->st.completed);
    if (status == 0) {
        TP__INC(p->st.succeeded);
    } else {
        TP__INC(p->st.failed);
        if (is_cancel_status(status)) TP__INC(p->st.cancelled);
        if (expired) TP__INC(p->st.expired);
    }
}

/* A task leaves the ring or the delayed list without (another) run: finalise it
 * now and hand its on_done to the service thread, which runs it promptly even
 * when every worker is busy. The caller has already taken it off its list. */
void tp__task_end_unrun(tp_pool *p, tp__task *t, int status, bool expired) {
    tp__task_finalise(p, t, status, expired);
    if (!t->on_done) {
        tp__task_retire(p, t); /* nothing to run: no need to wait for the service thread */
        return;
    }
    t->state = TP__ENDING;
    t->next = NULL;
    if (p->endings_tail)
        p->endings_tail->next = t;
    else
        p->endings_head = t;
    p->endings_tail = t;
    tp__svc_wake(p);
}

/* on_done has returned: the record can be reused. */
void tp__task_retire(tp_pool *p, tp__task *t) {
    t->user = NULL;
    if (!p->tasks.free) tp__signal_room(p); /* records were at their cap */
    tp__tasks_put(&p->tasks, t);
    p->inflight--;
    tp__drained_check(p);
}

/* Idle workers re-check whether they may exit. */
void tp__wake_exiters(tp_pool *p) {
    if (p->closed && p->idle_waiters && tp__ring_len(&p->ring) == 0 && p->delayed == 0)
        pthread_cond_broadcast(&p->work_cv);
}

void tp__ctx_cancel_locked(tp__worker *w) {
    if (atomic_load_explicit(&w->ctx.cancelled, memory_order_relaxed)) return;
    atomic_store_explicit(&w->ctx.cancelled, 1, memory_order_relaxed);
    pthread_cond_signal(&w->sleep_cv);
    if (w->fds[1] >= 0 && !w->fd_dirty) {
        char b = 1;
        ssize_t n = write(w->fds[1], &b, 1);
        (void)n; /* a non-blocking pipe with room for one byte: cannot fail */
        w->fd_dirty = true;
    }
}

/* Empty the cancel pipe so the next task starts clean. mu held. */
static void clean_fd(tp__worker *w) {
    if (!w->fd_dirty) return;
    char buf[16];
    while (read(w->fds[0], buf, sizeof buf) > 0) {
    }
    w->fd_dirty = false;
}

/* Report a failed attempt. Called without mu, with copies of the task's id and
 * log id: once a retry is scheduled the record may be cancelled, ended and
 * reused by other threads. */
static void log_failure(tp_pool *p, uint64_t id, const char *log_id, unsigned attempt, int status,
                        bool retry) {
    char st[48];
    if (status < 0 && status >= TP_ENODEFAULT)
        snprintf(st, sizeof st, "%s", tp_err_name(status));
    else
        snprintf(st, sizeof st, "status %d", status);
    if (retry)
        tp__log(p, TP_LOG_WARN, log_id, "task %llu attempt %u failed (%s); retry %u of %u in %llu ms",
                (unsigned long long)id, attempt, st, attempt + 1, p->max_retries,
                (unsigned long long)(p->retry_delay / 1000000ull));
    else
        tp__log(p, TP_LOG_ERROR, log_id, "task %llu attempt %u failed (%s); giving up",
                (unsigned long long)id, attempt, st);
}

/* Run on_done (mu released), then retire. Entered and left with mu held. */
static void finish_locked(tp_pool *p, tp__task *t) {
    if (t->on_done) {
        tp__unlock(p);
        tp__tls_enter_task(t);
        t->on_done(t->arg, t->status);
        tp__tls_leave_task();
        tp__lock(p);
    }
    tp__task_retire(p, t);
}

/* ------------------------------------------------------------ the loop */

/* Start `t` on `w`: mu held. The run timeout is added to ctx.deadline by
 * the worker right after it unlocks (arm_run_timeout), so the clock is not
 * read under the lock. */
static void start_locked(tp_pool *p, tp__worker *w, tp__task *t) {
    t->state = TP__RUNNING;
    t->worker = w;
    w->cur = t;
    p->active++;
    TP__SET(p->st.active, p->active);
    if (t->attempt == 0)
        TP__INC(p->st.started);
    else
        TP__INC(p->st.retried);
    w->ctx.t = t;
    w->ctx.deadline = t->deadline;
    atomic_store_explicit(&w->ctx.cancelled, 0, memory_order_relaxed);
}

/* The attempt starts now: its effective deadline is the earlier of the task
 * deadline and now + run timeout. Without mu: only this worker reads its ctx. */
static void arm_run_timeout(tp__worker *w, const tp__task *t) {
    if (t->run_timeout == TP_FOREVER) return;
    uint64_t d = tp__deadline_after(tp_now_ns(), t->run_timeout);
    if (d < w->ctx.deadline) w->ctx.deadline = d;
}

/* The attempt returned `rc`: retry or finalise. mu held. Returns true when a
 * retry was scheduled. */
static bool after_run_locked(tp_pool *p, tp__worker *w, tp__task *t, int rc) {
    bool cancelled = atomic_load_explicit(&w->ctx.cancelled, memory_order_relaxed) != 0;
    w->cur = NULL;
    w->ctx.t = NULL;
    clean_fd(w);
    p->active--;
    TP__SET(p->st.active, p->active);
    t->worker = NULL;
    bool may_retry = rc != 0 && !cancelled && !p->forced && t->attempt < p->max_retries;
    uint64_t now = may_retry ? tp_now_ns() : 0; /* no clock read on success */
    if (may_retry && now < t->deadline) {
        t->attempt++;
        t->state = TP__DELAYED;
        t->due = tp__deadline_after(now, p->retry_delay);
        t->next = NULL;
        t->prev = p->delayed_tail;
        if (p->delayed_tail)
            p->delayed_tail->next = t;
        else
            p->delayed_head = t;
        p->delayed_tail = t;
        p->delayed++;
        TP__SET(p->st.delayed, p->delayed);
        tp__svc_wake(p);
        return true;
    }
    tp__task_finalise(p, t, rc, false);
    return false;
}

/* How long an idle worker polls for work before it sleeps on work_cv. A
 * sleep costs the submitter a futex wake (a system call) and the worker a
 * context switch, together several microseconds; a pool under a steady stream
 * of tasks finds its next task within this window without either. Only one
 * worker spins at a time, so idle workers do not eat the CPUs that the
 * submitters need, and each idle period spins at most once. */
#define TP__SPIN_NS 20000u

/* stats.idle: workers waiting on work_cv plus the one spinning. mu held. */
static void set_idle_stat(tp_pool *p) { TP__SET(p->st.idle, p->idle_waiters + p->spinners); }

/* Entered and left with mu held: poll the queue length (st.queued, stored
 * with every change of the ring) without the lock for up to TP__SPIN_NS. The caller re-checks the ring under the lock, so a task
 * pushed at any moment is found either here or there: no wake-up is lost. */
static void spin_for_work(tp_pool *p) {
    p->spinners++;
    set_idle_stat(p);
    tp__unlock(p);
    uint64_t until = tp_now_ns() + TP__SPIN_NS;
    for (unsigned i = 1;; i++) {
        if (TP__LOAD(p->st.queued) != 0) break;
        if ((i & 63) == 0) {
            if (tp_now_ns() >= until) break;
            sched_yield(); /* let a submitter that shares this CPU run */
        }
        tp__cpu_relax();
    }
    tp__lock(p);
    p->spinners--;
    set_idle_stat(p);
}

/* mu held, ring empty: may this worker exit now? */
static bool may_exit(const tp_pool *p) {
    return p->closed && p->delayed == 0;
}

static void *worker_main(void *arg) {
    tp__worker *w = (tp__worker *)arg;
    tp_pool *p = w->pool;
    tp__tls_pool = p;
    set_thread_name(p, "w", w->index);
    if (p->on_worker_start) p->on_worker_start(p->hook_arg);

    tp__lock(p);
    p->starting--;
    /* stats.workers: threads that run, not spawns under way (which may fail) */
    TP__SET(p->st.workers, p->live_workers - p->starting);
    /* Idle since the last task ended (or the thread started): wake-ups that
     * bring no work do not restart the idle clock. */
    uint64_t idle_since = tp_now_ns();
    const bool elastic_pool = p->max_workers > p->min_workers; /* else no clock read per task */
    bool spun = false; /* spun once already in this idle period */
    for (;;) {
        /* mu held, no current task. */
        if (tp__ring_len(&p->ring) == 0) {
            if (may_exit(p)) break;
            if (!spun && p->spinners == 0) {
                spun = true;
                spin_for_work(p);
                continue;
            }
            bool elastic = p->live_workers > p->min_workers && p->idle_timeout != TP_FOREVER;
            uint64_t until = elastic ? tp__deadline_after(idle_since, p->idle_timeout) : TP_FOREVER;
            p->idle_waiters++;
            set_idle_stat(p);
            int e = tp__wait_locked(p, &p->work_cv, until);
            p->idle_waiters--;
            set_idle_stat(p);
            if (e == ETIMEDOUT && elastic && tp__ring_len(&p->ring) == 0 &&
                p->live_workers > p->min_workers && tp_now_ns() >= until)
                break;
            continue;
        }
        tp__task *t = tp__ring_pop(&p->ring);
        spun = false;
        TP__SET(p->st.queued, tp__ring_len(&p->ring));
        tp__signal_room(p);
        tp__wake_exiters(p);
        /* Submitters do not wake anyone while a worker spins: pass work on. */
        if (tp__ring_len(&p->ring) > 0 && p->idle_waiters && !p->spinners)
            pthread_cond_signal(&p->work_cv);
        /* The clock is read under the lock only for a task with a deadline. */
        if (t->deadline != TP_FOREVER && tp_now_ns() >= t->deadline) {
            /* Expired in the queue. A retry that comes back after its
             * deadline ran before: cancelled, not expired. */
            tp__task_finalise(p, t, TP_ETIMEDOUT, t->attempt == 0);
            finish_locked(p, t);
            if (elastic_pool) idle_since = tp_now_ns();
            continue;
        }
        start_locked(p, w, t);
        tp__unlock(p);
        arm_run_timeout(w, t);

        tp__tls_enter_task(t);
        int rc = t->fn(&w->ctx, t->arg);
        tp__tls_leave_task();

        tp__lock(p);
        unsigned attempt = t->attempt;
        uint64_t id = t->id;
        char log_id[TP_LOG_ID_MAX + 1];
        if (rc != 0) snprintf(log_id, sizeof log_id, "%s", tp__task_log_id(t));
        bool retry = after_run_locked(p, w, t, rc);
        if (rc != 0) {
            tp__unlock(p);
            log_failure(p, id, log_id, attempt, rc, retry);
            tp__lock(p);
        }
        if (!retry) finish_locked(p, t);
        if (elastic_pool) idle_since = tp_now_ns();
    }

    /* Exit: mu held. Leave the counted set first (stats, scaling), run the
     * stop hook without the lock, then report the thread as gone. */
    p->live_workers--;
    TP__SET(p->st.workers, p->live_workers - p->starting);
    tp__unlock(p);
    if (p->on_worker_stop) p->on_worker_stop(p->hook_arg);
    tp__lock(p);
    w->state = TP__W_DEAD;
    p->threads--;
    if (p->threads == 0) pthread_cond_broadcast(&p->done_cv);
    tp__wake_exiters(p);
    /* A spawn skipped while this slot was still taken (tp__spawn_start finds
     * no free slot) is retried now, by the service thread. */
    if (!p->closed && tp__want_spawn(p)) tp__svc_wake(p);
    tp__unlock(p);
    return NULL;
}
