/*
 * scheduler.h -- the scheduler: the waiting tasks of a pool, and which one starts
 * next (taskpool.h, section 14). A plain data structure: no threads, no
 * locks, no allocation after init (the pool lock guards every call); its unit
 * tests (tests/test_scheduler.c) drive it without a pool.
 *
 * Shapes.
 *   - Five lanes, one per priority. In a FIFO pool, lane 0 is a ring
 *     (ring.h: 1.1's queue, unchanged) and the other lanes are lists in
 *     admission order; a pool that never sees a priority other than 0 only
 *     ever touches the ring, and each pop costs one test more than 1.1's.
 *   - In a fair pool every lane is a list, kept twice: once per user (the
 *     user's flow, in admission order) and once in arrival order (for the
 *     lane's oldest task and the expiry scan). The users with waiting tasks
 *     in a lane form its round (deficit round robin, a quantum of `weight`
 *     tasks, a cost of one task per start).
 * Every operation is O(1) in the number of waiting tasks and of users, but
 * the expiry scan and a forced shutdown's take-all, which visit every waiting
 * task once.
 *
 * What it owns: the waiting tasks (their scheduling links: ring_pos, next,
 * prev, anext, aprev), the rounds and turns (flows), the starvation counts,
 * and the lane figures (waiting, running, started), which it publishes as
 * atomics for tp_lane_stats_get and the oldest-wait gauge (all but the
 * default lane's waiting count, which is the total less the other lanes'). It knows nothing
 * of a task's life: life.c decides when a task is pushed (admitted, or back
 * from a retry delay), popped (a worker starts it), removed (cancel, expiry,
 * forced shutdown) or done (an attempt ended).
 */
#ifndef TP_SCHED_H
#define TP_SCHED_H

#include "base.h"
#include "ring.h"
#include "task.h"

#define TP__LANES 5 /* TP_PRIO_MIN..TP_PRIO_MAX */

static inline unsigned tp__lane_of(int prio) { return (unsigned)(prio - TP_PRIO_MIN); }

/* A user's place in the rounds of a fair pool: one per user entry (users.h),
 * plus the anonymous user's in the scheduler. Zero-initialised, weight 1.
 * Its lanes, priority 0 first (tp__flow_lane); each lane keeps the flow's
 * weight (the same in all five: tp__flow_set_weight), so that the default
 * lane's fields, the weight among them, are the flow's first 48 bytes,
 * which users.h keeps on one line of the user's entry (with the slots given
 * back): a task of priority 0 moves one line of its user's entry per push
 * and per start, and a turn reads its quantum there. */
typedef struct tp__flow {
    struct tp__flow_lane {
        tp__task *head, *tail;          /* its waiting tasks in this lane, in admission order */
        struct tp__flow *rnext, *rprev; /* the lane's round, while in it */
        tp__task *rnext_head;           /* in the round, not its tail: rnext's head (see tp__lane) */
        unsigned credit;                /* starts left in the turn under way; 0: no turn started */
        uint16_t weight;                /* the flow's: the quantum of its next turns, 1..TP_WEIGHT_MAX */
        bool in_round;
    } lane_[TP__LANES]; /* by tp__flow_lane: priority 0, 1, 2, -2, -1 */
} tp__flow;
_Static_assert(TP_WEIGHT_MAX <= UINT16_MAX, "a weight fits a lane's");
_Static_assert(sizeof(struct tp__flow_lane) == 48, "a flow's lane: 48 bytes");

/* Where lane li's part sits in a flow's lane_: (li + 3) % 5, without the
 * division, so that the default lane's is first (users.h keeps it on one
 * line with the user's ending side). */
#define TP__FLOW_SLOT(li) ((li) >= 2u ? (li)-2u : (li) + TP__LANES - 2u)
_Static_assert(TP__FLOW_SLOT(0u - TP_PRIO_MIN) == 0, "the default lane's part is a flow's first 48 bytes");

/* Lane li's part of flow f (li = tp__lane_of(priority)). */
static inline struct tp__flow_lane *tp__flow_lane(tp__flow *f, unsigned li) {
    return &f->lane_[TP__FLOW_SLOT(li)];
}

