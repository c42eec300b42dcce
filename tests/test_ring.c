/*
 * test_ring.c -- the bounded FIFO ring, the task records and their id index:
 * data structures that need no threads, tested without them.
 */
#include "pool.h" /* first: it defines _GNU_SOURCE */
#include "tp_test.h"

static void test_ring_fifo_and_wrap(void **state) {
    (void)state;
    tp__ring r;
    void *raw;
    assert_int_equal(tp__ring_init(&r, 5, &raw), 0);
    assert_int_equal(r.mask + 1, 8); /* rounded up to a power of two */
    tp__task t[8];
    /* Free-running counters close to wrap-around: len and order stay right. */
    r.head = r.tail = UINT32_MAX - 3;
    for (uint32_t round = 0; round < 5; round++) {
        for (int i = 0; i < 8; i++) tp__ring_push(&r, &t[i]);
        assert_int_equal(tp__ring_len(&r), 8);
        for (int i = 0; i < 8; i++) assert_ptr_equal(tp__ring_pop(&r), &t[i]);
        assert_int_equal(tp__ring_len(&r), 0);
    }
    tp__ring_fini(&r, raw);
}

static void test_ring_remove_keeps_order(void **state) {
    (void)state;
    tp__ring r;
    void *raw;
    assert_int_equal(tp__ring_init(&r, 8, &raw), 0);
    r.head = r.tail = UINT32_MAX - 1; /* removal across the wrap */
    tp__task t[6];
    for (int i = 0; i < 6; i++) tp__ring_push(&r, &t[i]);
    assert_int_equal(tp__ring_remove(&r, &t[2]), 1);
    assert_int_equal(tp__ring_remove(&r, &t[5]), 1); /* the tail */
    assert_int_equal(tp__ring_remove(&r, &t[0]), 1); /* the head */
    assert_int_equal(tp__ring_remove(&r, &t[2]), 0); /* gone */
    assert_int_equal(tp__ring_len(&r), 3);
    assert_ptr_equal(tp__ring_at(&r, 0), &t[1]);
    assert_ptr_equal(tp__ring_pop(&r), &t[1]);
    assert_ptr_equal(tp__ring_pop(&r), &t[3]);
    assert_ptr_equal(tp__ring_pop(&r), &t[4]);
    assert_int_equal(tp__ring_len(&r), 0);
    tp__ring_fini(&r, raw);
}

/* Removal from every position of rings of every length up to 9, across the
 * wrap, against a plain array model: order kept, positions right (a second
 * removal of each remaining task still finds it). */
static void test_ring_remove_every_position(void **state) {
    (void)state;
    tp__task t[9];
    for (uint32_t len = 1; len <= 9; len++) {
        for (uint32_t victim = 0; victim < len; victim++) {
            for (uint32_t s = 0; s < 8; s++) {
                uint32_t start = UINT32_MAX - 10 + 3 * s; /* wraps past 0 */
                tp__ring r;
                void *raw;
                assert_int_equal(tp__ring_init(&r, 9, &raw), 0);
                r.head = r.tail = start;
                for (uint32_t i = 0; i < len; i++) tp__ring_push(&r, &t[i]);
                assert_int_equal(tp__ring_remove(&r, &t[victim]), 1);
                assert_int_equal(tp__ring_remove(&r, &t[victim]), 0);
                assert_int_equal(tp__ring_len(&r), len - 1);
                uint32_t k = 0;
                for (uint32_t i = 0; i < len; i++) {
                    if (i == victim) continue;
                    assert_ptr_equal(tp__ring_at(&r, k), &t[i]);
                    assert_int_equal(t[i].ring_pos, r.head + k);
                    k++;
                }
                /* Remove the rest from the middle outwards: each is found. */
                while (tp__ring_len(&r) > 0) {
                    tp__task *m = tp__ring_at(&r, tp__ring_len(&r) / 2);
                    assert_int_equal(tp__ring_remove(&r, m), 1);
                }
                tp__ring_fini(&r, raw);
            }
        }
    }
}

