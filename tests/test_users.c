/*
 * test_users.c -- the per-user slot table: counting, lookup
 * by exact name, idle entries (a user whose last slot was released keeps its
 * entry until a new user needs one), bounded memory under churn of many
 * distinct users, and the lock-free prefetch of a submitter (the one test
 * here with a second thread) while the table grows under a lock.
 */
#include "pool.h" /* first: it defines _GNU_SOURCE */
#include "tp_test.h"

static tp__user *acq(tp__users *us, const char *name) {
    size_t n = strlen(name);
    return tp__users_acquire(us, name, n, tp__users_hash(name, n));
}

static tp__user *find(tp__users *us, const char *name) {
    size_t n = strlen(name);
    return tp__users_find(us, name, n, tp__users_hash(name, n));
}

static void test_users_count_and_release(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    tp__user *a1 = acq(&us, "alice");
    tp__user *a2 = acq(&us, "alice");
    tp__user *b = acq(&us, "bob");
    assert_ptr_equal(a1, a2);
    assert_int_equal(tp__user_count(a1), 2);
    assert_int_equal(tp__user_count(b), 1);
    assert_int_equal(us.live, 2);
    assert_string_equal(a1->name, "alice");
    /* exact names only: prefixes and extensions are other users */
    assert_null(find(&us, "alic"));
    assert_null(find(&us, "alicex"));
    tp__users_release(&us, a1);
    assert_ptr_equal(find(&us, "alice"), a1);
    tp__users_release(&us, a1);
    /* idle: still found, holding nothing, not live */
    assert_ptr_equal(find(&us, "alice"), a1);
    assert_int_equal(tp__user_count(a1), 0);
    assert_int_equal(us.live, 1);
    tp__users_release(&us, b);
    assert_int_equal(us.live, 0);
    /* back again: the same entry, live again, nothing allocated */
    unsigned total = us.total;
    assert_ptr_equal(acq(&us, "alice"), a1);
    assert_int_equal(tp__user_count(a1), 1);
    assert_int_equal(us.live, 1);
    assert_int_equal(us.total, total);
    tp__users_release(&us, a1);
    assert_int_equal(us.live, 0);
    tp__users_fini(&us);
}

/* With every never-used entry taken, a new user takes over the oldest idle
 * entry (the one idle longest), not one that became live again since it
 * went idle, and the table does not grow while an idle entry exists. */
static void test_users_idle_entries_taken_over_oldest_first(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    unsigned total = us.total;
    char name[32];
    tp__user *e[64];
    for (unsigned i = 0; i < total; i++) {
        snprintf(name, sizeof name, "first-%u", i);
        e[i] = acq(&us, name);
        assert_non_null(e[i]);
    }
    assert_int_equal(us.total, total); /* every entry live, none left unused */
    for (unsigned i = 0; i < total; i++) tp__users_release(&us, e[i]); /* idle in order 0, 1, ... */
    assert_int_equal(us.live, 0);
    /* entry 0 comes back (live again while still queued), then leaves again:
     * it keeps its place at the head of the queue, but is live for now */
    assert_ptr_equal(acq(&us, "first-0"), e[0]);
    /* a new user: entry 0 is live, so entry 1 is the oldest idle one */
    tp__user *n1 = acq(&us, "new-1");
    assert_ptr_equal(n1, e[1]);
    assert_string_equal(n1->name, "new-1");
    assert_int_equal(tp__user_count(n1), 1);
    assert_null(find(&us, "first-1")); /* taken over: its old name is gone */
    assert_ptr_equal(find(&us, "first-2"), e[2]);
    assert_ptr_equal(find(&us, "first-0"), e[0]);
    assert_int_equal(us.total, total);
    /* entry 0 goes idle again: queued again, behind 2..total-1 */
    tp__users_release(&us, e[0]);
    for (unsigned i = 2; i < total; i++) {
        snprintf(name, sizeof name, "next-%u", i);
        assert_ptr_equal(acq(&us, name), e[i]);
    }
    assert_ptr_equal(acq(&us, "last"), e[0]);
    assert_int_equal(us.total, total);
    assert_int_equal(us.live, total);
    /* every entry live: the next new user grows the table */
    assert_non_null(acq(&us, "grown"));
    assert_true(us.total > total);
    assert_int_equal(us.live, total + 1);
    tp__users_fini(&us);
}

