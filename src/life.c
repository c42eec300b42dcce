/*
 * life.c -- the life of a task: the one owner of the task state graph.
 *
 * Every function runs with the pool lock held by its caller and is a
 * transition of task records; none knows a thread or a condition variable.
 * What a transition made possible goes into the caller's tp__fx (life.h),
 * and the engine wakes whoever waits for it.
 *
 * The state graph (tp__task.state), every edge here:
 *
 *     admit ──▶ QUEUED ──take──▶ RUNNING ──attempt ended──▶ DONE ──retire──▶ FREE
 *                 ▲  │                        │               ▲
 *                 │  │ deadline at take       │ retry         │ (expired)
 *                 │  └────────────────────────┼───────────────┘
 *        timers   │                           ▼
 *   (delay over)  └─────────────────────── DELAYED
 *
 *     QUEUED, DELAYED ──end unrun (cancel, forced shutdown, deadline)──▶ ENDING ──retire──▶ FREE
 *
 *   A task is *finalised* exactly once (finalise(): out of the id index, its
 *   user slot given back, counted, its group told), from QUEUED, RUNNING or
 *   DELAYED, which the caller leaves under the same lock. Then exactly one
 *   thread runs its on_done and retires the record: the worker that
 *   finalised it (DONE), or the service thread (ENDING: it never ran). A task
 *   bound to a completion queue has its completion queued by finalise, before
 *   anything else, and is retired at once: its on_done runs in tp_cq_drain,
 *   on the application's thread. A task without an on_done is retired at
 *   once too.
 *
 * Cancel on error. A failing member of a TP_GROUP_CANCEL_ON_ERROR group
 * cancels the other members before the lock is released (so before its
 * worker takes another task), but not inside finalise: the group is queued
 * (coe_pending) and every entry point runs the queued cancels last
 * (run_group_cancels). So no walk of the scheduler, the delayed list or a
 * member list ever sees a task end under its feet.
 *
 * What it owns, besides the state: the records and the id index (tasks.c),
 * the user slots (users.c), the waiting tasks (through scheduler.c), the delayed
 * list (retries waiting for their delay), the endings list (on_done calls
 * for the service thread), the counters of task life (inflight, active,
 * delayed, with_deadline), the admission word, the statistics that count
 * tasks, and group membership.
 *
 * Layer: below engine.c, pool.c and group.c, which call it with the lock
 * held; above the leaves it uses (scheduler.c, tasks.c, users.c, cq.c, ctx.c).
 * One call goes up, through a pointer the engine sets where the pool stages:
 * admit_staged (life.h), before the default lane would seem empty.
 */
#include "life.h"

#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "clock.h"
#include "group.h"

/* ------------------------------------------------------------ setup */

/* The room count's basis (sched.pub.basis) while the count is not kept:
 * more than waiting + delayed can ever be (room_live, below). */
#define TP__ROOM_OFF UINT32_MAX

/* The submitter's hot fields fill its line; the published words and the
 * scheduler's hot fields share the scheduler's first (life.h). */
_Static_assert(offsetof(tp__life, tasks) + offsetof(tp__tasks, indexed) + sizeof(bool) <=
                   offsetof(tp__life, next_id) + 64,
               "admission's fields leave the submitter's line");
_Static_assert(offsetof(tp__sched, given) + sizeof(uint64_t) <= 64,
               "the scheduler's hot fields leave the published words' line");

int tp__life_init(tp__life *L, const tp__life_cfg *cfg, tp__st_calls *calls, tp__st_gauges *gauges,
                  unsigned prealloc, bool fair, unsigned starve_limit, unsigned low_max) {
    L->cfg = *cfg;
    L->calls = calls;
    L->gauges = gauges;
    L->queued_deadline_min = TP_FOREVER;
    atomic_init(&L->room_taken, 0); /* (set when kept: tp__life_room_start) */
    atomic_init(&L->room_seen, 0);
    atomic_init(&L->room_back, 0);
    atomic_init(&L->sched.given, 0);
    L->room_capacity = (int64_t)cfg->capacity;
    atomic_init(&L->room_live, false);
    L->rel_n = 0;
    L->users_put = NULL;    /* set by the engine where the pool stages */
    L->admit_staged = NULL; /* likewise */
    L->stage_keep = NULL;
    L->stage_all = NULL;
    L->stage_joins = NULL;
    L->admit_staged_arg = NULL;
    if (tp__sched_init(&L->sched, cfg->waiting_max, fair, starve_limit, low_max) != 0 ||
        tp__tasks_init(&L->tasks, prealloc, cfg->waiting_max, fair ? 3 : 2) != 0 ||
        tp__users_init(&L->users, 32) != 0)
        return -1;
    L->sched.pub.basis = TP__ROOM_OFF; /* the room count is not kept yet (room_live) */
    L->users.flows = fair;
    return 0;
}

void tp__life_fini(tp__life *L) {
    tp__users_fini(&L->users);
    tp__tasks_fini(&L->tasks);
    tp__sched_fini(&L->sched);
}

/* ------------------------------------------------------------ the admission word */

/* Store `adm` again after one of its values changed (the waiting count, the
 * delayed count, users_at_limit, closed), before the lock is released, and
 * only once the change itself is made (a user's slot given back before the
 * count of users at their limit drops): each store is the pool's state at
 * that moment, so a lock-free reader sees that state or an older one, never
 * one the pool has not reached. One exception, on the safe side: delayed_run
 * moves a due retry from the delayed list to the queue in two steps
 * (delayed_remove stores the word before the push, queue_changed after the
 * pass), so a reader may meanwhile see queued + delayed lower by the retries
 * moved so far in that pass. A lower count never refuses (the fast path
 * refuses only a word that says full; the locked path decides the rest).
 *
 * And before the statistics of the same change (the published waiting count, the delayed and
 * users gauges): tp_stats_get reads those with acquire, so a thread that has seen
 * queued + delayed below the capacity then sees this word too, and is not
 * refused for space by an older one (release here, acquire in
 * tp__life_full_fast). */
static void room_sync(tp__life *L);

