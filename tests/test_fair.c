/*
 * test_fair.c -- fair shares across users (TP_SCHED_FAIR, taskpool.h section
 * 14; tp_user_weight_set).
 *
 * Covers, with one worker and exact orders: the header's worked example;
 * users joining the round at the back and leaving it when their last waiting
 * task starts; the anonymous user (NULL and "" are the same user, with a
 * weight of its own); weights, and tp_user_weight_set applying from the
 * user's next turn (a turn under way keeps its quantum), holding for the
 * pool's life whether or not the user has tasks; a retry going to the back of
 * its user's list (and its user to the back of the round when it had left);
 * a user whose last waiting task is cancelled or expires leaving the round
 * (a new task puts it at the back); rounds kept per lane, not moved by
 * starts of other lanes; random scenarios against the reference model of
 * tpt_sched.h (users, weights, lanes, cancels, batches, retries). Then, with
 * several workers: weights 2:1 (and 3:2:1) over a few thousand tasks give
 * shares near 2:1 while every user is backlogged. And: tp_user_weight_set's
 * errors; fairness never changes admission (the same script gives the same
 * answers and counters in a FIFO and a fair pool).
 *
 * As in test_priority.c, the worker is stopped on latches at chosen start
 * indices; pool threads record into atomics; only the main thread asserts.
 */
#define _GNU_SOURCE
#include "tpt_sched.h"

/* Tags: the user in the hundreds (1xx alice, 2xx bob, 3xx carol, 4xx dave,
 * 9xx no user), the lane in the thousands for urgent work (5000 + ...). */
#define A(i)  (100 + (i))
#define B(i)  (200 + (i))
#define C(i)  (300 + (i))
#define D(i)  (400 + (i))
#define AN(i) (900 + (i))
#define URG   5000

static const char *user_of(int tag) {
    switch ((tag % URG) / 100) {
    case 1: return "alice";
    case 2: return "bob";
    case 3: return "carol";
    case 4: return "dave";
    default: return NULL;
    }
}

static int prio_of(int tag) { return tag >= URG ? 2 : 0; }

/* A fair pool with one worker, stopped on `gate` by the gate task (tag 0,
 * start 0, anonymous: it has left the round before anything else waits). */
static tp_pool *fair_one_worker(tpt_fixture *f, tp_config c, tpt_ord *o, tpt_otask *g, tpt_latch *gate) {
    c.workers = 1;
    c.sched = TP_SCHED_FAIR;
    if (!c.queue_capacity) c.queue_capacity = 256;
    if (!c.max_per_user) c.max_per_user = TP_UNLIMITED;
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&o->at[0], gate);
    tpt_osubmit(p, g, o, 0, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    return p;
}

static void submit_tags(tp_pool *p, tpt_otask *t, tpt_ord *o, const int *tags, int n) {
    for (int i = 0; i < n; i++) tpt_osubmit(p, &t[i], o, tags[i], prio_of(tags[i]), user_of(tags[i]));
}

static void run_all(tp_pool *p, tpt_ord *o, tpt_latch *gate, int n) {
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&o->n) >= n);
    TPT_EVENTUALLY(tpt_stats(p).completed == tpt_stats(p).accepted);
}

/* ------------------------------------------------------------ exact orders */

/* The header's example: weights alice 2 and bob 1; a1 a2 a3 a4 b1 b2 n1,
 * then u1 urgent: u1 a1 a2 b1 n1 a3 a4 b2. */
static void test_worked_example(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
    assert_int_equal(tp_user_weight_set(p, "alice", 2), TP_OK);
    static const int tags[] = {A(1), A(2), A(3), A(4), B(1), B(2), AN(1), URG + AN(9)};
    submit_tags(p, t, o, tags, 8);
    run_all(p, o, g, 9);
    TPT_ORDER(o, "the header's example", 0, URG + AN(9), A(1), A(2), B(1), AN(1), A(3), A(4), B(2));
    tpt_finish(p);
}

/* Users join at the back and leave when their last waiting task started. */
static void test_join_and_leave(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f), *s2 = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
    static const int first[] = {A(1), A(2), A(3), B(1)};
    submit_tags(p, t, o, first, 4);
    atomic_store(&o->at[1], s1); /* a1: round (bob, alice) */
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    static const int second[] = {C(1), C(2)}; /* carol joins: (bob, alice, carol) */
    submit_tags(p, &t[4], o, second, 2);
    atomic_store(&o->at[3], s2); /* b1 (bob leaves), a2: (carol, alice) */
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&s2->waiting) == 1);
    tpt_osubmit(p, &t[6], o, B(2), 0, "bob"); /* bob back, at the back: (carol, alice, bob) */
    tpt_latch_open(s2);
    TPT_EVENTUALLY(atomic_load(&o->n) == 8);
    TPT_ORDER(o, "joining and leaving", 0, A(1), B(1), A(2), C(1), A(3), B(2), C(2));
    tpt_finish(p);
}

/* NULL and "" are one user, the anonymous one, with a weight of its own
 * (set with NULL or ""). */
static void test_anonymous_user(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int round = 0; round < 3; round++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
        tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
        if (round == 1) assert_int_equal(tp_user_weight_set(p, NULL, 2), TP_OK);
        if (round == 2) assert_int_equal(tp_user_weight_set(p, "", 3), TP_OK);
        for (int i = 0; i < 3; i++) {
            tpt_osubmit(p, &t[2 * i], o, A(i + 1), 0, "alice");
            tpt_osubmit(p, &t[2 * i + 1], o, AN(i + 1), 0, i == 1 ? "" : NULL);
        }
        run_all(p, o, g, 7);
        if (round == 0)
            TPT_ORDER(o, "anonymous, weight 1", 0, A(1), AN(1), A(2), AN(2), A(3), AN(3));
        else if (round == 1)
            TPT_ORDER(o, "anonymous, weight 2", 0, A(1), AN(1), AN(2), A(2), AN(3), A(3));
        else
            TPT_ORDER(o, "anonymous, weight 3", 0, A(1), AN(1), AN(2), AN(3), A(2), A(3));
        tpt_finish(p);
    }
}

