/*
 * life.h -- the life of a task as a state machine (life.c).
 *
 * Every function here is a transition of one or more task records, made with
 * the pool lock held by the caller (engine.c, pool.c, group.c). life.c knows
 * no thread, no condition variable and no worker: each transition reports in
 * a tp__fx what it made possible -- work for a worker, room for a waiting
 * submitter, a timer or an ending for the service thread, a drained pool, a
 * group without unfinished members -- and the engine, which owns the threads
 * and the condition variables, acts on it (tp__engine_act_locked).
 */
#ifndef TP_LIFE_H
#define TP_LIFE_H

#include "base.h"
#include "cq.h"
#include "ctx.h"
#include "scheduler.h"
#include "stats.h"
#include "task.h"
#include "users.h"

/* What a transition made possible: the engine wakes whoever waits for it.
 * Zero-initialise one per lock hold (TP__FX_INIT) and pass it to every
 * transition of that hold. */
enum {
    TP__FX_ROOM = 1u << 0,    /* space, a user slot or a record was freed: wake waiting submitters */
    TP__FX_SVC = 1u << 1,     /* an ending or a retry timer for the service thread */
    TP__FX_EXITERS = 1u << 2, /* idle workers re-check whether they may exit */
    TP__FX_DRAINED = 1u << 3, /* closed and nothing in flight: shutdown and wait callers */
    TP__FX_CANCEL = 1u << 4,  /* a forced shutdown: cancel the context of every running task */
};
typedef struct tp__fx {
    unsigned flags;          /* TP__FX_* */
    unsigned work;           /* tasks became startable: wake up to this many idle workers */
    uint64_t svc_by;         /* a deadline the service thread must look at by then (TP_FOREVER: none) */
    struct tp_group *groups; /* groups whose last unfinished member retired (linked by wake_next) */
    tp__st_runs *runs;       /* where this thread counts starts and endings (stats.h) */
} tp__fx;
/* A tp__fx for a thread that counts into `runs` (a worker's set, or the
 * pool's `misc` set for every other thread). */
#define TP__FX_INIT(runs)                                                                                    \
    { 0, 0, TP_FOREVER, NULL, (runs) }

/* What the life of a pool's tasks needs of its configuration. */
typedef struct tp__life_cfg {
    unsigned capacity, max_per_user, max_retries;
    unsigned waiting_max;        /* tasks that can wait at once: capacity + max_workers (see pool.c) */
    unsigned max_records;        /* task records in use at most (see pool.c) */
    unsigned max_records_staged; /* the cap for a staged task's admission (pool.c) */
    uint64_t run_timeout;        /* the pool's default, resolved */
    uint64_t retry_delay;        /* resolved */
    uint64_t retry_delay_max;    /* 0: fixed delay */
    uint32_t serial;             /* process-unique pool number, for generated log ids */
} tp__life_cfg;

/* A submit's checked arguments (pool.c fills it in before taking the lock). */
typedef struct tp__admit_args {
    struct tp_group *group; /* NULL: not a group member */
    tp_fn fn;
    tp_done_fn on_done;
    tp_cq *cq;
    uint64_t run_timeout, deadline;
    const char *user;
    size_t user_len;
    uint32_t user_hash;
    int prio;
    /* A staged task of a fair pool whose user was not known to be in the
     * default lane's round at its submit (engine.c, "A fair pool's staged
     * tasks"): it joins the round at its admission. */
    bool join;
    const char *log_src; /* NULL: generate */
    size_t log_len;
    uint64_t now; /* clock.h stamp just before admission, where the queue wait starts; 0: take it now */
} tp__admit_args;
/* tp__life_args sets every field one by one (life.c): a new field must be
 * set there too, which this size check recalls on LP64 targets. */
_Static_assert(sizeof(void *) != 8 || sizeof(tp__admit_args) == 104, "a new field: set it in tp__life_args");

/* The user slots a pool keeps before giving them back under put (tp__life,
 * `rel`). */
#define TP__REL_MAX 32u

