/*
 * pool.h -- the pool object, the engine's calls, and the map of src/.
 *
 * Files, by layer (top to bottom). A file calls only tp__ functions of files
 * in lower layers, never of its own layer or above; tests/check_layers.sh
 * checks it on the built library.
 *
 *   0  compat.c   the 1.0 entry points of the calls whose structs grew
 *                 (shared library only; public calls only)
 *   1  group.c    task groups: the group object and its waiters
 *      metrics.c  tp_metrics_format, through the public reads
 *      default.c  the process-wide default pool (public calls only)
 *   2  pool.c     the public calls of a pool: the resolved configuration,
 *                 argument checks, then the engine
 *      stats.c    tp_stats_get, tp_lane_stats_get, tp_user_active,
 *                 tp_stats_format
 *   3  engine.c   the pool's threads and its lock: worker loop, service
 *                 loop, spawning, every wait, and the wake-ups that life.c's
 *                 transitions call for
 *   4  life.c     the task's life as a state machine (no threads)
 *   5  scheduler.c the waiting tasks and which starts next (no threads)
 *      cq.c       completion queues
 *      ctx.c      the task context, log ids, logging, thread-locals
 *      tasks.c    task records and the id index
 *      users.c    per-user slots and weights
 *      hist.c     latency histograms: bounds, snapshots, quantiles
 *   6  clock.c    tp_now_ns and the histograms' clock
 *      error.c    error table, tp_strerror, version, tp__assert_fail
 *      text.c     tp__put: snprintf into a running position
 * Headers: base.h (asserts, atomics, the lock wrapper, chunks), stats.h,
 * task.h, scheduler.h + ring.h, users.h, cq.h, ctx.h, life.h, group.h, hist.h,
 * clock.h, stage.h (the staged submits' ring, inline, used by engine.c), and
 * this one.
 *
 * A plain submit on a FIFO pool with fixed workers (no options but an
 * on_done bound to a completion queue, no id asked) takes no lock: pool.c -> engine.c stages it (stage.h), and the next
 * holder of mu admits it through life.c before anything else. So does one
 * with a user in a fair pool with fixed workers (engine.c, "A fair pool's
 * staged tasks").
 *
 * A task's way, submit to on_done, on the worker side: engine.c (the worker
 * loop) -> life.c (take, attempt ended, retire) -> scheduler.c (peek, start).
 *
 * Who owns what. Each struct says which file writes each part; other files
 * read only what is said to be readable (the configuration, the statistics,
 * the histogram shards, and the inline queries of life.h).
 *
 * Locking
 *   One mutex per pool, `mu`, guards everything in the pool except the
 *   statistics and the lanes' published figures (atomics, written under mu,
 *   read without it), the admission word and the published waiting count (life.c, likewise), `fast_full`
 *   (added to without the lock by refused submitters), life.c's room count
 *   (`room_taken` and `room_back`: taken and given back without the lock by staged submits; sched.given under mu), the staged submits' ring
 *   (stage.h: producers without mu, its consumer under mu), the histogram shards
 *   (each written by its worker alone) and a running task's context flag
 *   (written under mu, read by the task). A function whose name ends in
 *   `_locked` needs mu held (asserted in debug builds); where it releases it
 *   around user code it says so.
 *   Lock order: the default-pool registry lock (default.c) before a pool lock
 *   (tp_default_create -> tp_create), never inside one; a pool lock before a
 *   completion queue's lock (cq.h), never the other way; no pool lock is held
 *   while calling user code (task functions, on_done, the log hook, worker
 *   hooks) or while taking another pool's lock.
 *   Idle workers sleep on a semaphore each (engine.c: parking), not on a
 *   condition variable. Condition variables, all on mu, all CLOCK_MONOTONIC:
 *   room_cv (tp_submit_wait), done_cv (shutdown, wait; the start gate of
 *   the workers tp_create spawns), svc_cv (the service
 *   thread), each context's sleep_cv (ctx.c: tp_ctx_sleep), each
 *   group's cv (group.c waits, engine.c wakes). Waits for a completion
 *   queue's place are on that queue's own lock and condition (cq.h).
 *   The staged submits' ring (stage.h) is a two-lock queue: its put lock
 *   (stage.put) comes after mu, and its holder takes no other lock; staged
 *   submitters hold put alone, only a holder of mu consumes the ring, and a
 *   holder of mu takes put only to wait for a submit mid-way, to look at
 *   or change the user table, which put guards too in a pool that stages
 *   (life.h, users_put), or to clear a user's stage_ok in a fair pool
 *   (engine.c, stage_keep_locked). A submitter that must wake a parked worker takes
 *   mu after releasing put.
 */
