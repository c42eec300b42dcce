/*
 * test_logid.c -- log ids and logging (header section 9).
 *
 * Covers: an explicit log id in opts (copied) is what tp_ctx_log_id and
 * tp_log_id_get return in the task; inherited from the submitting thread's
 * tp_log_id_set (copied at submit); generated when neither ("tp-" + hex fields,
 * unique over 1000 tasks and across pools); kept across retries; work a task
 * submits inherits its log id (or the one it set); the worker's log id does
 * not leak into the next task; on_done sees the task's log id; tp_log_id_set
 * semantics on a plain thread (copy, NULL/"" clear, truncation); the log hook
 * receives the task's log id; default logging to stderr; a log id longer than
 * TP_LOG_ID_MAX is TP_EINVAL and changes no counter.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "tp_test.h"

#define IDLEN (TP_LOG_ID_MAX + 16)

typedef struct lrec {
    /* inputs */
    tpt_latch *gate;     /* wait on it first */
    tp_pool *pool;       /* submit children to it */
    struct lrec *child;  /* submitted with opts NULL */
    struct lrec *child2; /* submitted after tp_log_id_set(set_id) */
    const char *set_id;
    int fail_until; /* attempts < fail_until return 1 */
    /* outputs */
    char ctx_id[IDLEN];
    char get_id[IDLEN];
    char set_get_id[IDLEN];    /* tp_log_id_get after tp_log_id_set */
    char attempt_id[4][IDLEN]; /* tp_ctx_log_id per attempt */
    char done_id[IDLEN];       /* tp_log_id_get inside on_done */
    atomic_int ctx_null;
    atomic_int get_null;
    atomic_int done_null;
    atomic_int child_rc;
    atomic_int child2_rc;
    atomic_int attempts;
    atomic_int finished; /* publishes the buffers above */
    atomic_int done_calls;
} lrec;

static void copy_id(char *dst, const char *src) { snprintf(dst, IDLEN, "%s", src ? src : ""); }

static void lrec_done(void *arg, int status) {
    (void)status;
    lrec *r = arg;
    const char *g = tp_log_id_get();
    atomic_store(&r->done_null, g == NULL);
    copy_id(r->done_id, g);
    atomic_fetch_add(&r->done_calls, 1);
}

static int lrec_task(tp_ctx *c, void *arg) {
    lrec *r = arg;
    if (r->gate) tpt_latch_wait(r->gate);
    unsigned a = tp_ctx_attempt(c);
    const char *ci = tp_ctx_log_id(c);
    const char *gi = tp_log_id_get();
    if (a < 4) copy_id(r->attempt_id[a], ci);
    copy_id(r->ctx_id, ci);
    copy_id(r->get_id, gi);
    atomic_store(&r->ctx_null, ci == NULL);
    atomic_store(&r->get_null, gi == NULL);
    if (r->child) {
        tp_task_opts o = {0};
        o.on_done = lrec_done;
        atomic_store(&r->child_rc, tp_submit(r->pool, lrec_task, r->child, &o, NULL));
    }
    if (r->set_id) {
        tp_log_id_set(r->set_id);
        copy_id(r->set_get_id, tp_log_id_get());
    }
    if (r->child2) {
        tp_task_opts o = {0};
        o.on_done = lrec_done;
        atomic_store(&r->child2_rc, tp_submit(r->pool, lrec_task, r->child2, &o, NULL));
    }
    atomic_fetch_add(&r->attempts, 1);
    int rc = (int)a < r->fail_until ? 1 : 0;
    atomic_store(&r->finished, 1);
    return rc;
}

static void submit_l(tp_pool *p, lrec *r, const char *log_id) {
    tp_task_opts o = {0};
    o.log_id = log_id;
    o.on_done = lrec_done;
    assert_int_equal(tp_submit(p, lrec_task, r, &o, NULL), TP_OK);
}

