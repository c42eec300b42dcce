/*
 * life.c -- the task's life and the queue: the one owner of the task state
 * graph.
 *
 * Layer: below pool.c, service.c and worker.c, which drive it; above the leaf
 * structures it uses (ring.h, tasks.c, users.c, ctx.c). It calls nothing
 * above itself: see the layer order in internal.h (tests/check_layers.sh).
 *
 * What it owns (all under the pool lock, `p->mu`, every function `_locked`):
 *   - the task state graph (tp__task.state), with every transition here:
 *       QUEUED -> RUNNING            tp__task_start_locked
 *       RUNNING -> DELAYED           tp__task_after_run_locked (a retry)
 *       DELAYED -> QUEUED            tp__delayed_run_locked (the timer is due)
 *       QUEUED/RUNNING -> DONE       finalise (expired at pop, last attempt)
 *       QUEUED/DELAYED -> ENDING     end_unrun (cancel, forced shutdown,
 *                                    expiry in the queue or while delayed)
 *       DONE/ENDING -> FREE          tp__task_retire_locked (on_done returned)
 *   - the queue: admission into the ring, pops, removals, the expiry scan;
 *     `st.queued` is stored by one helper (queue_changed_locked) after every
 *     change of the ring;
 *   - the delayed list (retries waiting for their timer) and the endings list
 *     (tasks finalised without a run whose on_done is pending);
 *   - the counters of task life: inflight, active, delayed, with_deadline;
 *   - the wake-ups that follow a change: room_cv (submitters waiting for
 *     space or a user slot), work_cv (idle workers), done_cv (shutdown, wait),
 *     svc_cv (the service thread), and the close/drained transitions;
 *   - group membership (SPEC 11.3; group.c owns the group object): a member
 *     joins at admission, leaves the member list when finalised -- where the
 *     first failure becomes the group's error and, with cancel on error,
 *     cancels the other members in the same lock hold, so before the failing
 *     member's worker takes another task -- and stops being unfinished when
 *     retired, which wakes the group's waiters at zero. Members cost no
 *     allocation: the links are in the task record.
 *
 * Hook points (one function each, for per-task instrumentation):
 *   admitted      task_admitted_locked     a new task entered the ring
 *   starts        tp__task_start_locked    an attempt begins on a worker
 *   attempt ends  tp__task_after_run_locked  retry or final
 *   finalised     task_finalise_locked     final status, counted once
 *   retired       tp__task_retire_locked   on_done returned, record reused
 *
 * Exactly once: task_finalise_locked() is the only place that ends a task,
 * reached from a state (QUEUED, RUNNING, DELAYED) that the caller leaves
 * under the same lock; then exactly one thread -- the worker that finalised
 * it (DONE) or the service thread for ENDING tasks -- runs on_done and
 * retires the record (tp__task_finish_locked, tp__endings_run_locked).
 *
 * Lock order: only the pool lock; it is released (and taken again) only
 * around user code: on_done in tp__task_finish_locked and
 * tp__endings_run_locked.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <string.h>

#define TP__ENDINGS_CHUNK 64u

/* ------------------------------------------------------------ setup */

int tp__life_init(tp_pool *p, unsigned full, unsigned prealloc) {
    p->life.queued_deadline_min = TP_FOREVER;
    if (tp__ring_init(&p->life.ring, full) != 0 || tp__tasks_init(&p->life.tasks, prealloc) != 0 ||
        tp__users_init(&p->life.users, 32) != 0)
        return -1;
    return 0;
}

/* Also for a pool whose tp__life_init failed half-way (zeroed parts). */
void tp__life_fini(tp_pool *p) {
    tp__users_fini(&p->life.users);
    tp__tasks_fini(&p->life.tasks);
    tp__ring_fini(&p->life.ring);
}

/* ------------------------------------------------------------ the admission word */

