/*
 * test_abi_layout.c -- the public structs keep the 1.1 layout (taskpool.h,
 * "How the structs grow").
 *
 * A program built against 1.1 passes and receives tp_config, tp_task_opts,
 * tp_stats, tp_task and tp_hist as the 1.1 header laid them out. This file
 * freezes those five layouts (copied from the 1.1 header, v1.1.0) and checks
 * against the current header, on whatever ABI the test is built for:
 *   - every 1.1 field keeps its offset, and every struct its size;
 *   - every field added since sits inside the 1.1 reserved tail: at or after
 *     the 1.1 `reserved` offset and before the struct's end, and the current
 *     tail ends the struct;
 *   - the constants an old binary has compiled in keep their values.
 * On x86-64 (LP64) it also checks the absolute offsets and sizes, so that a
 * change which moved both layouts alike is still caught there.
 * The sizes are also _Static_asserts: a break fails the build itself. The
 * ABI of the built library is compared with abidiff (tests/abi/abi_check.sh);
 * a 1.1 binary is run on it by tests/abi/old_binary.sh.
 */
#include <stddef.h>

#include "tp_test.h"

/* ------------------------------------------------------------ 1.1, frozen */

typedef struct cfg_1_1 {
    unsigned workers, max_workers, queue_capacity, max_per_user;
    uint64_t run_timeout_ns, submit_timeout_ns, drain_timeout_ns, idle_timeout_ns;
    unsigned max_retries;
    uint64_t retry_delay_ns;
    const char *name;
    tp_log_fn log;
    void *log_arg;
    void (*on_worker_start)(void *);
    void (*on_worker_stop)(void *);
    void *hook_arg;
    uint64_t reserved[8];
} cfg_1_1;

typedef struct opts_1_1 {
    const char *user;
    uint64_t run_timeout_ns, deadline_ns;
    tp_done_fn on_done;
    const char *log_id;
    int priority;
    uint64_t reserved[4];
} opts_1_1;

typedef struct stats_1_1 {
    uint64_t submitted, accepted, rejected;
    uint64_t rejected_full, rejected_user, rejected_closed, rejected_timeout;
    uint64_t started, retried, completed, succeeded, failed, cancelled, expired;
    uint32_t active, queued, delayed, workers, idle, users;
    uint64_t reserved[16];
} stats_1_1;

typedef struct task_1_1 {
    tp_fn fn;
    void *arg;
    const tp_task_opts *opts;
    uint64_t reserved[2];
} task_1_1;

typedef struct hist_1_1 {
    uint64_t count, sum_ns;
    uint64_t buckets[282];
    uint64_t reserved[4];
} hist_1_1;

_Static_assert(sizeof(tp_config) == sizeof(cfg_1_1), "tp_config changed size");
_Static_assert(sizeof(tp_task_opts) == sizeof(opts_1_1), "tp_task_opts changed size");
_Static_assert(sizeof(tp_stats) == sizeof(stats_1_1), "tp_stats changed size");
_Static_assert(sizeof(tp_task) == sizeof(task_1_1), "tp_task changed size");
_Static_assert(sizeof(tp_hist) == sizeof(hist_1_1), "tp_hist changed size");

/* ------------------------------------------------------------ checks */

typedef struct field {
    const char *name;
    size_t now, then; /* offset in the current header, in the 1.1 one */
} field;

/* The offset of the 1.1 struct's reserved word i. */
#define WORD(type_then, i) (offsetof(type_then, reserved) + (i) * sizeof(uint64_t))

#define SAME(type_now, type_then, f)                                                                         \
    { #type_now "." #f, offsetof(type_now, f), offsetof(type_then, f) }

static void fields_kept(const field *fs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (fs[i].now != fs[i].then)
            fail_msg("%s moved: offset %zu, was %zu in 1.1", fs[i].name, fs[i].now, fs[i].then);
    }
}

/* A field added after 1.1 (offset `at`, `size` bytes) lies inside the 1.1
 * reserved tail [tail, end). */
static void in_tail(const char *name, size_t at, size_t size, size_t tail, size_t end) {
    if (at < tail || at + size > end)
        fail_msg("%s at [%zu, %zu) is outside the 1.1 reserved tail [%zu, %zu)", name, at, at + size, tail,
                 end);
}
#define IN_TAIL(type_now, type_then, f)                                                                      \
    in_tail(#type_now "." #f, offsetof(type_now, f), sizeof(((type_now *)0)->f),                             \
            offsetof(type_then, reserved), sizeof(type_then))
/* The current tail ends the struct: nothing was added behind it. */
#define TAIL_LAST(type_now)                                                                                  \
    assert_int_equal(offsetof(type_now, reserved) + sizeof(((type_now *)0)->reserved), sizeof(type_now))