/* Whether the room count is kept (life.h), with the lock held: its basis is
 * TP__ROOM_OFF until then, a word on the line that every push and start
 * write anyway (room_live, on the count's own line, is for the submitters
 * without the lock: a worker that read it would fetch that line once more
 * per task, besides its add). */
static bool room_live(const tp__life *L) { return L->sched.pub.basis != TP__ROOM_OFF; }

static void adm_publish(tp__life *L) {
    uint64_t w = (uint64_t)(tp__sched_waiting(&L->sched) + L->delayed) |
                 (uint64_t)(L->users_at_limit & 0x7fffffffu) << 32 | (uint64_t)L->closed << 63;
    atomic_store_explicit(&L->sched.pub.word, w, memory_order_release);
    if (!L->room_hold) room_sync(L);
}

void tp__life_room_start(tp__life *L) {
    if (room_live(L)) return;
    /* No place was taken without the lock before this: the count is the
     * free places the waiting set leaves, exactly. */
    uint32_t now = tp__sched_waiting(&L->sched) + L->delayed;
    L->sched.pub.basis = now;
    atomic_store_explicit(&L->room_taken, (int64_t)now,
                          memory_order_relaxed); /* given, room_back and seen are 0 */
    atomic_store_explicit(&L->room_live, true, memory_order_release);
}

/* The places that waiting + delayed changed by since the room count last saw
 * them, as one store to given (its writers hold the lock) or one atomic add
 * to room_taken (life.h, `room_taken`). An admission took its place before
 * its task waits, and counts it in the basis itself (admit). */
static void room_sync(tp__life *L) {
    uint32_t now = tp__sched_waiting(&L->sched) + L->delayed;
    uint32_t was = L->sched.pub.basis;
    if (now == was || was == TP__ROOM_OFF) return;
    L->sched.pub.basis = now;
    if (now < was)
        atomic_store_explicit(&L->sched.given,
                              atomic_load_explicit(&L->sched.given, memory_order_relaxed) + (was - now),
                              memory_order_release);
    else /* it grew without a place taken (a retry delayed): as if it took them */
        atomic_fetch_add_explicit(&L->room_taken, (int64_t)now - (int64_t)was, memory_order_release);
}

/*
 * A refusal for lack of space decided without the lock, for a producer that
 * retries on TP_EFULL: it then never takes the lock while the queue is full,
 * and the workers that make room do not wait for it. It answers only where
 * the locked path would answer TP_EFULL too: not closed (TP_ECLOSED comes
 * first), the queue full, and the task's user, if it has one, below its limit
 * (TP_EUSERLIMIT comes before TP_EFULL), which is known without the user
 * table when no user at all is at its limit. One load gives the three values
 * of one moment under the lock, so the refusal is the locked path's answer at
 * that moment. A word that does not say "full" sends the caller to the locked
 * path, which decides exactly.
 */
bool tp__life_full_fast(tp__life *L, bool has_user) {
    uint64_t w = atomic_load_explicit(&L->sched.pub.word, memory_order_acquire);
    if ((uint32_t)w < L->cfg.capacity || (w >> 63) != 0) return false;
    return !has_user || ((w >> 32) & 0x7fffffffu) == 0;
}

/* The waiting set changed: publish the admission word, then the gauge. */
static void queue_changed(tp__life *L) {
    adm_publish(L);
    TP__SET(L->sched.pub.count, tp__sched_waiting(&L->sched));
}

/* One more task waits and may start now (a background task may not, while
 * enough of them run): a worker can take it. */
static void work_for(const tp__life *L, const tp__task *t, tp__fx *fx) {
    const tp__sched *s = &L->sched;
    if (t->prio >= 0 || s->low_max == 0 || s->low_running < s->low_max) fx->work++;
}

/* `t` waits in the scheduler and is about to leave it without a start. In a
 * pool that stages, the staged tasks wait in the default lane behind every
 * task of that lane here (stage.h): if `t` is that lane's last here, the
 * oldest of them is admitted first (life.h, admit_staged), or the lane
 * would seem empty while they wait -- a lower lane would start ahead of
 * them. */
static void before_unwait(tp__life *L, const tp__task *t);

/* A fair pool that stages: `t` waits in the scheduler and is about to leave
 * it (started, or not). A staged task of a user in the round (stage_ok,
 * users.h) joins its user's flow in the default lane without moving the
 * user, as an admission at its submit would have. So while such tasks of
 * t's user are staged, t must not leave as its user's last task there: that
 * would end the user's turn and place it, and them, at the back of the
 * round. Then they are admitted first (stage_keep, life.h) and this returns
 * true (the caller looks at the scheduler again); else the user's next
 * staged tasks join the round (stage_ok cleared), and this returns false.
 * t->next is t's follower in its flow. */
static bool fair_leave(tp__life *L, const tp__task *t) {
    if (!L->stage_keep || t->prio != 0 || !t->user || t->next) return false;
    if (!atomic_load_explicit(&t->user->stage_ok, memory_order_relaxed)) return false;
    return L->stage_keep(L->admit_staged_arg, t->user);
}

static void before_unwait(tp__life *L, const tp__task *t) {
    if (L->sched.fair) {
        /* A task of t's user that joins the round may be staged (its user
         * not flagged, so fair_leave would not look): admitted at its
         * submit, it would follow t in the flow and keep the user's place.
         * Admitted first (stage_joins: only if one may wait), so t is not
         * its user's last; a cancel, unlike a start, admits nothing else. */
        if (L->stage_joins && t->prio == 0 && t->user && !t->next) L->stage_joins(L->admit_staged_arg);
        (void)fair_leave(L, t); /* t stays where it was: the caller removes it */
        return;
    }
    if (L->admit_staged && t->prio == 0 && tp__sched_default_waiting(&L->sched) == 1)
        L->admit_staged(L->admit_staged_arg);
}

/* Closed and nothing waits: idle workers may exit. */
static void check_exiters(const tp__life *L, tp__fx *fx) {
    if (L->closed && tp__life_idle(L)) fx->flags |= TP__FX_EXITERS;
}

