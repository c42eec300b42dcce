/*
 * test_scheduler.c -- the scheduler unit (src/scheduler.c) without threads
 * or a pool: which waiting task starts next, by the rules of taskpool.h
 * section 14.
 *
 * Covers, with hand-written orders: FIFO within a lane, strict lanes, the
 * starvation count (limits 1, 2, 16, TP_UNLIMITED; several starved lanes;
 * counts reset when a lane empties or stops being ready), low_prio_max_running
 * (background lanes not ready while capped; tp__sched_done reports when one
 * becomes ready again), fair rounds (the header's worked example, weights,
 * the anonymous flow, leaving and rejoining the round, a weight change from
 * the next turn, removal of a flow's last task), retries going to the back,
 * the expiry take and the take-all, and the published lane figures. Then a
 * differential test: random pushes, starts, ends and removals against a naive
 * model of the same rules (arrays, O(n) per step), in FIFO and fair mode.
 */
#include "pool.h" /* first: it defines _GNU_SOURCE */
#include "tp_test.h"

/* A task as the scheduler sees it: lane, flow, stamp, deadline. */
static void mk(tp__task *t, int id, int prio, tp__flow *flow, uint64_t at) {
    memset(t, 0, sizeof *t);
    t->id = (uint64_t)id;
    t->prio = (int8_t)prio;
    t->flow = flow;
    t->queued_at = at;
    t->deadline = TP_FOREVER;
    t->state = TP__QUEUED;
}

/* Start everything that may start, in order, as ids; each started task ends
 * at once when `end` (so background caps do not bind). Returns how many. */
static int drain(tp__sched *s, int *ids, int max, bool end) {
    int n = 0;
    tp__task *t;
    while (n < max && (t = tp__sched_peek(s)) != NULL) {
        tp__sched_start(s, t);
        ids[n++] = (int)t->id;
        if (end) tp__sched_done(s, t);
    }
    return n;
}

static void assert_order(const int *got, int n, const int *want, int m, const char *what) {
    char g[512] = "", w[512] = "";
    for (int i = 0; i < n; i++) snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
    for (int i = 0; i < m; i++) snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[i]);
    if (n != m || strcmp(g, w) != 0) fail_msg("%s: started%s, expected%s", what, g, w);
}

#define ORDER(s, end, what, ...)                                                                             \
    do {                                                                                                     \
        static const int want_[] = {__VA_ARGS__};                                                            \
        int got_[64];                                                                                        \
        int n_ = drain((s), got_, 64, (end));                                                                \
        assert_order(got_, n_, want_, (int)(sizeof want_ / sizeof want_[0]), (what));                        \
    } while (0)

/* ------------------------------------------------------------ FIFO pools */

static void test_fifo_lane_zero_is_the_ring(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 8, false, 16, 0), 0);
    tp__task t[6];
    for (int i = 0; i < 6; i++) {
        mk(&t[i], i + 1, 0, NULL, 100 + (uint64_t)i);
        tp__sched_push(&s, &t[i]);
    }
    assert_int_equal(s.in_others, 0);
    assert_int_equal(tp__sched_waiting(&s), 6);
    assert_true(tp__sched_oldest_at(&s) == 100);
    ORDER(&s, true, "lane 0 in admission order", 1, 2, 3, 4, 5, 6);
    assert_true(tp__sched_oldest_at(&s) == 0);
    /* the ring lane publishes only its head's stamp: its counts are the
     * pool's totals less the other lanes' (stats.c) */
    assert_true(atomic_load(&s.lane[2].started_pub) == 0);
    assert_true(atomic_load(&s.ring_head_at) == 0);
    tp__sched_fini(&s);
}

static void test_strict_lanes_fifo_within(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 32, false, TP_UNLIMITED, 0), 0);
    tp__task t[10];
    static const int prio[10] = {0, -2, 2, 1, -1, 0, 2, -2, 1, 0};
    for (int i = 0; i < 10; i++) {
        mk(&t[i], i + 1, prio[i], NULL, 1000 + (uint64_t)i);
        tp__sched_push(&s, &t[i]);
    }
    assert_true(tp__sched_oldest_at(&s) == 1000);
    /* 2: ids 3, 7; 1: 4, 9; 0: 1, 6, 10; -1: 5; -2: 2, 8 */
    ORDER(&s, true, "strict lanes", 3, 7, 4, 9, 1, 6, 10, 5, 2, 8);
    tp__sched_fini(&s);
}

