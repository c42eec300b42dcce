/*
 * test_stats.c -- statistics, formatting, error strings, version (header
 * sections 1, 2, 8).
 *
 * Covers: tp_stats_format JSON (every field a key with its value) and
 * Prometheus (# HELP / # TYPE, counters taskpool_<f>_total, gauges
 * taskpool_<f>), snprintf semantics (needed length, truncation, NUL, len 0),
 * TP_EINVAL cases; live stats (workers, idle, active, queued, users); exact
 * counters and the at-rest invariants after a mixed workload; tp_strerror and
 * tp_err_name for every code and unknown ones; tp_version.
 */
#define _GNU_SOURCE
#include <inttypes.h>

#include "tp_test.h"

/* ------------------------------------------------------------ field table */

typedef struct field {
    const char *name;
    int gauge; /* 0: counter (uint64_t), 1: gauge (uint32_t) */
    size_t off;
} field;

#define C(f)                                                                                                 \
    { #f, 0, offsetof(tp_stats, f) }
#define G(f)                                                                                                 \
    { #f, 1, offsetof(tp_stats, f) }
static const field fields[] = {
    C(submitted),       C(accepted),         C(rejected),  C(rejected_full), C(rejected_user),
    C(rejected_closed), C(rejected_timeout), C(started),   C(retried),       C(completed),
    C(succeeded),       C(failed),           C(cancelled), C(expired),       G(active),
    G(queued),          G(delayed),          G(workers),   G(idle),          G(users),
};
#undef C
#undef G
#define NFIELDS (sizeof fields / sizeof fields[0])

static uint64_t field_get(const tp_stats *s, const field *f) {
    const char *b = (const char *)s + f->off;
    if (f->gauge) {
        uint32_t v;
        memcpy(&v, b, sizeof v);
        return v;
    }
    uint64_t v;
    memcpy(&v, b, sizeof v);
    return v;
}

static void field_set(tp_stats *s, const field *f, uint64_t v) {
    char *b = (char *)s + f->off;
    if (f->gauge) {
        uint32_t w = (uint32_t)v;
        memcpy(b, &w, sizeof w);
    } else {
        memcpy(b, &v, sizeof v);
    }
}

/* A distinct value per field: counters 1000000000001 + 7919*i (wider than 32
 * bits), gauges 40000 + 13*i; submitted is UINT64_MAX to check full-width
 * formatting. */
static tp_stats distinct_stats(void) {
    tp_stats s;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; i < NFIELDS; i++) {
        if (fields[i].gauge)
            field_set(&s, &fields[i], 40000u + 13u * i);
        else
            field_set(&s, &fields[i], 1000000000001ull + 7919ull * i);
    }
    s.submitted = UINT64_MAX;
    return s;
}

/* Find the JSON key "name" and parse the number after the colon. */
static int json_value(const char *js, const char *name, uint64_t *out) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\"", name);
    const char *k = strstr(js, key);
    if (!k) return 0;
    /* A second occurrence would be a duplicate key. */
    if (strstr(k + 1, key)) return 0;
    const char *q = k + strlen(key);
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
    if (*q != ':') return 0;
    q++;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
    if (*q < '0' || *q > '9') return 0;
    char *end;
    *out = strtoull(q, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    return *end == ',' || *end == '}';
}

