/*
 * old_consumer_1_1.c -- a program written and built against release 1.1 of
 * libtaskpool (its header and its shared library), then run against this
 * build's shared library (see old_binary.sh). old_consumer.c does the same
 * for 1.0.
 *
 * It uses the 1.1 API that reads or writes public structs: tp_create with
 * every 1.1 field of tp_config set, tp_submit and tp_submit_wait with every
 * field of tp_task_opts, tp_submit_batch (tp_task arrays and ids), task
 * groups, tp_stats_get / tp_stats_format, tp_hist_get and tp_metrics_format,
 * and the default pool. Guard words sit right behind each struct and array:
 * a library that read a larger layout through this binary's structs would
 * see non-zero "reserved" words and refuse (TP_EINVAL), and one that wrote a
 * larger layout would overwrite a guard. Its references bind to the
 * TASKPOOL_1.1 symbol versions (old_binary.sh checks that too).
 * Exit status 0 on success; the first failed check is printed.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taskpool.h>

#define GUARD 0xA5A5A5A5A5A5A5A5ull
#define NG    16 /* guard words behind each struct */
#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "old_consumer_1_1: check failed: %s (line %d)\n", #cond, __LINE__);              \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#define NBATCH 4
struct guarded_config {
    tp_config c;
    uint64_t guard[NG];
};
struct guarded_opts {
    tp_task_opts o;
    uint64_t guard[NG];
};
struct guarded_stats {
    tp_stats s;
    uint64_t guard[NG];
};
struct guarded_hist {
    tp_hist h;
    uint64_t guard[NG];
};
struct guarded_batch {
    tp_task t[NBATCH];
    uint64_t guard[NG];
};
struct guarded_ids {
    uint64_t id[NBATCH];
    uint64_t guard[NG];
};

static void guards_set(uint64_t *g) {
    for (size_t i = 0; i < NG; i++) g[i] = GUARD;
}
static int guards_intact(const uint64_t *g) {
    for (size_t i = 0; i < NG; i++)
        if (g[i] != GUARD) return 0;
    return 1;
}

static atomic_int ran, done_ok, done_failed, log_warn, log_error, hook_start, hook_stop;
static int hook_cookie, log_cookie;

/* Succeeds; checks that the options arrived. */
static int task(tp_ctx *ctx, void *arg) {
    (void)arg;
    if (tp_ctx_user(ctx) == NULL || strcmp(tp_ctx_user(ctx), "old-user") != 0) return 5;
    if (strcmp(tp_ctx_log_id(ctx), "old-log") != 0) return 6;
    if (tp_ctx_deadline(ctx) == TP_FOREVER) return 7; /* run timeout and deadline were given */
    atomic_fetch_add(&ran, 1);
    return 0;
}
/* Fails its first attempt: the pool's one retry succeeds. */
static int flaky(tp_ctx *ctx, void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return tp_ctx_attempt(ctx) == 0 ? 3 : 0;
}
/* Fails every attempt. */
static int broken(tp_ctx *ctx, void *arg) {
    (void)ctx, (void)arg;
    atomic_fetch_add(&ran, 1);
    return 9;
}

static void on_done(void *arg, int status) {
    (void)arg;
    atomic_fetch_add(status == 0 ? &done_ok : &done_failed, 1);
}
static void log_hook(void *arg, int level, const char *log_id, const char *msg) {
    (void)log_id, (void)msg;
    if (arg != &log_cookie) return;
    atomic_fetch_add(level == TP_LOG_WARN ? &log_warn : &log_error, 1);
}
static void worker_start(void *arg) {
    if (arg == &hook_cookie) atomic_fetch_add(&hook_start, 1);
}
static void worker_stop(void *arg) {
    if (arg == &hook_cookie) atomic_fetch_add(&hook_stop, 1);
}

static void config_init(struct guarded_config *gc) {
    memset(&gc->c, 0, sizeof gc->c);
    guards_set(gc->guard);
    gc->c.workers = 2;
    gc->c.max_workers = 3;
    gc->c.queue_capacity = 32;
    gc->c.max_per_user = 16;
    gc->c.run_timeout_ns = 30ull * 1000000000u;
    gc->c.submit_timeout_ns = 5ull * 1000000000u;
    gc->c.drain_timeout_ns = 60ull * 1000000000u;
    gc->c.idle_timeout_ns = 60ull * 1000000000u;
    gc->c.max_retries = 1;
    gc->c.retry_delay_ns = 1000000u; /* 1 ms */
    gc->c.name = "old11";
    gc->c.log = log_hook;
    gc->c.log_arg = &log_cookie;
    gc->c.on_worker_start = worker_start;
    gc->c.on_worker_stop = worker_stop;
    gc->c.hook_arg = &hook_cookie; /* the last field before the 1.1 tail */
}