/* The state of a pool's tasks. life.c owns every field. */
typedef struct tp__life {
    /* First: the submitter's line, which every submit writes and nothing
     * else touches per task (engine.c's lock comes before; static assertion
     * in life.c). */
    _Alignas(64) uint64_t next_id;
    unsigned admitted; /* tasks accepted; in flight: admitted - retired (wraps) */
    tp__tasks tasks;   /* its free list is admission's own; its growth fields spill over */
    /* Read by every push and start (the admission word is made of them),
     * written only by retries, users reaching or leaving their limit, and
     * close: no thread moves this line per task. */
    unsigned delayed;        /* tasks in the delayed list */
    unsigned users_at_limit; /* users holding max_per_user slots */
    bool closed;             /* no more admissions */
    bool forced;             /* no more retries; waiting tasks were dropped */
    bool room_hold;          /* a due retry moves to the queue: the room count is synced after (life.c) */
    /* Then the waiting tasks. The first line of the scheduler is the one
     * line that every push and every start writes, the submitter's and the
     * workers' alike; it carries the two words this file publishes for
     * lock-free readers (sched.pub, static assertion in life.c):
     *   - pub.word, the admission word: what tp__life_full_fast needs to
     *     refuse a full queue without the lock, stored under the lock after
     *     every change as one word, so that one load gives the values of one
     *     moment: waiting + delayed (bits 0-31), users_at_limit (bits
     *     32-62), closed (bit 63);
     *   - pub.count: the tasks waiting (stats, a spinning worker). */
    tp__sched sched;
    /* What retiring a task writes, on the retiring side's line: the
     * submitter does not touch it per task. */
    _Alignas(64) tp__task *given; /* retired records (tasks.h), taken over by admission */
    unsigned retired;             /* tasks retired */
    unsigned with_deadline;       /* unfinished tasks that carry a deadline */
    /* The free places, exact: capacity - (waiting + delayed) - places taken
     * by admissions not yet waiting (a staged task: stage.h), kept as
     * three counts that only grow: capacity + given + room_back -
     * room_taken. room_taken
     * counts the places taken (a compare-and-swap: tp__life_room_take,
     * with or without the lock) and the waiting set's growths that took
     * none (a retry delayed); sched.given, on the line that every start
     * writes anyway, the places the waiting set gave back as it shrank
     * (adm_publish turns each change into one store: sched.pub.basis is
     * what the count has seen; only holders of the pool lock write it, so
     * a load and a store, not a read-modify-write, under the lock that
     * every worker waits for); room_back, beside room_taken, the places
     * taken and not used (an atomic add, with or without the lock). Free =
     * capacity + given + room_back - room_taken. Below 0 while retries wait
     * beyond the capacity.
     * So a submitter, which writes room_taken per task, reads the starting
     * workers' count only when its last look at it (room_seen, never
     * above it) leaves no place, and a start writes no line of the
     * submitter's: where the queue does not fill, no line moves per task
     * for the bound. A refusal reads given after room_taken, and room_back
     * after given: all three only grow, so at the read of given the places
     * were at most what it computed.
     * A look that is stale (room_seen stored by a submitter that read
     * given and room_back long before) is below their sum, never above: it
     * costs a read of both, never a place.
     * Kept only from the pool's first try at a staged submit on
     * (`room_live`, set once under the lock: tp__life_room_start, even if
     * that try is then refused or locked): until then every admission is
     * under the lock, where waiting + delayed decide space, so a pool that
     * never stages moves no line of its own per task for it -- an elastic
     * pool, or one whose every submit takes the locked path (any
     * option but a user and an on_done bound to a completion queue, an id
     * asked, a group, a log id inherited; pool.c). */
    _Alignas(64) _Atomic int64_t room_taken;
    _Atomic int64_t room_seen; /* sched.given + room_back as last read */
    _Atomic int64_t room_back; /* places taken and not used (tp__life_room_give) */
    int64_t room_capacity;     /* cfg.capacity, on this line */
    _Atomic bool room_live;
    /* Then: what a task with a user, a deadline, a group or a retry uses. */
    _Alignas(64) tp__users users;
    /* In a pool that stages (stage.h), a plain task with a user may take its
     * slot without the pool lock (engine.c, tp__engine_submit_staged_user):
     * there the ring's put lock guards the user table too, taken after mu by
     * those that hold mu (`users_put`; NULL in a pool that does not stage,
     * where mu alone guards it). Such a submit takes a slot only from an
     * entry that exists and holds fewer than its limit minus one: it never
     * adds or evicts an entry, never brings a user to its limit (so
     * users_at_limit stays mu's) and never refuses TP_EUSERLIMIT (the locked
     * path decides). A slot given back while tasks wait in the queue, and
     * not its user's last, is kept here (`rel`, mu held; the user's entry
     * counts its own, users.h `kept`) and given back with
     * the next ones under one hold of put (life.c, user_release): a worker
     * ending tasks back to back takes put once per TP__REL_MAX, not per
     * task. A user's last slot goes back at once, so the users gauge never
     * counts a user whose tasks all ended. Every reader of a count gives the
     * kept ones back first (the locked admission, tp_user_active); a staged
     * submit, which sees a count too high by them, takes the locked path near
     * the limit: no one is refused for a kept slot. */
    tp__mutex *users_put; /* read-only once set: off the kept slots' line, which workers write */
    /* Where the pool stages (stage.h), the engine's: admits the oldest
     * staged task now, if any, mu held (through tp__life_admit_staged; one,
     * not the ring: the rest may wait behind it, and a cancel's or a scan's
     * cost stays O(1) in the staged tasks). Staged tasks
     * wait in the default lane too, behind every task of that lane here: a
     * task that leaves the scheduler unstarted (expired, cancelled), the
     * last of that lane here, calls it first (life.c, before_unwait), and so
     * does an expiry scan, so that the lane does not seem empty while staged
     * tasks wait in it (a lower lane starting first, the lane's starvation
     * count back to 0). NULL where the pool does not stage. Read-only once
     * set. */
    void (*admit_staged)(void *arg);
    void *admit_staged_arg;
    /* A fair pool that stages (engine.c, "A fair pool's staged tasks"), the
     * engine's, mu held, with admit_staged_arg; NULL elsewhere. Read-only
     * once set.
     * stage_keep: user `u` (its stage_ok set) is about to leave the default
     * lane's round, or has just left it in an expiry scan. If tasks of u
     * are staged, the ring is admitted (every entry claimed so far, oldest
     * first) and it returns true: u's next task there is one of them. Else
     * u->stage_ok is cleared under put, so a task of u staged from then on
     * joins the round (`join`) until an admission sets it again, and it
     * returns false.
     * stage_all: admit every entry claimed so far (before an expiry scan).
     * stage_joins: before a start (and a removal of a user's last task in
     * the default lane), admit every entry claimed so far if one
     * of them joins the round (tp__admit_args, `join`): where it stands in
     * the round decides which task starts. */
    bool (*stage_keep)(void *arg, struct tp__user *u);
    void (*stage_all)(void *arg);
    void (*stage_joins)(void *arg);
    _Alignas(64) unsigned rel_n;
    struct tp__user *rel[TP__REL_MAX];
    tp__task *delayed_head, *delayed_tail; /* retries waiting for their delay */
    tp__task *endings_head, *endings_tail; /* ended unrun, on_done pending (service thread) */
    uint64_t queued_deadline_min;          /* lower bound of the deadlines of waiting tasks */
    uint64_t expiry_scan_at;               /* the next expiry scan no earlier */
    struct tp_group *groups;               /* this pool's groups */
    struct tp_group *coe_pending;          /* cancel-on-error groups to cancel before the lock is released */
    tp__st_calls *calls;                   /* the pool's call counters (stats.h): `accepted` */
    tp__st_gauges *gauges;                 /* the pool's gauges (stats.h): delayed, users */
    tp__life_cfg cfg;
} tp__life;