/* Find a line that starts exactly with `prefix`; returns it or NULL. */
static const char *find_line(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    const char *l = text;
    while (l && *l) {
        if (strncmp(l, prefix, n) == 0) return l;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return NULL;
}

static char *format_alloc(const tp_stats *s, int fmt) {
    int n = tp_stats_format(s, fmt, NULL, 0);
    assert_true(n > 0);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    memset(buf, 'x', (size_t)n + 1);
    assert_int_equal(tp_stats_format(s, fmt, buf, (size_t)n + 1), n);
    assert_int_equal(strlen(buf), (size_t)n);
    return buf;
}

/* ------------------------------------------------------------ format */

static void test_format_json(void **state) {
    (void)state;
    tp_stats s = distinct_stats();
    char *js = format_alloc(&s, TP_FORMAT_JSON);
    /* One object. */
    const char *a = js;
    while (*a == ' ' || *a == '\n') a++;
    assert_int_equal(*a, '{');
    const char *z = js + strlen(js);
    while (z > js && (z[-1] == ' ' || z[-1] == '\n')) z--;
    assert_true(z > js);
    assert_int_equal(z[-1], '}');
    for (size_t i = 0; i < NFIELDS; i++) {
        uint64_t v = 0;
        if (!json_value(js, fields[i].name, &v))
            fail_msg("JSON lacks key \"%s\" (or it is duplicated / malformed): %s", fields[i].name, js);
        if (v != field_get(&s, &fields[i]))
            fail_msg("JSON %s = %" PRIu64 ", expected %" PRIu64, fields[i].name, v,
                     field_get(&s, &fields[i]));
    }
    free(js);

    /* All-zero stats format too. */
    tp_stats zero;
    memset(&zero, 0, sizeof zero);
    js = format_alloc(&zero, TP_FORMAT_JSON);
    for (size_t i = 0; i < NFIELDS; i++) {
        uint64_t v = 1;
        assert_true(json_value(js, fields[i].name, &v));
        assert_int_equal(v, 0);
    }
    free(js);
}

static void test_format_prometheus(void **state) {
    (void)state;
    tp_stats s = distinct_stats();
    char *pr = format_alloc(&s, TP_FORMAT_PROMETHEUS);
    assert_true(strlen(pr) > 0);
    assert_int_equal(pr[strlen(pr) - 1], '\n');
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        char metric[64], line[128];
        snprintf(metric, sizeof metric, "taskpool_%s%s", f->name, f->gauge ? "" : "_total");

        snprintf(line, sizeof line, "# HELP %s ", metric);
        if (!find_line(pr, line)) fail_msg("no \"%s\" line in:\n%s", line, pr);
        snprintf(line, sizeof line, "# TYPE %s %s\n", metric, f->gauge ? "gauge" : "counter");
        if (!find_line(pr, line)) fail_msg("no \"%s\" line in:\n%s", line, pr);

        /* The sample: "<metric> <value>" or "<metric>{...} <value>". */
        snprintf(line, sizeof line, "%s ", metric);
        const char *l = find_line(pr, line);
        if (!l) {
            snprintf(line, sizeof line, "%s{", metric);
            l = find_line(pr, line);
            if (l) l = strchr(l, '}');
            if (l) l++;
        } else {
            l += strlen(metric);
        }
        if (!l) fail_msg("no sample for %s in:\n%s", metric, pr);
        while (*l == ' ') l++;
        char *end;
        uint64_t v = strtoull(l, &end, 10);
        assert_true(end != l);
        if (v != field_get(&s, f))
            fail_msg("%s = %" PRIu64 ", expected %" PRIu64, metric, v, field_get(&s, f));
    }
    /* A counter never appears as a bare gauge name and vice versa. */
    assert_null(find_line(pr, "taskpool_submitted "));
    assert_null(find_line(pr, "taskpool_active_total"));
    free(pr);
}

static void check_snprintf(int fmt) {
    tp_stats s = distinct_stats();
    int n = tp_stats_format(&s, fmt, NULL, 0);
    assert_true(n > 0);
    char *full = format_alloc(&s, fmt);

    /* Small buffers: same return, truncated, NUL-terminated, no overrun. */
    const size_t lens[] = {1, 2, 10, (size_t)n - 1, (size_t)n, (size_t)n + 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t len = lens[i];
        char *buf = malloc(len + 64);
        assert_non_null(buf);
        memset(buf, 0x5a, len + 64);
        assert_int_equal(tp_stats_format(&s, fmt, buf, len), n);
        size_t want = len - 1 < (size_t)n ? len - 1 : (size_t)n;
        assert_int_equal(buf[want], '\0');
        assert_int_equal(strlen(buf), want);
        assert_memory_equal(buf, full, want);
        for (size_t j = len; j < len + 64; j++) assert_int_equal((unsigned char)buf[j], 0x5a);
        free(buf);
    }
    /* len 0 with a real buffer: nothing written. */
    char one = 'q';
    assert_int_equal(tp_stats_format(&s, fmt, &one, 0), n);
    assert_int_equal(one, 'q');
    free(full);
}

