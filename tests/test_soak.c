/*
 * test_soak.c -- the racy scenarios, round after round, each round asserting
 * exactly-once endings per task and the at-rest statistics:
 *
 *   lifecycle storm      submitters (tp_submit and tp_submit_wait, users,
 *                        deadlines, run timeouts, retries) + a canceller +
 *                        stats readers checking bounds on every read, then
 *                        concurrent tp_close / tp_shutdown x3 / tp_wait x2 with
 *                        a budget that is sometimes long (must drain: TP_OK)
 *                        and sometimes tiny (may force). Every shutdown caller
 *                        gets the same answer and an unbounded tp_wait agrees.
 *   timeout vs completion run timeouts and deadlines about as long as the
 *                        tasks, with retries: each ending is one of the allowed
 *                        outcomes, `expired` counts exactly the tasks that never
 *                        ran, a task's context never reports a timeout early.
 *   cancel vs completion every task is cancelled by its submitter and by a
 *                        second thread while it is queued, starting, running,
 *                        failing into a retry or finishing: TP_ECANCELED only
 *                        after an accepted cancel, a task ended unrun only by
 *                        one, never retried after one.
 *
 * In CI each scenario runs a fixed number of rounds (fewer under sanitizers
 * and valgrind; run.sh repeats the executable under TSan). A long soak by hand:
 *
 *     TP_SOAK_SECONDS=600 ./build/tests/test_soak
 *
 * runs each scenario for that many seconds (any build: plain, tsan, asan).
 * TP_TEST_SLOWDOWN=n (set by run.sh under valgrind) divides the round counts.
 */
#include "tp_test.h"

#include <sched.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

/* ------------------------------------------------------------ rounds */

static unsigned slowdown(void) {
    unsigned div = 1;
#if TPT_SANITIZED
    div = 4;
#endif
#ifdef RUNNING_ON_VALGRIND
    if (RUNNING_ON_VALGRIND) div = 10;
#endif
    return div * tpt_slowdown();
}

/* A scenario's loop: `ci_rounds` rounds (scaled down for slow builds), or,
 * with TP_SOAK_SECONDS set, as many as fit in that many seconds. */
typedef struct rounds {
    unsigned done, ci;
    uint64_t until; /* 0: count rounds */
} rounds;

static rounds rounds_start(unsigned ci_rounds) {
    rounds r = {0, 0, 0};
    const char *e = getenv("TP_SOAK_SECONDS");
    long secs = e ? atol(e) : 0;
    if (secs > 0) {
        r.until = tp_now_ns() + TPT_S(secs);
    } else {
        r.ci = ci_rounds / slowdown();
        if (r.ci == 0) r.ci = 1;
    }
    return r;
}

static int rounds_next(rounds *r) {
    if (r->until ? tp_now_ns() >= r->until : r->done >= r->ci) return 0;
    r->done++;
    return 1;
}

/* ------------------------------------------------------------ records */

enum { K_NOP, K_SLEEP, K_FAIL_FIRST, K_SPIN, K_KINDS };

typedef struct rec {
    atomic_int calls;     /* on_done */
    atomic_int ran;       /* attempts started */
    atomic_int status;    /* on_done's status */
    atomic_int last_rc;   /* what the last attempt returned */
    atomic_int cancel_ok; /* tp_cancel(id) == TP_OK, by anyone */
    atomic_int early;     /* the context reported a timeout before its deadline */
    atomic_uint_least64_t id;
    int rc; /* the submit's result */
    int kind;
    uint64_t dur;      /* K_SLEEP / K_SPIN: how long */
    uint64_t deadline; /* the deadline it was given, 0 none */
} rec;

