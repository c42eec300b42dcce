/*
 * test_priority.c -- priority lanes through a real pool (taskpool.h section
 * 14; tp_task_opts.priority, prio_starve_limit, low_prio_max_running,
 * tp_lane_stats_get, TP_HIST_QUEUE_WAIT_PRIO, tp_stats.oldest_wait_ns).
 *
 * Covers: the exact start order with one worker (a gate task first, then
 * mixed priorities): strict lanes and FIFO within a lane; the starvation
 * count with prio_starve_limit 1, 2, 3, the default 16 and TP_UNLIMITED;
 * several starved lanes; the count of lane 0 returning to 0 when it starts a
 * task while only it waits (the ring's fast path); a cancel that leaves a
 * lane ready keeps its count, one that empties it (cancel or expiry) resets
 * it; random scenarios (submits, batches, cancels, retries at known points)
 * against the reference model of tpt_sched.h; low_prio_max_running with two
 * workers (a capped background lane is not ready, counts nothing, and starts
 * from a count of 0 once it is ready again) and with four (never more
 * background tasks running than the cap, normal and urgent work still
 * starts); expiry and cancel of tasks waiting in a starved lane; retries
 * returning to the back of their own lane; tp_submit_batch with mixed
 * priorities (the accepted tasks adjacent in their own lanes, also against
 * concurrent submitters; a batch cut at the bound); groups with mixed
 * priorities (tp_group_cancel, cancel on error); invalid priorities and
 * configurations; tp_lane_stats_get while tasks wait and run and at rest;
 * the per-lane queue-wait histograms; oldest_wait_ns.
 *
 * With one worker the scheduler decides the whole order, so the tests
 * compare orders exactly; the worker is stopped on latches at start indices
 * the test chose, never by timing. Pool threads record into atomics; only
 * the main thread asserts.
 */
#define _GNU_SOURCE
#include "tpt_sched.h"

/* Tags: the lane in the hundreds (5xx urgent, 4xx priority 1, 3xx normal,
 * 2xx priority -1, 1xx background), the number below. */
#define TAG(prio, i) (((prio) + 3) * 100 + (i))
#define U(i)         TAG(2, i)
#define H(i)         TAG(1, i)
#define N(i)         TAG(0, i)
#define L(i)         TAG(-1, i)
#define B(i)         TAG(-2, i)

static int prio_of(int tag) { return (tag % TPT_RETRY_TAG) / 100 - 3; }

/* A pool with one worker, stopped on `gate` by the gate task (tag 0, start
 * 0): whatever the test submits next waits until it opens the gate. */
static tp_pool *one_worker(tpt_fixture *f, tp_config c, tpt_ord *o, tpt_otask *g, tpt_latch *gate) {
    c.workers = 1;
    if (!c.queue_capacity) c.queue_capacity = 256;
    if (!c.max_per_user) c.max_per_user = TP_UNLIMITED;
    c.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&o->at[0], gate);
    tpt_osubmit(p, g, o, 0, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    return p;
}

/* Submit tags[0..n) (each in the lane its tag names). */
static void submit_tags(tp_pool *p, tpt_otask *t, tpt_ord *o, const int *tags, int n) {
    for (int i = 0; i < n; i++) tpt_osubmit(p, &t[i], o, tags[i], prio_of(tags[i]), NULL);
}

/* Open the gate and wait until `n` starts are recorded and everything ended. */
static void run_all(tp_pool *p, tpt_ord *o, tpt_latch *gate, int n) {
    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&o->n) >= n);
    TPT_EVENTUALLY(tpt_stats(p).completed == tpt_stats(p).accepted);
}

/* ------------------------------------------------------------ strict lanes, starvation */

static void test_strict_lanes_fifo_within(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    static const int tags[] = {N(1), B(1), U(1), H(1), L(1), N(2), U(2), B(2), H(2), N(3), L(2)};
    submit_tags(p, t, o, tags, 11);
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.queued, 11);
    run_all(p, o, g, 12);
    TPT_ORDER(o, "strict lanes", 0, U(1), U(2), H(1), H(2), N(1), N(2), N(3), L(1), L(2), B(1), B(2));
    tpt_finish(p);
}

/* Seven urgent and three normal tasks: after `limit` urgent starts the
 * waiting normal lane takes one. */
static void starve_case(tpt_fixture *f, unsigned limit, const int *want, int n) {
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 32);
    tp_config c = {0};
    c.prio_starve_limit = limit;
    tp_pool *p = one_worker(f, c, o, &t[31], g);
    static const int tags[] = {U(1), U(2), U(3), U(4), U(5), U(6), U(7), N(1), N(2), N(3)};
    submit_tags(p, t, o, tags, 10);
    run_all(p, o, g, n);
    char what[48];
    snprintf(what, sizeof what, "prio_starve_limit %u", limit);
    tpt_assert_order(o, 0, want, n, what);
    assert_int_equal(atomic_load(&o->n), n);
    tpt_finish(p);
}

static void test_starve_limit_1_2_3_unlimited(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const int l1[] = {0, U(1), N(1), U(2), N(2), U(3), N(3), U(4), U(5), U(6), U(7)};
    static const int l2[] = {0, U(1), U(2), N(1), U(3), U(4), N(2), U(5), U(6), N(3), U(7)};
    static const int l3[] = {0, U(1), U(2), U(3), N(1), U(4), U(5), U(6), N(2), U(7), N(3)};
    static const int strict[] = {0, U(1), U(2), U(3), U(4), U(5), U(6), U(7), N(1), N(2), N(3)};
    starve_case(f, 1, l1, 11);
    starve_case(f, 2, l2, 11);
    starve_case(f, 3, l3, 11);
    starve_case(f, TP_UNLIMITED, strict, 11);
}

/* prio_starve_limit 0 is 16: the 17th start goes to the waiting lane. */
static void test_starve_limit_default_16(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 32);
    tp_pool *p = one_worker(f, (tp_config){0}, o, &t[31], g);
    int tags[22], want[23], k = 0;
    for (int i = 0; i < 20; i++) tags[i] = U(i + 1);
    tags[20] = N(1);
    tags[21] = N(2);
    submit_tags(p, t, o, tags, 22);
    want[k++] = 0;
    for (int i = 0; i < 16; i++) want[k++] = U(i + 1);
    want[k++] = N(1);
    for (int i = 16; i < 20; i++) want[k++] = U(i + 1);
    want[k++] = N(2);
    run_all(p, o, g, 23);
    tpt_assert_order(o, 0, want, 23, "the default limit, 16");
    tpt_finish(p);
}

/* Five lanes ready at once, limit 1 and 2: the highest starved lane first;
 * each start counts in every ready lane below it. */
static void test_several_starved_lanes(void **state) {
    tpt_fixture *f = tpt_fx(state);
    static const int tags[] = {U(1), U(2), U(3), U(4), H(1), H(2), N(1), N(2), L(1), B(1)};
    for (unsigned limit = 1; limit <= 2; limit++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
        tp_config c = {0};
        c.prio_starve_limit = limit;
        tp_pool *p = one_worker(f, c, o, &t[15], g);
        submit_tags(p, t, o, tags, 10);
        run_all(p, o, g, 11);
        if (limit == 1) {
            /* counts (H N L B) after: U1 1111; H1 (starved, highest) 0222; N1 0033;
             * L1 0004; B1 0000; U2 111-; H2 022-; N2; U3; U4 */
            TPT_ORDER(o, "limit 1, five lanes", 0, U(1), H(1), N(1), L(1), B(1), U(2), H(2), N(2), U(3),
                      U(4));
        } else {
            /* U1 1111; U2 2222; H1 0333; N1 0044; L1 0005; B1; U3 11--; U4 22--;
             * H2 03; N2; */
            TPT_ORDER(o, "limit 2, five lanes", 0, U(1), U(2), H(1), N(1), L(1), B(1), U(3), U(4), H(2),
                      N(2));
        }
        tpt_finish(p);
    }
}

/* Lane 0 counts two urgent starts, then only it waits and it starts a task:
 * its count returns to 0 there too, so the urgent tasks submitted next get
 * `limit` starts before the next normal one. */
