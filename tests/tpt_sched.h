/*
 * tpt_sched.h -- start orders through a real pool, and the rules of
 * taskpool.h section 14 as a reference model to compare them with.
 *
 * Included by the test executables about scheduling (test_priority.c,
 * test_fair.c). Two parts:
 *
 * The recorder. Every task of a scenario is a tpt_otask whose function
 * (tpt_otask_fn) takes the next start index, writes its tag (plus
 * TPT_RETRY_TAG x attempt for a retry) at that index, and then waits on the
 * latch the test armed for that index, if any, and on its own gate, if any;
 * attempts below `fail` return 1. With one worker the recorded order is the
 * order in which the scheduler started the tasks, and a latch armed at index
 * i stops the worker exactly after the i-th start: the test then changes the
 * waiting set (submits, cancels, weights) at a point of the order it knows.
 *
 * The model. tpm is a naive, array-based statement of the rules as the
 * header words them -- lanes, the starvation count, the round of users with
 * its quanta -- for one worker (so low_prio_max_running never binds: a
 * lane is ready when it has a waiting task). It knows nothing of the
 * library's data structures; it is written from the contract alone, and the
 * tests compare the recorded order with the order it predicts.
 *
 * Pool threads write only atomics here; the main thread asserts.
 */
#ifndef TPT_SCHED_H
#define TPT_SCHED_H

#include "tp_test.h"

/* ------------------------------------------------------------ the recorder */

#define TPT_ORD_MAX   4096
#define TPT_RETRY_TAG 10000 /* recorded tag of attempt a: tag + a x TPT_RETRY_TAG */

typedef struct tpt_ord {
    atomic_int n;                          /* starts so far */
    atomic_int recorded;                   /* starts whose tag is stored (n counts a start before) */
    atomic_int tag[TPT_ORD_MAX];           /* the tag of the i-th start */
    tpt_latch *_Atomic at[TPT_ORD_MAX];    /* the i-th start waits on it (NULL: no) */
    atomic_int fail_at[TPT_ORD_MAX];       /* the i-th start fails (returns 1) */
    _Atomic uint64_t t_start[TPT_ORD_MAX]; /* tp_now_ns() at the i-th start */
    tp_pool *_Atomic pool;                 /* set: a stop records the pool's delayed count */
    atomic_int delayed_at[TPT_ORD_MAX];    /* stats.delayed when the i-th start stopped */
} tpt_ord;

typedef struct tpt_otask {
    tpt_ord *o;
    int tag;
    int fail;          /* attempts < fail return 1 */
    tpt_latch *gate;   /* every attempt waits on it (NULL: no) */
    int no_done;       /* submitted without an on_done */
    atomic_int runs;   /* attempts started */
    atomic_int done;   /* on_done calls */
    atomic_int status; /* on_done's status */
} tpt_otask;

static inline int tpt_otask_fn(tp_ctx *c, void *arg) {
    tpt_otask *t = (tpt_otask *)arg;
    unsigned a = tp_ctx_attempt(c);
    atomic_fetch_add(&t->runs, 1);
    int i = atomic_fetch_add(&t->o->n, 1);
    int fail = (int)a < t->fail;
    if (i >= 0 && i < TPT_ORD_MAX) {
        atomic_store(&t->o->t_start[i], tp_now_ns());
        atomic_store(&t->o->tag[i], t->tag + (int)a * TPT_RETRY_TAG);
        atomic_fetch_add(&t->o->recorded, 1); /* after the tag: see tpt_assert_order_ */
        if (atomic_load(&t->o->fail_at[i])) fail = 1;
        tpt_latch *l = atomic_load(&t->o->at[i]);
        tp_pool *p = atomic_load(&t->o->pool);
        if (l && p) atomic_store(&t->o->delayed_at[i], (int)tpt_stats(p).delayed);
        if (l) tpt_latch_wait(l);
    }
    if (t->gate) tpt_latch_wait(t->gate);
    return fail;
}

static inline void tpt_otask_done(void *arg, int status) {
    tpt_otask *t = (tpt_otask *)arg;
    atomic_store(&t->status, status);
    atomic_fetch_add(&t->done, 1);
}