/* Limit 2: after two starts of a higher lane, a lane that stayed ready takes
 * the next one; its count returns to 0 when it starts. */
static void test_starvation_count(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, false, 2, 0), 0);
    tp__task u[7], n[3];
    for (int i = 0; i < 7; i++) mk(&u[i], 10 + i, 2, NULL, 1);
    for (int i = 0; i < 3; i++) mk(&n[i], 20 + i, 0, NULL, 1);
    for (int i = 0; i < 7; i++) tp__sched_push(&s, &u[i]);
    for (int i = 0; i < 3; i++) tp__sched_push(&s, &n[i]);
    ORDER(&s, true, "limit 2", 10, 11, 20, 12, 13, 21, 14, 15, 22, 16);
    tp__sched_fini(&s);

    /* limit 1: alternate */
    assert_int_equal(tp__sched_init(&s, 64, false, 1, 0), 0);
    for (int i = 0; i < 4; i++) tp__sched_push(&s, &u[i]);
    for (int i = 0; i < 3; i++) tp__sched_push(&s, &n[i]);
    ORDER(&s, true, "limit 1", 10, 20, 11, 21, 12, 22, 13);
    tp__sched_fini(&s);

    /* strict: never */
    assert_int_equal(tp__sched_init(&s, 64, false, TP_UNLIMITED, 0), 0);
    for (int i = 0; i < 4; i++) tp__sched_push(&s, &u[i]);
    for (int i = 0; i < 2; i++) tp__sched_push(&s, &n[i]);
    ORDER(&s, true, "strict", 10, 11, 12, 13, 20, 21);
    tp__sched_fini(&s);
}

/* Three lanes ready, limit 2: starts of lane 2 count in lanes 0 and -2; when
 * both have reached the limit the higher one (0) goes first; lane -2 also
 * counts the start of lane 0 (a higher lane) and keeps its count. */
static void test_several_starved_lanes(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, false, 2, 0), 0);
    tp__task u[6], n[2], b[2];
    for (int i = 0; i < 6; i++) mk(&u[i], 10 + i, 2, NULL, 1);
    for (int i = 0; i < 2; i++) mk(&n[i], 20 + i, 0, NULL, 1);
    for (int i = 0; i < 2; i++) mk(&b[i], 30 + i, -2, NULL, 1);
    for (int i = 0; i < 6; i++) tp__sched_push(&s, &u[i]);
    for (int i = 0; i < 2; i++) tp__sched_push(&s, &n[i]);
    for (int i = 0; i < 2; i++) tp__sched_push(&s, &b[i]);
    /* counts (n, b) after each start: u10 (1, 1), u11 (2, 2): both starved,
     * the higher first: n20 (0, 3), then b30 (0, 0) -- n and u do not count
     * starts of a lower lane -- u12 (1, 1), u13 (2, 2), n21 (n empty, 3),
     * b31, u14, u15 */
    ORDER(&s, true, "two starved lanes", 10, 11, 20, 30, 12, 13, 21, 31, 14, 15);
    tp__sched_fini(&s);
}

/* A lane that empties (its task cancelled) or stops being ready loses its
 * count. */
static void test_starvation_reset(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, false, 2, 0), 0);
    tp__task u[5], n[2];
    for (int i = 0; i < 5; i++) mk(&u[i], 10 + i, 2, NULL, 1);
    for (int i = 0; i < 2; i++) mk(&n[i], 20 + i, 0, NULL, 1);
    for (int i = 0; i < 5; i++) tp__sched_push(&s, &u[i]);
    tp__sched_push(&s, &n[0]);
    tp__task *t = tp__sched_peek(&s);
    assert_ptr_equal(t, &u[0]);
    tp__sched_start(&s, t);      /* lane 0: count 1 */
    tp__sched_remove(&s, &n[0]); /* empties lane 0: count 0 */
    tp__sched_push(&s, &n[1]);   /* ready again from 0 */
    ORDER(&s, true, "count reset by emptying", 11, 12, 21, 13, 14);
    assert_int_equal(s.lane[2].starve, 0);
    tp__sched_fini(&s);
}