static void test_format_snprintf_semantics(void **state) {
    (void)state;
    check_snprintf(TP_FORMAT_JSON);
    check_snprintf(TP_FORMAT_PROMETHEUS);
}

static void test_format_einval(void **state) {
    (void)state;
    tp_stats s = distinct_stats();
    char buf[64];
    assert_int_equal(tp_stats_format(&s, 2, buf, sizeof buf), TP_EINVAL);
    assert_int_equal(tp_stats_format(&s, -1, buf, sizeof buf), TP_EINVAL);
    assert_int_equal(tp_stats_format(&s, 1000, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_stats_format(NULL, TP_FORMAT_JSON, buf, sizeof buf), TP_EINVAL);
    assert_int_equal(tp_stats_format(NULL, TP_FORMAT_PROMETHEUS, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_stats_format(&s, TP_FORMAT_JSON, NULL, 10), TP_EINVAL);
    assert_int_equal(tp_stats_format(&s, TP_FORMAT_PROMETHEUS, NULL, 1), TP_EINVAL);
}

/* ------------------------------------------------------------ live pool */

static void test_live_stats(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 3;
    cfg.queue_capacity = 10;
    cfg.max_per_user = TP_UNLIMITED;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tp_stats s;
    TPT_EVENTUALLY((s = tpt_stats(p)).workers == 3 && s.idle == 3);
    tpt_assert_counts(s, TPT_EQ(active, 0), TPT_EQ(queued, 0), TPT_EQ(delayed, 0), TPT_EQ(users, 0),
                      TPT_EQ(submitted, 0));

    tpt_latch *gate = tpt_fx_latch(f);
    tp_task_opts o = {0};
    o.user = "a";
    assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 2);
    TPT_EVENTUALLY((s = tpt_stats(p)).active == 2 && s.idle == 1);
    assert_int_equal(s.workers, 3);
    assert_int_equal(s.users, 1);
    assert_int_equal(tp_user_active(p, "a"), 2);

    o.user = "b";
    assert_int_equal(tp_submit(p, tpt_block_task, gate, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 3);
    o.user = NULL;
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
    TPT_EVENTUALLY((s = tpt_stats(p)).active == 3 && s.idle == 0 && s.queued == 2);
    tpt_assert_counts(s, TPT_EQ(users, 2), TPT_EQ(submitted, 5), TPT_EQ(accepted, 5), TPT_EQ(started, 3));
    assert_int_equal(tp_user_active(p, "a"), 2);
    assert_int_equal(tp_user_active(p, "b"), 1);
    assert_int_equal(tp_user_active(p, "c"), 0);

    tpt_latch_open(gate);
    TPT_EVENTUALLY((s = tpt_stats(p)).completed == 5 && s.idle == 3);
    tpt_assert_counts(s, TPT_EQ(active, 0), TPT_EQ(queued, 0), TPT_EQ(users, 0));
    assert_int_equal(tp_user_active(p, "a"), 0);
    s = tpt_finish(p);
    assert_int_equal(s.succeeded, 5);
    assert_int_equal(s.idle, 0);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

/* ------------------------------------------------------------ synchronization */

/* Plain (non-atomic) memory written by tasks and read by the main thread after
 * it saw the task counted: the header (section 8) promises that reading a counter
 * synchronizes with the counting, so ThreadSanitizer must see no race here. */
typedef struct sync_cell {
    uint64_t value; /* written by the task, read after tp_stats_get */
    int status;     /* what the task returns */
} sync_cell;

static int write_cell_task(tp_ctx *c, void *arg) {
    (void)c;
    sync_cell *cell = (sync_cell *)arg;
    cell->value = 0x5eed0000u + (uint64_t)cell->status;
    return cell->status;
}

static void test_stats_synchronize(void **state) {
    tpt_fixture *f = tpt_fx(state);
    enum { ROUNDS = 200 };
    tp_config cfg = {0};
    cfg.workers = 2;
    cfg.queue_capacity = 8;
    cfg.max_per_user = TP_UNLIMITED;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    static sync_cell cells[ROUNDS];
    for (unsigned i = 0; i < ROUNDS; i++) {
        cells[i].value = 0;
        cells[i].status = (i % 3 == 0) ? 7 : 0; /* every third fails: read after `failed` */
        assert_int_equal(tp_submit(p, write_cell_task, &cells[i], NULL, NULL), TP_OK);
        /* Poll the counter that covers this task, then read what it wrote. */
        tp_stats s;
        if (cells[i].status != 0)
            TPT_EVENTUALLY((s = tpt_stats(p)).failed == i / 3 + 1);
        else
            TPT_EVENTUALLY((s = tpt_stats(p)).completed == i + 1);
        assert_true(cells[i].value == 0x5eed0000u + (uint64_t)cells[i].status);
    }
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.completed, ROUNDS);
    assert_int_equal(s.failed, (ROUNDS + 2) / 3);
}

static int fail3_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 3;
}

static void test_mixed_workload_at_rest(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 2, 4, 1);

    tpt_latch *gate = tpt_fx_latch(f);
    tpt_done d[7]; /* d[4], d[5]: args of rejected submits, never called; d[6] expires */
    memset(d, 0, sizeof d);
    tp_task_opts o = {0};
    o.on_done = tpt_done_fn;

    /* Two blockers fill the workers; u1 holds its only slot. */
    tp_task_opts ou = o;
    ou.user = "u1";
    /* tpt_block_task takes the latch as arg; on_done gets the same arg, so the
     * blockers use no on_done. */
    tp_task_opts ob = {0};
    ob.user = "u1";
    assert_int_equal(tp_submit(p, tpt_block_task, gate, &ob, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 2);

    /* Four queued: success, failure, to be cancelled, success. (The task
     * that expires comes later: a queued task ends at its deadline, so it
     * could not hold its place in the full queue below.) */
    uint64_t cid = 0;
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[0], &o, NULL), TP_OK);
    assert_int_equal(tp_submit(p, fail3_task, &d[1], &o, NULL), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[2], &o, &cid), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[3], &o, NULL), TP_OK);
    assert_int_equal(tpt_stats(p).queued, 4);

    /* Rejections of every kind. */
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[4], &o, NULL), TP_EFULL);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[5], &ou, NULL), TP_EUSERLIMIT);
    assert_int_equal(tp_submit_wait(p, tpt_nop_task, &d[4], &o, TPT_MS(5), NULL), TP_ETIMEDOUT);
    assert_int_equal(tp_submit(p, NULL, NULL, NULL, NULL), TP_EINVAL); /* not counted */

    assert_int_equal(tp_cancel(p, cid), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d[2].calls) == 1);
    assert_int_equal(atomic_load(&d[2].status), TP_ECANCELED);

    /* The freed place takes a task that expires in the queue. */
    tp_task_opts oe = o;
    oe.deadline_ns = tp_now_ns() + TPT_MS(1);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[6], &oe, NULL), TP_OK);

    /* It expires in the queue while both workers are still blocked. */
    TPT_EVENTUALLY(atomic_load(&d[6].calls) == 1);
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&d[0].calls) + atomic_load(&d[1].calls) + atomic_load(&d[3].calls) +
                       atomic_load(&d[6].calls) ==
                   4);
    assert_int_equal(tp_close(p), TP_OK);
    assert_int_equal(tp_submit(p, tpt_nop_task, &d[5], &o, NULL), TP_ECLOSED);

    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&d[4].calls), 0);
    assert_int_equal(atomic_load(&d[5].calls), 0);
    assert_int_equal(atomic_load(&d[0].status), 0);
    assert_int_equal(atomic_load(&d[1].status), 3);
    assert_int_equal(atomic_load(&d[3].status), 0);
    assert_int_equal(atomic_load(&d[6].status), TP_ETIMEDOUT);
    for (int i = 0; i < 4; i++) assert_int_equal(atomic_load(&d[i].calls), 1);
    assert_int_equal(atomic_load(&d[6].calls), 1);

    tpt_assert_counts(s, TPT_EQ(submitted, 11), TPT_EQ(accepted, 7), TPT_EQ(rejected, 4),
                      TPT_EQ(rejected_full, 1), TPT_EQ(rejected_user, 1), TPT_EQ(rejected_timeout, 1),
                      TPT_EQ(rejected_closed, 1), TPT_EQ(started, 5), TPT_EQ(retried, 0),
                      TPT_EQ(completed, 7), TPT_EQ(succeeded, 4), TPT_EQ(failed, 3), TPT_EQ(cancelled, 2),
                      TPT_EQ(expired, 1), TPT_EQ(workers, 0), TPT_EQ(idle, 0));
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

