/*
 * stage.h -- staged submits: a bounded ring in front of the pool lock.
 *
 * A plain tp_submit (no options but an on_done bound to a completion
 * queue, no id asked, not a group's) on a FIFO pool with a fixed number of
 * workers does not take the pool lock (in a fair pool, only such a submit
 * with a user: engine.c, "A fair pool's staged tasks"); nor does such a
 * tp_submit_wait that
 * finds a place free at once (with none, it waits on the locked path and
 * counts no refusal), nor a tp_submit_batch whose tasks are all such (its
 * places taken at once, its entries claimed and published under one hold
 * of put, so that they stay adjacent), nor such a tp_submit with a user
 * too, while its user is in the table and holds fewer slots than its limit
 * minus one (life.h, users_put: its slot is taken under put). It takes one of the pool's free
 * places (life.h, `room_taken`: the exact count that every admission takes) and,
 * if it is bound, a place of its completion queue (cq.c), then, holding the
 * ring's put lock, writes its function, argument, on_done, queue and
 * queue-wait stamp into this ring and returns TP_OK: the task is accepted.
 * A worker at the top of its turn admits every published entry, oldest
 * first, through life.c's usual admission (tp__life_admit_staged), when
 * the scheduler runs low (below). A locked
 * submit (options, an id asked, a batch, a waiting tp_submit_wait) first admits every
 * entry whose ticket was taken before it; so one thread's submits keep their
 * order whichever path each took. The ring is part of the queue: the
 * statistics count its entries as waiting.
 *
 * This is the two-lock queue of SPEC.md section 1 (Michael & Scott's, as in
 * Java's LinkedBlockingQueue), bounded: a put-side lock, `put`, that only
 * staged submits hold (for a dozen instructions: the ticket, the slot, the
 * counts); a take-side lock, the pool's mu, that every consumer holds; and
 * an atomic count between them (life.h's room count, exact for both paths).
 * The two sides meet only in a slot's sequence word, as the two-lock queue's
 * meet in a node's `next`: a producer takes the ticket `tail` (under put),
 * finds the slot one lap back consumed (its sequence equals the ticket),
 * fills it and publishes it with a release store of the sequence (ticket +
 * 1); the consumer reads a slot once its sequence says "published" and gives
 * it back with the sequence for the ticket one lap later. The ring has a slot
 * per place of the queue (up to TP__STAGE_MAX), so an accepted entry always
 * finds one; past that size a submit that finds it full takes the locked
 * path (after giving its place back), which admits the ring first.
 *
 * When a worker admits. At the top of its turn a worker admits a batch (up
 * to TP__STAGE_BATCH entries) only while fewer than TP__STAGE_LOW tasks wait
 * in the default lane (priority 0); otherwise it
 * starts the lane's next task and leaves the ring alone. Every entry of the
 * ring is younger than every task of that lane (a locked submit admits the
 * ring before its own task), and entries join only that lane, so which task
 * starts next is the same whether the ring was admitted or not: the lane's
 * head while it has tasks, by FIFO order; a higher lane's by priority; a
 * lower lane's by the starvation count, which counts starts, not arrivals,
 * and the lane stays ready (it has tasks) either way. (So that the lane
 * never seems empty while entries wait here, a task that leaves the
 * scheduler unstarted as the lane's last there -- cancelled, or ended at
 * its deadline by a worker's take or the service thread's scan -- has the
 * ring's oldest entry admitted first, one, which is enough: life.c,
 * before_unwait.) What it saves: a worker
 * that admitted at every turn met the producer at its newest slot -- a line
 * the producer was writing -- and ended every batch with a look at the slot
 * the producer was about to write, taking that line away from it; with the
 * scheduler kept above the mark, a batch reads slots written a while ago and
 * the two threads stop trading the ring's front line (docs/performance.md).
 *
 * Waiting for a submit mid-way: `tail` only grows under put, so an entry
 * below a `tail` that someone read is published, or its submitter holds put
 * right now. A consumer that must have every such entry (a locked submit,
 * the closer, a worker that would park) and finds one unpublished takes put
 * and lets it go: that waits for the submitter on a lock, as any waiter in
 * the pool does (no polling), and leaves every ticket below the tail it read
 * published. Lock order: mu before put; a holder of put takes no other lock
 * (engine.c's debug hook aside).
 *
 * Closing (engine.c, close_locked): the closer sets `closing`, then takes
 * put and reads `tail`; a submit reads `closing` under put. Whichever holds
 * put first orders the two: a submit after the closer sees the flag (it
 * gives its places back and takes the locked path, which answers
 * TP_ECLOSED), one before it has its ticket below the tail the closer read
 * (it is admitted before the pool closes). A staged task is never refused
 * after its TP_OK.
 *
 * Waking (engine.c, parking), ordered by put as closing is: a worker counts
 * itself in `sleepers`, takes put and lets it go, then looks at the ring a
 * last time and parks; a submit reads `sleepers` under put, after its entry.
 * A submit that held put before the worker did is seen by that look; one
 * that held it after sees the count and wakes a worker (after it lets put
 * go: it takes mu then). So no staged task waits for a worker that sleeps,
 * and a submit pays no fence for it (the worker about to park pays a lock).
 *
 * Cache lines: the ring's pointer and mask are read-only; put, `tail` and
 * the staged count are the producers' line (with one producer it stays in
 * its cache); `head` the consumer's; a slot (a line of its own: two
 * producers never write one line) moves once from its producer to the
 * consumer and back. The submitter touches neither the pool lock's line nor
 * the scheduler's.
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
/* A worker admits at the top of its turn only while fewer tasks than this
 * wait in the default lane (engine.c, stage_due_locked; see "When a worker
 * admits" above). */
