/*
 * users.c -- the per-user slot table and the weights (see users.h).
 *
 * Chained hashing (FNV-1a) over power-of-two buckets that double when live
 * entries outnumber them. Entries and bucket arrays are allocated only when
 * more distinct users are active at once than ever before, so the number of
 * entries is bounded by the tasks in flight. The weights are a second,
 * smaller table of the same kind that only grows (one entry per name ever
 * given a weight).
 *
 * No locking: every call is made with the pool lock held.
 *
 * Layer: a leaf (see pool.h); called by life.c (slots, weights), pool.c
 * (hashing the name at submit) and stats.c (tp_user_active).
 */
#include "users.h"

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
    tp__chunks_free(&us->chunks);
    free(us->buckets);
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
    if (us->flows) tp__flow_init(&u->flow, tp__users_weight(us, name, len, h));
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
    if (u) u->flow.weight = weight; /* from its next turn */
    return TP_OK;
}
