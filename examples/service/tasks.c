/*
 * tasks.c -- the table of recent tasks (see tasks.h).
 *
 * Two intrusive lists thread the recyclable entries: `empty`, a stack of
 * entries that hold nothing, and the FIFO `old_head..old_tail` of finished
 * tasks in the order they ended. An entry is on at most one list, and on none
 * while it is reserved or its task is unfinished. A finished entry whose
 * handler has not yet recorded the submit result (`submitting`: the task
 * ended before tp_submit() returned) joins the FIFO only when the handler
 * does, so an entry is never recycled under a handler that still holds it.
 * Lookups by id scan the array: a few hundred entries, under a lock held for
 * nothing else. The same lock orders the count of attempt starts behind
 * each task's `started_ahead` (tasks.h).
 */
#include "tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskpool.h"

int svc_tasks_init(svc_tasks *t, size_t n) {
    memset(t, 0, sizeof *t);
    t->entries = calloc(n, sizeof *t->entries);
    if (t->entries == NULL) return -1;
    t->n = n;
    for (size_t i = n; i-- > 0;) {
        t->entries[i].next = t->empty;
        t->empty = &t->entries[i];
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    return 0;
}

void svc_tasks_destroy(svc_tasks *t) {
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->entries);
    t->entries = NULL;
}

const char *svc_task_state_name(svc_task_state s) {
    switch (s) {
    case SVC_TASK_QUEUED: return "queued";
    case SVC_TASK_RUNNING: return "running";
    case SVC_TASK_RETRYING: return "retrying";
    case SVC_TASK_SUCCEEDED: return "succeeded";
    case SVC_TASK_FAILED: return "failed";
    case SVC_TASK_CANCELLED: return "cancelled";
    case SVC_TASK_EXPIRED: return "expired";
    case SVC_TASK_FREE: break;
    }
    return "unknown";
}

int svc_task_state_final(svc_task_state s) {
    return s == SVC_TASK_SUCCEEDED || s == SVC_TASK_FAILED || s == SVC_TASK_CANCELLED ||
           s == SVC_TASK_EXPIRED;
}

const char *svc_task_status_name(int status) {
    return status == SVC_TASK_EFAIL ? "SVC_TASK_EFAIL" : tp_err_name(status);
}

static void view_locked(const svc_tasks *t, const svc_task *e, svc_task_view *out) {
    out->id = e->id;
    out->state = e->state;
    out->status = e->status;
    out->attempts = e->attempts;
    out->cancel_requested = e->cancel_requested;
    out->priority = e->priority;
    out->delay_ns = e->delay_ns;
    out->age_ns = tp_now_ns() - e->accepted_ns;
    out->started = e->attempts > 0;
    out->wait_ns = out->started ? e->first_start_ns - e->accepted_ns : 0;
    out->started_ahead = e->ahead_fixed ? e->started_ahead : t->starts - e->starts_base;
    memcpy(out->log_id, e->log_id, sizeof out->log_id);
    memcpy(out->user, e->user, sizeof out->user);
}

static svc_task *find_locked(svc_tasks *t, uint64_t id) {
    if (id == 0) return NULL;
    for (size_t i = 0; i < t->n; i++)
        if (t->entries[i].id == id && t->entries[i].state != SVC_TASK_FREE) return &t->entries[i];
    return NULL;
}

static void make_old_locked(svc_tasks *t, svc_task *e) {
    e->next = NULL;
    if (t->old_tail != NULL)
        t->old_tail->next = e;
    else
        t->old_head = e;
    t->old_tail = e;
}

static void make_empty_locked(svc_tasks *t, svc_task *e) {
    e->state = SVC_TASK_FREE;
    e->id = 0;
    e->next = t->empty;
    t->empty = e;
}

static void changed_locked(svc_tasks *t) {
    if (t->waiters > 0) pthread_cond_broadcast(&t->cv);
}

/* started_ahead stops counting: the task started, or ended unrun. */
static void fix_ahead_locked(const svc_tasks *t, svc_task *e) {
    if (e->ahead_fixed) return;
    e->started_ahead = t->starts - e->starts_base;
    e->ahead_fixed = 1;
}