static int rec_task(tp_ctx *c, void *arg) {
    rec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    uint64_t start = tp_now_ns();
    uint64_t dl = tp_ctx_deadline(c);
    if (r->deadline && dl > r->deadline) atomic_fetch_add(&r->early, 1); /* must be the earlier of the two */
    int rc = 0;
    switch (r->kind) {
    case K_SLEEP:
        rc = tp_ctx_sleep(c, r->dur);
        if (rc == TP_ETIMEDOUT && tp_now_ns() < dl) atomic_fetch_add(&r->early, 1);
        if (rc == 0 && tp_now_ns() - start < r->dur) atomic_fetch_add(&r->early, 1);
        break;
    case K_FAIL_FIRST: rc = tp_ctx_attempt(c) == 0 ? 5 : tp_ctx_err(c); break;
    case K_SPIN:
        /* busy until its time is up or it is told to stop; then report */
        while (tp_now_ns() - start < r->dur && tp_ctx_err(c) == 0) sched_yield();
        rc = tp_ctx_err(c);
        if (rc == TP_ETIMEDOUT && tp_now_ns() < dl) atomic_fetch_add(&r->early, 1);
        break;
    default: rc = tp_ctx_err(c); break;
    }
    atomic_store(&r->last_rc, rc);
    return rc;
}

static void rec_done(void *arg, int status) {
    rec *r = arg;
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
}

static int is_cancel_status(int st) { return st == TP_ECANCELED || st == TP_ETIMEDOUT; }

/* At rest: the counters equal what the callers saw and what the records say.
 * `forced`: the shutdown was forced, so tasks may have ended unrun with
 * TP_ECANCELED without a cancel. Returns the number of records checked. */
static void check_round(const tp_stats *s, const tpt_tally *t, rec *recs, size_t n, unsigned max_runs,
                        int forced) {
    if (t->bad)
        fail_msg("%llu unexpected submit results, e.g. %d (%s)", (unsigned long long)t->bad, t->last_bad,
                 tp_err_name(t->last_bad));
    tpt_assert_at_rest(s);
    tpt_assert_counts(*s, TPT_EQ(workers, 0), TPT_EQ(submitted, t->total), TPT_EQ(accepted, t->ok),
                      TPT_EQ(rejected_full, t->full), TPT_EQ(rejected_user, t->user),
                      TPT_EQ(rejected_closed, t->closed), TPT_EQ(rejected_timeout, t->timedout));

    uint64_t ok = 0, fail = 0, canc = 0, started = 0, retried = 0, expired = 0, accepted = 0;
    for (size_t i = 0; i < n; i++) {
        rec *r = &recs[i];
        int calls = atomic_load(&r->calls), ran = atomic_load(&r->ran);
        int st = atomic_load(&r->status), last = atomic_load(&r->last_rc);
        int cok = atomic_load(&r->cancel_ok);
        if (r->rc != TP_OK) {
            if (calls != 0 || ran != 0)
                fail_msg("record %zu refused (%s) but on_done %d, ran %d", i, tp_err_name(r->rc), calls, ran);
            continue;
        }
        accepted++;
        if (calls != 1)
            fail_msg("record %zu: on_done called %d times (status %d, ran %d)", i, calls, st, ran);
        if (ran < 0 || (unsigned)ran > max_runs) fail_msg("record %zu: ran %d times", i, ran);
        if (atomic_load(&r->early))
            fail_msg("record %zu: its context reported a timeout early or a late deadline", i);
        if (ran == 0) {
            /* ended unrun: expired (deadline), cancelled, or dropped by force */
            if (st == TP_ETIMEDOUT) {
                if (!r->deadline) fail_msg("record %zu: TP_ETIMEDOUT unrun without a deadline", i);
                expired++;
            } else if (st == TP_ECANCELED) {
                if (!cok && !forced)
                    fail_msg("record %zu: TP_ECANCELED unrun, yet no cancel was accepted", i);
            } else {
                fail_msg("record %zu: ended unrun with %d (%s)", i, st, tp_err_name(st));
            }
        } else if (st != last) {
            /* only a retry that never came may change the status: its deadline
             * passed while it waited (TP_ETIMEDOUT), or it was cancelled or
             * dropped (TP_ECANCELED) */
            int retry_pending = last != 0 && last != TP_ECANCELED && (unsigned)ran < max_runs;
            int allowed = retry_pending &&
                          ((st == TP_ETIMEDOUT && r->deadline) || (st == TP_ECANCELED && (cok || forced)));
            if (!allowed)
                fail_msg("record %zu: status %d (%s) but its last attempt returned %d, ran %d, "
                         "cancel_ok %d",
                         i, st, tp_err_name(st), last, ran, cok);
        }
        if (st == TP_ECANCELED && !cok && !forced)
            fail_msg("record %zu: TP_ECANCELED without an accepted cancel", i);
        ok += st == 0;
        fail += st != 0;
        canc += is_cancel_status(st);
        started += ran > 0;
        retried += ran > 1 ? (uint64_t)(ran - 1) : 0;
    }
    tpt_assert_counts(*s, TPT_EQ(accepted, accepted), TPT_EQ(succeeded, ok), TPT_EQ(failed, fail),
                      TPT_EQ(cancelled, canc), TPT_EQ(started, started), TPT_EQ(retried, retried),
                      TPT_EQ(expired, expired));
}

