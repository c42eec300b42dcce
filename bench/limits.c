/*
 * limits.c -- the machine's own limits, measured in this process each round.
 *
 * The pool's figures mean little alone: a laptop and a loaded VM differ by
 * several times. So every round also measures what the pool is built from,
 * with no pool around it, the same way as the perf harness's limits.c:
 *
 *   mutex pair   an uncontended pthread_mutex lock+unlock, ns per pair;
 *   wake         one-way condition-variable wake latency: a thread blocked on
 *                a condvar; the main thread sleeps the idle gap, stamps,
 *                signals, and yields until the sleeper stamps; the difference
 *                is one sample (p50/p99 over --samples);
 *   ring         a bare bounded ring of --queue slots under one mutex with
 *                "not empty" / "not full" condvars, signalled only when a
 *                waiter is counted (the shape of libtaskpool's queue), one
 *                producer handing --tasks items to one consumer, ns per item;
 *   ring 1:W     the same ring with --workers consumers (only when --workers
 *                is more than 1): the pool's own shape at one producer. On a
 *                machine with fewer CPUs than 1 + W threads it pays for
 *                sharing them (preemptions, a consumer woken for nothing),
 *                which the one-consumer ring does not.
 *
 * The pool's throughput is reported as a multiple of the ring, its wake
 * latency as a multiple of the condvar wake: two machines that differ in
 * speed should still agree on those ratios. The throughput scenarios with one
 * producer also divide by the ring of W consumers, the like-for-like limit.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

#define MUTEX_PAIRS 1000000ul
#define WAKE_WARMUP 50 /* unrecorded samples, as limits.c */

/* The bare ring and one of its consumers (below). */
typedef struct ring {
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    void **buf;
    unsigned long cap, head, tail, count; /* under mu */
    int wait_empty, wait_full;            /* waiters counted, under mu */
    unsigned long items;
} ring;

typedef struct consumer {
    ring *r;
    unsigned long items; /* this consumer's share */
    uintptr_t sum;       /* of what it took */
    pthread_t thread;
} consumer;

static uint64_t *g_wake_lat;  /* --samples entries */
static void **g_ring_buf;     /* --queue entries */
static consumer *g_consumers; /* --workers entries */

int limits_setup(const bench_opts *o) {
    g_wake_lat = calloc(o->samples, sizeof g_wake_lat[0]);
    g_ring_buf = calloc(o->queue, sizeof g_ring_buf[0]);
    g_consumers = calloc(o->workers, sizeof g_consumers[0]);
    if (g_wake_lat == NULL || g_ring_buf == NULL || g_consumers == NULL) {
        fprintf(stderr, "tp_bench: out of memory for the limit buffers\n");
        return -1;
    }
    return 0;
}

void limits_teardown(void) {
    free(g_wake_lat);
    free(g_ring_buf);
    free(g_consumers);
}

/* ------------------------------------------------------------ mutex pair */

static double mutex_pair_ns(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    uint64_t t0 = bench_now();
    for (unsigned long i = 0; i < MUTEX_PAIRS; i++) {
        pthread_mutex_lock(&m);
        __asm__ volatile("" ::: "memory"); /* keep the pair from being merged */
        pthread_mutex_unlock(&m);
    }
    uint64_t t1 = bench_now();
    pthread_mutex_destroy(&m);
    return (double)(t1 - t0) / (double)MUTEX_PAIRS;
}

/* ------------------------------------------------------------ one-way wake */

typedef struct waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, stop; /* under mu */
    atomic_ullong stamp;
    atomic_int flag;
} waker;

static void *sleeper_main(void *arg) {
    waker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        w->pending = 0;
        pthread_mutex_unlock(&w->mu);
        atomic_store_explicit(&w->stamp, bench_now(), memory_order_relaxed);
        /* release: the stamp is visible to whoever sees the flag */
        atomic_store_explicit(&w->flag, 1, memory_order_release);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int wake_latency(const bench_opts *o, unsigned round) {
    waker w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper_main, &w) != 0) {
        fprintf(stderr, "tp_bench: pthread_create failed\n");
        return -1;
    }
    for (long s = -WAKE_WARMUP; s < (long)o->samples; s++) {
        atomic_store_explicit(&w.flag, 0, memory_order_relaxed);
        bench_sleep_ns(o->gap_ns);
        uint64_t ts = bench_now();
        pthread_mutex_lock(&w.mu);
        w.pending = 1;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        while (!atomic_load_explicit(&w.flag, memory_order_acquire)) sched_yield();
        uint64_t st = atomic_load_explicit(&w.stamp, memory_order_relaxed);
        if (s >= 0) g_wake_lat[s] = st > ts ? st - ts : 0;
    }
    pthread_mutex_lock(&w.mu);
    w.stop = 1;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(t, NULL);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);

    bench_sort(g_wake_lat, o->samples);
    bench_record(round, "limits", "", "wake p50 ns", (double)bench_pct(g_wake_lat, o->samples, 50), NULL);
    bench_record(round, "limits", "", "wake p99 ns", (double)bench_pct(g_wake_lat, o->samples, 99), NULL);
    return 0;
}