/* A weight applies from the user's next turn: alice's turn of 3 under way
 * keeps its quantum after her weight drops to 1. */
static void test_weight_from_next_turn(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
    assert_int_equal(tp_user_weight_set(p, "alice", 3), TP_OK);
    static const int tags[] = {A(1), A(2), A(3), A(4), A(5), A(6), B(1), B(2), B(3)};
    submit_tags(p, t, o, tags, 9);
    atomic_store(&o->at[1], s1); /* a1: alice's turn of 3 begins */
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    assert_int_equal(tp_user_weight_set(p, "alice", 1), TP_OK);
    assert_int_equal(tp_user_weight_set(p, "bob", 2), TP_OK); /* bob waits: from his turn */
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&o->n) == 10);
    TPT_ORDER(o, "weights from the next turn", 0, A(1), A(2), A(3), B(1), B(2), A(4), B(3), A(5), A(6));
    tpt_finish(p);
}

/* A weight holds for the pool's life: set before the user ever submitted,
 * and still there after all of its tasks ended (its slots all given back). */
static void test_weight_holds_for_pool_life(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 32);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[31], g);
    assert_int_equal(tp_user_weight_set(p, "carol", 2), TP_OK);
    static const int first[] = {C(1), C(2), C(3), D(1), D(2), D(3)};
    submit_tags(p, t, o, first, 6);
    run_all(p, o, g, 7);
    TPT_ORDER(o, "a weight set before any task", 0, C(1), C(2), D(1), C(3), D(2), D(3));
    assert_int_equal(tp_user_active(p, "carol"), 0);
    assert_int_equal(tpt_stats(p).users, 0);

    /* many other users come and go meanwhile (entries recycled) */
    static const char *const others[] = {"o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8"};
    for (int i = 0; i < 64; i++) {
        tp_task_opts op = {0};
        op.user = others[i % 8];
        assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, &op, TPT_WAIT_NS, NULL), TP_OK);
    }
    TPT_EVENTUALLY(tpt_stats(p).completed == 71 && tpt_stats(p).users == 0);

    /* stop the worker again and repeat: carol still has 2 */
    int n0 = atomic_load(&o->n);
    atomic_store(&o->at[n0], s1);
    tpt_osubmit(p, &t[10], o, 1, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    static const int second[] = {D(4), D(5), C(4), C(5), C(6), D(6)};
    submit_tags(p, &t[11], o, second, 6);
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&o->n) == n0 + 7);
    static const int want[] = {1, D(4), C(4), C(5), D(5), C(6), D(6)};
    tpt_assert_order(o, n0, want, 7, "the weight after the user's entry was given back");
    tpt_finish(p);
}

/* A retry goes to the back of its user's list; a user out of the round
 * (nothing else waiting) rejoins at the back with it. */
static void test_retry_back_of_user_list(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.max_retries = 1;
    c.retry_delay_ns = TPT_MS(20) * tpt_slowdown();
    tp_pool *p = fair_one_worker(f, c, o, &t[15], g);
    t[0].fail = 1; /* a1 */
    t[5].fail = 1; /* c1 */
    static const int tags[] = {A(1), A(2), B(1), B(2), B(3), C(1), D(1)};
    submit_tags(p, t, o, tags, 7);
    /* a1 fails (alice: a2 left, round (b, c, d, a)), b1, c1 fails (carol
     * leaves: no other task), d1 stops the worker; then the retries come
     * back: a1' behind a2, c1' with carol at the back: (a, b, c) */
    atomic_store(&o->at[4], s1);
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0 && tpt_stats(p).queued == 5);
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&o->n) == 10);
    TPT_ORDER(o, "retries in their user's list", 0, A(1), B(1), C(1), D(1), A(2), B(2), C(1) + TPT_RETRY_TAG,
              A(1) + TPT_RETRY_TAG, B(3));
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(retried, 2), TPT_EQ(succeeded, 8));
}

/* A user whose last waiting task is cancelled, or expires, leaves the round;
 * a new task puts it at the back. Either way the same order follows (an
 * expiry before or after the first start leaves the same round). */
static void test_cancel_or_expiry_leaves_round(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int expire = 0; expire < 2; expire++) {
        tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
        tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
        tpt_osubmit(p, &t[0], o, A(1), 0, "alice");
        tpt_osubmit(p, &t[1], o, A(2), 0, "alice");
        t[2].o = o;
        t[2].tag = B(1);
        tp_task_opts ob = {0};
        ob.user = "bob";
        ob.on_done = tpt_otask_done;
        if (expire) ob.deadline_ns = tp_now_ns() + TPT_MS(20);
        uint64_t bid = 0;
        assert_int_equal(tp_submit(p, tpt_otask_fn, &t[2], &ob, &bid), TP_OK);
        tpt_osubmit(p, &t[3], o, C(1), 0, "carol");
        atomic_store(&o->at[1], s1); /* a1: (bob, carol, alice) */
        tpt_latch_open(g);
        TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
        if (!expire) assert_int_equal(tp_cancel(p, bid), TP_OK);
        TPT_EVENTUALLY(atomic_load(&t[2].done) == 1); /* bob leaves: (carol, alice) */
        assert_int_equal(atomic_load(&t[2].status), expire ? TP_ETIMEDOUT : TP_ECANCELED);
        assert_int_equal(tp_user_active(p, "bob"), 0);
        tpt_osubmit(p, &t[4], o, B(2), 0, "bob"); /* (carol, alice, bob) */
        tpt_latch_open(s1);
        TPT_EVENTUALLY(atomic_load(&o->n) == 5);
        TPT_ORDER(o, expire ? "bob's last task expired" : "bob's last task cancelled", 0, A(1), C(1), A(2),
                  B(2));
        tp_stats s = tpt_finish(p);
        tpt_assert_counts(s, TPT_EQ(cancelled, 1), TPT_EQ(expired, expire));
    }
}