static void wait_l(lrec *r) {
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->finished), 1);
    assert_false(atomic_load(&r->ctx_null));
}

/* A generated id, as other tests need it: "tp-" and something after. The exact
 * format is pinned once, in test_logid_generated_unique. */
static int is_generated(const char *s) { return strncmp(s, "tp-", 3) == 0 && s[3] != '\0'; }

/* The documented format: "tp-" then three hex fields joined by '-' (a
 * per-process tag, the pool's serial, the task id), e.g. "tp-5f3a9c01-1-2a". */
static int is_generated_format(const char *s) {
    if (strncmp(s, "tp-", 3) != 0) return 0;
    int fields = 0;
    const char *q = s + 3;
    for (;;) {
        const char *f = q;
        while (isxdigit((unsigned char)*q)) q++;
        if (q == f) return 0; /* empty field */
        fields++;
        if (*q == '\0') break;
        if (*q != '-') return 0;
        q++;
    }
    return fields == 3;
}

/* ------------------------------------------------------------ explicit */

static void test_logid_explicit_copied(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    tp_pool *p = tpt_quiet_pool(f, 1, 0, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    char buf[64];
    strcpy(buf, "req-123");
    lrec *r = tpt_fx_new(f, lrec);
    submit_l(p, r, buf);
    memset(buf, 'Q', sizeof buf - 1);
    buf[sizeof buf - 1] = '\0';
    tpt_latch_open(gate);
    wait_l(r);
    assert_string_equal(r->ctx_id, "req-123");
    assert_false(atomic_load(&r->get_null));
    assert_string_equal(r->get_id, "req-123");
    assert_false(atomic_load(&r->done_null));
    assert_string_equal(r->done_id, "req-123"); /* on_done runs with it too */

    /* Exactly TP_LOG_ID_MAX bytes is fine and arrives whole. */
    char longid[TP_LOG_ID_MAX + 1];
    memset(longid, 'L', TP_LOG_ID_MAX);
    longid[TP_LOG_ID_MAX] = '\0';
    lrec *l = tpt_fx_new(f, lrec);
    submit_l(p, l, longid);
    wait_l(l);
    assert_string_equal(l->ctx_id, longid);
    tpt_finish(p);
}

static void test_logid_too_long_einval(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 0, 0);
    TPT_EVENTUALLY(tpt_stats(p).idle == 1);
    tp_stats before = tpt_stats(p);
    char longid[TP_LOG_ID_MAX + 2];
    memset(longid, 'L', TP_LOG_ID_MAX + 1);
    longid[TP_LOG_ID_MAX + 1] = '\0';
    tp_task_opts o = {0};
    o.log_id = longid;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, &id), TP_EINVAL);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, &o, TPT_MS(10), &id), TP_EINVAL);
    tp_stats after = tpt_stats(p);
    assert_memory_equal(&before, &after, sizeof before);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.submitted, 0);
}

/* ------------------------------------------------------------ thread log id */

static void test_logid_set_get_on_plain_thread(void **state) {
    (void)state;
    tp_log_id_set(NULL);
    assert_null(tp_log_id_get());
    char buf[32];
    strcpy(buf, "abc");
    tp_log_id_set(buf);
    strcpy(buf, "zzz"); /* copied */
    assert_non_null(tp_log_id_get());
    assert_string_equal(tp_log_id_get(), "abc");
    tp_log_id_set(NULL);
    assert_null(tp_log_id_get());
    tp_log_id_set("x");
    assert_string_equal(tp_log_id_get(), "x");
    tp_log_id_set("");
    assert_null(tp_log_id_get());

    /* Truncated to TP_LOG_ID_MAX bytes. */
    char big[300];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    tp_log_id_set(big);
    assert_non_null(tp_log_id_get());
    assert_int_equal(strlen(tp_log_id_get()), TP_LOG_ID_MAX);
    assert_memory_equal(tp_log_id_get(), big, TP_LOG_ID_MAX);
    tp_log_id_set(NULL);
    assert_null(tp_log_id_get());
}