/* ------------------------------------------------------------ group members */

/* Admitted: `t` joins the end of its group's member list. */
static void group_join(tp__task *t) {
    struct tp_group *g = t->group;
    t->g_next = NULL;
    t->g_prev = g->tail;
    if (g->tail)
        g->tail->g_next = t;
    else
        g->head = t;
    g->tail = t;
    g->unfinished++;
}

/* Finalised with `status`: off the member list; the first failure is the
 * group's error and, with cancel on error, queues the group's cancel. */
static void group_member_ended(tp__life *L, tp__task *t, int status) {
    struct tp_group *g = t->group;
    TP__ASSERT(g->unfinished > 0);
    if (t->g_prev)
        t->g_prev->g_next = t->g_next;
    else
        g->head = t->g_next;
    if (t->g_next)
        t->g_next->g_prev = t->g_prev;
    else
        g->tail = t->g_prev;
    t->g_next = t->g_prev = NULL;
    if (status == 0 || g->err != 0) return;
    g->err = status;
    if ((g->flags & TP_GROUP_CANCEL_ON_ERROR) && !g->cancelled && !g->coe_queued) {
        g->coe_queued = true;
        g->coe_next = L->coe_pending;
        L->coe_pending = g;
    }
}

/* Retired: no longer unfinished; its waiters wake at zero. */
static void group_member_retired(tp__task *t, tp__fx *fx) {
    struct tp_group *g = t->group;
    TP__ASSERT(g->unfinished > 0 && !t->g_next && !t->g_prev && g->head != t && g->tail != t);
    t->group = NULL;
    if (--g->unfinished == 0 && g->waiters && !g->wake_queued) {
        g->wake_queued = true;
        g->wake_next = fx->groups;
        fx->groups = g;
    }
}

void tp__life_group_link(tp__life *L, struct tp_group *g) {
    g->p_prev = NULL;
    g->p_next = L->groups;
    if (L->groups) L->groups->p_prev = g;
    L->groups = g;
}

void tp__life_group_unlink(tp__life *L, struct tp_group *g) {
    TP__ASSERT(g->unfinished == 0 && !g->head);
    if (g->p_prev)
        g->p_prev->p_next = g->p_next;
    else
        L->groups = g->p_next;
    if (g->p_next) g->p_next->p_prev = g->p_prev;
    g->p_next = g->p_prev = NULL;
}

void tp__life_groups_detach(tp__life *L) {
    for (struct tp_group *g = L->groups; g; g = g->p_next) {
        TP__ASSERT(g->unfinished == 0 && !g->head && g->waiters == 0);
        g->pool = NULL;
    }
    L->groups = NULL;
}

/* ------------------------------------------------------------ endings */

static bool is_cancel_status(int status) { return status == TP_ECANCELED || status == TP_ETIMEDOUT; }

/* The record can be reused: on_done has returned, or there was none, or it
 * went to a completion queue. */
static void retire(tp__life *L, tp__task *t, tp__fx *fx) {
    TP__ASSERT(t->state == TP__DONE || t->state == TP__ENDING);
    TP__ASSERT(tp__life_inflight(L) > 0);
    if (t->group) group_member_retired(t, fx);
    t->user = NULL;
    /* Records may have been at their cap: a waiting submitter looks again.
     * A submitter is refused for records while the tasks in flight are at
     * least max_records (admit); the record that brings them below tells
     * it. (Admission's own list is the submitter's line, not read here.) */
    if (tp__life_inflight(L) == L->cfg.max_records) fx->flags |= TP__FX_ROOM;
    tp__tasks_give(&L->given, t);
    L->retired++;
    if (L->closed && tp__life_inflight(L) == 0) fx->flags |= TP__FX_DRAINED;
}

/* ------------------------------------------------------------ user slots given back */

/* One slot given back now; the table guarded (mu, and put where it stages). */
static void user_release_now(tp__life *L, tp__user *u) {
    TP__ASSERT(u->kept == 0); /* kept slots go back first: the entry may go idle here */
    bool was_at_limit = tp__user_at_limit(&L->users, u, L->cfg.max_per_user);
    TP__ASSERT(was_at_limit == (tp__user_count(u) == L->cfg.max_per_user));
    if (was_at_limit) u->at_limit = false; /* split only: elsewhere never set */
    unsigned live = L->users.live;
    tp__users_release(&L->users, u); /* the entry may go idle (users.h): not read again */
    if (was_at_limit) {
        /* Published after the release, never before: the word may lag
         * the pool but never show a state it has not reached yet. */
        TP__ASSERT(L->users_at_limit > 0);
        L->users_at_limit--;
        adm_publish(L);
    }
    /* stored only when it changes: the gauge's cache line stays put */
    if (L->users.live != live) TP__SET(L->gauges->users, L->users.live);
}

#if defined(TP__DEBUG)
/* How many of u's slots `rel` keeps: what u->kept counts. */
static unsigned kept_of(const tp__life *L, const tp__user *u) {
    unsigned n = 0;
    for (unsigned i = 0; i < L->rel_n; i++) n += L->rel[i] == u;
    return n;
}
#endif
_Static_assert(TP__REL_MAX <= UCHAR_MAX, "a user's kept slots fit its entry's byte (users.h, kept)");

/* mu and put held: the kept slots given back (life.h, `rel`); each user's
 * kept count returns to 0 before its slots go back (its entry may go idle
 * with the last). */
static void users_flush_put(tp__life *L) {
#if defined(TP__DEBUG)
    for (unsigned i = 0; i < L->rel_n; i++) /* each count agrees, and is not its user's last slots */
        TP__ASSERT(L->rel[i]->kept == kept_of(L, L->rel[i]) && tp__user_count(L->rel[i]) > L->rel[i]->kept);
#endif
    for (unsigned i = 0; i < L->rel_n; i++) {
        L->rel[i]->kept = 0;
        user_release_now(L, L->rel[i]);
    }
    L->rel_n = 0;
}

void tp__life_users_flush(tp__life *L) {
    if (L->rel_n == 0) return;
    tp__mutex_lock(L->users_put);
    users_flush_put(L);
    tp__mutex_unlock(L->users_put);
}

