/*
 * group.c -- task groups (taskpool.h, section 11): a set of tasks of one pool
 * that can be waited for, whose first failure is remembered, and that can be
 * cancelled together, in the manner of Go's errgroup.
 *
 * Layer: 1 in pool.h, above pool.c: a member is admitted by pool.c's own
 * admission (tp__submit_member), so it is refused, counted and accepted
 * exactly as tp_submit would; the members themselves are life.c's (join at
 * admission, first error and cancel on error when one ends, the unfinished
 * count at retire). This file owns the group object (group.h): allocation,
 * the waiters, destruction.
 *
 * Design. A group is allocated once (tp_group_create); a member costs
 * nothing (the links are in the task record). Everything is guarded by the
 * pool lock, so a member's ending and a cancel walking the members never
 * interleave. tp_group_wait waits on the group's own condition variable (on
 * the pool lock) for `unfinished == 0`: every member ended and its on_done
 * returned, members admitted while it waits included. The engine broadcasts
 * it when life.c reports that the count reached zero with waiters present;
 * tp_group_destroy counts as a waiter and also waits for the other waiters
 * to leave, each of which broadcasts on leaving while a destroy waits.
 *
 * Lifetime: the pool keeps a list of its groups (life.c) only to detach them
 * when the pool is destroyed first; a detached group (pool == NULL) answers
 * from its own fields and is freed by tp_group_destroy.
 */
#include "group.h"

#include <stdlib.h>

#include "pool.h"

int tp_group_create(tp_pool *p, unsigned flags, tp_group **out) {
    if (!p || !out || (flags & ~TP_GROUP_CANCEL_ON_ERROR)) return TP_EINVAL;
    tp_group *g = (tp_group *)calloc(1, sizeof *g);
    if (!g) return TP_ENOMEM;
    if (tp__cond_init(&g->cv) != 0) {
        free(g);
        return TP_ENOMEM;
    }
    g->pool = p;
    g->flags = flags;
    tp__lock(p);
    tp__life_group_link(&p->life, g);
    tp__unlock(p);
    *out = g;
    return TP_OK;
}

int tp_group_submit(tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    if (!g) return TP_EINVAL;
    if (!g->pool) {
        /* Detached (its pool was destroyed), in the order of an attached
         * group: arguments, cancelled, then closed; nothing is counted.
         * No lock: no call on the pool ran concurrently with its destroy,
         * and the group's fields have not changed since. */
        int rc = tp__life_args_check(fn, opts);
        return rc != TP_OK ? rc : g->cancelled ? TP_ECANCELED : TP_ECLOSED;
    }
    return tp__submit_member(g->pool, g, fn, arg, opts, id_out);
}

int tp_group_wait(tp_group *g, uint64_t timeout_ns) {
    if (!g) return TP_EINVAL;
    tp_pool *p = g->pool;
    if (!p) return g->err;
    if (tp__tls_pool == p) return TP_EDEADLK;
    uint64_t deadline = timeout_ns == 0 || timeout_ns == TP_FOREVER
                            ? TP_FOREVER
                            : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__lock(p);
    g->waiters++;
    while (g->unfinished > 0) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__engine_wait_locked(p, &g->cv, deadline);
    }
    TP__ASSERT(g->waiters > 0);
    g->waiters--;
    if (rc == TP_OK) rc = g->err;
    if (g->destroying) pthread_cond_broadcast(&g->cv); /* the destroyer waits for the waiters to leave */
    tp__unlock(p);
    return rc;
}

int tp_group_cancel(tp_group *g) {
    if (!g) return TP_EINVAL;
    tp_pool *p = g->pool;
    if (!p) return TP_OK;
    tp__fx fx = TP__FX_INIT(&p->misc);
    tp__lock(p);
    tp__life_group_cancel(&p->life, g, &fx);
    tp__engine_act_locked(p, &fx);
    tp__unlock(p);
    return TP_OK;
}

int tp_group_destroy(tp_group *g) {
    if (!g) return TP_EINVAL;
    tp_pool *p = g->pool;
    if (p) {
        if (tp__tls_pool == p) return TP_EDEADLK;
        tp__lock(p);
        g->destroying = true;
        g->waiters++; /* woken with the others when unfinished reaches 0 */
        while (g->unfinished > 0 || g->waiters > 1) tp__engine_wait_locked(p, &g->cv, TP_FOREVER);
        g->waiters--;
        tp__life_group_unlink(&p->life, g);
        tp__unlock(p);
    }
    pthread_cond_destroy(&g->cv);
    free(g);
    return TP_OK;
}