static void test_logid_inherited_from_submitter(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    tp_pool *p = tpt_quiet_pool(f, 1, 0, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    char buf[32];
    strcpy(buf, "parent-1");
    tp_log_id_set(buf);
    strcpy(buf, "changed");
    lrec *a = tpt_fx_new(f, lrec);
    lrec *b = tpt_fx_new(f, lrec);
    lrec *e = tpt_fx_new(f, lrec);
    lrec *g = tpt_fx_new(f, lrec);
    submit_l(p, a, NULL);
    assert_int_equal(tp_submit(p, lrec_task, b, NULL, NULL), TP_OK); /* opts NULL */
    submit_l(p, e, "explicit-wins");
    tp_log_id_set("parent-2"); /* changing it later does not reach a */
    tp_log_id_set(NULL);
    submit_l(p, g, NULL); /* none: generated */
    tpt_latch_open(gate);

    wait_l(a);
    TPT_EVENTUALLY(atomic_load(&b->finished) == 1);
    wait_l(e);
    wait_l(g);
    assert_string_equal(a->ctx_id, "parent-1");
    assert_string_equal(a->get_id, "parent-1");
    assert_string_equal(b->ctx_id, "parent-1");
    assert_string_equal(e->ctx_id, "explicit-wins");
    assert_true(is_generated(g->ctx_id));
    assert_string_equal(g->get_id, g->ctx_id);
    tpt_finish(p);
    assert_null(tp_log_id_get());
}

/* ------------------------------------------------------------ generated */

typedef struct gen_slot {
    char id[IDLEN];
    atomic_int same; /* tp_log_id_get() == tp_ctx_log_id() */
    atomic_int done;
} gen_slot;

static int gen_task(tp_ctx *c, void *arg) {
    gen_slot *g = arg;
    const char *ci = tp_ctx_log_id(c);
    const char *gi = tp_log_id_get();
    copy_id(g->id, ci);
    atomic_store(&g->same, ci && gi && strcmp(ci, gi) == 0);
    atomic_store(&g->done, 1);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_logid_generated_unique(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    enum { N = 1000, M = 100 };
    gen_slot *slots = calloc(N + M, sizeof *slots);
    assert_non_null(slots);
    tp_pool *p = tpt_quiet_pool(f, 2, N, 0);
    tp_pool *q = tpt_quiet_pool(f, 1, M, 0);
    for (int i = 0; i < N; i++) assert_int_equal(tp_submit(p, gen_task, &slots[i], NULL, NULL), TP_OK);
    for (int i = 0; i < M; i++) assert_int_equal(tp_submit(q, gen_task, &slots[N + i], NULL, NULL), TP_OK);
    for (int i = 0; i < N + M; i++) TPT_EVENTUALLY(atomic_load(&slots[i].done) == 1);
    tpt_finish(p);
    tpt_finish(q);

    const char **ids = malloc((N + M) * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < N + M; i++) {
        assert_true(is_generated(slots[i].id));
        assert_true(atomic_load(&slots[i].same));
        ids[i] = slots[i].id;
    }
    qsort(ids, N + M, sizeof *ids, cmp_str);
    for (int i = 1; i < N + M; i++)
        if (strcmp(ids[i - 1], ids[i]) == 0)
            fail_msg("generated log id \"%s\" used twice (two pools share a process)", ids[i]);
    free(ids);
    /* The format the header documents. */
    char first[IDLEN];
    snprintf(first, sizeof first, "%s", slots[0].id);
    int bad = -1;
    for (int i = 0; i < N + M && bad < 0; i++)
        if (!is_generated_format(slots[i].id)) bad = i;
    free(slots);
    if (bad >= 0)
        fail_msg("generated log id (e.g. \"%s\") is not \"tp-\" + three '-'-joined hex "
                 "fields as taskpool.h documents",
                 first);
}

/* ------------------------------------------------------------ retries */

static void test_logid_kept_across_retries(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.max_retries = 2;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);

    lrec *gen = tpt_fx_new(f, lrec);
    lrec *exp = tpt_fx_new(f, lrec);
    lrec *inh = tpt_fx_new(f, lrec);
    gen->fail_until = 2;
    exp->fail_until = 2;
    inh->fail_until = 2;
    submit_l(p, gen, NULL);
    submit_l(p, exp, "retry-me");
    tp_log_id_set("inherit-me");
    submit_l(p, inh, NULL);
    tp_log_id_set(NULL);
    wait_l(gen);
    wait_l(exp);
    wait_l(inh);
    tpt_finish(p);

    lrec *all[] = {gen, exp, inh};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(atomic_load(&all[k]->attempts), 3);
        for (int a = 1; a < 3; a++) assert_string_equal(all[k]->attempt_id[a], all[k]->attempt_id[0]);
        assert_string_equal(all[k]->done_id, all[k]->attempt_id[0]);
    }
    assert_true(is_generated(gen->attempt_id[0]));
    assert_string_equal(exp->attempt_id[0], "retry-me");
    assert_string_equal(inh->attempt_id[0], "inherit-me");
}

