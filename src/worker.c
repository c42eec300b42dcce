/*
 * worker.c -- the worker threads: their slots, spawning, and the loop.
 *
 * Layer: below pool.c and service.c (which spawn workers), above life.c
 * (every step of a task's life is a life.c call) and the leaves. Owns p->wk:
 * the worker slots (workers[].state, .thread), the thread counters
 * (live_workers, starting, threads) and the idle bookkeeping (idle_waiters,
 * spinners), with stats.workers and stats.idle. life.c owns workers[].cur
 * (which task runs where).
 *
 * The loop (invariant: it starts each turn with mu held and no current task):
 *   1. wait_for_work_locked: wait on work_cv until the ring has a task, or
 *      until the worker may exit: closed with nothing queued or delayed (a
 *      task still running elsewhere keeps its own worker for its retries),
 *      or, above min_workers, idle for idle_timeout;
 *   2. tp__queue_pop_locked takes the head (FIFO); a task whose deadline has
 *      passed ends there with TP_ETIMEDOUT without running
 *      (tp__task_expired_locked);
 *   3. tp__task_start_locked marks it running; run_task releases mu, calls
 *      it, takes mu again;
 *   4. tp__task_after_run_locked decides: retry (the delayed list) or final;
 *   5. tp__task_finish_locked releases mu for on_done, then retires.
 *
 * Elastic workers: a submit that leaves more queued tasks than idle workers
 * reserves a worker slot under mu (tp__spawn_start_locked) and creates the
 * thread after unlocking (tp__spawn_finish). A slot whose thread exited is
 * joined before reuse. If pthread_create fails the reservation is undone;
 * the queued tasks are still served by the workers that exist (at least
 * min_workers).
 *
 * Lock order: only the pool lock, never held across user code (the task,
 * the worker hooks, the log hook).
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


static void *worker_main(void *arg);

#if defined(TP__DEBUG)
void (*volatile tp__test_attempt_returned)(tp_pool *p);
#endif

/* Workers whose threads run (spawns under way excluded). mu held. */
static unsigned running_workers_locked(const tp_pool *p) { return p->wk.live_workers - p->wk.starting; }

/* ------------------------------------------------------------ spawning */