static void test_tasks_index_and_growth(void **state) {
    (void)state;
    tp__tasks ts;
    tp__task *given = NULL; /* the retiring side's list */
    assert_int_equal(tp__tasks_init(&ts, 4, 0, 2), 0);
    tp__tasks_index_all(&ts); /* kept from the start: every record is free */
    assert_true(ts.indexed);
    unsigned first_total = ts.total;
    enum { N = 1000 };
    tp__task *got[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &got[i]), TP_OK);
        assert_non_null(got[i]);
        got[i]->id = (uint64_t)i + 1;
        tp__tasks_index(&ts, got[i]);
    }
    assert_true(ts.total >= N && ts.total > first_total); /* grew in chunks */
    for (int i = 0; i < N; i++) assert_ptr_equal(tp__tasks_find(&ts, (uint64_t)i + 1), got[i]);
    assert_null(tp__tasks_find(&ts, N + 1));
    for (int i = 0; i < N; i += 2) tp__tasks_unindex(&ts, got[i]);
    for (int i = 0; i < N; i++) {
        if (i % 2 == 0)
            assert_null(tp__tasks_find(&ts, (uint64_t)i + 1));
        else
            assert_ptr_equal(tp__tasks_find(&ts, (uint64_t)i + 1), got[i]);
    }
    /* A record put back stays findable under its id (its task has ended: the
     * caller checks the state) until it is taken again, which takes it out
     * of the index. */
    for (int i = 1; i < N; i += 2) tp__tasks_put(&ts, got[i]);
    for (int i = 1; i < N; i += 2) assert_ptr_equal(tp__tasks_find(&ts, (uint64_t)i + 1), got[i]);
    for (int i = 1; i < N; i += 2) assert_int_equal(tp__tasks_get(&ts, &given, 100000, &got[i]), TP_OK);
    for (int i = 0; i < N; i++) assert_null(tp__tasks_find(&ts, (uint64_t)i + 1));
    /* Records come back from the free lists: no growth in steady state.
     * Retired ones (given) are taken over once admission's own list is dry,
     * and given records keep their ids in the index until taken again. */
    unsigned total = ts.total;
    for (int round = 0; round < 10; round++) {
        if (round % 2)
            for (int i = 0; i < N; i++) tp__tasks_put(&ts, got[i]);
        else
            for (int i = 0; i < N; i++) {
                got[i]->id = (uint64_t)(round * N + i + 1);
                tp__tasks_index(&ts, got[i]);
                tp__tasks_give(&given, got[i]);
                assert_int_equal(got[i]->state, TP__FREE);
            }
        for (int i = 0; i < N; i++) assert_int_equal(tp__tasks_get(&ts, &given, 100000, &got[i]), TP_OK);
        for (int i = 0; i < N; i++) assert_int_equal(got[i]->id, 0); /* out of the index */
    }
    assert_int_equal(ts.total, total);
    tp__tasks_fini(&ts);
}

/* The id index is kept from a pool's first cancel by id: until then
 * admission indexes nothing, and tp__tasks_index_all then indexes exactly the
 * records in use -- not the free ones (put back, or retired onto the given
 * list), whose ids become 0, and not a grown chunk's records never handed
 * out (uninitialised memory: AddressSanitizer and valgrind would see a read
 * of them). After it, records move in and out of the index as usual. */
static void test_tasks_index_all(void **state) {
    (void)state;
    tp__tasks ts;
    tp__task *given = NULL;
    assert_int_equal(tp__tasks_init(&ts, 8, 0, 2), 0);
    assert_false(ts.indexed);
    enum { N = 300 };
    tp__task *got[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &got[i]), TP_OK);
        got[i]->id = (uint64_t)i + 1; /* as admission does; not indexed */
        got[i]->state = TP__QUEUED;
    }
    assert_true(ts.fresh < ts.fresh_end); /* a grown chunk with records never handed out */
    for (int i = 0; i < N; i += 3) tp__tasks_put(&ts, got[i]);     /* free: admission's list */
    for (int i = 1; i < N; i += 3) tp__tasks_give(&given, got[i]); /* free: retired */
    for (int i = 2; i < N; i += 3) got[i]->state = i % 2 ? TP__RUNNING : TP__DONE; /* in use */
    tp__tasks_index_all(&ts);
    assert_true(ts.indexed);
    for (int i = 0; i < N; i++) {
        if (i % 3 == 2) {
            assert_ptr_equal(tp__tasks_find(&ts, (uint64_t)i + 1), got[i]);
        } else {
            assert_null(tp__tasks_find(&ts, (uint64_t)i + 1));
            assert_int_equal(got[i]->id, 0);
        }
    }
    /* from now on: in at admission, out when taken again */
    tp__task *t = NULL;
    for (int k = 0; k < 2 * N; k++) {
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &t), TP_OK);
        assert_int_equal(t->id, 0);
        t->id = 100000u + (uint64_t)k;
        t->state = TP__QUEUED;
        tp__tasks_index(&ts, t);
        assert_ptr_equal(tp__tasks_find(&ts, t->id), t);
    }
    for (int i = 2; i < N; i += 3) {
        tp__tasks_give(&given, got[i]); /* retired: findable until taken again */
        assert_ptr_equal(tp__tasks_find(&ts, (uint64_t)i + 1), got[i]);
    }
    /* take records until every one of them has come back (admission's own
     * list first, then the given list, taken over whole) */
    int left = N / 3;
    for (int guard = 0; left > 0 && guard < 4 * N; guard++) {
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &t), TP_OK);
        for (int i = 2; i < N; i += 3)
            if (t == got[i]) left--;
    }
    assert_int_equal(left, 0);
    for (int i = 2; i < N; i += 3) assert_null(tp__tasks_find(&ts, (uint64_t)i + 1));
    tp__tasks_fini(&ts);
}