/* tp_submit of `t` (tag, priority, user; NULL user: anonymous) with
 * tpt_otask_done as on_done; must be accepted. Returns the id. */
static inline uint64_t tpt_osubmit(tp_pool *p, tpt_otask *t, tpt_ord *o, int tag, int prio,
                                   const char *user) {
    t->o = o;
    t->tag = tag;
    tp_task_opts opt = {0};
    opt.priority = prio;
    opt.user = user;
    opt.on_done = tpt_otask_done;
    uint64_t id = 0;
    int rc = tp_submit(p, tpt_otask_fn, t, &opt, &id);
    if (rc != TP_OK) fail_msg("submit of tag %d (priority %d) refused: %s", tag, prio, tp_err_name(rc));
    return id;
}

/* The recorded order [from, from + n) equals want[0..n). */
static inline void tpt_assert_order_(const tpt_ord *o, int from, const int *want, int n, const char *what,
                                     const char *file, int line) {
    char got[1024] = "", exp[1024] = "";
    int bad = 0;
    /* A start claims its index (o->n) before it stores its tag: a caller
     * that waited for n starts waits here for their tags too (bounded; a
     * start that never comes shows as a wrong order below). */
    int need = from + n < TPT_ORD_MAX ? from + n : TPT_ORD_MAX;
    (void)TPT_POLL(atomic_load(&o->recorded) >= need, TPT_WAIT_NS);
    for (int i = 0; i < n; i++) {
        int g = atomic_load(&o->tag[from + i]);
        if (g != want[i]) bad = 1;
        if (strlen(got) < sizeof got - 16) snprintf(got + strlen(got), sizeof got - strlen(got), " %d", g);
        if (strlen(exp) < sizeof exp - 16)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
    }
    if (bad) {
        print_error("%s: started%s\n%*sexpected%s\n", what, got, (int)strlen(what) + 2, "", exp);
        _fail(file, line);
    }
}
#define tpt_assert_order(o, from, want, n, what)                                                             \
    tpt_assert_order_((o), (from), (want), (n), (what), __FILE__, __LINE__)

/* Exactly `n` starts in all, matching want[0..n). */
#define TPT_ORDER(o, what, ...)                                                                              \
    do {                                                                                                     \
        static const int want_[] = {__VA_ARGS__};                                                            \
        const int n_ = (int)(sizeof want_ / sizeof want_[0]);                                                \
        tpt_assert_order((o), 0, want_, n_, (what));                                                         \
        assert_int_equal(atomic_load(&(o)->n), n_);                                                          \
    } while (0)

/* ------------------------------------------------------------ the model */

#define TPM_MAX        2048
#define TPM_USERS      16 /* user indices 0..TPM_USERS-1; TPM_ANON is the anonymous user */
#define TPM_ANON       TPM_USERS
#define TPM_LANE(prio) ((prio)-TP_PRIO_MIN)

typedef struct tpm_entry {
    int tag, prio, user;
} tpm_entry;

typedef struct tpm {
    int fair;
    unsigned limit;       /* prio_starve_limit as resolved; TP_UNLIMITED: strict */
    tpm_entry w[TPM_MAX]; /* the waiting tasks in arrival order */
    int nw;
    unsigned count[5];           /* the lanes' starvation counts */
    int round[5][TPM_USERS + 1]; /* fair: each lane's round, head first */
    int nround[5];
    unsigned credit[5][TPM_USERS + 1]; /* starts left in the turn under way; 0: none */
    unsigned weight[TPM_USERS + 1];    /* for the next turns */
} tpm;

static inline void tpm_init(tpm *m, int fair, unsigned limit) {
    memset(m, 0, sizeof *m);
    m->fair = fair;
    m->limit = limit;
    for (int u = 0; u <= TPM_USERS; u++) m->weight[u] = 1;
}

static inline int tpm_lane_waiting(const tpm *m, int lane) {
    int n = 0;
    for (int i = 0; i < m->nw; i++) n += TPM_LANE(m->w[i].prio) == lane;
    return n;
}

