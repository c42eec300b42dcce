/*
 * stage.h -- staged submits: a bounded ring in front of the pool lock.
 *
 * A plain tp_submit (no options but an on_done bound to a completion
 * queue, no id asked, not a group's) on a FIFO pool with a fixed number of
 * workers does not take the pool lock. It takes one of the pool's free
 * places (life.h, `room`: the exact count that every admission takes) and,
 * if it is bound, a place of its completion queue (cq.c), writes its
 * function, argument, on_done, queue and queue-wait stamp into this ring
 * and returns TP_OK: the task is accepted. A worker at the top of
 * its turn admits every published entry, oldest first, through life.c's
 * usual admission (tp__life_admit_staged). A locked submit (options, an id
 * asked, a batch, tp_submit_wait) first admits every entry whose ticket was
 * taken before it, waiting without the lock for one not yet published; so
 * one thread's submits keep their order whichever path each took. The ring
 * is part of the queue: the statistics count its entries as waiting.
 *
 * The ring is Vyukov's bounded multi-producer queue: a producer takes a
 * ticket by compare-and-swap on `tail` and publishes its slot with a release
 * store of the slot's sequence; the consumer (one at a time: it holds the
 * pool lock) reads a slot once its sequence says "published" and gives it
 * back with the sequence for the ticket one lap later. The ring has a slot
 * per place of the queue (up to TP__STAGE_MAX), so an accepted entry always
 * finds one; past that size a submit that finds it full takes the locked
 * path (after giving its place back), which admits the ring first.
 *
 * Closing (engine.c, close_locked): a submit takes its ticket, then reads
 * `closing`; the closer sets `closing`, then reads `tail`, waits until every
 * ticket below it is published and admits them all before the pool closes.
 * With both pairs sequentially consistent, a submit either sees `closing`
 * (it publishes a void entry and takes the locked path, which answers
 * TP_ECLOSED) or its ticket is below the tail the closer read (it is
 * admitted). A staged task is never refused after its TP_OK.
 *
 * Waking (engine.c, parking): a worker counts itself in `sleepers` before it
 * looks at the ring a last time and parks; a submit publishes, then reads
 * `sleepers` (a sequentially consistent fence between); one of the two sees
 * the other, so no staged task waits for a worker that sleeps.
 *
 * Cache lines: the ring's pointer and mask are read-only; `tail` and the
 * producers' count are the producers' line; `head` the consumer's; a slot
 * (a line of its own: two producers never write one line) moves once from
 * its producer to the consumer and back. The submitter touches neither the
 * lock's line nor the scheduler's.
 *
 * Layer: a leaf (no pool); engine.c owns the instance and all the calls.
 */
#ifndef TP_STAGE_H
#define TP_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "taskpool.h"

/* The ring's size: the next power of two at or above the queue's capacity,
 * up to this many slots (64 bytes each: 2 MiB). */
#define TP__STAGE_MAX 32768u

/* The most entries a worker admits in one turn (engine.c). */
#define TP__STAGE_BATCH 256u

typedef struct tp__stage_slot {
    _Alignas(64) _Atomic size_t seq; /* ticket + 1: published; ticket: free for that ticket */
    tp_fn fn;                        /* NULL: a void entry (a submit that met `closing`) */
    void *arg;
    tp_done_fn on_done;   /* with cq, or both NULL */
    tp_cq *cq;            /* its place taken by the submitter */
    _Atomic uint64_t now; /* the queue-wait stamp (clock.h); atomic for the statistics' oldest */
} tp__stage_slot;
_Static_assert(sizeof(tp__stage_slot) == 64, "a slot is a cache line");

typedef struct tp__stage {
    /* Read-only after tp__stage_init, but for `closing` (set once). */
    _Alignas(64) tp__stage_slot *slots; /* NULL: the pool does not stage */
    size_t mask;
    _Atomic bool closing;
    /* The producers' line. */
    _Alignas(64) _Atomic size_t tail;
    _Atomic uint64_t staged; /* tasks accepted here: counted as submitted and accepted (stats.c) */
    /* The consumer's line (the pool lock held). */
    _Alignas(64) _Atomic size_t head;
    /* Parked workers (engine.c): written when a worker parks or wakes. */
    _Alignas(64) _Atomic unsigned sleepers;
    char pad_[64 - sizeof(unsigned)];
} tp__stage;

/* Slots for a queue of `capacity` (cache-line aligned, so that no slot
 * straddles two lines); none when `on` is false. TP_OK or TP_ENOMEM. */
