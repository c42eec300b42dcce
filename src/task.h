/*
 * task.h -- the task record, and the table of records with its id index
 * (tasks.c).
 *
 * A record holds one accepted task from admission until its on_done has
 * returned (or, for a task bound to a completion queue, until its completion
 * is queued). Its `state` is written only by life.c, which owns the task's
 * life (see the state graph there); the scheduling links only by scheduler.c
 * while the task waits; everything else is filled in at admission and read
 * by the others.
 *
 * Records come from a free list, filled at create time and grown in chunks
 * only when more tasks are in flight than ever before, up to a limit the pool
 * sets (see pool.c). Chunks are freed only with the pool, so in steady state
 * a task costs no allocation. The id index maps a task id to its record for
 * tp_cancel(), the one caller that needs it: ids are consecutive, so
 * `id & mask` spreads them evenly over power-of-two buckets; the bucket array
 * doubles with the record count (at growth only). A pool keeps it from its
 * first tp_cancel() on (tp__tasks_index_all: one pass over the records, which
 * indexes every record in use), so a pool that never cancels by id writes no
 * bucket per task. Once kept, a record enters the index at admission and
 * leaves it only when it is taken again for a new task (tp__tasks_get): a
 * lookup can find a task that has ended, so its caller checks the state. That
 * keeps the index on the submitting side: the thread that ends a task never
 * writes it. No locking here: the pool lock guards every call.
 */
#ifndef TP_TASK_H
#define TP_TASK_H

#include "base.h"

/* The states of a task record (life.c owns every transition). */
enum { TP__QUEUED = 1, TP__RUNNING, TP__DELAYED, TP__ENDING, TP__DONE, TP__FREE };

struct tp__user;
struct tp__flow;
struct tp_ctx;
struct tp_group;

typedef struct tp__task {
    /* First cache line: written by admission, read by the worker. */
    _Alignas(64) uint64_t id;
    tp_fn fn;
    void *arg;
    tp_done_fn on_done;
    uint64_t run_timeout;  /* resolved, ns; TP_FOREVER for none */
    uint64_t deadline;     /* absolute; TP_FOREVER for none */
    uint64_t queued_at;    /* clock.h stamp: admission, or its return to the queue for a retry */
    struct tp__user *user; /* slot holder, NULL without a user */
    /* Second: the links and the state, written on both sides. A task is on
     * one list at a time: the free list, a flow's list (scheduler.c, waiting),
     * the delayed list, the endings list or a list being taken apart. */
    struct tp__task *next, *prev;
    struct tp__task *id_next; /* id index chain */
    struct tp_group *group;   /* NULL, or its group until it is retired */
    struct tp_ctx *ctx;       /* while RUNNING: the context it runs on */
    uint32_t ring_pos;        /* while in the ring: its index there (ring.h) */
    uint8_t state;            /* TP__* */
    int8_t prio;              /* TP_PRIO_MIN..TP_PRIO_MAX: its lane */
    uint16_t attempt;         /* 0 on the first run, n on the n-th retry */
    int status;               /* final status once finalised */
    uint32_t log_gen;         /* non-zero: log_id not yet written; the pool serial to generate it from */
    tp_cq *cq;                /* NULL, or the completion queue its on_done goes to */
    /* The rest: scheduling lists, retries, groups, log ids -- written only
     * for the tasks that use them. */
    struct tp__task *anext, *aprev;   /* waiting in a list lane: the lane's arrival order (scheduler.c) */
    struct tp__flow *flow;            /* fair pools only: its user's flow, or the anonymous one */
    uint64_t due;                     /* while DELAYED: when the retry is queued */
    struct tp__task *g_next, *g_prev; /* the group's members not yet finalised */
    char *log_id;                     /* its buffer of TP__LOG_BUF bytes, kept beside the records (tasks.c) */
    uint64_t anext_at; /* waiting in a list lane: anext's queued_at, 0 without one (scheduler.c) */
} tp__task;

