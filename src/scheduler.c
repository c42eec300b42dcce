/*
 * scheduler.c -- the scheduler (see scheduler.h for its shapes and what it owns).
 *
 * The rules, as taskpool.h section 14 states them:
 *   - A lane is ready when it has a waiting task that may start now: lanes
 *     below 0 only while fewer than low_max tasks of priority < 0 run (when
 *     low_max is set).
 *   - A start goes to the highest ready lane, unless a ready lane's starvation
 *     count has reached starve_limit: then to the highest such lane. The
 *     start adds one to the count of every ready lane below the chosen one
 *     and sets the chosen lane's count to 0. A lane's count also returns to
 *     0 when it stops being ready: when its last waiting task leaves
 *     (started, cancelled, expired) and, for the background lanes, when
 *     low_max tasks of theirs run. A lane that is not ready counts nothing.
 *   - Within a lane: the ring or the arrival list (FIFO pools), or the round
 *     (fair pools): the head user starts up to `weight` tasks in a row (its
 *     turn's credit, fixed when the turn starts), then goes to the back, or
 *     leaves as soon as it has no waiting task in the lane. A user that gets
 *     a waiting task while out of the round joins at the back.
 *
 * Publishing: every change of a lane's waiting count, running count, started
 * count or oldest task is stored into its *_pub atomics (release) before the
 * pool lock is released, for tp_lane_stats_get and tp_stats_get's
 * oldest_wait_ns, which read them without the lock -- except the default
 * lane (priority 0). In a FIFO pool (the ring) it publishes only its oldest
 * task's stamp (ring_head_at): its gauges are the pool's totals less the
 * other lanes', and its starts are counted on the starting worker's own
 * counter line (ring_started, life.c), so the hot path stores to no line
 * 1.1 did not. In a fair pool it publishes all but its waiting count, which
 * is, as it is in the FIFO pool, the total less the other lanes': a push
 * into it then writes neither that count nor the line of the lane that a
 * start writes (but when its user joins the round: scheduler.h, tp__lane).
 *
 * Layer: a leaf (see pool.h): life.c calls it; it calls nothing of
 * libtaskpool's but ring.h's inline functions.
 */
#include "scheduler.h"

#include <string.h>

#define RING_LANE 2u /* lane of priority 0, the default lane: the ring, in a FIFO pool */

/* A helper of the start's hot path, inlined in each caller (gcc would keep
 * one copy for two callers). */
#if defined(__GNUC__)
#define HOT_INLINE static inline __attribute__((always_inline))
#else
#define HOT_INLINE static inline
#endif

static bool is_ring_lane(const tp__sched *s, unsigned li) { return !s->fair && li == RING_LANE; }

/* Tasks waiting in lane li. The default lane's count is the total less the
 * other lanes' (the ring's length, in a FIFO pool): its tp__lane.waiting
 * stays 0, so that a push does not write the line a start writes for it
 * (scheduler.h, tp__lane). */
static unsigned lane_waiting(const tp__sched *s, unsigned li) {
    return li == RING_LANE ? s->waiting - s->in_others : s->lane[li].waiting;
}

/* ------------------------------------------------------------ setup */

int tp__sched_init(tp__sched *s, unsigned capacity, bool fair, unsigned starve_limit, unsigned low_max) {
    memset(s, 0, sizeof *s);
    s->fair = fair;
    s->starve_limit = starve_limit;
    s->low_max = low_max;
    tp__flow_init(&s->anon, 1);
    if (!fair && tp__ring_init(&s->ring, capacity, &s->ring_raw) != 0) return -1;
    return 0;
}

void tp__sched_fini(tp__sched *s) {
    if (s->ring.slots) tp__ring_fini(&s->ring, s->ring_raw);
}

/* ------------------------------------------------------------ publishing */

static uint64_t lane_head_at(const tp__sched *s, unsigned li) {
    if (is_ring_lane(s, li)) return tp__ring_head_at(&s->ring);
    return s->lane[li].ahead_at;
}

/* The lane's waiting count or its head changed. The default lane publishes
 * only its head's stamp (see tp__sched). */