int tp__life_init(tp__life *L, const tp__life_cfg *cfg, tp__st_calls *calls, tp__st_gauges *gauges,
                  unsigned prealloc, bool fair, unsigned starve_limit, unsigned low_max);
void tp__life_fini(tp__life *L); /* also after a failed init */

/* ---- admission */
/* tp__life_admit's refusal for a completion queue whose every place is
 * taken: TP_EFULL to the caller, but a waiting submit waits on the queue. */
#define TP__EFULL_CQ (-1000)
/* A submit's arguments checked and resolved into `a` (run timeout default,
 * user hash, log id source): TP_OK or TP_EINVAL. No lock needed: it reads
 * only the read-only configuration. */
int tp__life_args(const tp__life *L, tp_fn fn, const tp_task_opts *opts, tp__admit_args *a);
/* The part of those checks that needs no pool (a detached group's submit). */
int tp__life_args_check(tp_fn fn, const tp_task_opts *opts);
/* The admission checks after "closed" (the caller checks that first): the
 * user's limit, space, the completion queue's places; on TP_OK the task
 * waits in the scheduler and *id_out (if not NULL) holds its id. Refusals:
 * TP_EUSERLIMIT, TP_EFULL (also when the records are at their cap),
 * TP__EFULL_CQ, TP_ENOMEM. */
int tp__life_admit(tp__life *L, const tp__admit_args *a, void *arg, uint64_t *id_out, tp__fx *fx);
/* A staged task (stage.h) becomes a waiting one: its place (and its
 * completion queue's, and a slot of its user `u` if not NULL) was taken when
 * it was staged, and it was counted as accepted then. `a` is the pool's template for staged tasks (engine.c,
 * from tp__life_args with no options) with the entry's fn, stamp and, maybe,
 * an on_done and its completion queue. Never refused: TP_OK, or TP_ENOMEM when no
 * record can be allocated (its records' cap, max_records_staged, covers
 * every staged task: pool.c), and then the caller ends it unrun
 * (tp__life_staged_lost). */