/* Store `adm` again after one of its values changed (the ring length, the
 * delayed count, users_at_limit, closed), before the lock is released, and
 * only once the change itself is made (a user's slot given back before the
 * count of users at their limit drops): each store is the pool's state at
 * that moment, all earlier changes of the critical section included, so a
 * lock-free reader sees either that state or an older one, never one the
 * pool has not reached; a critical section's changes take effect for it at
 * its stores.
 *
 * And before the statistics of the same change (st.queued, st.delayed,
 * st.users): tp_stats_get reads those with acquire, so a thread that has seen
 * queued + delayed below the capacity then sees this word too, and is not
 * refused for space by an older one (release here, acquire in
 * tp__admit_full_fast). Stored after them, a reader could see queued = 0 and
 * still a "full" word. */
static void adm_publish_locked(tp_pool *p) {
    uint64_t w = (uint64_t)(tp__ring_len(&p->life.ring) + p->life.delayed) |
                 (uint64_t)(p->life.users_at_limit & 0x7fffffffu) << 32 | (uint64_t)p->life.closed << 63;
    atomic_store_explicit(&p->life.adm, w, memory_order_release);
}

/*
 * A refusal for lack of space decided without the lock, for a producer that
 * retries on TP_EFULL: it then never takes the lock while the queue is full,
 * and the workers that make room do not wait for it. It answers only where
 * the locked path would answer TP_EFULL too: not closed (TP_ECLOSED is
 * checked first), the queue full, and the task's user, if it has one, below
 * its limit (TP_EUSERLIMIT comes before TP_EFULL), which is known without
 * the user table when no user at all is at its limit. One load of `adm`
 * gives the three values as they were at one moment under the lock, so the
 * refusal is the locked path's answer at that moment (its linearisation
 * point). A word older than the newest store is still a state the pool was
 * in; one that does not say "full" sends the caller to the locked path,
 * which decides exactly, so a pool with room is never refused here.
 */
bool tp__admit_full_fast(tp_pool *p, bool has_user) {
    uint64_t w = atomic_load_explicit(&p->life.adm, memory_order_acquire);
    if ((uint32_t)w < p->cfg.capacity || (w >> 63) != 0) return false;
    return !has_user || ((w >> 32) & 0x7fffffffu) == 0;
}

/* ------------------------------------------------------------ wake-ups */

/* The service thread: an ending, a retry timer or an earlier deadline. */
static void svc_wake_locked(tp_pool *p) {
    if (p->svc.waiting) pthread_cond_signal(&p->svc_cv);
}

/* Room for a tp_submit_wait caller may have appeared. Broadcast, not signal:
 * waiters wait for different things (space, their user's slot), so one wake
 * could go to a caller that still cannot proceed while another could. */
static void signal_room_locked(tp_pool *p) {
    if (p->life.room_waiters) pthread_cond_broadcast(&p->room_cv);
}

int tp__wait_room_locked(tp_pool *p, uint64_t deadline) {
    p->life.room_waiters++;
    int e = tp__wait_locked(p, &p->room_cv, deadline);
    TP__ASSERT(p->life.room_waiters > 0);
    p->life.room_waiters--;
    return e;
}

/* Idle workers re-check whether they may exit. */
static void wake_exiters_locked(tp_pool *p) {
    if (p->life.closed && p->wk.idle_waiters && tp__ring_len(&p->life.ring) == 0 && p->life.delayed == 0)
        pthread_cond_broadcast(&p->work_cv);
}

/* Wake whoever waits for the end: shutdown/wait callers and the service
 * thread, once the pool is closed and nothing is in flight. */
static void drained_check_locked(tp_pool *p) {
    if (p->life.closed && p->life.inflight == 0) {
        pthread_cond_broadcast(&p->done_cv);
        svc_wake_locked(p);
        wake_exiters_locked(p);
    }
}

/* A queued task left the ring for good (cancelled, expired, dropped). */
static void signal_left_queue_locked(tp_pool *p) {
    wake_exiters_locked(p);
    signal_room_locked(p);
}