/* low_prio_max_running 1: a background lane is not ready while one of its
 * tasks runs; then it counts nothing, and a normal task goes first whatever
 * the background counts were. */
static void test_low_prio_cap(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, false, 1, 1), 0);
    tp__task b[3], n[3];
    for (int i = 0; i < 3; i++) mk(&b[i], 30 + i, -1, NULL, 1);
    for (int i = 0; i < 3; i++) mk(&n[i], 20 + i, 0, NULL, 1);
    for (int i = 0; i < 3; i++) tp__sched_push(&s, &b[i]);
    for (int i = 0; i < 3; i++) tp__sched_push(&s, &n[i]);
    int got[8], k = 0;
    tp__task *t = tp__sched_peek(&s);
    assert_ptr_equal(t, &n[0]);
    tp__sched_start(&s, t); /* lane -1 counts 1 (limit 1: starved) */
    got[k++] = (int)t->id;
    t = tp__sched_peek(&s);
    assert_ptr_equal(t, &b[0]); /* starved lane takes the next start */
    tp__sched_start(&s, t);
    got[k++] = (int)t->id;
    assert_int_equal(s.low_running, 1);
    assert_false(tp__sched_startable(&s) > 2); /* b31 b32 are not startable */
    /* capped: only normal tasks start, and the background lane counts nothing */
    t = tp__sched_peek(&s);
    assert_ptr_equal(t, &n[1]);
    tp__sched_start(&s, t);
    got[k++] = (int)t->id;
    t = tp__sched_peek(&s);
    assert_ptr_equal(t, &n[2]);
    tp__sched_start(&s, t);
    got[k++] = (int)t->id;
    assert_int_equal(s.lane[1].starve, 0);
    assert_null(tp__sched_peek(&s)); /* only capped background tasks wait */
    assert_false(tp__sched_ready(&s));
    assert_int_equal(tp__sched_startable(&s), 0);
    assert_false(tp__sched_done(&s, &n[0])); /* a normal task ended: no change */
    assert_true(tp__sched_done(&s, &b[0]));  /* the background one: ready again */
    assert_true(tp__sched_ready(&s));
    t = tp__sched_peek(&s);
    assert_ptr_equal(t, &b[1]);
    tp__sched_start(&s, t);
    got[k++] = (int)t->id;
    static const int want[] = {20, 30, 21, 22, 31};
    assert_order(got, k, want, 5, "low_prio_max_running 1");
    tp__sched_fini(&s);
}

/* ------------------------------------------------------------ fair pools */

/* The header's worked example: weights alice 2, bob 1; a1..a4, b1, b2, n1
 * (no user) in lane 0, then u1 in lane 2. */
static void test_fair_worked_example(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, true, 16, 0), 0);
    tp__flow alice, bob;
    tp__flow_init(&alice, 2);
    tp__flow_init(&bob, 1);
    tp__task a[4], b[2], n1, u1;
    for (int i = 0; i < 4; i++) mk(&a[i], 11 + i, 0, &alice, 1);
    for (int i = 0; i < 2; i++) mk(&b[i], 21 + i, 0, &bob, 1);
    mk(&n1, 31, 0, &s.anon, 1);
    mk(&u1, 41, 2, &s.anon, 1);
    for (int i = 0; i < 4; i++) tp__sched_push(&s, &a[i]);
    for (int i = 0; i < 2; i++) tp__sched_push(&s, &b[i]);
    tp__sched_push(&s, &n1);
    tp__sched_push(&s, &u1);
    ORDER(&s, true, "worked example", 41, 11, 12, 21, 31, 13, 14, 22);
    tp__sched_fini(&s);
}

/* A user that runs out of waiting tasks leaves the round; its next task joins
 * at the back. A weight change applies from the next turn. */