/* ------------------------------------------------------------ bare ring */

static void ring_push(ring *r, void *d) {
    pthread_mutex_lock(&r->mu);
    while (r->count == r->cap) {
        r->wait_full++;
        pthread_cond_wait(&r->not_full, &r->mu);
        r->wait_full--;
    }
    r->buf[r->tail] = d;
    r->tail = r->tail + 1 == r->cap ? 0 : r->tail + 1;
    r->count++;
    if (r->wait_empty) pthread_cond_signal(&r->not_empty);
    pthread_mutex_unlock(&r->mu);
}

static void *ring_pop(ring *r) {
    pthread_mutex_lock(&r->mu);
    while (r->count == 0) {
        r->wait_empty++;
        pthread_cond_wait(&r->not_empty, &r->mu);
        r->wait_empty--;
    }
    void *d = r->buf[r->head];
    r->head = r->head + 1 == r->cap ? 0 : r->head + 1;
    r->count--;
    if (r->wait_full) pthread_cond_signal(&r->not_full);
    pthread_mutex_unlock(&r->mu);
    return d;
}

static void *consumer_main(void *arg) {
    consumer *c = arg;
    uintptr_t sum = 0;
    for (unsigned long i = 0; i < c->items; i++) sum += (uintptr_t)ring_pop(c->r);
    c->sum = sum;
    return NULL;
}

/* One producer hands --tasks items to `nc` consumers (1..TP_MAX_WORKERS; the
 * consumers' records live in g_consumers) through the bare ring; records
 * `name` in ns per item. The consumers' shares add up to the items, and the
 * sum of what they took proves every item arrived once. */
static int ring_handoff(const bench_opts *o, unsigned round, unsigned nc, const char *name) {
    ring r = {
        .mu = PTHREAD_MUTEX_INITIALIZER,
        .not_empty = PTHREAD_COND_INITIALIZER,
        .not_full = PTHREAD_COND_INITIALIZER,
        .buf = g_ring_buf,
        .cap = o->queue,
        .items = o->tasks,
    };
    unsigned started = 0;
    for (; started < nc; started++) {
        consumer *c = &g_consumers[started];
        *c = (consumer){.r = &r, .items = r.items / nc + (started < r.items % nc ? 1 : 0)};
        if (pthread_create(&c->thread, NULL, consumer_main, c) != 0) break;
    }
    unsigned long items = r.items;
    if (started < nc) {
        fprintf(stderr, "tp_bench: pthread_create failed\n");
        /* Hand over only what the started consumers take, then give up. */
        items = 0;
        for (unsigned i = 0; i < started; i++) items += g_consumers[i].items;
    }
    uint64_t t0 = bench_now();
    for (unsigned long i = 0; i < items; i++) ring_push(&r, (void *)(uintptr_t)(i + 1));
    uintptr_t sum = 0;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(g_consumers[i].thread, NULL);
        sum += g_consumers[i].sum;
    }
    uint64_t t1 = bench_now();
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.not_empty);
    pthread_cond_destroy(&r.not_full);
    if (started < nc) return -1;
    /* 1 + 2 + ... + items */
    unsigned long n = r.items;
    uintptr_t want = (uintptr_t)(n / 2 * (n + 1) + (n % 2 ? (n + 1) / 2 : 0));
    if (sum != want) {
        fprintf(stderr, "tp_bench: the bare ring lost items\n");
        return -1;
    }
    bench_record(round, "limits", "", name, (double)(t1 - t0) / (double)r.items, NULL);
    return 0;
}

int limits_round(const bench_opts *o, unsigned round) {
    bench_record(round, "limits", "", "mutex pair ns", mutex_pair_ns(), NULL);
    if (wake_latency(o, round) != 0) return -1;
    if (ring_handoff(o, round, 1, "ring ns/item") != 0) return -1;
    return o->workers > 1 ? ring_handoff(o, round, o->workers, "ring 1:W ns/item") : 0;
}