static void test_config_layout(void **state) {
    (void)state;
    static const field fs[] = {
        SAME(tp_config, cfg_1_1, workers),
        SAME(tp_config, cfg_1_1, max_workers),
        SAME(tp_config, cfg_1_1, queue_capacity),
        SAME(tp_config, cfg_1_1, max_per_user),
        SAME(tp_config, cfg_1_1, run_timeout_ns),
        SAME(tp_config, cfg_1_1, submit_timeout_ns),
        SAME(tp_config, cfg_1_1, drain_timeout_ns),
        SAME(tp_config, cfg_1_1, idle_timeout_ns),
        SAME(tp_config, cfg_1_1, max_retries),
        SAME(tp_config, cfg_1_1, retry_delay_ns),
        SAME(tp_config, cfg_1_1, name),
        SAME(tp_config, cfg_1_1, log),
        SAME(tp_config, cfg_1_1, log_arg),
        SAME(tp_config, cfg_1_1, on_worker_start),
        SAME(tp_config, cfg_1_1, on_worker_stop),
        SAME(tp_config, cfg_1_1, hook_arg),
    };
    fields_kept(fs, sizeof fs / sizeof fs[0]);
    assert_int_equal(sizeof(tp_config), sizeof(cfg_1_1));
    /* 1.2: sched, prio_starve_limit, low_prio_max_running, reserved32,
     * retry_delay_max_ns took the first three reserved words. */
    IN_TAIL(tp_config, cfg_1_1, sched);
    IN_TAIL(tp_config, cfg_1_1, prio_starve_limit);
    IN_TAIL(tp_config, cfg_1_1, low_prio_max_running);
    IN_TAIL(tp_config, cfg_1_1, reserved32);
    IN_TAIL(tp_config, cfg_1_1, retry_delay_max_ns);
    assert_int_equal(offsetof(tp_config, sched), offsetof(cfg_1_1, reserved));
    assert_int_equal(offsetof(tp_config, retry_delay_max_ns), WORD(cfg_1_1, 2));
    assert_int_equal(offsetof(tp_config, reserved), WORD(cfg_1_1, 3));
    TAIL_LAST(tp_config);
}

static void test_task_opts_layout(void **state) {
    (void)state;
    static const field fs[] = {
        SAME(tp_task_opts, opts_1_1, user),        SAME(tp_task_opts, opts_1_1, run_timeout_ns),
        SAME(tp_task_opts, opts_1_1, deadline_ns), SAME(tp_task_opts, opts_1_1, on_done),
        SAME(tp_task_opts, opts_1_1, log_id),      SAME(tp_task_opts, opts_1_1, priority),
    };
    fields_kept(fs, sizeof fs / sizeof fs[0]);
    assert_int_equal(sizeof(tp_task_opts), sizeof(opts_1_1));
    /* 1.2: cq took reserved[0], a whole word even where pointers are 32 bits. */
    IN_TAIL(tp_task_opts, opts_1_1, cq);
    IN_TAIL(tp_task_opts, opts_1_1, cq_word_);
    assert_int_equal(offsetof(tp_task_opts, cq), WORD(opts_1_1, 0));
    assert_int_equal(offsetof(tp_task_opts, reserved), WORD(opts_1_1, 1));
    TAIL_LAST(tp_task_opts);
}

static void test_stats_layout(void **state) {
    (void)state;
    static const field fs[] = {
        SAME(tp_stats, stats_1_1, submitted),
        SAME(tp_stats, stats_1_1, accepted),
        SAME(tp_stats, stats_1_1, rejected),
        SAME(tp_stats, stats_1_1, rejected_full),
        SAME(tp_stats, stats_1_1, rejected_user),
        SAME(tp_stats, stats_1_1, rejected_closed),
        SAME(tp_stats, stats_1_1, rejected_timeout),
        SAME(tp_stats, stats_1_1, started),
        SAME(tp_stats, stats_1_1, retried),
        SAME(tp_stats, stats_1_1, completed),
        SAME(tp_stats, stats_1_1, succeeded),
        SAME(tp_stats, stats_1_1, failed),
        SAME(tp_stats, stats_1_1, cancelled),
        SAME(tp_stats, stats_1_1, expired),
        SAME(tp_stats, stats_1_1, active),
        SAME(tp_stats, stats_1_1, queued),
        SAME(tp_stats, stats_1_1, delayed),
        SAME(tp_stats, stats_1_1, workers),
        SAME(tp_stats, stats_1_1, idle),
        SAME(tp_stats, stats_1_1, users),
    };
    fields_kept(fs, sizeof fs / sizeof fs[0]);
    assert_int_equal(sizeof(tp_stats), sizeof(stats_1_1));
    /* 1.2: oldest_wait_ns took reserved[0]. */
    IN_TAIL(tp_stats, stats_1_1, oldest_wait_ns);
    assert_int_equal(offsetof(tp_stats, oldest_wait_ns), WORD(stats_1_1, 0));
    assert_int_equal(offsetof(tp_stats, reserved), WORD(stats_1_1, 1));
    TAIL_LAST(tp_stats);
}