/* Each lane has its own round; starts of one lane do not move another's.
 * Limit 1: the lanes alternate; alice and bob take turns in each lane. */
static void test_rounds_per_lane(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = 1;
    tp_pool *p = fair_one_worker(f, c, o, &t[15], g);
    static const int tags[] = {A(1), B(1), A(2), B(2), URG + A(1), URG + A(2), URG + B(1)};
    submit_tags(p, t, o, tags, 7);
    run_all(p, o, g, 8);
    TPT_ORDER(o, "a round per lane", 0, URG + A(1), A(1), URG + B(1), B(1), URG + A(2), A(2), B(2));
    tpt_finish(p);
}

/* ------------------------------------------------------------ staged tasks */

/* A task whose only option is its user, no id asked: a fair pool may stage
 * it (engine.c, "A fair pool's staged tasks") while its user is in the
 * round; no on_done. */
static void submit_plain(tp_pool *p, tpt_otask *t, tpt_ord *o, int tag) {
    t->o = o;
    t->tag = tag;
    t->no_done = 1;
    tp_task_opts opt = {0};
    opt.user = user_of(tag);
    assert_int_equal(tp_submit(p, tpt_otask_fn, t, &opt, NULL), TP_OK);
}

/* Bob's tasks B(1..n), each with an on_done (never staged): a lane deep
 * enough that the worker leaves staged tasks in the ring while it starts
 * (stage.h, TP__STAGE_LOW). */
#define DEEP 40
static void bob_deep(tp_pool *p, tpt_otask *t, tpt_ord *o) {
    for (int i = 0; i < DEEP; i++) tpt_osubmit(p, &t[i], o, B(i + 1), 0, "bob");
}

/* The order of a user's tasks and its place in the round do not depend on
 * whether they were staged: alice (weight 3) has a1 and a2 admitted and a3,
 * a4 most likely staged; when a2 starts, her turn goes on with a3. */
static void test_staged_turn_goes_on(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
    assert_int_equal(tp_user_weight_set(p, "alice", 3), TP_OK);
    bob_deep(p, t, o);                                                       /* round (bob) */
    for (int i = 1; i <= 4; i++) submit_plain(p, &t[DEEP + i - 1], o, A(i)); /* (bob, alice) */
    run_all(p, o, g, DEEP + 5);
    int want[DEEP + 5] = {0, B(1), A(1), A(2), A(3), B(2), A(4)};
    for (int i = 7; i < DEEP + 5; i++) want[i] = B(i - 4);
    tpt_assert_order(o, 0, want, DEEP + 5, "a user's turn with staged tasks");
    tpt_finish(p);
}

/* Alice's admitted tasks are cancelled, or expire while the worker is
 * stopped, while a later task of hers may be staged: she keeps her place in
 * the round (after bob, before carol), as if that task had been admitted at
 * its submit. */
static void test_staged_keeps_place_on_cancel_or_expiry(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int expire = 0; expire < 2; expire++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
        tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
        bob_deep(p, t, o);
        uint64_t id[2] = {0, 0};
        for (int i = 0; i < 2; i++) { /* a1, a2: admitted (an id asked) */
            tpt_otask *a = &t[DEEP + i];
            a->o = o;
            a->tag = A(i + 1);
            tp_task_opts oa = {0};
            oa.user = "alice";
            oa.on_done = tpt_otask_done;
            if (expire) oa.deadline_ns = tp_now_ns() + TPT_MS(20);
            assert_int_equal(tp_submit(p, tpt_otask_fn, a, &oa, &id[i]), TP_OK);
        }
        tpt_osubmit(p, &t[DEEP + 3], o, C(1), 0, "carol"); /* (bob, alice, carol) */
        submit_plain(p, &t[DEEP + 2], o, A(3));
        if (!expire) {
            assert_int_equal(tp_cancel(p, id[0]), TP_OK);
            assert_int_equal(tp_cancel(p, id[1]), TP_OK);
        }
        /* (with the worker stopped, only the service thread's scan ends them) */
        TPT_EVENTUALLY(atomic_load(&t[DEEP].done) == 1 && atomic_load(&t[DEEP + 1].done) == 1);
        assert_int_equal(atomic_load(&t[DEEP + 1].status), expire ? TP_ETIMEDOUT : TP_ECANCELED);
        run_all(p, o, g, DEEP + 3);
        int want[DEEP + 3] = {0, B(1), A(3), C(1)};
        for (int i = 4; i < DEEP + 3; i++) want[i] = B(i - 2);
        tpt_assert_order(o, 0, want, DEEP + 3, expire ? "alice's admitted tasks expired" : "cancelled");
        tpt_finish(p);
    }
}

/* A user that left the round (its last task started, or expired) stages no
 * more: its next task joins the round at the back when it is submitted,
 * behind a user that joined before it, not when a worker gets to it. */
