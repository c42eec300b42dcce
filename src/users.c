/*
 * users.c -- the per-user slot table.
 *
 * A slot is taken at admission and given back when the task is finalised, so
 * an entry lives exactly while its user has accepted, unfinished tasks: a user
 * whose last task ended leaves no entry behind (its record returns to a free
 * list reused by the next new user). The number of entries is bounded by the
 * tasks in flight.
 *
 * Chained hashing (FNV-1a) over power-of-two buckets that double when live
 * entries outnumber them. Entries and bucket arrays are allocated only when
 * more distinct users are active at once than ever before.
 *
 * No locking: every call is made with the pool lock held.
 *
 * Layer: a leaf (6 of 7 in internal.h); called by life.c (slots), pool.c
 * (hashing the name at submit) and stats.c (tp_user_active).
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdlib.h>
#include <string.h>


#define TP__USERS_CHUNK 32u

uint32_t tp__users_hash(const char *name, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 16777619u;
    }
    return h;
}

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

static void users_rehash(tp__users *us) {
    uint32_t want = (us->mask + 1) * 2;
    tp__user **nb = (tp__user **)calloc(want, sizeof *nb);
    if (!nb) return; /* longer chains, still correct */
    for (uint32_t b = 0; b <= us->mask; b++) {
        tp__user *u = us->buckets[b];
        while (u) {
            tp__user *nx = u->next;
            u->next = nb[u->hash & (want - 1)];
            nb[u->hash & (want - 1)] = u;
            u = nx;
        }
    }
    free(us->buckets);
    us->buckets = nb;
    us->mask = want - 1;
}

int tp__users_init(tp__users *us, unsigned prealloc) {
    memset(us, 0, sizeof *us);
    uint32_t nb = 16;
    while (nb < prealloc && nb < (1u << 16)) nb <<= 1;
    us->buckets = (tp__user **)calloc(nb, sizeof *us->buckets);
    if (!us->buckets) return -1;
    us->mask = nb - 1;
    if (users_grow(us, prealloc ? prealloc : TP__USERS_CHUNK) != 0) {
        free(us->buckets);
        us->buckets = NULL;
        return -1;
    }
    return 0;
}

void tp__users_fini(tp__users *us) {
    while (us->chunks) {
        tp__chunk *c = us->chunks;
        us->chunks = c->next;
        free(c);
    }
    free(us->buckets);
    memset(us, 0, sizeof *us);
}

tp__user *tp__users_find(const tp__users *us, const char *name, size_t len, uint32_t h) {
    for (tp__user *u = us->buckets[h & us->mask]; u; u = u->next)
        if (u->hash == h && u->name[len] == '\0' && memcmp(u->name, name, len) == 0) return u;
    return NULL;
}

tp__user *tp__users_acquire(tp__users *us, const char *name, size_t len, uint32_t h) {
    return tp__users_take(us, tp__users_find(us, name, len, h), name, len, h);
}

tp__user *tp__users_take(tp__users *us, tp__user *found, const char *name, size_t len, uint32_t h) {
    tp__user *u = found;
    if (u) {
        u->count++;
        return u;
    }
    if (!us->free && users_grow(us, us->total < TP__USERS_CHUNK ? TP__USERS_CHUNK : us->total / 2) != 0)
        return NULL;
    u = us->free;
    us->free = u->next;
    memcpy(u->name, name, len);
    u->name[len] = '\0';
    u->hash = h;
    u->count = 1;
    u->next = us->buckets[h & us->mask];
    us->buckets[h & us->mask] = u;
    if (++us->live > us->mask + 1) users_rehash(us);
    return u;
}

void tp__users_release(tp__users *us, tp__user *u) {
    TP__ASSERT(u->count > 0);
    if (--u->count > 0) return;
    for (tp__user **pp = &us->buckets[u->hash & us->mask]; *pp; pp = &(*pp)->next) {
        if (*pp == u) {
            *pp = u->next;
            break;
        }
    }
    TP__ASSERT(us->live > 0);
    u->next = us->free;
    us->free = u;
    us->live--;
}