/* Records stop at the limit the pool sets: TP_EFULL, not more memory. */
static void test_tasks_limit(void **state) {
    (void)state;
    tp__tasks ts;
    tp__task *given = NULL;
    assert_int_equal(tp__tasks_init(&ts, 8, 0, 2), 0);
    unsigned limit = ts.total + 100;
    tp__task *t = NULL;
    for (unsigned i = 0; i < limit; i++) assert_int_equal(tp__tasks_get(&ts, &given, limit, &t), TP_OK);
    assert_int_equal(ts.total, limit);
    assert_int_equal(tp__tasks_get(&ts, &given, limit, &t), TP_EFULL);
    tp__tasks_put(&ts, t);
    assert_int_equal(tp__tasks_get(&ts, &given, limit, &t), TP_OK);
    /* a retired record is what the next admission at the limit gets */
    tp__task *back = t;
    tp__tasks_give(&given, t);
    assert_int_equal(tp__tasks_get(&ts, &given, limit, &t), TP_OK);
    assert_ptr_equal(t, back);
    assert_null(given);
    assert_int_equal(tp__tasks_get(&ts, &given, limit, &t), TP_EFULL);
    assert_int_equal(ts.total, limit);
    tp__tasks_fini(&ts);
}

/* Every record, made at create or handed out later from a grown chunk, has a
 * log id buffer of its own, TP__LOG_BUF bytes long: fill them all to the
 * brim, then read them all back (AddressSanitizer sees an overrun). */
static void test_tasks_log_buffers(void **state) {
    (void)state;
    tp__tasks ts;
    tp__task *given = NULL;
    assert_int_equal(tp__tasks_init(&ts, 8, 0, 2), 0);
    enum { N = 600 };
    tp__task *got[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &got[i]), TP_OK);
        assert_non_null(got[i]->log_id);
        memset(got[i]->log_id, 'a' + i % 26, TP__LOG_BUF - 1);
        got[i]->log_id[TP__LOG_BUF - 1] = '\0';
    }
    assert_true(ts.total >= N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(strlen(got[i]->log_id), TP__LOG_BUF - 1);
        for (int k = 0; k < TP__LOG_BUF - 1; k++) assert_int_equal(got[i]->log_id[k], 'a' + i % 26);
    }
    /* given back and taken again: the same buffers */
    for (int i = 0; i < N; i++) tp__tasks_give(&given, got[i]);
    for (int i = 0; i < N; i++) {
        tp__task *t = NULL;
        assert_int_equal(tp__tasks_get(&ts, &given, 100000, &t), TP_OK);
        assert_non_null(t->log_id);
    }
    tp__tasks_fini(&ts);
}

/* The pool's hot structures sit on cache-line boundaries, as their layout
 * comments assume: the pool itself, each worker slot, the scheduler and
 * each of its lanes, the retiring side's line. */