static void lane_waiting_changed(tp__sched *s, unsigned li) {
    tp__lane *l = &s->lane[li];
    if (is_ring_lane(s, li)) {
        TP__SET(s->ring_head_at, tp__ring_head_at(&s->ring));
        return;
    }
    TP__SET(l->head_at_pub, lane_head_at(s, li));
    if (li != RING_LANE) TP__SET(l->waiting_pub, l->waiting);
}

/* ------------------------------------------------------------ lists */

/* The arrival list. Each task keeps its successor's stamp (anext_at), and
 * the lane its head's (ahead_at); a head's `aprev` is never read (it is
 * left as it was when the task before it left). So a start, which takes
 * the head off, learns the new head's stamp from the task it takes and
 * writes nothing of the new head -- in a fair pool that task may be far
 * from starting, its lines still in the submitter's cache. arrival_append
 * returns whether `t` is the lane's new head (the lane was empty). */
static bool arrival_append(tp__lane *l, tp__task *t) {
    t->anext = NULL;
    t->anext_at = 0;
    t->aprev = l->atail;
    bool first = l->atail == NULL;
    if (!first) {
        l->atail->anext = t;
        l->atail->anext_at = t->queued_at;
    } else {
        l->ahead = t;
        l->ahead_at = t->queued_at;
    }
    l->atail = t;
    return first;
}

static void arrival_unlink(tp__lane *l, tp__task *t) {
    bool head = l->ahead == t;
    if (head) {
        l->ahead = t->anext;
        l->ahead_at = t->anext_at;
    } else {
        t->aprev->anext = t->anext;
        t->aprev->anext_at = t->anext_at;
    }
    if (t->anext) {
        if (!head) t->anext->aprev = t->aprev;
    } else {
        l->atail = head ? NULL : t->aprev;
    }
    t->anext = t->aprev = NULL;
}

/* The round. Who points at a flow in it (its predecessor, or the lane for
 * the head) also keeps that flow's head task (rnext_head, rhead_head), so
 * that the start, which finds the next user in the lane's line, knows the
 * next task too without a load of that user's line. */
static void round_append(tp__lane *l, tp__flow *f, unsigned li) {
    struct tp__flow_lane *fl = tp__flow_lane(f, li);
    TP__ASSERT(fl->head);
    fl->rnext = NULL;
    fl->rnext_head = NULL;
    fl->rprev = l->rtail;
    if (l->rtail) {
        struct tp__flow_lane *tl = tp__flow_lane(l->rtail, li);
        tl->rnext = f;
        tl->rnext_head = fl->head;
    } else {
        l->rhead = f;
        l->rhead_head = fl->head;
    }
    l->rtail = f;
    fl->in_round = true;
    fl->credit = 0; /* its turn starts when it reaches the head */
}

/* As in the arrival list above, the head's `rprev` is never read: a turn that
 * ends writes nothing of the next user's flow. */
static void round_unlink(tp__lane *l, tp__flow *f, unsigned li) {
    struct tp__flow_lane *fl = tp__flow_lane(f, li);
    bool head = l->rhead == f;
    if (head) {
        l->rhead = fl->rnext;
        l->rhead_head = fl->rnext_head;
    } else {
        struct tp__flow_lane *pl = tp__flow_lane(fl->rprev, li);
        pl->rnext = fl->rnext;
        pl->rnext_head = fl->rnext_head;
    }
    if (fl->rnext) {
        if (!head) tp__flow_lane(fl->rnext, li)->rprev = fl->rprev;
    } else {
        l->rtail = head ? NULL : fl->rprev;
    }
    fl->rnext = fl->rprev = NULL;
    fl->rnext_head = NULL;
    fl->in_round = false;
    fl->credit = 0;
}

/* A flow's list: as the arrival list, a head's `prev` is never read, so
 * taking the head off writes nothing of the next task. */
static void flow_append(tp__flow *f, unsigned li, tp__task *t) {
    struct tp__flow_lane *fl = tp__flow_lane(f, li);
    t->next = NULL;
    t->prev = fl->tail;
    if (fl->tail)
        fl->tail->next = t;
    else
        fl->head = t;
    fl->tail = t;
}

/* Out of its flow's list; the flow leaves the round when that was its last
 * waiting task in the lane. */