static void test_fair_round_leave_rejoin_weight(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, true, 16, 0), 0);
    tp__flow x, y, z;
    tp__flow_init(&x, 1);
    tp__flow_init(&y, 1);
    tp__flow_init(&z, 1);
    tp__task t[12];
    mk(&t[0], 1, 0, &x, 1);
    mk(&t[1], 2, 0, &y, 1);
    mk(&t[2], 3, 0, &y, 1);
    mk(&t[3], 4, 0, &z, 1);
    for (int i = 0; i < 4; i++) tp__sched_push(&s, &t[i]);
    /* round x y z: x1 starts, x leaves */
    tp__task *p = tp__sched_peek(&s);
    assert_ptr_equal(p, &t[0]);
    tp__sched_start(&s, p);
    assert_false(tp__flow_lane(&x, 2)->in_round);
    mk(&t[4], 5, 0, &x, 1); /* x rejoins at the back: y z x */
    tp__sched_push(&s, &t[4]);
    /* y's turn under way? no: y (weight 1) starts 2, goes back: z x y */
    p = tp__sched_peek(&s);
    assert_ptr_equal(p, &t[1]);
    tp__sched_start(&s, p);
    tp__flow_set_weight(&y, 3); /* from y's next turn */
    mk(&t[5], 6, 0, &y, 1);
    mk(&t[6], 7, 0, &y, 1);
    mk(&t[7], 8, 0, &y, 1);
    for (int i = 5; i < 8; i++) tp__sched_push(&s, &t[i]);
    /* z4, x5, then y's turn of 3: 3 6 7, then y alone: 8 */
    ORDER(&s, true, "leave, rejoin, new weight", 4, 5, 3, 6, 7, 8);
    tp__sched_fini(&s);
}

/* Removing a flow's last waiting task takes it out of the round; removing the
 * head flow's head does not start its turn. Retries go to the back of their
 * user's list and of the round if it left. */
static void test_fair_remove_and_retry(void **state) {
    (void)state;
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 64, true, 16, 0), 0);
    tp__flow x, y;
    tp__flow_init(&x, 2);
    tp__flow_init(&y, 1);
    tp__task t[8];
    mk(&t[0], 1, 0, &x, 1);
    mk(&t[1], 2, 0, &x, 1);
    mk(&t[2], 3, 0, &y, 1);
    mk(&t[3], 4, 0, &x, 1);
    for (int i = 0; i < 4; i++) tp__sched_push(&s, &t[i]);
    tp__sched_remove(&s, &t[0]); /* x's head: its turn has not started */
    tp__sched_remove(&s, &t[2]); /* y's last: y leaves */
    assert_false(tp__flow_lane(&y, 2)->in_round);
    assert_int_equal(tp__sched_waiting(&s), 2);
    tp__task *p = tp__sched_peek(&s);
    assert_ptr_equal(p, &t[1]);
    tp__sched_start(&s, p); /* x's turn: 2 of 2 left -> 1 left */
    /* the attempt failed: back of x's list, as a retry (a new stamp) */
    tp__sched_done(&s, p);
    p->queued_at = 5;
    tp__sched_push(&s, p);
    mk(&t[4], 5, 0, &y, 1);
    tp__sched_push(&s, &t[4]); /* y joins behind x */
    ORDER(&s, true, "remove, retry", 4, 5, 2);
    tp__sched_fini(&s);
}

/* ------------------------------------------------------------ takes */

