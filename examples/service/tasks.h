/*
 * tasks.h -- the table of recent tasks behind GET and DELETE /tasks/{id}.
 *
 * A fixed array of entries, allocated once at start. Each entry is also the
 * `arg` of its task: POST /tasks reserves an entry, fills in the request's
 * values and hands the entry to tp_submit(), so admission allocates nothing.
 * The task function and on_done record the task's progress in it; the
 * handlers read it by id.
 *
 * Size: WORKERS + QUEUE_CAPACITY + MAX_CONNS + TASK_HISTORY entries. At most
 * WORKERS + QUEUE_CAPACITY tasks are unfinished and at most MAX_CONNS handlers
 * hold a reservation, so at least TASK_HISTORY entries hold finished tasks or
 * nothing. Finished entries are recycled oldest first (a FIFO, in the order
 * the tasks ended); entries that hold nothing (fresh, or given back by a
 * refused submit) are used before any finished one. Hence a finished task
 * stays visible for at least the next TASK_HISTORY accepted tasks. The one
 * exception: a task leaves the pool's capacity when it ends but leaves this
 * table only when its on_done has run (for tasks cancelled while queued, on
 * the pool's service thread), so a cancel storm can hold more unfinished
 * entries than the pool's capacity for a moment. If no entry is free then,
 * POST /tasks answers 503 (svc_tasks_reserve returns NULL): the table never
 * grows and never drops an unfinished task.
 *
 * Lock order: `mu` is a leaf. Nothing is called while it is held (no pool
 * call, no logging, no allocation), and it is never taken while the caller
 * holds another lock of ours; the pool calls our task function and on_done
 * without any pool lock held, and tp_submit()/tp_cancel() are always called
 * with `mu` released. The log mutex (log.c) is a leaf too. `cv` (one
 * condition: an entry changed state) is broadcast only when a DELETE waits.
 */
#ifndef SVC_TASKS_H
#define SVC_TASKS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "http.h"

typedef enum svc_task_state {
    SVC_TASK_FREE = 0,  /* holds nothing */
    SVC_TASK_QUEUED,    /* accepted, waiting for a worker */
    SVC_TASK_RUNNING,   /* an attempt is running */
    SVC_TASK_RETRYING,  /* an attempt failed; the pool will run it again */
    SVC_TASK_SUCCEEDED, /* the last attempt returned 0 */
    SVC_TASK_FAILED,    /* the last attempt failed, no retry left */
    SVC_TASK_CANCELLED, /* tp_cancel or a forced shutdown ended it */
    SVC_TASK_EXPIRED,   /* its deadline passed before it ever ran */
} svc_task_state;

/* A failed attempt on purpose (?fail=N): not a TP_ code. */
#define SVC_TASK_EFAIL 1

/* What POST /tasks asks for (validated values). */
typedef struct svc_task_spec {
    uint64_t delay_ns;
    uint64_t deadline_ns;   /* absolute, 0 = none */
    unsigned fail_attempts; /* the first N attempts fail on purpose */
    int priority;           /* TP_PRIO_MIN..TP_PRIO_MAX */
    const char *log_id;
    const char *user; /* "" = none */
} svc_task_spec;

/* One entry. The fields under "fixed" are written while the entry is
 * reserved (under mu) and only read afterwards; the rest change under mu. */
typedef struct svc_task {
    /* fixed from reservation to the end of the task */
    void *owner; /* the service (for the task function) */
    uint64_t delay_ns;
    uint64_t deadline_ns; /* absolute, 0 = none */
    uint64_t accepted_ns;
    uint64_t starts_base;   /* the table's `starts` when it was accepted */
    unsigned fail_attempts; /* the first N attempts fail on purpose */
    int priority;
    char log_id[HTTP_REQID_MAX + 16];
    char user[SVC_USER_MAX + 1];
    /* under mu */
    uint64_t id; /* 0 until known (after tp_submit or at the first start) */
    svc_task_state state;
    int status;           /* the final status, or the failed attempt's while retrying */
    unsigned attempts;    /* attempts started */
    int cancel_requested; /* a DELETE called tp_cancel for it */
    int submitting;       /* reserved; the handler has not recorded the result yet */
    int ahead_fixed;      /* started_ahead is final (it started, or ended unrun) */
    uint64_t started_ahead;
    uint64_t first_start_ns; /* when its first attempt started (valid once attempts > 0) */
    uint64_t ended_ns;
    struct svc_task *next; /* in a free list while recyclable */
} svc_task;