int tp__life_admit_staged(tp__life *L, const tp__admit_args *a, void *arg, struct tp__user *u, tp__fx *fx);
/* A staged task that will never wait (no record could be allocated):
 * counted as ended unrun and failed, its place and its user's slot (`u`, if
 * not NULL) given back, its on_done (if
 * any) queued on its completion queue with TP_ENOMEM. A forced shutdown
 * never needs it: close admits every staged task first. */
void tp__life_staged_lost(tp__life *L, const tp__admit_args *a, void *arg, struct tp__user *u, tp__fx *fx);
/* A pool that stages (tp__life, `users_put`), without the pool lock, put
 * held: the entry of the user named by a's user fields if it exists and
 * holds fewer slots than its limit minus one; else NULL (the locked path
 * decides). */
struct tp__user *tp__life_user_below(tp__life *L, const tp__admit_args *a);
/* The same, put still held since: one slot of `u` (tp__life_user_below's). */
void tp__life_user_take_staged(tp__life *L, struct tp__user *u, const tp__admit_args *a);
/* mu held: the slots kept back are given back now (tp__life, `rel`); put is
 * taken if there are any. */
void tp__life_users_flush(tp__life *L);
/* With the lock: keep the room count from now on (life.h, `room_taken`), for a
 * first staged submit; nothing if it is kept already. */
void tp__life_room_start(tp__life *L);
/* Without the lock: whether the room count is kept (acquire: then its value
 * is the count's). */
static inline bool tp__life_room_live(tp__life *L) {
    return atomic_load_explicit(&L->room_live, memory_order_acquire);
}
/* The places given back (sched.given + room_back: given first), read now;
 * stored as the next look's (life.h, `room_taken`). */
static inline int64_t tp__life_room_given(tp__life *L) {
    int64_t g = (int64_t)atomic_load_explicit(&L->sched.given, memory_order_acquire);
    g += atomic_load_explicit(&L->room_back, memory_order_acquire);
    atomic_store_explicit(&L->room_seen, g, memory_order_relaxed);
    return g;
}
/* Without the lock, once the count is kept: whether no place is free, as
 * the count stood at one moment (a look before taking one). */
static inline bool tp__life_room_full(tp__life *L) {
    int64_t t = atomic_load_explicit(&L->room_taken, memory_order_acquire); /* before given's */
    int64_t g = atomic_load_explicit(&L->room_seen, memory_order_relaxed);
    if (L->room_capacity + g - t > 0) return false;
    return L->room_capacity + tp__life_room_given(L) - t <= 0;
}
/* Without the lock, once the count is kept: the free places at one look
 * (never more than there were when given was read; 0 when none). */
static inline unsigned tp__life_room_free(tp__life *L) {
    int64_t t = atomic_load_explicit(&L->room_taken, memory_order_acquire); /* before given's */
    int64_t n = L->room_capacity + tp__life_room_given(L) - t;
    return n > 0 ? (unsigned)n : 0;
}
/* Without the lock, once the count is kept: take up to `n` free places at
 * once (a batch), and say how many were taken: 0 if none is free (so it was
 * when given was read). A place is taken only while capacity + room_seen -
 * room_taken, which never exceeds the free places, leaves one. */
static inline unsigned tp__life_room_take_n(tp__life *L, unsigned n) {
    int64_t t = atomic_load_explicit(&L->room_taken, memory_order_acquire); /* before given's */
    int64_t g = atomic_load_explicit(&L->room_seen, memory_order_relaxed);
    int64_t k;
    do {
        int64_t free = L->room_capacity + g - t;
        if (free < (int64_t)n) {
            g = tp__life_room_given(L); /* read after t */
            free = L->room_capacity + g - t;
        }
        if (free <= 0) return 0;
        k = free < (int64_t)n ? free : (int64_t)n;
    } while (!atomic_compare_exchange_weak_explicit(&L->room_taken, &t, t + k, memory_order_acq_rel,
                                                    memory_order_acquire));
    return (unsigned)k;
}
/* One place (tp__life_room_take_n): true, or false when none is free. */
static inline bool tp__life_room_take(tp__life *L) { return tp__life_room_take_n(L, 1) == 1; }
/* Give back `n` places taken by tp__life_room_take(_n) that no task used
 * (with or without the lock). */
static inline void tp__life_room_give_n(tp__life *L, unsigned n) {
    atomic_fetch_add_explicit(&L->room_back, n, memory_order_release);
}
static inline void tp__life_room_give(tp__life *L) { tp__life_room_give_n(L, 1); }
/* Without the lock, before taking it: warm the lines that tp__life_admit
 * will read for a's user (tp__users_prefetch); nothing if it names none. */
