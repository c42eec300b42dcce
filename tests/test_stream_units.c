/*
 * test_stream_units.c -- the stream worker's two thread-free parts, without
 * Redis (the worker itself is tested as a process: tests/stream/):
 *   - the timer heap (examples/stream/timers.h): bounds, order (due time,
 *     then arrival), the id index, flags, and a model check of random
 *     operations against a plain array;
 *   - the delivery-count rules (examples/stream/counts.h): every row of its
 *     table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "counts.h"
#include "timers.h"

/* A flag bit the consumer does not use: the heap keeps any bits it is given. */
#define FLAG_OTHER 2u

/* ------------------------------------------------------------ timer heap */

static int add(tps_sched *s, const char *id, uint64_t due, unsigned deliveries, unsigned flags) {
    return tps_sched_add(s, id, strlen(id), due, deliveries, flags);
}

/* Pops the next entry due at `now` and checks its id; returns its deliveries. */
static unsigned pop_expect(tps_sched *s, uint64_t now, const char *want) {
    char id[TPS_SCHED_ID_MAX + 1];
    size_t len = 0;
    uint64_t due = 0;
    unsigned d = 0, fl = 0;
    assert_int_equal(tps_sched_pop(s, now, id, &len, &due, &d, &fl), 1);
    assert_string_equal(id, want);
    assert_int_equal(len, strlen(want));
    assert_true(due <= now);
    return d;
}