static inline int tpm_user_waiting(const tpm *m, int lane, int user) {
    for (int i = 0; i < m->nw; i++)
        if (TPM_LANE(m->w[i].prio) == lane && m->w[i].user == user) return 1;
    return 0;
}

static inline void tpm_round_remove(tpm *m, int lane, int user) {
    for (int i = 0; i < m->nround[lane]; i++) {
        if (m->round[lane][i] != user) continue;
        memmove(&m->round[lane][i], &m->round[lane][i + 1], (size_t)(m->nround[lane] - i - 1) * sizeof(int));
        m->nround[lane]--;
        break;
    }
    m->credit[lane][user] = 0;
}

static inline int tpm_in_round(const tpm *m, int lane, int user) {
    for (int i = 0; i < m->nround[lane]; i++)
        if (m->round[lane][i] == user) return 1;
    return 0;
}

/* A task waits now (admitted, or a retry back from its delay): at the back
 * of its lane and of its user's list there; a user not in the round joins
 * it at the back. */
static inline void tpm_push(tpm *m, int tag, int prio, int user) {
    if (m->nw >= TPM_MAX) fail_msg("model: too many waiting tasks");
    m->w[m->nw++] = (tpm_entry){tag, prio, user};
    int lane = TPM_LANE(prio);
    if (m->fair && !tpm_in_round(m, lane, user)) {
        m->round[lane][m->nround[lane]++] = user;
        m->credit[lane][user] = 0;
    }
}

static inline void tpm_unwait(tpm *m, int i) {
    memmove(&m->w[i], &m->w[i + 1], (size_t)(m->nw - i - 1) * sizeof m->w[0]);
    m->nw--;
}

/* The waiting task `tag` left without starting (cancel, expiry): its user
 * leaves the round if that was its last there; an emptied lane is no longer
 * ready and its count returns to 0. */
static inline void tpm_remove(tpm *m, int tag) {
    for (int i = 0; i < m->nw; i++) {
        if (m->w[i].tag != tag) continue;
        tpm_entry e = m->w[i];
        int lane = TPM_LANE(e.prio);
        tpm_unwait(m, i);
        if (m->fair && !tpm_user_waiting(m, lane, e.user)) tpm_round_remove(m, lane, e.user);
        if (tpm_lane_waiting(m, lane) == 0) m->count[lane] = 0;
        return;
    }
    fail_msg("model: tag %d is not waiting", tag);
}

/* The next start by the rules; *out gets what starts. Returns 0 when nothing
 * waits. */
static inline int tpm_pop(tpm *m, tpm_entry *out) {
    int lane = -1;
    for (int l = 4; l >= 0 && lane < 0; l--)
        if (tpm_lane_waiting(m, l) && m->limit != TP_UNLIMITED && m->count[l] >= m->limit) lane = l;
    for (int l = 4; l >= 0 && lane < 0; l--)
        if (tpm_lane_waiting(m, l)) lane = l;
    if (lane < 0) return 0;
    /* every ready lane below counts this start; the starting lane's count returns to 0 */
    for (int l = 0; l < lane; l++)
        if (tpm_lane_waiting(m, l)) m->count[l]++;
    m->count[lane] = 0;
    int user = -1;
    if (m->fair) {
        if (m->nround[lane] == 0) fail_msg("model: lane %d waits but has no round", lane);
        user = m->round[lane][0];
        if (m->credit[lane][user] == 0) m->credit[lane][user] = m->weight[user]; /* its turn starts */
        m->credit[lane][user]--;
    }
    for (int i = 0; i < m->nw; i++) {
        if (TPM_LANE(m->w[i].prio) != lane || (m->fair && m->w[i].user != user)) continue;
        *out = m->w[i];
        tpm_unwait(m, i);
        break;
    }
    if (m->fair) {
        if (!tpm_user_waiting(m, lane, user)) {
            tpm_round_remove(m, lane, user); /* leaves as soon as it has nothing left */
        } else if (m->credit[lane][user] == 0) {
            tpm_round_remove(m, lane, user); /* its turn is over: to the back */
            m->round[lane][m->nround[lane]++] = user;
        }
    }
    if (tpm_lane_waiting(m, lane) == 0) m->count[lane] = 0;
    return 1;
}

