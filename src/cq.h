/*
 * cq.h -- completion queues (taskpool.h, section 15): the pool's side of
 * them (cq.c also holds the public calls).
 *
 * A queue is a bounded ring of completions (on_done, arg, status), which
 * workers push into without a lock and drainers empty under the queue's own
 * lock; an eventfd (a pipe where there is none) that is readable exactly
 * while completions wait; and a count of taken places. A place is taken at
 * admission (tp__cq_reserve, by life.c with the pool lock held, or by a
 * staged submit without it: engine.c, stage.h) and given back after the
 * task's on_done ran in a drain, so the ring, sized for every place, can
 * never overflow.
 *
 * Lock order: a pool lock, then a queue's lock; never the other way (a drain
 * holds no pool lock and takes none; a push takes the queue's lock, with the
 * pool's held, only to wake; a pool's close takes the locks of the queues
 * its waiting submitters wait on, with its own held).
 */
#ifndef TP_CQ_H
#define TP_CQ_H

#include "base.h"

/* Take one place of `cq` for a task being admitted: false when every place
 * is taken (the submit is refused with TP_EFULL). Lock-free. */
bool tp__cq_reserve(tp_cq *cq);
/* Give back `n` places without a completion (an admission that failed after
 * it reserved), waking submitters that wait for one. */
void tp__cq_release(tp_cq *cq, unsigned n);
/* Queue the completion of a bound task (its place stays taken until a drain
 * has run it): one atomic add and a published slot; the queue's lock only
 * when the descriptor must be woken (the queue was drained empty) or a
 * tp_cq_wait caller waits. Called with the pool lock held (life.c). */
void tp__cq_push(tp_cq *cq, tp_done_fn fn, void *arg, int status);

/*
 * A tp_submit_wait caller that found every place of `cq` taken waits for
 * one: with the pool lock held it links `w` into its pool's list of such
 * waiters and calls tp__cq_wait_place_begin (which takes the queue's lock),
 * releases the pool lock, then tp__cq_wait_place (queue lock held, until a
 * place may be free, `w->closed`, or the deadline), then
 * tp__cq_wait_place_end (releases the queue's lock) and retakes the pool
 * lock to unlink `w`. A close of the pool sets `closed` on every linked
 * waiter and wakes its queue (tp__cq_wake_closed, pool lock held).
 */
typedef struct tp__cq_waiter {
    tp_cq *cq;
    bool closed; /* written under the queue's lock */
    struct tp__cq_waiter *next, *prev;
} tp__cq_waiter;

void tp__cq_wait_place_begin(tp__cq_waiter *w);
void tp__cq_wait_place(tp__cq_waiter *w, uint64_t deadline);
void tp__cq_wait_place_end(tp__cq_waiter *w);
void tp__cq_wake_closed(tp__cq_waiter *w);

#if defined(TP__DEBUG)
/* A test hook of debug builds (tests/test_cq.c): when set, a push calls it
 * right after it took its ticket, before it publishes, so that a test can
 * hold a push under way while it drains or waits. */
typedef void (*tp__cq_test_hook)(tp_cq *cq);
extern _Atomic(tp__cq_test_hook) tp__test_cq_ticket_taken;
/* Pushes that took the slow way (the queue's lock), for tests that check a
 * push goes the fast way when nobody needs waking. */
extern _Atomic unsigned long tp__test_cq_slow_pushes;
#endif

#endif /* TP_CQ_H */
