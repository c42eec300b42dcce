/*
 * users.h -- the per-user slot table and the weights of a fair pool
 * (users.c).
 *
 * A slot is taken at admission and given back when the task is finalised.
 * An entry is live while its user has accepted, unfinished tasks (its count,
 * tp__user_count, > 0). A user whose last task ended keeps its entry, idle
 * (count 0), until a new user needs one and no entry was ever left unused:
 * then the oldest idle entry is taken over (users.c). So a user who comes
 * back soon finds its entry as it left it, and the table never holds more
 * entries than the most users ever live at once (it grows only when every
 * entry is live). In
 * a fair pool the entry carries the user's flow (scheduler.h): a user with
 * waiting tasks holds slots, so its entry outlives its place in every round,
 * and an idle entry's flow is in no round and has no credit -- as a new one.
 *
 * Weights (tp_user_weight_set) live in a table of their own, kept for the
 * pool's life whether or not the user has tasks; a new entry takes its weight
 * from there.
 *
 * No locking here: the pool lock guards every call but tp__users_prefetch,
 * which a submitter makes before it takes the lock (see there and users.c),
 * and in a pool that stages the ring's put lock guards the table too: a
 * staged submit takes a slot of an existing entry holding put alone (life.h,
 * users_put; `taken` is atomic for that), and every call that gives a slot
 * back holds both.
 */
#ifndef TP_USERS_H
#define TP_USERS_H

#include "base.h"
#include "scheduler.h"

typedef struct tp__user {
    /* own cache lines, 7 of them: the submitting side's first (the first
     * line and the name; the name's last line also holds the idle queue's
     * fields), then the ending side's. The slots held are
     * `taken - released`, two free-running counters on different lines.
     * Where slots are taken under one lock and given back under another
     * (`split`: a pool that stages, whose submitters take them under put
     * and workers give them back under mu and put, life.h), the submitting
     * side writes `taken`, the ending side `released`, and each side
     * decides from its own, older view of the other's counter: `rel_seen`
     * (<= released) makes taken - rel_seen a bound of the count from above,
     * enough to say "below the limit"; `taken_seen` (<= taken) makes
     * taken_seen - released one from below, enough to say "not the last
     * slot". A side reads the other's line only when its bound cannot
     * decide: near the user's limit (with the default limit of 2, a staged
     * submit always is), at the user's last slot. So a user whose tasks are
     * submitted on one thread and ended on another, with more than a slot
     * or two in flight, does not move a line between them per task (users.c
     * has the rules). Elsewhere both sides hold mu and write the first
     * line anyway: a slot given back takes one from `taken`, and `released`
     * stays 0.
     * In a fair pool the flow (scheduler.h) is the ending side's too: a
     * worker moves it at every admission and start, under mu, while a
     * staged submit writes only the first line; so its priority-0 part
     * (with the weight) shares the ending side's first line (a task of
     * priority 0 moves that one line of its entry per admission and per
     * start), and the submitter's line does not travel to the worker and
     * back per task (docs/performance.md, "the user entry's two sides"). */
    _Alignas(64) struct tp__user *next; /* hash chain, or free list */
    uint32_t hash;
    /* Slots ever taken. Atomic for one reader: in a pool that stages, a
     * worker reads it under mu alone while a staged submit adds to it under
     * put (life.c, user_release); its writers hold the table's lock(s), so
     * relaxed loads and stores do. */
    _Atomic unsigned taken;
    unsigned rel_seen; /* `released` as last read: <= it */
    bool zero;         /* split: holds no slot (an idle entry); exact under the table's lock(s) */
    /* A fair pool that stages (engine.c, "A fair pool's staged tasks"):
     * the user is in the default lane's round and stays there until its
     * staged tasks are admitted, so a staged task of it need not join. Set
     * under mu (an admission that finds the user's flow there not empty),
     * cleared under mu and put; read by staged submits under put, and by
     * a worker under mu before a user's last task leaves the round. */
    _Atomic bool stage_ok;
    /* The ticket + 1 of this user's newest staged task (written under put;
     * its low 32 bits: the ring is far smaller), read under mu and put. */
    uint32_t stage_last;
    /* read by every lookup: a name of up to 35 bytes is on the first line */
    char name[TP_USER_MAX + 1];
    /* the idle queue (users.c): touched only when the count reaches 0 and
     * when a new user needs an entry */
    bool idle_q; /* on the idle queue (its count may have risen since) */
    struct tp__user *inext;
    /* the ending side's: its first line, which the name shares with none
     * of its bytes, holds everything a worker reads or writes of the entry
     * per task of priority 0 */
    _Alignas(64) unsigned released; /* slots ever given back; its writers hold every lock of the table */
    unsigned taken_seen;            /* split: `taken` as last read; released <= taken_seen <= taken */
    /* split: holds max_per_user slots (life.c sets it at a locked admission
     * and clears it with the slot given back; users_at_limit counts them).
     * The ending side reads it at every slot given back (life.c,
     * user_release_now); the submitting side writes it only at a locked
     * admission that brings the user to its limit. */
    bool at_limit;
    /* A pool that stages: how many of its slots a worker keeps (life.h,
     * `rel`; at most TP__REL_MAX), mu held. */
    unsigned char kept;
    tp__flow flow; /* fair pools: its place in the rounds */
} tp__user;
_Static_assert(
    offsetof(tp__user, flow) + sizeof(struct tp__flow_lane) <= offsetof(tp__user, released) + 64 &&
        offsetof(tp__user, at_limit) < offsetof(tp__user, released) + 64 &&
        offsetof(tp__user, kept) < offsetof(tp__user, released) + 64,
    "the ending side's counters, at_limit, the kept count and the priority-0 flow (with the weight) on "
    "one line");
