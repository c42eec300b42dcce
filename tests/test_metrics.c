/*
 * test_metrics.c -- tp_metrics_format (header section 13).
 *
 * Covers, on pools with awkward names (a double quote, a backslash, a
 * newline, UTF-8 and a byte that is not UTF-8): snprintf semantics (the
 * length needed with a NULL buffer, a truncated prefix that is
 * NUL-terminated, the same document when it fits); the Prometheus text: one
 * # HELP and one # TYPE per family, before its samples, every sample labelled
 * with the escaped pool name except build_info, samples of one family
 * together, le bounds ascending and ending at +Inf, +Inf == _count, _count
 * equal to started + retried at rest, the capacity gauges (+Inf for an
 * unlimited max_per_user); the JSON document's shape and escaping; zero
 * pools; refusals (NULL arguments, an unknown format, two pools with one name,
 * one pool twice).
 *
 * The external parsers (promtool check metrics, prometheus_client) run on the
 * same kind of document in tests/metrics/ (CTest test metrics_parsers).
 */
#define _GNU_SOURCE
#include "tp_test.h"

static tp_pool *named_pool(tpt_fixture *f, const char *name, unsigned max_per_user) {
    tp_config cfg = tpt_quiet_config(2, 64, max_per_user);
    cfg.max_retries = 1;
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.name = name;
    return tpt_fx_pool(f, &cfg);
}

static void run_some(tp_pool *p, int n) {
    for (int i = 0; i < n; i++)
        assert_int_equal(
            tp_submit_wait(p, i % 4 ? tpt_nop_task : tpt_fail_once_task, NULL, NULL, TPT_WAIT_NS, NULL),
            TP_OK);
    assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
    assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
}

static char *format_all(tp_pool *const *pools, size_t n, int fmt) {
    int need = tp_metrics_format(pools, n, fmt, NULL, 0);
    assert_true(need > 0);
    char *buf = malloc((size_t)need + 1);
    assert_non_null(buf);
    assert_int_equal(tp_metrics_format(pools, n, fmt, buf, (size_t)need + 1), need);
    assert_int_equal(strlen(buf), (size_t)need);
    return buf;
}

#define NAME_A  "q\"uote\\back"
#define NAME_B  "line\nbreak \xc3\xa4\xff"
#define LABEL_A "pool=\"q\\\"uote\\\\back\""
#define LABEL_B "pool=\"line\\nbreak \xc3\xa4\xef\xbf\xbd\""

/* The families a document must hold, each with its type. */
static const char *const families[][2] = {
    {"taskpool_submitted_total", "counter"},
    {"taskpool_accepted_total", "counter"},
    {"taskpool_rejected_total", "counter"},
    {"taskpool_rejected_full_total", "counter"},
    {"taskpool_rejected_user_total", "counter"},
    {"taskpool_rejected_closed_total", "counter"},
    {"taskpool_rejected_timeout_total", "counter"},
    {"taskpool_started_total", "counter"},
    {"taskpool_retried_total", "counter"},
    {"taskpool_completed_total", "counter"},
    {"taskpool_succeeded_total", "counter"},
    {"taskpool_failed_total", "counter"},
    {"taskpool_cancelled_total", "counter"},
    {"taskpool_expired_total", "counter"},
    {"taskpool_active", "gauge"},
    {"taskpool_queued", "gauge"},
    {"taskpool_delayed", "gauge"},
    {"taskpool_workers", "gauge"},
    {"taskpool_idle", "gauge"},
    {"taskpool_users", "gauge"},
    {"taskpool_oldest_wait_seconds", "gauge"},
    {"taskpool_workers_max", "gauge"},
    {"taskpool_queue_capacity", "gauge"},
    {"taskpool_max_per_user", "gauge"},
    {"taskpool_queue_wait_seconds", "histogram"},
    {"taskpool_run_seconds", "histogram"},
    {"taskpool_lane_started_total", "counter"},
    {"taskpool_lane_queued", "gauge"},
    {"taskpool_lane_running", "gauge"},
    {"taskpool_lane_queue_wait_seconds", "histogram"},
    {"taskpool_build_info", "gauge"},
};
#define NFAM (sizeof families / sizeof families[0])