static void test_lane0_count_resets_when_it_starts_alone(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_latch *stop = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = 2;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    /* start 1: U1 (lane 0 counts 1); start 2: N1 alone in the queue but for
     * lane 0: it stops the worker */
    static const int first[] = {N(1), N(2), N(3), U(1)};
    submit_tags(p, t, o, first, 4);
    atomic_store(&o->at[2], stop);
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&stop->waiting) == 1);
    static const int second[] = {U(2), U(3), U(4)};
    submit_tags(p, &t[4], o, second, 3);
    tpt_latch_open(stop);
    TPT_EVENTUALLY(atomic_load(&o->n) == 8);
    /* U2 (count 1) U3 (count 2) N2 U4 N3 */
    TPT_ORDER(o, "lane 0's count after it started alone", 0, U(1), N(1), U(2), U(3), N(2), U(4), N(3));
    tpt_finish(p);
}

/* A cancel that leaves the lane ready keeps its count; one that empties it
 * resets it (the lane stopped being ready). */
static void test_cancel_in_starved_lane(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int empties = 0; empties < 2; empties++) {
        tpt_latch *g = tpt_fx_latch(f);
        tpt_latch *stop = tpt_fx_latch(f);
        tpt_ord *o = tpt_fx_new(f, tpt_ord);
        tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
        tp_config c = {0};
        c.prio_starve_limit = 2;
        tp_pool *p = one_worker(f, c, o, &t[15], g);
        uint64_t n1 = tpt_osubmit(p, &t[0], o, N(1), 0, NULL);
        if (!empties) tpt_osubmit(p, &t[1], o, N(2), 0, NULL);
        static const int us[] = {U(1), U(2), U(3), U(4), U(5)};
        submit_tags(p, &t[2], o, us, 5);
        atomic_store(&o->at[1], stop); /* U1 runs: lane 0 counts 1 */
        tpt_latch_open(g);
        TPT_EVENTUALLY(atomic_load(&stop->waiting) == 1);
        assert_int_equal(tp_cancel(p, n1), TP_OK);
        assert_int_equal(tp_cancel(p, n1), TP_ENOTFOUND);
        TPT_EVENTUALLY(atomic_load(&t[0].done) == 1); /* promptly, the worker busy */
        assert_int_equal(atomic_load(&t[0].status), TP_ECANCELED);
        assert_int_equal(atomic_load(&t[0].runs), 0);
        if (empties) tpt_osubmit(p, &t[1], o, N(2), 0, NULL); /* lane 0 ready again, from 0 */
        tpt_latch_open(stop);
        TPT_EVENTUALLY(atomic_load(&o->n) == 7);
        if (empties)
            TPT_ORDER(o, "cancel emptied lane 0", 0, U(1), U(2), U(3), N(2), U(4), U(5));
        else
            TPT_ORDER(o, "cancel left lane 0 ready", 0, U(1), U(2), N(2), U(3), U(4), U(5));
        tp_stats s = tpt_finish(p);
        tpt_assert_counts(s, TPT_EQ(cancelled, 1), TPT_EQ(expired, 0), TPT_EQ(succeeded, 7));
    }
}

/* A task waiting in a starved background lane whose deadline passes ends
 * then, with TP_ETIMEDOUT, while the worker is busy; the rest of its lane
 * keeps its place. When it was its lane's last task, the lane's count
 * returns to 0. L1 (deadline `margin` away) is the background lane's only
 * task while U1 starts and the lane counts 1; it must still wait then: under
 * tpt_with_time_to_spare. */
static bool expiry_in_starved_lane(tpt_fixture *f, uint64_t margin, void *arg) {
    tpt_latch *g = ((tpt_latch **)arg)[0];
    tpt_latch *stop = ((tpt_latch **)arg)[1];
    tpt_latch_rearm(g);
    tpt_latch_rearm(stop);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = 2;
    tp_pool *p = one_worker(f, c, o, &t[15], g);

    tp_task_opts od = {0};
    od.priority = -1;
    od.on_done = tpt_otask_done;
    od.deadline_ns = tp_now_ns() + margin;
    t[0].o = o;
    t[0].tag = L(1);
    assert_int_equal(tp_submit(p, tpt_otask_fn, &t[0], &od, NULL), TP_OK);
    static const int us[] = {U(1), U(2), U(3), U(4)};
    submit_tags(p, &t[1], o, us, 4);
    atomic_store(&o->at[1], stop);
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&stop->waiting) == 1);
    tp_lane_stats ls;
    assert_int_equal(tp_lane_stats_get(p, -1, &ls), TP_OK);
    if (tp_now_ns() >= od.deadline_ns) { /* the premise: it waited through U1's start */
        tpt_latch_open(stop);
        tpt_finish(p);
        return false;
    }
    assert_int_equal(ls.queued, 1); /* read before the deadline */

    /* it expires while the only worker is busy */
    TPT_EVENTUALLY(atomic_load(&t[0].done) == 1);
    assert_true(tp_now_ns() >= od.deadline_ns);
    assert_int_equal(atomic_load(&t[0].status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&t[0].runs), 0);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(expired, 1), TPT_EQ(cancelled, 1), TPT_EQ(queued, 3));
    assert_int_equal(tp_lane_stats_get(p, -1, &ls), TP_OK);
    assert_int_equal(ls.queued, 0);
    assert_int_equal(ls.started, 0);

    /* L2 joins an emptied lane: its count starts from 0 */
    tpt_osubmit(p, &t[5], o, L(2), -1, NULL);
    tpt_latch_open(stop);
    TPT_EVENTUALLY(atomic_load(&o->n) == 6);
    TPT_ORDER(o, "after the expiry", 0, U(1), U(2), U(3), L(2), U(4));
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(expired, 1), TPT_EQ(succeeded, 6), TPT_EQ(started, 6));
    return true;
}

static void test_expiry_in_starved_lane(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l[2] = {tpt_fx_latch(f), tpt_fx_latch(f)};
    tpt_with_time_to_spare(f, TPT_MS(1000) * tpt_slowdown(), expiry_in_starved_lane, l);
}

/* In a strict pool a background task under a steady stream of urgent work
 * never starts: each urgent task submits the next one before it returns, so
 * one always waits when the worker looks. The background task's deadline
 * ends it (expired), and the stream goes on. */
typedef struct chain {
    tp_pool *p;
    atomic_int stop, n, bad;
} chain;

static int chain_task(tp_ctx *c, void *arg) {
    chain *ch = arg;
    int n = atomic_fetch_add(&ch->n, 1);
    if (!atomic_load(&ch->stop) && n < 20000) {
        tp_task_opts o = {0};
        o.priority = 2;
        int rc = tp_submit(ch->p, chain_task, ch, &o, NULL);
        /* The test stores `stop` before tp_shutdown: a link that read it
         * just before may find the pool closed, and only then. */
        if (rc != TP_OK && !(rc == TP_ECLOSED && atomic_load(&ch->stop))) atomic_fetch_add(&ch->bad, 1);
    }
    tp_ctx_sleep(c, 200000); /* 0.2 ms: not a hot loop */
    return 0;
}

static void test_expiry_under_strict_stream(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 2);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    tp_pool *p = one_worker(f, c, o, &t[1], g);
    chain *ch = tpt_fx_new(f, chain);
    ch->p = p;
    tp_task_opts ou = {0};
    ou.priority = 2;
    assert_int_equal(tp_submit(p, chain_task, ch, &ou, NULL), TP_OK);
    tpt_latch_open(g);
    /* The stream runs: from now on a task of lane 2 waits at every start
     * (each one submits the next before it returns). The background task
     * joins it only then, so that its deadline cannot pass before the
     * stream has started, however late the worker gets a CPU. */
    TPT_EVENTUALLY(atomic_load(&ch->n) >= 2);
    tp_task_opts od = {0};
    od.priority = -2;
    od.on_done = tpt_otask_done;
    od.deadline_ns = tp_now_ns() + TPT_MS(50);
    t[0].o = o;
    t[0].tag = B(1);
    assert_int_equal(tp_submit(p, tpt_otask_fn, &t[0], &od, NULL), TP_OK);
    int n0 = atomic_load(&ch->n);
    TPT_EVENTUALLY(atomic_load(&t[0].done) == 1);
    assert_int_equal(atomic_load(&t[0].status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&t[0].runs), 0);
    TPT_EVENTUALLY(atomic_load(&ch->n) > n0); /* the stream went on past it */
    atomic_store(&ch->stop, 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&ch->bad), 0);
    tpt_assert_counts(s, TPT_EQ(expired, 1), TPT_EQ(cancelled, 1), TPT_EQ(accepted, atomic_load(&ch->n) + 2));
}