void tp__close_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    if (p->life.closed) return;
    p->life.closed = true;
    adm_publish_locked(p);
    pthread_cond_broadcast(&p->room_cv);
    pthread_cond_broadcast(&p->work_cv);
    svc_wake_locked(p);
    drained_check_locked(p);
}

void tp__signal_worker_gone_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    if (p->wk.threads == 0) pthread_cond_broadcast(&p->done_cv);
    wake_exiters_locked(p);
    /* A spawn skipped while this slot was still taken (tp__spawn_start finds
     * no free slot) is retried now, by the service thread. */
    if (!p->life.closed && tp__want_spawn_locked(p)) svc_wake_locked(p);
}

/* After work entered the ring: should a worker be added? Only while the
 * backlog exceeds the idle workers plus those still starting (not yet
 * waiting, but about to take work), and the pool is below its maximum; a
 * fixed pool never spawns here. */
bool tp__want_spawn_locked(const tp_pool *p) {
    return p->wk.live_workers < p->cfg.max_workers &&
           tp__ring_len(&p->life.ring) > p->wk.idle_waiters + p->wk.spinners + p->wk.starting;
}

/* A submit may spawn one worker itself (the thread is made after its lock
 * hold); should the backlog want more, as after a batch, the service thread
 * spawns the rest, one after the other. */
void tp__want_more_workers_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    if (!p->life.closed && tp__want_spawn_locked(p)) svc_wake_locked(p);
}

/* ------------------------------------------------------------ the queue */

/* The one place that publishes the queue length (read lock-free by spinning
 * workers, tp_stats_get and, in `adm`, admission). Called after every change
 * of the ring. */
static void queue_changed_locked(tp_pool *p) {
    adm_publish_locked(p); /* first: see adm_publish_locked */
    TP__SET(p->st.queued, tp__ring_len(&p->life.ring));
}

static void queue_remove_locked(tp_pool *p, tp__task *t) {
    int found = tp__ring_remove(&p->life.ring, t);
    TP__ASSERT(found);
    TP__UNUSED(found);
    queue_changed_locked(p);
}

/* ------------------------------------------------------------ group members */

static void group_cancel_members_locked(tp_pool *p, struct tp_group *g);