static void test_staged_after_leaving(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int expire = 0; expire < 2; expire++) {
        tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
        tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
        for (int i = 0; i < 2; i++) { /* a1, a2 (alice may stage from a2 on) */
            tpt_otask *a = &t[DEEP + i];
            a->o = o;
            a->tag = A(i + 1);
            tp_task_opts oa = {0};
            oa.user = "alice";
            oa.on_done = tpt_otask_done;
            if (expire) oa.deadline_ns = tp_now_ns() + TPT_MS(20);
            assert_int_equal(tp_submit(p, tpt_otask_fn, a, &oa, NULL), TP_OK);
        }
        bob_deep(p, t, o); /* (alice, bob) */
        int from = 1;
        if (expire) {
            TPT_EVENTUALLY(atomic_load(&t[DEEP].done) == 1 && atomic_load(&t[DEEP + 1].done) == 1);
        } else {
            /* a1, b1, a2 (alice leaves), then the worker stops on b2 */
            atomic_store(&o->at[4], s1);
            tpt_latch_open(g);
            TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
            from = 5;
        }
        tpt_osubmit(p, &t[DEEP + 2], o, C(1), 0, "carol"); /* (bob, carol) */
        submit_plain(p, &t[DEEP + 3], o, A(3));            /* (bob, carol, alice) */
        tpt_latch_open(expire ? g : s1);
        TPT_EVENTUALLY(atomic_load(&o->n) >= (expire ? DEEP + 3 : DEEP + 5));
        TPT_EVENTUALLY(tpt_stats(p).completed == tpt_stats(p).accepted);
        /* from the stop on: bob's next, carol, alice, then bob's */
        int want[DEEP + 5], n = 0;
        int b = expire ? 1 : 3;
        want[n++] = B(b++);
        want[n++] = C(1);
        want[n++] = A(3);
        while (b <= DEEP) want[n++] = B(b++);
        if (!expire) {
            static const int head[] = {0, A(1), B(1), A(2)};
            tpt_assert_order(o, 0, head, 4, "before the stop");
            want[0] = B(2); /* the stop itself */
            want[1] = B(3);
            want[2] = C(1);
            want[3] = A(3);
            n = 4;
            for (int i = 4; i <= DEEP; i++) want[n++] = B(i);
            from = 4;
        }
        tpt_assert_order(o, from, want, n, expire ? "after alice's tasks expired" : "after alice left");
        tpt_finish(p);
    }
}

/* As test_staged_keeps_place_on_cancel_or_expiry, with alice's admitted
 * tasks members of a group that is cancelled: a3, most likely staged, keeps
 * her place in the round (after bob, before carol). */
static void test_staged_keeps_place_on_group_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
    tp_group *grp = NULL;
    assert_int_equal(tp_group_create(p, 0, &grp), TP_OK);
    bob_deep(p, t, o);
    for (int i = 0; i < 2; i++) { /* a1, a2: admitted (a group's) */
        tpt_otask *a = &t[DEEP + i];
        a->o = o;
        a->tag = A(i + 1);
        tp_task_opts oa = {0};
        oa.user = "alice";
        oa.on_done = tpt_otask_done;
        assert_int_equal(tp_group_submit(grp, tpt_otask_fn, a, &oa, NULL), TP_OK);
    }
    tpt_osubmit(p, &t[DEEP + 3], o, C(1), 0, "carol"); /* (bob, alice, carol) */
    submit_plain(p, &t[DEEP + 2], o, A(3));
    assert_int_equal(tp_group_cancel(grp), TP_OK);
    TPT_EVENTUALLY(atomic_load(&t[DEEP].done) == 1 && atomic_load(&t[DEEP + 1].done) == 1);
    assert_int_equal(atomic_load(&t[DEEP].status), TP_ECANCELED);
    run_all(p, o, g, DEEP + 3);
    int want[DEEP + 3] = {0, B(1), A(3), C(1)};
    for (int i = 4; i < DEEP + 3; i++) want[i] = B(i - 2);
    tpt_assert_order(o, 0, want, DEEP + 3, "alice's group cancelled");
    assert_int_equal(tp_group_wait(grp, TPT_WAIT_NS), TP_ECANCELED);
    assert_int_equal(tp_group_destroy(grp), TP_OK);
    tpt_finish(p);
}

/* As the two tests above, with alice's one admitted task (so she is not
 * flagged, and a2 is staged as a task that joins the round): a1 is
 * cancelled by id, or its group is cancelled, while a2 waits in the ring.
 * Admitted at its submit, a2 would follow a1 in alice's flow, and she
 * would keep her place in the round (after bob, before carol). */
static void test_staged_joiner_keeps_place_on_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int grouped = 0; grouped < 2; grouped++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
        tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
        tp_group *grp = NULL;
        if (grouped) assert_int_equal(tp_group_create(p, 0, &grp), TP_OK);
        bob_deep(p, t, o);
        tpt_otask *a = &t[DEEP];
        a->o = o;
        a->tag = A(1);
        tp_task_opts oa = {0};
        oa.user = "alice";
        oa.on_done = tpt_otask_done;
        uint64_t id = 0;
        if (grouped)
            assert_int_equal(tp_group_submit(grp, tpt_otask_fn, a, &oa, NULL), TP_OK);
        else
            assert_int_equal(tp_submit(p, tpt_otask_fn, a, &oa, &id), TP_OK);
        tpt_osubmit(p, &t[DEEP + 2], o, C(1), 0, "carol"); /* (bob, alice, carol) */
        submit_plain(p, &t[DEEP + 1], o, A(2));            /* staged: joins */
        if (grouped)
            assert_int_equal(tp_group_cancel(grp), TP_OK);
        else
            assert_int_equal(tp_cancel(p, id), TP_OK);
        TPT_EVENTUALLY(atomic_load(&t[DEEP].done) == 1);
        assert_int_equal(atomic_load(&t[DEEP].status), TP_ECANCELED);
        run_all(p, o, g, DEEP + 3);
        int want[DEEP + 3] = {0, B(1), A(2), C(1)};
        for (int i = 4; i < DEEP + 3; i++) want[i] = B(i - 2);
        tpt_assert_order(o, 0, want, DEEP + 3, grouped ? "alice's group cancelled" : "a1 cancelled");
        if (grouped) {
            assert_int_equal(tp_group_wait(grp, TPT_WAIT_NS), TP_ECANCELED);
            assert_int_equal(tp_group_destroy(grp), TP_OK);
        }
        tpt_finish(p);
    }
}

