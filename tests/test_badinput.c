/*
 * test_badinput.c -- every public function called with NULL and out-of-range
 * arguments, from one table: each call must return the documented code (or
 * do the documented nothing), never crash, write no output argument, and
 * change no counter of a live pool.
 *
 * Tables:
 *   CALLS    one row per call: a name, the expected value, the expression.
 *            Functions returning a value other than an error code are written
 *            as a comparison with their documented result (expected 1). The
 *            table runs against a settled live pool P (one idle worker), once
 *            with no default pool registered and once with P registered as the
 *            default (rows marked D then see P through tp_default()).
 *   CONFIGS  one row per out-of-range tp_config field, given to tp_create()
 *            and tp_default_create(): TP_EINVAL, *out untouched, nothing
 *            registered, no thread started.
 *   Inside a task, an on_done and a worker hook, tp_shutdown / tp_wait /
 *   tp_destroy of the pool itself return TP_EDEADLK and change nothing.
 *
 * The tp_ctx_* functions document only calls by the running task with its own
 * context; for a NULL context the rows pin what the implementation does
 * (TP_EINVAL, or the "none" value of the getter) so that it never crashes.
 */
#define _GNU_SOURCE

#include "tp_test.h"

/* ------------------------------------------------------------ fixtures */

static tp_pool *P;                      /* the live pool */
static tp_stats S;                      /* a valid stats snapshot for tp_stats_format */
static char LONG_USER[TP_USER_MAX + 2]; /* TP_USER_MAX + 1 bytes */
static char HUGE[4097];                 /* 4096 bytes */
static char LONG_ID[TP_LOG_ID_MAX + 2];
static atomic_int sideeffects; /* bumped by anything a bad call must not run */

#define SENTINEL_ID 0x5eed5eed5eedull

static int fn_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    atomic_fetch_add(&sideeffects, 1);
    return 0;
}

static void fn_done(void *arg, int status) {
    (void)arg;
    (void)status;
    atomic_fetch_add(&sideeffects, 1);
}

static tp_task_opts opts_with(int priority, const char *user, const char *log_id) {
    tp_task_opts o = {0};
    o.priority = priority;
    o.user = user;
    o.log_id = log_id;
    o.on_done = fn_done;
    return o;
}

/* Options with one reserved word (taskpool.h, "How the structs grow") set. */
static tp_task_opts opts_reserved(size_t word) {
    tp_task_opts o = opts_with(0, NULL, NULL);
    o.reserved[word] = 1;
    return o;
}

/* tp_submit / tp_submit_wait / tp_default_submit that must leave *id_out
 * alone: returns the code, or 1000 if the id was written. */
static int sub(tp_pool *p, tp_fn fn, tp_task_opts o, int use_opts) {
    uint64_t id = SENTINEL_ID;
    int rc = tp_submit(p, fn, &id, use_opts ? &o : NULL, &id);
    return id == SENTINEL_ID ? rc : 1000;
}

static int subw(tp_pool *p, tp_fn fn, tp_task_opts o, uint64_t budget) {
    uint64_t id = SENTINEL_ID;
    int rc = tp_submit_wait(p, fn, &id, &o, budget, &id);
    return id == SENTINEL_ID ? rc : 1000;
}

static int dsub(tp_fn fn, tp_task_opts o) {
    uint64_t id = SENTINEL_ID;
    int rc = tp_default_submit(fn, &id, &o, &id);
    return id == SENTINEL_ID ? rc : 1000;
}

/* tp_stats_format with a buffer that must stay untouched: code or 1000. */
static int fmt_bad(const tp_stats *s, int format, int with_buf, size_t len) {
    char buf[64];
    memset(buf, 'x', sizeof buf);
    int rc = tp_stats_format(s, format, with_buf ? buf : NULL, len);
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != 'x') return 1000;
    return rc;
}

/* len 0 writes nothing and reports the length; len 1 writes only the NUL. */
static int fmt_len0(int format) {
    char buf[8];
    memset(buf, 'x', sizeof buf);
    int need = tp_stats_format(&S, format, buf, 0);
    int need_null = tp_stats_format(&S, format, NULL, 0);
    return need > 0 && need == need_null && buf[0] == 'x';
}