/* ------------------------------------------------------------ retries */

/* A retry returns to the back of its own lane: behind the tasks of its lane
 * that waited when it came back, ahead of those submitted later, and after
 * every higher lane. */
static void test_retry_back_of_own_lane(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_latch *stop = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    c.max_retries = 1;
    c.retry_delay_ns = TPT_MS(20) * tpt_slowdown();
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    tpt_osubmit(p, &t[0], o, N(1), 0, NULL);
    t[1].fail = 1;
    tpt_osubmit(p, &t[1], o, L(1), -1, NULL);
    tpt_osubmit(p, &t[2], o, L(2), -1, NULL);
    tpt_osubmit(p, &t[3], o, L(3), -1, NULL);
    atomic_store(&o->at[3], stop); /* 0 gate, 1 N1, 2 L1 fails, 3 L2 stops the worker */
    tpt_latch_open(g);
    TPT_EVENTUALLY(atomic_load(&stop->waiting) == 1);
    TPT_EVENTUALLY(tpt_stats(p).delayed == 0 && tpt_stats(p).queued == 2); /* L3, L1's retry */
    tpt_osubmit(p, &t[4], o, L(4), -1, NULL);
    tpt_osubmit(p, &t[5], o, N(2), 0, NULL);
    tpt_latch_open(stop);
    TPT_EVENTUALLY(atomic_load(&o->n) == 8);
    TPT_ORDER(o, "retry to the back of its lane", 0, N(1), L(1), L(2), N(2), L(3), L(1) + TPT_RETRY_TAG,
              L(4));
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(retried, 1), TPT_EQ(succeeded, 7));
}

/* ------------------------------------------------------------ random scenarios */

static void random_scenarios(void **state, unsigned limit, int lanes) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l[TPT_PHASES + 1];
    for (int i = 0; i <= TPT_PHASES; i++) l[i] = tpt_fx_latch(f);
    int seeds = tpt_sched_seeds(TPT_SANITIZED ? 6 : 15);
    for (int s = 1; s <= seeds; s++) {
        tpt_rand_cfg rc = {0, limit, s % 3 ? 3 : 0, lanes, 0};
        tpt_sched_random(f, l, &rc, (uint32_t)s * 2654435761u + limit);
    }
}

static void test_random_limit_1(void **state) { random_scenarios(state, 1, 0); }
static void test_random_limit_2(void **state) { random_scenarios(state, 2, 0); }
static void test_random_limit_3_two_lanes(void **state) { random_scenarios(state, 3, 2); }
static void test_random_default_limit(void **state) { random_scenarios(state, 0, 3); }
static void test_random_strict(void **state) { random_scenarios(state, TP_UNLIMITED, 0); }

/* ------------------------------------------------------------ low_prio_max_running */

/*
 * Two workers, low_prio_max_running 1, limit 3. Worker X: N1 N2 N3 (lanes -1
 * and -2 count 3 each), then the highest starved lane, -1: L1 starts (lane -2
 * counts one more) and runs; one background task runs, so lanes -1 and -2
 * are not ready, their counts return to 0 and count nothing while worker Y
 * runs N4 N5 and the gate G. When L1 ends, lane -2 is ready again from 0:
 * N6 N7 N8, then B1, then N9.
 */
static void test_low_prio_cap_not_ready_counts_reset(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *lx = tpt_fx_latch(f), *ly = tpt_fx_latch(f), *lb = tpt_fx_latch(f), *lg = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = tpt_quiet_config(2, 64, TP_UNLIMITED);
    c.prio_starve_limit = 3;
    c.low_prio_max_running = 1;
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&o->at[0], lx);
    atomic_store(&o->at[1], ly);
    tpt_osubmit(p, &t[0], o, 1, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&lx->waiting) == 1);
    tpt_osubmit(p, &t[1], o, 2, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&ly->waiting) == 1);

    tpt_osubmit(p, &t[2], o, B(1), -2, NULL);
    t[3].gate = lb;
    tpt_osubmit(p, &t[3], o, L(1), -1, NULL);
    static const int ns[] = {N(1), N(2), N(3), N(4), N(5)};
    submit_tags(p, &t[4], o, ns, 5);
    t[9].gate = lg;
    tpt_osubmit(p, &t[9], o, N(50), 0, NULL); /* G */
    static const int ns2[] = {N(6), N(7), N(8), N(9)};
    submit_tags(p, &t[10], o, ns2, 4);

    tpt_latch_open(lx); /* X: N1 N2 N3 L1 */
    TPT_EVENTUALLY(atomic_load(&lb->waiting) == 1);
    tp_lane_stats ls;
    assert_int_equal(tp_lane_stats_get(p, -1, &ls), TP_OK);
    assert_int_equal(ls.running, 1);
    tpt_latch_open(ly); /* Y: N4 N5 G */
    TPT_EVENTUALLY(atomic_load(&lg->waiting) == 1);
    assert_int_equal(tp_lane_stats_get(p, -2, &ls), TP_OK);
    assert_int_equal(ls.queued, 1); /* B1 still waits: not ready */
    assert_int_equal(ls.started, 0);
    tpt_latch_open(lb); /* X: N6 N7 N8 B1 N9 */
    TPT_EVENTUALLY(atomic_load(&o->n) == 14);
    tpt_latch_open(lg);
    TPT_ORDER(o, "low_prio_max_running 1, limit 3", 1, 2, N(1), N(2), N(3), L(1), N(4), N(5), N(50), N(6),
              N(7), N(8), B(1), N(9));
    tpt_finish(p);
}

typedef struct conc {
    atomic_int bg_now, bg_max, all_now, all_max;
    atomic_int ran;
} conc;

static conc conc_state;

static void conc_max(atomic_int *max, int v) {
    int m = atomic_load(max);
    while (v > m && !atomic_compare_exchange_weak(max, &m, v)) {
    }
}

static int conc_task(tp_ctx *c, void *arg) {
    (void)c;
    int bg = (int)(intptr_t)arg < 0;
    if (bg) conc_max(&conc_state.bg_max, atomic_fetch_add(&conc_state.bg_now, 1) + 1);
    conc_max(&conc_state.all_max, atomic_fetch_add(&conc_state.all_now, 1) + 1);
    uint64_t end = tp_now_ns() + 20000;
    while (tp_now_ns() < end) sched_yield();
    atomic_fetch_sub(&conc_state.all_now, 1);
    if (bg) atomic_fetch_sub(&conc_state.bg_now, 1);
    atomic_fetch_add(&conc_state.ran, 1);
    return 0;
}

/* Four workers, low_prio_max_running 2: blocked background tasks hold two
 * workers and no more; normal and urgent tasks take the other two although
 * the background ones were queued first; under a random load no more than
 * two background tasks ever run at once. */
