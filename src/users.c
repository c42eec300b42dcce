/*
 * users.c -- the per-user slot table and the weights (see users.h).
 *
 * Chained hashing (FNV-1a) over power-of-two buckets that double when the
 * entries in them (live and idle) outnumber them. Entries and bucket arrays
 * are allocated only when more distinct users are active at once than ever
 * before, so the number of entries is bounded by the tasks in flight.
 *
 * Idle entries. An entry whose count falls to 0 stays in its bucket and
 * joins the tail of the idle queue; found again, it is live again with one
 * count++, and stays queued (lazily: the queue is not touched). A new user
 * takes a never-used entry if there is one, else the oldest idle one (the
 * queue's head; entries that became live since leave the queue on the way,
 * so every entry is queued at most once and a take is O(1) amortised), and
 * only when neither exists does the table grow. Without it, a user whose
 * tasks run as fast as they come (a queue that is mostly empty) left the
 * table at every task and came back at the next: a free-list pop, the name
 * copied, a 208-byte flow cleared and a chain walked each time (tp_bench
 * fair: 19% of admissions made an entry with 100 users, 80% with 10,000).
 *
 * The weights are a second, smaller table of the same kind that only grows
 * (one entry per name ever given a weight).
 *
 * No locking: every call is made with the pool lock held (and, in a pool
 * that stages, the ring's put lock; a staged submit's tp__users_find and
 * tp__users_take of an existing entry with put alone: life.h, users_put),
 * but one: tp__users_prefetch (users.h), which a submitter calls before it
 * takes the lock. For it the bucket array is published through an atomic pointer, its
 * slots are atomics (relaxed under the lock: plain moves on common CPUs), a
 * rehash keeps the arrays it replaces until fini (their slots together fewer
 * than the newest's: bucket memory about doubles), and entries are never
 * freed before fini either.
 *
 * Layer: a leaf (see pool.h); called by life.c (slots, weights), pool.c
 * (hashing the name at submit) and stats.c (tp_user_active).
 */
#include "users.h"

#include <stdlib.h>
#include <string.h>

#define TP__USERS_CHUNK 32u

static int users_grow(tp__users *us, unsigned n) {
    void *at; /* entries start on a cache line, as records do (tasks.c) */
    if (!tp__chunk_new(&us->chunks, n, sizeof(tp__user), _Alignof(tp__user), &at)) return -1;
    tp__user *e = (tp__user *)at;
    for (unsigned i = n; i-- > 0;) {
        e[i].next = us->free;
        us->free = &e[i];
    }
    us->total += n;
    return 0;
}

static tp__user_table *table_new(uint32_t buckets, tp__user_table *older) {
    tp__user_table *t = (tp__user_table *)calloc(1, sizeof *t + buckets * sizeof t->slot[0]);
    if (!t) return NULL;
    t->older = older;
    t->mask = buckets - 1;
    for (uint32_t b = 0; b < buckets; b++) atomic_init(&t->slot[b], NULL);
    return t;
}

static inline tp__user *slot_get(const tp__user_table *t, uint32_t h) {
    return atomic_load_explicit(&t->slot[h & t->mask], memory_order_relaxed);
}

static inline void slot_set(tp__user_table *t, uint32_t h, tp__user *u) {
    atomic_store_explicit(&t->slot[h & t->mask], u, memory_order_relaxed);
}

static void users_rehash(tp__users *us) {
    tp__user_table *old = us->tab, *nt = table_new((old->mask + 1) * 2, old);
    if (!nt) return; /* longer chains, still correct */
    for (uint32_t b = 0; b <= old->mask; b++) {
        tp__user *u = atomic_load_explicit(&old->slot[b], memory_order_relaxed);
        while (u) {
            tp__user *nx = u->next;
            u->next = slot_get(nt, u->hash);
            slot_set(nt, u->hash, u);
            u = nx;
        }
    }
    /* the old array stays readable (see tp__user_table); its slots still
     * lead to allocated entries (idle, or taken over by another user since),
     * so a prefetch through it is merely stale */
    us->tab = nt;
    atomic_store_explicit(&us->tab_pub, nt, memory_order_release);
}

