/*
 * engine.c -- the pool's threads and its lock: the worker loop, the service
 * loop, spawning, every wait, and acting on what life.c's transitions call
 * for.
 *
 * life.c changes task records and reports, in a tp__fx, what became possible
 * (work, room, a timer, a drained pool, a group without unfinished members);
 * this file owns every thread, condition variable and worker semaphore and
 * decides whom to wake (tp__engine_act_locked; idle workers park, see
 * "parking"). Nothing here changes a task's state.
 *
 * The worker loop (each turn starts with mu held and no current task):
 *   1. wait_for_work_locked: first admit what was staged (stage.h); then
 *      until a task may start, or until the worker may exit: closed with
 *      nothing waiting or delayed (a task still running elsewhere keeps its
 *      own worker for its retries), or, above min_workers, idle for
 *      idle_timeout. One idle worker at a time first polls for up to
 *      TP__SPIN_NS without the lock.
 *   2. tp__life_take: the next task by the scheduler's rules, started on
 *      this worker's context (or one whose deadline passed, ended unrun:
 *      the worker runs its on_done);
 *   3. run_task_locked: mu released, the function called, mu taken again;
 *      tp__life_attempt_ended: a retry (the delayed list) or the end; then
 *      on_done without mu, and tp__life_retire.
 *
 * The service thread does what must not need a free worker: the on_done of
 * tasks that ended without running (life.c's endings list), retry timers and
 * the deadlines of waiting tasks (tp__life_timers), and a spawn that a worker
 * exit or a retry backlog calls for. It exits when the pool is closed and
 * nothing is in flight.
 *
 * Elastic workers: a submit that leaves more startable tasks than idle
 * workers reserves a worker slot under mu (spawn_start_locked) and creates
 * the thread after unlocking (spawn_finish). A slot whose thread exited is
 * joined before reuse. If pthread_create fails the reservation is undone; the
 * tasks are still served by the workers that exist (at least min_workers).
 *
 * Shutdown: the first tp_shutdown() fixes `shut.deadline`; every caller waits
 * on done_cv for the same state change, and the first to wake past the
 * deadline forces (tp__life_force). The outcome is recorded in `shut.state`
 * and every later call reports it.
 *
 * Lock order: see pool.h. mu is never held across user code (task, on_done,
 * hooks, the log hook) or pthread_create.
 *
 * The cache lines of one task (a FIFO pool, no user, deadline, group or
 * on_done), from tp_submit (S) to the end of its attempt on a worker (W).
 * Where a line that one thread writes is next touched by another, it moves
 * between their CPUs: that move is what a task costs where moving lines is
 * expensive, so this is the budget to keep in review.
 *   written by S and W (each moves once or twice per task):
 *     1  the lock and the waiter counts (tp_pool.mu, waiting)
 *     2  the published line: the admission word and the waiting count for
 *        lock-free readers, then the scheduler's hot fields: the ring's
 *        head and tail, its head's stamp, the waiting count (life.h)
 *     3  the task record's second line: its state, links, context (S fills
 *        it at admission, W changes its state and gives it back)
 *   written by S, read by W:
 *     4  the task record's first line: fn, arg, on_done, timeouts, stamp
 *     5  the ring slot
 *   written by workers only (moves between workers, never to S): the
 *     retiring line (life.h: retired records, the retired count)
 *   written by one side only (stay in its cache):
 *     S: the submitter's line (life.h: its free list, the next id, the
 *     admitted count, the id index's head), the calls' counters, the id
 *     index bucket; W: its slot and context (pool.h: a line of their own),
 *     its runs' counters (one line; lane 0's start count is on it too), its
 *     histogram shard.
 *   read by both, written only on rare events: life.h's line of delayed,
 *     users at their limit, closed.
 * A staged task (a plain submit on a pool with fixed workers, stage.h)
 * never has S take the pool lock (but the pool's first, which starts the
 * room count): S writes the room count's taken places (life.h,
 * `room_taken`: its own line; S reads the places that starts gave back,
 * on the scheduler's first line, only when its last look at them leaves no
 * free place), the ring's put side (its lock, tail
 * and staged count: one line, which stays with S while S is the only
 * submitter), and the ring's slot (a line of its own: it moves to the
 * worker and back once), and for a task bound to a completion queue that
 * queue's places line (cq.c); the worker, under the pool lock, which only
 * workers and locked calls take, admits it (lines 2-4 above are then
 * written on the worker's side). S reads the sleepers' line in each submit
 * (under put); only a worker that parks writes it, and then takes put once.
 * Once a pool has tried to stage a task, its locked admissions write
 * `room_taken` too and its starts the places given back (a line they
 * write anyway); a pool that never stages keeps no count
 * (life.h, `room_taken`).
 * A task with a user adds its entry's first line (users.h: `taken`, and a
 * name of up to 35 bytes; S writes it, and W too in a pool that does not
 * stage, where a slot given back lowers `taken`), in a pool that stages or
 * is fair its ending line (`released`, `at_limit`, the count of slots
 * kept, and in a fair pool the flow's priority-0 part with its weight:
 * W's alone in a pool that stages; S reads it only near the user's limit
 * -- with the default limit of 2, at every staged submit -- and writes it
 * only at a locked admission that brings the user to its limit, and W
 * reads the first line only at the user's last slot; a fair pool's locked
 * admission writes both) and, read by S only, the bucket's slot. (Until
 * the flow's weight moved into its lanes, `at_limit` and the kept count
 * sat on the name's last line, a second line of the entry that W read per
 * slot given back.) (The flow once shared the first line, which a fair pool's staged
 * submit and its worker then both wrote per task: docs/performance.md,
 * "the user entry's two sides".) With few users
 * they stay cached; with thousands (tp_bench fair) they come from memory or
 * another core at every submit, so S fetches the bucket's entry's first
 * line (and so a name of up to 35 bytes) before it takes the lock
 * (tp__life_prefetch) rather than holding the lock through the misses; the
 * ending line, which a fair pool's locked admission writes (the flow), is
 * not fetched: it is the worker's in a pool that stages.
 * Staged with its user (life.h, users_put: a plain tp_submit whose user is
 * well below its limit), S takes the slot under put (the lines above, on
 * S's side, and the ring's as a staged task's) and the slot rides in the
 * ring slot; W gives it back with up to 31 others under one hold of put
 * (the entry's ending line, and the put line once per 32 tasks; the kept
 * slots' line is W's), unless
 * it is the user's last slot or no task waits: then at once, taking put.
 * History: right after the core was reshaped for 1.2, S and W both wrote
 * nine lines per task: the lock, life's first line, the admission word and
 * ring, lane 0's published counts, the statistics line, the three lines of
 * the record and the id index bucket; 1.1 had eight. Before 1.2's hot path
 * pass, seven: the lock, life's hot line (free list, inflight and the
 * published words, which S and W both wrote), the scheduler's line, the
 * ring lane's line (its waiting count), the record's two lines and the
 * ring slot; and as the pool and the worker slots were allocated with
 * calloc (16-byte aligned), every one of those lines straddled two, and
 * two workers' slots shared one.
 */
#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "group.h"

static void *worker_main(void *arg);
static void *service_main(void *arg);
static void stage_absorb_locked(tp_pool *p, unsigned max, bool worker);
static void stage_absorb_all_locked(tp_pool *p);
static bool stage_pending(tp_pool *p);

#if defined(TP__DEBUG)
_Atomic(tp__test_hook) tp__test_attempt_returned; /* pool.h */
_Atomic(tp__test_hook) tp__test_stage_claimed;    /* pool.h */
#endif

/* ------------------------------------------------------------ parking */

/*
 * An idle worker parks: it pushes itself on the pool's stack of parked
 * workers (wk.parked) under mu, releases mu and sleeps on its own semaphore,
 * `wake`. Whoever wakes one pops the top of the stack under mu (the worker
 * that parked last: its cache is the warmest, and the ones below it are
 * those an elastic pool lets time out) and posts its semaphore, under mu or
 * right after releasing it (a submit: the woken worker then finds mu free).
 * A popped worker is woken exactly once, so a task never wakes two, and a
 * post never goes to a worker that runs.
 *
 * Why not a condition variable on mu: a thread woken in pthread_cond_wait
 * takes the mutex back marked as contended (glibc cannot know whether others
 * wait), so the woken worker's first unlock is a futex wake system call that
 * wakes nobody, on the path of every wake-up; and a signal reaches any
 * waiter, not a chosen one. A semaphore wakes the worker without the mutex,
 * which it then takes as any thread does.
 *
 * A worker that timed out (an elastic pool's idle timeout) takes itself off
 * the stack. If it was popped while timing out, its post is still to come or
 * pending in the semaphore: its next park then returns at once, finds it was
 * not popped, and parks again -- one spare turn, never a lost wake-up.
 * `waiting.idle` counts parked workers and popped ones that have not yet
 * taken mu back (each takes itself out of the count).
 */