static int count_occurrences(const char *hay, const char *needle) {
    int n = 0;
    for (const char *s = hay; (s = strstr(s, needle)) != NULL; s++) n++;
    return n;
}

/* Family of a sample line: its metric name without a histogram suffix. */
static void family_of(const char *line, char *out, size_t len) {
    size_t n = strcspn(line, "{ ");
    if (n >= len) n = len - 1;
    memcpy(out, line, n);
    out[n] = '\0';
    static const char *const suf[3] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(suf[i]);
        if (n > k && strcmp(out + n - k, suf[i]) == 0 &&
            (strncmp(out, "taskpool_queue_wait_seconds", 27) == 0 ||
             strncmp(out, "taskpool_run_seconds", 20) == 0 ||
             strncmp(out, "taskpool_lane_queue_wait_seconds", 32) == 0)) {
            out[n - k] = '\0';
            break;
        }
    }
}

static void check_prometheus(char *doc, const tp_stats *sa, const tp_stats *sb) {
    /* one HELP and one TYPE per family, with the right type */
    for (size_t f = 0; f < NFAM; f++) {
        char help[96], type[96];
        snprintf(help, sizeof help, "# HELP %s ", families[f][0]);
        snprintf(type, sizeof type, "# TYPE %s %s\n", families[f][0], families[f][1]);
        if (count_occurrences(doc, help) != 1 || count_occurrences(doc, type) != 1)
            fail_msg("family %s: %d HELP, %d TYPE lines", families[f][0], count_occurrences(doc, help),
                     count_occurrences(doc, type));
    }
    assert_int_equal(count_occurrences(doc, "# HELP "), (int)NFAM);
    assert_int_equal(count_occurrences(doc, "# TYPE "), (int)NFAM);
    char *ver = NULL;
    assert_true(asprintf(&ver, "taskpool_build_info{version=\"%s\"} 1\n", tp_version()) > 0);
    assert_non_null(strstr(doc, ver));
    free(ver);
    assert_non_null(strstr(doc, "taskpool_max_per_user{" LABEL_B "} +Inf\n"));
    assert_non_null(strstr(doc, "taskpool_max_per_user{" LABEL_A "} 3\n"));
    assert_non_null(strstr(doc, "taskpool_workers_max{" LABEL_A "} 2\n"));
    assert_non_null(strstr(doc, "taskpool_queue_capacity{" LABEL_A "} 64\n"));
    char want[160];
    snprintf(want, sizeof want, "taskpool_accepted_total{" LABEL_A "} %llu\n",
             (unsigned long long)sa->accepted);
    assert_non_null(strstr(doc, want));
    snprintf(want, sizeof want, "taskpool_retried_total{" LABEL_B "} %llu\n",
             (unsigned long long)sb->retried);
    assert_non_null(strstr(doc, want));

    /* line by line: samples labelled, families contiguous, after their TYPE;
     * buckets ascending to +Inf == _count */
    char current[64] = "", seen[NFAM][64];
    size_t nseen = 0;
    double last_le = -1;
    unsigned long long inf = 0, buckets = 0;
    int pools_in_hist = 0, finite_le = 0;
    for (char *line = strtok(doc, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            size_t n = strcspn(line + 7, " ");
            snprintf(current, sizeof current, "%.*s", (int)n, line + 7);
            for (size_t i = 0; i < nseen; i++)
                if (strcmp(seen[i], current) == 0) fail_msg("family %s appears twice", current);
            assert_true(nseen < NFAM);
            snprintf(seen[nseen++], sizeof seen[0], "%s", current);
            continue;
        }
        if (line[0] == '#') continue;
        char fam[64];
        family_of(line, fam, sizeof fam);
        if (strcmp(fam, current) != 0) fail_msg("sample of %s after the TYPE of %s: %s", fam, current, line);
        if (strcmp(fam, "taskpool_build_info") == 0) {
            assert_null(strstr(line, "pool="));
            continue;
        }
        if (!strstr(line, "{" LABEL_A) && !strstr(line, "{" LABEL_B))
            fail_msg("sample without its pool label: %s", line);
        if (strstr(line, "_bucket{")) {
            const char *le = strstr(line, "le=\"");
            assert_non_null(le);
            unsigned long long v = strtoull(strrchr(line, ' ') + 1, NULL, 10);
            if (strncmp(le + 4, "+Inf\"", 5) == 0) {
                inf = v;
                last_le = -1;
                pools_in_hist++;
                /* a fixed subset of the exact bounds, from about 1 us to about 1 h */
                if (finite_le != 24) fail_msg("%d finite le bounds before: %s", finite_le, line);
                finite_le = 0;
            } else {
                finite_le++;
                double x = strtod(le + 4, NULL);
                if (!(x > last_le)) fail_msg("le not ascending: %s", line);
                if (v < buckets) fail_msg("cumulative bucket count decreases: %s", line);
                last_le = x;
                buckets = v;
            }
        } else if (strstr(line, "_count{")) {
            unsigned long long v = strtoull(strrchr(line, ' ') + 1, NULL, 10);
            if (v != inf) fail_msg("_count %llu != +Inf bucket %llu: %s", v, inf, line);
            const tp_stats *s = strstr(line, LABEL_A) ? sa : sb;
            if (strncmp(line, "taskpool_lane_", 14) != 0 || strstr(line, "priority=\"0\""))
                assert_int_equal(v, s->started + s->retried); /* at rest; every task of lane 0 */
            else
                assert_int_equal(v, 0);
            buckets = 0;
        }
    }
    assert_int_equal(nseen, NFAM);
    assert_int_equal(pools_in_hist, 14); /* (two histograms + five lanes) x two pools */
}

