/*
 * tasks.c -- task records and the id index (see task.h).
 *
 * Records come from a free list that tp__tasks_init fills (the pool asks for
 * enough to cover a full queue several times, pool.c) and tp__tasks_get
 * grows in chunks, up to the limit the caller passes; the bucket array of the
 * id index doubles with the record count, at growth only, and is filled from
 * the first tp__tasks_index_all on (task.h). A large chunk and a large
 * index start on a huge page (base.h, large arrays).
 *
 * No locking: every call is made with the pool lock held.
 *
 * Layer: a leaf (see pool.h); life.c takes and gives back records, pool.c
 * makes and frees the table.
 */
#include "task.h"

#include <stdlib.h>
#include <string.h>

#define TP__CHUNK_MIN 64u

/* `n` more records. At create (`now`) they are made free at once, so their
 * memory is touched before the first task; a chunk grown later is handed out
 * from `fresh` as admission needs its records (tp__tasks_get), so growing
 * costs no pass over the chunk under the pool lock, and the pages of records
 * never used are never touched. */
static int tasks_grow(tp__tasks *ts, unsigned n, bool now) {
    /* Records start on a cache-line boundary: their hot fields are the
     * first two lines (see tp__task). */
    void *at;
    if (!tp__chunk_new(&ts->chunks, n, sizeof(tp__task) + TP__LOG_BUF, _Alignof(tp__task), &at)) return -1;
    tp__task *recs = (tp__task *)at;
    char *logs = (char *)(recs + n); /* then the records' log id buffers, in the same order */
    if (now) {
        for (unsigned i = n; i-- > 0;) {
            recs[i].id = 0; /* not in the id index */
            recs[i].state = TP__FREE;
            recs[i].log_id = logs + (size_t)i * TP__LOG_BUF;
            recs[i].next = ts->free;
            ts->free = &recs[i];
        }
    } else {
        TP__ASSERT(ts->fresh == ts->fresh_end);
        ts->fresh = recs;
        ts->fresh_end = recs + n;
        ts->fresh_log = logs;
    }
    ts->total += n;

    /* At least one bucket per record (the pool sizes the index for its
     * records in use at create: a full queue's worth). A failed resize
     * keeps the old buckets: chains get longer, lookups stay correct. */
    uint32_t want = ts->index_mask + 1;
    while ((want < ts->total || want < ts->index_min) && want < (1u << 30)) want <<= 1;
    if (want != ts->index_mask + 1 || !ts->index) {
        void *raw;
        tp__task **nb = (tp__task **)tp__calloc_big(want, sizeof *nb, &raw);
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
                free(ts->index_raw);
            }
            ts->index = nb;
            ts->index_raw = raw;
            ts->index_mask = nmask;
        } else if (!ts->index) {
            return -1;
        }
    }
    return 0;
}

int tp__tasks_init(tp__tasks *ts, unsigned prealloc, unsigned index_min, unsigned warm_lines) {
    memset(ts, 0, sizeof *ts);
    ts->index_min = index_min;
    ts->warm_lines = warm_lines;
    return tasks_grow(ts, prealloc ? prealloc : 1, true);
}

void tp__tasks_fini(tp__tasks *ts) {
    tp__chunks_free(&ts->chunks);
    free(ts->index_raw);
    memset(ts, 0, sizeof *ts);
}

int tp__tasks_get(tp__tasks *ts, tp__task **given, unsigned limit, tp__task **out) {
    if (!ts->free) {
        /* The records retired since the last time, all at once: one look at
         * the retiring side's list head, not one per record. */
        ts->free = *given;
        *given = NULL;
    }
    if (!ts->free) {
        if (ts->fresh == ts->fresh_end) {
            if (ts->total >= limit) return TP_EFULL;
            unsigned n = ts->total / 2 > TP__CHUNK_MIN ? ts->total / 2 : TP__CHUNK_MIN;
            if (n > limit - ts->total) n = limit - ts->total;
            if (tasks_grow(ts, n, false) != 0) return TP_ENOMEM;
        }
        /* A record never used: zeroed (not in the index, no links), with
         * its log id buffer; admission fills the rest. */
        tp__task *t = ts->fresh++;
        memset(t, 0, sizeof *t);
        t->log_id = ts->fresh_log;
        ts->fresh_log += TP__LOG_BUF;
        *out = t;
        return TP_OK;
    }
    tp__task *t = ts->free;
    ts->free = t->next;
    /* The next admission's record, given back by a worker whose cache
     * holds its lines: fetched now, for writing, they arrive while this
     * task is admitted and its submitter runs, not under the next lock
     * hold. (It stays on this list: a worker never writes it again.) */
    if (ts->free) {
        __builtin_prefetch(ts->free, 1, 3);
        __builtin_prefetch((char *)ts->free + 64, 1, 3);
        if (ts->warm_lines > 2) __builtin_prefetch((char *)ts->free + 128, 1, 3);
    }
    /* A record stays in the id index under its last id until it is reused
     * (task.h): out now, on the submitting side, so that the worker that
     * ended it never writes the index. */
    if (ts->indexed && t->id) tp__tasks_unindex(ts, t);
    t->next = t->prev = NULL;
    *out = t;
    return TP_OK;
}

void tp__tasks_put(tp__tasks *ts, tp__task *t) {
    t->state = TP__FREE;
    t->next = ts->free;
    ts->free = t;
}

void tp__tasks_index_all(tp__tasks *ts) {
    TP__ASSERT(!ts->indexed);
    for (tp__chunk *c = ts->chunks; c; c = c->next) {
        tp__task *recs = (tp__task *)c->items;
        for (size_t i = 0; i < c->n; i++) {
            tp__task *t = &recs[i];
            if (t >= ts->fresh && t < ts->fresh_end) continue; /* never used: not even initialised */
            if (t->state == TP__FREE) {
                t->id = 0; /* (its last id, if any, is not indexed) */
            } else {
                TP__ASSERT(t->id != 0);
                tp__tasks_index(ts, t);
            }
        }
    }
    ts->indexed = true;
}