/* Wait on `sem` until it is posted (0) or CLOCK_MONOTONIC reaches `deadline`
 * in ns (ETIMEDOUT; TP_FOREVER: no limit). Signals do not end the wait. */
static int sem_wait_until(sem_t *sem, uint64_t deadline) {
    for (;;) {
        int r;
        if (deadline == TP_FOREVER) {
            r = sem_wait(sem);
        } else {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
            struct timespec ts;
            ts.tv_sec = (time_t)(deadline / 1000000000ull);
            ts.tv_nsec = (long)(deadline % 1000000000ull);
            r = sem_clockwait(sem, CLOCK_MONOTONIC, &ts);
#else /* sem_timedwait's clock is CLOCK_REALTIME: the time left, from now on it */
            uint64_t now = tp_now_ns();
            if (now >= deadline) return ETIMEDOUT;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (deadline - now);
            ts.tv_sec = (time_t)(at / 1000000000ull);
            ts.tv_nsec = (long)(at % 1000000000ull);
            r = sem_timedwait(sem, &ts);
#endif
        }
        if (r == 0) return 0;
        if (errno != EINTR) return ETIMEDOUT; /* ETIMEDOUT (anything else: as if timed out) */
    }
}

/* Pop the top parked worker, its post left to the caller; NULL if none. */
static tp__worker *unpark_take_locked(tp_pool *p) {
    tp__worker *w = p->wk.parked;
    if (!w) return NULL;
    p->wk.parked = w->park_next;
    w->park_next = NULL;
    w->parked = false;
    return w;
}

static bool unpark_one_locked(tp_pool *p) {
    tp__worker *w = unpark_take_locked(p);
    if (w) sem_post(&w->wake);
    return w != NULL;
}

static void unpark_all_locked(tp_pool *p) {
    while (unpark_one_locked(p)) {
    }
}

/* Park `w` until it is woken or `until` passes (ETIMEDOUT; TP_FOREVER: no
 * limit); mu released meanwhile, held on return. 0 means popped: woken. */
static int park_locked(tp_pool *p, tp__worker *w, uint64_t until) {
    TP__ASSERT(!w->parked);
    w->parked = true;
    w->park_next = p->wk.parked;
    p->wk.parked = w;
    tp__unlock(p);
    int e = sem_wait_until(&w->wake, until);
    tp__lock(p);
    if (!w->parked) return 0; /* popped: woken, whatever the wait said */
    /* timed out, or an earlier post was pending: take itself off */
    for (tp__worker **pp = &p->wk.parked; *pp; pp = &(*pp)->park_next) {
        if (*pp == w) {
            *pp = w->park_next;
            break;
        }
    }
    w->park_next = NULL;
    w->parked = false;
    return e == 0 ? EAGAIN : e; /* EAGAIN: a spare turn (see above) */
}

/* ------------------------------------------------------------ acting on transitions */

static void svc_wake_locked(tp_pool *p) {
    if (p->waiting.svc) pthread_cond_signal(&p->svc_cv);
}

/* Workers whose threads run (spawns under way excluded). */
static unsigned running_workers_locked(const tp_pool *p) { return p->wk.live_workers - p->wk.starting; }

/* Should a worker be added? Only while the startable tasks exceed the idle
 * workers plus those still starting (not yet waiting, but about to take
 * work), and the pool is below its maximum; a fixed pool never spawns. */
static bool want_spawn_locked(const tp_pool *p) {
    return p->wk.live_workers < p->cfg.max_workers &&
           tp__life_startable(&p->life) > p->waiting.idle + p->waiting.spin + p->wk.starting;
}

/* Whether a transition's report asks for anything at all: the usual case of
 * a busy pool is "nothing" (no thread sleeps that it would wake), answered
 * inline, without the call. */
static inline bool act_needed(const tp_pool *p, const tp__fx *fx) {
    unsigned f = fx->flags;
    return (fx->work && p->waiting.idle && !p->waiting.spin) || ((f & TP__FX_ROOM) && p->waiting.room) ||
           (f & ~(unsigned)TP__FX_ROOM) || fx->svc_by != TP_FOREVER || fx->groups;
}
#define ACT_LOCKED(p, fx)                                                                                    \
    do {                                                                                                     \
        if (act_needed((p), (fx))) tp__engine_act_locked((p), (fx));                                         \
    } while (0)

void tp__engine_act_locked(tp_pool *p, tp__fx *fx) {
    TP__ASSERT_LOCKED(p);
    unsigned f = fx->flags;
    /* One signal per startable task, as far as there are sleepers; none while
     * a worker spins: it takes new work without a wake-up, and wakes a
     * sleeper itself if more is left (worker_main). */
    if (fx->work && !p->waiting.spin)
        for (unsigned i = 0; i < fx->work && unpark_one_locked(p); i++) {
        }
    /* Broadcast: waiters wait for different things (space, their user's
     * slot), so one wake could go to a caller that still cannot proceed. */
    if ((f & TP__FX_ROOM) && p->waiting.room) pthread_cond_broadcast(&p->room_cv);
    if ((f & (TP__FX_SVC | TP__FX_DRAINED)) || (fx->svc_by != TP_FOREVER && fx->svc_by < p->waiting.svc_next))
        svc_wake_locked(p);
    if (!(f & (TP__FX_EXITERS | TP__FX_DRAINED | TP__FX_CANCEL)) && !fx->groups) return; /* the usual case */
    if ((f & (TP__FX_EXITERS | TP__FX_DRAINED)) && p->waiting.idle && tp__life_closed(&p->life) &&
        tp__life_idle(&p->life))
        unpark_all_locked(p);
    if (f & TP__FX_DRAINED) pthread_cond_broadcast(&p->done_cv);
    if (f & TP__FX_CANCEL)
        for (unsigned i = 0; i < p->cfg.max_workers; i++)
            if (p->wk.workers[i].cur) tp__ctx_cancel_locked(&p->wk.workers[i].ctx);
    for (struct tp_group *g = fx->groups, *nx; g; g = nx) {
        nx = g->wake_next;
        g->wake_next = NULL;
        g->wake_queued = false;
        if (g->waiters) pthread_cond_broadcast(&g->cv);
    }
    fx->groups = NULL; /* woken: the list is gone */
}

int tp__engine_wait_locked(tp_pool *p, pthread_cond_t *cv, uint64_t deadline) {
    return tp__mutex_wait(&p->mu, cv, deadline);
}

/* ------------------------------------------------------------ spawning */

/* Reserve a worker slot (mu held); the thread is made after unlocking by
 * spawn_finish. */
static int spawn_start_locked(tp_pool *p, tp__worker **slot, pthread_t *old, bool *join_old) {
    *slot = NULL;
    for (unsigned i = 0; i < p->cfg.max_workers; i++) {
        tp__worker *w = &p->wk.workers[i];
        if (w->state == TP__W_LIVE) continue;
        *join_old = w->state == TP__W_DEAD;
        *old = w->thread;
        w->state = TP__W_LIVE;
        p->wk.live_workers++;
        p->wk.threads++;
        p->wk.starting++; /* counted in stats.workers once it runs (worker_enter) */
        *slot = w;
        return TP_OK;
    }
    /* Every slot is taken: some exiting worker has left the counted set but
     * still runs its stop hook. Skip this spawn; the next one will find it. */
    return TP_ENOMEM;
}