/* Admitted: `t` joins the end of its group's member list. */
static void group_join_locked(tp__task *t) {
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
 * group's error and, with cancel on error, cancels the others now. */
static void group_member_ended_locked(tp_pool *p, tp__task *t, int status) {
    struct tp_group *g = t->group;
    TP__ASSERT(g->pool == p && g->unfinished > 0);
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
    if ((g->flags & TP_GROUP_CANCEL_ON_ERROR) && !g->cancelled) group_cancel_members_locked(p, g);
}

/* Retired (on_done returned): no longer unfinished. */
static void group_member_retired_locked(tp__task *t) {
    struct tp_group *g = t->group;
    TP__ASSERT(g->unfinished > 0 && !t->g_next && !t->g_prev && g->head != t && g->tail != t);
    t->group = NULL;
    if (--g->unfinished == 0 && g->waiters) pthread_cond_broadcast(&g->cv);
}

void tp__group_link_locked(tp_pool *p, struct tp_group *g) {
    TP__ASSERT_LOCKED(p);
    g->p_prev = NULL;
    g->p_next = p->life.groups;
    if (p->life.groups) p->life.groups->p_prev = g;
    p->life.groups = g;
}

void tp__group_unlink_locked(tp_pool *p, struct tp_group *g) {
    TP__ASSERT_LOCKED(p);
    TP__ASSERT(g->unfinished == 0 && !g->head);
    if (g->p_prev)
        g->p_prev->p_next = g->p_next;
    else
        p->life.groups = g->p_next;
    if (g->p_next) g->p_next->p_prev = g->p_prev;
    g->p_next = g->p_prev = NULL;
}

void tp__groups_detach(tp_pool *p) {
    for (struct tp_group *g = p->life.groups; g; g = g->p_next) {
        TP__ASSERT(g->unfinished == 0 && !g->head && g->waiters == 0);
        g->pool = NULL;
    }
    p->life.groups = NULL;
}

/* ------------------------------------------------------------ endings */

static bool is_cancel_status(int status) { return status == TP_ECANCELED || status == TP_ETIMEDOUT; }

/* Hook point "finalised": the task has its final status; counted once. Then
 * exactly one thread runs its on_done and retires it. */
static void task_finalise_locked(tp_pool *p, tp__task *t, int status, bool expired) {
    TP__ASSERT(t->state == TP__QUEUED || t->state == TP__RUNNING || t->state == TP__DELAYED);
    tp__tasks_unindex(&p->life.tasks, t);
    if (t->deadline != TP_FOREVER) {
        TP__ASSERT(p->life.with_deadline > 0);
        p->life.with_deadline--;
    }
    if (t->user) {
        bool was_at_limit = t->user->count == p->cfg.max_per_user;
        unsigned live = p->life.users.live;
        tp__users_release(&p->life.users, t->user); /* may recycle the entry: not read again */
        if (was_at_limit) {
            /* Published after the release, never before: the word may lag
             * the pool but never show a state it has not reached yet. */
            TP__ASSERT(p->life.users_at_limit > 0);
            p->life.users_at_limit--;
            adm_publish_locked(p);
        }
        /* stored only when it changes: the gauge's cache line stays put */
        if (p->life.users.live != live) TP__SET(p->st.users, p->life.users.live);
        signal_room_locked(p);
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
    if (t->group) group_member_ended_locked(p, t, status); /* may end other members */
}

/* Hook point "retired": on_done has returned (or there was none); the record
 * can be reused. */
void tp__task_retire_locked(tp_pool *p, tp__task *t) {
    TP__ASSERT_LOCKED(p);
    TP__ASSERT(t->state == TP__DONE || t->state == TP__ENDING);
    TP__ASSERT(p->life.inflight > 0);
    if (t->group) group_member_retired_locked(t);
    t->user = NULL;
    if (!p->life.tasks.free) signal_room_locked(p); /* records were at their cap */
    tp__tasks_put(&p->life.tasks, t);
    p->life.inflight--;
    drained_check_locked(p);
}

/* A task leaves the ring or the delayed list without (another) run: finalise
 * it now and hand its on_done to the service thread, which runs it promptly
 * even when every worker is busy. The caller has already taken it off its
 * list. */
static void end_unrun_locked(tp_pool *p, tp__task *t, int status, bool expired) {
    task_finalise_locked(p, t, status, expired);
    if (!t->on_done) {
        tp__task_retire_locked(p, t); /* nothing to run: no need to wait for the service thread */
        return;
    }
    t->state = TP__ENDING;
    t->next = NULL;
    if (p->life.endings_tail)
        p->life.endings_tail->next = t;
    else
        p->life.endings_head = t;
    p->life.endings_tail = t;
    svc_wake_locked(p);
}

bool tp__endings_pending_locked(const tp_pool *p) { return p->life.endings_head != NULL; }

void tp__endings_run_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    tp__task *list = p->life.endings_head;
    p->life.endings_head = p->life.endings_tail = NULL;
    /* Run the on_done calls in chunks and give each chunk's records back
     * under one lock: one lock round-trip per chunk keeps the service thread
     * ahead of a cancel storm, and a chunk is short enough not to sit on
     * records that admission may be waiting for. */
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
        while (chunk != list) {
            tp__task *nx = chunk->next;
            tp__task_retire_locked(p, chunk);
            chunk = nx;
        }
    }
}

/* Run on_done (mu released), then retire. Entered and left with mu held. */
void tp__task_finish_locked(tp_pool *p, tp__task *t) {
    TP__ASSERT_LOCKED(p);
    TP__ASSERT(t->state == TP__DONE);
    if (t->on_done) {
        tp__unlock(p);
        tp__tls_enter_task(t);
        t->on_done(t->arg, t->status);
        tp__tls_leave_task();
        tp__lock(p);
    }
    tp__task_retire_locked(p, t);
}