static void flow_unlink(tp__lane *l, tp__task *t, unsigned li) {
    tp__flow *f = t->flow;
    struct tp__flow_lane *fl = tp__flow_lane(f, li);
    bool head = fl->head == t;
    if (head)
        fl->head = t->next;
    else
        t->prev->next = t->next;
    if (t->next) {
        if (!head) t->next->prev = t->prev;
    } else {
        fl->tail = head ? NULL : t->prev;
    }
    t->next = t->prev = NULL;
    if (!fl->head) {
        round_unlink(l, f, li);
    } else if (head) { /* a new head: the copy of the pointer to it too */
        if (l->rhead == f)
            l->rhead_head = fl->head;
        else
            tp__flow_lane(fl->rprev, li)->rnext_head = fl->head;
    }
}

/* ------------------------------------------------------------ push, pop */

void tp__sched_push_lanes(tp__sched *s, tp__task *t) {
    unsigned li = tp__lane_of(t->prio);
    tp__lane *l = &s->lane[li];
    TP__ASSERT(li < TP__LANES);
    s->waiting++;
    if (is_ring_lane(s, li)) {
        tp__ring_push(&s->ring, t);
        if (tp__ring_len(&s->ring) == 1) TP__SET(s->ring_head_at, t->queued_at); /* a new head */
        return;
    }
    bool first = arrival_append(l, t);
    if (s->fair) {
        TP__ASSERT(t->flow);
        struct tp__flow_lane *fl = tp__flow_lane(t->flow, li);
        flow_append(t->flow, li, t);
        if (!fl->in_round) round_append(l, t->flow, li);
    }
    if (first) TP__SET(l->head_at_pub, t->queued_at); /* a new head */
    if (li == RING_LANE) return;                      /* a fair pool's default lane: no count of its own */
    s->in_others++;
    l->waiting++;
    TP__SET(l->waiting_pub, l->waiting);
}

/* The task lane li starts next (it has one). */
static tp__task *lane_head(const tp__sched *s, unsigned li) {
    const tp__lane *l = &s->lane[li];
    if (is_ring_lane(s, li)) return tp__ring_at(&s->ring, 0);
    if (s->fair) {
        TP__ASSERT(l->rhead_head == tp__flow_lane(l->rhead, li)->head);
        return l->rhead_head;
    }
    return l->ahead;
}

/* A fair lane's start: `t` is the head of the round's head flow, whose
 * turn goes on or ends. What flow_unlink, then round_unlink and
 * round_append for a turn that ends, would do, for the one case a start is:
 * the head of the round's head. */
static void fair_take(tp__lane *l, unsigned li, tp__task *t) {
    tp__flow *f = l->rhead;
    struct tp__flow_lane *fl = tp__flow_lane(f, li);
    TP__ASSERT(t->flow == f && fl->head == t && fl->in_round);
    unsigned credit = (fl->credit ? fl->credit : fl->weight) - 1; /* a turn starts at 0 */
    tp__task *nx = t->next;
    t->next = t->prev = NULL;
    fl->head = nx;
    if (!nx) { /* its last task here: it leaves the round */
        fl->tail = NULL;
        round_unlink(l, f, li);
    } else if (credit > 0) { /* its turn goes on */
        fl->credit = credit;
        l->rhead_head = nx;
    } else if (!fl->rnext) { /* its turn ends, alone in the round: the next turn is its own */
        fl->credit = 0;
        l->rhead_head = nx;
    } else { /* its turn ends: to the back of the round */
        struct tp__flow_lane *tl = tp__flow_lane(l->rtail, li);
        l->rhead = fl->rnext;
        l->rhead_head = fl->rnext_head;
        tl->rnext = f;
        tl->rnext_head = nx;
        fl->rprev = l->rtail;
        fl->rnext = NULL;
        fl->rnext_head = NULL;
        fl->credit = 0;
        l->rtail = f;
    }
}

/* Take lane li's head `t` out, as a start: in a fair pool its user's turn
 * goes on or ends. */
static void lane_take(tp__sched *s, unsigned li, tp__task *t) {
    tp__lane *l = &s->lane[li];
    if (is_ring_lane(s, li)) {
        tp__task *h = tp__ring_pop(&s->ring);
        TP__ASSERT(h == t);
        TP__UNUSED(h);
        return;
    }
    if (s->fair) {
        fair_take(l, li, t);
    } else {
        TP__ASSERT(l->ahead == t);
    }
    arrival_unlink(l, t);
    if (li != RING_LANE) s->in_others--;
}