static int fmt_len1(int format) {
    char buf[8];
    memset(buf, 'x', sizeof buf);
    int need = tp_stats_format(&S, format, buf, 1);
    return need > 0 && buf[0] == '\0' && buf[1] == 'x';
}

static int stats_get_null_pool(void) {
    tp_stats a, b;
    memset(&a, 0xab, sizeof a);
    memset(&b, 0xab, sizeof b);
    tp_stats_get(NULL, &a);
    return memcmp(&a, &b, sizeof a) == 0;
}

static int strerror_unknown(int code) {
    const char *m = tp_strerror(code), *n = tp_err_name(code);
    return m && n && strcmp(m, "unknown error") == 0 && strcmp(n, "TP_UNKNOWN") == 0;
}

static int ctx_log_id_null(void) {
    const char *s = tp_ctx_log_id(NULL);
    return s != NULL; /* "never NULL" */
}

static int log_id_roundtrip(const char *set, size_t want_len) {
    tp_log_id_set("before");
    tp_log_id_set(set);
    const char *got = tp_log_id_get();
    size_t len = got ? strlen(got) : 0;
    int ok = want_len == 0 ? got == NULL : (got && len == want_len && strncmp(got, set, len) == 0);
    tp_log_id_set(NULL);
    return ok && tp_log_id_get() == NULL;
}

static int create_null_out(const tp_config *cfg) { return tp_create(NULL, cfg); }

/* ------------------------------------------------------------ the table */

static const tp_task_opts NO_OPTS;

/* X(name, default_registered, expected, expression). default_registered: 0
 * when the row needs no default pool, 1 when it needs P as the default, -1
 * for either. */