/* A task's slot given back, mu held. In a pool that stages, it is kept
 * (life.h, `rel`) while tasks wait in the queue, fewer than TP__REL_MAX are
 * kept, and the user holds more slots than those kept for it with this one
 * (so a worker ending tasks back to back takes put once per TP__REL_MAX);
 * else every kept slot and this one go back under one hold of put. So a
 * user's last slot is never kept: an entry goes idle at once, the users
 * gauge is exact as without keeping, and a pool at rest keeps none. Only
 * users_at_limit may stay high while a slot of a user at its limit is kept
 * (the lock-free refusal then sends a submit to the locked path). The count is
 * read under mu alone: a staged submit may raise it meanwhile, never lower
 * it (put holders that lower it hold mu too), so a count read above the
 * kept slots stays above them. */
static void user_release(tp__life *L, tp__user *u) {
    if (!L->users_put) {
        user_release_now(L, u);
        return;
    }
    if (L->rel_n < TP__REL_MAX && tp__sched_waiting(&L->sched) > 0) {
        if (tp__user_holds_more(&L->users, u, u->kept + 1u)) { /* those kept and this one */
            L->rel[L->rel_n++] = u;
            u->kept++;
            TP__ASSERT(u->kept == kept_of(L, u));
            return;
        }
    }
    tp__mutex_lock(L->users_put);
    users_flush_put(L);
    user_release_now(L, u);
    tp__mutex_unlock(L->users_put);
}

/* The entry of a's user if it holds fewer slots than its limit minus one:
 * one more never brings it to its limit (life.h, users_put). */
static tp__user *user_below(tp__life *L, const tp__admit_args *a) {
    TP__ASSERT_HELD(L->users_put);
    tp__user *u = tp__users_find(&L->users, a->user, a->user_len, a->user_hash);
    return u && tp__user_below(u, L->cfg.max_per_user, 1) ? u : NULL;
}

tp__user *tp__life_user_below(tp__life *L, const tp__admit_args *a) { return user_below(L, a); }

void tp__life_user_take_staged(tp__life *L, tp__user *u, const tp__admit_args *a) {
    TP__ASSERT_HELD(L->users_put);
    TP__ASSERT(tp__user_count(u) + 1 < L->cfg.max_per_user);
    unsigned live = L->users.live;
    u = tp__users_take(&L->users, u, a->user, a->user_len, a->user_hash);
    if (L->users.live != live) TP__SET(L->gauges->users, L->users.live); /* one more user */
}

/* The task has its final status: counted once. A task bound to a completion
 * queue has its completion queued first, and is retired here; so is a task
 * without an on_done (nothing is left to run). Else it stays DONE for the
 * caller, who runs its on_done and retires it.
 *
 * The completion is queued under the pool's lock, in the same critical
 * section that counts the task and releases its user slot: a drained on_done
 * may run before this section ends, but any call it makes that takes the
 * pool's lock (tp_submit*, tp_user_active, tp_cancel, tp_wait) sees the task
 * ended and its slot free (taskpool.h, section 15): an on_done that submits
 * its own user's next task is not refused TP_EUSERLIMIT by the slot of the
 * task it reports. */
static void finalise(tp__life *L, tp__task *t, int status, bool expired, tp__fx *fx) {
    TP__ASSERT(t->state == TP__QUEUED || t->state == TP__RUNNING || t->state == TP__DELAYED);
    if (t->cq) tp__cq_push(t->cq, t->on_done, t->arg, status); /* before anything counts it */
    /* (it stays in the id index until its record is reused: task.h) */
    if (t->deadline != TP_FOREVER) {
        TP__ASSERT(L->with_deadline > 0);
        L->with_deadline--;
    }
    if (t->user) {
        user_release(L, t->user); /* the entry may go idle (users.h): not read again */
        fx->flags |= TP__FX_ROOM;
    }
    t->status = status;
    t->state = TP__DONE;
    tp__st_runs *r = fx->runs;
    TP__INC(r->completed);
    if (status == 0) {
        TP__INC(r->succeeded);
    } else {
        TP__INC(r->failed);
        if (is_cancel_status(status)) TP__INC(r->cancelled);
        if (expired) TP__INC(r->expired);
    }
    if (t->group) group_member_ended(L, t, status);
    if (t->cq || !t->on_done) retire(L, t, fx);
}

/* A task leaves the scheduler or the delayed list without (another) run:
 * finalise it, and hand its on_done to the service thread, which runs it
 * promptly even when every worker is busy. The caller took it off its list. */
static void end_unrun(tp__life *L, tp__task *t, int status, bool expired, tp__fx *fx) {
    finalise(L, t, status, expired, fx);
    if (t->state != TP__DONE) return; /* retired: nothing to run, or its completion waits in its queue */
    t->state = TP__ENDING;
    t->next = NULL;
    if (L->endings_tail)
        L->endings_tail->next = t;
    else
        L->endings_head = t;
    L->endings_tail = t;
    fx->flags |= TP__FX_SVC;
}

tp__task *tp__life_take_endings(tp__life *L) {
    tp__task *list = L->endings_head;
    L->endings_head = L->endings_tail = NULL;
    return list;
}

void tp__life_retire(tp__life *L, tp__task *t, tp__fx *fx) { retire(L, t, fx); }

/* ------------------------------------------------------------ the delayed list */

static void delayed_push(tp__life *L, tp__task *t) {
    t->next = NULL;
    t->prev = L->delayed_tail;
    if (L->delayed_tail)
        L->delayed_tail->next = t;
    else
        L->delayed_head = t;
    L->delayed_tail = t;
    L->delayed++;
    adm_publish(L);
    TP__SET(L->gauges->delayed, L->delayed);
}

static void delayed_remove(tp__life *L, tp__task *t) {
    TP__ASSERT(t->state == TP__DELAYED && L->delayed > 0);
    if (t->prev)
        t->prev->next = t->next;
    else
        L->delayed_head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        L->delayed_tail = t->prev;
    t->next = t->prev = NULL;
    L->delayed--;
    adm_publish(L);
    TP__SET(L->gauges->delayed, L->delayed);
}