/* ------------------------------------------------------------ lifecycle storm */

enum {
    LS_SUBMITTERS = 3,
    LS_PER = 300,
    LS_W = 2,
    LS_MAXW = 4,
    LS_CAP = 16,
    LS_USERS = 4,
    LS_PER_USER = 2,
    LS_SHUTTERS = 3,
};

static const char *const ls_users[LS_USERS] = {"ua", "ub", "uc", "ud"};

typedef struct ls_shared {
    tp_pool *p;
    rec *recs;
    atomic_int go, stop, end_go;
    atomic_uint_least64_t ids[LS_SUBMITTERS * LS_PER];
    atomic_int nids;
    atomic_int violations, reads;
    atomic_int cancel_bad;
    char what[160];
    /* the end */
    uint64_t budget;
    atomic_int shut_rc[LS_SHUTTERS];
    atomic_int wait_rc, wait_bounded_rc, close_rc;
} ls_shared;

typedef struct ls_sub {
    ls_shared *sh;
    rec *recs;
    uint32_t seed;
    tpt_tally t;
    int ok_after_closed;
} ls_sub;

static void *ls_submitter(void *a) {
    ls_sub *x = a;
    int seen_closed = 0;
    tpt_wait_go(&x->sh->go);
    for (int k = 0; k < LS_PER; k++) {
        rec *r = &x->recs[k];
        uint32_t v = tpt_xorshift(&x->seed);
        r->kind = (int)(v % K_KINDS);
        r->dur = 10000 + (v >> 8) % 60000; /* 10..70 us */
        tp_task_opts o = {0};
        o.on_done = rec_done;
        if ((v >> 4) % 3 == 0) o.user = ls_users[(v >> 6) % LS_USERS];
        if ((v >> 10) % 5 == 0) {
            r->deadline = tp_now_ns() + (v >> 12) % 200000; /* 0..200 us */
            o.deadline_ns = r->deadline;
        }
        if ((v >> 14) % 7 == 0) o.run_timeout_ns = 30000;
        uint64_t id = 0;
        if ((v >> 20) % 4 == 0)
            r->rc = tp_submit_wait(x->sh->p, rec_task, r, &o, TPT_MS(1), &id);
        else
            r->rc = tp_submit(x->sh->p, rec_task, r, &o, &id);
        tpt_tally_add(&x->t, r->rc);
        if (r->rc == TP_OK) {
            atomic_store(&r->id, id);
            if (seen_closed) x->ok_after_closed++;
            int slot = atomic_fetch_add(&x->sh->nids, 1);
            atomic_store(&x->sh->ids[slot], (uint64_t)(r - x->sh->recs) + 1); /* record index + 1 */
        } else if (r->rc == TP_ECLOSED) {
            seen_closed = 1;
        } else {
            sched_yield();
        }
    }
    return NULL;
}