_Static_assert(offsetof(tp__user, name) + 35 < 64 &&
                   offsetof(tp__user, name) + sizeof(((tp__user *)0)->name) <= offsetof(tp__user, released),
               "a short name on the first line, none of it on the ending side's");
/* An odd stride: at 8 lines, every entry's first line fell into one cache
 * set in eight, and a fair pool with 10,000 users ran 1.3x slower. */
_Static_assert(sizeof(tp__user) == 448, "7 lines");

/* An entry's slot count, exact with the table's lock(s) held (users.h's
 * top). */
static inline unsigned tp__user_count(const tp__user *u) {
    return atomic_load_explicit(&u->taken, memory_order_relaxed) - u->released;
}

/* With the table's lock(s) held (put alone will do in a pool that stages:
 * `released` changes only with put held too): whether `u` holds fewer than
 * `max - more` slots, i.e. `more` more would leave it below `max`. Decided
 * from rel_seen when that is far enough (the count is at most taken -
 * rel_seen); else rel_seen is read afresh. */
static inline bool tp__user_below(tp__user *u, unsigned max, unsigned more) {
    unsigned taken = atomic_load_explicit(&u->taken, memory_order_relaxed);
    if ((uint64_t)(taken - u->rel_seen) + more < max) return true;
    u->rel_seen = u->released;
    return (uint64_t)(taken - u->rel_seen) + more < max;
}

typedef struct tp__weight {
    struct tp__weight *next;
    uint32_t hash;
    unsigned weight;
    char name[TP_USER_MAX + 1];
} tp__weight;

/* The bucket array and its mask, one allocation, so that one pointer
 * publishes both (tp__users_prefetch). A rehash replaces it and keeps the
 * old one, on `older`, until fini: a submitter that read the old pointer
 * without the lock still reads memory of the pool's. The slots are atomics
 * for that reader only; the lock holder loads and stores them relaxed. */
typedef struct tp__user_table {
    struct tp__user_table *older;
    uint32_t mask;
    _Atomic(tp__user *) slot[];
} tp__user_table;

typedef struct tp__users {
    tp__user_table *tab;               /* the lock holder's view */
    _Atomic(tp__user_table *) tab_pub; /* the same, for tp__users_prefetch (release) */
    unsigned live;                     /* entries holding at least one slot */
    unsigned in_table;                 /* entries in the buckets: live ones and idle ones */
    unsigned total;                    /* entries allocated */
    tp__user *free;                    /* entries never used */
    tp__user *idle_head, *idle_tail;   /* the idle queue, oldest first */
    tp__chunk *chunks;
    bool flows;           /* a fair pool: entries carry a flow (set by the owner after init) */
    bool split;           /* slots come back in `released` (set by the owner after init; see tp__user) */
    tp__weight **weights; /* NULL until the first tp_user_weight_set */
    uint32_t weights_mask;
    unsigned weights_n;
} tp__users;

/* Whether `u` holds no slot, with the table's lock(s) held. Where the
 * table is not split `released` stays 0 (a give-back lowers `taken`), so
 * `taken` says it on the first line, which both sides write anyway; where it
 * is, the flag (on the first line) says it, so the submitter need not read
 * the ending side's line. */