static void test_low_prio_cap_several_workers(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(4, 2048, TP_UNLIMITED);
    c.low_prio_max_running = 2;
    tp_pool *p = tpt_fx_pool(f, &c);
    for (int i = 0; i < 6; i++) {
        tp_task_opts o = {0};
        o.priority = i % 2 ? -1 : -2;
        assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    }
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 2 && tpt_stats(p).queued == 4);
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(active, 2), TPT_EQ(queued, 4));
    TPT_EVENTUALLY(tpt_stats(p).idle == 2);
    tp_lane_stats a, b;
    assert_int_equal(tp_lane_stats_get(p, -1, &a), TP_OK);
    assert_int_equal(tp_lane_stats_get(p, -2, &b), TP_OK);
    assert_int_equal(a.running + b.running, 2);
    assert_int_equal(a.queued + b.queued, 4);
    /* normal and urgent work still starts */
    tp_task_opts on = {0};
    assert_int_equal(tp_submit(p, tpt_block_task, l, &on, NULL), TP_OK);
    on.priority = 2;
    assert_int_equal(tp_submit(p, tpt_block_task, l, &on, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 4);
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(active, 4), TPT_EQ(queued, 4));
    assert_int_equal(tp_lane_stats_get(p, -1, &a), TP_OK);
    assert_int_equal(tp_lane_stats_get(p, -2, &b), TP_OK);
    assert_int_equal(a.running + b.running, 2);
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == 8);

    /* random load */
    memset(&conc_state, 0, sizeof conc_state);
    uint32_t r = 7;
    int n = TPT_SANITIZED ? 600 : 2000;
    for (int i = 0; i < n; i++) {
        tp_task_opts o = {0};
        o.priority = (int)(tpt_xorshift(&r) % 5) - 2;
        assert_int_equal(tp_submit_wait(p, conc_task, (void *)(intptr_t)o.priority, &o, TPT_WAIT_NS, NULL),
                         TP_OK);
        if (i % 64 == 0) { /* one lane's figure alone is one read */
            assert_int_equal(tp_lane_stats_get(p, -1, &a), TP_OK);
            assert_true(a.running <= 2);
        }
    }
    TPT_EVENTUALLY(atomic_load(&conc_state.ran) == n);
    assert_true(atomic_load(&conc_state.bg_max) <= 2);
    assert_true(atomic_load(&conc_state.bg_max) >= 1);
    tpt_finish(p);
}

/* An elastic pool grows for tasks that may start, not for capped background
 * tasks: one worker, up to four, low_prio_max_running 1; six blocked
 * background tasks hold one worker and add none; two normal tasks add two. */
static void test_low_prio_cap_elastic_growth(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 64, TP_UNLIMITED);
    c.max_workers = 4;
    c.low_prio_max_running = 1;
    tp_pool *p = tpt_fx_pool(f, &c);
    TPT_EVENTUALLY(tpt_stats(p).workers == 1);
    tp_task_opts o = {0};
    o.priority = -1;
    for (int i = 0; i < 6; i++) assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1 && tpt_stats(p).queued == 5);
    tpt_sleep_ns(TPT_MS(20)); /* time for a wrong spawn to show */
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(workers, 1), TPT_EQ(active, 1), TPT_EQ(queued, 5));
    o.priority = 0;
    for (int i = 0; i < 2; i++) assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 3);
    tpt_sleep_ns(TPT_MS(20));
    s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(workers, 3), TPT_EQ(active, 3), TPT_EQ(queued, 5));
    tpt_latch_open(l);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(succeeded, 8));
}

/* Everything at once with several workers: two producers (random lanes and
 * users, tasks that fail and are retried, deadlines about to pass, cancels
 * right after the submit), an elastic pool with low_prio_max_running 2, FIFO
 * and fair; the second round of each ends in a forced shutdown. Background
 * tasks never run more than two at once; at rest the lanes agree with the
 * pool's counters and histograms. */
typedef struct mix {
    tp_pool *p;
    int which, per;
    int bad;
} mix;

static int mix_task(tp_ctx *c, void *arg) {
    intptr_t v = (intptr_t)arg; /* bit 0: fails its first attempt; bits 1-: priority + 2 */
    int bg = (v >> 1) - 2 < 0;
    if (bg) conc_max(&conc_state.bg_max, atomic_fetch_add(&conc_state.bg_now, 1) + 1);
    uint64_t end = tp_now_ns() + 5000;
    while (tp_now_ns() < end) sched_yield();
    if (bg) atomic_fetch_sub(&conc_state.bg_now, 1);
    return (v & 1) && tp_ctx_attempt(c) == 0 ? 1 : 0;
}

static void *mix_producer(void *arg) {
    mix *x = arg;
    static const char *const users[] = {NULL, "m0", "m1", "m2", "m3"};
    uint32_t r = 77u + (uint32_t)x->which;
    for (int i = 0; i < x->per; i++) {
        tp_task_opts o = {0};
        o.priority = (int)(tpt_xorshift(&r) % 5) - 2;
        o.user = users[tpt_xorshift(&r) % 5];
        uint32_t dl = tpt_xorshift(&r) % 16;
        if (dl == 0) o.deadline_ns = 1; /* passed already: expires unrun */
        if (dl == 1) o.deadline_ns = tp_now_ns() + tpt_xorshift(&r) % 2000000;
        intptr_t v = (intptr_t)((o.priority + 2) << 1) | (intptr_t)(tpt_xorshift(&r) % 6 == 0);
        uint64_t id = 0;
        int rc = tp_submit_wait(x->p, mix_task, (void *)v, &o, TPT_WAIT_NS, &id);
        if (rc == TP_ECLOSED) break;
        if (rc != TP_OK) {
            x->bad++;
            continue;
        }
        if (tpt_xorshift(&r) % 10 == 0) {
            int crc = tp_cancel(x->p, id);
            if (crc != TP_OK && crc != TP_ENOTFOUND) x->bad++;
        }
    }
    return NULL;
}

static void test_lanes_stress_several_workers(void **state) {
    tpt_fixture *f = tpt_fx(state);
    int per = TPT_SANITIZED || tpt_slowdown() > 1 ? 800 : 3000;
    for (int round = 0; round < 4; round++) {
        int fair = round & 1, forced = round >= 2;
        memset(&conc_state, 0, sizeof conc_state);
        tp_config c = tpt_quiet_config(4, 64, 3);
        c.max_workers = 6;
        c.sched = fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
        c.prio_starve_limit = 2;
        c.low_prio_max_running = 2;
        c.max_retries = 2;
        c.retry_delay_ns = TPT_MS(1);
        tp_pool *p = tpt_fx_pool(f, &c);
        if (fair) assert_int_equal(tp_user_weight_set(p, "m1", 3), TP_OK);
        mix *x = tpt_fx_array(f, mix, 2);
        tpt_fx_thr *th[2];
        for (int i = 0; i < 2; i++) {
            x[i] = (mix){p, i, per, 0};
            th[i] = tpt_fx_thread(f, mix_producer, &x[i]);
        }
        int rc = TP_OK;
        if (forced) {
            TPT_EVENTUALLY(tpt_stats(p).accepted >= (uint64_t)per / 2);
            rc = tp_shutdown(p, 1);
            assert_true(rc == TP_OK || rc == TP_ETIMEDOUT);
        }
        for (int i = 0; i < 2; i++) tpt_fx_join(th[i]);
        for (int i = 0; i < 2; i++) assert_int_equal(x[i].bad, 0);
        assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), rc);
        assert_int_equal(tp_wait(p, TPT_WAIT_NS), rc);
        tp_stats s = tpt_stats(p);
        tpt_assert_at_rest(&s);
        uint64_t sum = 0, hsum = 0;
        tp_hist *h = tpt_fx_new(f, tp_hist);
        for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
            tp_lane_stats ls;
            assert_int_equal(tp_lane_stats_get(p, pr, &ls), TP_OK);
            assert_int_equal(ls.queued, 0);
            assert_int_equal(ls.running, 0);
            sum += ls.started;
            assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(pr), h), TP_OK);
            assert_int_equal(h->count, ls.started);
            hsum += h->count;
        }
        assert_int_equal(sum, s.started + s.retried);
        assert_int_equal(hsum, s.started + s.retried);
        assert_true(s.oldest_wait_ns == 0);
        assert_true(atomic_load(&conc_state.bg_max) <= 2);
        if (!forced) assert_true(s.expired > 0 && s.retried > 0 && s.cancelled > 0);
        tpt_fx_forget(p);
        assert_int_equal(tp_destroy(p), TP_OK);
    }
}

/* ------------------------------------------------------------ batches */