#define CALLS(X)                                                                                             \
    /* lifecycle */                                                                                          \
    X(create_out_null, -1, TP_EINVAL, create_null_out(NULL))                                                 \
    X(create_out_null_cfg, -1, TP_EINVAL, create_null_out(&(tp_config){.workers = 1}))                       \
    X(close_null, -1, TP_EINVAL, tp_close(NULL))                                                             \
    X(shutdown_null, -1, TP_EINVAL, tp_shutdown(NULL, 0))                                                    \
    X(shutdown_null_forever, -1, TP_EINVAL, tp_shutdown(NULL, TP_FOREVER))                                   \
    X(shutdown_null_1ns, -1, TP_EINVAL, tp_shutdown(NULL, 1))                                                \
    X(wait_null, -1, TP_EINVAL, tp_wait(NULL, 0))                                                            \
    X(wait_null_forever, -1, TP_EINVAL, tp_wait(NULL, TP_FOREVER))                                           \
    X(wait_null_1ns, -1, TP_EINVAL, tp_wait(NULL, 1))                                                        \
    X(destroy_null, -1, TP_EINVAL, tp_destroy(NULL))                                                         \
    /* tp_submit */                                                                                          \
    X(submit_null_pool, -1, TP_EINVAL, sub(NULL, fn_task, NO_OPTS, 0))                                       \
    X(submit_null_pool_opts, -1, TP_EINVAL, sub(NULL, fn_task, opts_with(0, "u", "l"), 1))                   \
    X(submit_null_fn, -1, TP_EINVAL, sub(P, NULL, NO_OPTS, 0))                                               \
    X(submit_null_fn_opts, -1, TP_EINVAL, sub(P, NULL, opts_with(0, "u", "l"), 1))                           \
    X(submit_null_both, -1, TP_EINVAL, sub(NULL, NULL, NO_OPTS, 0))                                          \
    X(submit_priority_3, -1, TP_EINVAL, sub(P, fn_task, opts_with(3, NULL, NULL), 1))                        \
    X(submit_priority_m3, -1, TP_EINVAL, sub(P, fn_task, opts_with(-3, NULL, NULL), 1))                      \
    X(submit_priority_max, -1, TP_EINVAL, sub(P, fn_task, opts_with(INT_MAX, NULL, NULL), 1))                \
    X(submit_priority_min, -1, TP_EINVAL, sub(P, fn_task, opts_with(INT_MIN, NULL, NULL), 1))                \
    X(submit_user_128, -1, TP_EINVAL, sub(P, fn_task, opts_with(0, LONG_USER, NULL), 1))                     \
    X(submit_user_4096, -1, TP_EINVAL, sub(P, fn_task, opts_with(0, HUGE, NULL), 1))                         \
    X(submit_log_id_128, -1, TP_EINVAL, sub(P, fn_task, opts_with(0, NULL, LONG_ID), 1))                     \
    X(submit_log_id_4096, -1, TP_EINVAL, sub(P, fn_task, opts_with(0, "u", HUGE), 1))                        \
    X(submit_user_and_prio, -1, TP_EINVAL, sub(P, fn_task, opts_with(2, LONG_USER, LONG_ID), 1))             \
    /* tp_submit_wait */                                                                                     \
    X(submitw_null_pool, -1, TP_EINVAL, subw(NULL, fn_task, NO_OPTS, 0))                                     \
    X(submitw_null_fn, -1, TP_EINVAL, subw(P, NULL, NO_OPTS, 0))                                             \
    X(submitw_null_fn_forever, -1, TP_EINVAL, subw(P, NULL, NO_OPTS, TP_FOREVER))                            \
    X(submitw_priority, -1, TP_EINVAL, subw(P, fn_task, opts_with(7, NULL, NULL), TP_FOREVER))               \
    X(submit_reserved_0, -1, TP_EINVAL, sub(P, fn_task, opts_reserved(0), 1))                                \
    X(submit_reserved_last, -1, TP_EINVAL, sub(P, fn_task, opts_reserved(2), 1))                             \
    X(submitw_reserved, -1, TP_EINVAL, subw(P, fn_task, opts_reserved(1), TP_FOREVER))                       \
    X(submitw_user_128, -1, TP_EINVAL, subw(P, fn_task, opts_with(0, LONG_USER, NULL), 1))                   \
    X(submitw_log_id_128, -1, TP_EINVAL, subw(P, fn_task, opts_with(0, NULL, LONG_ID), 0))                   \
    /* tp_cancel */                                                                                          \
    X(cancel_null, -1, TP_EINVAL, tp_cancel(NULL, 1))                                                        \
    X(cancel_null_0, -1, TP_EINVAL, tp_cancel(NULL, 0))                                                      \
    X(cancel_id_0, -1, TP_EINVAL, tp_cancel(P, 0))                                                           \
    X(cancel_unknown, -1, TP_ENOTFOUND, tp_cancel(P, 123456789))                                             \
    X(cancel_id_max, -1, TP_ENOTFOUND, tp_cancel(P, UINT64_MAX))                                             \
    /* the context, NULL (see the header comment) */                                                         \
    X(ctx_err_null, -1, TP_EINVAL, tp_ctx_err(NULL))                                                         \
    X(ctx_sleep_null, -1, TP_EINVAL, tp_ctx_sleep(NULL, 1))                                                  \
    X(ctx_sleep_null_forever, -1, TP_EINVAL, tp_ctx_sleep(NULL, TP_FOREVER))                                 \
    X(ctx_fd_null, -1, TP_EINVAL, tp_ctx_fd(NULL))                                                           \
    X(ctx_deadline_null, -1, 1, tp_ctx_deadline(NULL) == TP_FOREVER)                                         \
    X(ctx_id_null, -1, 1, tp_ctx_id(NULL) == 0)                                                              \
    X(ctx_user_null, -1, 1, tp_ctx_user(NULL) == NULL)                                                       \
    X(ctx_log_id_null, -1, 1, ctx_log_id_null())                                                             \
    X(ctx_attempt_null, -1, 1, tp_ctx_attempt(NULL) == 0)                                                    \
    /* statistics */                                                                                         \
    X(stats_get_null_pool, -1, 1, stats_get_null_pool())                                                     \
    X(stats_get_null_out, -1, 1, (tp_stats_get(P, NULL), 1))                                                 \
    X(stats_get_null_both, -1, 1, (tp_stats_get(NULL, NULL), 1))                                             \
    X(user_active_null_pool, -1, 0, (int)tp_user_active(NULL, "u"))                                          \
    X(user_active_null_user, -1, 0, (int)tp_user_active(P, NULL))                                            \
    X(user_active_empty, -1, 0, (int)tp_user_active(P, ""))                                                  \
    X(user_active_128, -1, 0, (int)tp_user_active(P, LONG_USER))                                             \
    X(user_active_4096, -1, 0, (int)tp_user_active(P, HUGE))                                                 \
    X(format_null_stats, -1, TP_EINVAL, fmt_bad(NULL, TP_FORMAT_JSON, 1, 64))                                \
    X(format_null_stats_prom, -1, TP_EINVAL, fmt_bad(NULL, TP_FORMAT_PROMETHEUS, 1, 64))                     \
    X(format_null_buf, -1, TP_EINVAL, fmt_bad(&S, TP_FORMAT_JSON, 0, 64))                                    \
    X(format_null_buf_1, -1, TP_EINVAL, fmt_bad(&S, TP_FORMAT_PROMETHEUS, 0, 1))                             \
    X(format_minus_1, -1, TP_EINVAL, fmt_bad(&S, -1, 1, 64))                                                 \
    X(format_2, -1, TP_EINVAL, fmt_bad(&S, 2, 1, 64))                                                        \
    X(format_int_max, -1, TP_EINVAL, fmt_bad(&S, INT_MAX, 1, 64))                                            \
    X(format_int_min, -1, TP_EINVAL, fmt_bad(&S, INT_MIN, 1, 64))                                            \
    X(format_bad_null_buf_0, -1, TP_EINVAL, fmt_bad(&S, 5, 0, 0))                                            \
    X(format_len0_json, -1, 1, fmt_len0(TP_FORMAT_JSON))                                                     \
    X(format_len0_prom, -1, 1, fmt_len0(TP_FORMAT_PROMETHEUS))                                               \
    X(format_len1_json, -1, 1, fmt_len1(TP_FORMAT_JSON))                                                     \
    X(format_len1_prom, -1, 1, fmt_len1(TP_FORMAT_PROMETHEUS))                                               \
    /* errors */                                                                                             \
    X(strerror_int_min, -1, 1, strerror_unknown(INT_MIN))                                                    \
    X(strerror_int_max, -1, 1, strerror_unknown(INT_MAX))                                                    \
    X(strerror_1, -1, 1, strerror_unknown(1))                                                                \
    X(strerror_below_last, -1, 1, strerror_unknown(TP_EBUSY - 1))                                            \
    X(strerror_ok, -1, 1, strcmp(tp_err_name(TP_OK), "TP_OK") == 0)                                          \
    X(version, -1, 1, tp_version() != NULL && tp_version()[0] >= '0')                                        \
    /* log ids: NULL and "" clear, an over-long one is truncated */                                          \
    X(log_id_set_null, -1, 1, log_id_roundtrip(NULL, 0))                                                     \
    X(log_id_set_empty, -1, 1, log_id_roundtrip("", 0))                                                      \
    X(log_id_set_128, -1, 1, log_id_roundtrip(LONG_ID, TP_LOG_ID_MAX))                                       \
    X(log_id_set_4096, -1, 1, log_id_roundtrip(HUGE, TP_LOG_ID_MAX))                                         \
    /* the default pool: none registered */                                                                  \
    X(default_none, 0, 1, tp_default() == NULL)                                                              \
    X(default_submit_none, 0, TP_ENODEFAULT, dsub(fn_task, NO_OPTS))                                         \
    X(default_submit_none_null_fn, 0, TP_ENODEFAULT, dsub(NULL, NO_OPTS))                                    \
    X(default_shutdown_none, 0, TP_ENODEFAULT, tp_default_shutdown(0))                                       \
    X(default_wait_none, 0, TP_ENODEFAULT, tp_default_wait(1))                                               \
    X(default_create_bad_cfg, 0, TP_EINVAL, tp_default_create(&(tp_config){.max_retries = 101}))             \
    X(default_still_none, 0, 1, tp_default() == NULL)                                                        \
    /* the default pool: P registered */                                                                     \
    X(default_is_p, 1, 1, tp_default() == P)                                                                 \
    X(default_submit_null_fn, 1, TP_EINVAL, dsub(NULL, NO_OPTS))                                             \
    X(default_submit_priority, 1, TP_EINVAL, dsub(fn_task, opts_with(3, NULL, NULL)))                        \
    X(default_submit_reserved, 1, TP_EINVAL, dsub(fn_task, opts_reserved(2)))                                \
    X(default_submit_user_128, 1, TP_EINVAL, dsub(fn_task, opts_with(0, LONG_USER, NULL)))                   \
    X(default_submit_log_id_128, 1, TP_EINVAL, dsub(fn_task, opts_with(0, NULL, LONG_ID)))                   \
    X(default_create_registered, 1, TP_EINVAL, tp_default_create(&(tp_config){.workers = 1}))                \
    X(default_create_registered_bad, 1, TP_EINVAL, tp_default_create(&(tp_config){.workers = UINT_MAX}))     \
    X(default_still_p, 1, 1, tp_default() == P)