/* Many threads hammer one pool with a mix; at rest the invariants hold. */
typedef struct hammer {
    tp_pool *p;
    int seed;
    atomic_int ok;
} hammer;

static int mixed_task(tp_ctx *c, void *arg) {
    uintptr_t k = (uintptr_t)arg;
    if (k % 5 == 1) return 1;
    if (k % 5 == 2) return tp_ctx_sleep(c, TPT_MS(1));
    return 0;
}

static void *hammer_main(void *arg) {
    hammer *h = arg;
    char user[8];
    for (int i = 0; i < 400; i++) {
        uintptr_t k = (uintptr_t)(h->seed * 1000 + i);
        tp_task_opts o = {0};
        snprintf(user, sizeof user, "u%d", (int)(k % 3));
        if (k % 2) o.user = user;
        if (k % 7 == 3) o.deadline_ns = tp_now_ns(); /* probably expires */
        uint64_t id = 0;
        int rc = (k % 11 == 0) ? tp_submit_wait(h->p, mixed_task, (void *)k, &o, TPT_MS(1), &id)
                               : tp_submit(h->p, mixed_task, (void *)k, &o, &id);
        if (rc == TP_OK) {
            atomic_fetch_add(&h->ok, 1);
            if (k % 13 == 0) (void)tp_cancel(h->p, id);
        }
    }
    return NULL;
}