static void test_batch_mixed_priorities(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    tpt_osubmit(p, &t[0], o, N(1), 0, NULL);
    tpt_osubmit(p, &t[1], o, U(1), 2, NULL);
    static const int bt[] = {N(2), U(2), L(1), N(3), U(3)};
    tp_task batch[5];
    tp_task_opts bo[5];
    for (int i = 0; i < 5; i++) {
        t[2 + i].o = o;
        t[2 + i].tag = bt[i];
        memset(&bo[i], 0, sizeof bo[i]);
        bo[i].priority = prio_of(bt[i]);
        bo[i].on_done = tpt_otask_done;
        batch[i] = (tp_task){.fn = tpt_otask_fn, .arg = &t[2 + i], .opts = &bo[i]};
    }
    size_t k = 99;
    assert_int_equal(tp_submit_batch(p, batch, 5, NULL, &k), TP_OK);
    assert_int_equal(k, 5);
    tpt_osubmit(p, &t[7], o, N(4), 0, NULL);
    tpt_osubmit(p, &t[8], o, U(4), 2, NULL);
    run_all(p, o, g, 10);
    TPT_ORDER(o, "a batch in its lanes", 0, U(1), U(2), U(3), U(4), N(1), N(2), N(3), N(4), L(1));
    tpt_finish(p);
}

/* A batch larger than the free space is cut there, whatever the lanes: the
 * accepted prefix starts by the rules, the rest is untouched. */
static void test_batch_mixed_cut_at_bound(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    c.queue_capacity = 5;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    static const int bt[] = {B(1), N(1), U(1), L(1), H(1), U(2), N(2), B(2)};
    tp_task batch[8];
    tp_task_opts bo[8];
    for (int i = 0; i < 8; i++) {
        t[i].o = o;
        t[i].tag = bt[i];
        memset(&bo[i], 0, sizeof bo[i]);
        bo[i].priority = prio_of(bt[i]);
        bo[i].on_done = tpt_otask_done;
        batch[i] = (tp_task){.fn = tpt_otask_fn, .arg = &t[i], .opts = &bo[i]};
    }
    uint64_t ids[8] = {0};
    size_t k = 99;
    assert_int_equal(tp_submit_batch(p, batch, 8, ids, &k), TP_EFULL);
    assert_int_equal(k, 5);
    for (int i = 0; i < 5; i++) assert_true(ids[i] != 0);
    for (int i = 5; i < 8; i++) assert_true(ids[i] == 0);
    tp_lane_stats ls;
    assert_int_equal(tp_lane_stats_get(p, 2, &ls), TP_OK);
    assert_int_equal(ls.queued, 1);
    run_all(p, o, g, 6);
    TPT_ORDER(o, "the accepted prefix", 0, U(1), H(1), N(1), L(1), B(1));
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, 6), TPT_EQ(rejected_full, 1), TPT_EQ(submitted, 7));
    for (int i = 5; i < 8; i++) assert_int_equal(atomic_load(&t[i].done), 0);
}

/* Batches of mixed priorities against two threads submitting single tasks
 * into the same lanes: in a strict pool with one stopped worker, each lane
 * starts in admission order, and each batch's tasks of a lane are next to
 * each other in that lane's order, in array order. */
#define ADJ_SINGLES 300
#define ADJ_BATCHES 40
#define ADJ_B       6
#define ADJ_TAGS    (1000 + ADJ_BATCHES * ADJ_B)

typedef struct adj {
    tp_pool *p;
    tpt_ord *o;
    tpt_otask *t;
    int *prio; /* by tag */
    atomic_int *go;
    int which; /* 0 or 1: tags 1 + which x ADJ_SINGLES ... */
    int rc_bad;
} adj;

static void *adj_single(void *arg) {
    adj *x = arg;
    uint32_t r = 11u + (uint32_t)x->which;
    tpt_wait_go(x->go);
    for (int i = 0; i < ADJ_SINGLES; i++) {
        int tag = 1 + x->which * ADJ_SINGLES + i;
        tpt_otask *t = &x->t[tag];
        t->o = x->o;
        t->tag = tag;
        tp_task_opts o = {0};
        o.priority = (int)(tpt_xorshift(&r) % 3) - 1;
        o.on_done = tpt_otask_done;
        x->prio[tag] = o.priority;
        if (tp_submit(x->p, tpt_otask_fn, t, &o, NULL) != TP_OK) x->rc_bad++;
    }
    return NULL;
}

static void test_batch_adjacent_in_lanes_concurrent(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    int total = 2 * ADJ_SINGLES + ADJ_BATCHES * ADJ_B;
    tpt_otask *t = tpt_fx_array(f, tpt_otask, ADJ_TAGS + 1);
    int *prio = tpt_fx_array(f, int, ADJ_TAGS + 1);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    c.queue_capacity = (unsigned)total + 8;
    tp_pool *p = one_worker(f, c, o, &t[0], g); /* tag 0: the gate */
    atomic_int *go = tpt_fx_new(f, atomic_int);
    adj *x = tpt_fx_array(f, adj, 2);
    tpt_fx_thr *th[2];
    for (int i = 0; i < 2; i++) {
        x[i] = (adj){p, o, t, prio, go, i, 0};
        th[i] = tpt_fx_thread(f, adj_single, &x[i]);
    }
    atomic_store(go, 1);
    uint32_t r = 3;
    for (int b = 0; b < ADJ_BATCHES; b++) {
        tp_task batch[ADJ_B];
        tp_task_opts bo[ADJ_B];
        for (int i = 0; i < ADJ_B; i++) {
            int tag = 1000 + b * ADJ_B + i;
            tpt_otask *bt = &t[tag];
            bt->o = o;
            bt->tag = tag;
            memset(&bo[i], 0, sizeof bo[i]);
            bo[i].priority = (int)(tpt_xorshift(&r) % 3) - 1; /* several lanes per batch */
            bo[i].on_done = tpt_otask_done;
            prio[tag] = bo[i].priority;
            batch[i] = (tp_task){.fn = tpt_otask_fn, .arg = bt, .opts = &bo[i]};
        }
        size_t k = 0;
        assert_int_equal(tp_submit_batch(p, batch, ADJ_B, NULL, &k), TP_OK);
        if (b % 8 == 0) sched_yield();
    }
    tpt_fx_join(th[0]);
    tpt_fx_join(th[1]);
    assert_int_equal(x[0].rc_bad + x[1].rc_bad, 0);
    run_all(p, o, g, total + 1);
    assert_int_equal(atomic_load(&o->n), total + 1);
    int *seq = tpt_fx_array(f, int, total);
    for (int lane = 1, prev_lane = 2; lane >= -1; prev_lane = lane, lane--) {
        /* this lane's starts, in order; strict: all after the higher lanes' */
        int n = 0;
        for (int i = 1; i <= total; i++) {
            int tag = atomic_load(&o->tag[i]);
            if (prio[tag] == lane) seq[n++] = tag;
            if (prio[tag] == prev_lane && n > 0)
                fail_msg("lane %d started before lane %d was empty", lane, prev_lane);
        }
        int last_single[2] = {0, 0}, last_batch_tag = 0;
        for (int i = 0; i < n; i++) {
            int tag = seq[i];
            if (tag < 1000) { /* FIFO per submitting thread */
                int w = (tag - 1) / ADJ_SINGLES;
                if (tag <= last_single[w]) fail_msg("lane %d: single %d after %d", lane, tag, last_single[w]);
                last_single[w] = tag;
                continue;
            }
            if (tag <= last_batch_tag) fail_msg("lane %d: batch task %d after %d", lane, tag, last_batch_tag);
            last_batch_tag = tag;
            /* the next task of this batch in this lane, if any, comes right after it */
            int b = (tag - 1000) / ADJ_B;
            for (int j = tag + 1; j < 1000 + (b + 1) * ADJ_B; j++) {
                if (prio[j] != lane) continue;
                if (i + 1 >= n || seq[i + 1] != j)
                    fail_msg("lane %d: batch %d's tasks %d and %d are not adjacent", lane, b, tag, j);
                break;
            }
        }
    }
    tpt_finish(p);
}

/* ------------------------------------------------------------ groups */

/* tp_group_cancel with members in four lanes: every queued member ends
 * TP_ECANCELED without running, whatever its lane; non-members start in
 * order, and the lanes' figures drop. */
