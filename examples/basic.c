/*
 * basic.c -- the smallest complete use of libtaskpool.
 *
 * Creates a pool, submits a few tasks whose argument is heap-allocated and
 * freed by on_done (which runs exactly once for every accepted task), shuts the
 * pool down, prints its statistics as JSON and destroys it. Every call's result
 * is checked; a refused submit leaves the argument with the caller.
 */
#include <stdio.h>
#include <stdlib.h>

#include "taskpool.h"

typedef struct job {
    int n;
} job;

/* The task: runs on a worker thread. A long task would check tp_ctx_err()
 * (or use tp_ctx_sleep()/tp_ctx_fd()) to notice cancellation and timeouts. */
static int square(tp_ctx *ctx, void *arg) {
    const job *j = arg;
    int err = tp_ctx_err(ctx);
    if (err != 0) return err;
    printf("task %llu: %d squared is %d\n", (unsigned long long)tp_ctx_id(ctx), j->n, j->n * j->n);
    return 0;
}

/* Called once per accepted task, after its final outcome: frees its argument. */
static void job_done(void *arg, int status) {
    if (status != 0) fprintf(stderr, "job %d ended with %s\n", ((job *)arg)->n, tp_strerror(status));
    free(arg);
}

int main(void) {
    tp_config cfg = {
        .workers = 2, /* zero fields keep their defaults */
        .queue_capacity = 16,
        .name = "basic", /* worker threads are named basic-... */
    };
    tp_pool *pool = NULL;
    int rc = tp_create(&pool, &cfg);
    if (rc != TP_OK) {
        fprintf(stderr, "tp_create: %s\n", tp_strerror(rc));
        return 1;
    }

    int failed = 0;
    tp_task_opts opts = {.on_done = job_done};
    for (int i = 1; i <= 5; i++) {
        job *j = malloc(sizeof *j);
        if (j == NULL) {
            fprintf(stderr, "out of memory\n");
            failed = 1;
            break;
        }
        j->n = i;
        uint64_t id = 0;
        rc = tp_submit(pool, square, j, &opts, &id);
        if (rc != TP_OK) {
            /* Refused (TP_EFULL, TP_ECLOSED, ...): the job is still ours. */
            fprintf(stderr, "tp_submit: %s\n", tp_strerror(rc));
            free(j);
            failed = 1;
            continue;
        }
        printf("submitted task %llu\n", (unsigned long long)id);
    }

    /* Stop admission and wait up to 5 s for every accepted task to end. */
    rc = tp_shutdown(pool, 5000000000ull);
    if (rc != TP_OK) {
        fprintf(stderr, "tp_shutdown: %s\n", tp_strerror(rc));
        failed = 1;
    }

    tp_stats stats;
    tp_stats_get(pool, &stats);
    int need = tp_stats_format(&stats, TP_FORMAT_JSON, NULL, 0); /* length, like snprintf */
    char *json = need < 0 ? NULL : malloc((size_t)need + 1);
    if (json == NULL) {
        fprintf(stderr, "tp_stats_format: %s\n", need < 0 ? tp_strerror(need) : "out of memory");
        failed = 1;
    } else {
        rc = tp_stats_format(&stats, TP_FORMAT_JSON, json, (size_t)need + 1);
        if (rc < 0) {
            fprintf(stderr, "tp_stats_format: %s\n", tp_strerror(rc));
            failed = 1;
        } else {
            printf("%s\n", json);
        }
        free(json);
    }

    rc = tp_destroy(pool); /* joins the threads and frees the pool */
    if (rc != TP_OK) {
        fprintf(stderr, "tp_destroy: %s\n", tp_strerror(rc));
        failed = 1;
    }
    return failed;
}