/* A task that joins the round, staged while the default lane is empty and
 * only background tasks wait (alice's entry held by one of them), starts
 * before them, as admitted at its submit: with and without a cap on the
 * background tasks that run. And behind bob's deep lane (the worker leaves
 * the ring alone there), it joins when submitted: bob's turn ends, a1
 * starts next. */
static void test_staged_joiner_lanes(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int cap = 0; cap < 2; cap++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 8);
        tp_config c = {0};
        c.low_prio_max_running = cap;
        tp_pool *p = fair_one_worker(f, c, o, &t[7], g);
        tpt_osubmit(p, &t[0], o, 1001, -1, "alice");
        tpt_osubmit(p, &t[1], o, 2001, -1, "bob");
        submit_plain(p, &t[2], o, A(1)); /* staged: joins */
        run_all(p, o, g, 4);
        TPT_ORDER(o, cap ? "a joiner over background tasks, capped" : "a joiner over background tasks", 0,
                  A(1), 1001, 2001);
        tpt_finish(p);
    }
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED; /* her background task waits for the end */
    tp_pool *p = fair_one_worker(f, c, o, &t[DEEP + 7], g);
    tpt_osubmit(p, &t[DEEP], o, 1001, -1, "alice"); /* her entry */
    bob_deep(p, t, o);                              /* (bob) */
    submit_plain(p, &t[DEEP + 1], o, A(1));         /* staged: (bob, alice) */
    run_all(p, o, g, DEEP + 3);
    int want[DEEP + 3] = {0, B(1), A(1)};
    for (int i = 3; i < DEEP + 2; i++) want[i] = B(i - 1);
    want[DEEP + 2] = 1001;
    tpt_assert_order(o, 0, want, DEEP + 3, "a joiner behind a deep lane");
    tpt_finish(p);
}

/* Starvation counts with a task that joins the round: urgent u1 u2 admitted,
 * then a1 (alice's entry held by a background task), limit 1: the same
 * order whether a1 is staged (joins) or admitted at its submit (an id). */
static void test_staged_joiner_starve_count(void **state) {
    tpt_fixture *f = tpt_fx(state);
    int locked[6];
    for (int staged = 0; staged < 2; staged++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 8);
        tp_config c = {0};
        c.prio_starve_limit = 1;
        tp_pool *p = fair_one_worker(f, c, o, &t[7], g);
        tpt_osubmit(p, &t[0], o, 1001, -1, "alice");
        tpt_osubmit(p, &t[1], o, URG + B(1), 2, "bob");
        tpt_osubmit(p, &t[2], o, URG + B(2), 2, "bob");
        tpt_osubmit(p, &t[3], o, 1002, -1, "bob");
        if (staged)
            submit_plain(p, &t[4], o, A(1)); /* staged: joins */
        else
            tpt_osubmit(p, &t[4], o, A(1), 0, "alice");
        run_all(p, o, g, 6);
        if (staged)
            tpt_assert_order(o, 0, locked, 6, "a joiner's lane counts the starts that pass it by");
        else
            for (int i = 0; i < 6; i++) locked[i] = atomic_load(&o->tag[i]);
        tpt_finish(p);
    }
    /* the rules' order, for the record: u1, a1, 1001, u2, then 1002 */
    static const int want[6] = {0, URG + B(1), A(1), 1001, URG + B(2), 1002};
    assert_memory_equal(locked, want, sizeof want);
}

/* The service thread, held in an on_done (tpt_hold_service): no expiry
 * scan while it waits. */
static tpt_latch *g_svc_gate;
static atomic_int g_svc_calls;
static void svc_hold_done(void *arg, int status) {
    (void)arg;
    (void)status;
    tpt_hold_ending(g_svc_gate, &g_svc_calls);
}

/* A worker that finds alice's last admitted task expired at the head of the
 * round (the service thread held: no scan) ends it there; a3, most likely
 * staged behind it, keeps her turn going (weight 2: a1, then a3), before
 * carol. */
static void test_staged_keeps_place_on_expiry_at_take(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    g_svc_gate = tpt_fx_latch(f);
    atomic_store(&g_svc_calls, 0);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
    tpt_hold_service(p, g_svc_gate, svc_hold_done);
    assert_int_equal(tp_user_weight_set(p, "alice", 2), TP_OK);
    bob_deep(p, t, o);
    tpt_osubmit(p, &t[DEEP], o, A(1), 0, "alice"); /* (bob, alice) */
    tpt_otask *a2 = &t[DEEP + 1];
    a2->o = o;
    a2->tag = A(2);
    tp_task_opts oa = {0};
    oa.user = "alice";
    oa.on_done = tpt_otask_done;
    uint64_t dl = tp_now_ns() + TPT_MS(10);
    oa.deadline_ns = dl;
    assert_int_equal(tp_submit(p, tpt_otask_fn, a2, &oa, NULL), TP_OK);
    tpt_osubmit(p, &t[DEEP + 3], o, C(1), 0, "carol"); /* (bob, alice, carol) */
    submit_plain(p, &t[DEEP + 2], o, A(3));
    TPT_EVENTUALLY(tp_now_ns() > dl);
    run_all(p, o, g, DEEP + 3);
    assert_int_equal(atomic_load(&a2->done), 1);
    assert_int_equal(atomic_load(&a2->status), TP_ETIMEDOUT);
    int want[DEEP + 3] = {0, B(1), A(1), A(3), C(1)};
    for (int i = 5; i < DEEP + 3; i++) want[i] = B(i - 3);
    tpt_assert_order(o, 0, want, DEEP + 3, "alice's last admitted task expired at the worker's take");
    tpt_latch_open(g_svc_gate);
    TPT_EVENTUALLY(atomic_load(&g_svc_calls) == 1);
    tpt_finish(p);
}