/* A lane: what a start and an end in it write is its first cache line,
 * which it shares with no other lane; its starvation count (written only
 * while several lanes are ready) is on the second; what every push writes,
 * the arrival list's tail, on the third. The default lane (priority 0)
 * keeps no waiting count: its count is the scheduler's `waiting` less
 * `in_others` (tp__sched). So while the lane holds tasks a push writes
 * nothing of the start's line, but in a fair pool when its user joins the
 * round (the round's tail, and its head if the round was empty). Both
 * still write the scheduler's first line and the user's flow. */
typedef struct tp__lane {
    /* the start's side, under the pool lock */
    _Alignas(64) tp__task *ahead; /* list lanes: every waiting task, in arrival order */
    tp__flow *rhead, *rtail;      /* fair pools: the round */
    /* tasks waiting in (lanes other than the default lane; a push writes
     * it too) / running from this lane (a FIFO pool's ring lane keeps
     * neither: its length is its waiting count) */
    unsigned waiting, running;
    /* published for lock-free readers (release stores; see stats.h) */
    _Atomic uint32_t waiting_pub, running_pub; /* waiting_pub: not for the default lane */
    _Atomic uint64_t head_at_pub;              /* queue stamp of its oldest waiting task, 0 if none */
    _Atomic uint64_t started_pub;              /* attempts started from this lane */
    _Alignas(64) unsigned starve; /* starts that went to a higher lane while this one stayed ready */
    uint64_t ahead_at; /* list lanes: `ahead`'s queue stamp (0 if none): its line is not read for it */
    /* Fair pools: the round's head user's oldest task here (NULL: empty
     * round), the task that starts next from this lane. It and each flow's
     * rnext_head copy a head pointer from another user's line, so that the
     * start knows the next task without a load of that line: it fetches the
     * task ahead, exactly, as the ring's start does. */
    tp__task *rhead_head;
    /* the push's side: list lanes' last waiting task (a start writes it
     * only when it takes the last one) */
    _Alignas(64) tp__task *atail;
} tp__lane;

/* Two words that the scheduler's owner publishes for lock-free readers at
 * every push and start (life.c: the admission word and the waiting count).
 * They live on the line that every push and start writes anyway, so that
 * publishing them moves no line of its own; the scheduler never touches
 * them. */
typedef struct tp__sched_pub {
    _Atomic uint64_t word;
    _Atomic uint32_t count;
    uint32_t basis; /* the owner's, not published: waiting + delayed as the room count has seen them */
} tp__sched_pub;

typedef struct tp__sched {
    /* First, one cache line: what every push and every start of a FIFO
     * pool's lane 0 writes, after the owner's published words. That lane
     * (the ring) publishes only its oldest task's stamp; its other figures
     * are the pool's totals less the other lanes' (stats.c). */
    _Alignas(64) tp__sched_pub pub; /* the owner's (see tp__sched_pub) */
    tp__ring ring;                  /* FIFO pools: lane 0 */
    _Atomic uint64_t ring_head_at;  /* FIFO pools: queue stamp of the ring's head, 0 if empty */
    unsigned waiting;               /* in every lane */
    /* The owner's, as pub: the places its waiting set gave back (life.h,
     * the room count). */
    _Atomic uint64_t given;
    /* The second line: read per start, written by pushes and starts
     * outside the default lane and, in a fair pool, by those of tasks
     * without a user (the anonymous flow, `anon`, begins on it). */
    /* waiting outside the default lane (priority 0: a FIFO pool's ring, a
     * fair pool's lane 2), which keeps no count of its own: its count is
     * waiting - in_others */
    unsigned in_others;
    unsigned starve_limit; /* prio_starve_limit, resolved; TP_UNLIMITED: strict */
    void *ring_raw;        /* FIFO pools: what to free for the ring (tp__ring_init) */
    unsigned low_max;      /* low_prio_max_running; 0: no limit */
    unsigned low_running;  /* running tasks of priority < 0 */
    bool fair;             /* TP_SCHED_FAIR */
    /* The rest: lanes other than a FIFO pool's lane 0, and fair rounds. */
    tp__flow anon; /* fair pools: the tasks without a user */
    tp__lane lane[TP__LANES];
} tp__sched;

