/*
 * test_handlers.c -- handlers the stream tests pick with TEST_HANDLER, linked
 * into taskpool-stream-worker-test (examples/stream/worker.c built with
 * TPS_TEST_HANDLERS; never installed). Each one behaves like a handler an
 * application could well write, which the demo's handler does not:
 *   neg             tps_default_handler, except that a failed attempt returns
 *                   -1 (C's usual "failed") and a cut-short sleep TP_ECANCELED
 *                   or TP_ETIMEDOUT (the pool's own codes);
 *   uninterruptible finishes what it started when it is cancelled (work that
 *                   cannot stop halfway, such as a payment call): runs
 *                   `work` long, or until a cancellation and 100 ms more,
 *                   then succeeds with the payload as its result.
 * Unset or empty: tps_default_handler.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>

#include "test_handlers.h"

#include "taskpool.h"
#include "tp_stream.h"

static int neg_handler(tp_ctx *ctx, const tps_msg *msg, void *arg) {
    int rc = tps_default_handler(ctx, msg, arg);
    switch (rc) {
    case TPS_RUN_FAILED: return -1;
    case TPS_RUN_CANCELED: return TP_ECANCELED;
    case TPS_RUN_TIMEDOUT: return TP_ETIMEDOUT;
    default: return rc;
    }
}

static int uninterruptible_handler(tp_ctx *ctx, const tps_msg *msg, void *arg) {
    (void)arg;
    uint64_t end = tp_now_ns() + msg->work_ns;
    while (tp_ctx_err(ctx) != TP_ECANCELED && tp_now_ns() < end) {
        struct timespec tick = {0, 5000000}; /* 5 ms */
        (void)nanosleep(&tick, NULL);
    }
    if (tp_ctx_err(ctx) == TP_ECANCELED) {
        struct timespec rest = {0, 100000000}; /* 100 ms: the rest of the work */
        while (nanosleep(&rest, &rest) != 0 && errno == EINTR) {
        }
    }
    if (msg->payload != NULL) (void)tps_set_result(msg, msg->payload, msg->payload_len);
    return 0;
}

int tps_test_handler(const char *name, tps_handler *out) {
    if (name == NULL || name[0] == '\0')
        *out = NULL;
    else if (strcmp(name, "neg") == 0)
        *out = neg_handler;
    else if (strcmp(name, "uninterruptible") == 0)
        *out = uninterruptible_handler;
    else
        return -1;
    return 0;
}
