/*
 * service.c -- the pool's one service thread.
 *
 * Layer: below pool.c (which starts it), above worker.c (it may spawn a
 * worker), life.c (every change to a task is a life.c call) and the leaves.
 * Owns p->svc (waiting, next), which life.c reads to decide whether to
 * wake it.
 *
 * It does the work that must not need a free worker, each step a life.c
 * function:
 *   - endings (tp__endings_run_locked): on_done of tasks that ended without
 *     running (cancelled while queued or waiting for a retry, dropped by a
 *     forced shutdown, deadline passed in the queue or while waiting for a
 *     retry), run promptly even when every worker is busy;
 *   - retry timers (tp__delayed_run_locked): a failed attempt waits on the
 *     delayed list without holding a worker; when its fixed delay has passed
 *     it goes to the back of the ring;
 *   - deadlines of queued tasks (tp__queue_expire_locked): one that passes
 *     before a worker picks the task ends it without running (expired);
 *   - a spawn that a worker exit or a retry backlog calls for.
 *
 * Loop invariant: mu is held at the top of each turn. It exits when the pool
 * is closed and nothing is in flight (no accepted task can need it again).
 * Lock order: only the pool lock, released around on_done and pthread_create.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdio.h>

static void set_thread_name(const tp_pool *p) {
#if defined(__linux__)
    char name[16];
    snprintf(name, sizeof name, "%.11s-svc", p->cfg.name);
    pthread_setname_np(pthread_self(), name);
#else
    (void)p;
#endif
}

/* Retries came back to a backlog, or a spawn was skipped while an exiting
 * worker held its slot: grow an elastic pool as a submit would. One attempt
 * per pass: a failed pthread_create leaves the tasks to the existing workers
 * instead of spinning. mu is released and taken again. */
static bool spawn_locked(tp_pool *p) {
    tp__worker *w;
    pthread_t old;
    bool join_old = false;
    if (tp__spawn_start_locked(p, &w, &old, &join_old) != TP_OK) return false;
    tp__unlock(p);
    int rc = tp__spawn_finish(p, w, old, join_old);
    tp__lock(p);
    return rc == TP_OK;
}

/* Timers and queue deadlines: returns when to look again. */
static uint64_t run_timers_locked(tp_pool *p) {
    uint64_t now = tp_now_ns();
    uint64_t next = tp__delayed_run_locked(p, now);
    uint64_t next_expiry = tp__queue_expire_locked(p, now);
    return next_expiry < next ? next_expiry : next;
}

/* Sleep until `next` or a wake-up from life.c. */
static void wait_locked(tp_pool *p, uint64_t next) {
    p->svc.waiting = true;
    p->svc.next = next; /* an earlier deadline admitted meanwhile wakes us */
    tp__wait_locked(p, &p->svc_cv, next);
    p->svc.waiting = false;
}

void *tp__service_main(void *arg) {
    tp_pool *p = (tp_pool *)arg;
    tp__tls_pool = p;
    tp__tls_service = true;
    set_thread_name(p);
    bool tried_spawn = false; /* at most one spawn attempt between two waits */
    tp__lock(p);
    for (;;) {
        if (tp__endings_pending_locked(p)) {
            tp__endings_run_locked(p);
            tried_spawn = false; /* mu was released: a wake for a spawn may have been missed */
            continue;
        }
        uint64_t next = run_timers_locked(p);
        if (tp__endings_pending_locked(p)) continue;
        if (!tried_spawn && !p->life.closed && tp__want_spawn_locked(p)) {
            /* Only a failed spawn waits for the next wake-up before trying
             * again (no busy loop while threads cannot be made); after a
             * success the backlog may want another worker at once, and a
             * "worker gone" wake sent while mu was released found us not
             * waiting, so it must not be needed. */
            tried_spawn = !spawn_locked(p);
            continue; /* mu was released: look at everything again */
        }
        if (p->life.closed && p->life.inflight == 0) break;
        wait_locked(p, next);
        tried_spawn = false;
    }
    tp__unlock(p);
    return NULL;
}