svc_task *svc_tasks_reserve(svc_tasks *t, void *owner, const svc_task_spec *spec) {
    pthread_mutex_lock(&t->mu);
    svc_task *e = t->empty;
    if (e != NULL) {
        t->empty = e->next;
    } else if ((e = t->old_head) != NULL) {
        t->old_head = e->next;
        if (t->old_head == NULL) t->old_tail = NULL;
    }
    if (e != NULL) {
        memset(e, 0, sizeof *e);
        e->owner = owner;
        e->delay_ns = spec->delay_ns;
        e->deadline_ns = spec->deadline_ns;
        e->accepted_ns = tp_now_ns();
        e->starts_base = t->starts;
        e->fail_attempts = spec->fail_attempts;
        e->priority = spec->priority;
        snprintf(e->log_id, sizeof e->log_id, "%s", spec->log_id);
        snprintf(e->user, sizeof e->user, "%s", spec->user);
        e->state = SVC_TASK_QUEUED;
        e->submitting = 1;
    }
    pthread_mutex_unlock(&t->mu);
    return e;
}

void svc_tasks_submitted(svc_tasks *t, svc_task *e, int rc, uint64_t id) {
    pthread_mutex_lock(&t->mu);
    e->submitting = 0;
    if (rc != TP_OK) {
        make_empty_locked(t, e); /* never accepted: the pool never saw it */
    } else {
        e->id = id;
        if (svc_task_state_final(e->state)) make_old_locked(t, e); /* it ended before tp_submit() returned */
    }
    pthread_mutex_unlock(&t->mu);
}

void svc_tasks_started(svc_tasks *t, svc_task *e, uint64_t id, unsigned attempt) {
    pthread_mutex_lock(&t->mu);
    e->id = id;
    e->state = SVC_TASK_RUNNING;
    e->attempts = attempt + 1;
    if (attempt == 0) e->first_start_ns = tp_now_ns();
    fix_ahead_locked(t, e);
    t->starts++;
    changed_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void svc_tasks_attempt_ended(svc_tasks *t, svc_task *e, int rc, int will_retry) {
    if (rc == 0 || !will_retry) return; /* on_done follows at once and records the outcome */
    pthread_mutex_lock(&t->mu);
    e->state = SVC_TASK_RETRYING;
    e->status = rc;
    changed_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void svc_tasks_done(svc_tasks *t, svc_task *e, int status, svc_task_view *out) {
    pthread_mutex_lock(&t->mu);
    if (e->attempts == 0)
        e->state = status == TP_ETIMEDOUT ? SVC_TASK_EXPIRED : SVC_TASK_CANCELLED;
    else if (status == 0)
        e->state = SVC_TASK_SUCCEEDED;
    else if (status == TP_ECANCELED)
        e->state = SVC_TASK_CANCELLED;
    else
        e->state = SVC_TASK_FAILED;
    e->status = status;
    e->ended_ns = tp_now_ns();
    fix_ahead_locked(t, e);
    view_locked(t, e, out);
    if (!e->submitting) make_old_locked(t, e);
    changed_locked(t);
    pthread_mutex_unlock(&t->mu);
}

int svc_tasks_get(svc_tasks *t, uint64_t id, svc_task_view *out) {
    pthread_mutex_lock(&t->mu);
    svc_task *e = find_locked(t, id);
    if (e != NULL) view_locked(t, e, out);
    pthread_mutex_unlock(&t->mu);
    return e != NULL;
}

int svc_tasks_mark_cancel(svc_tasks *t, uint64_t id, svc_task_view *out) {
    pthread_mutex_lock(&t->mu);
    svc_task *e = find_locked(t, id);
    if (e != NULL) {
        view_locked(t, e, out);
        if (!svc_task_state_final(e->state)) e->cancel_requested = 1;
    }
    pthread_mutex_unlock(&t->mu);
    return e != NULL;
}

/* Has the cancel reached its target? The task has finished, or an attempt
 * is running that was running already or started since. */
static int settled_locked(const svc_task *e, const svc_task_view *before) {
    if (svc_task_state_final(e->state)) return 1;
    if (e->attempts > before->attempts) return 1;
    return before->state == SVC_TASK_RUNNING && e->state == SVC_TASK_RUNNING;
}

int svc_tasks_wait_settled(svc_tasks *t, uint64_t id, const svc_task_view *before, uint64_t deadline_ns,
                           svc_task_view *out) {
    pthread_mutex_lock(&t->mu);
    svc_task *e;
    t->waiters++;
    while ((e = find_locked(t, id)) != NULL && !settled_locked(e, before)) {
        uint64_t now = tp_now_ns();
        if (now >= deadline_ns) break;
        /* The condvar uses CLOCK_REALTIME; a relative wait of at most 100 ms
         * keeps a clock step from stretching the bound. */
        uint64_t wait = deadline_ns - now < 100000000ull ? deadline_ns - now : 100000000ull;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + wait;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    t->waiters--;
    if (e != NULL) view_locked(t, e, out);
    pthread_mutex_unlock(&t->mu);
    return e != NULL;
}