/* tp_user_weight_set: from the user's next turn. */
static inline void tpm_weight(tpm *m, int user, unsigned w) { m->weight[user] = w; }


/* ------------------------------------------------------------ random scenarios */

/*
 * tpt_sched_random -- one random scenario through a pool with one worker,
 * checked against the model at every stop.
 *
 * The worker starts on a gate task (tag 0, start index 0) and stops again at
 * a start index the test picks, on latch[j] of phase j. While it is stopped,
 * a phase submits tasks of random priority (and, with nusers > 0, random
 * users, the anonymous one spelt NULL or ""), some as one tp_submit_batch,
 * cancels random waiting tasks, and in a fair pool sets random weights; the
 * model does the same. Sometimes the start just before the stop fails: its
 * retry comes back to the queue while the worker is stopped (the retry delay
 * is long against the few microseconds between that attempt's end and the
 * worker's next start), and the model pushes it there too. The recorded order
 * of each phase must equal the model's; at the end, the counters agree.
 * Uses latch[0..TPT_PHASES] and leaves them re-armed.
 */
#define TPT_PHASES 6

/* How many random scenarios a test runs: `dflt`, or TPT_SCHED_SEEDS from the
 * environment (for a longer search). */
static inline int tpt_sched_seeds(int dflt) {
    const char *e = getenv("TPT_SCHED_SEEDS");
    int n = e ? atoi(e) : 0;
    return n > 0 ? n : dflt;
}

typedef struct tpt_rand_cfg {
    int fair;
    unsigned limit; /* tp_config.prio_starve_limit (0: the default, 16) */
    int nusers;     /* 0: no user at all */
    int lanes;      /* priorities used: the top `lanes` of 2, 1, 0, -1, -2 (0: all five) */
    /* Non-zero: phases of up to 96 tasks, and this percentage of the tasks
     * of priority 0 with a user are submitted with that user as their only
     * option and no id, as a pool may stage them (stage.h; a fair pool
     * stages them all, and a worker admits a task whose user is not in the
     * round before the next start: engine.c, life.c); they have no on_done
     * and cannot be cancelled. The lane then holds enough tasks
     * that the worker leaves staged ones in the ring while it starts. */
    int staged;
} tpt_rand_cfg;