static void test_layout_on_cache_lines(void **state) {
    (void)state;
    for (int fair = 0; fair < 2; fair++) {
        for (int round = 0; round < 8; round++) {
            tp_config cfg = {0};
            cfg.workers = 1 + (unsigned)round % 3;
            cfg.max_workers = cfg.workers + 2;
            cfg.queue_capacity = 16;
            cfg.sched = fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
            tp_pool *p = NULL;
            assert_int_equal(tp_create(&p, &cfg), TP_OK);
            assert_int_equal((uintptr_t)p % 64, 0);
            assert_int_equal((uintptr_t)&p->mu % 64, 0);
            assert_int_equal((uintptr_t)&p->life % 64, 0);
            assert_int_equal((uintptr_t)&p->life.sched % 64, 0);
            assert_int_equal((uintptr_t)&p->life.given % 64, 0);
            for (unsigned i = 0; i < TP__LANES; i++)
                assert_int_equal((uintptr_t)&p->life.sched.lane[i] % 64, 0);
            for (unsigned i = 0; i < p->cfg.max_workers; i++) {
                assert_int_equal((uintptr_t)&p->wk.workers[i] % 64, 0);
                assert_int_equal((uintptr_t)&p->wk.runs[i] % 64, 0);
            }
            assert_int_equal(tp_shutdown(p, TP_FOREVER), TP_OK);
            tp_destroy(p);
        }
    }
}

/* Large arrays (a big queue's ring, record chunks and id index) start on a
 * 2 MiB boundary so that they can take transparent huge pages; small ones on
 * a cache line. Every byte is usable (AddressSanitizer and valgrind see an
 * overrun), the zeroed ones read zero, and a size that would overflow is
 * refused, not wrapped. */
static void test_large_arrays_start_on_a_huge_page(void **state) {
    (void)state;
    tp__ring r;
    void *ring_raw;
    assert_int_equal(tp__ring_init(&r, 1u << 18, &ring_raw), 0); /* 4 MiB of slots */
    assert_int_equal((uintptr_t)r.slots % TP__HUGE, 0);
    tp__task t[3];
    for (uint32_t i = 0; i <= r.mask; i++) assert_null(r.slots[i].t);
    for (uint32_t i = 0; i < 2 * (r.mask + 1); i++) { /* every slot written, twice round */
        tp__ring_push(&r, &t[i % 3]);
        assert_ptr_equal(tp__ring_pop(&r), &t[i % 3]);
    }
    tp__ring_fini(&r, ring_raw);
    assert_int_equal(tp__ring_init(&r, 100, &ring_raw), 0);
    assert_int_equal((uintptr_t)r.slots % 64, 0);
    tp__ring_fini(&r, ring_raw);

    void *raw = &raw;
    assert_null(tp__calloc_big(SIZE_MAX / 2, 4, &raw));
    assert_null(raw);
    tp__chunk *list = NULL;
    void *items = NULL;
    assert_null(tp__chunk_new(&list, SIZE_MAX / 2, 4, 64, &items));
    assert_null(list);
    const size_t big = 3 * TP__HUGE / 256 + 7; /* items of 256 bytes: a little over 3 MiB */
    assert_non_null(tp__chunk_new(&list, big, 256, 64, &items));
    assert_int_equal((uintptr_t)items % TP__HUGE, 0);
    memset(items, 0xa5, big * 256);
    assert_non_null(tp__chunk_new(&list, 10, 256, 64, &items));
    assert_int_equal((uintptr_t)items % 64, 0);
    memset(items, 0x5a, 10 * 256);
    tp__chunks_free(&list);
    assert_null(list);

    /* a pool's records and id index: made at init, large */
    tp__tasks ts;
    assert_int_equal(tp__tasks_init(&ts, 20000, 1u << 19, 2), 0);
    assert_int_equal((uintptr_t)ts.chunks->items % TP__HUGE, 0);
    assert_int_equal((uintptr_t)ts.index % TP__HUGE, 0);
    for (uint32_t b = 0; b <= ts.index_mask; b++) assert_null(ts.index[b]);
    tp__task *given = NULL, *got = NULL;
    for (int i = 0; i < 20000; i++) assert_int_equal(tp__tasks_get(&ts, &given, 40000, &got), TP_OK);
    tp__tasks_fini(&ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_ring_fifo_and_wrap),
        TPT_TEST(test_ring_remove_keeps_order),
        TPT_TEST(test_ring_remove_every_position),
        TPT_TEST(test_tasks_index_and_growth),
        TPT_TEST(test_tasks_index_all),
        TPT_TEST(test_tasks_limit),
        TPT_TEST(test_tasks_log_buffers),
        TPT_TEST(test_layout_on_cache_lines),
        TPT_TEST(test_large_arrays_start_on_a_huge_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
