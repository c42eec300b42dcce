/*
 * pool.c -- the public calls of a pool: the resolved configuration, argument
 * checks, and then the engine (engine.c), which owns the threads and the
 * lock.
 *
 * Admission (tp_submit, tp_submit_wait, tp_submit_batch): the arguments are
 * checked and resolved without the lock (tp__life_args); then the engine
 * takes the lock once and runs the contract's checks in order -- closed,
 * user limit, space, a completion queue's place -- and only after all passed
 * is anything reserved (tp__life_admit), so a refusal leaves nothing behind
 * but its counter. Space means queued + delayed < queue_capacity; running
 * tasks do not count. Before the lock, tp_submit asks tp__life_full_fast
 * whether the answer is TP_EFULL whatever happens under the lock; then it
 * refuses without taking it (a producer retrying on a full queue then does
 * not compete with the workers that make room) and counts the refusal in
 * `fast_full`. A plain task on a pool that stages (stage.h) skips all that:
 * tp_submit stages it, and tp_submit_wait too when a place is free at once;
 * tp_submit stages one with a user as well, while that user is well below
 * its limit (life.h, users_put).
 *
 * Why the scheduler holds queue_capacity + max_workers: admission keeps
 * queued + delayed < capacity at the moment a task enters, and afterwards a
 * task only moves between running, delayed and queued, so
 * active + queued + delayed <= max_workers + capacity at every moment.
 *
 * Layer: 2 (see pool.h): the public API, over engine.c and life.c; only
 * group.c (tp__submit_member), compat.c and default.c (public calls) call
 * into it. It never calls user code with the lock held.
 */
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "group.h"

#define TP__PREALLOC_MAX 16384u /* caps the four pools' worth made at create (~5 MB), not a full pool's */
#define TP__RECORD_SLACK 65536u /* records for ended tasks awaiting on_done, at least */
#define TP__STARVE_LIMIT 16u    /* prio_starve_limit's default */

static atomic_uint tp__pool_serial = 1;

/* ------------------------------------------------------------ config */

static int resolve_config(tp__config *c, const tp_config *cfg) {
    static const tp_config zero;
    if (!cfg) cfg = &zero;

    unsigned workers = cfg->workers;
    if (workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        workers = (unsigned)(n > (long)(TP_MAX_WORKERS / 4) ? TP_MAX_WORKERS : 4 * n);
    }
    unsigned max_workers = cfg->max_workers ? cfg->max_workers : workers;
    if (workers > TP_MAX_WORKERS || max_workers > TP_MAX_WORKERS || max_workers < workers) return TP_EINVAL;
    if (cfg->queue_capacity > TP_MAX_QUEUE_CAPACITY) return TP_EINVAL;
    if (cfg->max_retries > TP_MAX_RETRIES) return TP_EINVAL;
    if (!TP__RESERVED_ZERO(cfg) || cfg->reserved32 != 0) return TP_EINVAL;
    if (cfg->sched != TP_SCHED_FIFO && cfg->sched != TP_SCHED_FAIR) return TP_EINVAL;
    if (cfg->low_prio_max_running > max_workers) return TP_EINVAL;
    const char *name = cfg->name ? cfg->name : "tp";
    size_t nlen = strlen(name);
    if (nlen > TP_NAME_MAX) return TP_EINVAL;

    c->min_workers = workers;
    c->max_workers = max_workers;
    c->capacity = cfg->queue_capacity ? cfg->queue_capacity : 100;
    c->max_per_user = cfg->max_per_user ? cfg->max_per_user : 2;
    c->max_retries = cfg->max_retries;
    c->run_timeout = cfg->run_timeout_ns ? cfg->run_timeout_ns : 600ull * 1000000000ull;
    c->submit_timeout = cfg->submit_timeout_ns ? cfg->submit_timeout_ns : 1000000000ull;
    c->drain_timeout = cfg->drain_timeout_ns ? cfg->drain_timeout_ns : 20ull * 1000000000ull;
    c->idle_timeout = cfg->idle_timeout_ns ? cfg->idle_timeout_ns : 300ull * 1000000000ull;
    c->retry_delay = cfg->retry_delay_ns ? cfg->retry_delay_ns : 1000000000ull;
    c->retry_delay_max = cfg->retry_delay_max_ns;
    if (c->retry_delay_max && c->retry_delay_max < c->retry_delay) return TP_EINVAL;
    c->sched = cfg->sched;
    c->starve_limit = cfg->prio_starve_limit ? cfg->prio_starve_limit : TP__STARVE_LIMIT;
    c->low_max = cfg->low_prio_max_running;
    c->log = cfg->log;
    c->log_arg = cfg->log_arg;
    c->on_worker_start = cfg->on_worker_start;
    c->on_worker_stop = cfg->on_worker_stop;
    c->hook_arg = cfg->hook_arg;
    memcpy(c->name, name, nlen + 1);
    return TP_OK;
}