#define TP__STAGE_LOW   32u

struct tp__user;

typedef struct tp__stage_slot {
    _Alignas(64) _Atomic size_t seq; /* ticket + 1: published; ticket: free for that ticket */
    tp_fn fn;
    void *arg;
    tp_done_fn on_done;    /* with cq, or both NULL */
    tp_cq *cq;             /* its place taken by the submitter */
    _Atomic uint64_t now;  /* the queue-wait stamp (clock.h); atomic for the statistics' oldest */
    struct tp__user *user; /* a slot of it taken by the submitter, or NULL (life.h, users_put) */
    bool join;             /* a fair pool's task that joins the round (life.h, tp__admit_args) */
} tp__stage_slot;
_Static_assert(sizeof(tp__stage_slot) == 64, "a slot is a cache line");

typedef struct tp__stage {
    /* Read-only after tp__stage_init, but for `closing` (set once). */
    _Alignas(64) tp__stage_slot *slots; /* NULL: the pool does not stage */
    size_t mask;
    /* Tasks without a user may be staged: not in a fair pool, where only a
     * user's are (engine.c, "A fair pool's staged tasks"). */
    bool plain;
    _Atomic bool closing;
    /* The producers' line: the put side's lock and what it guards. */
    _Alignas(64) tp__mutex put;
    _Atomic size_t tail; /* the next ticket: written under put only */
    /* Tasks accepted here (written under put): counted as submitted and
     * accepted (stats.c). */
    _Atomic uint64_t staged;
    /* The consumer's line (the pool lock held). */
    _Alignas(64) _Atomic size_t head;
    /* Parked workers (engine.c): written when a worker parks or wakes. */
    _Alignas(64) _Atomic unsigned sleepers;
    /* A fair pool's: the ticket + 1 of the newest entry that joins the
     * round (engine.c, "A fair pool's staged tasks"; written under put,
     * read by the consumer before every start). On a line of its own: a
     * pool whose tasks seldom join reads it there without a miss. */
    _Alignas(64) _Atomic size_t join_last;
    char pad_[64 - sizeof(size_t)];
} tp__stage;

/* Slots for a queue of `capacity` (cache-line aligned, so that no slot
 * straddles two lines) and the put lock; none when `on` is false. TP_OK or
 * TP_ENOMEM. */