static void *ls_canceller(void *a) {
    ls_shared *sh = a;
    uint32_t seed = 0xc0ffee;
    tpt_wait_go(&sh->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&sh->stop) && tp_now_ns() < end) {
        int n = atomic_load(&sh->nids);
        if (n == 0) {
            sched_yield();
            continue;
        }
        uint64_t ix = atomic_load(&sh->ids[tpt_xorshift(&seed) % (uint32_t)n]);
        if (ix == 0) continue; /* slot taken, not yet written */
        rec *r = &sh->recs[ix - 1];
        int rc = tp_cancel(sh->p, atomic_load(&r->id));
        if (rc == TP_OK)
            atomic_fetch_add(&r->cancel_ok, 1);
        else if (rc != TP_ENOTFOUND)
            atomic_fetch_add(&sh->cancel_bad, 1);
        if ((tpt_xorshift(&seed) & 3) == 0) sched_yield();
    }
    return NULL;
}

static void *ls_reader(void *a) {
    ls_shared *sh = a;
    char buf[4096];
    tpt_wait_go(&sh->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&sh->stop) && tp_now_ns() < end) {
        tp_stats s;
        tp_stats_get(sh->p, &s);
        /* single fields: a snapshot is not one instant */
        const char *bad = s.active > LS_MAXW             ? "active"
                          : s.workers > LS_MAXW          ? "workers"
                          : s.idle > LS_MAXW             ? "idle"
                          : s.queued > LS_CAP + LS_MAXW  ? "queued"
                          : s.delayed > LS_CAP + LS_MAXW ? "delayed"
                          : s.users > LS_USERS           ? "users"
                          : tp_stats_format(&s, TP_FORMAT_JSON, buf, sizeof buf) >= (int)sizeof buf ? "json"
                                                                                                    : NULL;
        for (int u = 0; !bad && u < LS_USERS; u++)
            if (tp_user_active(sh->p, ls_users[u]) > LS_PER_USER) bad = "user slots";
        if (bad) {
            if (atomic_fetch_add(&sh->violations, 1) == 0)
                snprintf(sh->what, sizeof sh->what, "%s out of bounds", bad);
        }
        atomic_fetch_add(&sh->reads, 1);
        sched_yield();
    }
    return NULL;
}

typedef struct ls_end {
    ls_shared *sh;
    int role; /* 0..LS_SHUTTERS-1 shutdown, then wait, bounded wait, close */
} ls_end;

static void *ls_ender(void *a) {
    ls_end *e = a;
    ls_shared *sh = e->sh;
    tpt_wait_go(&sh->end_go);
    if (e->role < LS_SHUTTERS)
        atomic_store(&sh->shut_rc[e->role], tp_shutdown(sh->p, sh->budget));
    else if (e->role == LS_SHUTTERS)
        atomic_store(&sh->wait_rc, tp_wait(sh->p, 0));
    else if (e->role == LS_SHUTTERS + 1)
        atomic_store(&sh->wait_bounded_rc, tp_wait(sh->p, TPT_MS(1)));
    else
        atomic_store(&sh->close_rc, tp_close(sh->p));
    return NULL;
}