/* `capacity`: the most tasks that can wait at once (sizes the ring of a FIFO
 * pool). 0 or -1 (out of memory). fini also after a failed init (zeroed). */
int tp__sched_init(tp__sched *s, unsigned capacity, bool fair, unsigned starve_limit, unsigned low_max);
void tp__sched_fini(tp__sched *s);

/* `t` waits now, at the back of its lane (t->prio) and, in a fair pool, of
 * its flow (t->flow, which joins the lane's round at the back if it was not
 * in it). t->queued_at is its queue stamp. */
void tp__sched_push_lanes(tp__sched *s, tp__task *t); /* the general case, in scheduler.c */
static inline void tp__sched_push(tp__sched *s, tp__task *t) {
    if (s->fair || t->prio != 0) {
        tp__sched_push_lanes(s, t);
        return;
    }
    /* lane 0 of a FIFO pool: the ring, whose length is the lane's count */
    tp__ring_push(&s->ring, t);
    if (tp__ring_len(&s->ring) == 1) TP__SET(s->ring_head_at, t->queued_at); /* a new head */
    s->waiting++;
}

/* A fair pool whose waiting tasks (one or more) are all in the default
 * lane, its usual case: that lane is the one ready lane, and starvation
 * counts choose nothing. */
static inline bool tp__sched_fair_default(const tp__sched *s) {
    return s->fair && s->waiting > 0 && s->in_others == 0;
}

/* The task that starts next by the rules of section 14, left in place; NULL
 * when no lane is ready (nothing waits, or only background tasks wait while
 * low_prio_max_running of them run). The caller then either starts it
 * (tp__sched_start) or, if it must not run (its deadline passed), removes it
 * (tp__sched_remove), which is no start: no count moves for it. */
tp__task *tp__sched_peek_lanes(const tp__sched *s); /* the general case, below */
static inline tp__task *tp__sched_peek(const tp__sched *s) {
    if (s->in_others > 0) return tp__sched_peek_lanes(s);
    if (s->waiting == 0) return NULL;
    /* Only the default lane holds tasks: the one ready lane. A FIFO pool's
     * ring; a fair pool's usual case, the round's head user's oldest task
     * in that lane (scheduler.c, lane_head). */
    if (!s->fair) return tp__ring_at(&s->ring, 0);
    TP__ASSERT(s->lane[2].rhead_head == tp__flow_lane(s->lane[2].rhead, 2)->head);
    return s->lane[2].rhead_head;
}

/* Whether `t` starts from the ring (lane 0 of a FIFO pool), whose start count
 * its worker keeps (tp__st_runs.ring_started) instead of the lane. */
static inline bool tp__sched_from_ring(const tp__sched *s, const tp__task *t) {
    return !s->fair && t->prio == 0;
}

/* Start `t`, what tp__sched_peek just returned: take it out, count it
 * started and running in its lane, move the starvation counts and the
 * lane's round. */
void tp__sched_start_lanes(tp__sched *s, tp__task *t); /* the general case, below */
static inline void tp__sched_start(tp__sched *s, tp__task *t) {
    if (s->in_others > 0 || s->fair) {
        tp__sched_start_lanes(s, t);
        return;
    }
    /* Only the ring holds tasks (a FIFO pool, lane 0): every other lane is
     * empty, so no count moves but the ring lane's starvation count, which
     * returns to 0 (stored only if it was not: the lane's line is not
     * written per start). The ring lane publishes only its head's stamp
     * (see tp__sched). */
    tp__lane *l = &s->lane[2];
    tp__task *h = tp__ring_pop(&s->ring);
    TP__ASSERT(h == t);
    TP__UNUSED(h);
    TP__UNUSED(t);
    if (l->starve) l->starve = 0;
    s->waiting--;
    TP__SET(s->ring_head_at, tp__ring_head_at(&s->ring));
    if (s->waiting) {
        /* The next start's record, most likely written on another CPU: start
         * moving its two hot lines here now, while this task runs. */
        const char *nx = (const char *)tp__ring_at(&s->ring, 0);
        __builtin_prefetch(nx, 1);
        __builtin_prefetch(nx + 64, 1);
    }
}