/* ------------------------------------------------------------ delayed list */

static void delayed_push_locked(tp_pool *p, tp__task *t) {
    t->next = NULL;
    t->prev = p->life.delayed_tail;
    if (p->life.delayed_tail)
        p->life.delayed_tail->next = t;
    else
        p->life.delayed_head = t;
    p->life.delayed_tail = t;
    p->life.delayed++;
    adm_publish_locked(p);
    TP__SET(p->st.delayed, p->life.delayed);
}

static void delayed_remove_locked(tp_pool *p, tp__task *t) {
    TP__ASSERT(t->state == TP__DELAYED);
    TP__ASSERT(p->life.delayed > 0);
    if (t->prev)
        t->prev->next = t->next;
    else
        p->life.delayed_head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        p->life.delayed_tail = t->prev;
    t->next = t->prev = NULL;
    p->life.delayed--;
    adm_publish_locked(p);
    TP__SET(p->st.delayed, p->life.delayed);
}

/* Move due retries to the ring and end those whose deadline passed. The
 * delay is the same for every task, so the list is in due order; deadlines
 * are arbitrary, so each pass looks at every delayed task. Returns the next
 * time something on the list needs attention. */
uint64_t tp__delayed_run_locked(tp_pool *p, uint64_t now) {
    TP__ASSERT_LOCKED(p);
    uint64_t next = TP_FOREVER;
    unsigned queued = 0;
    tp__task *t = p->life.delayed_head;
    while (t) {
        tp__task *nx = t->next;
        if (now >= t->deadline) {
            delayed_remove_locked(p, t);
            end_unrun_locked(p, t, TP_ETIMEDOUT, false); /* it ran: not expired */
            signal_room_locked(p);
            /* Ending it may have ended others, `nx` among them (a group's
             * cancel on error): then start over, the list is shorter. */
            if (nx && nx->state != TP__DELAYED) nx = p->life.delayed_head;
        } else if (now >= t->due) {
            delayed_remove_locked(p, t); /* asserts DELAYED */
            t->state = TP__QUEUED;
            t->queued_at = tp__hclk_now(); /* the queue-wait histogram measures from here */
            tp__ring_push(&p->life.ring, t);
            if (t->deadline < p->life.queued_deadline_min) p->life.queued_deadline_min = t->deadline;
            queued++;
        } else {
            if (t->due < next) next = t->due;
            if (t->deadline < next) next = t->deadline;
        }
        t = nx;
    }
    if (queued) {
        queue_changed_locked(p);
        /* one wake per task: idle workers that find nothing would only go
         * back to sleep */
        for (unsigned i = 0; i < queued && i < p->wk.idle_waiters; i++) pthread_cond_signal(&p->work_cv);
    }
    wake_exiters_locked(p);
    return next;
}

/* ------------------------------------------------------------ queue expiry */

typedef struct expiry {
    uint64_t now, next;
    tp__task *head, *tail; /* taken out of the ring, ended after the pass */
} expiry;

/* Ending a task may end others (a group's cancel on error), which would move
 * entries of the ring under the filter: expired tasks are only collected
 * here (still QUEUED, linked through `next`) and ended after the pass. */
static int keep_unexpired_locked(tp__task *t, void *arg) {
    expiry *e = (expiry *)arg;
    if (e->now >= t->deadline) {
        t->next = NULL;
        if (e->tail)
            e->tail->next = t;
        else
            e->head = t;
        e->tail = t;
        return 0;
    }
    if (t->deadline < e->next) e->next = t->deadline;
    return 1;
}

/* Queued tasks whose deadline has passed end now, without running, so their
 * on_done is prompt and their queue place and user slot free up even while
 * every worker is busy. (A worker that pops one first expires it the same
 * way.) Returns when to look again.
 *
 * The scan walks the ring with the lock held, so it runs only when it can
 * find something: `queued_deadline_min` is a lower bound of the queued
 * deadlines (lowered at every push, made exact by each scan; pops leave it
 * low, which only costs a scan), and scans are spaced by at least 1 ms, more
 * for long queues, so a queue full of staggered deadlines is handled in
 * batches instead of one O(queue) pass per expiry. */