#define X_FN(name, dflt, want, expr)                                                                         \
    static int row_##name(void) { return (int)(expr); }
CALLS(X_FN)
#undef X_FN

typedef struct row {
    const char *name, *expr;
    int dflt, want;
    int (*call)(void);
} row;

static const row rows[] = {
#define X_ROW(name, dflt, want, expr) {#name, #expr, dflt, want, row_##name},
    CALLS(X_ROW)
#undef X_ROW
};

/* ------------------------------------------------------------ helpers */

static void stats_diff_fail(const char *what, const tp_stats *a, const tp_stats *b) {
    char ja[1024], jb[1024];
    tp_stats_format(a, TP_FORMAT_JSON, ja, sizeof ja);
    tp_stats_format(b, TP_FORMAT_JSON, jb, sizeof jb);
    fail_msg("%s changed the counters:\nbefore %s\nafter  %s", what, ja, jb);
}

static void fill_strings(void) {
    memset(LONG_USER, 'u', TP_USER_MAX + 1);
    LONG_USER[TP_USER_MAX + 1] = '\0';
    memset(LONG_ID, 'l', TP_LOG_ID_MAX + 1);
    LONG_ID[TP_LOG_ID_MAX + 1] = '\0';
    memset(HUGE, 'h', sizeof HUGE - 1);
    HUGE[sizeof HUGE - 1] = '\0';
}