/* A weight set in the middle of a turn applies from the next one, staged
 * tasks or not: alice (weight 3) starts a1, her weight becomes 1; her turn
 * goes on with a2 and a3 (most likely staged), then one task per turn. */
static void test_staged_weight_mid_turn(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f), *s1 = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, DEEP + 8);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[DEEP + 7], g);
    assert_int_equal(tp_user_weight_set(p, "alice", 3), TP_OK);
    bob_deep(p, t, o);
    for (int i = 0; i < 2; i++) tpt_osubmit(p, &t[DEEP + i], o, A(i + 1), 0, "alice"); /* (bob, alice) */
    for (int i = 2; i < 5; i++) submit_plain(p, &t[DEEP + i], o, A(i + 1));
    atomic_store(&o->at[2], s1); /* a1 */
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    assert_int_equal(tp_user_weight_set(p, "alice", 1), TP_OK);
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&o->n) >= DEEP + 6);
    TPT_EVENTUALLY(tpt_stats(p).completed == tpt_stats(p).accepted);
    int want[DEEP + 6] = {0, B(1), A(1), A(2), A(3), B(2), A(4), B(3), A(5)};
    for (int i = 9; i < DEEP + 6; i++) want[i] = B(i - 5);
    tpt_assert_order(o, 0, want, DEEP + 6, "alice's weight set mid-turn");
    tpt_finish(p);
}

/* ------------------------------------------------------------ random scenarios */

static void random_fair(void **state, unsigned limit, int lanes, int nusers) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l[TPT_PHASES + 1];
    for (int i = 0; i <= TPT_PHASES; i++) l[i] = tpt_fx_latch(f);
    int seeds = tpt_sched_seeds(TPT_SANITIZED ? 6 : 15);
    for (int s = 1; s <= seeds; s++) {
        tpt_rand_cfg rc = {1, limit, nusers, lanes, 0};
        tpt_sched_random(f, l, &rc, (uint32_t)s * 2246822519u + (uint32_t)nusers);
    }
}

static void random_fair_staged(void **state, unsigned limit, int lanes, int nusers, int percent) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l[TPT_PHASES + 1];
    for (int i = 0; i <= TPT_PHASES; i++) l[i] = tpt_fx_latch(f);
    int seeds = tpt_sched_seeds(TPT_SANITIZED || tpt_slowdown() > 1 ? 25 : 120);
    for (int s = 1; s <= seeds; s++) {
        tpt_rand_cfg rc = {1, limit, nusers, lanes, percent};
        tpt_sched_random(f, l, &rc, (uint32_t)s * 3266489917u + (uint32_t)nusers);
    }
}

static void test_random_one_lane_three_users(void **state) { random_fair(state, 0, 1, 3); }
/* lanes 2, 1 and 0 (mostly 0, where tasks are staged) */
static void test_random_staged_few_users(void **state) { random_fair_staged(state, 0, 3, 2, 100); }
static void test_random_staged_many_users(void **state) { random_fair_staged(state, 0, 3, 8, 90); }
static void test_random_staged_all_lanes(void **state) { random_fair_staged(state, 2, 5, 4, 75); }
static void test_random_one_lane_many_users(void **state) { random_fair(state, 0, 1, 12); }
static void test_random_lanes_limit_1(void **state) { random_fair(state, 1, 5, 4); }
static void test_random_lanes_limit_2(void **state) { random_fair(state, 2, 3, 5); }
static void test_random_lanes_strict(void **state) { random_fair(state, TP_UNLIMITED, 5, 3); }

/* ------------------------------------------------------------ shares */

#define SH_MAX 9000
typedef struct shares {
    atomic_int n;
    atomic_schar who[SH_MAX]; /* the user index of the i-th start */
} shares;

static shares *sh_state;

static int share_task(tp_ctx *c, void *arg) {
    (void)c;
    int i = atomic_fetch_add(&sh_state->n, 1);
    if (i < SH_MAX) atomic_store(&sh_state->who[i], (signed char)(intptr_t)arg);
    return 0;
}

/* Users with the given weights, `per` tasks each, all submitted (user 0's
 * first) while four workers are stopped; then they run. Among the first
 * `window` starts, during which every user still has a backlog, user i's
 * share must be near weight_i / sum. */