uint64_t tp__queue_expire_locked(tp_pool *p, uint64_t now) {
    TP__ASSERT_LOCKED(p);
    if (p->life.with_deadline == 0 || tp__ring_len(&p->life.ring) == 0) {
        p->life.queued_deadline_min = TP_FOREVER;
        return TP_FOREVER;
    }
    uint64_t due = p->life.queued_deadline_min > p->life.expiry_scan_at ? p->life.queued_deadline_min
                                                                        : p->life.expiry_scan_at;
    if (now < due) return due;
    expiry e = {now, TP_FOREVER, NULL, NULL};
    if (tp__ring_filter(&p->life.ring, keep_unexpired_locked, &e) > 0) {
        queue_changed_locked(p);
        while (e.head) {
            tp__task *t = e.head;
            e.head = t->next; /* before end_unrun_locked reuses `next` */
            /* never ran: expired; a retry back in the queue ran: cancelled */
            end_unrun_locked(p, t, TP_ETIMEDOUT, t->attempt == 0);
        }
        signal_left_queue_locked(p);
    }
    p->life.queued_deadline_min = e.next;
    p->life.expiry_scan_at = now + 1000000ull + 16ull * tp__ring_len(&p->life.ring);
    return e.next > p->life.expiry_scan_at ? e.next : p->life.expiry_scan_at;
}

/* ------------------------------------------------------------ admission */

/* Hook point "admitted": `t` is filled in and gets its id, its index entry
 * and its place at the back of the ring. `wake`: signal an idle worker for
 * it now (a batch wakes them once, after its last task: tp__work_signal_locked). */
static void task_admitted_locked(tp_pool *p, tp__task *t, bool wake) {
    t->id = ++p->life.next_id;
    tp__tasks_index(&p->life.tasks, t);
    tp__ring_push(&p->life.ring, t);
    if (t->deadline != TP_FOREVER) {
        /* The service thread ends it at its deadline if no worker picked it
         * by then; wake it if this deadline comes before its own wake-up. */
        p->life.with_deadline++;
        if (t->deadline < p->life.queued_deadline_min) p->life.queued_deadline_min = t->deadline;
        if (t->deadline < p->svc.next) svc_wake_locked(p);
    }
    p->life.inflight++;
    if (t->group) group_join_locked(t);
    TP__INC(p->st.accepted);
    queue_changed_locked(p);
    if (wake) tp__work_signal_locked(p, 1);
}

void tp__work_signal_locked(tp_pool *p, size_t n) {
    TP__ASSERT_LOCKED(p);
    /* A spinning worker takes new tasks without a wake-up; it wakes a
     * sleeper itself if more work is left (tp__queue_pop_locked). Else one
     * signal per task, as far as there are sleepers. */
    if (p->wk.spinners) return;
    for (size_t i = 0; i < n && i < p->wk.idle_waiters; i++) pthread_cond_signal(&p->work_cv);
}