static void test_metrics_prometheus(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *pools[2] = {named_pool(f, NAME_A, 3), named_pool(f, NAME_B, TP_UNLIMITED)};
    run_some(pools[0], 50);
    run_some(pools[1], 30);
    tp_stats sa = tpt_stats(pools[0]), sb = tpt_stats(pools[1]);
    assert_true(sb.retried > 0);
    char *doc = format_all(pools, 2, TP_FORMAT_PROMETHEUS);
    int need = (int)strlen(doc);
    /* a prefix, NUL-terminated */
    char small[64];
    memset(small, 'x', sizeof small);
    assert_int_equal(tp_metrics_format(pools, 2, TP_FORMAT_PROMETHEUS, small, sizeof small), need);
    assert_int_equal(small[sizeof small - 1], '\0');
    assert_memory_equal(small, doc, sizeof small - 1);
    char one[1] = {'x'};
    assert_int_equal(tp_metrics_format(pools, 2, TP_FORMAT_PROMETHEUS, one, 1), need);
    assert_int_equal(one[0], '\0');
    check_prometheus(doc, &sa, &sb);
    free(doc);
    tpt_destroy(pools[0]);
    tpt_destroy(pools[1]);
}

static void test_metrics_json(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *pools[2] = {named_pool(f, NAME_A, 3), named_pool(f, NAME_B, TP_UNLIMITED)};
    run_some(pools[0], 20);
    run_some(pools[1], 10);
    char *doc = format_all(pools, 2, TP_FORMAT_JSON);
    char *head = NULL;
    assert_true(asprintf(&head, "{\"version\":\"%s\",\"pools\":{\"q\\\"uote\\\\back\":{\"submitted\":20,",
                         tp_version()) > 0);
    if (strncmp(doc, head, strlen(head)) != 0) fail_msg("JSON starts: %.120s", doc);
    free(head);
    assert_non_null(strstr(doc, ",\"line\\nbreak \xc3\xa4\\ufffd\":{\"submitted\":10,"));
    assert_non_null(
        strstr(doc, "\"workers_max\":2,\"queue_capacity\":64,\"max_per_user\":3,\"queue_wait\":{\"count\":"));
    assert_non_null(strstr(doc, "\"max_per_user\":null,"));
    assert_non_null(strstr(doc, "\"run\":{\"count\":"));
    /* the pool's and each lane's */
    assert_int_equal(count_occurrences(doc, "\"queue_wait\":"), 2 * (1 + 5));
    assert_int_equal(count_occurrences(doc, "\"lanes\":{\"-2\":{\"started\":0,\"queued\":0,\"running\":0,"),
                     2);
    assert_int_equal(count_occurrences(doc, "\"oldest_wait_ns\":0,"), 2);
    assert_int_equal(doc[strlen(doc) - 1], '}');
    assert_null(strchr(doc, '\n')); /* the raw newline is escaped */
    free(doc);
    tpt_destroy(pools[0]);
    tpt_destroy(pools[1]);
}