static void test_heap_bounds(void **state) {
    (void)state;
    tps_sched *s = tps_sched_create(3);
    assert_non_null(s);
    assert_int_equal(tps_sched_room(s), 3);
    assert_int_equal(tps_sched_next(s), UINT64_MAX);
    assert_int_equal(add(s, "1-0", 10, 0, 0), 0);
    assert_int_equal(add(s, "2-0", 20, 0, 0), 0);
    assert_int_equal(add(s, "1-0", 5, 7, 0), 1); /* held already: nothing changes */
    assert_int_equal(tps_sched_next(s), 10);
    assert_int_equal(add(s, "3-0", 30, 0, 0), 0);
    assert_int_equal(tps_sched_room(s), 0);
    assert_int_equal(add(s, "4-0", 1, 0, 0), -1); /* full */
    assert_false(tps_sched_has(s, "4-0", 3));
    char longid[TPS_SCHED_ID_MAX + 2];
    memset(longid, '7', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    assert_int_equal(tps_sched_remove(s, "2-0", 3), 1);
    assert_int_equal(add(s, longid, 1, 0, 0), -1); /* too long for the index */
    assert_int_equal(tps_sched_add(s, "", 0, 1, 0, 0), -1);
    assert_false(tps_sched_has(s, longid, strlen(longid)));
    unsigned d = 9, fl = 9;
    assert_int_equal(tps_sched_get(s, longid, strlen(longid), &d, &fl), 0);
    assert_int_equal(tps_sched_count(s), 2);
    tps_sched_clear(s);
    assert_int_equal(tps_sched_count(s), 0);
    assert_int_equal(tps_sched_room(s), 3);
    assert_false(tps_sched_has(s, "1-0", 3));
    tps_sched_destroy(s);
    tps_sched_destroy(NULL);
}

static void test_heap_order(void **state) {
    (void)state;
    tps_sched *s = tps_sched_create(8);
    assert_non_null(s);
    assert_int_equal(add(s, "c", 300, 3, 0), 0);
    assert_int_equal(add(s, "a", 100, 1, 0), 0);
    assert_int_equal(add(s, "b1", 200, 21, 0), 0);
    assert_int_equal(add(s, "b2", 200, 22, 0), 0); /* same time: after b1, its elder */
    assert_int_equal(add(s, "b0", 200, 20, 0), 0);
    char id[TPS_SCHED_ID_MAX + 1];
    size_t len;
    uint64_t due;
    unsigned d, fl;
    assert_int_equal(tps_sched_pop(s, 99, id, &len, &due, &d, &fl), 0); /* nothing due */
    assert_int_equal(pop_expect(s, 100, "a"), 1);
    assert_int_equal(tps_sched_pop(s, 199, id, &len, &due, &d, &fl), 0);
    assert_int_equal(pop_expect(s, 1000, "b1"), 21);
    assert_int_equal(pop_expect(s, 1000, "b2"), 22);
    assert_int_equal(pop_expect(s, 1000, "b0"), 20);
    assert_int_equal(pop_expect(s, 1000, "c"), 3);
    assert_int_equal(tps_sched_pop(s, UINT64_MAX, id, &len, &due, &d, &fl), 0);
    tps_sched_destroy(s);
}

static void test_heap_flags_and_mark(void **state) {
    (void)state;
    tps_sched *s = tps_sched_create(4);
    assert_non_null(s);
    assert_int_equal(add(s, "x", 500, 2, TPS_SCHED_LOWER), 0);
    assert_int_equal(add(s, "y", 400, 0, 0), 0);
    unsigned d = 0, fl = 0;
    assert_int_equal(tps_sched_get(s, "x", 1, &d, &fl), 1);
    assert_int_equal(d, 2);
    assert_int_equal(fl, TPS_SCHED_LOWER);
    /* set RAISED, clear LOWER, due time kept */
    assert_int_equal(tps_sched_mark(s, "x", 1, TPS_SCHED_RAISED, TPS_SCHED_LOWER, UINT64_MAX), 1);
    assert_int_equal(tps_sched_get(s, "x", 1, &d, &fl), 1);
    assert_int_equal(fl, TPS_SCHED_RAISED);
    assert_int_equal(tps_sched_next(s), 400);
    /* a later due_at_most changes nothing; an earlier one brings it first */
    assert_int_equal(tps_sched_mark(s, "x", 1, 0, 0, 600), 1);
    assert_int_equal(tps_sched_next(s), 400);
    assert_int_equal(tps_sched_mark(s, "x", 1, FLAG_OTHER, TPS_SCHED_RAISED, 50), 1);
    assert_int_equal(tps_sched_next(s), 50);
    assert_int_equal(tps_sched_mark(s, "z", 1, FLAG_OTHER, 0, 1), 0); /* not held */
    /* the flags of every held id, in tps_sched_id's order */
    unsigned seen = 0;
    for (uint32_t i = 0; i < tps_sched_count(s); i++) {
        size_t len;
        const char *id = tps_sched_id(s, i, &len, &d);
        if (len == 1 && id[0] == 'x') {
            assert_int_equal(tps_sched_flags(s, i), FLAG_OTHER);
            assert_int_equal(d, 2);
            seen |= 1;
        } else {
            assert_int_equal(len, 1);
            assert_int_equal(id[0], 'y');
            assert_int_equal(tps_sched_flags(s, i), 0);
            seen |= 2;
        }
    }
    assert_int_equal(seen, 3);
    assert_int_equal(tps_sched_mark(s, "y", 1, TPS_SCHED_RAISED | TPS_SCHED_LOWER, 0, UINT64_MAX), 1);
    tps_sched_unflag(s, TPS_SCHED_LOWER);
    assert_int_equal(tps_sched_get(s, "y", 1, &d, &fl), 1);
    assert_int_equal(fl, TPS_SCHED_RAISED);
    assert_int_equal(tps_sched_get(s, "x", 1, &d, &fl), 1);
    assert_int_equal(fl, FLAG_OTHER);
    assert_int_equal(pop_expect(s, 60, "x"), 2);
    tps_sched_destroy(s);
}

/* Random operations on the heap and on a plain array that does the same
 * the slow way; after each, both agree on every id, count and the next due
 * time, and pops come in the same order. Ids collide in the index's hash
 * (a small table, many ids), so removals exercise its backward shift. */
typedef struct model_ent {
    int used;
    uint64_t due, seq;
    unsigned deliveries, flags;
} model_ent;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64*: a fixed sequence */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

#define MODEL_IDS 96
#define MODEL_CAP 40

static void model_id(unsigned k, char *buf) { snprintf(buf, 24, "%u-%u", 1700000000u + k * 7u, k % 3u); }

static int model_first(const model_ent *m) {
    int best = -1;
    for (int k = 0; k < MODEL_IDS; k++)
        if (m[k].used &&
            (best < 0 || m[k].due < m[best].due || (m[k].due == m[best].due && m[k].seq < m[best].seq)))
            best = k;
    return best;
}

static void test_heap_model(void **state) {
    (void)state;
    tps_sched *s = tps_sched_create(MODEL_CAP);
    assert_non_null(s);
    model_ent m[MODEL_IDS];
    memset(m, 0, sizeof m);
    uint64_t seq = 0;
    unsigned n = 0, pops = 0, fulls = 0;
    char id[24];
    for (int step = 0; step < 200000; step++) {
        unsigned k = (unsigned)(rnd() % MODEL_IDS), op = (unsigned)(rnd() % 100);
        model_id(k, id);
        size_t len = strlen(id);
        if (op < 40) { /* add */
            uint64_t due = rnd() % 64;
            unsigned d = (unsigned)(rnd() % 5), fl = (unsigned)(rnd() % 16);
            int rc = tps_sched_add(s, id, len, due, d, fl);
            if (m[k].used) {
                assert_int_equal(rc, 1);
            } else if (n == MODEL_CAP) {
                assert_int_equal(rc, -1);
                fulls++;
            } else {
                assert_int_equal(rc, 0);
                m[k] = (model_ent){1, due, seq++, d, fl};
                n++;
            }
        } else if (op < 55) { /* remove */
            assert_int_equal(tps_sched_remove(s, id, len), m[k].used);
            if (m[k].used) n--;
            m[k].used = 0;
        } else if (op < 70) { /* mark */
            unsigned set = (unsigned)(rnd() % 16), clear = (unsigned)(rnd() % 16);
            uint64_t at_most = rnd() % 2 ? UINT64_MAX : rnd() % 64;
            assert_int_equal(tps_sched_mark(s, id, len, set, clear, at_most), m[k].used);
            if (m[k].used) {
                m[k].flags = (m[k].flags | set) & ~clear;
                if (at_most < m[k].due) m[k].due = at_most;
            }
        } else if (op < 72) { /* unflag one flag everywhere */
            unsigned f = 1u << (rnd() % 4);
            tps_sched_unflag(s, f);
            for (int j = 0; j < MODEL_IDS; j++) m[j].flags &= ~f;
        } else { /* pop at a random time */
            uint64_t now = rnd() % 64;
            int want = model_first(m);
            char got[TPS_SCHED_ID_MAX + 1];
            size_t glen;
            uint64_t gdue;
            unsigned gd, gfl;
            int rc = tps_sched_pop(s, now, got, &glen, &gdue, &gd, &gfl);
            if (want < 0 || m[want].due > now) {
                assert_int_equal(rc, 0);
            } else {
                char wid[24];
                model_id((unsigned)want, wid);
                assert_int_equal(rc, 1);
                assert_string_equal(got, wid);
                assert_int_equal(glen, strlen(wid));
                assert_int_equal(gdue, m[want].due);
                assert_int_equal(gd, m[want].deliveries);
                assert_int_equal(gfl, m[want].flags);
                m[want].used = 0;
                n--;
                pops++;
            }
        }
        /* both agree */
        assert_int_equal(tps_sched_count(s), n);
        assert_int_equal(tps_sched_room(s), MODEL_CAP - n);
        int first = model_first(m);
        assert_int_equal(tps_sched_next(s), first < 0 ? UINT64_MAX : m[first].due);
        if (step % 97 == 0) {
            for (unsigned j = 0; j < MODEL_IDS; j++) {
                model_id(j, id);
                unsigned d = 0, fl = 0;
                int has = tps_sched_get(s, id, strlen(id), &d, &fl);
                assert_int_equal(has, m[j].used);
                assert_int_equal(tps_sched_has(s, id, strlen(id)), m[j].used);
                if (has) {
                    assert_int_equal(d, m[j].deliveries);
                    assert_int_equal(fl, m[j].flags);
                }
            }
        }
    }
    /* the run went through every kind of state */
    assert_true(pops > 1000);
    assert_true(fulls > 0);
    tps_sched_destroy(s);
}

/* ------------------------------------------------------------ delivery counts */

static tps_admit_plan plan(tps_from from, unsigned deliveries, int malformed, int stopping, int not_due,
                           int due_guess, unsigned max) {
    tps_admit_in in = {.from = from,
                       .deliveries = deliveries,
                       .malformed = malformed,
                       .stopping = stopping,
                       .not_due = not_due,
                       .due_guess = due_guess};
    return tps_counts_admit(&in, max);
}

/* Rows "read, due now" and "read, not due". */
static void test_counts_read(void **state) {
    (void)state;
    tps_admit_plan p = plan(TPS_FROM_READ, 1, 0, 0, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_RUN);
    assert_int_equal(p.deliveries, 1);
    assert_false(p.set_back);
    p = plan(TPS_FROM_READ, 1, 0, 0, 1, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    assert_int_equal(p.deliveries, 1);
    assert_false(p.set_back); /* lowered later, in a batch (LOWER) */
    assert_int_equal(p.heap_runs, 0);
    assert_int_equal(p.heap_flags, TPS_SCHED_LOWER);
    assert_false(p.set_back_if_full);
    /* a read time guess is still a read: its one delivery is lowered */
    p = plan(TPS_FROM_READ, 1, 0, 0, 1, 1, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    assert_int_equal(p.heap_runs, 0);
    assert_int_equal(p.heap_flags, TPS_SCHED_LOWER);
    /* malformed: dead, and never set back */
    p = plan(TPS_FROM_READ, 1, 1, 0, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_MALFORMED);
    assert_false(p.set_back);
    /* read while stopping: released unrun, its delivery given back when it
     * is let go (not now: a read may come inside another pipeline) */
    p = plan(TPS_FROM_READ, 1, 0, 1, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_RELEASE);
    assert_false(p.set_back);
    assert_true(p.let_go_back);
    assert_int_equal(p.deliveries, 1);
    /* so is an entry that came due (its run was counted before admit) */
    p = plan(TPS_FROM_DUE, 3, 0, 1, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_RELEASE);
    assert_false(p.set_back);
    assert_true(p.let_go_back);
}

/* Rows "claimed, due now", "claimed, not due" (known and guessed time),
 * "claimed while stopping", and the count judged. */
static void test_counts_claim(void **state) {
    (void)state;
    assert_int_equal(tps_counts_claimed(3), 3);
    assert_int_equal(tps_counts_claimed(0), 2); /* not listed: at least the second delivery */
    tps_admit_plan p = plan(TPS_FROM_CLAIM, 3, 0, 0, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_RUN);
    assert_int_equal(p.deliveries, 3);
    assert_false(p.set_back);
    /* known time later: this claim was no run */
    p = plan(TPS_FROM_CLAIM, 3, 0, 0, 1, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    assert_true(p.set_back);
    assert_int_equal(p.deliveries, 2);
    assert_int_equal(p.heap_runs, 2);
    assert_int_equal(p.heap_flags, 0);
    assert_false(p.set_back_if_full);
    /* guessed time: the claim may be its run; it stands for the coming one */
    p = plan(TPS_FROM_CLAIM, 3, 0, 0, 1, 1, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    assert_false(p.set_back);
    assert_int_equal(p.deliveries, 3);
    assert_int_equal(p.heap_runs, 2);
    assert_int_equal(p.heap_flags, TPS_SCHED_RAISED);
    assert_true(p.set_back_if_full);
    /* a stop: released, set back (with or without a time) */
    for (int nd = 0; nd <= 1; nd++) {
        p = plan(TPS_FROM_CLAIM, 4, 0, 1, nd, 0, 5);
        assert_int_equal(p.verdict, TPS_ADMIT_RELEASE);
        assert_true(p.set_back);
        assert_false(p.let_go_back); /* set back already */
        assert_int_equal(p.deliveries, 3);
    }
    /* MAX_DELIVERIES judges the count after the set-back */
    p = plan(TPS_FROM_CLAIM, 6, 0, 0, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_COUNT);
    assert_int_equal(p.deliveries, 6);
    p = plan(TPS_FROM_CLAIM, 6, 0, 0, 1, 0, 5); /* not due: 5 runs so far, it may wait */
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    assert_int_equal(p.deliveries, 5);
    assert_int_equal(p.heap_runs, 5);
    p = plan(TPS_FROM_CLAIM, 6, 0, 0, 1, 1, 5); /* guessed: the claim counts, dead */
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_COUNT);
    assert_false(p.set_back);
    p = plan(TPS_FROM_CLAIM, 7, 0, 1, 0, 0, 5); /* a stop does not save a poison entry */
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_COUNT);
    assert_int_equal(p.deliveries, 6);
    assert_true(p.set_back);
    /* the count is checked before the fields */
    p = plan(TPS_FROM_CLAIM, 9, 1, 0, 0, 0, 5);
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_COUNT);
    assert_false(p.set_back);
    p = plan(TPS_FROM_CLAIM, 2, 1, 1, 0, 0, 5); /* malformed while stopping: dead, not set back */
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_MALFORMED);
    assert_false(p.set_back);
    /* a count of 0 (cannot come from tps_counts_claimed) never wraps */
    p = plan(TPS_FROM_CLAIM, 0, 0, 1, 0, 0, 5);
    assert_false(p.set_back);
    assert_int_equal(p.deliveries, 0);
}

/* Rows "waiting, comes due", "claimed, held here already", "held unrun at
 * a stop", and a whole stay: read, wait, claimed by a successor, due. */
static void test_counts_due_and_back(void **state) {
    (void)state;
    int set = -1;
    assert_int_equal(tps_counts_due(0, 0, &set), 1);
    assert_true(set);
    assert_int_equal(tps_counts_due(0, TPS_SCHED_LOWER, &set), 1); /* Redis shows the read's 1 still */
    assert_false(set);
    assert_int_equal(tps_counts_due(2, TPS_SCHED_RAISED, &set), 3);
    assert_false(set);
    assert_int_equal(tps_counts_due(2, FLAG_OTHER, &set), 3);
    assert_true(set);
    assert_int_equal(tps_counts_put_back(0, TPS_SCHED_LOWER), 0);
    assert_int_equal(tps_counts_put_back(2, 0), 2);
    assert_int_equal(tps_counts_put_back(2, TPS_SCHED_RAISED), 3);
    assert_int_equal(tps_counts_given_back(1), 0);
    assert_int_equal(tps_counts_given_back(4), 3);
    assert_int_equal(tps_counts_given_back(0), 0);

    /* A stay with MAX_DELIVERIES 1: read before its time, the worker
     * restarted three times before it (a successor claims it each time,
     * Redis's count is then 1 more than what was kept), then it runs once. */
    unsigned redis = 1; /* XREADGROUP */
    tps_admit_plan p = plan(TPS_FROM_READ, redis, 0, 0, 1, 0, 1);
    assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
    redis = p.heap_runs; /* lower_waiting */
    for (int restart = 0; restart < 3; restart++) {
        redis++; /* XAUTOCLAIM */
        p = plan(TPS_FROM_CLAIM, tps_counts_claimed(redis), 0, 0, 1, 0, 1);
        assert_int_equal(p.verdict, TPS_ADMIT_WAIT);
        assert_true(p.set_back);
        redis = p.deliveries;
        assert_int_equal(redis, 0);
    }
    unsigned runs = tps_counts_due(p.heap_runs, p.heap_flags, &set);
    assert_true(set);
    redis = runs;
    p = plan(TPS_FROM_DUE, redis, 0, 0, 0, 0, 1);
    assert_int_equal(p.verdict, TPS_ADMIT_RUN);
    assert_int_equal(p.deliveries, 1);
    /* it crashed its worker: claimed again, it is judged 2 > 1 */
    p = plan(TPS_FROM_CLAIM, tps_counts_claimed(redis + 1), 0, 0, 0, 0, 1);
    assert_int_equal(p.verdict, TPS_ADMIT_DEAD_COUNT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heap_bounds),         cmocka_unit_test(test_heap_order),
        cmocka_unit_test(test_heap_flags_and_mark), cmocka_unit_test(test_heap_model),
        cmocka_unit_test(test_counts_read),         cmocka_unit_test(test_counts_claim),
        cmocka_unit_test(test_counts_due_and_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