static tp_pool *settled_pool(tpt_fixture *f) {
    tp_pool *p = tpt_quiet_pool(f, 1, 4, 0);
    tp_stats s;
    TPT_EVENTUALLY((s = tpt_stats(p)).workers == 1 && s.idle == 1);
    return p;
}

/* Run every row that fits the registration state `dflt` against P. */
static unsigned run_rows(int dflt) {
    unsigned ran = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *r = &rows[i];
        if (r->dflt != -1 && r->dflt != dflt) continue;
        int threads = tpt_count_dir("/proc/self/task");
        tp_stats before = tpt_stats(P);
        int got = r->call();
        tp_stats after = tpt_stats(P);
        if (got != r->want)
            fail_msg("%s: %s returned %d (%s), expected %d (%s)", r->name, r->expr, got, tp_err_name(got),
                     r->want, tp_err_name(r->want));
        if (memcmp(&before, &after, sizeof before) != 0) stats_diff_fail(r->name, &before, &after);
        if (tpt_count_dir("/proc/self/task") != threads)
            fail_msg("%s: %s left a thread behind", r->name, r->expr);
        ran++;
    }
    return ran;
}

/* ------------------------------------------------------------ tests */

static void test_bad_calls_table(void **state) {
    tpt_fixture *f = tpt_fx(state);
    fill_strings();
    assert_null(tp_default());
    P = settled_pool(f);
    tp_stats_get(P, &S);
    atomic_store(&sideeffects, 0);

    unsigned n = run_rows(0);
    assert_null(tp_default_swap(P));
    n += run_rows(1);
    assert_ptr_equal(tp_default_swap(NULL), P);
    assert_int_equal(atomic_load(&sideeffects), 0); /* no bad call ran a task or on_done */
    unsigned want = 0;                              /* rows for either state run twice */
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) want += rows[i].dflt == -1 ? 2 : 1;
    assert_int_equal(n, want);
    print_message("%u bad calls checked (%zu rows)\n", n, sizeof rows / sizeof rows[0]);

    /* The pool is untouched: it still works, and nothing was counted. */
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(P, tpt_nop_task, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    tp_stats s = tpt_finish(P);
    assert_int_equal(s.submitted, 1);
    assert_int_equal(s.succeeded, 1);
    P = NULL;
}