/* Computed without overflow: a shift that would pass the maximum gives it. */
uint64_t tp__life_retry_delay(const tp__life *L, unsigned k) {
    const tp__life_cfg *c = &L->cfg;
    if (!c->retry_delay_max) return c->retry_delay;
    unsigned shift = k - 1;
    if (shift >= 64 || c->retry_delay > (c->retry_delay_max >> shift)) return c->retry_delay_max;
    uint64_t d = c->retry_delay << shift;
    return d < c->retry_delay_max ? d : c->retry_delay_max;
}

/* ------------------------------------------------------------ cancel on error */

/* Cancel `t`, waiting, delayed or running, as tp_cancel does. */
static void cancel_task(tp__life *L, tp__task *t, tp__fx *fx) {
    switch (t->state) {
    case TP__QUEUED:
        before_unwait(L, t);
        tp__sched_remove(&L->sched, t);
        queue_changed(L);
        end_unrun(L, t, TP_ECANCELED, false, fx);
        fx->flags |= TP__FX_ROOM;
        check_exiters(L, fx);
        break;
    case TP__DELAYED:
        delayed_remove(L, t);
        end_unrun(L, t, TP_ECANCELED, false, fx);
        fx->flags |= TP__FX_ROOM;
        check_exiters(L, fx);
        break;
    case TP__RUNNING: tp__ctx_cancel_locked(t->ctx); break;
    default: TP__ASSERT(!"cancel of a finalised task");
    }
}

/* Every member not yet finalised, oldest first. Ending one unlinks only that
 * member (cancels of other groups it causes are queued), so the next pointer
 * read before stays valid. */
static void group_cancel_members(tp__life *L, struct tp_group *g, tp__fx *fx) {
    g->cancelled = true;
    tp__task *t = g->head;
    while (t) {
        tp__task *nx = t->g_next;
        TP__ASSERT(t->group == g);
        cancel_task(L, t, fx);
        t = nx;
    }
}

/* The cancels that failing members of cancel-on-error groups queued: run by
 * every entry point before it returns, so within the lock hold in which the
 * member failed. */
static void run_group_cancels(tp__life *L, tp__fx *fx) {
    while (L->coe_pending) {
        struct tp_group *g = L->coe_pending;
        L->coe_pending = g->coe_next;
        g->coe_next = NULL;
        g->coe_queued = false;
        if (!g->cancelled) group_cancel_members(L, g, fx);
    }
}

void tp__life_group_cancel(tp__life *L, struct tp_group *g, tp__fx *fx) {
    group_cancel_members(L, g, fx);
    run_group_cancels(L, fx);
}

int tp__life_cancel(tp__life *L, uint64_t id, tp__fx *fx) {
    if (!L->tasks.indexed) tp__tasks_index_all(&L->tasks); /* once: the pool's first cancel by id */
    tp__task *t = tp__tasks_find(&L->tasks, id);
    if (!t || (t->state != TP__QUEUED && t->state != TP__DELAYED && t->state != TP__RUNNING))
        return TP_ENOTFOUND; /* unknown, or ended (its record may wait for its on_done, or be free) */
    cancel_task(L, t, fx);
    run_group_cancels(L, fx);
    return TP_OK;
}

/* ------------------------------------------------------------ admission */

/* The checks of tp__life_args_check but the user name's length. */
static int args_check_but_user(tp_fn fn, const tp_task_opts *opts) {
    if (!fn) return TP_EINVAL;
    if (!opts) return TP_OK;
    if (opts->priority < TP_PRIO_MIN || opts->priority > TP_PRIO_MAX || !TP__RESERVED_ZERO(opts))
        return TP_EINVAL;
    if (opts->cq && !opts->on_done) return TP_EINVAL;
    if (opts->log_id && strnlen(opts->log_id, TP_LOG_ID_MAX + 1) > TP_LOG_ID_MAX) return TP_EINVAL;
    return TP_OK;
}

int tp__life_args_check(tp_fn fn, const tp_task_opts *opts) {
    int rc = args_check_but_user(fn, opts);
    if (rc == TP_OK && opts && opts->user && strnlen(opts->user, TP_USER_MAX + 1) > TP_USER_MAX)
        rc = TP_EINVAL;
    return rc;
}

int tp__life_args(const tp__life *L, tp_fn fn, const tp_task_opts *opts, tp__admit_args *a) {
    int rc = args_check_but_user(fn, opts);
    if (rc != TP_OK) return rc;
    /* Field by field: compilers make a memset (or a compound literal) of
     * this size a string instruction (rep stos), whose start-up cost the
     * submitter more per task than these stores (docs/performance.md). */
    a->group = NULL;
    a->fn = fn;
    a->on_done = NULL;
    a->cq = NULL;
    a->run_timeout = L->cfg.run_timeout;
    a->deadline = TP_FOREVER;
    a->user = NULL;
    a->user_len = 0;
    a->user_hash = 0;
    a->prio = 0;
    a->join = false;
    a->log_src = NULL;
    a->log_len = 0;
    a->now = 0;
    const char *explicit_log = NULL;
    if (opts) {
        if (opts->user && opts->user[0]) {
            /* the name is read once: its length checked and its hash taken */
            a->user_len = tp__users_scan(opts->user, &a->user_hash);
            if (a->user_len > TP_USER_MAX) return TP_EINVAL;
            a->user = opts->user;
        }
        if (opts->run_timeout_ns) a->run_timeout = opts->run_timeout_ns;
        if (opts->deadline_ns) a->deadline = opts->deadline_ns;
        a->on_done = opts->on_done;
        a->cq = opts->cq;
        a->prio = opts->priority;
        explicit_log = opts->log_id;
    }
    /* an inherited log id is cut to TP_LOG_ID_MAX; only an explicit one can be too long (checked) */
    if (tp__log_id_source(explicit_log, &a->log_src, &a->log_len) != 0) return TP_EINVAL;
    return TP_OK;
}

