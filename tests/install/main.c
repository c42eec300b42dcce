/*
 * main.c -- a consumer of an installed libtaskpool (see check.sh).
 *
 * Uses only the installed header and library: creates a pool, runs a few
 * tasks, shuts down, and checks that the library it linked is the version its
 * header announces. Exit status 0 on success.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <taskpool.h>

#define TASKS 8

static atomic_int ran;
static atomic_int done;

static int count_task(tp_ctx *ctx, void *arg) {
    (void)ctx;
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return 0;
}

static void count_done(void *arg, int status) {
    (void)arg;
    if (status == 0) atomic_fetch_add(&done, 1);
}

#define STR_(x) #x
#define STR(x)  STR_(x)

int main(void) {
    const char *want = STR(TP_VERSION_MAJOR) "." STR(TP_VERSION_MINOR) "." STR(TP_VERSION_PATCH);
    if (strcmp(tp_version(), want) != 0) {
        fprintf(stderr, "consumer: library is %s, header says %s\n", tp_version(), want);
        return 1;
    }

    tp_pool *pool = NULL;
    tp_config cfg = {.workers = 2, .queue_capacity = TASKS};
    int rc = tp_create(&pool, &cfg);
    if (rc != TP_OK) {
        fprintf(stderr, "consumer: tp_create: %s\n", tp_strerror(rc));
        return 1;
    }
    tp_task_opts opts = {.on_done = count_done};
    for (int i = 0; i < TASKS; i++) {
        rc = tp_submit(pool, count_task, NULL, &opts, NULL);
        if (rc != TP_OK) {
            fprintf(stderr, "consumer: tp_submit: %s\n", tp_strerror(rc));
            tp_destroy(pool);
            return 1;
        }
    }
    rc = tp_shutdown(pool, TP_FOREVER);
    if (rc != TP_OK) {
        fprintf(stderr, "consumer: tp_shutdown: %s\n", tp_strerror(rc));
        tp_destroy(pool);
        return 1;
    }
    rc = tp_destroy(pool);
    if (rc != TP_OK) {
        fprintf(stderr, "consumer: tp_destroy: %s\n", tp_strerror(rc));
        return 1;
    }
    if (atomic_load(&ran) != TASKS || atomic_load(&done) != TASKS) {
        fprintf(stderr, "consumer: ran %d, done %d, expected %d\n", atomic_load(&ran), atomic_load(&done),
                TASKS);
        return 1;
    }
    printf("consumer: libtaskpool %s ran %d tasks\n", tp_version(), TASKS);
    return 0;
}