static void test_group_cancel_mixed_lanes(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = 1;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    tp_group *gr = NULL;
    assert_int_equal(tp_group_create(p, 0, &gr), TP_OK);
    static const int members[] = {U(1), N(1), B(1), H(1)};
    for (int i = 0; i < 4; i++) {
        t[i].o = o;
        t[i].tag = members[i];
        tp_task_opts op = {0};
        op.priority = prio_of(members[i]);
        op.on_done = tpt_otask_done;
        assert_int_equal(tp_group_submit(gr, tpt_otask_fn, &t[i], &op, NULL), TP_OK);
    }
    tpt_osubmit(p, &t[4], o, N(2), 0, NULL);
    tpt_osubmit(p, &t[5], o, B(2), -2, NULL);
    tpt_osubmit(p, &t[6], o, U(2), 2, NULL);
    assert_int_equal(tp_group_cancel(gr), TP_OK);
    for (int i = 0; i < 4; i++) {
        TPT_EVENTUALLY(atomic_load(&t[i].done) == 1);
        assert_int_equal(atomic_load(&t[i].status), TP_ECANCELED);
    }
    tp_lane_stats ls;
    static const int want_queued[5] = {1, 0, 1, 0, 1}; /* lanes -2..2 */
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
        assert_int_equal(tp_lane_stats_get(p, pr, &ls), TP_OK);
        assert_int_equal(ls.queued, want_queued[pr + 2]);
    }
    assert_int_equal(tp_group_wait(gr, TPT_WAIT_NS), TP_ECANCELED);
    run_all(p, o, g, 4);
    /* limit 1: U2 (lanes 0 and -2 count 1), N2 (starved, the higher), B2 */
    TPT_ORDER(o, "non-members after the cancel", 0, U(2), N(2), B(2));
    for (int i = 0; i < 4; i++) assert_int_equal(atomic_load(&t[i].runs), 0);
    assert_int_equal(tp_group_destroy(gr), TP_OK);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(cancelled, 4), TPT_EQ(succeeded, 4), TPT_EQ(started, 4));
}

/* Cancel on error: the urgent member fails first; before the worker takes
 * another task the group's members in every lane are cancelled; the group's
 * error is the member's status. */
static void test_group_cancel_on_error_mixed_lanes(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *g = tpt_fx_latch(f);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, 16);
    tp_config c = {0};
    c.prio_starve_limit = TP_UNLIMITED;
    tp_pool *p = one_worker(f, c, o, &t[15], g);
    tp_group *gr = NULL;
    assert_int_equal(tp_group_create(p, TP_GROUP_CANCEL_ON_ERROR, &gr), TP_OK);
    static const int members[] = {N(1), L(1), U(1), B(1), H(1)};
    for (int i = 0; i < 5; i++) {
        t[i].o = o;
        t[i].tag = members[i];
        t[i].fail = members[i] == U(1) ? 1 : 0;
        tp_task_opts op = {0};
        op.priority = prio_of(members[i]);
        op.on_done = tpt_otask_done;
        assert_int_equal(tp_group_submit(gr, tpt_otask_fn, &t[i], &op, NULL), TP_OK);
    }
    tpt_osubmit(p, &t[5], o, H(2), 1, NULL);
    tpt_osubmit(p, &t[6], o, B(2), -2, NULL);
    run_all(p, o, g, 4);
    TPT_ORDER(o, "after the urgent member failed", 0, U(1), H(2), B(2));
    assert_int_equal(tp_group_wait(gr, TPT_WAIT_NS), 1);
    for (int i = 0; i < 5; i++) {
        TPT_EVENTUALLY(atomic_load(&t[i].done) == 1);
        if (members[i] == U(1)) {
            assert_int_equal(atomic_load(&t[i].status), 1);
        } else {
            assert_int_equal(atomic_load(&t[i].status), TP_ECANCELED);
            assert_int_equal(atomic_load(&t[i].runs), 0);
        }
    }
    assert_int_equal(tp_group_destroy(gr), TP_OK);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(cancelled, 4), TPT_EQ(failed, 5), TPT_EQ(succeeded, 3));
}

/* ------------------------------------------------------------ bad input */

static void test_invalid_priorities_and_configs(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = tpt_quiet_pool(f, 1, 8, TP_UNLIMITED);
    tp_stats before = tpt_stats(p);
    static const int bad[] = {TP_PRIO_MIN - 1, TP_PRIO_MAX + 1, INT_MIN, INT_MAX, 100};
    for (int i = 0; i < 5; i++) {
        tp_task_opts o = {0};
        o.priority = bad[i];
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_EINVAL);
        assert_int_equal(tp_submit_wait(p, tpt_nop_task, NULL, &o, TPT_MS(1), NULL), TP_EINVAL);
        tp_task tk = {.fn = tpt_nop_task, .opts = &o};
        size_t k = 9;
        assert_int_equal(tp_submit_batch(p, &tk, 1, NULL, &k), TP_EINVAL);
        assert_int_equal(k, 0);
        tp_group *gr = NULL;
        assert_int_equal(tp_group_create(p, 0, &gr), TP_OK);
        assert_int_equal(tp_group_submit(gr, tpt_nop_task, NULL, &o, NULL), TP_EINVAL);
        assert_int_equal(tp_group_destroy(gr), TP_OK);
    }
    tp_stats after = tpt_stats(p);
    assert_int_equal(after.submitted, before.submitted); /* TP_EINVAL counts nothing */
    /* every valid priority is accepted */
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
        tp_task_opts o = {0};
        o.priority = pr;
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
    }

    /* configurations */
    tp_pool *q = NULL;
    tp_config c = {0};
    c.workers = 2;
    c.sched = 2;
    assert_int_equal(tp_create(&q, &c), TP_EINVAL);
    c.sched = (unsigned)-1;
    assert_int_equal(tp_create(&q, &c), TP_EINVAL);
    c.sched = TP_SCHED_FIFO;
    c.low_prio_max_running = 3; /* > max_workers (2) */
    assert_int_equal(tp_create(&q, &c), TP_EINVAL);
    c.reserved32 = 1;
    c.low_prio_max_running = 0;
    assert_int_equal(tp_create(&q, &c), TP_EINVAL);
    c.reserved32 = 0;
    c.max_workers = 4; /* elastic: the bound is max_workers */
    c.low_prio_max_running = 4;
    assert_null(q);
    assert_int_equal(tp_create(&q, &c), TP_OK);
    tpt_fx_adopt(f, q);
    tpt_finish(q);
    c.max_workers = 0;
    c.low_prio_max_running = 2; /* = workers */
    c.prio_starve_limit = TP_UNLIMITED;
    c.sched = TP_SCHED_FAIR;
    q = NULL;
    assert_int_equal(tp_create(&q, &c), TP_OK);
    tpt_fx_adopt(f, q);
    tpt_finish(q);
    c.prio_starve_limit = 1;
    c.workers = 0; /* the default worker count; the cap only needs to fit it */
    c.low_prio_max_running = 1;
    q = NULL;
    assert_int_equal(tp_create(&q, &c), TP_OK);
    tpt_fx_adopt(f, q);
    tpt_finish(q);
    c.workers = 1;
    c.low_prio_max_running = TP_UNLIMITED;
    assert_int_equal(tp_create(&q, &c), TP_EINVAL);
    /* against the default worker count, 4 x online CPUs */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus >= 1 && 4 * cpus <= (long)TP_MAX_WORKERS) {
        c.workers = 0;
        c.low_prio_max_running = (unsigned)(4 * cpus) + 1;
        assert_int_equal(tp_create(&q, &c), TP_EINVAL);
        c.low_prio_max_running = (unsigned)(4 * cpus);
        q = NULL;
        assert_int_equal(tp_create(&q, &c), TP_OK);
        tpt_fx_adopt(f, q);
        tpt_finish(q);
    }

    /* the lane and histogram readers */
    tp_lane_stats ls;
    memset(&ls, 0x5a, sizeof ls);
    assert_int_equal(tp_lane_stats_get(NULL, 0, &ls), TP_EINVAL);
    assert_int_equal(tp_lane_stats_get(p, 0, NULL), TP_EINVAL);
    assert_int_equal(tp_lane_stats_get(p, TP_PRIO_MAX + 1, &ls), TP_EINVAL);
    assert_int_equal(tp_lane_stats_get(p, TP_PRIO_MIN - 1, &ls), TP_EINVAL);
    assert_int_equal(tp_lane_stats_get(p, INT_MIN, &ls), TP_EINVAL);
    for (size_t i = 0; i < sizeof ls; i++) assert_int_equal(((unsigned char *)&ls)[i], 0x5a); /* untouched */
    tp_hist *h = tpt_fx_new(f, tp_hist);
    memset(h, 0x5a, sizeof *h);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MAX + 1), h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MIN - 1), h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, 2, h), TP_EINVAL);
    assert_int_equal(tp_hist_get(p, -1, h), TP_EINVAL);
    assert_int_equal(((unsigned char *)h)[0], 0x5a);
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++)
        assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(pr), h), TP_OK);
    tpt_finish(p);
}