static inline bool tp__user_zero(const tp__users *us, const tp__user *u) {
    return us->split ? u->zero : atomic_load_explicit(&u->taken, memory_order_relaxed) == 0;
}

/* Whether `u` holds max_per_user (`max`) slots, for a give-back (mu held,
 * and put where the table is split): the flag there, `taken` elsewhere (as
 * tp__user_zero). */
static inline bool tp__user_at_limit(const tp__users *us, const tp__user *u, unsigned max) {
    return us->split ? u->at_limit : atomic_load_explicit(&u->taken, memory_order_relaxed) == max;
}

/* With mu held, in a pool that stages (every writer of `released` and
 * `taken_seen` holds mu; `taken` may rise meanwhile, never fall): whether
 * `u` holds more than `n` slots. The answer is of a moment under mu, and
 * stays true while mu is held. */
static inline bool tp__user_holds_more(const tp__users *us, tp__user *u, unsigned n) {
    TP__UNUSED(us);        /* but by the assert */
    TP__ASSERT(us->split); /* elsewhere taken falls, and taken_seen is not kept */
    if (u->taken_seen - u->released > n) return true;
    u->taken_seen = atomic_load_explicit(&u->taken, memory_order_relaxed);
    return u->taken_seen - u->released > n;
}

int tp__users_init(tp__users *us, unsigned prealloc);
void tp__users_fini(tp__users *us);
/* FNV-1a, one byte at a time, from TP__FNV_BASIS. */
#define TP__FNV_BASIS 2166136261u
static inline uint32_t tp__fnv_step(uint32_t h, char c) { return (h ^ (unsigned char)c) * 16777619u; }
/* A name's hash (FNV-1a over its `len` bytes). */
static inline uint32_t tp__users_hash(const char *name, size_t len) {
    uint32_t h = TP__FNV_BASIS;
    for (size_t i = 0; i < len; i++) h = tp__fnv_step(h, name[i]);
    return h;
}
/* A submitted name, read once: its length, or TP_USER_MAX + 1 when it is
 * longer (then *hash is meaningless), and its hash (tp__users_hash). */
static inline size_t tp__users_scan(const char *name, uint32_t *hash) {
    uint32_t h = TP__FNV_BASIS;
    size_t n = 0;
    for (; n <= TP_USER_MAX && name[n]; n++) h = tp__fnv_step(h, name[n]);
    *hash = h;
    return n;
}
/* Without the pool lock: fetch into this CPU's cache the lines that a
 * lookup of a name of hash `h` will read under the lock (the first entry of
 * its bucket: its first line and its name), so that the lock is not held
 * while they come from another core or from memory. It reads the bucket's
 * slot only; an entry is never dereferenced (it may be changing owner).
 * The fetch is a hint: a wrong line (another user's entry on the same
 * chain, or one reached through an array a rehash replaced) costs the
 * fetch, and as the first line is fetched for writing, possibly that line's
 * trip away from a worker that was about to write it. Any thread. */
static inline void tp__users_prefetch(tp__users *us, uint32_t h) {
    tp__user_table *t = atomic_load_explicit(&us->tab_pub, memory_order_acquire);
    tp__user *u = atomic_load_explicit(&t->slot[h & t->mask], memory_order_relaxed);
    if (u) {
        __builtin_prefetch(u, 1);
        __builtin_prefetch(u->name, 0);
    }
}
/* The entry of `name`, live or idle (count 0), or NULL. */
tp__user *tp__users_find(const tp__users *us, const char *name, size_t len, uint32_t h);
/* Take one slot for `name`; `found` is what tp__users_find() returned for it
 * (an idle entry becomes live as it was; NULL: an entry is made, its flow
 * initialised with the user's weight), so admission looks the name up once.
 * NULL: out of memory. */
tp__user *tp__users_take(tp__users *us, tp__user *found, const char *name, size_t len, uint32_t h);
/* tp__users_take after its own lookup. */
tp__user *tp__users_acquire(tp__users *us, const char *name, size_t len, uint32_t h);
/* Give one slot back; at count 0 the entry becomes idle (see the top). */
void tp__users_release(tp__users *us, tp__user *u);
/* The weight set for `name` (1 if none). */
unsigned tp__users_weight(const tp__users *us, const char *name, size_t len, uint32_t h);
/* Remember `weight` for `name`; a live entry's flow takes it for its next
 * turns. TP_OK or TP_ENOMEM. */
int tp__users_set_weight(tp__users *us, const char *name, size_t len, uint32_t h, unsigned weight);

#endif /* TP_USERS_H */