/* Admission proper. `staged`: the task's place, and its completion queue's
 * if it has one, were taken and it was counted as accepted when it was
 * staged (stage.h); it has no group, no user name in `a` (the slot of its
 * user `staged_user`, if any, was taken then too), and only a failed
 * allocation refuses it. */
static int admit(tp__life *L, const tp__admit_args *a, void *arg, uint64_t *id_out, tp__fx *fx, bool staged,
                 tp__user *staged_user) {
    tp__user *found = NULL;
    if (a->user) {
        /* Where the pool stages, put guards the table (life.h): the kept
         * slots go back first, so the count is exact. Between this look and
         * the take below a staged submit may take a slot of `found`, but
         * never its last one, nor add or evict an entry (life.h): the
         * answer stands. */
        if (L->users_put) {
            tp__mutex_lock(L->users_put);
            users_flush_put(L);
        }
        found = tp__users_find(&L->users, a->user, a->user_len, a->user_hash);
        bool at_limit = found && !tp__user_below(found, L->cfg.max_per_user, 0); /* never for TP_UNLIMITED */
        if (L->users_put) tp__mutex_unlock(L->users_put);
        if (at_limit) return TP_EUSERLIMIT;
    }
    /* Space: queued + delayed + staged < capacity, decided by the room
     * count, which staged submits take from without the lock (before the
     * pool's first one, by the waiting set's count: life.h). The queue's
     * place is taken last (after a look at the count), so that a place is
     * never held for a moment by a submit that the completion queue then
     * refuses: a staged submit meanwhile would be refused for nothing. */
    if (!staged) {
        bool live = room_live(L);
        bool full =
            live ? tp__life_room_full(L) : tp__sched_waiting(&L->sched) + L->delayed >= L->cfg.capacity;
        if (full) return TP_EFULL;
        if (a->cq && !tp__cq_reserve(a->cq)) return TP__EFULL_CQ;
        if (live && !tp__life_room_take(L)) { /* a staged submit took the last one meanwhile */
            if (a->cq) tp__cq_release(a->cq, 1);
            return TP_EFULL;
        }
    }

    /* Reserve. Refused with nothing reserved when the records are at their
     * cap (TP_EFULL) or cannot grow (TP_ENOMEM); see pool.c. A staged task
     * has a higher cap (pool.c): it was accepted already. The cap is on the
     * records in use (the tasks in flight), not only on those allocated: a
     * free record that a staged admission grew past max_records would
     * otherwise let locked tasks hold more than max_records, and leave a
     * staged task that was accepted without one. */
    tp__task *t = NULL;
    unsigned limit = staged ? L->cfg.max_records_staged : L->cfg.max_records;
    TP__ASSERT(!staged || tp__life_inflight(L) < limit); /* pool.c: the staged cap covers them */
    int rc = tp__life_inflight(L) >= limit ? TP_EFULL : tp__tasks_get(&L->tasks, &L->given, limit, &t);
    tp__user *u = staged_user;
    if (rc == TP_OK && a->user) {
        if (L->users_put) tp__mutex_lock(L->users_put);
        unsigned live = L->users.live;
        u = tp__users_take(&L->users, found, a->user, a->user_len, a->user_hash);
        if (u) {
            if (L->users.live != live) TP__SET(L->gauges->users, L->users.live); /* one more user */
            if (!tp__user_below(u, L->cfg.max_per_user, 0)) {                    /* at its limit now */
                u->at_limit = L->users.split;                                    /* tp__user_at_limit */
                L->users_at_limit++; /* published with the queue below */
            }
        }
        if (L->users_put) tp__mutex_unlock(L->users_put);
        if (!u) {
            tp__tasks_put(&L->tasks, t);
            rc = TP_ENOMEM;
        }
    }
    if (rc != TP_OK) {
        if (!staged) { /* a staged task's places are the caller's (tp__life_staged_lost) */
            if (a->cq) tp__cq_release(a->cq, 1);
            if (room_live(L)) tp__life_room_give(L);
        }
        return rc;
    }
    t->fn = a->fn;
    t->arg = arg;
    t->on_done = a->on_done;
    t->cq = a->cq;
    t->run_timeout = a->run_timeout;
    t->deadline = a->deadline;
    t->user = u;
    if (L->sched.fair) t->flow = u ? &u->flow : &L->sched.anon; /* read in fair pools only */
    t->group = a->group;
    t->ctx = NULL;
    t->attempt = 0;
    t->prio = (int8_t)a->prio;
    t->status = 0;
    t->state = TP__QUEUED;
    /* the queue-wait histogram measures from here: the caller's stamp taken
     * before the lock, or, from a caller that has none, one now */
    t->queued_at = a->now ? a->now : tp__hclk_now();
    if (a->log_src) {
        memcpy(t->log_id, a->log_src, a->log_len);
        t->log_id[a->log_len] = '\0';
        t->log_gen = 0;
    } else {
        /* log_id is written only when someone asks for it (tp__task_log_id):
         * its cache line is not touched per task */
        t->log_gen = L->cfg.serial; /* non-zero: generate from pool serial + id */
    }
    t->id = ++L->next_id;
    if (L->tasks.indexed) tp__tasks_index(&L->tasks, t); /* from the pool's first cancel by id (task.h) */
    if (t->deadline != TP_FOREVER) {
        /* The service thread ends it at its deadline if no worker took it
         * by then: it must look no later than that. */
        L->with_deadline++;
        if (t->deadline < L->queued_deadline_min) L->queued_deadline_min = t->deadline;
        if (t->deadline < fx->svc_by) fx->svc_by = t->deadline;
    }
    L->admitted++;
    if (t->group) group_join(t);
    if (!staged) TP__INC(L->calls->accepted);
    tp__sched_push(&L->sched, t);
    /* A fair pool that stages: a user whose task joins others of its own in
     * the default lane is in that lane's round, and its next tasks may wait
     * staged behind them (users.h, stage_ok; engine.c). Not for a user's
     * only task there: it leaves the round at that task's start, which
     * would then take put. Looked at for a locked admission and a staged
     * one that joined (a staged task of a user with the flag set leaves it
     * set: its entry's line is not read). */
    if (u && L->stage_keep && (!staged || a->join) && t->prio == 0 &&
        tp__flow_lane(&u->flow, tp__lane_of(0))->head != t &&
        !atomic_load_explicit(&u->stage_ok, memory_order_relaxed))
        atomic_store_explicit(&u->stage_ok, true, memory_order_relaxed);
    if (room_live(L)) L->sched.pub.basis++; /* its place is taken already */
    queue_changed(L);
    work_for(L, t, fx);
    if (id_out) *id_out = t->id;
    return TP_OK;
}