static void test_lifecycle_storm(void **state) {
    tpt_fixture *f = tpt_fx(state);
    rounds rd = rounds_start(40);
    tpt_tally all = {0};
    unsigned forced_rounds = 0;
    uint64_t cancels = 0, reads = 0;
    while (rounds_next(&rd)) {
        unsigned round = rd.done;
        tp_config c = {0};
        c.workers = LS_W;
        c.max_workers = LS_MAXW;
        c.idle_timeout_ns = TPT_MS(1); /* elastic workers come and go */
        c.queue_capacity = LS_CAP;
        c.max_per_user = LS_PER_USER;
        c.max_retries = 1;
        c.retry_delay_ns = 100000;
        c.log = tpt_quiet_log;
        ls_shared *sh = calloc(1, sizeof *sh);
        rec *recs = calloc(LS_SUBMITTERS * LS_PER, sizeof *recs);
        assert_non_null(sh);
        assert_non_null(recs);
        sh->recs = recs;
        sh->p = tpt_fx_pool(f, &c);
        /* every other round a drain budget far too short: it may force */
        int tiny = round % 2 == 0;
        sh->budget = tiny ? 20000 + round % 7 * 10000 : TPT_WAIT_NS;

        ls_sub subs[LS_SUBMITTERS];
        memset(subs, 0, sizeof subs);
        pthread_t st[LS_SUBMITTERS], ct, rt, et[LS_SHUTTERS + 3];
        ls_end ends[LS_SHUTTERS + 3];
        for (int i = 0; i < LS_SUBMITTERS; i++) {
            subs[i].sh = sh;
            subs[i].recs = recs + (size_t)i * LS_PER;
            subs[i].seed = 0x9e3779b9u * (uint32_t)(i + 1) + round * 7919u;
            assert_int_equal(pthread_create(&st[i], NULL, ls_submitter, &subs[i]), 0);
        }
        assert_int_equal(pthread_create(&ct, NULL, ls_canceller, sh), 0);
        assert_int_equal(pthread_create(&rt, NULL, ls_reader, sh), 0);
        atomic_store(&sh->go, 1);
        uint64_t want = (uint64_t)(LS_SUBMITTERS * LS_PER) * (1 + round % 4) / 6;
        (void)TPT_POLL(tpt_stats(sh->p).submitted >= want, TPT_WAIT_NS);
        TPT_EVENTUALLY(atomic_load(&sh->reads) > 0);
        /* the enders start together, in the middle of the submissions */
        for (int i = 0; i < LS_SHUTTERS + 3; i++) {
            ends[i].sh = sh;
            ends[i].role = i;
            assert_int_equal(pthread_create(&et[i], NULL, ls_ender, &ends[i]), 0);
        }
        atomic_store(&sh->end_go, 1);
        for (int i = 0; i < LS_SHUTTERS + 3; i++) pthread_join(et[i], NULL);
        for (int i = 0; i < LS_SUBMITTERS; i++) pthread_join(st[i], NULL);
        int final = tp_wait(sh->p, TPT_WAIT_NS);
        atomic_store(&sh->stop, 1);
        pthread_join(ct, NULL);
        pthread_join(rt, NULL);

        int rc0 = atomic_load(&sh->shut_rc[0]);
        for (int i = 0; i < LS_SHUTTERS; i++)
            assert_int_equal(atomic_load(&sh->shut_rc[i]), rc0); /* one outcome for all */
        if (!tiny) assert_int_equal(rc0, TP_OK);                 /* short cooperative tasks drain in 20 s */
        assert_true(rc0 == TP_OK || rc0 == TP_ETIMEDOUT);
        assert_int_equal(atomic_load(&sh->wait_rc), rc0);
        assert_int_equal(final, rc0);
        int wb = atomic_load(&sh->wait_bounded_rc);
        assert_true(wb == TP_ETIMEDOUT || (wb == TP_OK && rc0 == TP_OK));
        assert_int_equal(atomic_load(&sh->close_rc), TP_OK);
        if (atomic_load(&sh->violations))
            fail_msg("stats reader: %d violations, first: %s", atomic_load(&sh->violations), sh->what);
        assert_int_equal(atomic_load(&sh->cancel_bad), 0);

        tp_stats s = tpt_stats(sh->p);
        tpt_tally t = {0};
        for (int i = 0; i < LS_SUBMITTERS; i++) {
            tpt_tally_merge(&t, &subs[i].t);
            assert_int_equal(subs[i].ok_after_closed, 0);
        }
        check_round(&s, &t, recs, LS_SUBMITTERS * LS_PER, 2, rc0 == TP_ETIMEDOUT);
        forced_rounds += rc0 == TP_ETIMEDOUT;
        tpt_tally_merge(&all, &t);
        for (int i = 0; i < LS_SUBMITTERS * LS_PER; i++) cancels += atomic_load(&recs[i].cancel_ok) > 0;
        reads += (uint64_t)atomic_load(&sh->reads);
        tpt_destroy(sh->p);
        free(recs);
        free(sh);
    }
    print_message("lifecycle storm: %u rounds (%u forced), %llu accepted, %llu full, %llu user, "
                  "%llu closed, %llu timed out, %llu cancelled by id, %llu stats reads\n",
                  rd.done, forced_rounds, (unsigned long long)all.ok, (unsigned long long)all.full,
                  (unsigned long long)all.user, (unsigned long long)all.closed,
                  (unsigned long long)all.timedout, (unsigned long long)cancels, (unsigned long long)reads);
}