static bool lane_ready(const tp__sched *s, unsigned li, bool low_ok) {
    return lane_waiting(s, li) > 0 && (li >= RING_LANE || low_ok);
}

tp__task *tp__sched_peek_lanes(const tp__sched *s) {
    /* A fair pool's usual case, every waiting task in the default lane, is
     * the caller's (tp__sched_peek); what reaches here has tasks in a list
     * lane, and, in a FIFO pool, possibly in the ring too. */
    TP__ASSERT(s->in_others > 0);
    bool low_ok = s->low_max == 0 || s->low_running < s->low_max;
    int top = -1;
    for (int i = TP__LANES - 1; i >= 0; i--) {
        if (!lane_ready(s, (unsigned)i, low_ok)) continue;
        if (s->starve_limit != TP_UNLIMITED && s->lane[i].starve >= s->starve_limit)
            return lane_head(s, (unsigned)i); /* the highest starved lane */
        if (top < 0) top = i;
    }
    return top < 0 ? NULL : lane_head(s, (unsigned)top);
}

/* A list lane's figures after a start from it: one fewer waiting, one more
 * running, published; and, as the ring's start does (scheduler.h), the lines
 * of the record that starts next from this lane, written on another CPU,
 * start moving here while this task runs: the lane's oldest task in a FIFO
 * list lane, the round head's in a fair pool, with that user's line, which
 * the next start reads and writes. */
HOT_INLINE void list_lane_started(tp__sched *s, tp__lane *l, unsigned li) {
    if (li != RING_LANE) { /* the default lane keeps no count (tp__lane) */
        l->waiting--;
        TP__SET(l->waiting_pub, l->waiting);
    }
    l->running++;
    TP__SET(l->head_at_pub, l->ahead_at);
    TP__SET(l->running_pub, l->running);
    TP__INC(l->started_pub);
    if (l->ahead) {
        const char *nx = (const char *)l->ahead;
        if (s->fair) {
            nx = (const char *)l->rhead_head;
            __builtin_prefetch(tp__flow_lane(l->rhead, li), 1);
        }
        __builtin_prefetch(nx, 1);
        __builtin_prefetch(nx + 64, 1);
    }
}

/* A fair pool's usual start: every waiting task is in the default lane.
 * Then no other lane is ready, so none counts a start that passed it by,
 * and no background task starts: what the general case below does, without
 * its tests (fewer instructions under the pool lock per start). */
static void start_fair_default(tp__sched *s, tp__task *t) {
    tp__lane *l = &s->lane[RING_LANE];
    if (l->starve) l->starve = 0;
    fair_take(l, RING_LANE, t);
    arrival_unlink(l, t);
    s->waiting--;
    list_lane_started(s, l, RING_LANE);
}

void tp__sched_start_lanes(tp__sched *s, tp__task *t) {
    if (tp__sched_fair_default(s)) {
        TP__ASSERT(t->prio == 0);
        start_fair_default(s, t);
        return;
    }
    unsigned li = tp__lane_of(t->prio);
    tp__lane *l = &s->lane[li];
    /* Every ready lane below counts a start that passed it by; the starting
     * lane's count returns to 0. Only a lane with waiting tasks can be
     * ready: none other has any when every waiting task is in this one. */
    if (li > 0 && s->waiting != lane_waiting(s, li)) {
        bool low_ok = s->low_max == 0 || s->low_running < s->low_max;
        for (unsigned i = 0; i < li; i++)
            if (lane_ready(s, i, low_ok) && s->lane[i].starve < UINT_MAX) s->lane[i].starve++;
    }
    if (l->starve) l->starve = 0;
    lane_take(s, li, t);
    s->waiting--;
    if (li < RING_LANE) {
        s->low_running++;
        if (s->low_max && s->low_running >= s->low_max) /* the background lanes stop being ready */
            s->lane[0].starve = s->lane[1].starve = 0;
    }
    if (is_ring_lane(s, li)) { /* its other figures: stats.c, from the totals */
        TP__SET(s->ring_head_at, tp__ring_head_at(&s->ring));
        return;
    }
    list_lane_started(s, l, li);
}