/* Out-of-range configuration fields. */
typedef struct cfg_row {
    const char *what;
    tp_config cfg;
} cfg_row;

static unsigned default_workers(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n > 0 ? n : 1;
    return 4u * (unsigned)n > TP_MAX_WORKERS ? TP_MAX_WORKERS : 4u * (unsigned)n;
}

static void test_bad_configs_table(void **state) {
    (void)state;
    fill_strings();
    const unsigned W = default_workers();
    char name32[TP_NAME_MAX + 2];
    memset(name32, 'n', TP_NAME_MAX + 1);
    name32[TP_NAME_MAX + 1] = '\0';
    const cfg_row cfgs[] = {
        {"workers TP_MAX_WORKERS + 1", {.workers = TP_MAX_WORKERS + 1}},
        {"workers UINT_MAX", {.workers = UINT_MAX}},
        {"max_workers TP_MAX_WORKERS + 1", {.workers = 1, .max_workers = TP_MAX_WORKERS + 1}},
        {"max_workers UINT_MAX", {.workers = 1, .max_workers = UINT_MAX}},
        {"max_workers < workers", {.workers = 2, .max_workers = 1}},
        {"max_workers < workers (both large)",
         {.workers = TP_MAX_WORKERS, .max_workers = TP_MAX_WORKERS - 1}},
        {"max_workers < default workers", {.max_workers = W - 1}},
        {"workers above max and max_workers",
         {.workers = TP_MAX_WORKERS + 1, .max_workers = TP_MAX_WORKERS + 2}},
        {"queue_capacity TP_MAX_QUEUE_CAPACITY + 1",
         {.workers = 1, .queue_capacity = TP_MAX_QUEUE_CAPACITY + 1}},
        {"queue_capacity UINT_MAX", {.workers = 1, .queue_capacity = UINT_MAX}},
        {"max_retries TP_MAX_RETRIES + 1", {.workers = 1, .max_retries = TP_MAX_RETRIES + 1}},
        {"max_retries UINT_MAX", {.workers = 1, .max_retries = UINT_MAX}},
        {"name TP_NAME_MAX + 1 bytes", {.workers = 1, .name = name32}},
        {"name 4096 bytes", {.workers = 1, .name = HUGE}},
        {"reserved[0] not zero", {.workers = 1, .reserved = {1}}},
        {"reserved[4] not zero", {.workers = 1, .reserved[4] = UINT64_MAX}},
        {"reserved32 not zero", {.workers = 1, .reserved32 = 1}},
        {"sched 2", {.workers = 1, .sched = 2}},
        {"sched UINT_MAX", {.workers = 1, .sched = UINT_MAX}},
        {"low_prio_max_running > max_workers", {.workers = 2, .max_workers = 3, .low_prio_max_running = 4}},
        {"low_prio_max_running > default workers", {.low_prio_max_running = W + 1}},
        {"retry_delay_max_ns < retry_delay_ns",
         {.workers = 1, .retry_delay_ns = 10, .retry_delay_max_ns = 9}},
        {"retry_delay_max_ns < the default delay", {.workers = 1, .retry_delay_max_ns = 999999999}},
    };
    assert_null(tp_default());
    int threads = tpt_count_dir("/proc/self/task"), fds = tpt_count_dir("/proc/self/fd");
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        tp_pool *sentinel = (tp_pool *)(uintptr_t)0x1234, *p = sentinel;
        int rc = tp_create(&p, &cfgs[i].cfg);
        if (rc != TP_EINVAL) fail_msg("tp_create, %s: %s, expected TP_EINVAL", cfgs[i].what, tp_err_name(rc));
        assert_ptr_equal(p, sentinel);
        rc = tp_default_create(&cfgs[i].cfg);
        if (rc != TP_EINVAL)
            fail_msg("tp_default_create, %s: %s, expected TP_EINVAL", cfgs[i].what, tp_err_name(rc));
        assert_null(tp_default());
        assert_int_equal(tpt_count_dir("/proc/self/task"), threads);
        assert_int_equal(tpt_count_dir("/proc/self/fd"), fds);
    }
}

