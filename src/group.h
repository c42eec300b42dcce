/*
 * group.h -- the task group object (taskpool.h, section 11).
 *
 * group.c owns the object (allocation, its waiters, destruction); life.c
 * owns its members (the member list, the unfinished count, the first error,
 * cancellation); engine.c wakes its waiters when life.c reports that the
 * last unfinished member retired. Every field is guarded by the pool lock of
 * `pool`, except `pool` and `flags`, which do not change while the group is
 * attached.
 */
#ifndef TP_GROUP_H
#define TP_GROUP_H

#include "base.h"
#include "task.h"

struct tp_group {
    struct tp_pool *pool; /* NULL once detached (the pool was destroyed first) */
    unsigned flags;       /* TP_GROUP_*, read-only */
    pthread_cond_t cv;    /* no unfinished member (engine.c broadcasts), or a waiter left while destroying */
    /* life.c */
    tp__task *head, *tail;            /* members not yet finalised, in admission order */
    unsigned long unfinished;         /* accepted members not yet retired */
    int err;                          /* the first failed member's final status, 0 until then */
    bool cancelled;                   /* tp_group_cancel, or cancel on error fired: refuse submits */
    bool coe_queued;                  /* on life's list of cancels to run */
    bool wake_queued;                 /* on a tp__fx's list of groups to wake */
    struct tp_group *p_next, *p_prev; /* the pool's groups */
    struct tp_group *coe_next;        /* life's list of cancels to run */
    struct tp_group *wake_next;       /* a tp__fx's list of groups to wake */
    /* group.c */
    unsigned waiters; /* threads in tp_group_wait or tp_group_destroy */
    bool destroying;  /* tp_group_destroy waits for the waiters to leave */
};

#endif /* TP_GROUP_H */