static void shares_case(tpt_fixture *f, const unsigned *w, int nu, int per, int window, int anon_last) {
    static const char *const names[] = {"s0", "s1", "s2"};
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(4, (unsigned)(nu * per + 8), TP_UNLIMITED);
    c.sched = TP_SCHED_FAIR;
    tp_pool *p = tpt_fx_pool(f, &c);
    sh_state = tpt_fx_new(f, shares);
    tpt_fill_workers(p, l, 4, NULL);
    unsigned sum = 0;
    for (int u = 0; u < nu; u++) {
        const char *name = anon_last && u == nu - 1 ? NULL : names[u];
        assert_int_equal(tp_user_weight_set(p, name, w[u]), TP_OK);
        sum += w[u];
    }
    for (int u = 0; u < nu; u++) {
        tp_task_opts o = {0};
        o.user = anon_last && u == nu - 1 ? NULL : names[u];
        for (int i = 0; i < per; i++)
            assert_int_equal(tp_submit(p, share_task, (void *)(intptr_t)u, &o, NULL), TP_OK);
    }
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == (uint64_t)(nu * per + 4));
    assert_int_equal(atomic_load(&sh_state->n), nu * per);
    int count[3] = {0, 0, 0};
    for (int i = 0; i < window; i++) count[atomic_load(&sh_state->who[i])]++;
    for (int u = 0; u < nu; u++) {
        double want = (double)window * w[u] / sum;
        double tol = 0.03 * window; /* exact under the lock; starts are recorded a little out of order */
        if (count[u] < want - tol || count[u] > want + tol)
            fail_msg("user %d (weight %u): %d of the first %d starts, expected about %.0f", u, w[u], count[u],
                     window, want);
        assert_true(count[u] < per); /* still backlogged in the window */
        print_message("weight %u: %d of the first %d starts (expected %.0f)\n", w[u], count[u], window, want);
    }
    tpt_finish(p);
}

static void test_shares_2_to_1(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const unsigned w[] = {2, 1};
    int per = TPT_SANITIZED ? 1200 : 3000;
    shares_case(f, w, 2, per, per, 0); /* first user submitted everything first */
    shares_case(f, w, 2, per, per, 1); /* the anonymous user has weight 1 */
}

static void test_shares_3_2_1(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const unsigned w[] = {1, 2, 3};
    int per = TPT_SANITIZED ? 1000 : 2500;
    shares_case(f, w, 3, per, per, 0); /* user 2 (weight 3) ends first, after about 2 x per starts */
}

/* ------------------------------------------------------------ tp_user_weight_set errors */

static void test_weight_set_errors(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *fifo = tpt_quiet_pool(f, 1, 8, 0);
    assert_int_equal(tp_user_weight_set(fifo, "alice", 2), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(fifo, NULL, 2), TP_EINVAL);
    tpt_finish(fifo);

    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_pool *p = fair_one_worker(f, (tp_config){0}, o, &t[15], g);
    assert_int_equal(tp_user_weight_set(NULL, "alice", 2), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(p, "alice", 0), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(p, "alice", TP_WEIGHT_MAX + 1), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(p, "alice", UINT_MAX), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(p, NULL, 0), TP_EINVAL);
    char name[TP_USER_MAX + 2];
    memset(name, 'x', TP_USER_MAX + 1);
    name[TP_USER_MAX + 1] = '\0';
    assert_int_equal(tp_user_weight_set(p, name, 2), TP_EINVAL);
    name[TP_USER_MAX] = '\0'; /* exactly TP_USER_MAX bytes */
    assert_int_equal(tp_user_weight_set(p, name, 2), TP_OK);
    assert_int_equal(tp_user_weight_set(p, "bob", TP_WEIGHT_MAX), TP_OK);
    assert_int_equal(tp_user_weight_set(p, "bob", 1), TP_OK);
    assert_int_equal(tp_user_weight_set(p, "", 1), TP_OK);
    assert_int_equal(tp_user_weight_set(p, NULL, 1), TP_OK);
    /* a refused call leaves the weight as it was */
    assert_int_equal(tp_user_weight_set(p, "alice", 2), TP_OK);
    assert_int_equal(tp_user_weight_set(p, "alice", 0), TP_EINVAL);
    assert_int_equal(tp_user_weight_set(p, "alice", TP_WEIGHT_MAX + 1), TP_EINVAL);
    /* nothing about weights shows in the counters */
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(submitted, 1), TPT_EQ(users, 0));
    static const int tags[] = {A(1), A(2), A(3), B(1), B(2)};
    submit_tags(p, t, o, tags, 5);
    run_all(p, o, g, 6);
    TPT_ORDER(o, "alice still 2", 0, A(1), A(2), B(1), A(3), B(2));
    /* a weight of TP_WEIGHT_MAX: bob's whole backlog in one turn */
    tpt_latch *s1 = tpt_fx_latch(f);
    assert_int_equal(tp_user_weight_set(p, "bob", TP_WEIGHT_MAX), TP_OK);
    int n0 = atomic_load(&o->n);
    atomic_store(&o->at[n0], s1);
    tpt_osubmit(p, &t[5], o, 1, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&s1->waiting) == 1);
    static const int more[] = {B(3), B(4), A(4), B(5), B(6), A(5)};
    submit_tags(p, &t[6], o, more, 6);
    tpt_latch_open(s1);
    TPT_EVENTUALLY(atomic_load(&o->n) == n0 + 7);
    static const int want[] = {1, B(3), B(4), B(5), B(6), A(4), A(5)};
    tpt_assert_order(o, n0, want, 7, "weight TP_WEIGHT_MAX");
    tpt_finish(p);
}

/* ------------------------------------------------------------ admission is unchanged */

typedef struct script_out {
    int rc[32];
    int n;
    size_t k[4];
    unsigned active[4];
    tp_stats s;
} script_out;

static void run_script(tpt_fixture *f, unsigned sched, script_out *out) {
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 3, 2);
    c.sched = sched;
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_fill_workers(p, l, 1, "a"); /* a holds one slot, running */
    memset(out, 0, sizeof *out);
    tp_task_opts oa = {0}, ob = {0}, oc = {0}, od = {0}, on = {0};
    oa.user = "a";
    ob.user = "b";
    oc.user = "c";
    od.user = "d";
    ob.priority = 2;
    oc.priority = -1;
    uint64_t nid = 0;