static void test_concurrent_mix_at_rest(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 2, 8, 2);
    enum { T = 4 };
    pthread_t th[T];
    static hammer h[T];
    for (int i = 0; i < T; i++) {
        h[i].p = p;
        h[i].seed = i + 1;
        atomic_init(&h[i].ok, 0);
        assert_int_equal(pthread_create(&th[i], NULL, hammer_main, &h[i]), 0);
    }
    /* Snapshot invariant while running: capacity is explicit. */
    for (int i = 0; i < 200; i++) {
        tp_stats s = tpt_stats(p);
        assert_true(s.queued + s.delayed <= 8);
        assert_true(s.active <= 2);
        /* Counter inequalities hold in every snapshot, not only at rest:
         * tp_stats_get reads downstream counters first (stats.c). */
        assert_true(s.submitted >= s.accepted + s.rejected);
        assert_true(s.accepted >= s.completed);
        assert_true(s.accepted >= s.started);
        assert_true(s.completed >= s.succeeded + s.failed);
        assert_true(s.failed >= s.cancelled);
        assert_true(s.cancelled >= s.expired);
        tpt_pause();
    }
    for (int i = 0; i < T; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    tp_stats s = tpt_finish(p);
    uint64_t ok = 0;
    for (int i = 0; i < T; i++) ok += (uint64_t)atomic_load(&h[i].ok);
    assert_int_equal(s.submitted, T * 400);
    assert_int_equal(s.accepted, ok);
}

