/*
 * emit_metrics.c -- writes a tp_metrics_format document of two pools with
 * awkward names, for the external parsers (check.sh).
 *
 *   emit_metrics PROM_FILE JSON_FILE
 *
 * The pools run a few tasks (some retried) and are shut down first, so the
 * figures are at rest and the histograms are not empty. The names are the
 * ones check_metrics.py expects.
 */
#include <stdio.h>
#include <stdlib.h>

#include "taskpool.h"

static int flaky(tp_ctx *c, void *arg) {
    (void)arg;
    return tp_ctx_attempt(c) == 0 ? 1 : 0;
}

static int nop(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    return 0;
}

static void quiet(void *arg, int level, const char *log_id, const char *msg) {
    (void)arg, (void)level, (void)log_id, (void)msg;
}

static int write_doc(tp_pool *const *pools, int fmt, const char *path) {
    int need = tp_metrics_format(pools, 2, fmt, NULL, 0);
    if (need < 0) return fprintf(stderr, "emit_metrics: %s\n", tp_strerror(need)), 1;
    char *buf = malloc((size_t)need + 1);
    FILE *f = fopen(path, "wb");
    int rc = !buf || !f || tp_metrics_format(pools, 2, fmt, buf, (size_t)need + 1) != need ||
             fwrite(buf, 1, (size_t)need, f) != (size_t)need;
    if (f && fclose(f) != 0) rc = 1;
    free(buf);
    if (rc) fprintf(stderr, "emit_metrics: cannot write %s\n", path);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 3) return fprintf(stderr, "usage: %s PROM_FILE JSON_FILE\n", argv[0]), 2;
    static const char *const names[2] = {"q\"uote\\back", "line\nbreak \xc3\xa4"};
    tp_pool *pools[2];
    for (int i = 0; i < 2; i++) {
        tp_config cfg = {0};
        cfg.workers = 2;
        cfg.max_retries = 1;
        cfg.retry_delay_ns = 1000000;
        cfg.max_per_user = i ? TP_UNLIMITED : 0;
        cfg.name = names[i];
        cfg.log = quiet;
        if (tp_create(&pools[i], &cfg) != TP_OK) return fprintf(stderr, "emit_metrics: tp_create\n"), 1;
        for (int k = 0; k < 40; k++)
            if (tp_submit_wait(pools[i], k % 5 ? nop : flaky, NULL, NULL, 5000000000ull, NULL) != TP_OK)
                return fprintf(stderr, "emit_metrics: submit\n"), 1;
        if (tp_shutdown(pools[i], 20000000000ull) != TP_OK)
            return fprintf(stderr, "emit_metrics: shutdown\n"), 1;
    }
    int rc = write_doc(pools, TP_FORMAT_PROMETHEUS, argv[1]) | write_doc(pools, TP_FORMAT_JSON, argv[2]);
    tp_destroy(pools[0]);
    tp_destroy(pools[1]);
    return rc;
}