#ifndef TP_POOL_H
#define TP_POOL_H

#include "base.h"
#include "ctx.h"
#include "hist.h"
#include "life.h"
#include "stage.h"
#include "stats.h"

/* The resolved configuration: pool.c writes it in tp_create, read-only after. */
typedef struct tp__config {
    unsigned min_workers, max_workers, capacity, max_per_user, max_retries;
    unsigned sched, starve_limit, low_max;
    uint64_t run_timeout, submit_timeout, drain_timeout, idle_timeout, retry_delay, retry_delay_max;
    tp_log_fn log;
    void *log_arg;
    void (*on_worker_start)(void *);
    void (*on_worker_stop)(void *);
    void *hook_arg;
    char name[TP_NAME_MAX + 1];
    uint32_t serial; /* process-unique pool number, for generated log ids */
} tp__config;

enum { TP__W_FREE = 0, TP__W_LIVE, TP__W_DEAD };

/* A worker slot (engine.c). */
/* A worker slot: its own cache lines (each worker writes its slot per task). */
typedef struct tp__worker {
    _Alignas(64) struct tp_pool *pool;
    pthread_t thread;
    int state; /* TP__W_*: FREE never started, DEAD exited and joinable */
    unsigned index;
    tp__task *cur;     /* the running task, NULL between tasks */
    struct tp_ctx ctx; /* ctx.c's */
    /* Parking (engine.c): an idle worker sleeps on its own semaphore, on
     * the pool's stack of parked workers (wk.parked); `parked` and
     * `park_next` under mu. */
    sem_t wake;
    bool parked;
    struct tp__worker *park_next;
} tp__worker;

enum { TP__SHUT_NONE = 0, TP__SHUT_RUNNING, TP__SHUT_OK, TP__SHUT_FORCED };

/* The start gate (engine.c, worker_enter): closed while tp_create spawns
 * its workers, then open, or failed if one could not be made. */
enum { TP__GATE_CLOSED = 0, TP__GATE_OPEN, TP__GATE_FAILED };

struct tp_pool {
    /* One cache line (without debug fields): the lock, and who waits --
     * read by every submit and start, written only when a thread goes to
     * sleep or wakes (engine.c, under mu). */
    _Alignas(64) tp__mutex mu;
    struct tp__waiters {
        unsigned idle;     /* workers parked or woken but not yet running (engine.c) */
        unsigned spin;     /* idle workers polling for work before they wait (0 or 1) */
        unsigned room;     /* tp_submit_wait callers in room_cv */
        bool svc;          /* the service thread is in svc_cv */
        uint64_t svc_next; /* when the waiting service thread wakes by itself */
    } waiting;
    pthread_cond_t room_cv, done_cv, svc_cv; /* see Locking above */

    tp__config cfg; /* pool.c, read-only after tp_create */
    tp__life life;  /* life.c: the tasks, under mu */

    /* engine.c: worker slots and thread counts, under mu */
    struct tp__workers {
        tp__worker *workers;   /* max_workers slots (in workers_mem) */
        void *workers_mem;     /* what to free for workers */
        unsigned live_workers; /* workers counted in stats.workers */
        unsigned starting;     /* spawned threads that have not yet taken mu */
        unsigned threads;      /* worker threads not yet finished (incl. stop hook) */
        int gate;              /* TP__GATE_*: may a worker tp_create spawned run its start hook (engine.c) */
        tp__worker *parked;    /* idle workers asleep, the last to park on top (engine.c) */
        tp__hist_shard *hist;  /* max_workers shards: slot i's worker is the only writer of hist[i] */
        tp__st_runs
            *runs; /* max_workers counter sets (stats.h): slot i's worker is the only writer of runs[i] */
        void *runs_mem; /* what to free for runs */
        bool synced;    /* the lock, the conditions and the contexts are made */
    } wk;