/* ------------------------------------------------------------ errors, version */

static void test_strerror_and_names(void **state) {
    (void)state;
    static const struct {
        int code;
        const char *name;
        const char *msg;
    } tab[] = {
#define XX(name, value, msg) {TP_##name, "TP_" #name, msg},
        TP_ERRNO_MAP(XX)
#undef XX
    };
    const size_t n = sizeof tab / sizeof tab[0];
    assert_int_equal(n, 11);
    for (size_t i = 0; i < n; i++) {
        const char *m = tp_strerror(tab[i].code);
        const char *nm = tp_err_name(tab[i].code);
        assert_non_null(m);
        assert_non_null(nm);
        assert_true(strlen(m) > 0);
        assert_string_equal(m, tab[i].msg);
        assert_string_equal(nm, tab[i].name);
        assert_string_not_equal(m, "unknown error");
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(m, tp_strerror(tab[j].code));
            assert_string_not_equal(nm, tp_err_name(tab[j].code));
        }
    }
    assert_int_equal(TP_EINVAL, -1);
    assert_int_equal(TP_ENODEFAULT, -10);
    assert_int_equal(TP_EBUSY, -11);
    assert_string_equal(tp_strerror(TP_EBUSY), "still in use");
    assert_string_equal(tp_strerror(TP_OK), "success");
    assert_string_equal(tp_err_name(TP_OK), "TP_OK");
    const int unknown[] = {1, 42, -12, -1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_non_null(tp_strerror(unknown[i]));
        assert_string_equal(tp_strerror(unknown[i]), "unknown error");
        assert_string_equal(tp_err_name(unknown[i]), "TP_UNKNOWN");
    }
}

static void test_version(void **state) {
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH);
    assert_non_null(tp_version());
    assert_string_equal(tp_version(), want);
    assert_ptr_equal(tp_version(), tp_version()); /* static string */
    /* TP_VERSION_HEX and TP_VERSION_AT_LEAST agree with the parts. */
    assert_int_equal(TP_VERSION_HEX, (TP_VERSION_MAJOR << 16) | (TP_VERSION_MINOR << 8) | TP_VERSION_PATCH);
    assert_true(TP_VERSION_AT_LEAST(TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH));
    assert_true(TP_VERSION_AT_LEAST(1, 0, 0));
    assert_false(TP_VERSION_AT_LEAST(TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH + 1));
    assert_false(TP_VERSION_AT_LEAST(TP_VERSION_MAJOR + 1, 0, 0));
#if !TP_VERSION_AT_LEAST(1, 1, 0)
    fail_msg("the preprocessor sees TP_VERSION_AT_LEAST(1, 1, 0) false in a 1.1 header");
#endif
}

/* The reserved tail of tp_stats is written as zero (taskpool.h, "How the
 * structs grow"), whatever the caller's buffer held. */
static void test_stats_reserved_zeroed(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    tp_stats s;
    memset(&s, 0xA5, sizeof s);
    tp_stats_get(p, &s);
    for (size_t i = 0; i < sizeof s.reserved / sizeof s.reserved[0]; i++) assert_true(s.reserved[i] == 0);
    (void)tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_format_json),
        TPT_TEST(test_format_prometheus),
        TPT_TEST(test_format_snprintf_semantics),
        TPT_TEST(test_format_einval),
        TPT_TEST(test_live_stats),
        TPT_TEST(test_stats_synchronize),
        TPT_TEST(test_mixed_workload_at_rest),
        TPT_TEST(test_concurrent_mix_at_rest),
        TPT_TEST(test_strerror_and_names),
        TPT_TEST(test_version),
        TPT_TEST(test_stats_reserved_zeroed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