static inline int tp__stage_init(tp__stage *st, unsigned capacity, bool on) {
    st->slots = NULL;
    st->mask = 0;
    if (!on) return TP_OK;
    size_t n = 2;
    while (n < capacity && n < TP__STAGE_MAX) n <<= 1;
    st->slots = (tp__stage_slot *)aligned_alloc(64, n * sizeof(tp__stage_slot));
    if (!st->slots) return TP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        atomic_init(&st->slots[i].seq, i);
        st->slots[i].fn = NULL;
        st->slots[i].arg = NULL;
        st->slots[i].on_done = NULL;
        st->slots[i].cq = NULL;
        atomic_init(&st->slots[i].now, 0);
    }
    st->mask = n - 1;
    atomic_init(&st->closing, false);
    atomic_init(&st->tail, 0);
    atomic_init(&st->staged, 0);
    atomic_init(&st->head, 0);
    atomic_init(&st->sleepers, 0);
    return TP_OK;
}

static inline void tp__stage_fini(tp__stage *st) {
    free(st->slots);
    st->slots = NULL;
}

static inline bool tp__stage_on(const tp__stage *st) { return st->slots != NULL; }

/* A ticket for a new entry: its slot, or NULL when the ring is full. */
static inline tp__stage_slot *tp__stage_claim(tp__stage *st, size_t *ticket) {
    size_t pos = atomic_load_explicit(&st->tail, memory_order_relaxed);
    for (;;) {
        tp__stage_slot *s = &st->slots[pos & st->mask];
        size_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        intptr_t d = (intptr_t)(seq - pos); /* wraps with the counters */
        if (d == 0) {
            /* seq_cst: the closer's read of `tail` and this ticket (above) */
            if (atomic_compare_exchange_weak_explicit(&st->tail, &pos, pos + 1, memory_order_seq_cst,
                                                      memory_order_relaxed)) {
                *ticket = pos;
                return s;
            }
        } else if (d < 0) {
            return NULL; /* the slot one lap back is not consumed yet: full */
        } else {
            pos = atomic_load_explicit(&st->tail, memory_order_relaxed);
        }
    }
}

/* Publish the claimed slot's entry (fn NULL: void). */
static inline void tp__stage_publish(tp__stage_slot *s, size_t ticket, tp_fn fn, void *arg,
                                     tp_done_fn on_done, tp_cq *cq, uint64_t now) {
    s->fn = fn;
    s->arg = arg;
    s->on_done = on_done;
    s->cq = cq;
    atomic_store_explicit(&s->now, now, memory_order_relaxed);
    atomic_store_explicit(&s->seq, ticket + 1, memory_order_release);
}

/* The consumer (pool lock held): the oldest published entry, or NULL. */
static inline tp__stage_slot *tp__stage_peek(tp__stage *st) {
    size_t h = atomic_load_explicit(&st->head, memory_order_relaxed);
    tp__stage_slot *s = &st->slots[h & st->mask];
    return atomic_load_explicit(&s->seq, memory_order_acquire) == h + 1 ? s : NULL;
}

/* The consumer: give the peeked slot back and move on. */
static inline void tp__stage_pop(tp__stage *st, tp__stage_slot *s) {
    size_t h = atomic_load_explicit(&st->head, memory_order_relaxed);
    atomic_store_explicit(&s->seq, h + st->mask + 1, memory_order_release);
    atomic_store_explicit(&st->head, h + 1, memory_order_release);
}

/* Entries claimed and not yet consumed (published or not), without the
 * lock. The tail first: an entry claimed after that read is not counted, and
 * one consumed meanwhile is not counted either (never more than the ring
 * held at some moment). A claim that turns out void counts until consumed. */
static inline uint32_t tp__stage_count(const tp__stage *st) {
    if (!st->slots) return 0;
    size_t t = atomic_load_explicit(&st->tail, memory_order_acquire);
    size_t h = atomic_load_explicit(&st->head, memory_order_acquire);
    ptrdiff_t n = (ptrdiff_t)(t - h); /* wraps with the counters (32-bit size_t) */
    return n > 0 ? (uint32_t)n : 0;
}

/* The consumer has taken every entry below `ticket` (the counters wrap). */
static inline bool tp__stage_passed(const tp__stage *st, size_t ticket) {
    return (ptrdiff_t)(atomic_load_explicit(&st->head, memory_order_relaxed) - ticket) >= 0;
}

/* The stamp of the oldest entry, lock-free (the statistics); 0 if none. */
static inline uint64_t tp__stage_oldest_at(const tp__stage *st) {
    if (!st->slots) return 0;
    size_t h = atomic_load_explicit(&st->head, memory_order_acquire);
    const tp__stage_slot *s = &st->slots[h & st->mask];
    if (atomic_load_explicit(&s->seq, memory_order_acquire) != h + 1) return 0;
    return atomic_load_explicit(&s->now, memory_order_relaxed);
}

#endif /* TP_STAGE_H */