    /* engine.c: the service thread, under mu */
    struct tp__service {
        bool started; /* `thread` is joinable */
        pthread_t thread;
    } svc;

    /* engine.c: shutdown and waiting submitters, under mu */
    struct tp__shutdown {
        int state;         /* TP__SHUT_* */
        uint64_t deadline; /* fixed by the first tp_shutdown */
    } shut;
    tp__cq_waiter *cq_waiters; /* tp_submit_wait callers waiting for a completion queue's place */

    /* statistics (stats.h): atomics written under mu, each set on its own
     * cache line; the worker slots' sets are in wk.runs */
    tp__st_calls calls;   /* engine.c (submitted, rejected_*), life.c (accepted) */
    tp__st_gauges gauges; /* life.c (delayed, users), engine.c (workers, idle) */
    tp__st_runs misc;     /* starts and endings counted by threads that are not workers */
    /* Submits refused without the lock: by tp__life_full_fast (pool.c) or a
     * staged submit that found no room or no completion queue place
     * (engine.c). Each
     * counts in both submitted and rejected_full (tp_stats_get adds it in).
     * A read-modify-write, as no lock orders the writers; its own cache line,
     * which only refused submitters write. */
    _Alignas(64) _Atomic uint64_t fast_full;

    /* engine.c: staged submits (stage.h), with the arguments every staged
     * task is admitted with (no options, read-only after start). */
    tp__stage stage;
    tp__admit_args stage_args;

    void *mem; /* what calloc returned: the pool is aligned to a cache line within it (pool.c) */
};

/* ---- the lock (for pool.c, stats.c and group.c; engine.c's own waits) */
static inline void tp__lock(tp_pool *p) { tp__mutex_lock(&p->mu); }
static inline void tp__unlock(tp_pool *p) { tp__mutex_unlock(&p->mu); }
#define TP__ASSERT_LOCKED(p) TP__ASSERT_HELD(&(p)->mu)

/* The lock for the two takings that meet each other at every task where
 * submits take it: a locked submit's (tp__engine_submit, in any pool), and,
 * in a pool that does not stage plain tasks (a fair pool, elastic workers; stage.h), a
 * worker's after its task returned. Both sides hold mu for an admission or
 * a take, well under a microsecond, so a bounded spin (base.h,
 * tp__mutex_lock_spin) finds it free where sleeping at once made the glibc
 * mutex contended for good: every unlock then a futex wake, every lock a
 * futex wait (the compare driver's fair pool: about half of its samples in
 * futex calls; 0.66-0.78x the time and CPU per task with the spin,
 * docs/performance.md, "1.2 on a sixth machine"). Every other taking sleeps
 * at once (engine.c, make_sync); so does a worker of a FIFO pool that
 * stages, whose submitters seldom take mu (a fair pool's take it for a
 * task of a user new to the table, and its workers admit the ring before
 * any start where a staged task joins the round). A
 * fair pool's worker spins the same way for the ring's put lock, which its
 * submitters hold for a few stores (engine.c, stage_keep_locked). */
#define TP__LOCK_TRIES 64u
static inline void tp__lock_spin(tp_pool *p) { tp__mutex_lock_spin(&p->mu, TP__LOCK_TRIES); }

/* ---- pool.c: what group.c builds on */
/* tp_submit with the task joining group g (NULL: none): pool.c's checks and
 * the engine's admission. */
int tp__submit_member(tp_pool *p, struct tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts,
                      uint64_t *id_out);

/* ---- engine.c */
/* Make the worker slots, the histograms, the lock, the conditions and the
 * slots' contexts, then start the service thread and min_workers workers.
 * TP_OK, or TP_ENOMEM with every thread joined; tp__engine_free then frees
 * whatever was made. */
int tp__engine_start(tp_pool *p);
/* Free the worker slots' contexts and the synchronisation (threads gone). */
void tp__engine_free(tp_pool *p);
/* Admission of checked arguments: tp_submit (wait false) or tp_submit_wait
 * (until `deadline`). `a->now` is filled in here. */
int tp__engine_submit(tp_pool *p, tp__admit_args *a, void *arg, uint64_t *id_out, bool wait,
                      uint64_t deadline);