int tp__users_init(tp__users *us, unsigned prealloc) {
    memset(us, 0, sizeof *us);
    uint32_t nb = 16;
    while (nb < prealloc && nb < (1u << 16)) nb <<= 1;
    us->tab = table_new(nb, NULL);
    if (!us->tab) return -1;
    if (users_grow(us, prealloc ? prealloc : TP__USERS_CHUNK) != 0) {
        free(us->tab);
        us->tab = NULL;
        return -1;
    }
    atomic_init(&us->tab_pub, us->tab); /* published only once it is kept */
    return 0;
}

void tp__users_fini(tp__users *us) {
    tp__chunks_free(&us->chunks);
    for (tp__user_table *t = us->tab, *older; t; t = older) {
        older = t->older;
        free(t);
    }
    if (us->weights) {
        for (uint32_t b = 0; b <= us->weights_mask; b++) {
            tp__weight *w = us->weights[b];
            while (w) {
                tp__weight *nx = w->next;
                free(w);
                w = nx;
            }
        }
        free(us->weights);
    }
    memset(us, 0, sizeof *us);
}

tp__user *tp__users_find(const tp__users *us, const char *name, size_t len, uint32_t h) {
    for (tp__user *u = slot_get(us->tab, h); u; u = u->next)
        if (u->hash == h && u->name[len] == '\0' && memcmp(u->name, name, len) == 0) return u;
    return NULL;
}

tp__user *tp__users_acquire(tp__users *us, const char *name, size_t len, uint32_t h) {
    return tp__users_take(us, tp__users_find(us, name, len, h), name, len, h);
}

/* Out of its bucket's chain. */
static void table_unlink(tp__users *us, tp__user *u) {
    tp__user *first = slot_get(us->tab, u->hash);
    if (first == u) {
        slot_set(us->tab, u->hash, u->next);
        us->in_table--;
        return;
    }
    for (tp__user *prev = first; prev; prev = prev->next) {
        if (prev->next == u) {
            prev->next = u->next;
            us->in_table--;
            return;
        }
    }
    TP__ASSERT(!"tp__users: entry not in its bucket");
}

/* The oldest idle entry, out of the table; NULL if none. Entries whose
 * count rose again since they were queued leave the queue on the way. */
static tp__user *idle_evict(tp__users *us) {
    tp__user *u;
    while ((u = us->idle_head) != NULL) {
        us->idle_head = u->inext;
        if (!us->idle_head) us->idle_tail = NULL;
        u->inext = NULL;
        u->idle_q = false;
        if (tp__user_zero(us, u)) {
            table_unlink(us, u);
            return u;
        }
    }
    return NULL;
}