static inline void tpt_sched_random(tpt_fixture *f, tpt_latch *const *latch, const tpt_rand_cfg *rc,
                                    uint32_t seed) {
    static const char *const names[TPM_USERS] = {"u0", "u1", "u2",  "u3",  "u4",  "u5",  "u6",  "u7",
                                                 "u8", "u9", "u10", "u11", "u12", "u13", "u14", "u15"};
    uint32_t r = seed ? seed : 1;
    tp_config c = tpt_quiet_config(1, TPM_MAX, TP_UNLIMITED);
    c.sched = rc->fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
    c.prio_starve_limit = rc->limit;
    c.max_retries = TP_MAX_RETRIES;
    c.retry_delay_ns = TPT_MS(30) * tpt_slowdown();
    tp_pool *p = tpt_fx_pool(f, &c);
    tpt_ord *o = tpt_fx_new(f, tpt_ord);
    tpt_otask *t = tpt_fx_array(f, tpt_otask, TPM_MAX);
    uint64_t *ids = tpt_fx_array(f, uint64_t, TPM_MAX);
    int *want = tpt_fx_array(f, int, TPT_ORD_MAX);
    tpm *m = tpt_fx_new(f, tpm);
    tpm_init(m, rc->fair, rc->limit ? rc->limit : 16);
    int lanes = rc->lanes ? rc->lanes : 5;

    /* the gate: start 0 */
    tpm_push(m, 0, 0, TPM_ANON);
    tpm_entry e = {0, 0, 0}; /* (filled by tpm_pop; initialised for gcc -O3's flow analysis) */
    assert_true(tpm_pop(m, &e));
    want[0] = 0;
    atomic_store(&o->pool, p);
    atomic_store(&o->at[0], latch[0]);
    ids[0] = tpt_osubmit(p, &t[0], o, 0, 0, NULL);
    TPT_EVENTUALLY(atomic_load(&latch[0]->waiting) == 1);

    int ntasks = 1, nwant = 1, cancels = 0, retries = 0;
    int phases = 2 + (int)(tpt_xorshift(&r) % (TPT_PHASES - 1));
    for (int j = 1; j <= phases; j++) {
        /* submissions while the worker is stopped */
        int k = 1 + (int)(tpt_xorshift(&r) % (rc->staged ? 96u : 24u));
        if (ntasks + k > TPM_MAX - 8) k = 0;
        int batch_from = (tpt_xorshift(&r) % 3 == 0) ? (int)(tpt_xorshift(&r) % (unsigned)(k + 1)) : k;
        /* with staged tasks: the phase's first tasks are all admitted (a
         * locked submit admits what is staged before it), so that staged
         * ones may wait behind a deep lane */
        int stage_from = rc->staged ? k / 2 + (int)(tpt_xorshift(&r) % (unsigned)(k / 2 + 1)) : k;
        tp_task batch[96];
        tp_task_opts bopt[96];
        int nb = 0;
        for (int i = 0; i < k; i++) {
            int tag = ntasks++;
            int prio = TP_PRIO_MAX - (int)(tpt_xorshift(&r) % (unsigned)lanes);
            if (rc->staged && lanes >= 3 && tpt_xorshift(&r) % 4 != 0) prio = 0; /* staged tasks' lane */
            int user = rc->nusers ? (int)(tpt_xorshift(&r) % (unsigned)(rc->nusers + 1)) : TPM_ANON;
            /* with staged tasks, user 0 has half of them: its tasks keep the
             * lane deep while the others' run out (engine.c, fair_leave) */
            if (rc->staged && rc->nusers && (tpt_xorshift(&r) & 1)) user = 0;
            if (user == rc->nusers) user = TPM_ANON;
            const char *uname = user == TPM_ANON ? ((tpt_xorshift(&r) & 1) ? "" : NULL) : names[user];
            tpm_push(m, tag, prio, user);
            if (i < batch_from && i >= stage_from && prio == 0 && user != TPM_ANON &&
                tpt_xorshift(&r) % 100 < (unsigned)rc->staged) {
                t[tag].o = o;
                t[tag].tag = tag;
                t[tag].no_done = 1;
                tp_task_opts so = {0};
                so.user = uname;
                assert_int_equal(tp_submit(p, tpt_otask_fn, &t[tag], &so, NULL), TP_OK);
                ids[tag] = 0; /* no id asked: not cancelled below */
            } else if (i < batch_from) {
                ids[tag] = tpt_osubmit(p, &t[tag], o, tag, prio, uname);
            } else {
                t[tag].o = o;
                t[tag].tag = tag;
                memset(&bopt[nb], 0, sizeof bopt[nb]);
                bopt[nb].priority = prio;
                bopt[nb].user = uname;
                bopt[nb].on_done = tpt_otask_done;
                batch[nb] = (tp_task){.fn = tpt_otask_fn, .arg = &t[tag], .opts = &bopt[nb]};
                nb++;
            }
        }
        if (nb) {
            uint64_t bids[96];
            size_t acc = 0;
            assert_int_equal(tp_submit_batch(p, batch, (size_t)nb, bids, &acc), TP_OK);
            assert_int_equal(acc, nb);
            for (int i = 0; i < nb; i++) ids[((tpt_otask *)batch[i].arg)->tag] = bids[i];
        }
        /* cancels of waiting tasks */
        int nc = (tpt_xorshift(&r) % 2) ? (int)(tpt_xorshift(&r) % 4) : 0;
        for (int i = 0; i < nc && m->nw > 0; i++) {
            tpm_entry v = m->w[tpt_xorshift(&r) % (unsigned)m->nw];
            if (!ids[v.tag % TPT_RETRY_TAG]) continue; /* submitted without an id */
            assert_int_equal(tp_cancel(p, ids[v.tag % TPT_RETRY_TAG]), TP_OK);
            tpm_remove(m, v.tag);
            cancels++;
        }
        /* weights, from each user's next turn */
        if (rc->fair && rc->nusers && tpt_xorshift(&r) % 2) {
            int u = (int)(tpt_xorshift(&r) % (unsigned)(rc->nusers + 1));
            unsigned w = 1 + tpt_xorshift(&r) % 4;
            assert_int_equal(tp_user_weight_set(p, u == rc->nusers ? NULL : names[u], w), TP_OK);
            tpm_weight(m, u == rc->nusers ? TPM_ANON : u, w);
        }
        TPT_EVENTUALLY(tpt_stats(p).queued == (uint32_t)m->nw);

        /* the next stop, or the end */
        int from = nwant, stop = -1, retry_tag = -1;
        tpm_entry failed = {0, 0, 0};
        if (j < phases && m->nw > 0) {
            int kk = 1 + (int)(tpt_xorshift(&r) % (unsigned)m->nw);
            stop = nwant + kk - 1;
            atomic_store(&o->at[stop], latch[j]);
            if (kk >= 2 && tpt_xorshift(&r) % 3 == 0) {
                atomic_store(&o->fail_at[stop - 1], 1);
                retry_tag = stop - 1;
            }
            for (int i = 0; i < kk; i++) {
                assert_true(tpm_pop(m, &e));
                if (nwant == retry_tag) failed = e;
                want[nwant++] = e.tag;
            }
        } else {
            while (tpm_pop(m, &e)) want[nwant++] = e.tag;
        }
        tpt_latch_open(latch[j - 1]);
        if (stop < 0) break;
        TPT_EVENTUALLY(atomic_load(&latch[j]->waiting) == 1);
        if (retry_tag >= 0 && atomic_load(&o->delayed_at[stop]) == 0) {
            /* The retry came back before the worker chose this start (a
             * stalled machine: its delay is long against that moment): the
             * model cannot know where it went. Not a finding; this seed ends. */
            print_message("seed %u phase %d: the retry returned before the stop; scenario abandoned\n", seed,
                          j);
            for (int i = j; i <= TPT_PHASES; i++) tpt_latch_open(latch[i]);
            TPT_EVENTUALLY(tpt_stats(p).completed == (uint64_t)ntasks);
            tpt_finish(p);
            for (int i = 0; i <= TPT_PHASES; i++) tpt_latch_rearm(latch[i]);
            return;
        }
        if (retry_tag >= 0) {
            /* the failed attempt's retry is back, behind what waits in its lane */
            tpm_push(m, failed.tag + TPT_RETRY_TAG, failed.prio, failed.user);
            retries++;
            TPT_EVENTUALLY(tpt_stats(p).delayed == 0);
        }
        char what[96];
        snprintf(what, sizeof what, "seed %u phase %d", seed, j);
        tpt_assert_order(o, from, &want[from], nwant - from, what);
    }
    /* everything left ran, in the model's order */
    TPT_EVENTUALLY(atomic_load(&o->n) == nwant);
    TPT_EVENTUALLY(tpt_stats(p).completed == (uint64_t)ntasks);
    char what[64];
    snprintf(what, sizeof what, "seed %u, the whole order", seed);
    tpt_assert_order(o, 0, want, nwant, what);
    assert_int_equal(atomic_load(&o->n), nwant);
    int restarts = 0; /* retries that started (a retry may be cancelled while it waits) */
    for (int i = 0; i < nwant; i++) restarts += want[i] >= TPT_RETRY_TAG;
    assert_true(restarts <= retries);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(accepted, ntasks), TPT_EQ(completed, ntasks), TPT_EQ(cancelled, cancels),
                      TPT_EQ(retried, restarts), TPT_EQ(failed, cancels));
    assert_int_equal(s.started + s.retried, (uint64_t)nwant);
    for (int i = 0; i < ntasks; i++) assert_int_equal(atomic_load(&t[i].done), t[i].no_done ? 0 : 1);
    for (int i = 0; i <= TPT_PHASES; i++) tpt_latch_rearm(latch[i]);
}

#endif /* TPT_SCHED_H */