/* tp_submit_batch after its own argument checks: a[0..nchecked) hold the
 * checked arguments of the first tasks; later ones are checked under the
 * lock. Returns the refusal of task k (TP_OK: all `valid` admitted). */
int tp__engine_submit_batch(tp_pool *p, const tp_task *tasks, size_t valid, tp__admit_args *a,
                            size_t nchecked, uint64_t *ids_out, size_t *k_out);
/* tp_submit without the lock (stage.h), for checked arguments with no
 * options but an on_done bound to `cq` (both NULL or both set), no id
 * asked, no group and no inherited log id, on a pool that stages; `now` is
 * the queue-wait stamp (clock.h). TP_OK (accepted), TP_EFULL (counted in
 * fast_full), or TP__STAGE_LOCKED: take the locked path (the ring is full
 * or the pool closes). `wait` (tp_submit_wait): no place free (the pool's
 * or the completion queue's) is TP__STAGE_LOCKED too, and counts nothing:
 * the locked path waits for one. */
#define TP__STAGE_LOCKED (-1001)
int tp__engine_submit_staged(tp_pool *p, tp_fn fn, void *arg, tp_done_fn on_done, tp_cq *cq, uint64_t now,
                             bool wait);
/* tp_submit of such a task with a user (a->user; a->on_done, a->cq and
 * a->now as above) on a pool whose user slots may be taken without the
 * lock (life.h, users_put): TP_OK, TP_EFULL (the user below its limit),
 * or TP__STAGE_LOCKED (the user is not in the table or is near its limit,
 * the ring is full, the pool closes). */
int tp__engine_submit_staged_user(tp_pool *p, void *arg, const tp__admit_args *a);
/* tp_submit_batch without the lock: tasks[0..valid) may all be staged (as
 * tp__engine_submit_staged's), a[0..nchecked) checked arguments of the
 * first ones. One hold of put stages a prefix of the batch, so its tasks
 * are adjacent in the ring as the locked path makes them in the lane.
 * TP_OK: all staged; TP_EFULL: the first *k_out staged, task *k_out
 * refused for space (the pool's or its completion queue's; counted in
 * fast_full); TP__STAGE_LOCKED, *k_out 0: nothing staged (the pool
 * closes, or the ring has no slots for them): take the locked path. */
int tp__engine_submit_staged_batch(tp_pool *p, const tp_task *tasks, size_t valid, const tp__admit_args *a,
                                   size_t nchecked, size_t *k_out);
/* Tasks waiting, staged ones included, without the lock (stats.c). The
 * ring first: an entry leaves it only once it waits in the scheduler
 * (engine.c), so a task is never missed by both reads. */
static inline uint32_t tp__pool_queued(tp_pool *p) {
    uint32_t staged = tp__stage_count(&p->stage);
    return staged + tp__life_queued(&p->life);
}
int tp__engine_cancel(tp_pool *p, uint64_t id);
void tp__engine_close(tp_pool *p);
int tp__engine_shutdown(tp_pool *p, uint64_t budget_ns);
int tp__engine_wait(tp_pool *p, uint64_t timeout_ns);
/* tp_destroy after a shutdown: wait, join every thread, detach groups. */
void tp__engine_join(tp_pool *p);
/* A group's calls: act on what a transition called for (mu held), and wait
 * on a group's condition. */
void tp__engine_act_locked(tp_pool *p, tp__fx *fx);
int tp__engine_wait_locked(tp_pool *p, pthread_cond_t *cv, uint64_t deadline);

#if defined(TP__DEBUG)
/* A test hook of debug builds (tests/test_fuzz_found.c): when set, a worker
 * calls it right after an attempt returned, without the lock, before it
 * takes the lock again to end the attempt. It holds open the window in which
 * a task can be admitted between one attempt's end and the next start. */
typedef void (*tp__test_hook)(tp_pool *p);
extern _Atomic(tp__test_hook) tp__test_attempt_returned;
/* Likewise (tests/test_stage.c): a staged submit calls it between taking its
 * ticket and publishing its entry. */
extern _Atomic(tp__test_hook) tp__test_stage_claimed;
#endif

#endif /* TP_POOL_H */
