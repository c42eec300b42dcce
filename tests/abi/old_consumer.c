/*
 * old_consumer.c -- a program written and built against an OLDER release of
 * libtaskpool (its header and its shared library), then run against this
 * build's shared library (see old_binary.sh). It proves the promise of
 * taskpool.h, "What the same major version promises": the binary keeps
 * working, unchanged, when only the library is replaced.
 *
 * It uses every call that reads or writes a public struct, and puts guard
 * words right behind each struct: a library that read or wrote the newer,
 * larger layout through an old binary's struct would trip a guard (tp_create
 * and tp_submit would see non-zero "reserved" words and refuse; tp_stats_get
 * would overwrite them). Exit status 0 on success; the first failed check is
 * printed.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taskpool.h>

#define GUARD 0xA5A5A5A5A5A5A5A5ull
#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "old_consumer: check failed: %s (line %d)\n", #cond, __LINE__);                  \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* Each struct followed by guard words the library must never touch. */
struct guarded_config {
    tp_config c;
    uint64_t guard[16];
};
struct guarded_opts {
    tp_task_opts o;
    uint64_t guard[16];
};
struct guarded_stats {
    tp_stats s;
    uint64_t guard[32];
};

static void guards_set(uint64_t *g, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = GUARD;
}
static int guards_intact(const uint64_t *g, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (g[i] != GUARD) return 0;
    return 1;
}

static atomic_int ran, done_ok;

static int task(tp_ctx *ctx, void *arg) {
    (void)arg;
    if (strcmp(tp_ctx_user(ctx), "old-user") != 0) return 5;
    atomic_fetch_add(&ran, 1);
    return 0;
}

static void on_done(void *arg, int status) {
    (void)arg;
    if (status == 0) atomic_fetch_add(&done_ok, 1);
}

int main(void) {
    /* The library must be of this major version and at least this minor. */
    int maj = 0, min = 0, pat = 0;
    CHECK(sscanf(tp_version(), "%d.%d.%d", &maj, &min, &pat) == 3);
    CHECK(maj == TP_VERSION_MAJOR);
    CHECK(min >= TP_VERSION_MINOR);
    printf("old_consumer: built against %d.%d.%d, running on %s\n", TP_VERSION_MAJOR, TP_VERSION_MINOR,
           TP_VERSION_PATCH, tp_version());

    struct guarded_config gc;
    memset(&gc.c, 0, sizeof gc.c);
    guards_set(gc.guard, 16);
    gc.c.workers = 2;
    gc.c.queue_capacity = 16;
    gc.c.max_per_user = 3;
    gc.c.name = "old";
    gc.c.hook_arg = NULL; /* the last field of the 1.0 layout */
    tp_pool *p = NULL;
    CHECK(tp_create(&p, &gc.c) == TP_OK);
    CHECK(guards_intact(gc.guard, 16));

    struct guarded_opts go;
    memset(&go.o, 0, sizeof go.o);
    guards_set(go.guard, 16);
    go.o.user = "old-user";
    go.o.on_done = on_done;
    go.o.priority = 0; /* the last field of the 1.0 layout */
    uint64_t id = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(tp_submit(p, task, NULL, &go.o, &id) == TP_OK);
        CHECK(id != 0);
    }
    CHECK(tp_submit_wait(p, task, NULL, &go.o, 0, &id) == TP_OK);
    CHECK(guards_intact(go.guard, 16));

    CHECK(tp_shutdown(p, TP_FOREVER) == TP_OK);
    CHECK(tp_wait(p, TP_FOREVER) == TP_OK);
    struct guarded_stats gs;
    guards_set(gs.guard, 32);
    tp_stats_get(p, &gs.s);
    CHECK(guards_intact(gs.guard, 32));
    CHECK(gs.s.accepted == 4 && gs.s.submitted == 4);
    CHECK(gs.s.completed == gs.s.accepted);
    CHECK(gs.s.succeeded == gs.s.accepted);
    CHECK(atomic_load(&ran) == (int)gs.s.accepted);
    CHECK(atomic_load(&done_ok) == (int)gs.s.accepted);
    char buf[4096];
    int n = tp_stats_format(&gs.s, TP_FORMAT_JSON, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n < sizeof buf);
    CHECK(strstr(buf, "\"succeeded\"") != NULL);
    CHECK(guards_intact(gs.guard, 32));
    CHECK(tp_destroy(p) == TP_OK);

    /* The default pool takes the same structs. */
    guards_set(gc.guard, 16);
    CHECK(tp_default_create(&gc.c) == TP_OK);
    CHECK(tp_default_submit(task, NULL, &go.o, NULL) == TP_OK);
    CHECK(tp_default_shutdown(TP_FOREVER) == TP_OK);
    CHECK(guards_intact(gc.guard, 16) && guards_intact(go.guard, 16));
    tp_pool *d = tp_default_swap(NULL);
    CHECK(d != NULL && tp_destroy(d) == TP_OK);

    printf("old_consumer: OK (%llu tasks)\n", (unsigned long long)gs.s.accepted);
    return 0;
}