/* ------------------------------------------------------------ children */

static void test_logid_child_inherits(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    tp_pool *p = tpt_quiet_pool(f, 1, 0, 0); /* one worker: children run after, on it */

    lrec *parent = tpt_fx_new(f, lrec);
    lrec *child = tpt_fx_new(f, lrec);
    lrec *child2 = tpt_fx_new(f, lrec);
    parent->pool = p;
    parent->child = child;
    parent->child2 = child2;
    parent->set_id = "override";
    submit_l(p, parent, "parent-xyz");
    wait_l(parent);
    assert_int_equal(atomic_load(&parent->child_rc), TP_OK);
    assert_int_equal(atomic_load(&parent->child2_rc), TP_OK);
    wait_l(child);
    wait_l(child2);
    assert_string_equal(parent->ctx_id, "parent-xyz");
    assert_string_equal(parent->set_get_id, "override");
    assert_string_equal(child->ctx_id, "parent-xyz");
    assert_string_equal(child->get_id, "parent-xyz");
    assert_string_equal(child2->ctx_id, "override");

    /* The override ended with the parent's call: the next task on the same
     * worker, submitted without a log id, gets its own (generated) one. */
    lrec *next = tpt_fx_new(f, lrec);
    submit_l(p, next, NULL);
    wait_l(next);
    assert_true(is_generated(next->ctx_id));
    assert_string_equal(next->get_id, next->ctx_id);

    /* A parent with a generated id passes that one on. */
    lrec *gp = tpt_fx_new(f, lrec);
    lrec *gc = tpt_fx_new(f, lrec);
    gp->pool = p;
    gp->child = gc;
    submit_l(p, gp, NULL);
    wait_l(gp);
    wait_l(gc);
    assert_true(is_generated(gp->ctx_id));
    assert_string_equal(gc->ctx_id, gp->ctx_id);
    tpt_finish(p);
}

