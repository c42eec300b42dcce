/*
 * ring.h -- the bounded FIFO of queued tasks.
 *
 * A power-of-two array of slots, each a task pointer and the task's queue
 * stamp (its queued_at, copied at push so that the head's age is known
 * without touching the head's record), with free-running 32-bit head and tail
 * counters: the length is `tail - head` in unsigned arithmetic, which stays
 * right across wrap-around because the length never exceeds the size (at most
 * 2^21 here), far below 2^32. Slots are addressed with `& mask`.
 *
 * Each task remembers where it sits (`ring_pos`, the free-running index of
 * its slot), kept right by every function that moves it, so that a cancel
 * finds it at once and closes the gap from the nearer end: removing the head
 * (or the tail) costs O(1), any other O(min(distance to either end)).
 *
 * No locking and no allocation after init (a large ring starts on a huge
 * page: base.h, large arrays), and no page fault either: init touches every
 * slot, as the first lap would, so that a burst filling the queue for the
 * first time does not fault under the pool lock. The pool lock guards every
 * call.
 * The pool sizes it for queue_capacity + max_workers, the most tasks that can
 * ever be queued at once (a failed attempt may enter the retry wait, and later
 * the queue, while the queue is full; see pool.c).
 *
 * A leaf of inline functions, used by scheduler.c only (the ring is lane 0 of a
 * FIFO pool).
 */
#ifndef TP_RING_H
#define TP_RING_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "task.h"

typedef struct tp__ring_slot {
    struct tp__task *t;
    uint64_t at; /* t->queued_at when pushed */
} tp__ring_slot;

/* What is read or written per push and pop, 20 bytes: the owner keeps what
 * to free elsewhere (tp__ring_init's `raw`), off its hot line. */
typedef struct tp__ring {
    tp__ring_slot *slots;
    uint32_t mask;
    uint32_t head; /* next to pop */
    uint32_t tail; /* next free */
} tp__ring;

/* Size for at least `n` entries (n >= 1). 0 or -1 when out of memory.
 * *raw receives what tp__ring_fini frees (slots is aligned within it:
 * base.h, large arrays). */
static inline int tp__ring_init(tp__ring *r, uint32_t n, void **raw) {
    uint32_t size = 1;
    while (size < n) size <<= 1;
    r->slots = (tp__ring_slot *)tp__calloc_big(size, sizeof *r->slots, raw);
    if (r->slots) memset(r->slots, 0, (size_t)size * sizeof *r->slots); /* touched now (see above) */
    r->mask = size - 1;
    r->head = r->tail = 0;
    return r->slots ? 0 : -1;
}

static inline void tp__ring_fini(tp__ring *r, void *raw) {
    free(raw);
    r->slots = NULL;
}

static inline uint32_t tp__ring_len(const tp__ring *r) { return r->tail - r->head; }

/* The caller guarantees room (the pool's admission bound). */
static inline void tp__ring_push(tp__ring *r, struct tp__task *t) {
    TP__ASSERT(tp__ring_len(r) <= r->mask); /* room for one more */
    t->ring_pos = r->tail;
    tp__ring_slot *s = &r->slots[r->tail++ & r->mask];
    s->t = t;
    s->at = t->queued_at;
}

/* The caller guarantees the ring is not empty. */
static inline struct tp__task *tp__ring_pop(tp__ring *r) {
    TP__ASSERT(tp__ring_len(r) > 0);
    return r->slots[r->head++ & r->mask].t;
}

/* The i-th queued task from the head, i < len. */
static inline struct tp__task *tp__ring_at(const tp__ring *r, uint32_t i) {
    return r->slots[(r->head + i) & r->mask].t;
}

/* The queue stamp of the head, 0 when the ring is empty. */
static inline uint64_t tp__ring_head_at(const tp__ring *r) {
    return tp__ring_len(r) ? r->slots[r->head & r->mask].at : 0;
}

/* Whether `t` is in the ring now (its ring_pos is stale once it left). */
static inline int tp__ring_holds(const tp__ring *r, const struct tp__task *t) {
    uint32_t pos = t->ring_pos;
    return (uint32_t)(pos - r->head) < tp__ring_len(r) && r->slots[pos & r->mask].t == t;
}

/* Remove `t` wherever it is, keeping the order of the others: the entries on
 * the shorter side of it move one step to close the gap. Returns 1 if found. */
static inline int tp__ring_remove(tp__ring *r, struct tp__task *t) {
    uint32_t pos = t->ring_pos;
    if (!tp__ring_holds(r, t)) return 0;
    if (pos - r->head < r->tail - 1 - pos) {
        for (uint32_t j = pos; j != r->head; j--) {
            tp__ring_slot s = r->slots[(j - 1) & r->mask];
            r->slots[j & r->mask] = s;
            s.t->ring_pos = j;
        }
        r->head++;
    } else {
        for (uint32_t j = pos; j + 1 != r->tail; j++) {
            tp__ring_slot s = r->slots[(j + 1) & r->mask];
            r->slots[j & r->mask] = s;
            s.t->ring_pos = j;
        }
        r->tail--;
    }
    return 1;
}

/* Keep, in order, the tasks for which keep(t, arg) is true; drop the others
 * (keep() takes care of them). One pass, in place: the write position never
 * passes the read position. Returns how many were dropped. */
static inline uint32_t tp__ring_filter(tp__ring *r, int (*keep)(struct tp__task *, void *), void *arg) {
    uint32_t w = r->head;
    for (uint32_t i = r->head; i != r->tail; i++) {
        tp__ring_slot s = r->slots[i & r->mask];
        if (keep(s.t, arg)) {
            s.t->ring_pos = w;
            r->slots[w++ & r->mask] = s;
        }
    }
    uint32_t dropped = r->tail - w;
    r->tail = w;
    return dropped;
}

#endif /* TP_RING_H */