static void test_take_expired_and_all(void **state) {
    (void)state;
    for (int fair = 0; fair < 2; fair++) {
        tp__sched s;
        assert_int_equal(tp__sched_init(&s, 64, fair, 16, 0), 0);
        tp__flow f;
        tp__flow_init(&f, 1);
        tp__task t[8];
        for (int i = 0; i < 8; i++) {
            mk(&t[i], i + 1, i % 3 - 1, fair ? (i % 2 ? &f : &s.anon) : NULL, (uint64_t)(10 + i));
            t[i].deadline = i % 2 ? 100 : 200;
            tp__sched_push(&s, &t[i]);
        }
        tp__task *list;
        uint64_t next = tp__sched_take_expired(&s, 150, &list);
        assert_true(next == 200);
        /* lanes from the top (1, 0, -1), each oldest first: 6 | 2 8 | 4 */
        int ids[8], n = 0;
        for (tp__task *x = list; x; x = x->next) ids[n++] = (int)x->id;
        static const int want[] = {6, 2, 8, 4};
        assert_order(ids, n, want, 4, "expired");
        assert_int_equal(tp__sched_waiting(&s), 4);
        assert_true(tp__sched_oldest_at(&s) == 10);
        tp__sched_take_all(&s, &list);
        n = 0;
        for (tp__task *x = list; x; x = x->next) ids[n++] = (int)x->id;
        static const int rest[] = {3, 5, 1, 7};
        assert_order(ids, n, rest, 4, "all");
        assert_int_equal(tp__sched_waiting(&s), 0);
        assert_true(tp__sched_oldest_at(&s) == 0);
        for (int l = 0; l < TP__LANES; l++) assert_true(atomic_load(&s.lane[l].waiting_pub) == 0);
        assert_null(tp__sched_peek(&s));
        tp__sched_fini(&s);
    }
}

/* ------------------------------------------------------------ against a model */

/*
 * The model: every waiting task in one array in push order, and per lane the
 * starvation count; per flow and lane the credit of its turn and whether it
 * is in the round, the round an array of flows. The next task: the lane by
 * the rules, then in a FIFO pool the first waiting task of that lane, in a
 * fair pool the first waiting task of the round's head flow.
 */
enum { M_TASKS = 48, M_FLOWS = 4 };
typedef struct model {
    bool fair;
    unsigned limit, low_max, low_running;
    tp__task *w[M_TASKS * 4]; /* waiting, push order */
    int nw;
    unsigned starve[TP__LANES], running[TP__LANES];
    tp__flow *round[TP__LANES][M_FLOWS + 1];
    int nround[TP__LANES];
    unsigned credit[TP__LANES][M_FLOWS + 1];
} model;

static int flow_ix(tp__flow *f, tp__flow *flows, tp__flow *anon) {
    return f == anon ? M_FLOWS : (int)(f - flows);
}

static int m_lane_waiting(const model *m, unsigned li) {
    int n = 0;
    for (int i = 0; i < m->nw; i++) n += tp__lane_of(m->w[i]->prio) == li;
    return n;
}

static bool m_ready(const model *m, unsigned li) {
    bool low_ok = m->low_max == 0 || m->low_running < m->low_max;
    return m_lane_waiting(m, li) > 0 && (li >= 2 || low_ok);
}

static void m_round_remove(model *m, unsigned li, tp__flow *f) {
    for (int i = 0; i < m->nround[li]; i++)
        if (m->round[li][i] == f) {
            memmove(&m->round[li][i], &m->round[li][i + 1], (size_t)(m->nround[li] - i - 1) * sizeof f);
            m->nround[li]--;
            return;
        }
}

static bool m_in_round(const model *m, unsigned li, tp__flow *f) {
    for (int i = 0; i < m->nround[li]; i++)
        if (m->round[li][i] == f) return true;
    return false;
}

static bool m_flow_waits(const model *m, unsigned li, tp__flow *f) {
    for (int i = 0; i < m->nw; i++)
        if (tp__lane_of(m->w[i]->prio) == li && m->w[i]->flow == f) return true;
    return false;
}

static void m_push(model *m, tp__task *t) {
    m->w[m->nw++] = t;
    unsigned li = tp__lane_of(t->prio);
    if (m->fair && !m_in_round(m, li, t->flow)) m->round[li][m->nround[li]++] = t->flow;
}

static void m_unwait(model *m, tp__task *t) {
    for (int i = 0; i < m->nw; i++)
        if (m->w[i] == t) {
            memmove(&m->w[i], &m->w[i + 1], (size_t)(m->nw - i - 1) * sizeof t);
            m->nw--;
            return;
        }
    fail_msg("model: task %d not waiting", (int)t->id);
}