/* ------------------------------------------------------------ timeout vs completion */

enum { TO_SUBMITTERS = 3, TO_PER = 200, TO_W = 2, TO_CAP = 8 };

typedef struct to_sub {
    tp_pool *p;
    rec *recs;
    uint32_t seed;
    atomic_int *go;
    tpt_tally t;
} to_sub;

static void *to_submitter(void *a) {
    to_sub *x = a;
    tpt_wait_go(x->go);
    for (int k = 0; k < TO_PER; k++) {
        rec *r = &x->recs[k];
        uint32_t v = tpt_xorshift(&x->seed);
        /* a task of about D, a run timeout of about D, a deadline of about
         * queueing + D: every ending is a close race */
        const uint64_t D = 40000 + (v % 40000); /* 40..80 us */
        r->kind = v % 3 == 0 ? K_SPIN : v % 3 == 1 ? K_SLEEP : K_FAIL_FIRST;
        r->dur = D;
        tp_task_opts o = {0};
        o.on_done = rec_done;
        if ((v >> 4) % 2) o.run_timeout_ns = D - 10000 + (v >> 8) % 20000;
        if ((v >> 5) % 3 != 0) {
            r->deadline = tp_now_ns() + D + (v >> 12) % 800000;
            o.deadline_ns = r->deadline;
        }
        r->rc = tp_submit_wait(x->p, rec_task, r, &o, TPT_WAIT_NS, NULL);
        tpt_tally_add(&x->t, r->rc);
    }
    return NULL;
}

static void test_timeout_vs_completion(void **state) {
    tpt_fixture *f = tpt_fx(state);
    rounds rd = rounds_start(20);
    uint64_t tot = 0, exp = 0, canc = 0, ok = 0, retr = 0;
    while (rounds_next(&rd)) {
        tp_config c = {0};
        c.workers = TO_W;
        c.queue_capacity = TO_CAP;
        c.max_per_user = TP_UNLIMITED;
        c.max_retries = 1;
        c.retry_delay_ns = 30000;
        c.log = tpt_quiet_log;
        tp_pool *p = tpt_fx_pool(f, &c);
        rec *recs = calloc(TO_SUBMITTERS * TO_PER, sizeof *recs);
        assert_non_null(recs);
        atomic_int go = 0;
        to_sub subs[TO_SUBMITTERS];
        pthread_t th[TO_SUBMITTERS];
        memset(subs, 0, sizeof subs);
        for (int i = 0; i < TO_SUBMITTERS; i++) {
            subs[i].p = p;
            subs[i].recs = recs + (size_t)i * TO_PER;
            subs[i].seed = 0x51ed27u * (uint32_t)(i + 1) + rd.done * 104729u;
            subs[i].go = &go;
            assert_int_equal(pthread_create(&th[i], NULL, to_submitter, &subs[i]), 0);
        }
        atomic_store(&go, 1);
        for (int i = 0; i < TO_SUBMITTERS; i++) pthread_join(th[i], NULL);
        assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
        assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);
        tp_stats s = tpt_stats(p);
        tpt_tally t = {0};
        for (int i = 0; i < TO_SUBMITTERS; i++) tpt_tally_merge(&t, &subs[i].t);
        assert_int_equal(t.ok, t.total); /* 20 s budgets: every submit gets in */
        check_round(&s, &t, recs, TO_SUBMITTERS * TO_PER, 2, 0);
        tot += s.completed;
        exp += s.expired;
        canc += s.cancelled;
        ok += s.succeeded;
        retr += s.retried;
        tpt_destroy(p);
        free(recs);
    }
    print_message("timeout vs completion: %u rounds, %llu tasks: %llu succeeded, %llu timed out "
                  "(%llu of them expired unrun), %llu retries\n",
                  rd.done, (unsigned long long)tot, (unsigned long long)ok, (unsigned long long)canc,
                  (unsigned long long)exp, (unsigned long long)retr);
}

