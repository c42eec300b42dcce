/*
 * timers.c -- bounded timer heap with an id index (see timers.h).
 *
 * Entries live in a fixed array; `heap` orders their indices by due time
 * (ties by insertion, so entries due at the same ms start in the order they
 * came); `tab` is open addressing on the id (index + 1, 0 = empty) with
 * backward-shift deletion, so no tombstones build up.
 */
#include "timers.h"

#include <stdlib.h>
#include <string.h>

typedef struct ent {
    uint64_t due_ms, seq;
    unsigned deliveries;
    uint32_t pos; /* index in heap */
    uint8_t len;
    uint8_t flags; /* TPS_SCHED_* (timers.h) */
    char id[TPS_SCHED_ID_MAX + 1];
} ent;

struct tps_sched {
    uint32_t cap, n, nfree, mask;
    uint64_t seq;
    ent *e;
    uint32_t *heap, *freel, *tab;
};

static uint32_t hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

tps_sched *tps_sched_create(uint32_t cap) {
    tps_sched *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    uint32_t t = 16;
    while (t < 2 * cap) t <<= 1;
    s->cap = cap;
    s->mask = t - 1;
    s->e = calloc(cap, sizeof *s->e);
    s->heap = calloc(cap, sizeof *s->heap);
    s->freel = calloc(cap, sizeof *s->freel);
    s->tab = calloc(t, sizeof *s->tab);
    if (s->e == NULL || s->heap == NULL || s->freel == NULL || s->tab == NULL) {
        tps_sched_destroy(s);
        return NULL;
    }
    tps_sched_clear(s);
    return s;
}

void tps_sched_destroy(tps_sched *s) {
    if (s == NULL) return;
    free(s->e);
    free(s->heap);
    free(s->freel);
    free(s->tab);
    free(s);
}

void tps_sched_clear(tps_sched *s) {
    s->n = 0;
    s->nfree = s->cap;
    for (uint32_t i = 0; i < s->cap; i++) s->freel[i] = s->cap - 1 - i;
    memset(s->tab, 0, ((size_t)s->mask + 1) * sizeof *s->tab);
}

uint32_t tps_sched_count(const tps_sched *s) { return s->n; }
uint32_t tps_sched_room(const tps_sched *s) { return s->cap - s->n; }

static int before(const tps_sched *s, uint32_t a, uint32_t b) {
    const ent *x = &s->e[a], *y = &s->e[b];
    return x->due_ms < y->due_ms || (x->due_ms == y->due_ms && x->seq < y->seq);
}

static void place(tps_sched *s, uint32_t pos, uint32_t idx) {
    s->heap[pos] = idx;
    s->e[idx].pos = pos;
}

static void sift_up(tps_sched *s, uint32_t pos) {
    uint32_t idx = s->heap[pos];
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (!before(s, idx, s->heap[parent])) break;
        place(s, pos, s->heap[parent]);
        pos = parent;
    }
    place(s, pos, idx);
}

static void sift_down(tps_sched *s, uint32_t pos) {
    uint32_t idx = s->heap[pos];
    for (;;) {
        uint32_t l = 2 * pos + 1, m = pos;
        uint32_t best = idx;
        if (l < s->n && before(s, s->heap[l], best)) m = l, best = s->heap[l];
        if (l + 1 < s->n && before(s, s->heap[l + 1], best)) m = l + 1, best = s->heap[l + 1];
        if (m == pos) break;
        place(s, pos, best);
        pos = m;
    }
    place(s, pos, idx);
}

static uint32_t find_slot(const tps_sched *s, const char *id, size_t len) {
    for (uint32_t i = hash(id, len) & s->mask;; i = (i + 1) & s->mask) {
        uint32_t v = s->tab[i];
        if (v == 0) return i;
        const ent *e = &s->e[v - 1];
        if (e->len == len && memcmp(e->id, id, len) == 0) return i;
    }
}

int tps_sched_has(const tps_sched *s, const char *id, size_t len) {
    return len <= TPS_SCHED_ID_MAX && s->tab[find_slot(s, id, len)] != 0;
}

int tps_sched_get(const tps_sched *s, const char *id, size_t len, unsigned *deliveries, unsigned *flags) {
    if (len > TPS_SCHED_ID_MAX) return 0;
    uint32_t v = s->tab[find_slot(s, id, len)];
    if (v == 0) return 0;
    *deliveries = s->e[v - 1].deliveries;
    *flags = s->e[v - 1].flags;
    return 1;
}