static tp__task *m_peek(const model *m) {
    int pick = -1;
    for (int i = TP__LANES - 1; i >= 0 && pick < 0; i--)
        if (m_ready(m, (unsigned)i) && m->limit != TP_UNLIMITED && m->starve[i] >= m->limit) pick = i;
    for (int i = TP__LANES - 1; i >= 0 && pick < 0; i--)
        if (m_ready(m, (unsigned)i)) pick = i;
    if (pick < 0) return NULL;
    tp__flow *head = m->fair ? m->round[pick][0] : NULL;
    for (int i = 0; i < m->nw; i++)
        if (tp__lane_of(m->w[i]->prio) == (unsigned)pick && (!head || m->w[i]->flow == head)) return m->w[i];
    fail_msg("model: no task in the picked lane");
    return NULL;
}

static void m_start(model *m, tp__task *t, tp__flow *flows, tp__flow *anon) {
    unsigned li = tp__lane_of(t->prio);
    for (unsigned i = 0; i < li; i++)
        if (m_ready(m, i)) m->starve[i]++;
    m->starve[li] = 0;
    m_unwait(m, t);
    if (m->fair) {
        int fi = flow_ix(t->flow, flows, anon);
        if (m->credit[li][fi] == 0) m->credit[li][fi] = tp__flow_weight(t->flow);
        m->credit[li][fi]--;
        if (!m_flow_waits(m, li, t->flow)) {
            m_round_remove(m, li, t->flow);
            m->credit[li][fi] = 0;
        } else if (m->credit[li][fi] == 0) {
            m_round_remove(m, li, t->flow);
            m->round[li][m->nround[li]++] = t->flow;
        }
    }
    m->running[li]++;
    if (li < 2) {
        m->low_running++;
        if (m->low_max && m->low_running >= m->low_max) m->starve[0] = m->starve[1] = 0;
    }
    if (m_lane_waiting(m, li) == 0) m->starve[li] = 0;
}

static void m_remove(model *m, tp__task *t, tp__flow *flows, tp__flow *anon) {
    unsigned li = tp__lane_of(t->prio);
    m_unwait(m, t);
    if (m->fair && !m_flow_waits(m, li, t->flow)) {
        m_round_remove(m, li, t->flow);
        m->credit[li][flow_ix(t->flow, flows, anon)] = 0;
    }
    if (m_lane_waiting(m, li) == 0) m->starve[li] = 0;
}

/* A fair lane's round is the model's, in order, and every copy of a head
 * pointer (the lane's rhead_head, each flow's rnext_head) is that flow's
 * head: the start fetches ahead the task they name. */
static void check_round(const tp__sched *s, const model *m, unsigned li, uint32_t seed, int step) {
    const tp__lane *l = &s->lane[li];
    tp__task *want_head = l->rhead ? tp__flow_lane(l->rhead, li)->head : NULL;
    if (l->rhead_head != want_head)
        fail_msg("seed %u step %d: lane %u's rhead_head is stale", seed, step, li);
    int n = 0;
    for (tp__flow *f = l->rhead; f; f = tp__flow_lane(f, li)->rnext, n++) {
        const struct tp__flow_lane *fl = tp__flow_lane(f, li);
        assert_true(n < m->nround[li] && m->round[li][n] == f);
        assert_non_null(fl->head);
        tp__task *next_head = fl->rnext ? tp__flow_lane(fl->rnext, li)->head : NULL;
        if (fl->rnext_head != next_head)
            fail_msg("seed %u step %d: lane %u, flow %d of the round: rnext_head is stale", seed, step, li,
                     n);
    }
    assert_int_equal(n, m->nround[li]);
}