static void test_metrics_zero_pools_and_refusals(void **state) {
    tpt_fixture *f = tpt_fx(state);
    char buf[4096];
    int n = tp_metrics_format(NULL, 0, TP_FORMAT_PROMETHEUS, buf, sizeof buf);
    assert_true(n > 0 && (size_t)n == strlen(buf));
    assert_non_null(strstr(buf, "taskpool_build_info{version="));
    assert_non_null(strstr(buf, "# TYPE taskpool_run_seconds histogram\n"));
    assert_null(strstr(buf, "pool="));
    n = tp_metrics_format(NULL, 0, TP_FORMAT_JSON, buf, sizeof buf);
    char want[64];
    snprintf(want, sizeof want, "{\"version\":\"%s\",\"pools\":{}}", tp_version());
    assert_string_equal(buf, want);
    assert_int_equal(n, (int)strlen(want));

    tp_pool *a = named_pool(f, "same", 0), *b = named_pool(f, "same", 0), *c = named_pool(f, "other", 0);
    tp_pool *dup[2] = {a, b}, *twice[2] = {c, c}, *withnull[2] = {c, NULL}, *ok[2] = {a, c};
    memset(buf, 'x', sizeof buf);
    assert_int_equal(tp_metrics_format(dup, 2, TP_FORMAT_PROMETHEUS, buf, sizeof buf), TP_EINVAL);
    assert_int_equal(buf[0], 'x'); /* nothing written */
    assert_int_equal(tp_metrics_format(dup, 2, TP_FORMAT_JSON, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_metrics_format(twice, 2, TP_FORMAT_JSON, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_metrics_format(withnull, 2, TP_FORMAT_JSON, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_metrics_format(NULL, 1, TP_FORMAT_JSON, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_metrics_format(ok, 2, TP_FORMAT_JSON, NULL, 10), TP_EINVAL);
    assert_int_equal(tp_metrics_format(ok, 2, 7, buf, sizeof buf), TP_EINVAL);
    assert_true(tp_metrics_format(ok, 2, TP_FORMAT_JSON, NULL, 0) > 0);
    assert_true(tp_metrics_format(ok, 1, TP_FORMAT_PROMETHEUS, NULL, 0) > 0);
    tpt_finish(a);
    tpt_finish(b);
    tpt_finish(c);
}

/* Names written the same are the same name: a byte that is not UTF-8 is
 * written as U+FFFD, so "web\xff", "web\xfe" and "web" U+FFFD would give
 * one JSON key (a parser keeps one pool) and twice the same Prometheus
 * series. Refused, as two equal names are; names that are written apart
 * pass, however close their bytes. */
static void test_metrics_names_written_the_same(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *ff = named_pool(f, "web\xff", 0), *fe = named_pool(f, "web\xfe", 0),
            *fffd = named_pool(f, "web\xef\xbf\xbd", 0), *plain = named_pool(f, "web", 0),
            *nl = named_pool(f, "web\n", 0), *esc = named_pool(f, "web\\n", 0);
    tp_pool *same[][2] = {{ff, fe}, {ff, fffd}, {fffd, fe}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        assert_int_equal(tp_metrics_format(same[i], 2, TP_FORMAT_JSON, NULL, 0), TP_EINVAL);
        assert_int_equal(tp_metrics_format(same[i], 2, TP_FORMAT_PROMETHEUS, NULL, 0), TP_EINVAL);
    }
    /* apart: a name and its prefix; a newline and the two characters "\n" */
    tp_pool *apart[] = {ff, plain, nl, esc};
    assert_true(tp_metrics_format(apart, 4, TP_FORMAT_JSON, NULL, 0) > 0);
    assert_true(tp_metrics_format(apart, 4, TP_FORMAT_PROMETHEUS, NULL, 0) > 0);
    tpt_finish(ff);
    tpt_finish(fe);
    tpt_finish(fffd);
    tpt_finish(plain);
    tpt_finish(nl);
    tpt_finish(esc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(f) TPT_TEST(f)
        T(test_metrics_prometheus),
        T(test_metrics_json),
        T(test_metrics_zero_pools_and_refusals),
        T(test_metrics_names_written_the_same),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