bool tp__sched_done_low(tp__sched *s, const tp__task *t) {
    unsigned li = tp__lane_of(t->prio);
    tp__lane *l = &s->lane[li];
    TP__ASSERT(li < RING_LANE && l->running > 0);
    l->running--;
    TP__SET(l->running_pub, l->running);
    TP__ASSERT(s->low_running > 0);
    bool was_full = s->low_max && s->low_running == s->low_max;
    s->low_running--;
    return was_full && s->lane[0].waiting + s->lane[1].waiting > 0;
}

/* ------------------------------------------------------------ removal */

/* Out of lane li's lists (not the ring); `in_others` kept here, the other
 * counts by the caller. */
static void list_unlink(tp__sched *s, unsigned li, tp__task *t) {
    tp__lane *l = &s->lane[li];
    if (s->fair) flow_unlink(l, t, li);
    arrival_unlink(l, t);
    if (li != RING_LANE) s->in_others--;
}

/* One task fewer waits in lane li (removed, not started). */
static void lane_left(tp__sched *s, unsigned li) {
    tp__lane *l = &s->lane[li];
    TP__ASSERT(s->waiting > 0);
    if (li != RING_LANE) { /* the default lane's count: the total less the others' */
        TP__ASSERT(l->waiting > 0);
        l->waiting--;
    }
    s->waiting--;
    if (lane_waiting(s, li) == 0) l->starve = 0; /* no longer ready */
    lane_waiting_changed(s, li);
}

void tp__sched_remove(tp__sched *s, tp__task *t) {
    unsigned li = tp__lane_of(t->prio);
    if (is_ring_lane(s, li)) {
        int found = tp__ring_remove(&s->ring, t);
        TP__ASSERT(found);
        TP__UNUSED(found);
    } else {
        list_unlink(s, li, t);
    }
    lane_left(s, li);
}

/* A list of taken tasks, linked through `next` in the order taken. */
typedef struct taken {
    tp__task **tail; /* where the next one is linked */
    uint64_t now, next;
    unsigned n;
} taken;

static void taken_add(taken *k, tp__task *t) {
    t->next = NULL;
    *k->tail = t;
    k->tail = &t->next;
    k->n++;
}

static int keep_ring_task(tp__task *t, void *arg) {
    taken *k = (taken *)arg;
    if (k->now >= t->deadline) {
        taken_add(k, t);
        return 0;
    }
    if (t->deadline < k->next) k->next = t->deadline;
    return 1;
}

/* Take out lane li's tasks with deadline <= k->now (every task for
 * TP_FOREVER), in its order. */
static void lane_take_expired(tp__sched *s, unsigned li, taken *k) {
    tp__lane *l = &s->lane[li];
    unsigned before = k->n;
    if (is_ring_lane(s, li)) {
        tp__ring_filter(&s->ring, keep_ring_task, k);
    } else {
        tp__task *t = l->ahead;
        while (t) {
            tp__task *nx = t->anext;
            if (k->now >= t->deadline) {
                list_unlink(s, li, t); /* uses next/prev: before taken_add */
                taken_add(k, t);
            } else if (t->deadline < k->next) {
                k->next = t->deadline;
            }
            t = nx;
        }
    }
    unsigned n = k->n - before;
    if (n == 0) return;
    if (li != RING_LANE) { /* the default lane's count: the total less the others' */
        TP__ASSERT(l->waiting >= n);
        l->waiting -= n;
    }
    s->waiting -= n;
    if (lane_waiting(s, li) == 0) l->starve = 0;
    lane_waiting_changed(s, li);
}

uint64_t tp__sched_take_expired(tp__sched *s, uint64_t now, tp__task **out) {
    *out = NULL;
    taken k = {out, now, TP_FOREVER, 0};
    for (unsigned li = TP__LANES; li-- > 0;)
        if (lane_waiting(s, li)) lane_take_expired(s, li, &k);
    return k.next;
}

void tp__sched_take_all(tp__sched *s, tp__task **out) {
    *out = NULL;
    taken k = {out, TP_FOREVER, TP_FOREVER, 0}; /* now >= every deadline */
    for (unsigned li = TP__LANES; li-- > 0;)
        if (lane_waiting(s, li)) lane_take_expired(s, li, &k);
    TP__ASSERT(s->waiting == 0 && s->in_others == 0);
}