tp__user *tp__users_take(tp__users *us, tp__user *found, const char *name, size_t len, uint32_t h) {
    tp__user *u = found;
    if (u) {
        bool was_zero = tp__user_zero(us, u);
        atomic_store_explicit(&u->taken, atomic_load_explicit(&u->taken, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        if (was_zero) { /* an idle entry is live again, as it was left */
            if (us->split) u->zero = false;
            us->live++;
        }
        return u;
    }
    if (us->free) {
        u = us->free;
        us->free = u->next;
    } else if ((u = idle_evict(us)) == NULL) {
        if (users_grow(us, us->total < TP__USERS_CHUNK ? TP__USERS_CHUNK : us->total / 2) != 0) return NULL;
        u = us->free;
        us->free = u->next;
    }
    memcpy(u->name, name, len);
    u->name[len] = '\0';
    u->hash = h;
    atomic_store_explicit(&u->taken, 1, memory_order_relaxed);
    u->rel_seen = u->released = u->taken_seen = 0;
    u->zero = u->at_limit = false;
    u->kept = 0; /* an idle entry keeps none (life.c gives kept slots back before a count reaches 0) */
    atomic_store_explicit(&u->stage_ok, false,
                          memory_order_relaxed); /* in no round (an evicted one left it) */
    u->stage_last = 0;
    u->inext = NULL;
    u->idle_q = false;
    if (us->flows) tp__flow_init(&u->flow, tp__users_weight(us, name, len, h));
    u->next = slot_get(us->tab, h);
    slot_set(us->tab, h, u);
    us->live++;
    if (++us->in_table > us->tab->mask + 1) users_rehash(us);
    return u;
}

void tp__users_release(tp__users *us, tp__user *u) {
    TP__ASSERT(!tp__user_zero(us, u) && tp__user_count(u) > 0);
    if (!us->split) {
        /* one lock for both sides: taken goes down (users.h) */
        unsigned taken = atomic_load_explicit(&u->taken, memory_order_relaxed) - 1;
        atomic_store_explicit(&u->taken, taken, memory_order_relaxed);
        if (taken != 0) return; /* `released` stays 0 here */
    } else {
        /* released <= taken_seen <= taken (users.h): not the last slot
         * while released stays below taken_seen after the give-back; taken
         * is read only when released has caught up with its older view. */
        if (u->released == u->taken_seen)
            u->taken_seen = atomic_load_explicit(&u->taken, memory_order_relaxed);
        if (++u->released != u->taken_seen) return;
        u->taken_seen = atomic_load_explicit(&u->taken, memory_order_relaxed);
        if (u->released != u->taken_seen) return;
        u->zero = true;
    }
    TP__ASSERT(us->live > 0);
    us->live--;
    if (us->flows)
        for (unsigned i = 0; i < TP__LANES; i++) /* no task waits: out of every round */
            TP__ASSERT(!u->flow.lane_[i].head && !u->flow.lane_[i].in_round && u->flow.lane_[i].credit == 0);
    if (u->idle_q) return; /* still queued from an earlier time: its place there stands */
    u->idle_q = true;
    u->inext = NULL;
    if (us->idle_tail)
        us->idle_tail->inext = u;
    else
        us->idle_head = u;
    us->idle_tail = u;
}

/* ------------------------------------------------------------ weights */

static tp__weight *weight_find(const tp__users *us, const char *name, size_t len, uint32_t h) {
    if (!us->weights) return NULL;
    for (tp__weight *w = us->weights[h & us->weights_mask]; w; w = w->next)
        if (w->hash == h && w->name[len] == '\0' && memcmp(w->name, name, len) == 0) return w;
    return NULL;
}

unsigned tp__users_weight(const tp__users *us, const char *name, size_t len, uint32_t h) {
    const tp__weight *w = weight_find(us, name, len, h);
    return w ? w->weight : 1;
}

/* Double the weight buckets (a failure keeps the old ones: longer chains). */
static void weights_rehash(tp__users *us) {
    uint32_t want = (us->weights_mask + 1) * 2;
    tp__weight **nb = (tp__weight **)calloc(want, sizeof *nb);
    if (!nb) return;
    for (uint32_t b = 0; b <= us->weights_mask; b++) {
        tp__weight *w = us->weights[b];
        while (w) {
            tp__weight *nx = w->next;
            w->next = nb[w->hash & (want - 1)];
            nb[w->hash & (want - 1)] = w;
            w = nx;
        }
    }
    free(us->weights);
    us->weights = nb;
    us->weights_mask = want - 1;
}

int tp__users_set_weight(tp__users *us, const char *name, size_t len, uint32_t h, unsigned weight) {
    tp__weight *w = weight_find(us, name, len, h);
    if (!w) {
        if (!us->weights) {
            us->weights = (tp__weight **)calloc(16, sizeof *us->weights);
            if (!us->weights) return TP_ENOMEM;
            us->weights_mask = 15;
        }
        w = (tp__weight *)malloc(sizeof *w);
        if (!w) return TP_ENOMEM;
        memcpy(w->name, name, len);
        w->name[len] = '\0';
        w->hash = h;
        w->next = us->weights[h & us->weights_mask];
        us->weights[h & us->weights_mask] = w;
        if (++us->weights_n > us->weights_mask + 1) weights_rehash(us);
    }
    w->weight = weight;
    tp__user *u = tp__users_find(us, name, len, h);
    if (u) tp__flow_set_weight(&u->flow, weight); /* from its next turn */
    return TP_OK;
}