int tps_sched_add(tps_sched *s, const char *id, size_t len, uint64_t due_ms, unsigned deliveries,
                  unsigned flags) {
    if (len == 0 || len > TPS_SCHED_ID_MAX) return -1;
    uint32_t t = find_slot(s, id, len);
    if (s->tab[t] != 0) return 1;
    if (s->nfree == 0) return -1;
    uint32_t idx = s->freel[--s->nfree];
    ent *e = &s->e[idx];
    e->due_ms = due_ms;
    e->seq = s->seq++;
    e->deliveries = deliveries;
    e->flags = (uint8_t)flags;
    e->len = (uint8_t)len;
    memcpy(e->id, id, len);
    e->id[len] = '\0';
    s->tab[t] = idx + 1;
    s->n++;
    place(s, s->n - 1, idx);
    sift_up(s, s->n - 1);
    return 0;
}

uint64_t tps_sched_next(const tps_sched *s) { return s->n > 0 ? s->e[s->heap[0]].due_ms : UINT64_MAX; }

static void tab_remove(tps_sched *s, uint32_t idx) {
    const ent *e = &s->e[idx];
    uint32_t i = find_slot(s, e->id, e->len);
    for (uint32_t j = (i + 1) & s->mask; s->tab[j] != 0; j = (j + 1) & s->mask) {
        const ent *o = &s->e[s->tab[j] - 1];
        uint32_t home = hash(o->id, o->len) & s->mask;
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & s->mask) >= ((j - i) & s->mask)) {
            s->tab[i] = s->tab[j];
            i = j;
        }
    }
    s->tab[i] = 0;
}

int tps_sched_pop(tps_sched *s, uint64_t now_ms, char *id, size_t *len, uint64_t *due_ms,
                  unsigned *deliveries, unsigned *flags) {
    if (s->n == 0) return 0;
    uint32_t idx = s->heap[0];
    ent *e = &s->e[idx];
    if (e->due_ms > now_ms) return 0;
    memcpy(id, e->id, (size_t)e->len + 1);
    *len = e->len;
    *due_ms = e->due_ms;
    *deliveries = e->deliveries;
    *flags = e->flags;
    tab_remove(s, idx);
    s->freel[s->nfree++] = idx;
    s->n--;
    if (s->n > 0) {
        place(s, 0, s->heap[s->n]);
        sift_down(s, 0);
    }
    return 1;
}

int tps_sched_mark(tps_sched *s, const char *id, size_t len, unsigned set, unsigned clear,
                   uint64_t due_at_most) {
    if (len > TPS_SCHED_ID_MAX) return 0;
    uint32_t v = s->tab[find_slot(s, id, len)];
    if (v == 0) return 0;
    ent *e = &s->e[v - 1];
    e->flags = (uint8_t)((e->flags | set) & ~clear);
    if (due_at_most < e->due_ms) {
        e->due_ms = due_at_most;
        sift_up(s, e->pos);
    }
    return 1;
}

unsigned tps_sched_flags(const tps_sched *s, uint32_t i) { return s->e[s->heap[i]].flags; }

void tps_sched_unflag(tps_sched *s, unsigned flag) {
    for (uint32_t i = 0; i < s->n; i++) s->e[s->heap[i]].flags &= (uint8_t)~flag;
}

int tps_sched_remove(tps_sched *s, const char *id, size_t len) {
    if (len > TPS_SCHED_ID_MAX) return 0;
    uint32_t v = s->tab[find_slot(s, id, len)];
    if (v == 0) return 0;
    uint32_t idx = v - 1, pos = s->e[idx].pos;
    tab_remove(s, idx);
    s->freel[s->nfree++] = idx;
    s->n--;
    if (pos < s->n) { /* the last one fills the hole, then finds its place */
        uint32_t moved = s->heap[s->n];
        place(s, pos, moved);
        if (pos > 0 && before(s, moved, s->heap[(pos - 1) / 2]))
            sift_up(s, pos);
        else
            sift_down(s, pos);
    }
    return 1;
}

const char *tps_sched_id(const tps_sched *s, uint32_t i, size_t *len, unsigned *deliveries) {
    const ent *e = &s->e[s->heap[i]];
    *len = e->len;
    if (deliveries != NULL) *deliveries = e->deliveries;
    return e->id;
}