/* A copy of an entry, for answers and logs (taken under mu, used without). */
typedef struct svc_task_view {
    uint64_t id;
    svc_task_state state;
    int status;
    unsigned attempts;
    int cancel_requested;
    int priority;
    uint64_t delay_ns;
    uint64_t age_ns;        /* since accepted */
    int started;            /* its first attempt has started */
    uint64_t wait_ns;       /* from acceptance to its first start (when `started`) */
    uint64_t started_ahead; /* see svc_tasks below */
    char log_id[HTTP_REQID_MAX + 16];
    char user[SVC_USER_MAX + 1];
} svc_task_view;

/* `starts` counts the attempts started (every task's, retries included), in
 * the order the task function reported them. A task's `started_ahead` is
 * how many of them started after it was accepted and before its own first
 * attempt: the tasks the scheduler let go first. It grows while the task is
 * queued and is fixed at its first start (or its end, if it never ran).
 * With one worker it is exact; with more, starts that happen at the same
 * moment are counted in the order their workers took the lock. */
typedef struct svc_tasks {
    pthread_mutex_t mu;
    uint64_t starts;   /* attempts started (above) */
    pthread_cond_t cv; /* an entry changed state; see `waiters` */
    unsigned waiters;  /* DELETE handlers waiting on cv */
    svc_task *entries;
    size_t n;
    svc_task *empty;    /* entries holding nothing: a stack, used first */
    svc_task *old_head; /* finished entries, oldest first */
    svc_task *old_tail;
} svc_tasks;

/* Allocate `n` entries once. 0, or -1 (out of memory). */
int svc_tasks_init(svc_tasks *t, size_t n);
void svc_tasks_destroy(svc_tasks *t);

/* Take an entry for a new task (fresh before finished; finished oldest
 * first) and fill in its fixed values from `spec`. NULL when every entry
 * holds an unfinished task. */
svc_task *svc_tasks_reserve(svc_tasks *t, void *owner, const svc_task_spec *spec);

/* After tp_submit(): TP_OK with its id, or a refusal (the entry holds
 * nothing again). */
void svc_tasks_submitted(svc_tasks *t, svc_task *e, int rc, uint64_t id);

/* From the task function: an attempt starts / ended with rc (`will_retry`:
 * the pool is expected to run it again). */
void svc_tasks_started(svc_tasks *t, svc_task *e, uint64_t id, unsigned attempt);
void svc_tasks_attempt_ended(svc_tasks *t, svc_task *e, int rc, int will_retry);

/* From on_done: the final outcome. Fills *out for the log line. */
void svc_tasks_done(svc_tasks *t, svc_task *e, int status, svc_task_view *out);

/* Find `id`. 1 and *out filled, or 0 (never issued, or forgotten). */
int svc_tasks_get(svc_tasks *t, uint64_t id, svc_task_view *out);

/* Mark `id` as cancel-requested. 1 and *out filled (state before the
 * cancel), or 0 if it is not in the table. */
int svc_tasks_mark_cancel(svc_tasks *t, uint64_t id, svc_task_view *out);

/* After tp_cancel(id): wait until the cancel has visibly reached the task,
 * i.e. it has finished, or an attempt has started since `before` (the view
 * from svc_tasks_mark_cancel), or it was running then and still is; or until
 * deadline_ns (tp_now_ns clock). 1 and *out filled, or 0 if the id left the
 * table. */
int svc_tasks_wait_settled(svc_tasks *t, uint64_t id, const svc_task_view *before, uint64_t deadline_ns,
                           svc_task_view *out);

/* "queued", "running", ... */
const char *svc_task_state_name(svc_task_state s);
int svc_task_state_final(svc_task_state s);

/* The status's name: "TP_ECANCELED", "TP_OK", ..., "SVC_TASK_EFAIL". */
const char *svc_task_status_name(int status);

#endif