static void test_logid_on_done_of_unrun_task(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    /* A task cancelled while queued ends on the service thread: its on_done
     * still runs with the task's log id current. */
    tp_pool *p = tpt_quiet_pool(f, 1, 0, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    lrec *r = tpt_fx_new(f, lrec);
    lrec *g = tpt_fx_new(f, lrec);
    tp_task_opts o = {0};
    o.on_done = lrec_done;
    o.log_id = "unrun-7";
    uint64_t id = 0, gid = 0;
    assert_int_equal(tp_submit(p, lrec_task, r, &o, &id), TP_OK);
    o.log_id = NULL;
    assert_int_equal(tp_submit(p, lrec_task, g, &o, &gid), TP_OK);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    assert_int_equal(tp_cancel(p, gid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1 && atomic_load(&g->done_calls) == 1);
    assert_false(atomic_load(&r->done_null));
    assert_string_equal(r->done_id, "unrun-7");
    assert_false(atomic_load(&g->done_null));
    assert_true(is_generated(g->done_id));
    tpt_latch_open(gate);
    tpt_finish(p);
    assert_int_equal(atomic_load(&r->finished), 0); /* never ran */
}

/* A worker's own log id (set in on_worker_start) is current again after
 * each task, whether the task set its own or not, and at on_worker_stop;
 * inside a task the task's id, then the one the task set. */
static char g_stop_id[IDLEN];
static atomic_int g_stop_calls;

static void worker_start_sets_id(void *arg) {
    (void)arg;
    tp_log_id_set("worker-own");
}

static void worker_stop_reads_id(void *arg) {
    (void)arg;
    copy_id(g_stop_id, tp_log_id_get());
    atomic_fetch_add(&g_stop_calls, 1);
}

typedef struct own_rec {
    char before[IDLEN], after_set[IDLEN], after_clear[IDLEN];
    int set; /* 1: the task sets an id, then clears it */
    atomic_int done;
} own_rec;

static int own_task(tp_ctx *c, void *arg) {
    (void)c;
    own_rec *r = arg;
    copy_id(r->before, tp_log_id_get());
    if (r->set) {
        tp_log_id_set("task-set");
        copy_id(r->after_set, tp_log_id_get());
        tp_log_id_set(NULL);
        copy_id(r->after_clear, tp_log_id_get());
    }
    atomic_store(&r->done, 1);
    return 0;
}

static void test_logid_worker_own_kept(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    atomic_store(&g_stop_calls, 0);
    g_stop_id[0] = '\0';
    tp_config cfg = tpt_quiet_config(1, 0, 0);
    cfg.on_worker_start = worker_start_sets_id;
    cfg.on_worker_stop = worker_stop_reads_id;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    own_rec *a = tpt_fx_new(f, own_rec), *b = tpt_fx_new(f, own_rec), *c = tpt_fx_new(f, own_rec);
    a->set = 1;
    c->set = 1;
    tp_task_opts o = {0};
    o.log_id = "task-a";
    assert_int_equal(tp_submit(p, own_task, a, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&a->done) == 1);
    o.log_id = "task-b";
    assert_int_equal(tp_submit(p, own_task, b, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&b->done) == 1);
    o.log_id = "task-c";
    assert_int_equal(tp_submit(p, own_task, c, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&c->done) == 1);
    tpt_finish(p);
    assert_string_equal(a->before, "task-a");
    assert_string_equal(a->after_set, "task-set");
    assert_string_equal(a->after_clear, "");  /* cleared for the rest of the call */
    assert_string_equal(b->before, "task-b"); /* not a's */
    assert_string_equal(c->before, "task-c");
    assert_int_equal(atomic_load(&g_stop_calls), 1);
    assert_string_equal(g_stop_id, "worker-own");
    assert_null(tp_log_id_get()); /* this thread's untouched */
}

/* ------------------------------------------------------------ log hook */

typedef struct hook_entry {
    int level;
    char log_id[IDLEN];
} hook_entry;

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static hook_entry hook_rec[64];
static int hook_n;
static int hook_null;

static void hook_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg;
    (void)msg;
    pthread_mutex_lock(&hook_mu);
    if (!log_id) hook_null++;
    if (hook_n < 64) {
        hook_rec[hook_n].level = level;
        copy_id(hook_rec[hook_n].log_id, log_id);
        hook_n++;
    }
    pthread_mutex_unlock(&hook_mu);
}

static int hook_count(const char *log_id, int level) {
    int n = 0;
    pthread_mutex_lock(&hook_mu);
    for (int i = 0; i < hook_n; i++)
        if (hook_rec[i].level == level && strcmp(hook_rec[i].log_id, log_id) == 0) n++;
    pthread_mutex_unlock(&hook_mu);
    return n;
}

static void test_logid_log_hook_receives_it(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    pthread_mutex_lock(&hook_mu);
    hook_n = 0;
    hook_null = 0;
    pthread_mutex_unlock(&hook_mu);

    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.log = hook_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    lrec *e = tpt_fx_new(f, lrec);
    lrec *i = tpt_fx_new(f, lrec);
    lrec *g = tpt_fx_new(f, lrec);
    e->fail_until = 1;
    i->fail_until = 1;
    g->fail_until = 1;
    submit_l(p, e, "fail-1");
    tp_log_id_set("inh-2");
    submit_l(p, i, NULL);
    tp_log_id_set(NULL);
    submit_l(p, g, NULL);
    wait_l(e);
    wait_l(i);
    wait_l(g);
    tpt_finish(p);

    assert_int_equal(hook_count("fail-1", TP_LOG_ERROR), 1);
    assert_int_equal(hook_count("inh-2", TP_LOG_ERROR), 1);
    assert_true(is_generated(g->ctx_id));
    assert_int_equal(hook_count(g->ctx_id, TP_LOG_ERROR), 1);
    pthread_mutex_lock(&hook_mu);
    int nulls = hook_null;
    pthread_mutex_unlock(&hook_mu);
    assert_int_equal(nulls, 0);
}

static void test_logid_default_stderr(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_log_id_set(NULL);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(pfd[1], 2) >= 0);

    /* No cmocka assert may run while stderr is redirected: record, then check. */
    tp_config cfg = {0};
    cfg.workers = 1; /* log NULL: failures go to stderr */
    tp_pool *p = NULL;
    int rc_create = tp_create(&p, &cfg);
    int rc_submit = -100, rc_shut = -100, rc_wait = -100, rc_destroy = -100;
    lrec *r = tpt_fx_new(f, lrec);
    r->fail_until = 1;
    if (rc_create == TP_OK) {
        tp_task_opts o = {0};
        o.log_id = "stderr-probe-42";
        o.on_done = lrec_done;
        rc_submit = tp_submit(p, lrec_task, r, &o, NULL);
        rc_shut = tp_shutdown(p, TPT_WAIT_NS);
        rc_wait = tp_wait(p, TPT_WAIT_NS);
        rc_destroy = tp_destroy(p);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(pfd[1]);

    char out[8192];
    size_t n = 0;
    int fl = fcntl(pfd[0], F_GETFL);
    fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK);
    for (;;) {
        ssize_t k = read(pfd[0], out + n, sizeof out - 1 - n);
        if (k > 0) {
            n += (size_t)k;
            if (n == sizeof out - 1) break;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        break;
    }
    out[n] = '\0';
    close(pfd[0]);

    assert_int_equal(rc_create, TP_OK);
    assert_int_equal(rc_submit, TP_OK);
    assert_int_equal(rc_shut, TP_OK);
    assert_int_equal(rc_wait, TP_OK);
    assert_int_equal(rc_destroy, TP_OK);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    if (!strstr(out, "stderr-probe-42"))
        fail_msg("stderr did not mention the failed task's log id; got: \"%s\"", out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_logid_explicit_copied),         TPT_TEST(test_logid_too_long_einval),
        TPT_TEST(test_logid_set_get_on_plain_thread), TPT_TEST(test_logid_inherited_from_submitter),
        TPT_TEST(test_logid_generated_unique),        TPT_TEST(test_logid_kept_across_retries),
        TPT_TEST(test_logid_child_inherits),          TPT_TEST(test_logid_on_done_of_unrun_task),
        TPT_TEST(test_logid_worker_own_kept),         TPT_TEST(test_logid_log_hook_receives_it),
        TPT_TEST(test_logid_default_stderr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