/* A fair table: an idle entry's flow is as a new one's, with the weight set
 * meanwhile (tp_user_weight_set reaches idle entries too). */
static void test_users_idle_entry_keeps_weight(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    us.flows = true;
    tp__user *a = acq(&us, "alice");
    assert_int_equal(tp__flow_weight(&a->flow), 1);
    tp__users_release(&us, a);
    assert_int_equal(tp__users_set_weight(&us, "alice", 5, tp__users_hash("alice", 5), 3), TP_OK);
    assert_ptr_equal(acq(&us, "alice"), a);
    assert_int_equal(tp__flow_weight(&a->flow), 3);
    for (unsigned i = 0; i < TP__LANES; i++) {
        assert_null(a->flow.lane_[i].head);
        assert_false(a->flow.lane_[i].in_round);
        assert_int_equal(a->flow.lane_[i].credit, 0);
    }
    tp__users_release(&us, a);
    tp__users_fini(&us);
}

static void test_users_churn_bounded(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    char name[32];
    /* 64 users live at once, 100000 distinct names over time: the table holds
     * what is live, never more than its peak. */
    tp__user *live[64] = {0};
    for (int i = 0; i < 100000; i++) {
        int slot = i % 64;
        if (live[slot]) tp__users_release(&us, live[slot]);
        snprintf(name, sizeof name, "user-%d", i);
        live[slot] = acq(&us, name);
        assert_non_null(live[slot]);
        assert_true(us.live <= 64);
    }
    unsigned peak_total = us.total;
    assert_true(peak_total < 256);
    for (int i = 0; i < 64; i++) tp__users_release(&us, live[i]);
    assert_int_equal(us.live, 0);
    /* 1000 users at once grows the table; all still found */
    static tp__user *many[1000];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "m%d", i);
        many[i] = acq(&us, name);
    }
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_ptr_equal(find(&us, name), many[i]);
    }
    for (int i = 0; i < 1000; i++) tp__users_release(&us, many[i]);
    assert_int_equal(us.live, 0);
    tp__users_fini(&us);
}

static void test_users_max_length_name(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 1), 0);
    char name[TP_USER_MAX + 1];
    memset(name, 'u', TP_USER_MAX);
    name[TP_USER_MAX] = '\0';
    tp__user *u = acq(&us, name);
    assert_non_null(u);
    assert_int_equal(strlen(u->name), TP_USER_MAX);
    tp__users_release(&us, u);
    tp__users_fini(&us);
}

/* tp__users_scan reads a submitted name once: its length up to TP_USER_MAX,
 * TP_USER_MAX + 1 for anything longer (without reading past that), and the
 * hash tp__users_hash gives. */
static void test_users_scan(void **state) {
    (void)state;
    char name[TP_USER_MAX + 8];
    uint32_t h = 0;
    assert_int_equal(tp__users_scan("alice", &h), 5);
    assert_int_equal(h, tp__users_hash("alice", 5));
    assert_int_equal(tp__users_scan("", &h), 0);
    assert_int_equal(h, tp__users_hash("", 0));
    memset(name, 'u', TP_USER_MAX);
    name[TP_USER_MAX] = '\0';
    assert_int_equal(tp__users_scan(name, &h), TP_USER_MAX);
    assert_int_equal(h, tp__users_hash(name, TP_USER_MAX));
    /* one byte too long: the scan stops at TP_USER_MAX + 1 (no terminator
     * needed after it) */
    char *tight = malloc(TP_USER_MAX + 1);
    assert_non_null(tight);
    memset(tight, 'v', TP_USER_MAX + 1);
    assert_int_equal(tp__users_scan(tight, &h), TP_USER_MAX + 1);
    free(tight);
}