/* ------------------------------------------------------------ cancel vs completion */

enum { CC_SUBMITTERS = 3, CC_PER = 300, CC_W = 2, CC_CAP = 8, CC_RECENT = 64 };

typedef struct cc_shared {
    tp_pool *p;
    rec *recs;
    atomic_int go, stop;
    atomic_int recent[CC_RECENT]; /* record index + 1 of recent submits */
    atomic_uint next;
    atomic_int cancel_bad;
} cc_shared;

typedef struct cc_sub {
    cc_shared *sh;
    rec *recs;
    uint32_t seed;
    tpt_tally t;
} cc_sub;

static void cancel_rec(tp_pool *p, rec *r, atomic_int *bad) {
    int rc = tp_cancel(p, atomic_load(&r->id));
    if (rc == TP_OK)
        atomic_fetch_add(&r->cancel_ok, 1);
    else if (rc != TP_ENOTFOUND)
        atomic_fetch_add(bad, 1);
}

static void *cc_submitter(void *a) {
    cc_sub *x = a;
    tpt_wait_go(&x->sh->go);
    for (int k = 0; k < CC_PER; k++) {
        rec *r = &x->recs[k];
        uint32_t v = tpt_xorshift(&x->seed);
        r->kind = (int)(v % K_KINDS);
        r->dur = 5000 + (v >> 8) % 30000; /* 5..35 us */
        tp_task_opts o = {0};
        o.on_done = rec_done;
        uint64_t id = 0;
        r->rc = tp_submit_wait(x->sh->p, rec_task, r, &o, TPT_WAIT_NS, &id);
        tpt_tally_add(&x->t, r->rc);
        if (r->rc != TP_OK) continue;
        atomic_store(&r->id, id);
        unsigned slot = atomic_fetch_add(&x->sh->next, 1) % CC_RECENT;
        atomic_store(&x->sh->recent[slot], (int)(r - x->sh->recs) + 1);
        /* cancel it ourselves after 0..150 us of spinning: it may be queued,
         * starting, running, in its retry wait or done */
        uint64_t spin = (v >> 16) % 150000, t0 = tp_now_ns();
        while (tp_now_ns() - t0 < spin)
            ;
        if ((v >> 3) % 4 != 0) cancel_rec(x->sh->p, r, &x->sh->cancel_bad);
    }
    return NULL;
}

static void *cc_canceller(void *a) {
    cc_shared *sh = a;
    uint32_t seed = 0xfeed;
    tpt_wait_go(&sh->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&sh->stop) && tp_now_ns() < end) {
        int ix = atomic_load(&sh->recent[tpt_xorshift(&seed) % CC_RECENT]);
        if (ix == 0) {
            sched_yield();
            continue;
        }
        cancel_rec(sh->p, &sh->recs[ix - 1], &sh->cancel_bad);
        if ((tpt_xorshift(&seed) & 7) == 0) sched_yield();
    }
    return NULL;
}