/* ------------------------------------------------------------ seeing the lanes */

/* Two workers held by a priority 1 task and a background one; tasks waiting
 * in lanes 2, 0 and -1: each lane's queued and running; at rest the lanes'
 * started sum to started + retried, and queued == running == 0; reserved
 * words are zero. In a FIFO pool and in a fair one: the default lane keeps
 * no waiting count of its own in either (src/scheduler.h), its `queued` is
 * the pool's less the other lanes'. */
static void lane_stats_round(tpt_fixture *f, bool fair) {
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(2, 64, TP_UNLIMITED);
    c.max_retries = 1;
    c.retry_delay_ns = TPT_MS(1);
    c.sched = fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
    tp_pool *p = tpt_fx_pool(f, &c);
    tp_task_opts o = {0};
    o.priority = 1;
    assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 1);
    o.priority = -2;
    assert_int_equal(tp_submit(p, tpt_block_task, l, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&l->waiting) == 2);
    static const int queued_prio[] = {2, 2, 2, 0, 0, -1};
    for (int i = 0; i < 6; i++) {
        o.priority = queued_prio[i];
        assert_int_equal(tp_submit(p, i == 3 ? tpt_fail_once_task : tpt_block_task, l, &o, NULL), TP_OK);
    }
    static const unsigned want_q[5] = {0, 1, 2, 0, 3}, want_r[5] = {1, 0, 0, 1, 0},
                          want_s[5] = {1, 0, 0, 1, 0};
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
        tp_lane_stats ls;
        memset(&ls, 0xab, sizeof ls);
        assert_int_equal(tp_lane_stats_get(p, pr, &ls), TP_OK);
        assert_int_equal(ls.queued, want_q[pr + 2]);
        assert_int_equal(ls.running, want_r[pr + 2]);
        assert_int_equal(ls.started, want_s[pr + 2]);
        for (int i = 0; i < 6; i++) assert_true(ls.reserved[i] == 0);
    }
    tp_stats s = tpt_stats(p);
    tpt_assert_counts(s, TPT_EQ(queued, 6), TPT_EQ(active, 2));
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == 8);
    s = tpt_stats(p);
    assert_int_equal(s.retried, 1);
    uint64_t sum = 0;
    static const unsigned want_started[5] = {1, 1, 3, 1, 3}; /* lane 0: two tasks and one retry */
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
        tp_lane_stats ls;
        memset(&ls, 0xab, sizeof ls);
        assert_int_equal(tp_lane_stats_get(p, pr, &ls), TP_OK);
        assert_int_equal(ls.queued, 0);
        assert_int_equal(ls.running, 0);
        assert_int_equal(ls.started, want_started[pr + 2]);
        for (int i = 0; i < 6; i++) assert_true(ls.reserved[i] == 0);
        sum += ls.started;
    }
    assert_int_equal(sum, s.started + s.retried);
    tpt_finish(p);
}

static void test_lane_stats(void **state) {
    tpt_fixture *f = tpt_fx(state);
    lane_stats_round(f, false);
    lane_stats_round(f, true);
}

/*
 * Lane 0's `started` of a FIFO pool is a counter (taskpool_lane_started_total):
 * it never goes back and never misses a start, while other lanes' tasks start
 * on another worker. One lane-0 task holds a worker; lane-1 tasks run on the
 * other; a reader sees lane 0 at exactly 1 start throughout. It was once
 * derived as the pool's starts less the other lanes', and a lane-1 start
 * that had reached its lane's count but not yet the pool's read as 0 (the
 * model fuzzer's "lane 0 started 0, its tasks entered 1 attempts").
 */
static void test_lane0_started_is_a_counter(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(2, 64, TP_UNLIMITED);
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_fill_workers(p, l, 1, NULL); /* lane 0: one start */
    tp_task_opts o = {0};
    o.priority = 1;
    enum { TASKS = 20000 };
    unsigned submitted = 0, bad = 0;
    uint64_t lowest = 1, highest = 1;
    while (submitted < TASKS) {
        if (tp_submit(p, tpt_nop_task, NULL, &o, NULL) == TP_OK) submitted++;
        for (int r = 0; r < 4; r++) {
            tp_lane_stats ls;
            assert_int_equal(tp_lane_stats_get(p, 0, &ls), TP_OK);
            if (ls.started != 1) bad++;
            if (ls.started < lowest) lowest = ls.started;
            if (ls.started > highest) highest = ls.started;
        }
    }
    TPT_EVENTUALLY(tpt_stats(p).completed == TASKS);
    if (bad)
        fail_msg("lane 0 read %u times as other than 1 start (lowest %llu, highest %llu)", bad,
                 (unsigned long long)lowest, (unsigned long long)highest);
    tp_lane_stats ls;
    assert_int_equal(tp_lane_stats_get(p, 1, &ls), TP_OK);
    assert_int_equal(ls.started, TASKS);
    tpt_finish(p);
}

/* Lane figures at rest, read from a pool that is still alive. */
static void test_lane_stats_at_rest_and_hist(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_latch *l = tpt_fx_latch(f);
    tp_config c = tpt_quiet_config(1, 64, TP_UNLIMITED);
    c.max_retries = 2;
    c.retry_delay_ns = TPT_MS(1);
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_fill_workers(p, l, 1, NULL); /* lane 0, waits no time worth measuring */
    /* a background task that waits at least 30 ms behind the blocked worker */
    tp_task_opts o = {0};
    o.priority = -1;
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
    static const int more[] = {2, 2, 1, -2, 0};
    for (int i = 0; i < 5; i++) {
        o.priority = more[i];
        assert_int_equal(
            tp_submit(p, i == 1 ? tpt_fail_attempts_task : tpt_nop_task, (void *)(uintptr_t)2, &o, NULL),
            TP_OK);
    }
    tpt_sleep_ns(TPT_MS(30)); /* time passes while they wait */
    tpt_latch_open(l);
    TPT_EVENTUALLY(tpt_stats(p).completed == 7);
    uint64_t waited_max = tp_now_ns() - t0;
    tp_stats s = tpt_stats(p);
    assert_int_equal(s.retried, 2);
    assert_int_equal(s.started, 7);
    uint64_t sum = 0, hsum = 0;
    static const uint64_t want_started[5] = {1, 1, 2, 1, 4}; /* lane 2: two tasks, one retried twice */
    tp_hist *h = tpt_fx_new(f, tp_hist);
    for (int pr = TP_PRIO_MIN; pr <= TP_PRIO_MAX; pr++) {
        tp_lane_stats ls;
        assert_int_equal(tp_lane_stats_get(p, pr, &ls), TP_OK);
        assert_int_equal(ls.queued, 0);
        assert_int_equal(ls.running, 0);
        assert_int_equal(ls.started, want_started[pr + 2]);
        sum += ls.started;
        assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT_PRIO(pr), h), TP_OK);
        assert_int_equal(h->count, ls.started); /* one observation per start in the lane */
        uint64_t b = 0;
        for (unsigned i = 0; i < TP_HIST_BUCKETS; i++) b += h->buckets[i];
        assert_int_equal(b, h->count);
        hsum += h->count;
        if (pr == -1) {
            /* it waited >= 30 ms and at most as long as the whole test */
            assert_true(h->sum_ns >= TPT_MS(30));
            assert_true(h->sum_ns <= waited_max + TPT_MS(5));
            assert_true(tp_hist_quantile_ns(h, 1.0) >= TPT_MS(30));
        }
    }
    assert_int_equal(sum, s.started + s.retried);
    assert_int_equal(tp_hist_get(p, TP_HIST_QUEUE_WAIT, h), TP_OK);
    assert_int_equal(h->count, hsum);
    assert_int_equal(hsum, s.started + s.retried);
    tpt_finish(p);
}