/* ------------------------------------------------------------ create/destroy */

/* Frees a pool in any state of construction: everything not yet made is
 * zero. Threads must already be gone. */
static void pool_free(tp_pool *p) {
    tp__engine_free(p);
    tp__life_fini(&p->life);
    free(p->mem);
}

/* Records: a full pool holds `full` tasks. Tasks that ended without running
 * (cancelled, dropped, expired) and have an on_done keep theirs until the
 * service thread has run it. Four pools' worth is preallocated (up to a
 * size), which covers a service thread lagging behind ordinary cancellations,
 * so steady state allocates nothing; and never less than a full pool's worth,
 * so that a burst that fills a large queue for the first time allocates
 * nothing and takes no page fault under the pool lock (the records are
 * touched here; the ring's pages too, ring.h). A cancel storm that outruns
 * the service thread grows records in chunks (kept for reuse). A hard cap
 * far above that keeps memory bounded if the service thread is stuck (an
 * on_done that blocks): admission then refuses (TP_EFULL; tp_submit_wait
 * waits) rather than grow without end. */
static int make_life(tp_pool *p) {
    const tp__config *c = &p->cfg;
    unsigned full = c->capacity + c->max_workers;
    unsigned slack = 3 * full > TP__RECORD_SLACK ? 3 * full : TP__RECORD_SLACK;
    unsigned prealloc = 4 * full + 64 < TP__PREALLOC_MAX ? 4 * full + 64 : TP__PREALLOC_MAX;
    if (prealloc < full + 64) prealloc = full + 64; /* a full pool never grows */
    tp__life_cfg lc = {.capacity = c->capacity,
                       .max_per_user = c->max_per_user,
                       .max_retries = c->max_retries,
                       .waiting_max = full,
                       .max_records = full + slack,
                       /* staged tasks (engine.c) are admitted after they were
                        * accepted: past the cap that refuses the others (a
                        * locked admission is refused while the tasks in
                        * flight, staged ones included, are at max_records,
                        * so the others never hold more), they hold at most a
                        * queue's worth waiting or delayed plus two per worker
                        * (running, a retry beyond the queue), and never wait
                        * for an on_done in the endings (theirs, if any, goes
                        * to a completion queue) */
                       .max_records_staged = full + slack + c->capacity + 2 * c->max_workers,
                       .run_timeout = c->run_timeout,
                       .retry_delay = c->retry_delay,
                       .retry_delay_max = c->retry_delay_max,
                       .serial = c->serial};
    return tp__life_init(&p->life, &lc, &p->calls, &p->gauges, prealloc, c->sched == TP_SCHED_FAIR,
                         c->starve_limit, c->low_max);
}

int tp_create(tp_pool **out, const tp_config *cfg) {
    if (!out) return TP_EINVAL;
    tp__hclk_init(); /* the histograms' clock, once per process (clock.h) */
    /* On a cache-line boundary, as its layout assumes (calloc gives 16 bytes) */
    void *mem;
    tp_pool *p = (tp_pool *)tp__calloc_big(1, sizeof *p, &mem);
    if (!p) return TP_ENOMEM;
    p->mem = mem;
    int rc = resolve_config(&p->cfg, cfg);
    if (rc != TP_OK) {
        free(p->mem);
        return rc;
    }
    do /* never 0: 0 marks a log id already written */
        p->cfg.serial = atomic_fetch_add_explicit(&tp__pool_serial, 1, memory_order_relaxed);
    while (p->cfg.serial == 0);
    if (make_life(p) != 0 || tp__engine_start(p) != TP_OK) {
        pool_free(p);
        return TP_ENOMEM;
    }
    *out = p;
    return TP_OK;
}

