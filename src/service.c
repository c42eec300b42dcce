/*
 * service.c -- the pool's one service thread.
 *
 * It does the work that must not need a free worker:
 *   - deadlines of queued tasks: one that passes before a worker picks the
 *     task ends it without running (expired), at once;
 *   - on_done of tasks that ended without running (cancelled while queued or
 *     waiting for a retry, dropped by a forced shutdown, deadline passed while
 *     waiting for a retry): they are put on the endings list, already
 *     finalised, and run here promptly even when every worker is busy;
 *   - retry timers: a failed attempt waits on the delayed list without holding
 *     a worker; when its fixed delay has passed it goes to the back of the
 *     ring. The delay is the same for every task, so the list is in due order;
 *     deadlines are arbitrary, so each pass looks at every delayed task.
 *
 * Loop invariant: mu is held at the top of each turn. It exits when the pool
 * is closed and nothing is in flight (no accepted task can need it again).
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <errno.h>
#include <stdio.h>


#define TP__ENDINGS_CHUNK 64u

void tp__svc_wake(tp_pool *p) {
    if (p->svc_waiting) pthread_cond_signal(&p->svc_cv);
}

void tp__delayed_remove(tp_pool *p, tp__task *t) {
    if (t->prev)
        t->prev->next = t->next;
    else
        p->delayed_head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        p->delayed_tail = t->prev;
    t->next = t->prev = NULL;
    p->delayed--;
    TP__SET(p->st.delayed, p->delayed);
}

/* Move due retries to the ring and end those whose deadline passed. Returns the
 * next time something on the list needs attention. mu held. */
static uint64_t run_timers(tp_pool *p, uint64_t now) {
    uint64_t next = TP_FOREVER;
    unsigned queued = 0;
    tp__task *t = p->delayed_head;
    while (t) {
        tp__task *nx = t->next;
        if (now >= t->deadline) {
            tp__delayed_remove(p, t);
            tp__task_end_unrun(p, t, TP_ETIMEDOUT, false); /* it ran: not expired */
            tp__signal_room(p);
        } else if (now >= t->due) {
            tp__delayed_remove(p, t);
            t->state = TP__QUEUED;
            tp__ring_push(&p->ring, t);
            if (t->deadline < p->queued_deadline_min) p->queued_deadline_min = t->deadline;
            queued++;
        } else {
            if (t->due < next) next = t->due;
            if (t->deadline < next) next = t->deadline;
        }
        t = nx;
    }
    if (queued) {
        TP__SET(p->st.queued, tp__ring_len(&p->ring));
        /* one wake per task: idle workers that find nothing would only go
         * back to sleep */
        for (unsigned i = 0; i < queued && i < p->idle_waiters; i++) pthread_cond_signal(&p->work_cv);
    }
    tp__wake_exiters(p);
    return next;
}

typedef struct expiry {
    tp_pool *p;
    uint64_t now, next;
} expiry;

static int keep_unexpired(tp__task *t, void *arg) {
    expiry *e = (expiry *)arg;
    if (e->now >= t->deadline) {
        /* never ran: expired; a retry back in the queue ran: cancelled */
        tp__task_end_unrun(e->p, t, TP_ETIMEDOUT, t->attempt == 0);
        return 0;
    }
    if (t->deadline < e->next) e->next = t->deadline;
    return 1;
}

/* Queued tasks whose deadline has passed end now, without running, so their
 * on_done is prompt and their queue place and user slot free up even while
 * every worker is busy. (A worker that picks one first expires it the same
 * way.) Returns when to look again. mu held.
 *
 * The scan walks the ring with the lock held, so it runs only when it can
 * find something: `queued_deadline_min` is a lower bound of the queued
 * deadlines (lowered at every push, made exact by each scan; pops leave it
 * low, which only costs a scan), and scans are spaced by at least 1 ms, more
 * for long queues, so a queue full of staggered deadlines is handled in
 * batches instead of one O(queue) pass per expiry. */
static uint64_t expire_queued(tp_pool *p, uint64_t now) {
    if (p->with_deadline == 0 || tp__ring_len(&p->ring) == 0) {
        p->queued_deadline_min = TP_FOREVER;
        return TP_FOREVER;
    }
    uint64_t due = p->queued_deadline_min > p->expiry_scan_at ? p->queued_deadline_min : p->expiry_scan_at;
    if (now < due) return due;
    expiry e = {p, now, TP_FOREVER};
    if (tp__ring_filter(&p->ring, keep_unexpired, &e) > 0) {
        TP__SET(p->st.queued, tp__ring_len(&p->ring));
        tp__signal_room(p);
        tp__wake_exiters(p);
    }
    p->queued_deadline_min = e.next;
    p->expiry_scan_at = now + 1000000ull + 16ull * tp__ring_len(&p->ring);
    return e.next > p->expiry_scan_at ? e.next : p->expiry_scan_at;
}

void *tp__service_main(void *arg) {
    tp_pool *p = (tp_pool *)arg;
    tp__tls_pool = p;
    tp__tls_service = true;
#if defined(__linux__)
    char name[16];
    snprintf(name, sizeof name, "%.11s-svc", p->name);
    pthread_setname_np(pthread_self(), name);
#endif
    bool tried_spawn = false; /* at most one spawn attempt between two waits */
    tp__lock(p);
    for (;;) {
        if (p->endings_head) {
            tp__task *list = p->endings_head;
            p->endings_head = p->endings_tail = NULL;
            /* Run the on_done calls in chunks and give each chunk's records
             * back under one lock: one lock round-trip per chunk keeps this
             * thread ahead of a cancel storm, and a chunk is short enough not
             * to sit on records that admission may be waiting for. */
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
                    tp__task_retire(p, chunk);
                    chunk = nx;
                }
            }
            tried_spawn = false; /* mu was released: a wake for a spawn may have been missed */
            continue;
        }
        uint64_t now = tp_now_ns();
        uint64_t next = run_timers(p, now);
        uint64_t next_expiry = expire_queued(p, now);
        if (next_expiry < next) next = next_expiry;
        if (p->endings_head) continue;
        if (!tried_spawn && !p->closed && tp__want_spawn(p)) {
            /* Retries came back to a backlog: grow an elastic pool as a
             * submit would. One attempt per pass: a failed pthread_create
             * leaves the tasks to the existing workers instead of spinning. */
            tp__worker *w;
            pthread_t old;
            bool join_old = false;
            tried_spawn = true;
            if (tp__spawn_start(p, &w, &old, &join_old) == TP_OK) {
                tp__unlock(p);
                (void)tp__spawn_finish(p, w, old, join_old);
                tp__lock(p);
            }
            continue; /* mu was released: look at everything again */
        }
        if (p->closed && p->inflight == 0) break;
        p->svc_waiting = true;
        p->svc_next = next; /* an earlier deadline admitted meanwhile wakes us */
        tp__wait_locked(p, &p->svc_cv, next);
        p->svc_waiting = false;
        tried_spawn = false;
    }
    tp__unlock(p);
    return NULL;
}