/* tp__users_prefetch reads the published bucket array without the pool
 * lock, while the lock holder adds entries and doubles the array. Every
 * array it can have read stays allocated until fini (checked below through
 * the chain of kept arrays: a read of a freed one is a window of a few
 * instructions, which ASan would seldom catch), the slots it loads are
 * atomics (TSan), and the lookups under the lock stay exact across the
 * growth. The table and the thread's argument are static: a failed assert
 * leaves the thread running on them, not on a stack frame that is gone. */
typedef struct {
    tp__users *us;
    atomic_bool stop;
    atomic_ulong prefetched;
} prefetch_arg;

static void *prefetcher(void *a) {
    prefetch_arg *pa = a;
    char name[32];
    unsigned long n = 0;
    while (!atomic_load(&pa->stop)) {
        int len = snprintf(name, sizeof name, "grow-%lu", n % 5000);
        tp__users_prefetch(pa->us, tp__users_hash(name, (size_t)len));
        n++;
        if (n % 64 == 0) atomic_store(&pa->prefetched, n);
    }
    atomic_store(&pa->prefetched, n);
    return NULL;
}

static void test_users_prefetch_while_growing(void **state) {
    (void)state;
    static tp__users us;
    static prefetch_arg pa;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    assert_int_equal(tp__users_init(&us, 4), 0);
    tp__user_table *first = atomic_load(&us.tab_pub);
    pa.us = &us;
    atomic_init(&pa.stop, false);
    atomic_init(&pa.prefetched, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, prefetcher, &pa), 0);
    static tp__user *e[5000];
    char name[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "grow-%d", i);
        pthread_mutex_lock(&mu);
        e[i] = acq(&us, name);
        pthread_mutex_unlock(&mu);
        assert_non_null(e[i]);
        /* the other thread has run at least once per 500 new users (bounded wait) */
        if (i % 500 == 499) {
            unsigned long seen = atomic_load(&pa.prefetched);
            assert_true(TPT_POLL(atomic_load(&pa.prefetched) != seen, TPT_WAIT_NS));
        }
    }
    atomic_store(&pa.stop, true);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(atomic_load(&pa.prefetched) > 0);
    /* grown from 16 buckets, every array kept, the newest published */
    tp__user_table *t = us.tab;
    assert_ptr_equal(atomic_load(&us.tab_pub), t);
    assert_int_equal(t->mask + 1, 8192); /* doubled when the entries outnumber the buckets */
    unsigned arrays = 1;
    while (t->older) {
        assert_true(t->older->mask + 1 == (t->mask + 1) / 2);
        t = t->older;
        arrays++;
    }
    assert_ptr_equal(t, first);
    assert_int_equal(arrays, 10); /* 16 .. 8192 */
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "grow-%d", i);
        assert_ptr_equal(find(&us, name), e[i]);
        tp__users_prefetch(&us, tp__users_hash(name, strlen(name))); /* with the lock's owner's thread too */
        tp__users_release(&us, e[i]);
    }
    assert_int_equal(us.live, 0);
    tp__users_fini(&us); /* frees every array (LeakSanitizer, valgrind) */
    pthread_mutex_destroy(&mu);
}

/* The count is taken - released (users.h), both free-running: exact after
 * every take and give-back, across the counters' wrap-around where slots
 * come back in `released` (split: a pool that stages), and where they take
 * one from `taken`; the entry goes idle at its last slot and only then. */