int tp_destroy(tp_pool *p) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    tp__lock(p);
    bool started = p->shut.state != TP__SHUT_NONE;
    tp__unlock(p);
    if (!started) (void)tp__engine_shutdown(p, 0);
    tp__engine_join(p);
    pool_free(p);
    return TP_OK;
}

/* ------------------------------------------------------------ admission */

/* A full queue refused without the lock (see the top of this file). */
static bool refuse_full_fast(tp_pool *p, const tp__admit_args *a) {
    if (!tp__life_full_fast(&p->life, a->user != NULL)) return false;
    /* release, like every counter update (taskpool.h, section 8) */
    atomic_fetch_add_explicit(&p->fast_full, 1, memory_order_release);
    return true;
}

/* Options a staged task can carry (stage.h): only an on_done with its
 * completion queue (tp__life_args checked the rest: a cq has an on_done,
 * the reserved words are zero; the caller checks the log id). */
static bool stageable(const tp_task_opts *o) {
    return o->cq && !(o->user && o->user[0]) && !o->run_timeout_ns && !o->deadline_ns && !o->priority;
}

/* Options a staged task with a user can carry (stage.h, life.h's
 * users_put): a user, and an on_done only with its completion queue. */
static bool stageable_user(const tp_task_opts *o) {
    return (o->cq || !o->on_done) && !o->run_timeout_ns && !o->deadline_ns && !o->priority;
}

int tp__submit_member(tp_pool *p, struct tp_group *g, tp_fn fn, void *arg, const tp_task_opts *opts,
                      uint64_t *id_out) {
    if (!p) return TP_EINVAL;
    /* A plain submit on a pool that stages takes not the pool lock but the
     * ring's put lock (stage.h, the two-lock queue): no
     * options but an on_done bound to a completion queue, no id asked, no
     * log id inherited from a running task (its record may be reused before
     * the staged task is admitted). Without options, only fn is checked. */
    bool staging = !id_out && !g && tp__stage_on(&p->stage);
    if (staging && !opts && tp__stage_plain(&p->stage)) {
        if (!fn) return TP_EINVAL;
        const char *inherited = tp_log_id_get();
        if (!inherited || !inherited[0]) {
            int rc = tp__engine_submit_staged(p, fn, arg, NULL, NULL, tp__hclk_now(), false);
            if (rc != TP__STAGE_LOCKED) return rc;
            staging = false; /* the ring is full or the pool closes */
        }
    }
    tp__admit_args a;
    int rc = tp__life_args(&p->life, fn, opts, &a);
    if (rc != TP_OK) return rc;
    a.group = g;
    if (staging && opts && !a.log_src) {
        if (stageable(opts) && tp__stage_plain(&p->stage)) {
            a.now = tp__hclk_now();
            rc = tp__engine_submit_staged(p, fn, arg, a.on_done, a.cq, a.now, false);
            if (rc != TP__STAGE_LOCKED) return rc;
        } else if (a.user && stageable_user(opts)) {
            a.now = tp__hclk_now();
            rc = tp__engine_submit_staged_user(p, arg, &a);
            if (rc != TP__STAGE_LOCKED) return rc;
        }
    }
    /* A group's submit takes the lock: a cancelled group answers
     * TP_ECANCELED before anything else, and counts nothing. */
    if (!g && refuse_full_fast(p, &a)) return TP_EFULL;
    return tp__engine_submit(p, &a, arg, id_out, false, TP_FOREVER);
}

int tp_submit(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    return tp__submit_member(p, NULL, fn, arg, opts, id_out);
}

int tp_submit_wait(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t budget_ns,
                   uint64_t *id_out) {
    if (!p) return TP_EINVAL;
    tp__admit_args a;
    int rc = tp__life_args(&p->life, fn, opts, &a);
    if (rc != TP_OK) return rc;
    uint64_t deadline = tp__deadline_after(tp_now_ns(), budget_ns ? budget_ns : p->cfg.submit_timeout);
    /* A task tp_submit would stage (tp__submit_member) is staged here too
     * when a place is free at once: accepted as tp_submit's, without the
     * pool lock. The budget is looked at first (a spent one is TP_ETIMEDOUT
     * even with space); with no place free, nothing is counted and the
     * locked path waits for one with the same budget. */
    if (!id_out && tp__stage_plain(&p->stage) && (!opts || stageable(opts)) && !a.log_src &&
        tp_now_ns() < deadline) {
        a.now = tp__hclk_now();
        rc = tp__engine_submit_staged(p, fn, arg, a.on_done, a.cq, a.now, true);
        if (rc != TP__STAGE_LOCKED) return rc;
    }
    return tp__engine_submit(p, &a, arg, id_out, true, deadline);
}