/* An attempt of `t` that was started has ended: it no longer runs in its
 * lane. Returns true when this made a lane ready that was not (a background
 * task may start again): a worker should be woken. */
bool tp__sched_done_low(tp__sched *s, const tp__task *t); /* a background lane's, in scheduler.c */
static inline bool tp__sched_done(tp__sched *s, const tp__task *t) {
    if (t->prio < 0) return tp__sched_done_low(s, t);
    if (t->prio == 0 && !s->fair) return false; /* the ring lane counts no running tasks */
    tp__lane *l = &s->lane[tp__lane_of(t->prio)];
    TP__ASSERT(l->running > 0);
    l->running--;
    TP__SET(l->running_pub, l->running);
    return false;
}

/* Take out waiting task `t` (cancel, group cancel). */
void tp__sched_remove(tp__sched *s, tp__task *t);

/* Take out every waiting task whose deadline is <= now, linked through `next`
 * in lane order (each lane oldest first) into *out; returns the earliest
 * deadline left among the waiting tasks (TP_FOREVER if none). Visits every
 * waiting task. */
uint64_t tp__sched_take_expired(tp__sched *s, uint64_t now, tp__task **out);

/* Take out every waiting task, linked through `next` into *out (forced
 * shutdown). */
void tp__sched_take_all(tp__sched *s, tp__task **out);

/* How many tasks wait. */
static inline unsigned tp__sched_waiting(const tp__sched *s) { return s->waiting; }

/* How many tasks wait in the default lane (priority 0): the total less the
 * other lanes' (it keeps no count of its own). */
static inline unsigned tp__sched_default_waiting(const tp__sched *s) { return s->waiting - s->in_others; }

/* Whether a pop would return a task now. */
static inline bool tp__sched_ready(const tp__sched *s) {
    if (s->waiting == 0) return false;
    if (s->low_max == 0 || s->low_running < s->low_max) return true;
    /* the default lane's count: the total less the other lanes' */
    return s->waiting - s->in_others + s->lane[3].waiting + s->lane[4].waiting > 0;
}

/* How many of the waiting tasks could start now, one per worker (an elastic
 * pool grows while this exceeds its idle workers). */
static inline unsigned tp__sched_startable(const tp__sched *s) {
    unsigned high = s->waiting - s->lane[0].waiting - s->lane[1].waiting;
    if (s->low_max == 0) return s->waiting;
    unsigned low = s->lane[0].waiting + s->lane[1].waiting;
    unsigned room = s->low_max > s->low_running ? s->low_max - s->low_running : 0;
    return high + (low < room ? low : room);
}

/* The queue stamp (clock.h) of the oldest waiting task, 0 if none. Lock-free:
 * the lanes' published heads. */
static inline uint64_t tp__sched_oldest_at(tp__sched *s) {
    uint64_t oldest = TP__ACQUIRE(s->ring_head_at);
    for (unsigned i = 0; i < TP__LANES; i++) {
        uint64_t at = TP__ACQUIRE(s->lane[i].head_at_pub);
        if (at && (!oldest || at < oldest)) oldest = at;
    }
    return oldest;
}

/* The weight of flow f's next turns, in every lane. */
static inline void tp__flow_set_weight(tp__flow *f, unsigned weight) {
    for (unsigned i = 0; i < TP__LANES; i++) f->lane_[i].weight = (uint16_t)(weight ? weight : 1);
}

/* Flow f's weight. */
static inline unsigned tp__flow_weight(const tp__flow *f) { return f->lane_[0].weight; }

/* Fair pools: `f` is a new user's flow; weight as set (1 by default). */
static inline void tp__flow_init(tp__flow *f, unsigned weight) {
    for (unsigned i = 0; i < TP__LANES; i++) {
        f->lane_[i].head = f->lane_[i].tail = NULL;
        f->lane_[i].rnext = f->lane_[i].rprev = NULL;
        f->lane_[i].rnext_head = NULL;
        f->lane_[i].credit = 0;
        f->lane_[i].in_round = false;
    }
    tp__flow_set_weight(f, weight);
}

#endif /* TP_SCHED_H */