static int spawn_finish(tp_pool *p, tp__worker *w, pthread_t old, bool join_old) {
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

/* A spawn that a submit calls for: reserved under mu, made after. */
typedef struct spawn {
    tp__worker *w;
    pthread_t old;
    bool join_old;
} spawn;

static void spawn_if_wanted_locked(tp_pool *p, spawn *sp) {
    sp->w = NULL;
    if (want_spawn_locked(p)) spawn_start_locked(p, &sp->w, &sp->old, &sp->join_old);
    /* A submit spawns one worker itself; should the backlog want more (a
     * batch), the service thread spawns the rest, one after the other. */
    if (!tp__life_closed(&p->life) && want_spawn_locked(p)) svc_wake_locked(p);
}

static void spawn_run(tp_pool *p, spawn *sp) {
    if (sp->w)
        (void)spawn_finish(p, sp->w, sp->old, sp->join_old); /* a failure leaves the tasks to the others */
}

/* "<name>-<what><index>", the name cut so the whole fits Linux's 15 characters. */
static void set_thread_name(const tp_pool *p, const char *what, unsigned index) {
#if defined(__linux__)
    char suffix[16], buf[16];
    int n = index == UINT_MAX ? snprintf(suffix, sizeof suffix, "-%s", what)
                              : snprintf(suffix, sizeof suffix, "-%s%u", what, index);
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
    uint64_t whole = ns, milli = 0;
    while (units[i].div > 1) {
        uint64_t div = units[i].div;
        uint64_t q = div / 1000;                 /* a thousandth of the unit */
        uint64_t t = ns / q + (ns % q * 2 >= q); /* thousandths, rounded half up */
        whole = t / 1000;
        milli = t % 1000;
        if (whole < 1000 || i == 0) break;
        i--; /* rounded up to a thousand of this unit (999.9996 ms): one of the next */
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

/* A failed attempt, as the task looked when it ended (copied under mu: once
 * a retry is scheduled the record may be cancelled, ended and reused). */
typedef struct failure {
    uint64_t id;
    unsigned attempt;
    int status;
    bool retry;
    uint64_t delay; /* before the retry */
    char log_id[TP_LOG_ID_MAX + 1];
} failure;

/* Reported without mu. */
static void log_failure(tp_pool *p, const failure *f) {
    char st[48];
    if (f->status < 0 && f->status >= TP_EBUSY)
        snprintf(st, sizeof st, "%s", tp_err_name(f->status));
    else
        snprintf(st, sizeof st, "status %d", f->status);
    if (f->retry) {
        char delay[32];
        format_duration(delay, sizeof delay, f->delay);
        tp__log(p->cfg.log, p->cfg.log_arg, p->cfg.name, TP_LOG_WARN, f->log_id,
                "task %llu attempt %u failed (%s); retry %u of %u in %s", (unsigned long long)f->id,
                f->attempt, st, f->attempt + 1, p->cfg.max_retries, delay);
    } else {
        tp__log(p->cfg.log, p->cfg.log_arg, p->cfg.name, TP_LOG_ERROR, f->log_id,
                "task %llu attempt %u failed (%s); giving up", (unsigned long long)f->id, f->attempt, st);
    }
}

/* ------------------------------------------------------------ the worker loop */

/* How long an idle worker polls for work before it parks. A
 * sleep costs the submitter a futex wake (a system call) and the worker a
 * context switch, together several microseconds; a pool under a steady stream
 * of tasks finds its next task within this window without either. Only one
 * worker spins at a time, so idle workers do not eat the CPUs that the
 * submitters need, and each idle period spins at most once. 2 us: on the
 * fifth machine (docs/performance.md) 20 us cost a paced pool 1.2x the CPU
 * of 2 us, and the saturated configs and the wake latency did not tell the
 * two apart. */
#define TP__SPIN_NS 2000u

/* stats.idle: workers parked (or woken, not yet running) plus the one spinning. */
static void set_idle_stat_locked(tp_pool *p) { TP__SET(p->gauges.idle, p->waiting.idle + p->waiting.spin); }

/* stats.workers: threads that run, not spawns under way (which may fail). */
static void set_workers_stat_locked(tp_pool *p) { TP__SET(p->gauges.workers, running_workers_locked(p)); }

/* Entered and left with mu held: poll the waiting count (life.sched.pub.count,
 * stored with every change) without the lock for up to TP__SPIN_NS. The caller
 * re-checks under the lock, so a task pushed at any moment is found either
 * here or there: no wake-up is lost. The idle gauge still counts this worker
 * when it returns: the caller stores it once it knows what comes next. */
static void spin_for_work_locked(tp_pool *p, uint64_t since) {
    p->waiting.spin++;
    set_idle_stat_locked(p);
    bool staging = tp__stage_on(&p->stage);
    tp__unlock(p);
    uint64_t until = since + TP__SPIN_NS;
    for (unsigned i = 1;; i++) {
        /* a published entry, by its slot: the submitters' line (`tail`, the
         * put lock) is not pulled away from them at every poll */
        if (TP__LOAD(p->life.sched.pub.count) != 0 || (staging && tp__stage_peek(&p->stage))) break;
        if ((i & 63) == 0) {
            if (tp_now_ns() >= until) break;
            sched_yield(); /* let a submitter that shares this CPU run */
        }
        tp__cpu_relax();
    }
    tp__lock(p);
    TP__ASSERT(p->waiting.spin > 0);
    p->waiting.spin--;
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

/* Whether a worker at the top of its turn admits staged entries now (stage.h,
 * "When a worker admits"): while the default lane
 * holds fewer than TP__STAGE_LOW tasks (that lane's count: the total less
 * the other lanes', as in tp__sched_ready). mu held. */
static bool stage_due_locked(const tp_pool *p) {
    const tp__sched *s = &p->life.sched;
    return s->waiting - s->in_others < TP__STAGE_LOW;
}

/* Step 1, mu held, no current task: return when a task may start (true) or
 * this worker should exit (false). The idle period starts when the worker
 * first finds nothing to start (the clock is read then, not per task);
 * wake-ups that bring no work do not restart it. */
static bool wait_for_work_locked(tp_pool *p, tp__worker *w, worker_turn *wt) {
    uint64_t idle_since = 0;
    /* The idle gauge still counts this worker (after a spin or a wait): it
     * is stored when the worker leaves, or again when it waits once more, so
     * a lock-free reader never sees an idle worker dip out of it. */
    bool stale = false;
    bool go = true;
    for (;;) {
        /* a bounded batch: a deep ring does not hold the lock for long (what
         * is left keeps this and the other workers from parking); and only
         * when the default lane runs low (stage.h, "When a worker admits") */
        if (stage_due_locked(p)) stage_absorb_locked(p, TP__STAGE_BATCH, true);
        if (tp__life_ready(&p->life)) break;
        wt->last_end_h = 0;
        if (tp__life_closed(&p->life) && tp__life_idle(&p->life)) {
            go = false;
            break;
        }
        if (!idle_since) {
            idle_since = tp_now_ns();
            tp__life_users_flush(&p->life); /* slots kept back go back before a worker idles (life.h) */
        }
        if (!wt->spun && p->waiting.spin == 0) {
            wt->spun = true;
            spin_for_work_locked(p, idle_since);
            stale = true;
            continue;
        }
        /* Above the minimum counting only workers that run: a spawn under
         * way may still fail, and then this worker is one of the minimum. */
        bool elastic = running_workers_locked(p) > p->cfg.min_workers && p->cfg.idle_timeout != TP_FOREVER;
        uint64_t until = elastic ? tp__deadline_after(idle_since, p->cfg.idle_timeout) : TP_FOREVER;
        /* Counted among the sleepers, then put taken and let go, before a
         * last look at the staged submits: a submit that held put before
         * that is seen by the look, one after it sees the count (stage.h,
         * waking). */
        bool staging = tp__stage_on(&p->stage);
        if (staging) {
            atomic_fetch_add_explicit(&p->stage.sleepers, 1, memory_order_relaxed);
            tp__stage_put_barrier(&p->stage);
            if (stage_pending(p)) {
                atomic_fetch_sub_explicit(&p->stage.sleepers, 1, memory_order_relaxed);
                /* an entry not yet published: its submitter holds put */
                if (!tp__stage_peek(&p->stage)) tp__stage_put_barrier(&p->stage);
                continue; /* admitted at the top of the loop */
            }
        }
        p->waiting.idle++;
        set_idle_stat_locked(p);
        int e = park_locked(p, w, until);
        if (staging) atomic_fetch_sub_explicit(&p->stage.sleepers, 1, memory_order_relaxed);
        TP__ASSERT(p->waiting.idle > 0);
        p->waiting.idle--;
        stale = true;
        if (e == ETIMEDOUT && elastic && !tp__life_ready(&p->life) &&
            running_workers_locked(p) > p->cfg.min_workers && tp_now_ns() >= until) {
            go = false;
            break;
        }
    }
    if (stale) set_idle_stat_locked(p);
    if (go) wt->spun = false;
    return go;
}

/* A finalised task (DONE, with an on_done): its on_done without mu, then
 * retired. Entered and left with mu held. */
static void finish_locked(tp_pool *p, tp__task *t) {
    TP__ASSERT(t->state == TP__DONE && t->on_done);
    tp__unlock(p);
    tp__tls_enter_task(t);
    t->on_done(t->arg, t->status);
    tp__tls_leave_task();
    tp__lock(p);
    tp__fx fx = TP__FX_INIT(&p->misc);
    tp__life_retire(&p->life, t, &fx);
    ACT_LOCKED(p, &fx);
}

/* Step 3 for a started task: run it without mu, then retry or end. Entered
 * and left with mu held. */
static void run_task_locked(tp_pool *p, tp__worker *w, tp__task *t, worker_turn *wt) {
    tp__unlock(p);
    /* The run timeout counts from this attempt's start: CLOCK_MONOTONIC read
     * now, after the task left the queue, so never before its admission (or
     * its return to the queue for a retry). Not read without one. The
     * histograms' clock (clock.h) starts both histograms. */
    if (t->run_timeout != TP_FOREVER) tp__ctx_arm_run_timeout(&w->ctx, t, tp_now_ns());
    uint64_t last = wt->last_end_h;
    uint64_t started_at = !last ? tp__hclk_now() : last > t->queued_at ? last : t->queued_at;
    tp__hist_shard *h = &p->wk.hist[w->index];
    tp__hist_attempt_started(h, tp__lane_of(t->prio), t->queued_at, started_at);

    tp__tls_enter_task(t);
    int rc = t->fn(&w->ctx, t->arg);
    tp__tls_leave_task();
    uint64_t ended_at = tp__hclk_now();
    tp__hist_attempt_ended(h, started_at, ended_at);
    /* straight on to the next task, if any: nothing to run or log here */
    bool busy = rc == 0 && (!t->on_done || t->cq);
    wt->last_end_h = busy ? ended_at : 0;
#if defined(TP__DEBUG)
    tp__test_hook hook = atomic_load_explicit(&tp__test_attempt_returned, memory_order_acquire);
    if (hook) hook(p);
#endif

    if (tp__stage_plain(&p->stage))
        tp__lock(p); /* its submitters seldom take mu */
    else
        tp__lock_spin(p); /* pool.h */
    failure f;
    if (rc != 0) {
        f.id = t->id;
        f.attempt = t->attempt;
        f.status = rc;
        snprintf(f.log_id, sizeof f.log_id, "%s", tp__task_log_id(t));
    }
    tp__fx fx = TP__FX_INIT(&p->wk.runs[w->index]);
    bool retry = tp__life_attempt_ended(&p->life, t, rc, &fx);
    w->cur = NULL;
    /* read now: a task that went to a completion queue is retired already */
    bool finish = !retry && tp__life_done_here(t);
    if (retry) f.delay = tp__life_retry_delay(&p->life, t->attempt);
    ACT_LOCKED(p, &fx);
    if (rc != 0) {
        f.retry = retry;
        tp__unlock(p);
        log_failure(p, &f);
        tp__lock(p);
    }
    if (finish) finish_locked(p, t);
}

/* The thread runs: count it, mu held on return. A worker that tp_create
 * spawned waits at the start gate until every one of them exists: should
 * one not be made, tp_create fails and the others exit without running a
 * hook (false), so that its unwind waits for no user code -- a start hook
 * may wait for the application to have the pool, or call
 * tp_default_create, whose lock tp_create's caller may hold. */
static bool worker_enter(tp_pool *p, tp__worker *w) {
    tp__tls_pool = p;
    set_thread_name(p, "w", w->index);
    tp__lock(p);
    while (p->wk.gate == TP__GATE_CLOSED) tp__mutex_wait(&p->mu, &p->done_cv, TP_FOREVER);
    bool hooks = p->wk.gate == TP__GATE_OPEN;
    tp__unlock(p);
    if (hooks && p->cfg.on_worker_start) p->cfg.on_worker_start(p->cfg.hook_arg);
    tp__lock(p);
    TP__ASSERT(p->wk.starting > 0);
    p->wk.starting--;
    set_workers_stat_locked(p);
    return hooks;
}

/* Exit, entered with mu held: leave the counted set first (stats, scaling),
 * run the stop hook without the lock, then report the thread as gone. */
static void worker_leave_locked(tp_pool *p, tp__worker *w, bool hooks) {
    TP__ASSERT(p->wk.live_workers > 0);
    p->wk.live_workers--;
    set_workers_stat_locked(p);
    tp__unlock(p);
    if (hooks && p->cfg.on_worker_stop) p->cfg.on_worker_stop(p->cfg.hook_arg);
    tp__lock(p);
    TP__ASSERT(p->wk.threads > 0);
    w->state = TP__W_DEAD;
    p->wk.threads--;
    if (p->wk.threads == 0) pthread_cond_broadcast(&p->done_cv);
    if (tp__life_closed(&p->life) && tp__life_idle(&p->life) && p->waiting.idle) unpark_all_locked(p);
    /* A spawn skipped while this slot was still taken (spawn_start finds no
     * free slot) is retried now, by the service thread. */
    if (!tp__life_closed(&p->life) && want_spawn_locked(p)) svc_wake_locked(p);
    tp__unlock(p);
}

static void *worker_main(void *arg) {
    tp__worker *w = (tp__worker *)arg;
    tp_pool *p = w->pool;
    bool hooks = worker_enter(p, w); /* false: tp_create failed, the pool is closed */
    worker_turn wt = {false, 0};
    while (hooks && wait_for_work_locked(p, w, &wt)) {
        tp__fx fx = TP__FX_INIT(&p->wk.runs[w->index]);
        tp__task *t = tp__life_take(&p->life, &w->ctx, &fx);
        /* Submitters do not wake anyone while a worker spins: pass work on. */
        if (tp__life_ready(&p->life) && p->waiting.idle && !p->waiting.spin) unpark_one_locked(p);
        ACT_LOCKED(p, &fx);
        if (!t) continue; /* the ready task ended at its deadline, with nothing for this worker to run */
        if (t->state == TP__DONE) {
            finish_locked(p, t); /* its deadline passed while it waited */
            wt.last_end_h = 0;
            continue;
        }
        w->cur = t;
        run_task_locked(p, w, t, &wt);
    }
    worker_leave_locked(p, w, hooks);
    return NULL;
}

/* ------------------------------------------------------------ the service thread */

/* The on_done calls of tasks that ended without running, in chunks: one lock
 * round-trip per chunk keeps the service thread ahead of a cancel storm, and
 * a chunk is short enough not to sit on records that admission may wait for.
 * Entered and left with mu held. */
#define TP__ENDINGS_CHUNK 64u
static void run_endings_locked(tp_pool *p) {
    tp__task *list = tp__life_take_endings(&p->life);
    while (list) {
        tp__task *chunk = list;
        unsigned n = 0;
        tp__unlock(p);
        for (; list && n < TP__ENDINGS_CHUNK; list = list->next, n++) {
            tp__tls_enter_task(list);
            list->on_done(list->arg, list->status);
            tp__tls_leave_task();
        }
        tp__lock(p);
        tp__fx fx = TP__FX_INIT(&p->misc);
        while (chunk != list) {
            tp__task *nx = chunk->next;
            tp__life_retire(&p->life, chunk, &fx);
            chunk = nx;
        }
        ACT_LOCKED(p, &fx);
    }
}

/* Retries came back to a backlog, or a spawn was skipped while an exiting
 * worker held its slot: grow an elastic pool as a submit would. One attempt
 * per pass: a failed pthread_create leaves the tasks to the existing workers
 * instead of spinning. mu is released and taken again. */
static bool service_spawn_locked(tp_pool *p) {
    tp__worker *w;
    pthread_t old;
    bool join_old = false;
    if (spawn_start_locked(p, &w, &old, &join_old) != TP_OK) return false;
    tp__unlock(p);
    int rc = spawn_finish(p, w, old, join_old);
    tp__lock(p);
    return rc == TP_OK;
}

static void *service_main(void *arg) {
    tp_pool *p = (tp_pool *)arg;
    tp__tls_pool = p;
    tp__tls_service = true;
    set_thread_name(p, "svc", UINT_MAX);
    bool tried_spawn = false; /* at most one spawn attempt between two waits */
    tp__lock(p);
    for (;;) {
        if (tp__life_endings_pending(&p->life)) {
            run_endings_locked(p);
            tried_spawn = false; /* mu was released: a wake for a spawn may have been missed */
            continue;
        }
        /* A due retry goes to the back of its lane: behind the staged tasks
         * too, which a worker leaves in the ring while the lane is deep
         * (stage.h, "When a worker admits"). */
        if (tp__life_delayed(&p->life) != 0) stage_absorb_all_locked(p);
        tp__fx fx = TP__FX_INIT(&p->misc);
        uint64_t next = tp__life_timers(&p->life, tp_now_ns(), &fx);
        fx.flags &= ~(unsigned)TP__FX_SVC; /* that is this thread */
        ACT_LOCKED(p, &fx);
        if (tp__life_endings_pending(&p->life)) continue;
        if (!tried_spawn && !tp__life_closed(&p->life) && want_spawn_locked(p)) {
            /* Only a failed spawn waits for the next wake-up before trying
             * again (no busy loop while threads cannot be made); after a
             * success the backlog may want another worker at once. */
            tried_spawn = !service_spawn_locked(p);
            continue; /* mu was released: look at everything again */
        }
        if (tp__life_closed(&p->life) && tp__life_inflight(&p->life) == 0) break;
        p->waiting.svc = true;
        p->waiting.svc_next = next; /* an earlier deadline admitted meanwhile wakes us */
        tp__mutex_wait(&p->mu, &p->svc_cv, next);
        p->waiting.svc = false;
        p->waiting.svc_next = TP_FOREVER;
        tried_spawn = false;
    }
    tp__unlock(p);
    return NULL;
}

/* ------------------------------------------------------------ staged submits */

/* A fair pool's admission of a staged entry reads and writes its user's
 * flow (the user entry's ending side, users.h), a line that a worker wrote
 * at that user's last start or end: while the oldest entry is admitted,
 * the next one's flow starts moving here, if that entry is published (its
 * producer then no longer writes it). A hint. */
static void stage_prefetch_next_flow(const tp__stage *st) {
    size_t h = atomic_load_explicit(&st->head, memory_order_relaxed); /* the oldest entry's ticket */
    const tp__stage_slot *n = &st->slots[(h + 1) & st->mask];
    if (atomic_load_explicit(&n->seq, memory_order_acquire) != h + 2) return;
    if (n->user) __builtin_prefetch(&n->user->flow, 1, 3);
}

/* Admit every published staged entry, oldest first (stage.h), mu held.
 * Every call that reads or changes the waiting tasks under mu calls this
 * first. A staged task that cannot have a record (out of memory) ends unrun
 * with TP_ENOMEM: it was accepted, has no id, counts as failed, and its
 * on_done, if it has one, gets TP_ENOMEM through its completion queue. */
static void stage_absorb_locked(tp_pool *p, unsigned max, bool worker) {
    tp__stage *st = &p->stage;
    if (!tp__stage_on(st)) return;
    tp__stage_slot *s = tp__stage_peek(st);
    if (!s) return;
    tp__fx fx = TP__FX_INIT(&p->misc);
    do {
        tp__admit_args a = p->stage_args;
        a.fn = s->fn;
        a.on_done = s->on_done;
        a.cq = s->cq;
        a.now = atomic_load_explicit(&s->now, memory_order_relaxed);
        a.join = s->join;
        /* Popped once admitted: a reader of the statistics that no longer
         * counts it in the ring counts it among the waiting tasks (stats.c
         * reads the ring first) or sees it started. */
        TP__ASSERT(a.fn != NULL);
        tp__stage_prefetch_ahead(st, s);
        if (!tp__stage_plain(st)) stage_prefetch_next_flow(st);
        int rc = tp__life_admit_staged(&p->life, &a, s->arg, s->user, &fx);
        TP__ASSERT(rc == TP_OK || rc == TP_ENOMEM); /* its records' cap covers it (pool.c) */
        if (rc != TP_OK) tp__life_staged_lost(&p->life, &a, s->arg, s->user, &fx);
        tp__stage_pop(st, s); /* the slot may be reused from here */
    } while (--max > 0 && (s = tp__stage_peek(st)) != NULL);
    /* A worker admitting at the top of its turn takes a task next, and then
     * wakes a sleeper itself if more is left (worker_main): none here, or
     * the task that woke it would wake a second worker for nothing. */
    if (worker) fx.work = 0;
    ACT_LOCKED(p, &fx);
}

/* life.h, admit_staged, mu held: the default lane is about to seem empty
 * while staged entries may wait behind it. Its oldest entry is admitted
 * (waited for on put if its submitter is handing it over): with one task
 * in the lane, the rest may stay in the ring, as they do behind any task
 * of the lane (stage.h). One, not the ring: a cancel or an expiry costs
 * what taskpool.h says, not a whole ring's admissions under the lock. */
static void admit_staged_locked(void *arg) {
    tp_pool *p = (tp_pool *)arg;
    tp__stage *st = &p->stage;
    if (tp__stage_count(st) == 0) return;
    if (!tp__stage_peek(st)) tp__stage_put_barrier(st); /* its submitter holds put */
    stage_absorb_locked(p, 1, false);
}

/* A fair pool's staged tasks. A fair pool stages only tasks with a user (as
 * a users pool's: the user has an entry, below its limit; pool.c sends every
 * other submit to the locked path), and the staged task must start where
 * its admission at the submit would have put it. Where a user stands in the
 * default lane's round decides which task starts next, so a staged task is
 * one of two kinds:
 *   - Its user is in the round and stays there until the task is admitted
 *     (the user's flag, users.h stage_ok, read by the submitter under put).
 *     Admitting it appends it to its user's flow and moves no user, so when
 *     it is admitted changes no start -- as for a FIFO pool's (stage.h), and
 *     the worker leaves it in the ring while the lane is deep. The submitter
 *     records its ticket in the user's entry (stage_last, on the line its
 *     lookup reads anyway).
 *   - Else it joins the round (tp__admit_args, `join`): the submitter stores
 *     its ticket in the ring's join_last, and a worker admits the ring before
 *     its next start (stage_joins_locked, from life.c's take). Every other
 *     change to the round also admits the ring first: a locked admission
 *     (stage_absorb_all_locked), a retry back from its delay (the service
 *     thread admits the ring before its timers); a removal only takes a user
 *     out, wherever the others stand -- but a removal of a user's last task
 *     there admits the ring first (life.c, before_unwait): a joining task
 *     of that user would have kept it in the round.
 * The flag is set under mu by an admission (a locked one, or a staged one
 * that joined) that finds the user's flow not empty (life.c, admit): a user
 * with one task at a time never has it, and costs nothing at its start. A
 * user leaves the round only when its last task there starts or leaves
 * unstarted; for a flagged user life.c calls stage_keep_locked first
 * (fair_leave), which under put either finds the user's newest staged ticket
 * not yet admitted (then the ring is admitted, and the task is no longer
 * the user's last), or clears the flag: a submit that holds put later joins,
 * one that held it before is in the ring below the tail read there. An
 * expiry scan, which removes many tasks at once, admits the ring before it,
 * and calls this for every flagged user that it took out of the round. So
 * the flag is set only while its user is in the round when mu is let go,
 * and staged tasks start in the order their admissions at submit would have
 * given. The worker reads the flag (the entry's first line) only for a user's
 * last task in the round, and join_last (a line of its own) at every
 * start. */
static bool stage_keep_locked(void *arg, tp__user *u) {
    tp_pool *p = (tp_pool *)arg;
    tp__stage *st = &p->stage;
    bool admitted = false;
    for (;;) {
        if (admitted && tp__flow_lane(&u->flow, tp__lane_of(0))->in_round) return true;
        tp__mutex_lock_spin(&st->put, TP__LOCK_TRIES); /* its holders hold it for a few stores */
        size_t tail = atomic_load_explicit(&st->tail, memory_order_relaxed);
        size_t head = atomic_load_explicit(&st->head, memory_order_relaxed);
        /* staged and not admitted: head < stage_last <= tail, in 32 bits
         * (the ring holds fewer than 2^31 entries) */
        uint32_t ahead = u->stage_last - (uint32_t)head;
        if (ahead == 0 || ahead > (uint32_t)(tail - head)) {
            atomic_store_explicit(&u->stage_ok, false, memory_order_relaxed);
            tp__mutex_unlock(&st->put);
            return admitted;
        }
        /* admitted below: a stale ticket (2^32 tickets old) reads as passed
         * from now on, so this loop ends */
        u->stage_last = (uint32_t)tail;
        tp__mutex_unlock(&st->put);
        stage_absorb_all_locked(p);
        admitted = true;
    }
}

/* life.h, stage_all: every staged entry claimed so far, mu held. */
static void stage_all_locked(void *arg) { stage_absorb_all_locked((tp_pool *)arg); }

/* life.h, stage_joins, mu held, before a start: if an entry that joins the
 * round may wait in the ring (its ticket at or above `head`), every entry
 * claimed so far is admitted. `join_last` is on a line of its own, written
 * only by such submits: a pool whose users stay in the round reads it here
 * without a miss. The tail bounds the look (a ticket 2^63 old, or 2^31 with
 * a 32-bit size_t, does not read as waiting). */
static void stage_joins_locked(void *arg) {
    tp_pool *p = (tp_pool *)arg;
    tp__stage *st = &p->stage;
    size_t last = atomic_load_explicit(&st->join_last, memory_order_acquire);
    if (tp__stage_passed(st, last)) return;
    size_t head = atomic_load_explicit(&st->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&st->tail, memory_order_acquire);
    if (last - head > tail - head) return;
    stage_absorb_all_locked(p);
}

/* Entries claimed and not yet consumed (published or not): a worker does
 * not park while there are some (see parking, and stage.h). */
static bool stage_pending(tp_pool *p) { return tp__stage_count(&p->stage) != 0; }

/* A submit published while a worker may be parked: wake one, unless one
 * spins (it looks at the ring itself). */
static void stage_wake(tp_pool *p) {
    tp__lock(p);
    tp__worker *wake = !p->waiting.spin && p->waiting.idle ? unpark_take_locked(p) : NULL;
    tp__unlock(p);
    if (wake) sem_post(&wake->wake);
}

/* Give back the places a staged submit took and did not use. */
static void stage_give_back(tp_pool *p, tp_cq *cq) {
    tp__life_room_give(&p->life);
    if (cq) tp__cq_release(cq, 1);
}

int tp__engine_submit_staged(tp_pool *p, tp_fn fn, void *arg, tp_done_fn on_done, tp_cq *cq, uint64_t now,
                             bool wait) {
    tp__stage *st = &p->stage;
    if (atomic_load_explicit(&st->closing, memory_order_acquire)) return TP__STAGE_LOCKED;
    if (!tp__life_room_live(&p->life)) { /* the pool's first staged submit: once */
        tp__lock(p);
        tp__life_room_start(&p->life);
        tp__unlock(p);
    }
    /* The places as the locked admission takes them (life.c, admit): a look
     * at the room, the completion queue's, then the room's. */
    bool full = tp__life_room_full(&p->life);
    if (!full && cq && !tp__cq_reserve(cq)) full = true;
    if (!full && !tp__life_room_take(&p->life)) {
        if (cq) tp__cq_release(cq, 1);
        full = true;
    }
    if (full) {
        if (wait) return TP__STAGE_LOCKED; /* the locked path waits for a place */
        /* counted as pool.c's lock-free refusals are (pool.h, fast_full) */
        atomic_fetch_add_explicit(&p->fast_full, 1, memory_order_release);
        return TP_EFULL;
    }
    tp__mutex_lock(&st->put);
    size_t ticket;
    tp__stage_slot *s = NULL;
    /* Under put: the closer either read a tail above this ticket or set
     * the flag before this submit took put (stage.h, closing). */
    if (!atomic_load_explicit(&st->closing, memory_order_relaxed)) s = tp__stage_claim(st, &ticket);
    if (!s) { /* closing, or the ring is full: the locked path decides */
        tp__mutex_unlock(&st->put);
        stage_give_back(p, cq);
        return TP__STAGE_LOCKED;
    }
#if defined(TP__DEBUG)
    tp__test_hook hook = atomic_load_explicit(&tp__test_stage_claimed, memory_order_acquire);
    if (hook) hook(p);
#endif
    /* Accepted: counted before it is published, so no reader sees it start
     * before it was accepted. Written under put only: a store, not a
     * read-modify-write. */
    atomic_store_explicit(&st->staged, atomic_load_explicit(&st->staged, memory_order_relaxed) + 1,
                          memory_order_release);
    tp__stage_publish(s, ticket, fn, arg, on_done, cq, NULL, false, now);
    /* The next ticket's slot, which a worker gave back last (its cache
     * holds it): fetched for writing now, it arrives while this submitter
     * goes on, not while the next one holds put. A hint only. */
    __builtin_prefetch(&st->slots[(ticket + 1) & st->mask], 1, 3);
    /* Read under put: a worker that counted itself before this submit took
     * put is seen here (stage.h, waking). */
    bool sleepers = atomic_load_explicit(&st->sleepers, memory_order_relaxed) != 0;
    tp__mutex_unlock(&st->put);
    if (sleepers) stage_wake(p);
    return TP_OK;
}

int tp__engine_submit_staged_user(tp_pool *p, void *arg, const tp__admit_args *a) {
    tp__stage *st = &p->stage;
    if (!p->life.users_put || atomic_load_explicit(&st->closing, memory_order_acquire))
        return TP__STAGE_LOCKED;
    if (!tp__life_room_live(&p->life)) { /* the pool's first staged submit: once */
        tp__lock(p);
        tp__life_room_start(&p->life);
        tp__unlock(p);
    }
    tp__life_prefetch(&p->life, a); /* the entry, before put is held */
    /* Everything under put, in the locked admission's order: closed, the
     * user's limit (a user near it goes the locked way, which answers
     * TP_EUSERLIMIT), space, the completion queue's place, then the slot
     * (life.h, users_put). Places taken and not used are given back once
     * put is let go (its holder takes no other lock: a queue's may wake). */
    tp__mutex_lock(&st->put);
    int rc = TP__STAGE_LOCKED;
    bool give_room = false, give_cq = false;
    tp__stage_slot *s = NULL;
    tp__user *u = NULL;
    size_t ticket;
    if (atomic_load_explicit(&st->closing, memory_order_relaxed) || !(u = tp__life_user_below(&p->life, a)))
        goto out;
    bool full = tp__life_room_full(&p->life);
    if (!full && a->cq && !tp__cq_reserve(a->cq)) full = true;
    if (!full && !tp__life_room_take(&p->life)) {
        give_cq = a->cq != NULL;
        full = true;
    }
    if (full) {
        atomic_fetch_add_explicit(&p->fast_full, 1, memory_order_release); /* as a plain staged submit's */
        rc = TP_EFULL;
        goto out;
    }
    s = tp__stage_claim(st, &ticket);
    if (!s) { /* the ring is full: the locked path admits it first */
        give_room = true;
        give_cq = a->cq != NULL;
        goto out;
    }
#if defined(TP__DEBUG)
    tp__test_hook hook = atomic_load_explicit(&tp__test_stage_claimed, memory_order_acquire);
    if (hook) hook(p);
#endif
    tp__life_user_take_staged(&p->life, u, a); /* looked at above, under put */
    /* A fair pool's (see "A fair pool's staged tasks"): a user not known to
     * be in the round joins it when this task is admitted, which a worker
     * does before its next start (join_last); one in it stays there while
     * this task waits here (stage_last). */
    bool join = p->life.stage_keep && !atomic_load_explicit(&u->stage_ok, memory_order_relaxed);
    u->stage_last = (uint32_t)(ticket + 1);
    if (join) atomic_store_explicit(&st->join_last, ticket + 1, memory_order_release);
    /* accepted, and counted before published (as tp__engine_submit_staged's) */
    atomic_store_explicit(&st->staged, atomic_load_explicit(&st->staged, memory_order_relaxed) + 1,
                          memory_order_release);
    tp__stage_publish(s, ticket, a->fn, arg, a->on_done, a->cq, u, join, a->now);
    __builtin_prefetch(&st->slots[(ticket + 1) & st->mask], 1, 3);
    rc = TP_OK;
out:;
    bool sleepers = rc == TP_OK && atomic_load_explicit(&st->sleepers, memory_order_relaxed) != 0;
    tp__mutex_unlock(&st->put);
    if (give_room) tp__life_room_give(&p->life);
    if (give_cq) tp__cq_release(a->cq, 1);
    if (sleepers) stage_wake(p);
    return rc;
}

/* The on_done and completion queue of task i of a staged batch. */
static void batch_done_of(const tp_task *tasks, const tp__admit_args *a, size_t nchecked, size_t i,
                          tp_done_fn *on_done, tp_cq **cq) {
    if (i < nchecked) {
        *on_done = a[i].on_done;
        *cq = a[i].cq;
    } else {
        const tp_task_opts *o = tasks[i].opts;
        *on_done = o ? o->on_done : NULL;
        *cq = o ? o->cq : NULL;
    }
}

int tp__engine_submit_staged_batch(tp_pool *p, const tp_task *tasks, size_t valid, const tp__admit_args *a,
                                   size_t nchecked, size_t *k_out) {
    tp__stage *st = &p->stage;
    *k_out = 0;
    if (atomic_load_explicit(&st->closing, memory_order_acquire)) return TP__STAGE_LOCKED;
    if (!tp__life_room_live(&p->life)) {
        tp__lock(p);
        tp__life_room_start(&p->life);
        tp__unlock(p);
    }
    /* More tasks than the ring has slots: the locked path, before any
     * place is taken. */
    if (valid > st->mask + 1) return TP__STAGE_LOCKED;
    uint64_t now = tp__hclk_now(); /* one queue-wait stamp for the batch */
    /* The places, as a single submit takes them (a look at the pool's, the
     * completion queue's, then the pool's): the tasks that the look leaves
     * room for reserve their queues' places up to the first refused one;
     * the pool's places are taken for those; the queue places beyond what
     * the pool gave go back. The first task without both is refused. */
    unsigned want = (unsigned)valid, got = 0, bound = 0;
    unsigned room = tp__life_room_free(&p->life);
    if (want > room) want = room;
    for (; bound < want; bound++) {
        tp_done_fn on_done;
        tp_cq *cq;
        batch_done_of(tasks, a, nchecked, bound, &on_done, &cq);
        if (cq && !tp__cq_reserve(cq)) break;
    }
    if (bound > 0) got = tp__life_room_take_n(&p->life, bound);
    for (unsigned i = got; i < bound; i++) {
        tp_done_fn on_done;
        tp_cq *cq;
        batch_done_of(tasks, a, nchecked, i, &on_done, &cq);
        if (cq) tp__cq_release(cq, 1);
    }
    bool cut = got < valid;
    bool staged = false;
    size_t pos = 0;
    if (got > 0) {
        tp__mutex_lock(&st->put);
        pos = atomic_load_explicit(&st->tail, memory_order_relaxed);
        /* Slots are given back in ticket order: the last one free, all are.
         * Under put, as tp__stage_claim (closing: see there). */
        staged = !atomic_load_explicit(&st->closing, memory_order_relaxed) &&
                 atomic_load_explicit(&st->slots[(pos + got - 1) & st->mask].seq, memory_order_acquire) ==
                     pos + got - 1;
        if (!staged) tp__mutex_unlock(&st->put);
    }
    if (got > 0 && !staged) { /* closing, or too few slots: the locked path decides, for all */
        for (unsigned i = 0; i < got; i++) {
            tp_done_fn on_done;
            tp_cq *cq;
            batch_done_of(tasks, a, nchecked, i, &on_done, &cq);
            if (cq) tp__cq_release(cq, 1);
        }
        tp__life_room_give_n(&p->life, got);
        return TP__STAGE_LOCKED;
    }
    if (got > 0) {
        atomic_store_explicit(&st->tail, pos + got, memory_order_release);
#if defined(TP__DEBUG)
        tp__test_hook hook = atomic_load_explicit(&tp__test_stage_claimed, memory_order_acquire);
        if (hook) hook(p);
#endif
        /* accepted, and counted before published (as a single one) */
        atomic_store_explicit(&st->staged, atomic_load_explicit(&st->staged, memory_order_relaxed) + got,
                              memory_order_release);
        for (unsigned i = 0; i < got; i++) {
            tp_done_fn on_done;
            tp_cq *cq;
            batch_done_of(tasks, a, nchecked, i, &on_done, &cq);
            tp__stage_publish(&st->slots[(pos + i) & st->mask], pos + i, tasks[i].fn, tasks[i].arg, on_done,
                              cq, NULL, false, now);
        }
        bool sleepers = atomic_load_explicit(&st->sleepers, memory_order_relaxed) != 0;
        tp__mutex_unlock(&st->put);
        if (sleepers) stage_wake(p);
    }
    *k_out = got;
    if (!cut) return TP_OK;
    atomic_fetch_add_explicit(&p->fast_full, 1, memory_order_release); /* task `got`: no place */
    return TP_EFULL;
}

/* A locked submit admits every entry whose ticket was taken before it
 * (stage.h): one thread's tasks keep their order across the two paths. An
 * entry not yet published (its submitter holds put, between its ticket and
 * its store) is waited for on put. Entered and left with mu held. */
static void stage_absorb_all_locked(tp_pool *p) {
    tp__stage *st = &p->stage;
    if (!tp__stage_on(st)) return;
    size_t tail = atomic_load_explicit(&st->tail, memory_order_acquire);
    stage_absorb_locked(p, UINT_MAX, false);
    if (tp__stage_passed(st, tail)) return;
    tp__stage_put_barrier(st);
    stage_absorb_locked(p, UINT_MAX, false);
    TP__ASSERT(tp__stage_passed(st, tail));
}

/* A closing pool stages nothing more: every ticket taken before the flag
 * was seen is admitted before the pool closes (stage.h), mu held. */
static void stage_close_locked(tp_pool *p) {
    tp__stage *st = &p->stage;
    if (!tp__stage_on(st) || atomic_load_explicit(&st->closing, memory_order_relaxed)) return;
    atomic_store_explicit(&st->closing, true, memory_order_release);
    /* after this, every submit that did not see the flag has published */
    tp__mutex_lock(&st->put);
    size_t tail = atomic_load_explicit(&st->tail, memory_order_relaxed);
    tp__mutex_unlock(&st->put);
    stage_absorb_locked(p, UINT_MAX, false);
    TP__ASSERT(tp__stage_passed(st, tail));
    (void)tail;
}

/* ------------------------------------------------------------ admission */

static void count_reject_locked(tp_pool *p, int rc) {
    switch (rc) {
    case TP_ECLOSED: TP__INC(p->calls.rejected_closed); break;
    case TP_EUSERLIMIT: TP__INC(p->calls.rejected_user); break;
    case TP_ETIMEDOUT: TP__INC(p->calls.rejected_timeout); break;
    default: TP__INC(p->calls.rejected_full); break; /* TP_EFULL, TP_ENOMEM */
    }
}

/* Wait for a place of `cq` (mu held on entry and return, released while
 * waiting), until one may be free, the pool closes or `deadline`. */
static void wait_cq_place_locked(tp_pool *p, tp_cq *cq, uint64_t deadline) {
    tp__cq_waiter cw = {cq, false, p->cq_waiters, NULL};
    if (p->cq_waiters) p->cq_waiters->prev = &cw;
    p->cq_waiters = &cw;
    tp__cq_wait_place_begin(&cw); /* the queue's lock, under the pool's (pool.h) */
    tp__unlock(p);
    tp__cq_wait_place(&cw, deadline);
    tp__cq_wait_place_end(&cw);
    tp__lock(p);
    if (cw.prev)
        cw.prev->next = cw.next;
    else
        p->cq_waiters = cw.next;
    if (cw.next) cw.next->prev = cw.prev;
}

int tp__engine_submit(tp_pool *p, tp__admit_args *a, void *arg, uint64_t *id_out, bool wait,
                      uint64_t deadline) {
    /* The admission stamp of the queue-wait histogram (clock.h): taken
     * before the lock, not under it. A waiting submit takes it under the
     * lock each turn, after its budget check (which covers the lock
     * acquisition). */
    a->now = wait ? 0 : tp__hclk_now();
    /* With many users, their entries are not in this CPU's cache: fetched
     * now, they are usually here by the time the lock is held, where every
     * miss makes the workers wait longer for it. */
    tp__life_prefetch(&p->life, a);
    tp__lock_spin(p);                      /* pool.h */
    stage_absorb_all_locked(p);            /* staged submits come first (stage.h) */
    if (a->group && a->group->cancelled) { /* a cancelled group: counts nothing */
        tp__unlock(p);
        return TP_ECANCELED;
    }
    TP__INC(p->calls.submitted);
    int rc;
    tp__fx fx = TP__FX_INIT(&p->misc);
    for (;;) {
        if (tp__life_closed(&p->life)) {
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
        rc = tp__life_admit(&p->life, a, arg, id_out, &fx);
        if (!wait || (rc != TP_EFULL && rc != TP__EFULL_CQ && rc != TP_EUSERLIMIT)) break;
        if (tp__tls_service && tp__tls_pool == p) {
            /* An on_done on this pool's service thread: waiting would stall
             * the retry timers and endings that may be what frees room. */
            rc = TP_ETIMEDOUT;
            break;
        }
        if (rc == TP__EFULL_CQ) {
            wait_cq_place_locked(p, a->cq, deadline);
        } else {
            p->waiting.room++;
            tp__mutex_wait(&p->mu, &p->room_cv, deadline); /* the loop re-checks closed and the budget */
            p->waiting.room--;
        }
        /* What was staged while this submit waited (a worker leaves the ring
         * alone while the lane is deep) came first: admitted before it. */
        stage_absorb_all_locked(p);
    }
    if (rc == TP__EFULL_CQ) rc = TP_EFULL;
    spawn sp = {NULL, 0, false};
    if (rc == TP_OK)
        spawn_if_wanted_locked(p, &sp);
    else
        count_reject_locked(p, rc);
    /* The worker this task wakes, if one is parked, is posted after mu is
     * released: it then finds mu free (see parking). */
    tp__worker *wake = NULL;
    if (fx.work && !p->waiting.spin && p->waiting.idle && (wake = unpark_take_locked(p)) != NULL) fx.work--;
    ACT_LOCKED(p, &fx);
    tp__unlock(p);
    if (wake) sem_post(&wake->wake);
    spawn_run(p, &sp);
    return rc;
}

int tp__engine_submit_batch(tp_pool *p, const tp_task *tasks, size_t valid, tp__admit_args *a,
                            size_t nchecked, uint64_t *ids_out, size_t *k_out) {
    /* The queue wait of every task starts now: one stamp for the batch. */
    uint64_t now = tp__hclk_now();
    for (size_t i = 0; i < nchecked; i++) a[i].now = now;
    size_t k = 0;
    int rc = TP_OK;
    tp__fx fx = TP__FX_INIT(&p->misc);
    tp__lock(p);
    stage_absorb_all_locked(p); /* staged submits come first (stage.h) */
    for (; k < valid; k++) {
        tp__admit_args spare;
        const tp__admit_args *ak = &spare;
        if (k < nchecked) {
            ak = &a[k];
        } else {
            (void)tp__life_args(&p->life, tasks[k].fn, tasks[k].opts, &spare); /* passed before */
            spare.now = now;
        }
        TP__INC(p->calls.submitted);
        rc = tp__life_closed(&p->life)
                 ? TP_ECLOSED
                 : tp__life_admit(&p->life, ak, tasks[k].arg, ids_out ? &ids_out[k] : NULL, &fx);
        if (rc != TP_OK) {
            if (rc == TP__EFULL_CQ) rc = TP_EFULL;
            count_reject_locked(p, rc);
            break;
        }
    }
    spawn sp = {NULL, 0, false};
    if (k > 0) spawn_if_wanted_locked(p, &sp);
    ACT_LOCKED(p, &fx);
    tp__unlock(p);
    spawn_run(p, &sp);
    *k_out = k;
    return rc;
}

/* ------------------------------------------------------------ cancel, close, shutdown */

int tp__engine_cancel(tp_pool *p, uint64_t id) {
    tp__fx fx = TP__FX_INIT(&p->misc);
    tp__lock(p);
    int rc = tp__life_cancel(&p->life, id, &fx);
    ACT_LOCKED(p, &fx);
    tp__unlock(p);
    return rc;
}

static void close_locked(tp_pool *p) {
    if (tp__life_closed(&p->life)) return;
    stage_close_locked(p);
    tp__fx fx = TP__FX_INIT(&p->misc);
    tp__life_close(&p->life, &fx);
    ACT_LOCKED(p, &fx);
    pthread_cond_broadcast(&p->room_cv); /* a close wakes every waiting submitter at once */
    unpark_all_locked(p);
    for (tp__cq_waiter *cw = p->cq_waiters; cw; cw = cw->next) tp__cq_wake_closed(cw);
}

void tp__engine_close(tp_pool *p) {
    tp__lock(p);
    close_locked(p);
    tp__unlock(p);
}

int tp__engine_shutdown(tp_pool *p, uint64_t budget_ns) {
    tp__lock(p);
    close_locked(p);
    if (p->shut.state == TP__SHUT_NONE) {
        p->shut.state = TP__SHUT_RUNNING;
        p->shut.deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->cfg.drain_timeout);
    }
    while (p->shut.state == TP__SHUT_RUNNING) {
        if (tp__life_inflight(&p->life) == 0) {
            p->shut.state = TP__SHUT_OK;
        } else if (p->shut.deadline != TP_FOREVER && tp_now_ns() >= p->shut.deadline) {
            p->shut.state = TP__SHUT_FORCED;
            tp__fx fx = TP__FX_INIT(&p->misc);
            tp__life_force(&p->life, &fx);
            ACT_LOCKED(p, &fx);
        } else {
            tp__mutex_wait(&p->mu, &p->done_cv, p->shut.deadline);
            continue;
        }
        pthread_cond_broadcast(&p->done_cv); /* the other shutdown callers */
    }
    int rc = p->shut.state == TP__SHUT_OK ? TP_OK : TP_ETIMEDOUT;
    tp__unlock(p);
    return rc;
}

/* Everything accepted has ended and every worker thread is gone. */
static bool finished_locked(const tp_pool *p) {
    return tp__life_closed(&p->life) && tp__life_inflight(&p->life) == 0 && p->wk.threads == 0;
}

int tp__engine_wait(tp_pool *p, uint64_t timeout_ns) {
    uint64_t deadline = timeout_ns == 0 ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__lock(p);
    while (!finished_locked(p)) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__mutex_wait(&p->mu, &p->done_cv, deadline);
    }
    if (rc == TP_OK && p->shut.state == TP__SHUT_FORCED) rc = TP_ETIMEDOUT;
    tp__unlock(p);
    return rc;
}

/* ------------------------------------------------------------ start, stop */

/* Join every worker thread that was started, and the service thread. */
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

void tp__engine_join(tp_pool *p) {
    (void)tp__engine_wait(p, TP_FOREVER);
    join_all(p);
    tp__life_groups_detach(&p->life); /* groups that outlive their pool (taskpool.h) */
}

/* How far make_sync got, for tp__engine_free. */
static int make_sync(tp_pool *p) {
    /* A plain mutex, not an adaptive one (base.h, tp__mutex_init): the
     * workers meet on mu, and a waiter that spins takes a CPU that a
     * submitter or the holder itself needs whenever the pool has more
     * threads than CPUs (docs/performance.md, "1.2 on a fifth machine").
     * The takings that spin a bounded while all the same: pool.h,
     * TP__LOCK_TRIES. */
    if (tp__mutex_init(&p->mu, false) != 0) return -1;
    pthread_cond_t *cvs[3] = {&p->room_cv, &p->done_cv, &p->svc_cv};
    int n = 0;
    while (n < 3 && tp__cond_init(cvs[n]) == 0) n++;
    unsigned i = 0;
    if (n == 3)
        for (; i < p->cfg.max_workers; i++) {
            if (sem_init(&p->wk.workers[i].wake, 0, 0) != 0) break;
            if (tp__ctx_init(&p->wk.workers[i].ctx, &p->mu) != 0) {
                sem_destroy(&p->wk.workers[i].wake);
                break;
            }
        }
    if (n == 3 && i == p->cfg.max_workers) return 0;
    while (i-- > 0) {
        tp__ctx_fini(&p->wk.workers[i].ctx);
        sem_destroy(&p->wk.workers[i].wake);
    }
    while (n-- > 0) pthread_cond_destroy(cvs[n]);
    tp__mutex_destroy(&p->mu);
    return -1;
}

/* The function of the staged tasks' argument template (never called: each
 * staged task brings its own). */
static int stage_template_fn(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 0;
}

int tp__engine_start(tp_pool *p) {
    p->waiting.svc_next = TP_FOREVER;
    p->shut.deadline = TP_FOREVER;
    p->wk.workers = (tp__worker *)tp__calloc_big(p->cfg.max_workers, sizeof(tp__worker), &p->wk.workers_mem);
    p->wk.hist = tp__hist_alloc(p->cfg.max_workers); /* the latency histograms: one shard per slot */
    p->wk.runs = (tp__st_runs *)tp__calloc_big(p->cfg.max_workers, sizeof(tp__st_runs), &p->wk.runs_mem);
    if (!p->wk.workers || !p->wk.hist || !p->wk.runs) return TP_ENOMEM;
    /* Staged submits (stage.h): a pool whose workers are all started up
     * front (a submit may otherwise have to start one, under mu); in a fair
     * pool, only tasks with a user ("A fair pool's staged tasks"). */
    bool staging = p->cfg.min_workers == p->cfg.max_workers;
    if (tp__stage_init(&p->stage, p->cfg.capacity, staging) != TP_OK) return TP_ENOMEM;
    p->stage.plain = staging && p->cfg.sched != TP_SCHED_FAIR;
    if (staging) {
        /* every staged task's arguments but fn and the stamp: no options,
         * and no log id inherited (a submit that has one is not staged) */
        (void)tp__life_args(&p->life, stage_template_fn, NULL, &p->stage_args);
        p->life.users_put = &p->stage.put;          /* user slots taken under put too (life.h) */
        p->life.admit_staged = admit_staged_locked; /* before the default lane seems empty (life.h) */
        p->life.admit_staged_arg = p;
        if (p->cfg.sched == TP_SCHED_FAIR) {
            p->life.stage_keep = stage_keep_locked;   /* before a flagged user leaves the round */
            p->life.stage_all = stage_all_locked;     /* before an expiry scan */
            p->life.stage_joins = stage_joins_locked; /* before a start */
        }
        p->life.users.split = true; /* and given back under mu and put (users.h) */
        p->stage_args.log_src = NULL;
        p->stage_args.log_len = 0;
    }
    for (unsigned i = 0; i < p->cfg.max_workers; i++) {
        p->wk.workers[i].pool = p;
        p->wk.workers[i].index = i;
    }
    if (make_sync(p) != 0) return TP_ENOMEM;
    p->wk.synced = true;
    int rc = TP_OK;
    tp__lock(p);
    p->svc.started = pthread_create(&p->svc.thread, NULL, service_main, p) == 0;
    if (!p->svc.started) rc = TP_ENOMEM;
    tp__unlock(p);
    /* min_workers workers, each reserved under the lock like an elastic one */
    for (unsigned i = 0; rc == TP_OK && i < p->cfg.min_workers; i++) {
        spawn sp = {NULL, 0, false};
        tp__lock(p);
        spawn_start_locked(p, &sp.w, &sp.old, &sp.join_old);
        tp__unlock(p);
        rc = spawn_finish(p, sp.w, sp.old, sp.join_old);
    }
    /* The start gate (worker_enter): open once all exist, or failed */
    tp__lock(p);
    p->wk.gate = rc == TP_OK ? TP__GATE_OPEN : TP__GATE_FAILED;
    pthread_cond_broadcast(&p->done_cv);
    if (rc == TP_OK) {
        tp__unlock(p);
        return TP_OK;
    }
    /* Unwind through the normal close path so that the threads already
     * started exit: closed before a gated worker can look, so it runs no
     * hook and no task; the wait is for no user code. */
    close_locked(p);
    while (p->wk.threads > 0)
        tp__mutex_wait(&p->mu, &p->done_cv, TP_FOREVER); /* then no thread writes w->state */
    tp__unlock(p);
    join_all(p);
    return TP_ENOMEM;
}

void tp__engine_free(tp_pool *p) {
    if (p->wk.synced) {
        for (unsigned i = 0; i < p->cfg.max_workers; i++) {
            tp__ctx_fini(&p->wk.workers[i].ctx);
            sem_destroy(&p->wk.workers[i].wake);
        }
        pthread_cond_destroy(&p->svc_cv);
        pthread_cond_destroy(&p->done_cv);
        pthread_cond_destroy(&p->room_cv);
        tp__mutex_destroy(&p->mu);
        p->wk.synced = false;
    }
    tp__stage_fini(&p->stage);
    free(p->wk.workers_mem);
    p->wk.workers = NULL;
    tp__hist_free(p->wk.hist);
    p->wk.hist = NULL;
    free(p->wk.runs_mem);
    p->wk.runs_mem = NULL;
    p->wk.runs = NULL;
}