static void test_task_and_hist_layout(void **state) {
    (void)state;
    static const field fs[] = {
        SAME(tp_task, task_1_1, fn),       SAME(tp_task, task_1_1, arg),      SAME(tp_task, task_1_1, opts),
        SAME(tp_task, task_1_1, reserved), SAME(tp_hist, hist_1_1, count),    SAME(tp_hist, hist_1_1, sum_ns),
        SAME(tp_hist, hist_1_1, buckets),  SAME(tp_hist, hist_1_1, reserved),
    };
    fields_kept(fs, sizeof fs / sizeof fs[0]);
    assert_int_equal(sizeof(tp_task), sizeof(task_1_1));
    assert_int_equal(sizeof(tp_hist), sizeof(hist_1_1));
    TAIL_LAST(tp_task);
    TAIL_LAST(tp_hist);
}

/* Values a 1.1 binary has compiled in. */
static void test_constants_kept(void **state) {
    (void)state;
    assert_int_equal(TP_HIST_BUCKETS, 282);
    assert_int_equal(TP_HIST_QUEUE_WAIT, 0);
    assert_int_equal(TP_HIST_RUN, 1);
    assert_int_equal(TP_FORMAT_JSON, 0);
    assert_int_equal(TP_FORMAT_PROMETHEUS, 1);
    assert_int_equal(TP_GROUP_CANCEL_ON_ERROR, 1);
    assert_int_equal(TP_EINVAL, -1);
    assert_int_equal(TP_ENOMEM, -2);
    assert_int_equal(TP_EFULL, -3);
    assert_int_equal(TP_EUSERLIMIT, -4);
    assert_int_equal(TP_ECLOSED, -5);
    assert_int_equal(TP_ETIMEDOUT, -6);
    assert_int_equal(TP_ECANCELED, -7);
    assert_int_equal(TP_ENOTFOUND, -8);
    assert_int_equal(TP_EDEADLK, -9);
    assert_int_equal(TP_ENODEFAULT, -10);
    assert_true(TP_FOREVER == UINT64_MAX);
    assert_true(TP_UNLIMITED == UINT_MAX);
    /* The lanes' histograms take `which` values no 1.1 histogram used. */
    for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
        assert_true(TP_HIST_QUEUE_WAIT_PRIO(prio) != TP_HIST_QUEUE_WAIT);
        assert_true(TP_HIST_QUEUE_WAIT_PRIO(prio) != TP_HIST_RUN);
    }
}

/* The same, as numbers, on the one ABI where they are known by heart. */
static void test_x86_64_offsets(void **state) {
    (void)state;
#if defined(__x86_64__) && defined(__LP64__)
    assert_int_equal(sizeof(tp_config), 176);
    assert_int_equal(offsetof(tp_config, max_retries), 48);
    assert_int_equal(offsetof(tp_config, retry_delay_ns), 56);
    assert_int_equal(offsetof(tp_config, hook_arg), 104);
    assert_int_equal(offsetof(tp_config, sched), 112); /* was reserved[0] */
    assert_int_equal(offsetof(tp_config, prio_starve_limit), 116);
    assert_int_equal(offsetof(tp_config, low_prio_max_running), 120);
    assert_int_equal(offsetof(tp_config, reserved32), 124);
    assert_int_equal(offsetof(tp_config, retry_delay_max_ns), 128); /* was reserved[2] */
    assert_int_equal(offsetof(tp_config, reserved), 136);

    assert_int_equal(sizeof(tp_task_opts), 80);
    assert_int_equal(offsetof(tp_task_opts, log_id), 32);
    assert_int_equal(offsetof(tp_task_opts, priority), 40);
    assert_int_equal(offsetof(tp_task_opts, cq), 48); /* was reserved[0] */
    assert_int_equal(offsetof(tp_task_opts, reserved), 56);

    assert_int_equal(sizeof(tp_stats), 264);
    assert_int_equal(offsetof(tp_stats, active), 112);
    assert_int_equal(offsetof(tp_stats, users), 132);
    assert_int_equal(offsetof(tp_stats, oldest_wait_ns), 136); /* was reserved[0] */
    assert_int_equal(offsetof(tp_stats, reserved), 144);

    assert_int_equal(sizeof(tp_task), 40);
    assert_int_equal(offsetof(tp_task, reserved), 24);
    assert_int_equal(sizeof(tp_hist), 2304);
    assert_int_equal(offsetof(tp_hist, buckets), 16);
    assert_int_equal(offsetof(tp_hist, reserved), 2272);

    assert_int_equal(sizeof(tp_lane_stats), 64); /* new in 1.2: pinned from now on */
    assert_int_equal(offsetof(tp_lane_stats, queued), 8);
    assert_int_equal(offsetof(tp_lane_stats, running), 12);
    assert_int_equal(offsetof(tp_lane_stats, reserved), 16);
#else
    skip(); /* the generic checks above hold on every ABI */
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_layout),  cmocka_unit_test(test_task_opts_layout),
        cmocka_unit_test(test_stats_layout),   cmocka_unit_test(test_task_and_hist_layout),
        cmocka_unit_test(test_constants_kept), cmocka_unit_test(test_x86_64_offsets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