static void opts_init(struct guarded_opts *go) {
    memset(&go->o, 0, sizeof go->o);
    guards_set(go->guard);
    go->o.user = "old-user";
    go->o.run_timeout_ns = 30ull * 1000000000u;
    go->o.deadline_ns = tp_now_ns() + 600ull * 1000000000u;
    go->o.on_done = on_done;
    go->o.log_id = "old-log";
    go->o.priority = 0; /* the last field before the 1.1 tail */
}

int main(void) {
    /* The library must be of this major version and at least this minor. */
    int maj = 0, min = 0, pat = 0;
    CHECK(sscanf(tp_version(), "%d.%d.%d", &maj, &min, &pat) == 3);
    CHECK(maj == TP_VERSION_MAJOR);
    CHECK(min >= TP_VERSION_MINOR);
    printf("old_consumer_1_1: built against %d.%d.%d, running on %s\n", TP_VERSION_MAJOR, TP_VERSION_MINOR,
           TP_VERSION_PATCH, tp_version());

    struct guarded_config gc;
    config_init(&gc);
    tp_pool *p = NULL;
    CHECK(tp_create(&p, &gc.c) == TP_OK);
    CHECK(guards_intact(gc.guard));

    /* Single submits: every option field set. */
    struct guarded_opts go;
    opts_init(&go);
    uint64_t id = 0;
    CHECK(tp_submit(p, task, NULL, &go.o, &id) == TP_OK && id != 0);
    CHECK(tp_submit_wait(p, flaky, NULL, &go.o, 0, &id) == TP_OK && id != 0);
    CHECK(guards_intact(go.guard));

    /* A batch: tp_task array, ids and options behind guards. */
    struct guarded_batch gb;
    struct guarded_ids gi;
    memset(gb.t, 0, sizeof gb.t);
    guards_set(gb.guard);
    memset(gi.id, 0, sizeof gi.id);
    guards_set(gi.guard);
    for (int i = 0; i < NBATCH; i++) {
        gb.t[i].fn = task;
        gb.t[i].arg = NULL;
        gb.t[i].opts = &go.o;
    }
    size_t k = 99;
    CHECK(tp_submit_batch(p, gb.t, NBATCH, gi.id, &k) == TP_OK);
    CHECK(k == NBATCH);
    for (int i = 0; i < NBATCH; i++) CHECK(gi.id[i] != 0 && (i == 0 || gi.id[i] > gi.id[i - 1]));
    CHECK(guards_intact(gb.guard) && guards_intact(gi.guard) && guards_intact(go.guard));

    /* Groups: one that succeeds, one whose member fails for good. */
    tp_group *g = NULL;
    CHECK(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &g) == TP_OK);
    for (int i = 0; i < 2; i++) CHECK(tp_group_submit(g, task, NULL, &go.o, NULL) == TP_OK);
    CHECK(tp_group_wait(g, TP_FOREVER) == TP_OK);
    CHECK(tp_group_destroy(g) == TP_OK);
    CHECK(tp_group_create(p, 0, &g) == TP_OK);
    CHECK(tp_group_submit(g, broken, NULL, &go.o, NULL) == TP_OK);
    CHECK(tp_group_wait(g, TP_FOREVER) == 9);
    CHECK(tp_group_destroy(g) == TP_OK);
    CHECK(guards_intact(go.guard));
    const int accepted = 2 + NBATCH + 2 + 1;

    CHECK(tp_shutdown(p, TP_FOREVER) == TP_OK);
    CHECK(tp_wait(p, TP_FOREVER) == TP_OK);

    /* Statistics. */
    struct guarded_stats gs;
    memset(&gs.s, 0xA5, sizeof gs.s); /* every word the library must write is written */
    guards_set(gs.guard);
    tp_stats_get(p, &gs.s);
    CHECK(guards_intact(gs.guard));
    CHECK(gs.s.submitted == (uint64_t)accepted && gs.s.accepted == (uint64_t)accepted);
    CHECK(gs.s.completed == gs.s.accepted);
    CHECK(gs.s.succeeded == (uint64_t)accepted - 1 && gs.s.failed == 1 && gs.s.cancelled == 0);
    CHECK(gs.s.started == (uint64_t)accepted && gs.s.retried == 2); /* flaky's and broken's */
    CHECK(gs.s.active == 0 && gs.s.queued == 0 && gs.s.delayed == 0 && gs.s.users == 0);
    CHECK(atomic_load(&ran) == (int)(gs.s.started + gs.s.retried));
    CHECK(atomic_load(&done_ok) == accepted - 1 && atomic_load(&done_failed) == 1);
    CHECK(atomic_load(&log_warn) == 2 && atomic_load(&log_error) == 1);
    CHECK(atomic_load(&hook_start) >= 2 && atomic_load(&hook_stop) == atomic_load(&hook_start));
    char text[4096];
    int n = tp_stats_format(&gs.s, TP_FORMAT_JSON, text, sizeof text);
    CHECK(n > 0 && (size_t)n < sizeof text && strstr(text, "\"retried\":2") != NULL);
    CHECK(guards_intact(gs.guard));

    /* Histograms. */
    struct guarded_hist gh;
    for (int which = TP_HIST_QUEUE_WAIT; which <= TP_HIST_RUN; which++) {
        guards_set(gh.guard);
        CHECK(tp_hist_get(p, which, &gh.h) == TP_OK);
        CHECK(guards_intact(gh.guard));
        CHECK(gh.h.count == gs.s.started + gs.s.retried);
        uint64_t sum = 0;
        for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) sum += gh.h.buckets[i];
        CHECK(sum == gh.h.count);
        CHECK(tp_hist_quantile_ns(&gh.h, 0.5) >= tp_hist_bound_ns(0));
    }
    CHECK(tp_hist_bound_ns(0) == 128 && tp_hist_bound_ns(TP_HIST_BUCKETS - 1) == UINT64_MAX);

    /* Metrics: snprintf rules, nothing written past `len`. */
    tp_pool *pools[1] = {p};
    for (int format = TP_FORMAT_JSON; format <= TP_FORMAT_PROMETHEUS; format++) {
        int need = tp_metrics_format(pools, 1, format, NULL, 0);
        CHECK(need > 0);
        char *buf = malloc((size_t)need + 1 + 64);
        CHECK(buf != NULL);
        memset(buf, 0xA5, (size_t)need + 1 + 64);
        CHECK(tp_metrics_format(pools, 1, format, buf, (size_t)need + 1) == need);
        CHECK(buf[need] == '\0' && strlen(buf) == (size_t)need);
        for (int i = 1; i <= 64; i++) CHECK((unsigned char)buf[need + i] == 0xA5);
        char want[128];
        unsigned long long attempts = (unsigned long long)(gs.s.started + gs.s.retried);
        if (format == TP_FORMAT_JSON) {
            CHECK(strstr(buf, "\"pools\":{\"old11\":{") != NULL);
            snprintf(want, sizeof want, "\"queue_wait\":{\"count\":%llu,", attempts);
        } else {
            CHECK(strstr(buf, "taskpool_build_info{version=\"") != NULL);
            snprintf(want, sizeof want, "taskpool_run_seconds_count{pool=\"old11\"} %llu\n", attempts);
        }
        CHECK(strstr(buf, want) != NULL);
        free(buf);
    }
    CHECK(tp_destroy(p) == TP_OK);

    /* The default pool takes the same structs. */
    config_init(&gc);
    opts_init(&go);
    CHECK(tp_default_create(&gc.c) == TP_OK);
    CHECK(tp_default_submit(task, NULL, &go.o, NULL) == TP_OK);
    CHECK(tp_default_shutdown(TP_FOREVER) == TP_OK);
    CHECK(guards_intact(gc.guard) && guards_intact(go.guard));
    tp_pool *d = tp_default_swap(NULL);
    CHECK(d != NULL);
    guards_set(gs.guard);
    tp_stats_get(d, &gs.s);
    CHECK(guards_intact(gs.guard) && gs.s.succeeded == 1);
    CHECK(tp_destroy(d) == TP_OK);

    printf("old_consumer_1_1: OK (%d tasks, 2 groups, a batch of %d, metrics)\n", accepted + 1, NBATCH);
    return 0;
}