int tp__admit_locked(tp_pool *p, const tp__admit_args *a, void *arg, uint64_t *id_out, bool wake) {
    TP__ASSERT_LOCKED(p);
    tp__user *found = NULL;
    if (a->user) {
        found = tp__users_find(&p->life.users, a->user, a->user_len, a->user_hash);
        if (found && found->count >= p->cfg.max_per_user) return TP_EUSERLIMIT; /* never for TP_UNLIMITED */
    }
    if (tp__ring_len(&p->life.ring) + p->life.delayed >= p->cfg.capacity) return TP_EFULL;

    /* Reserve. Refused with nothing reserved when the records are at their
     * cap (TP_EFULL) or cannot grow (TP_ENOMEM); see tp_create(). */
    tp__task *t = NULL;
    int rc = tp__tasks_get(&p->life.tasks, p->cfg.max_records, &t);
    if (rc != TP_OK) return rc;
    tp__user *u = NULL;
    if (a->user) {
        u = tp__users_take(&p->life.users, found, a->user, a->user_len, a->user_hash);
        if (!u) {
            tp__tasks_put(&p->life.tasks, t);
            return TP_ENOMEM;
        }
        if (!found) TP__SET(p->st.users, p->life.users.live);          /* a new entry: one more user */
        if (u->count == p->cfg.max_per_user) p->life.users_at_limit++; /* published with the ring below */
    }
    t->fn = a->fn;
    t->arg = arg;
    t->on_done = a->on_done;
    t->run_timeout = a->run_timeout;
    t->deadline = a->deadline;
    t->user = u;
    t->group = a->group;
    t->worker = NULL;
    t->attempt = 0;
    t->status = 0;
    t->state = TP__QUEUED;
    /* the queue-wait histogram measures from here: the caller's stamp taken
     * before the lock (pool.c), or, from a caller that has none, one now */
    t->queued_at = a->now ? a->now : tp__hclk_now();
    if (a->log_src) {
        memcpy(t->log_id, a->log_src, a->log_len);
        t->log_id[a->log_len] = '\0';
        t->log_gen = 0;
    } else {
        t->log_id[0] = '\0';
        t->log_gen = p->cfg.serial; /* non-zero: generate from pool serial + id */
    }
    task_admitted_locked(p, t, wake);
    if (id_out) *id_out = t->id;
    return TP_OK;
}

/* ------------------------------------------------------------ running */

tp__task *tp__queue_pop_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    tp__task *t = tp__ring_pop(&p->life.ring);
    TP__ASSERT(t->state == TP__QUEUED);
    /* The next pop's record, most likely written on another CPU: start
     * moving its two hot lines here now, while this task runs. */
    if (tp__ring_len(&p->life.ring) > 0) {
        const char *nx = (const char *)tp__ring_at(&p->life.ring, 0);
        __builtin_prefetch(nx, 1);
        __builtin_prefetch(nx + 64, 1);
    }
    queue_changed_locked(p);
    signal_room_locked(p);
    wake_exiters_locked(p);
    /* Submitters do not wake anyone while a worker spins: pass work on. */
    if (tp__ring_len(&p->life.ring) > 0 && p->wk.idle_waiters && !p->wk.spinners)
        pthread_cond_signal(&p->work_cv);
    return t;
}

bool tp__task_expired_locked(tp_pool *p, tp__task *t) {
    TP__ASSERT_LOCKED(p);
    /* The clock is read under the lock only for a task with a deadline. */
    if (t->deadline == TP_FOREVER || tp_now_ns() < t->deadline) return false;
    /* Expired in the queue. A retry that comes back after its deadline ran
     * before: cancelled, not expired. */
    task_finalise_locked(p, t, TP_ETIMEDOUT, t->attempt == 0);
    return true;
}

/* Hook point "starts". The run timeout is added to ctx.deadline by the
 * worker right after it unlocks (tp__ctx_arm_run_timeout), so the clock is
 * not read under the lock; the worker records the histograms then too
 * (hist.h). */
void tp__task_start_locked(tp_pool *p, tp__worker *w, tp__task *t) {
    TP__ASSERT_LOCKED(p);
    TP__ASSERT(t->state == TP__QUEUED && !w->cur);
    t->state = TP__RUNNING;
    t->worker = w;
    w->cur = t;
    p->life.active++;
    TP__SET(p->st.active, p->life.active);
    if (t->attempt == 0)
        TP__INC(p->st.started);
    else
        TP__INC(p->st.retried);
    tp__ctx_begin(&w->ctx, t);
}

/* Hook point "attempt ends": the attempt returned `rc`; retry or finalise.
 * Returns true when a retry was scheduled (then the record belongs to the
 * delayed list and may be cancelled and reused as soon as mu is released). */