static void differential(bool fair, unsigned limit, unsigned low_max, uint32_t seed) {
    tp__sched s;
    assert_int_equal(tp__sched_init(&s, 4 * M_TASKS, fair, limit, low_max), 0);
    model m;
    memset(&m, 0, sizeof m);
    m.fair = fair;
    m.limit = limit;
    m.low_max = low_max;
    tp__flow flows[M_FLOWS];
    for (int i = 0; i < M_FLOWS; i++) tp__flow_init(&flows[i], 1 + (unsigned)i % 3);
    tp__task *t = calloc(M_TASKS, sizeof *t);
    assert_non_null(t);
    int state_of[M_TASKS] = {0}; /* 0 free, 1 waiting, 2 running */
    uint32_t r = seed;
    for (int step = 0; step < 4000; step++) {
        int i = (int)(tpt_xorshift(&r) % M_TASKS);
        unsigned op = tpt_xorshift(&r) % 8;
        if (op < 3 && state_of[i] == 0) { /* push (new, or a retry) */
            int prio = (int)(tpt_xorshift(&r) % 5) - 2;
            tp__flow *f =
                fair ? (tpt_xorshift(&r) % 5 == 0 ? &s.anon : &flows[tpt_xorshift(&r) % M_FLOWS]) : NULL;
            mk(&t[i], i + 1, prio, f, (uint64_t)step + 1);
            tp__sched_push(&s, &t[i]);
            m_push(&m, &t[i]);
            state_of[i] = 1;
        } else if (op < 5) { /* start the next */
            tp__task *want = m_peek(&m), *got = tp__sched_peek(&s);
            if (want != got)
                fail_msg("seed %u step %d: next is %d, the model says %d", seed, step, got ? (int)got->id : 0,
                         want ? (int)want->id : 0);
            if (got) {
                tp__sched_start(&s, got);
                m_start(&m, got, flows, &s.anon);
                state_of[got->id - 1] = 2;
            }
        } else if (op < 7 && state_of[i] == 2) { /* an attempt ends */
            bool woke = tp__sched_done(&s, &t[i]);
            unsigned li = tp__lane_of(t[i].prio);
            m.running[li]--;
            bool want_woke = false;
            if (li < 2) {
                want_woke = m.low_max && m.low_running == m.low_max &&
                            (m_lane_waiting(&m, 0) + m_lane_waiting(&m, 1));
                m.low_running--;
            }
            assert_int_equal(woke, want_woke);
            state_of[i] = 0;
        } else if (state_of[i] == 1) { /* cancel or expiry */
            tp__sched_remove(&s, &t[i]);
            m_remove(&m, &t[i], flows, &s.anon);
            state_of[i] = 0;
        }
        /* the counts and published figures agree */
        assert_int_equal(tp__sched_waiting(&s), m.nw);
        for (unsigned l = 0; l < TP__LANES; l++) {
            if (s.lane[l].starve != m.starve[l])
                fail_msg("seed %u step %d: lane %u counts %u, the model %u", seed, step, l, s.lane[l].starve,
                         m.starve[l]);
            if (fair) check_round(&s, &m, l, seed, step);
            if (l == 2) { /* the default lane's count: the total less the others' */
                assert_int_equal(s.waiting - s.in_others, m_lane_waiting(&m, l));
                assert_true(atomic_load(&s.lane[l].waiting_pub) == 0);
                if (!fair) continue; /* the ring lane publishes no counts */
            } else {
                assert_int_equal(atomic_load(&s.lane[l].waiting_pub), m_lane_waiting(&m, l));
            }
            assert_int_equal(atomic_load(&s.lane[l].running_pub), m.running[l]);
        }
        uint64_t oldest = 0;
        for (int k = 0; k < m.nw; k++)
            if (!oldest || m.w[k]->queued_at < oldest) oldest = m.w[k]->queued_at;
        assert_true(tp__sched_oldest_at(&s) == oldest);
    }
    free(t);
    tp__sched_fini(&s);
}

static void test_against_model(void **state) {
    (void)state;
    static const unsigned limits[] = {1, 2, 3, 16, TP_UNLIMITED};
    for (uint32_t seed = 1; seed <= 40; seed++)
        for (int fair = 0; fair < 2; fair++)
            differential(fair, limits[seed % 5], seed % 3 == 0 ? 0 : seed % 3, seed * 2654435761u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_fifo_lane_zero_is_the_ring),
        TPT_TEST(test_strict_lanes_fifo_within),
        TPT_TEST(test_starvation_count),
        TPT_TEST(test_several_starved_lanes),
        TPT_TEST(test_starvation_reset),
        TPT_TEST(test_low_prio_cap),
        TPT_TEST(test_fair_worked_example),
        TPT_TEST(test_fair_round_leave_rejoin_weight),
        TPT_TEST(test_fair_remove_and_retry),
        TPT_TEST(test_take_expired_and_all),
        TPT_TEST(test_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