/* Three cache lines: the log id's buffer lives outside the record, so that
 * a record that never needs one never touches its memory. */
#define TP__LOG_BUF (TP_LOG_ID_MAX + 1)
_Static_assert(sizeof(tp__task) == 192, "a task record is three cache lines");

/* Task records and the id index. Two free lists: admission takes from
 * `free`; retiring gives records to a list of the caller's (life.h keeps it
 * on the retiring side's cache line), which admission takes over whole when
 * `free` runs dry. So the submitter and the workers do not write one list
 * head per task. */
typedef struct tp__tasks {
    /* what every admission reads or writes */
    tp__task *free;              /* admission's own */
    tp__task *fresh, *fresh_end; /* the newest chunk's records never used yet (tasks.c) */
    tp__task **index;            /* id -> task, chained, power-of-two buckets */
    uint32_t index_mask;
    uint32_t warm_lines; /* of the next free record, fetched ahead for admission: 2, or 3 (fair pools) */
    bool indexed;        /* the id index is kept (from the first tp__tasks_index_all) */
    /* growth only */
    unsigned total;  /* records allocated */
    char *fresh_log; /* the log id buffer of `fresh` */
    void *index_raw; /* what to free: `index` is aligned within it (base.h, large arrays) */
    tp__chunk *chunks;
    unsigned index_min; /* buckets at least */
} tp__tasks;

/* `prealloc` records made (and touched) now; an index of at least
 * `index_min` buckets. `warm_lines`: how many of a record's cache lines
 * admission writes (2; 3 when it links the task in a fair pool's lists),
 * which tp__tasks_get fetches ahead. 0 or -1 (out of memory). */
int tp__tasks_init(tp__tasks *ts, unsigned prealloc, unsigned index_min, unsigned warm_lines);
void tp__tasks_fini(tp__tasks *ts);
/* A free record, out of the id index: TP_OK, TP_EFULL (none is free and
 * `limit` records exist), TP_ENOMEM. `limit` caps growth only: a free record
 * is handed out whatever it is, so a caller that caps the records in use
 * checks its own count first (life.c). `*given`, the retired records,
 * becomes admission's list when its own is empty. */
int tp__tasks_get(tp__tasks *ts, tp__task **given, unsigned limit, tp__task **out);
/* Back to admission's own list: a record just taken and not used. */
void tp__tasks_put(tp__tasks *ts, tp__task *t);
/* A retired record onto the list `*given` (tp__tasks_get takes it over). */
static inline void tp__tasks_give(tp__task **given, tp__task *t) {
    t->state = TP__FREE;
    t->next = *given;
    *given = t;
}

/* Keep the id index from now on: every record in use enters it (records
 * free or never used get id 0). One pass over every record; then
 * tp__tasks_indexed() is true. */
void tp__tasks_index_all(tp__tasks *ts);

/* The id index: inline, so that admission's and cancel's calls stay in the
 * caller's file. Only while ts->indexed. */
static inline void tp__tasks_index(tp__tasks *ts, tp__task *t) {
    tp__task **b = &ts->index[t->id & ts->index_mask];
    t->id_next = *b;
    *b = t;
}

/* Out of the index; its id becomes 0 (a record's id is non-zero exactly
 * while it is in the index). */
static inline void tp__tasks_unindex(tp__tasks *ts, tp__task *t) {
    for (tp__task **pp = &ts->index[t->id & ts->index_mask]; *pp; pp = &(*pp)->id_next) {
        if (*pp == t) {
            *pp = t->id_next;
            t->id_next = NULL;
            t->id = 0;
            return;
        }
    }
    TP__ASSERT(!"tp__tasks_unindex: task not in the index");
}

/* The record that last held `id`, if it has not been reused since: the task
 * may have ended (check its state). */
static inline tp__task *tp__tasks_find(const tp__tasks *ts, uint64_t id) {
    for (tp__task *t = ts->index[id & ts->index_mask]; t; t = t->id_next)
        if (t->id == id) return t;
    return NULL;
}

#endif /* TP_TASK_H */