int tp__life_admit(tp__life *L, const tp__admit_args *a, void *arg, uint64_t *id_out, tp__fx *fx) {
    return admit(L, a, arg, id_out, fx, false, NULL);
}

int tp__life_admit_staged(tp__life *L, const tp__admit_args *a, void *arg, tp__user *u, tp__fx *fx) {
    TP__ASSERT(!a->user && !a->group && (a->cq != NULL) == (a->on_done != NULL) && (!a->join || u));
    return admit(L, a, arg, NULL, fx, true, u);
}

void tp__life_staged_lost(tp__life *L, const tp__admit_args *a, void *arg, tp__user *u, tp__fx *fx) {
    /* as finalise: the completion first (its place was taken when staged) */
    if (a->cq) tp__cq_push(a->cq, a->on_done, arg, TP_ENOMEM);
    if (u) user_release(L, u);
    tp__life_room_give(L);
    tp__st_runs *r = fx->runs;
    TP__INC(r->completed);
    TP__INC(r->failed);
    fx->flags |= TP__FX_ROOM;
    check_exiters(L, fx);
}

void tp__life_close(tp__life *L, tp__fx *fx) {
    if (L->closed) return;
    L->closed = true;
    adm_publish(L);
    fx->flags |= TP__FX_ROOM; /* waiting submitters see it */
    fx->flags |= TP__FX_SVC;
    fx->flags |= TP__FX_EXITERS;
    if (tp__life_inflight(L) == 0) fx->flags |= TP__FX_DRAINED;
}

void tp__life_force(tp__life *L, tp__fx *fx) {
    L->forced = true;
    fx->flags |= TP__FX_CANCEL;
    tp__task *list;
    tp__sched_take_all(&L->sched, &list);
    queue_changed(L);
    while (list) {
        tp__task *t = list;
        list = t->next; /* before end_unrun reuses `next` */
        end_unrun(L, t, TP_ECANCELED, false, fx);
    }
    while (L->delayed_head) {
        tp__task *t = L->delayed_head;
        delayed_remove(L, t);
        end_unrun(L, t, TP_ECANCELED, false, fx);
    }
    fx->flags |= TP__FX_ROOM;
    check_exiters(L, fx);
    run_group_cancels(L, fx);
}

/* ------------------------------------------------------------ running */

tp__task *tp__life_take(tp__life *L, struct tp_ctx *c, tp__fx *fx) {
    /* a staged task that joins the round takes its place before any start */
    if (L->stage_joins) L->stage_joins(L->admit_staged_arg);
    for (;;) {
        tp__task *t = tp__sched_peek(&L->sched);
        if (!t) return NULL;
        TP__ASSERT(t->state == TP__QUEUED);
        fx->flags |= TP__FX_ROOM; /* a waiting submitter may find space */
        /* The clock is read under the lock only for a task with a deadline. */
        if (t->deadline != TP_FOREVER && tp_now_ns() >= t->deadline) {
            /* Its deadline passed while it waited: it ends without running
             * (expired; a retry back in the queue ran before: cancelled). */
            before_unwait(L, t);
            tp__sched_remove(&L->sched, t);
            queue_changed(L);
            check_exiters(L, fx);
            finalise(L, t, TP_ETIMEDOUT, t->attempt == 0, fx);
            run_group_cancels(L, fx);
            if (t->state == TP__DONE) return t; /* the caller runs its on_done, then retires it */
            continue;
        }
        if (fair_leave(L, t)) continue; /* its user's staged tasks admitted: look again */
        tp__sched_start(&L->sched, t);
        queue_changed(L);
        check_exiters(L, fx);
        t->state = TP__RUNNING;
        t->ctx = c;
        tp__st_runs *r = fx->runs;
        TP__INC(r->active);
        if (t->attempt == 0)
            TP__INC(r->started);
        else
            TP__INC(r->retried);
        if (tp__sched_from_ring(&L->sched, t)) TP__INC(r->ring_started); /* lane 0's own count (stats.c) */
        tp__ctx_begin(c, t);
        return t;
    }
}

bool tp__life_attempt_ended(tp__life *L, tp__task *t, int rc, tp__fx *fx) {
    TP__ASSERT(t->state == TP__RUNNING && TP__LOAD(fx->runs->active) > 0);
    bool cancelled = tp__ctx_end_locked(t->ctx);
    t->ctx = NULL;
    if (tp__sched_done(&L->sched, t)) fx->work++; /* a background lane may start again */
    TP__DEC(fx->runs->active);                    /* the set its start counted in: the same worker's */
    bool may_retry = rc != 0 && !cancelled && !L->forced && t->attempt < L->cfg.max_retries;
    uint64_t now = may_retry ? tp_now_ns() : 0; /* no clock read on success */
    if (may_retry && now < t->deadline) {
        t->attempt++;
        t->state = TP__DELAYED;
        t->due = tp__deadline_after(now, tp__life_retry_delay(L, t->attempt));
        delayed_push(L, t);
        fx->flags |= TP__FX_SVC;
        return true;
    }
    finalise(L, t, rc, false, fx);
    run_group_cancels(L, fx);
    return false;
}

/* ------------------------------------------------------------ timers */

/* A list linked by `next`, sorted by `due`, stably (equal dues keep their
 * order): a merge sort, O(n log n) for the retries of one late pass. */