bool tp__task_after_run_locked(tp_pool *p, tp__worker *w, tp__task *t, int rc) {
    TP__ASSERT_LOCKED(p);
    TP__ASSERT(t->state == TP__RUNNING && w->cur == t);
    TP__ASSERT(p->life.active > 0);
    bool cancelled = tp__ctx_end_locked(&w->ctx);
    w->cur = NULL;
    p->life.active--;
    TP__SET(p->st.active, p->life.active);
    t->worker = NULL;
    bool may_retry = rc != 0 && !cancelled && !p->life.forced && t->attempt < p->cfg.max_retries;
    uint64_t now = may_retry ? tp_now_ns() : 0; /* no clock read on success */
    if (may_retry && now < t->deadline) {
        t->attempt++;
        t->state = TP__DELAYED;
        t->due = tp__deadline_after(now, p->cfg.retry_delay);
        delayed_push_locked(p, t);
        svc_wake_locked(p);
        return true;
    }
    task_finalise_locked(p, t, rc, false);
    return false;
}

/* ------------------------------------------------------------ cancel */

/* Cancel `t`, QUEUED (in the ring), DELAYED or RUNNING, as tp_cancel does. */
static void cancel_task_locked(tp_pool *p, tp__task *t) {
    switch (t->state) {
    case TP__QUEUED:
        queue_remove_locked(p, t);
        end_unrun_locked(p, t, TP_ECANCELED, false);
        signal_left_queue_locked(p);
        break;
    case TP__DELAYED:
        delayed_remove_locked(p, t);
        end_unrun_locked(p, t, TP_ECANCELED, false);
        signal_left_queue_locked(p);
        break;
    case TP__RUNNING: tp__ctx_cancel_locked(t->worker); break;
    default: TP__ASSERT(!"cancel of a finalised task");
    }
}

int tp__cancel_locked(tp_pool *p, uint64_t id) {
    TP__ASSERT_LOCKED(p);
    tp__task *t = tp__tasks_find(&p->life.tasks, id);
    if (!t) return TP_ENOTFOUND; /* finalised tasks leave the index */
    cancel_task_locked(p, t);
    return TP_OK;
}

/* Every member not yet finalised, oldest first. Ending one re-enters
 * group_member_ended_locked for that member only (the group is marked
 * cancelled first, so no walk starts inside this one): it unlinks it and
 * nothing else, so the next pointer read before stays valid. A QUEUED member
 * that is not in the ring was taken out by the expiry pass, which ends it
 * right after: it is passed by. */
static void group_cancel_members_locked(tp_pool *p, struct tp_group *g) {
    g->cancelled = true;
    tp__task *t = g->head;
    while (t) {
        tp__task *nx = t->g_next;
        TP__ASSERT(t->group == g);
        if (t->state != TP__QUEUED || tp__ring_holds(&p->life.ring, t)) cancel_task_locked(p, t);
        t = nx;
    }
}

void tp__group_cancel_locked(tp_pool *p, struct tp_group *g) {
    TP__ASSERT_LOCKED(p);
    group_cancel_members_locked(p, g);
}

/* Forced shutdown: cancel running tasks, end queued and delayed ones unrun. */
void tp__force_locked(tp_pool *p) {
    TP__ASSERT_LOCKED(p);
    p->life.forced = true;
    for (unsigned i = 0; i < p->cfg.max_workers; i++)
        if (p->wk.workers[i].cur) tp__ctx_cancel_locked(&p->wk.workers[i]);
    while (tp__ring_len(&p->life.ring) > 0) {
        tp__task *t = tp__ring_pop(&p->life.ring);
        queue_changed_locked(p);
        end_unrun_locked(p, t, TP_ECANCELED, false);
    }
    while (p->life.delayed_head) {
        tp__task *t = p->life.delayed_head;
        delayed_remove_locked(p, t);
        end_unrun_locked(p, t, TP_ECANCELED, false);
    }
    signal_left_queue_locked(p);
}