static void test_cancel_vs_completion(void **state) {
    tpt_fixture *f = tpt_fx(state);
    rounds rd = rounds_start(20);
    uint64_t tot = 0, canc = 0, unrun = 0, cancels = 0, ran_cancelled = 0;
    while (rounds_next(&rd)) {
        tp_config c = {0};
        c.workers = CC_W;
        c.queue_capacity = CC_CAP;
        c.max_per_user = TP_UNLIMITED;
        c.max_retries = 1;
        c.retry_delay_ns = 20000;
        c.log = tpt_quiet_log;
        cc_shared *sh = calloc(1, sizeof *sh);
        rec *recs = calloc(CC_SUBMITTERS * CC_PER, sizeof *recs);
        assert_non_null(sh);
        assert_non_null(recs);
        sh->p = tpt_fx_pool(f, &c);
        sh->recs = recs;
        cc_sub subs[CC_SUBMITTERS];
        memset(subs, 0, sizeof subs);
        pthread_t th[CC_SUBMITTERS], ct;
        for (int i = 0; i < CC_SUBMITTERS; i++) {
            subs[i].sh = sh;
            subs[i].recs = recs + (size_t)i * CC_PER;
            subs[i].seed = 0x2545f491u * (uint32_t)(i + 1) + rd.done * 31337u;
            assert_int_equal(pthread_create(&th[i], NULL, cc_submitter, &subs[i]), 0);
        }
        assert_int_equal(pthread_create(&ct, NULL, cc_canceller, sh), 0);
        atomic_store(&sh->go, 1);
        for (int i = 0; i < CC_SUBMITTERS; i++) pthread_join(th[i], NULL);
        assert_int_equal(tp_shutdown(sh->p, TPT_WAIT_NS), TP_OK);
        atomic_store(&sh->stop, 1);
        pthread_join(ct, NULL);
        assert_int_equal(tp_wait(sh->p, TPT_WAIT_NS), TP_OK);
        assert_int_equal(atomic_load(&sh->cancel_bad), 0);
        tp_stats s = tpt_stats(sh->p);
        tpt_tally t = {0};
        for (int i = 0; i < CC_SUBMITTERS; i++) tpt_tally_merge(&t, &subs[i].t);
        assert_int_equal(t.ok, t.total);
        check_round(&s, &t, recs, CC_SUBMITTERS * CC_PER, 2, 0);
        /* after an accepted cancel no new attempt starts: at most one ran
         * after it, so a task cancelled while queued or delayed never reruns */
        for (int i = 0; i < CC_SUBMITTERS * CC_PER; i++) {
            rec *r = &recs[i];
            if (atomic_load(&r->cancel_ok) && atomic_load(&r->status) == 5 && atomic_load(&r->ran) != 1)
                fail_msg("record %d: failed first attempt, cancelled, yet ran %d times", i,
                         atomic_load(&r->ran));
            unrun += atomic_load(&r->ran) == 0;
            cancels += atomic_load(&r->cancel_ok) > 0;
            ran_cancelled += atomic_load(&r->cancel_ok) > 0 && atomic_load(&r->ran) > 0;
        }
        tot += s.completed;
        canc += s.cancelled;
        tpt_destroy(sh->p);
        free(recs);
        free(sh);
    }
    print_message("cancel vs completion: %u rounds, %llu tasks, %llu with an accepted cancel "
                  "(%llu of them had run), %llu ended cancelled (%llu unrun)\n",
                  rd.done, (unsigned long long)tot, (unsigned long long)cancels,
                  (unsigned long long)ran_cancelled, (unsigned long long)canc, (unsigned long long)unrun);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_lifecycle_storm),
        TPT_TEST(test_timeout_vs_completion),
        TPT_TEST(test_cancel_vs_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