static tp__task *sort_by_due(tp__task *list) {
    if (!list || !list->next) return list;
    tp__task *slow = list, *fast = list->next;
    while (fast && fast->next) {
        slow = slow->next;
        fast = fast->next->next;
    }
    tp__task *b = slow->next;
    slow->next = NULL;
    tp__task *a = sort_by_due(list), *head = NULL, **tail = &head;
    b = sort_by_due(b);
    while (a && b) {
        tp__task **from = b->due < a->due ? &b : &a; /* a first on a tie: stable */
        *tail = *from;
        tail = &(*from)->next;
        *from = (*from)->next;
    }
    *tail = a ? a : b;
    return head;
}

/* Due retries go back to the scheduler, and delayed tasks whose deadline
 * passed end. Each pass looks at every delayed task (delays and deadlines
 * differ per task); returns the next time one needs attention. A retry goes
 * to the back of its lane when its delay ends (SPEC 5): the retries that one
 * pass finds due (more than one when it comes late) go back in the order of
 * their due times, which with backoff (SPEC 14) is not the order they
 * failed in, the delayed list's. */
static uint64_t delayed_run(tp__life *L, uint64_t now, tp__fx *fx) {
    uint64_t next = TP_FOREVER;
    tp__task *t = L->delayed_head;
    while (t) {
        tp__task *nx = t->next;
        if (now >= t->deadline) {
            delayed_remove(L, t);
            end_unrun(L, t, TP_ETIMEDOUT, false, fx); /* it ran: not expired */
            fx->flags |= TP__FX_ROOM;
        } else if (now < t->due) {
            if (t->due < next) next = t->due;
            if (t->deadline < next) next = t->deadline;
        }
        t = nx;
    }
    /* The due ones leave the delayed list before they wait again: the room
     * count (life.h) sees the move as a whole, never a place in between
     * that a staged submit could take. Nothing runs between their removal
     * and their push but this list's moves. */
    tp__task *due = NULL, **due_tail = &due;
    L->room_hold = true;
    for (t = L->delayed_head; t;) {
        tp__task *nx = t->next;
        if (now >= t->due) {
            delayed_remove(L, t); /* asserts DELAYED */
            *due_tail = t;
            due_tail = &t->next;
        }
        t = nx;
    }
    bool queued = due != NULL;
    for (t = sort_by_due(due); t;) {
        tp__task *nx = t->next;
        t->next = NULL;
        t->state = TP__QUEUED;
        t->queued_at = tp__hclk_now(); /* the queue-wait histogram measures from here */
        tp__sched_push(&L->sched, t);
        if (t->deadline < L->queued_deadline_min) L->queued_deadline_min = t->deadline;
        work_for(L, t, fx);
        t = nx;
    }
    L->room_hold = false;
    room_sync(L); /* nothing to add: waiting + delayed did not change */
    if (queued) queue_changed(L);
    check_exiters(L, fx);
    return next;
}

/* Waiting tasks whose deadline has passed end now, without running, so their
 * on_done is prompt and their place and user slot free up even while every
 * worker is busy. (A worker that takes one first ends it the same way.)
 * Returns when to look again.
 *
 * The scan visits every waiting task with the lock held, so it runs only
 * when it can find something: `queued_deadline_min` is a lower bound of the
 * waiting deadlines (lowered at every push, made exact by each scan; starts
 * leave it low, which only costs a scan), and scans are spaced by at least
 * 1 ms, more for long queues, so a queue full of staggered deadlines is
 * handled in batches instead of one O(queue) pass per expiry. */
static uint64_t queue_expire(tp__life *L, uint64_t now, tp__fx *fx) {
    if (L->with_deadline == 0 || tp__sched_waiting(&L->sched) == 0) {
        L->queued_deadline_min = TP_FOREVER;
        return TP_FOREVER;
    }
    uint64_t due = L->queued_deadline_min > L->expiry_scan_at ? L->queued_deadline_min : L->expiry_scan_at;
    if (now < due) return due;
    /* The scan may leave the default lane empty: the oldest staged task
     * first, which has no deadline (as before_unwait does for one task). In
     * a fair pool it may take a user's last task there out of the round:
     * every staged task first, then each such user is seen to after the
     * scan (fair_leave; a task of it staged meanwhile is admitted then,
     * as if submitted after the scan). */
    if (L->stage_all)
        L->stage_all(L->admit_staged_arg);
    else if (L->admit_staged && tp__sched_default_waiting(&L->sched) > 0)
        L->admit_staged(L->admit_staged_arg);
    tp__task *list;
    uint64_t next = tp__sched_take_expired(&L->sched, now, &list);
    if (list) {
        queue_changed(L);
        if (L->stage_keep)
            for (tp__task *t = list; t; t = t->next)
                if (t->prio == 0 && t->user &&
                    atomic_load_explicit(&t->user->stage_ok, memory_order_relaxed) &&
                    !tp__flow_lane(&t->user->flow, tp__lane_of(0))->in_round)
                    (void)L->stage_keep(L->admit_staged_arg, t->user);
        while (list) {
            tp__task *t = list;
            list = t->next; /* before end_unrun reuses `next` */
            /* never ran: expired; a retry back in the queue ran: cancelled */
            end_unrun(L, t, TP_ETIMEDOUT, t->attempt == 0, fx);
        }
        fx->flags |= TP__FX_ROOM;
        check_exiters(L, fx);
    }
    L->queued_deadline_min = next;
    L->expiry_scan_at = now + 1000000ull + 16ull * tp__sched_waiting(&L->sched);
    return next > L->expiry_scan_at ? next : L->expiry_scan_at;
}

uint64_t tp__life_timers(tp__life *L, uint64_t now, tp__fx *fx) {
    uint64_t next = delayed_run(L, now, fx);
    uint64_t next_expiry = queue_expire(L, now, fx);
    run_group_cancels(L, fx);
    return next_expiry < next ? next_expiry : next;
}

/* ------------------------------------------------------------ weights */

int tp__life_set_weight(tp__life *L, const char *user, size_t len, unsigned weight) {
    if (len == 0) {
        tp__flow_set_weight(&L->sched.anon, weight); /* from its next turn */
        return TP_OK;
    }
    return tp__users_set_weight(&L->users, user, len, tp__users_hash(user, len), weight);
}