/* ------------------------------------------------------------ on the pool's own threads */

typedef struct own {
    tp_pool *p;
    atomic_int shutdown_rc, wait_rc, destroy_rc, wait_forever_rc, shutdown_forever_rc;
    atomic_int done_shutdown_rc, done_wait_rc, done_destroy_rc;
    atomic_int hook_rc[3];
    atomic_int hook_calls;
    atomic_int done_calls;
} own;

static own O;

static int own_task(tp_ctx *c, void *arg) {
    (void)c;
    own *o = arg;
    atomic_store(&o->shutdown_rc, tp_shutdown(o->p, 1));
    atomic_store(&o->shutdown_forever_rc, tp_shutdown(o->p, TP_FOREVER));
    atomic_store(&o->wait_rc, tp_wait(o->p, 1));
    atomic_store(&o->wait_forever_rc, tp_wait(o->p, 0));
    atomic_store(&o->destroy_rc, tp_destroy(o->p));
    return 0;
}

static void own_done(void *arg, int status) {
    (void)status;
    own *o = arg;
    atomic_store(&o->done_shutdown_rc, tp_shutdown(o->p, 1));
    atomic_store(&o->done_wait_rc, tp_wait(o->p, 1));
    atomic_store(&o->done_destroy_rc, tp_destroy(o->p));
    atomic_fetch_add(&o->done_calls, 1);
}

static _Atomic(tp_pool *) hook_pool;

static void own_hook(void *arg) {
    own *o = arg;
    tp_pool *p = atomic_load(&hook_pool); /* NULL for the first worker: not yet known */
    if (p && atomic_fetch_add(&o->hook_calls, 1) == 0) {
        atomic_store(&o->hook_rc[0], tp_shutdown(p, 1));
        atomic_store(&o->hook_rc[1], tp_wait(p, 1));
        atomic_store(&o->hook_rc[2], tp_destroy(p));
    }
}

static void test_own_thread_calls_deadlk(void **state) {
    tpt_fixture *f = tpt_fx(state);
    memset(&O, 0, sizeof O);
    atomic_store(&hook_pool, NULL);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TP_FOREVER;
    cfg.on_worker_start = own_hook;
    cfg.hook_arg = &O;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    O.p = p;
    atomic_store(&hook_pool, p);
    TPT_EVENTUALLY(tpt_stats(p).idle == 1);
    tp_stats before = tpt_stats(p);

    /* From a task and its on_done (on a worker). */
    tp_task_opts o = {0};
    o.on_done = own_done;
    assert_int_equal(tp_submit(p, own_task, &O, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&O.done_calls) == 1);
    TPT_EVENTUALLY(tpt_stats(p).completed == 1 && tpt_stats(p).idle == 1);
    assert_int_equal(atomic_load(&O.shutdown_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.shutdown_forever_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.wait_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.wait_forever_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.destroy_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.done_shutdown_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.done_wait_rc), TP_EDEADLK);
    assert_int_equal(atomic_load(&O.done_destroy_rc), TP_EDEADLK);
    tp_stats after = tpt_stats(p);
    /* only the task's own counters moved: nothing was closed or cancelled */
    tpt_assert_counts(after, TPT_EQ(submitted, before.submitted + 1), TPT_EQ(succeeded, before.succeeded + 1),
                      TPT_EQ(cancelled, 0), TPT_EQ(rejected, 0));

    /* From a worker start hook: make the pool grow by one worker. */
    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 2, NULL);
    TPT_EVENTUALLY(atomic_load(&O.hook_calls) >= 1);
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&O.hook_rc[i]), TP_EDEADLK);
    /* still open and working */
    tpt_done *d = tpt_fx_new(f, tpt_done);
    tp_task_opts od = {0};
    od.on_done = tpt_done_fn;
    assert_int_equal(tp_submit(p, tpt_nop_task, d, &od, NULL), TP_OK);
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&d->calls) == 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 4);
    assert_int_equal(s.failed, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_bad_calls_table),
        TPT_TEST(test_bad_configs_table),
        TPT_TEST(test_own_thread_calls_deadlk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