int tp__spawn_start_locked(tp_pool *p, tp__worker **slot, pthread_t *old, bool *join_old) {
    TP__ASSERT_LOCKED(p);
    *slot = NULL;
    for (unsigned i = 0; i < p->cfg.max_workers; i++) {
        tp__worker *w = &p->wk.workers[i];
        if (w->state == TP__W_LIVE) continue;
        *join_old = w->state == TP__W_DEAD;
        *old = w->thread;
        w->state = TP__W_LIVE;
        p->wk.live_workers++;
        p->wk.threads++;
        p->wk.starting++; /* counted in stats.workers once it runs (worker_main) */
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
    TP__ASSERT(p->wk.live_workers > 0 && p->wk.threads > 0 && p->wk.starting > 0);
    w->state = TP__W_FREE;
    p->wk.live_workers--;
    p->wk.threads--;
    p->wk.starting--;
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
    size_t keep = strlen(p->cfg.name);
    if (keep > (size_t)(15 - n)) keep = (size_t)(15 - n);
    memcpy(buf, p->cfg.name, keep);
    memcpy(buf + keep, suffix, (size_t)n + 1);
    pthread_setname_np(pthread_self(), buf);
#else
    (void)p, (void)what, (void)index;
#endif
}

/* ------------------------------------------------------------ failures */

/* A duration in the largest unit it reaches (ns, us, ms, s), with up to three
 * decimals and no trailing zeros: 750 ns, 200 us, 1.5 ms, 2.5 s. */
static void format_duration(char *buf, size_t len, uint64_t ns) {
    static const struct {
        uint64_t div;
        const char *unit;
    } units[] = {{1000000000ull, "s"}, {1000000ull, "ms"}, {1000ull, "us"}, {1, "ns"}};
    size_t i = 0;
    while (units[i].div > 1 && ns < units[i].div) i++;
    uint64_t div = units[i].div, whole = ns / div;
    uint64_t milli = div >= 1000 ? (ns % div + div / 2000) / (div / 1000) : 0; /* thousandths, rounded */
    if (milli == 1000) {
        whole++;
        milli = 0;
    }
    if (milli == 0) {
        snprintf(buf, len, "%llu %s", (unsigned long long)whole, units[i].unit);
        return;
    }
    int digits = 3;
    while (milli % 10 == 0) {
        milli /= 10;
        digits--;
    }
    snprintf(buf, len, "%llu.%0*llu %s", (unsigned long long)whole, digits, (unsigned long long)milli,
             units[i].unit);
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
    if (retry) {
        char delay[32];
        format_duration(delay, sizeof delay, p->cfg.retry_delay);
        tp__log(p, TP_LOG_WARN, log_id, "task %llu attempt %u failed (%s); retry %u of %u in %s",
                (unsigned long long)id, attempt, st, attempt + 1, p->cfg.max_retries, delay);
    } else
        tp__log(p, TP_LOG_ERROR, log_id, "task %llu attempt %u failed (%s); giving up",
                (unsigned long long)id, attempt, st);
}

/* ------------------------------------------------------------ idle */

/* How long an idle worker polls for work before it sleeps on work_cv. A
 * sleep costs the submitter a futex wake (a system call) and the worker a
 * context switch, together several microseconds; a pool under a steady stream
 * of tasks finds its next task within this window without either. Only one
 * worker spins at a time, so idle workers do not eat the CPUs that the
 * submitters need, and each idle period spins at most once. */
#define TP__SPIN_NS 20000u

/* stats.idle: workers waiting on work_cv plus the one spinning. */
static void set_idle_stat_locked(tp_pool *p) { TP__SET(p->st.idle, p->wk.idle_waiters + p->wk.spinners); }

/* stats.workers: threads that run, not spawns under way (which may fail). */
static void set_workers_stat_locked(tp_pool *p) { TP__SET(p->st.workers, running_workers_locked(p)); }

/* Entered and left with mu held: poll the queue length (st.queued, stored
 * with every change of the ring) without the lock for up to TP__SPIN_NS. The
 * caller re-checks the ring under the lock, so a task pushed at any moment is
 * found either here or there: no wake-up is lost. */
static void spin_for_work_locked(tp_pool *p, uint64_t since) {
    p->wk.spinners++;
    set_idle_stat_locked(p);
    tp__unlock(p);
    uint64_t until = since + TP__SPIN_NS;
    for (unsigned i = 1;; i++) {
        if (TP__LOAD(p->st.queued) != 0) break;
        if ((i & 63) == 0) {
            if (tp_now_ns() >= until) break;
            sched_yield(); /* let a submitter that shares this CPU run */
        }
        tp__cpu_relax();
    }
    tp__lock(p);
    TP__ASSERT(p->wk.spinners > 0);
    p->wk.spinners--;
    set_idle_stat_locked(p);
}

/* The state a worker carries between turns of its loop. */
typedef struct worker_turn {
    bool spun; /* spun once already in this idle period */
    /* The end of the last attempt on the histograms' clock (clock.h), while
     * this worker has done nothing since but its lock hold (no wait, on_done
     * or failure log): the next attempt's queue wait ends then, or at the
     * task's admission if later (hist.h). 0: read the clock afresh. */
    uint64_t last_end_h;
} worker_turn;

/* Step 1, mu held, no current task: return when the ring has a task (true)
 * or this worker should exit (false). The idle period starts when the worker
 * first finds the ring empty (the clock is read then, not per task);
 * wake-ups that bring no work do not restart it. */
static bool wait_for_work_locked(tp_pool *p, worker_turn *wt) {
    uint64_t idle_since = 0;
    while (tp__ring_len(&p->life.ring) == 0) {
        wt->last_end_h = 0;
        if (p->life.closed && p->life.delayed == 0) return false;
        if (!idle_since) idle_since = tp_now_ns();
        if (!wt->spun && p->wk.spinners == 0) {
            wt->spun = true;
            spin_for_work_locked(p, idle_since);
            continue;
        }
        /* Above the minimum counting only workers that run: a spawn under
         * way may still fail, and then this worker is one of the minimum. */
        bool elastic = running_workers_locked(p) > p->cfg.min_workers && p->cfg.idle_timeout != TP_FOREVER;
        uint64_t until = elastic ? tp__deadline_after(idle_since, p->cfg.idle_timeout) : TP_FOREVER;
        p->wk.idle_waiters++;
        set_idle_stat_locked(p);
        int e = tp__wait_locked(p, &p->work_cv, until);
        TP__ASSERT(p->wk.idle_waiters > 0);
        p->wk.idle_waiters--;
        set_idle_stat_locked(p);
        if (e == ETIMEDOUT && elastic && tp__ring_len(&p->life.ring) == 0 &&
            running_workers_locked(p) > p->cfg.min_workers && tp_now_ns() >= until)
            return false;
    }
    wt->spun = false;
    return true;
}

/* Steps 3 to 5 for a started task: run it without mu, then retry or finish.
 * Entered and left with mu held. */
static void run_task_locked(tp_pool *p, tp__worker *w, tp__task *t, worker_turn *wt) {
    tp__unlock(p);
    /* The run timeout counts from this attempt's start: CLOCK_MONOTONIC
     * read now, after the task was popped, so never before its admission
     * (or its return to the queue for a retry). Not read without one. The
     * histograms' clock (clock.h) starts both histograms. */
    if (t->run_timeout != TP_FOREVER) tp__ctx_arm_run_timeout(&w->ctx, t, tp_now_ns());
    uint64_t last = wt->last_end_h;
    uint64_t started_at = !last ? tp__hclk_now() : last > t->queued_at ? last : t->queued_at;
    tp__hist_attempt_started(&p->wk.hist[w->index], t->queued_at, started_at);

    tp__tls_enter_task(t);
    int rc = t->fn(&w->ctx, t->arg);
    tp__tls_leave_task();
    uint64_t ended_at = tp__hclk_now();
    tp__hist_attempt_ended(&p->wk.hist[w->index], started_at, ended_at);
    bool busy = rc == 0 && !t->on_done; /* straight on to the next task, if any */
    wt->last_end_h = busy ? ended_at : 0;
#if defined(TP__DEBUG)
    if (tp__test_attempt_returned) tp__test_attempt_returned(p);
#endif

    tp__lock(p);
    unsigned attempt = t->attempt;
    uint64_t id = t->id;
    char log_id[TP_LOG_ID_MAX + 1];
    if (rc != 0) snprintf(log_id, sizeof log_id, "%s", tp__task_log_id(t));
    bool retry = tp__task_after_run_locked(p, w, t, rc);
    if (rc != 0) {
        tp__unlock(p);
        log_failure(p, id, log_id, attempt, rc, retry);
        tp__lock(p);
    }
    if (!retry) tp__task_finish_locked(p, t);
}

/* The thread runs: count it, mu held on return. */
static void worker_enter(tp_pool *p, tp__worker *w) {
    tp__tls_pool = p;
    set_thread_name(p, "w", w->index);
    if (p->cfg.on_worker_start) p->cfg.on_worker_start(p->cfg.hook_arg);
    tp__lock(p);
    TP__ASSERT(p->wk.starting > 0);
    p->wk.starting--;
    set_workers_stat_locked(p);
}

/* Exit, entered with mu held: leave the counted set first (stats, scaling),
 * run the stop hook without the lock, then report the thread as gone. */
static void worker_leave_locked(tp_pool *p, tp__worker *w) {
    TP__ASSERT(p->wk.live_workers > 0);
    p->wk.live_workers--;
    set_workers_stat_locked(p);
    tp__unlock(p);
    if (p->cfg.on_worker_stop) p->cfg.on_worker_stop(p->cfg.hook_arg);
    tp__lock(p);
    TP__ASSERT(p->wk.threads > 0);
    w->state = TP__W_DEAD;
    p->wk.threads--;
    tp__signal_worker_gone_locked(p);
    tp__unlock(p);
}

static void *worker_main(void *arg) {
    tp__worker *w = (tp__worker *)arg;
    tp_pool *p = w->pool;
    worker_enter(p, w);
    worker_turn wt = {false, 0};
    while (wait_for_work_locked(p, &wt)) {
        tp__task *t = tp__queue_pop_locked(p);
        if (tp__task_expired_locked(p, t)) {
            tp__task_finish_locked(p, t);
            wt.last_end_h = 0;
        } else {
            tp__task_start_locked(p, w, t);
            run_task_locked(p, w, t, &wt);
        }
    }
    worker_leave_locked(p, w);
    return NULL;
}