/* oldest_wait_ns: 0 with nothing queued; while tasks wait behind blocked
 * workers, at least the time since the oldest was admitted (and not more
 * than since just before); after that one is cancelled, the next one's; a
 * task waiting for its retry delay is not queued; 0 at rest. */
static void test_oldest_wait(void **state) {
    tpt_fixture *f = tpt_fx(state);
    for (int variant = 0; variant < 4; variant++) {
        /* FIFO and fair; the two tasks in lanes -1 and 2, or both in lane 0
         * (a FIFO pool's ring) */
        int fair = variant & 1, same_lane = variant >= 2;
        tpt_latch *l = tpt_fx_latch(f);
        tp_config c = tpt_quiet_config(1, 64, TP_UNLIMITED);
        c.sched = fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
        c.max_retries = 1;
        c.retry_delay_ns = TPT_S(60);
        tp_pool *p = tpt_fx_pool(f, &c);
        assert_true(tpt_stats(p).oldest_wait_ns == 0);
        tpt_fill_workers(p, l, 1, NULL);
        assert_true(tpt_stats(p).oldest_wait_ns == 0);

        uint64_t before1 = tp_now_ns();
        tp_task_opts o = {0};
        o.priority = same_lane ? 0 : -1;
        uint64_t id1 = 0;
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, &id1), TP_OK);
        uint64_t after1 = tp_now_ns();
        tpt_sleep_ns(TPT_MS(20));
        uint64_t before2 = tp_now_ns();
        o.priority = same_lane ? 0 : 2;
        o.user = "x";
        assert_int_equal(tp_submit(p, tpt_nop_task, NULL, &o, NULL), TP_OK);
        uint64_t after2 = tp_now_ns();
        tpt_sleep_ns(TPT_MS(20));

        uint64_t r0 = tp_now_ns();
        tp_stats s = tpt_stats(p);
        uint64_t r1 = tp_now_ns();
        /* the oldest is the background one, whatever the lanes */
        assert_true(s.oldest_wait_ns >= r0 - after1 - TPT_MS(1));
        assert_true(s.oldest_wait_ns <= r1 - before1 + TPT_MS(1));
        assert_true(s.oldest_wait_ns >= TPT_MS(39));
        tp_stats s2 = tpt_stats(p);
        assert_true(s2.oldest_wait_ns >= s.oldest_wait_ns); /* it grows while it waits */

        assert_int_equal(tp_cancel(p, id1), TP_OK);
        r0 = tp_now_ns();
        s = tpt_stats(p);
        r1 = tp_now_ns();
        assert_true(s.oldest_wait_ns >= r0 - after2 - TPT_MS(1));
        assert_true(s.oldest_wait_ns <= r1 - before2 + TPT_MS(1));

        /* a failed attempt waiting for its retry delay is not queued */
        tpt_latch_open(l);
        TPT_EVENTUALLY(tpt_stats(p).completed == 3);
        assert_true(tpt_stats(p).oldest_wait_ns == 0);
        uint64_t fid = 0;
        o = (tp_task_opts){0};
        assert_int_equal(tp_submit(p, tpt_fail_once_task, NULL, &o, &fid), TP_OK);
        TPT_EVENTUALLY(tpt_stats(p).delayed == 1);
        tpt_sleep_ns(TPT_MS(5));
        s = tpt_stats(p);
        assert_int_equal(s.queued, 0);
        assert_true(s.oldest_wait_ns == 0);
        assert_int_equal(tp_cancel(p, fid), TP_OK);
        s = tpt_finish(p);
        assert_true(s.oldest_wait_ns == 0);
    }
}

static _Atomic uint64_t fail_end_at;
static int fail_once_stamped(tp_ctx *c, void *arg) {
    (void)arg;
    if (tp_ctx_attempt(c) > 0) return 0;
    atomic_store(&fail_end_at, tp_now_ns());
    return 1;
}

/* A retry back in the queue has waited since its return, not since its
 * admission. The worker must be busy before the retry returns, within the
 * retry delay: under tpt_with_time_to_spare. */
static bool retry_waits_from_return(tpt_fixture *f, uint64_t delay, void *arg) {
    tpt_latch *l = arg;
    tpt_latch_rearm(l);
    tp_config c = tpt_quiet_config(1, 8, TP_UNLIMITED);
    c.max_retries = 1;
    c.retry_delay_ns = delay;
    tp_pool *p = tpt_fx_pool(f, &c);
    atomic_store(&fail_end_at, 0);
    uint64_t t0 = tp_now_ns();
    assert_int_equal(tp_submit(p, fail_once_stamped, NULL, NULL, NULL), TP_OK);
    tp_stats s;
    bool in_time =
        TPT_POLL((s = tpt_stats(p)).delayed == 1 || s.completed == 1, TPT_WAIT_NS) && s.delayed == 1;
    if (in_time) {
        tpt_fill_workers(p, l, 1, NULL); /* the worker is busy when the retry returns */
        in_time = tpt_stats(p).delayed == 1;
    }
    if (!in_time) {
        tpt_latch_open(l);
        tpt_finish(p);
        return false;
    }
    TPT_EVENTUALLY((s = tpt_stats(p)).queued == 1 && s.delayed == 0);
    tpt_sleep_ns(TPT_MS(30));
    s = tpt_stats(p);
    uint64_t r1 = tp_now_ns(); /* after the read: the bound holds however long the read took to start */
    uint64_t back_at = atomic_load(&fail_end_at) + delay; /* the retry returned no earlier */
    assert_true(s.oldest_wait_ns > 0);
    if (s.oldest_wait_ns > r1 - back_at + TPT_MS(1))
        fail_msg("the retry has waited %llu ms by oldest_wait_ns, but it returned %llu ms ago (admitted %llu "
                 "ms ago)",
                 (unsigned long long)(s.oldest_wait_ns / 1000000),
                 (unsigned long long)((r1 - back_at) / 1000000), (unsigned long long)((r1 - t0) / 1000000));
    tpt_latch_open(l);
    s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(retried, 1), TPT_EQ(succeeded, 2));
    return true;
}

static void test_oldest_wait_of_a_retry(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tpt_with_time_to_spare(f, TPT_MS(100), retry_waits_from_return, tpt_fx_latch(f));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_strict_lanes_fifo_within),
        TPT_TEST(test_starve_limit_1_2_3_unlimited),
        TPT_TEST(test_starve_limit_default_16),
        TPT_TEST(test_several_starved_lanes),
        TPT_TEST(test_lane0_count_resets_when_it_starts_alone),
        TPT_TEST(test_cancel_in_starved_lane),
        TPT_TEST(test_expiry_in_starved_lane),
        TPT_TEST(test_expiry_under_strict_stream),
        TPT_TEST(test_retry_back_of_own_lane),
        TPT_TEST(test_random_limit_1),
        TPT_TEST(test_random_limit_2),
        TPT_TEST(test_random_limit_3_two_lanes),
        TPT_TEST(test_random_default_limit),
        TPT_TEST(test_random_strict),
        TPT_TEST(test_low_prio_cap_not_ready_counts_reset),
        TPT_TEST(test_low_prio_cap_several_workers),
        TPT_TEST(test_low_prio_cap_elastic_growth),
        TPT_TEST(test_lanes_stress_several_workers),
        TPT_TEST(test_batch_mixed_priorities),
        TPT_TEST(test_batch_mixed_cut_at_bound),
        TPT_TEST(test_batch_adjacent_in_lanes_concurrent),
        TPT_TEST(test_group_cancel_mixed_lanes),
        TPT_TEST(test_group_cancel_on_error_mixed_lanes),
        TPT_TEST(test_invalid_priorities_and_configs),
        TPT_TEST(test_lane_stats),
        TPT_TEST(test_lane0_started_is_a_counter),
        TPT_TEST(test_lane_stats_at_rest_and_hist),
        TPT_TEST(test_oldest_wait),
        TPT_TEST(test_oldest_wait_of_a_retry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