static inline int tp__stage_init(tp__stage *st, unsigned capacity, bool on) {
    st->slots = NULL;
    st->mask = 0;
    st->plain = false;
    if (!on) return TP_OK;
    size_t n = 2;
    while (n < capacity && n < TP__STAGE_MAX) n <<= 1;
    st->slots = (tp__stage_slot *)aligned_alloc(64, n * sizeof(tp__stage_slot));
    if (!st->slots) return TP_ENOMEM;
    if (tp__mutex_init(&st->put, true) != 0) {
        free(st->slots);
        st->slots = NULL;
        return TP_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        atomic_init(&st->slots[i].seq, i);
        st->slots[i].fn = NULL;
        st->slots[i].arg = NULL;
        st->slots[i].on_done = NULL;
        st->slots[i].cq = NULL;
        atomic_init(&st->slots[i].now, 0);
        st->slots[i].user = NULL;
        st->slots[i].join = false;
    }
    st->mask = n - 1;
    atomic_init(&st->closing, false);
    atomic_init(&st->tail, 0);
    atomic_init(&st->staged, 0);
    atomic_init(&st->head, 0);
    atomic_init(&st->sleepers, 0);
    atomic_init(&st->join_last, 0);
    return TP_OK;
}

static inline void tp__stage_fini(tp__stage *st) {
    if (st->slots) tp__mutex_destroy(&st->put);
    free(st->slots);
    st->slots = NULL;
}

static inline bool tp__stage_on(const tp__stage *st) { return st->slots != NULL; }

/* Whether a task without a user may be staged (see `plain`). */
static inline bool tp__stage_plain(const tp__stage *st) { return st->plain; }

/* A ticket for a new entry, put held: its slot, or NULL when the ring is
 * full (the slot one lap back is not consumed yet). */
static inline tp__stage_slot *tp__stage_claim(tp__stage *st, size_t *ticket) {
    TP__ASSERT_HELD(&st->put);
    size_t pos = atomic_load_explicit(&st->tail, memory_order_relaxed);
    tp__stage_slot *s = &st->slots[pos & st->mask];
    if (atomic_load_explicit(&s->seq, memory_order_acquire) != pos) return NULL;
    atomic_store_explicit(&st->tail, pos + 1, memory_order_release);
    *ticket = pos;
    return s;
}

/* Wait for a submit that holds put (mid-way between its ticket and its
 * publication): every ticket below the tail read before this call is
 * published after it. Any thread, mu held or not (mu comes before put). */
static inline void tp__stage_put_barrier(tp__stage *st) {
    tp__mutex_lock(&st->put);
    tp__mutex_unlock(&st->put);
}

/* Publish the claimed slot's entry, put held. */
static inline void tp__stage_publish(tp__stage_slot *s, size_t ticket, tp_fn fn, void *arg,
                                     tp_done_fn on_done, tp_cq *cq, struct tp__user *user, bool join,
                                     uint64_t now) {
    s->join = join;
    s->fn = fn;
    s->arg = arg;
    s->on_done = on_done;
    s->cq = cq;
    s->user = user;
    atomic_store_explicit(&s->now, now, memory_order_relaxed);
    atomic_store_explicit(&s->seq, ticket + 1, memory_order_release);
}

/* The consumer (pool lock held): the oldest published entry, or NULL. Also
 * a poll without the lock (a spinning worker), which the caller repeats
 * under the lock. */
static inline tp__stage_slot *tp__stage_peek(tp__stage *st) {
    size_t h = atomic_load_explicit(&st->head, memory_order_relaxed);
    tp__stage_slot *s = &st->slots[h & st->mask];
    return atomic_load_explicit(&s->seq, memory_order_acquire) == h + 1 ? s : NULL;
}

/* The consumer, about to admit the peeked slot `s`: start fetching the slot
 * two places on (for writing: its consumer gives it back), which the
 * producer most likely wrote meanwhile, so that a batch's misses overlap
 * the admissions instead of following each other under the pool lock. A
 * hint only: a slot not yet written comes back to its producer when it
 * writes it. */
static inline void tp__stage_prefetch_ahead(const tp__stage *st, const tp__stage_slot *s) {
    size_t i = (size_t)(s - st->slots);
    __builtin_prefetch(&st->slots[(i + 2) & st->mask], 1, 3);
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
 * held at some moment). An entry counts from its ticket on. */
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