static void counts_across_wrap(bool split) {
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    us.split = split;
    tp__user *u = acq(&us, "wrap");
    assert_non_null(u);
    /* split: as after 2^32 - 3 slots taken and given back, one held
     * (elsewhere `released` stays 0 and `taken` is the count: no wrap) */
    if (split) {
        atomic_store(&u->taken, UINT_MAX - 2u);
        u->released = u->taken_seen = u->rel_seen = UINT_MAX - 3u;
    }
    assert_int_equal(tp__user_count(u), 1);
    unsigned held = 1;
    /* up and down in steps, so that each side's view goes stale, to 0 and back */
    static const int steps[] = {+3, -4, +5, -2, +1, -4, +4, -4}; /* idle twice on the way */
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int n = steps[i];
        for (; n > 0; n--) {
            assert_ptr_equal(acq(&us, "wrap"), u);
            held++;
            assert_int_equal(tp__user_count(u), held);
            assert_false(tp__user_zero(&us, u));
        }
        for (; n < 0; n++) {
            tp__users_release(&us, u);
            held--;
            assert_int_equal(tp__user_count(u), held);
            assert_int_equal(tp__user_zero(&us, u), held == 0);
            assert_int_equal(us.live, held ? 1u : 0u);
            if (split) assert_true(u->taken_seen - u->released <= held); /* released <= taken_seen <= taken */
        }
        /* a bound from above, whatever the views */
        assert_true(atomic_load(&u->taken) - u->rel_seen >= held);
    }
    assert_int_equal(held, 0);
    assert_true(tp__user_zero(&us, u));
    assert_int_equal(us.live, 0);
    /* idle with wrapped counters: found again and live again */
    assert_ptr_equal(acq(&us, "wrap"), u);
    assert_int_equal(tp__user_count(u), 1);
    assert_int_equal(us.live, 1);
    tp__users_release(&us, u);
    assert_int_equal(us.live, 0);
    tp__users_fini(&us);
}

static void test_users_counts_across_wrap(void **state) {
    (void)state;
    counts_across_wrap(true);
    counts_across_wrap(false);
}

/* The two views' questions: tp__user_below answers for the count as it is
 * when its view is stale (it reads `released` afresh only when the stale
 * bound says no), and so does tp__user_holds_more with `taken`. */
static void test_users_stale_views_answer_exactly(void **state) {
    (void)state;
    tp__users us;
    assert_int_equal(tp__users_init(&us, 4), 0);
    us.split = true;
    tp__user *u = acq(&us, "v");
    for (int i = 0; i < 3; i++) assert_ptr_equal(acq(&us, "v"), u); /* holds 4 */
    assert_false(tp__user_below(u, 4, 0));                          /* at a limit of 4 */
    assert_true(tp__user_below(u, 5, 0));
    assert_false(tp__user_below(u, 5, 1)); /* one more would reach 5 */
    assert_true(tp__user_holds_more(&us, u, 3));
    assert_false(tp__user_holds_more(&us, u, 4));
    /* two come back: rel_seen is stale, and below() reads afresh */
    tp__users_release(&us, u);
    tp__users_release(&us, u);
    assert_int_equal(tp__user_count(u), 2);
    assert_true(atomic_load(&u->taken) - u->rel_seen == 4); /* stale */
    assert_true(tp__user_below(u, 4, 1));                   /* 2 + 1 < 4 */
    assert_int_equal(u->rel_seen, u->released);             /* read afresh */
    assert_false(tp__user_below(u, 3, 1));
    /* one more taken: taken_seen is stale, and holds_more() reads afresh */
    u->taken_seen = u->released; /* as stale as it may be */
    assert_ptr_equal(acq(&us, "v"), u);
    assert_true(tp__user_holds_more(&us, u, 2)); /* holds 3 */
    assert_false(tp__user_holds_more(&us, u, 3));
    for (int i = 0; i < 3; i++) tp__users_release(&us, u);
    assert_true(u->zero);
    assert_int_equal(us.live, 0);
    tp__users_fini(&us);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_users_count_and_release),
        TPT_TEST(test_users_idle_entries_taken_over_oldest_first),
        TPT_TEST(test_users_idle_entry_keeps_weight),
        TPT_TEST(test_users_churn_bounded),
        TPT_TEST(test_users_max_length_name),
        TPT_TEST(test_users_scan),
        TPT_TEST(test_users_prefetch_while_growing),
        TPT_TEST(test_users_counts_across_wrap),
        TPT_TEST(test_users_stale_views_answer_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
