/*
 * tasks.c -- task records and the id index.
 *
 * Records come from a free list, filled at create time and grown in chunks
 * only when more tasks are in flight than ever before, up to a limit the pool
 * sets (see pool.c). Chunks are freed only with the pool, so in steady state
 * a task costs no allocation.
 *
 * The id index maps a task id to its record for tp_cancel(). Ids are
 * consecutive, so `id & mask` spreads them evenly over power-of-two buckets;
 * the bucket array doubles with the record count (at growth only, here).
 * Its lookups are inline functions in internal.h, so that a cancel runs in
 * pool.c, life.c and one leaf.
 *
 * No locking: every call is made with the pool lock held.
 *
 * Layer: a leaf (6 of 7 in internal.h); life.c calls it, pool.c makes and
 * frees it. The id index's lookups are inline in internal.h.
 */
#include "internal.h" /* first: it defines _GNU_SOURCE */
#include <stdlib.h>
#include <string.h>


#define TP__CHUNK_MIN 64u

static int tasks_grow(tp__tasks *ts, unsigned n) {
    /* Records start on a cache-line boundary: their hot fields are the
     * first two lines (see tp__task). */
    void *at;
    if (!tp__chunk_new(&ts->chunks, n, sizeof(tp__task), _Alignof(tp__task), &at)) return -1;
    tp__task *recs = (tp__task *)at;
    for (unsigned i = n; i-- > 0;) {
        recs[i].state = TP__FREE;
        recs[i].next = ts->free;
        ts->free = &recs[i];
    }
    ts->total += n;

    /* Keep about one bucket per record. A failed resize keeps the old buckets:
     * chains get longer, lookups stay correct. */
    uint32_t want = ts->index_mask + 1;
    while (want < ts->total && want < (1u << 30)) want <<= 1;
    if (want != ts->index_mask + 1 || !ts->index) {
        tp__task **nb = (tp__task **)calloc(want, sizeof *nb);
        if (nb) {
            uint32_t nmask = want - 1;
            if (ts->index) {
                for (uint32_t b = 0; b <= ts->index_mask; b++) {
                    tp__task *t = ts->index[b];
                    while (t) {
                        tp__task *nx = t->id_next;
                        t->id_next = nb[t->id & nmask];
                        nb[t->id & nmask] = t;
                        t = nx;
                    }
                }
                free(ts->index);
            }
            ts->index = nb;
            ts->index_mask = nmask;
        } else if (!ts->index) {
            return -1;
        }
    }
    return 0;
}

int tp__tasks_init(tp__tasks *ts, unsigned prealloc) {
    memset(ts, 0, sizeof *ts);
    return tasks_grow(ts, prealloc ? prealloc : 1);
}

void tp__tasks_fini(tp__tasks *ts) {
    while (ts->chunks) {
        tp__chunk *c = ts->chunks;
        ts->chunks = c->next;
        free(c);
    }
    free(ts->index);
    memset(ts, 0, sizeof *ts);
}

int tp__tasks_get(tp__tasks *ts, unsigned limit, tp__task **out) {
    if (!ts->free) {
        if (ts->total >= limit) return TP_EFULL;
        unsigned n = ts->total / 2 > TP__CHUNK_MIN ? ts->total / 2 : TP__CHUNK_MIN;
        if (n > limit - ts->total) n = limit - ts->total;
        if (tasks_grow(ts, n) != 0) return TP_ENOMEM;
    }
    tp__task *t = ts->free;
    ts->free = t->next;
    t->next = t->prev = t->id_next = NULL;
    *out = t;
    return TP_OK;
}

void tp__tasks_put(tp__tasks *ts, tp__task *t) {
    t->state = TP__FREE;
    t->next = ts->free;
    ts->free = t;
}