/* Whether every task of a batch could be staged (stageable; no log id,
 * explicit or inherited): then the whole batch is staged under one hold of
 * the ring's put lock, or none of it (tp__engine_submit_staged_batch). */
static bool batch_stageable(const tp_task *tasks, size_t valid) {
    const char *inherited = tp_log_id_get();
    if (inherited && inherited[0]) return false;
    for (size_t i = 0; i < valid; i++) {
        const tp_task_opts *o = tasks[i].opts;
        if (o && (!stageable(o) || (o->log_id && o->log_id[0]))) return false;
    }
    return true;
}

/* Tasks of a batch whose checked arguments stay on the stack; the arguments
 * of later ones are checked again under the lock (same inputs, same result). */
#define TP__BATCH_ARGS 32

int tp_submit_batch(tp_pool *p, const tp_task *tasks, size_t n, uint64_t *ids_out, size_t *accepted_out) {
    if (accepted_out) *accepted_out = 0;
    if (!p || (n > 0 && !tasks)) return TP_EINVAL;
    if (n == 0) return TP_OK;

    /* Arguments first, without the lock: tasks[0..valid) pass. The first one
     * that does not is refused with its TP_EINVAL only if every task before it
     * is admitted, and, like tp_submit's TP_EINVAL, counts nowhere. */
    tp__admit_args a[TP__BATCH_ARGS];
    size_t valid = 0;
    int arg_rc = TP_OK;
    for (; valid < n; valid++) {
        tp__admit_args spare;
        tp__admit_args *ak = valid < TP__BATCH_ARGS ? &a[valid] : &spare;
        arg_rc = !TP__RESERVED_ZERO(&tasks[valid])
                     ? TP_EINVAL
                     : tp__life_args(&p->life, tasks[valid].fn, tasks[valid].opts, ak);
        if (arg_rc != TP_OK) break;
    }
    if (valid == 0) return arg_rc;
    if (refuse_full_fast(p, &a[0])) return TP_EFULL;

    size_t k = 0;
    size_t checked = valid < TP__BATCH_ARGS ? valid : TP__BATCH_ARGS;
    int rc = TP__STAGE_LOCKED;
    if (!ids_out && tp__stage_plain(&p->stage) && batch_stageable(tasks, valid))
        rc = tp__engine_submit_staged_batch(p, tasks, valid, a, checked, &k);
    if (rc == TP__STAGE_LOCKED) rc = tp__engine_submit_batch(p, tasks, valid, a, checked, ids_out, &k);
    if (accepted_out) *accepted_out = k;
    if (rc != TP_OK) return rc;
    return k < n ? arg_rc : TP_OK;
}

/* ------------------------------------------------------------ cancel, lifecycle */

int tp_cancel(tp_pool *p, uint64_t id) {
    if (!p || id == 0) return TP_EINVAL;
    return tp__engine_cancel(p, id);
}

int tp_close(tp_pool *p) {
    if (!p) return TP_EINVAL;
    tp__engine_close(p);
    return TP_OK;
}

int tp_shutdown(tp_pool *p, uint64_t budget_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    return tp__engine_shutdown(p, budget_ns);
}

int tp_wait(tp_pool *p, uint64_t timeout_ns) {
    if (!p) return TP_EINVAL;
    if (tp__tls_pool == p) return TP_EDEADLK;
    return tp__engine_wait(p, timeout_ns);
}

/* ------------------------------------------------------------ weights */

int tp_user_weight_set(tp_pool *p, const char *user, unsigned weight) {
    if (!p || weight < 1 || weight > TP_WEIGHT_MAX || p->cfg.sched != TP_SCHED_FAIR) return TP_EINVAL;
    size_t len = user ? strnlen(user, TP_USER_MAX + 1) : 0;
    if (len > TP_USER_MAX) return TP_EINVAL;
    tp__lock(p);
    int rc = tp__life_set_weight(&p->life, user, len, weight);
    tp__unlock(p);
    return rc;
}
