/*
 * test_users.c -- the per-user slot table without threads: counting, lookup
 * by exact name, entries recycled when a user's last slot is released, and
 * bounded memory under churn of many distinct users.
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
    assert_int_equal(a1->count, 2);
    assert_int_equal(b->count, 1);
    assert_int_equal(us.live, 2);
    assert_string_equal(a1->name, "alice");
    /* exact names only: prefixes and extensions are other users */
    assert_null(find(&us, "alic"));
    assert_null(find(&us, "alicex"));
    tp__users_release(&us, a1);
    assert_ptr_equal(find(&us, "alice"), a1);
    tp__users_release(&us, a1);
    assert_null(find(&us, "alice"));
    assert_int_equal(us.live, 1);
    tp__users_release(&us, b);
    assert_int_equal(us.live, 0);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_users_count_and_release),
        TPT_TEST(test_users_churn_bounded),
        TPT_TEST(test_users_max_length_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