static inline void tp__life_prefetch(tp__life *L, const tp__admit_args *a) {
    if (a->user) tp__users_prefetch(&L->users, a->user_hash);
}
/* Without the lock: true when the locked path would refuse a task (with a
 * user, or not) with TP_EFULL at the moment of one atomic load; false means
 * "ask under the lock". */
bool tp__life_full_fast(tp__life *L, bool has_user);
/* Stop admission (idempotent). */
void tp__life_close(tp__life *L, tp__fx *fx);
/* Forced shutdown: no more retries, waiting and delayed tasks end unrun with
 * TP_ECANCELED; fx->cancel_running asks the engine to cancel the running
 * ones. */
void tp__life_force(tp__life *L, tp__fx *fx);

/* ---- a worker's steps */
/* The next task to start, started on context `c` (RUNNING), or one whose
 * deadline had passed, finalised and DONE (the caller runs its on_done and
 * retires it; one without an on_done is retired, and the next one taken).
 * NULL when no waiting task may start now. */
tp__task *tp__life_take(tp__life *L, struct tp_ctx *c, tp__fx *fx);
/* The attempt returned `rc`: schedule a retry (true: the record belongs to
 * the delayed list from now on) or finalise (false). A finalised task with
 * an on_done of its own stays DONE: the caller runs the on_done and retires
 * it. One without an on_done, or bound to a completion queue, is retired
 * here, and the caller must not touch it (tp__life_done_here tells). */
bool tp__life_attempt_ended(tp__life *L, tp__task *t, int rc, tp__fx *fx);
/* After a transition that finalised t: whether the caller runs its on_done
 * and retires it (DONE), or it was retired already. Read before the lock is
 * released. */
static inline bool tp__life_done_here(const tp__task *t) { return t->state == TP__DONE; }
/* The wait before retry k (k = 1 for the first): the pool's retry delay, or
 * with retry_delay_max min(retry delay x 2^(k-1), max). */
uint64_t tp__life_retry_delay(const tp__life *L, unsigned k);
/* on_done has returned (or there was none): the record is reused. */
void tp__life_retire(tp__life *L, tp__task *t, tp__fx *fx);

/* ---- cancel */
int tp__life_cancel(tp__life *L, uint64_t id, tp__fx *fx); /* TP_OK or TP_ENOTFOUND */

/* ---- the service thread's steps */
/* The tasks that ended without running and whose on_done the service thread
 * runs, linked through `next`; the list is emptied. */
tp__task *tp__life_take_endings(tp__life *L);
/* Due retries go back to the scheduler, retries and waiting tasks whose
 * deadline passed end. Returns when to look again. */
uint64_t tp__life_timers(tp__life *L, uint64_t now, tp__fx *fx);

/* ---- groups (group.c owns the group object; its members are life.c's) */
void tp__life_group_link(tp__life *L, struct tp_group *g);
void tp__life_group_unlink(tp__life *L, struct tp_group *g);
void tp__life_group_cancel(tp__life *L, struct tp_group *g, tp__fx *fx);
/* tp_destroy: every task retired; the pool's groups lose their pool. */
void tp__life_groups_detach(tp__life *L);

/* ---- weights of a fair pool (tp_user_weight_set) */
int tp__life_set_weight(tp__life *L, const char *user, size_t len, unsigned weight);

/* ---- what the engine asks */
static inline bool tp__life_ready(const tp__life *L) { return tp__sched_ready(&L->sched); }
static inline unsigned tp__life_startable(const tp__life *L) { return tp__sched_startable(&L->sched); }
/* Nothing waits or waits for a retry (a closed pool's idle workers exit). */
static inline bool tp__life_idle(const tp__life *L) {
    return tp__sched_waiting(&L->sched) == 0 && L->delayed == 0;
}
/* Tasks waiting for a retry. */
static inline unsigned tp__life_delayed(const tp__life *L) { return L->delayed; }
static inline bool tp__life_closed(const tp__life *L) { return L->closed; }
/* The tasks waiting, lock-free (acquire; see adm_publish in life.c). */
static inline uint32_t tp__life_queued(tp__life *L) { return TP__ACQUIRE(L->sched.pub.count); }
/* Accepted tasks not yet retired. */
static inline unsigned tp__life_inflight(const tp__life *L) { return L->admitted - L->retired; }
static inline bool tp__life_endings_pending(const tp__life *L) { return L->endings_head != NULL; }

#endif /* TP_LIFE_H */