#define REC(x) (out->rc[out->n++] = (x))
    REC(tp_submit(p, tpt_nop_task, NULL, &oa, NULL));                  /* a: 2 slots, queued 1 */
    REC(tp_submit(p, tpt_nop_task, NULL, &oa, NULL));                  /* TP_EUSERLIMIT */
    REC(tp_submit(p, tpt_nop_task, NULL, &ob, NULL));                  /* queued 2 */
    REC(tp_submit(p, tpt_nop_task, NULL, &on, &nid));                  /* queued 3: full */
    REC(tp_submit(p, tpt_nop_task, NULL, &oc, NULL));                  /* TP_EFULL */
    REC(tp_submit(p, tpt_nop_task, NULL, &oa, NULL));                  /* the limit before the bound */
    REC(tp_submit_wait(p, tpt_nop_task, NULL, &oc, TPT_MS(10), NULL)); /* TP_ETIMEDOUT */
    tp_task bt[3] = {{.fn = tpt_nop_task, .opts = &ob},
                     {.fn = tpt_nop_task, .opts = &ob},
                     {.fn = tpt_nop_task, .opts = &oc}};
    REC(tp_submit_batch(p, bt, 3, NULL, &out->k[0])); /* full at once */
    REC(tp_cancel(p, nid));
    TPT_EVENTUALLY(tpt_stats(p).queued == 2);
    tp_task bt2[3] = {{.fn = tpt_nop_task, .opts = &oc},
                      {.fn = tpt_nop_task, .opts = &ob},
                      {.fn = tpt_nop_task, .opts = &od}};
    REC(tp_submit_batch(p, bt2, 3, NULL, &out->k[1])); /* c accepted, then full */
    REC(tp_submit_batch(p, bt2 + 1, 1, NULL, &out->k[2]));
    out->active[0] = tp_user_active(p, "a");
    out->active[1] = tp_user_active(p, "b");
    out->active[2] = tp_user_active(p, "c");
    out->active[3] = tp_user_active(p, "d");
    REC(tp_close(p));
    REC(tp_submit(p, tpt_nop_task, NULL, &od, NULL));
    REC(tp_submit_wait(p, tpt_nop_task, NULL, &od, TPT_MS(10), NULL));
#undef REC
    tpt_latch_open(l);
    out->s = tpt_finish(p);
}

static void test_admission_unchanged_by_fairness(void **state) {
    tpt_fixture *f = tpt_fx(state);
    script_out *fifo = tpt_fx_new(f, script_out), *fair = tpt_fx_new(f, script_out);
    run_script(f, TP_SCHED_FIFO, fifo);
    run_script(f, TP_SCHED_FAIR, fair);
    static const int want[] = {TP_OK,         TP_EUSERLIMIT, TP_OK,      TP_OK,     TP_EFULL,
                               TP_EUSERLIMIT, TP_ETIMEDOUT,  TP_EFULL,   TP_OK,     TP_EFULL,
                               TP_EFULL,      TP_OK,         TP_ECLOSED, TP_ECLOSED};
    assert_int_equal(fifo->n, 14);
    assert_int_equal(fair->n, 14);
    for (int i = 0; i < 14; i++) {
        if (fifo->rc[i] != want[i] || fair->rc[i] != want[i])
            fail_msg("step %d: FIFO %s, fair %s, expected %s", i, tp_err_name(fifo->rc[i]),
                     tp_err_name(fair->rc[i]), tp_err_name(want[i]));
    }
    for (int i = 0; i < 3; i++) assert_int_equal(fifo->k[i], fair->k[i]);
    assert_int_equal(fifo->k[1], 1);
    for (int i = 0; i < 4; i++) assert_int_equal(fifo->active[i], fair->active[i]);
    assert_int_equal(fair->active[0], 2);
    assert_int_equal(fair->active[2], 1);
    assert_int_equal(memcmp(&fifo->s, &fair->s, offsetof(tp_stats, oldest_wait_ns)), 0);
    tpt_assert_counts(fair->s, TPT_EQ(accepted, 5), TPT_EQ(rejected_user, 2), TPT_EQ(rejected_full, 4),
                      TPT_EQ(rejected_timeout, 1), TPT_EQ(rejected_closed, 2), TPT_EQ(cancelled, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_worked_example),
        TPT_TEST(test_join_and_leave),
        TPT_TEST(test_anonymous_user),
        TPT_TEST(test_weight_from_next_turn),
        TPT_TEST(test_weight_holds_for_pool_life),
        TPT_TEST(test_retry_back_of_user_list),
        TPT_TEST(test_cancel_or_expiry_leaves_round),
        TPT_TEST(test_rounds_per_lane),
        TPT_TEST(test_staged_turn_goes_on),
        TPT_TEST(test_staged_keeps_place_on_cancel_or_expiry),
        TPT_TEST(test_staged_after_leaving),
        TPT_TEST(test_staged_keeps_place_on_group_cancel),
        TPT_TEST(test_staged_joiner_keeps_place_on_cancel),
        TPT_TEST(test_staged_joiner_lanes),
        TPT_TEST(test_staged_joiner_starve_count),
        TPT_TEST(test_staged_weight_mid_turn),
        TPT_TEST(test_staged_keeps_place_on_expiry_at_take),
        TPT_TEST(test_random_staged_few_users),
        TPT_TEST(test_random_staged_many_users),
        TPT_TEST(test_random_staged_all_lanes),
        TPT_TEST(test_random_one_lane_three_users),
        TPT_TEST(test_random_one_lane_many_users),
        TPT_TEST(test_random_lanes_limit_1),
        TPT_TEST(test_random_lanes_limit_2),
        TPT_TEST(test_random_lanes_strict),
        TPT_TEST(test_shares_2_to_1),
        TPT_TEST(test_shares_3_2_1),
        TPT_TEST(test_weight_set_errors),
        TPT_TEST(test_admission_unchanged_by_fairness),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
