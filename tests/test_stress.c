/*
 * test_stress.c -- many threads at once against one pool: submit and close,
 * submit + cancel + stats readers + shutdown, user-slot churn, tp_submit_wait
 * producers with a close in the middle.
 *
 * Nothing here depends on an interleaving. Each test asserts invariants that
 * must hold whatever happened: only the allowed return codes, the counters
 * equal to what the callers saw, every accepted task's on_done exactly once
 * (one atomic counter per task), the at-rest invariants. Iteration counts
 * shrink under sanitizers and valgrind so each test stays within seconds.
 */
#include "tp_test.h"

#include <sched.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

/* n scaled down for slow builds, at least 1. */
static unsigned scaled(unsigned n) {
    unsigned div = 1;
#if TPT_SANITIZED
    div = 4;
#endif
#ifdef RUNNING_ON_VALGRIND
    if (RUNNING_ON_VALGRIND) div = 10;
#endif
    n /= div;
    return n ? n : 1;
}

/* ------------------------------------------------------------ the task record */

#define NUSERS   16
#define PER_USER 2

typedef struct shared {
    atomic_int running[NUSERS]; /* tasks of each user running now */
    atomic_int over_limit;      /* saw more than PER_USER running for a user */
    atomic_int wrong_user;      /* tp_ctx_user() differed from the submitter's */
} shared;

enum { K_NOP, K_YIELD, K_SLEEP, K_FAIL_FIRST, K_USER };

typedef struct srec {
    atomic_int calls;
    atomic_int ran;
    atomic_int status;
    int rc; /* the submit's result, written by the submitting thread */
    int kind;
    int user; /* index, -1 none */
    shared *sh;
} srec;

static int stress_task(tp_ctx *c, void *arg) {
    srec *r = arg;
    atomic_fetch_add(&r->ran, 1);
    switch (r->kind) {
    case K_YIELD: sched_yield(); return 0;
    case K_SLEEP: return tp_ctx_sleep(c, 50000);
    case K_FAIL_FIRST:
        if (tp_ctx_attempt(c) == 0) return 9;
        return tp_ctx_sleep(c, 20000);
    case K_USER: {
        char want[16];
        snprintf(want, sizeof want, "user%02d", r->user);
        const char *u = tp_ctx_user(c);
        if (u == NULL || strcmp(u, want) != 0) atomic_fetch_add(&r->sh->wrong_user, 1);
        int n = atomic_fetch_add(&r->sh->running[r->user], 1) + 1;
        if (n > PER_USER) atomic_fetch_add(&r->sh->over_limit, 1);
        int rc = tp_ctx_sleep(c, 20000);
        atomic_fetch_sub(&r->sh->running[r->user], 1);
        return rc;
    }
    default: return 0;
    }
}

static void stress_done(void *arg, int status) {
    srec *r = arg;
    atomic_store(&r->status, status);
    atomic_fetch_add(&r->calls, 1);
}

/* The counters equal what the callers saw; at rest. */
static void assert_counters_match(const tp_stats *s, const tpt_tally *t) {
    if (t->bad)
        fail_msg("%llu unexpected return codes, e.g. %d (%s)", (unsigned long long)t->bad, t->last_bad,
                 tp_err_name(t->last_bad));
    tpt_assert_at_rest(s);
    tpt_assert_counts(*s, TPT_EQ(submitted, t->total), TPT_EQ(accepted, t->ok),
                      TPT_EQ(rejected_full, t->full), TPT_EQ(rejected_user, t->user),
                      TPT_EQ(rejected_closed, t->closed), TPT_EQ(rejected_timeout, t->timedout));
}

/* Every accepted record: on_done exactly once, ran at most 1 + retries.
 * Every refused one: never ran, no on_done. The final statuses add up to the
 * outcome counters. */
static void assert_records(const tp_stats *s, srec *recs, size_t n, unsigned max_runs) {
    uint64_t ok = 0, fail = 0, canc = 0, started = 0, retried = 0, accepted = 0;
    for (size_t i = 0; i < n; i++) {
        srec *r = &recs[i];
        int calls = atomic_load(&r->calls), ran = atomic_load(&r->ran);
        if (r->rc == TP_OK) {
            accepted++;
            if (calls != 1) fail_msg("record %zu: accepted, on_done called %d times", i, calls);
            if (ran < 0 || (unsigned)ran > max_runs) fail_msg("record %zu: ran %d times", i, ran);
            int st = atomic_load(&r->status);
            ok += (st == 0);
            fail += (st != 0);
            canc += (st == TP_ECANCELED || st == TP_ETIMEDOUT);
            started += (ran > 0);
            retried += ran > 1 ? (uint64_t)(ran - 1) : 0;
        } else {
            if (calls != 0 || ran != 0)
                fail_msg("record %zu: refused (%s) but on_done %d, ran %d", i, tp_err_name(r->rc), calls,
                         ran);
        }
    }
    tpt_assert_counts(*s, TPT_EQ(accepted, accepted), TPT_EQ(succeeded, ok), TPT_EQ(failed, fail),
                      TPT_EQ(cancelled, canc), TPT_EQ(started, started), TPT_EQ(retried, retried));
}

/* ------------------------------------------------------------ submit + close */

enum { SC_THREADS = 8, SC_PER = 300 };

typedef struct sc_arg {
    tp_pool *p;
    srec *recs;
    int close_at; /* -1: never */
    atomic_int *go;
    tpt_tally t;
    int ok_after_closed; /* TP_OK after this thread saw TP_ECLOSED */
} sc_arg;

static void *sc_main(void *a) {
    sc_arg *x = a;
    int seen_closed = 0;
    tpt_wait_go(x->go);
    for (int k = 0; k < SC_PER; k++) {
        if (k == x->close_at) {
            tp_close(x->p);
            seen_closed = 1; /* everything after our own close must be refused */
        }
        srec *r = &x->recs[k];
        r->kind = (k % 4 == 0) ? K_YIELD : K_NOP;
        tp_task_opts o = {0};
        o.on_done = stress_done;
        r->rc = tp_submit(x->p, stress_task, r, &o, NULL);
        tpt_tally_add(&x->t, r->rc);
        if (r->rc == TP_ECLOSED)
            seen_closed = 1;
        else if (r->rc == TP_OK && seen_closed)
            x->ok_after_closed++;
        else if (r->rc == TP_EFULL)
            sched_yield(); /* let the workers make room */
    }
    return NULL;
}

static void test_concurrent_submit_close(void **state) {
    tpt_fixture *f = tpt_fx(state);
    unsigned rounds = scaled(100);
    tpt_tally all = {0};
    for (unsigned round = 0; round < rounds; round++) {
        tp_config c = {0};
        c.workers = 2;
        c.queue_capacity = 8;
        c.max_per_user = TP_UNLIMITED;
        tp_pool *p = tpt_fx_pool(f, &c);
        srec *recs = calloc(SC_THREADS * SC_PER, sizeof *recs);
        assert_non_null(recs);
        atomic_int go = 0;
        sc_arg args[SC_THREADS];
        pthread_t th[SC_THREADS];
        memset(args, 0, sizeof args);
        for (int i = 0; i < SC_THREADS; i++) {
            args[i].p = p;
            args[i].recs = recs + (size_t)i * SC_PER;
            args[i].go = &go;
            args[i].close_at = i == 0   ? 20 + (int)(round * 37 % 200)
                               : i == 1 ? 50 + (int)(round * 53 % 200)
                                        : -1;
            assert_int_equal(pthread_create(&th[i], NULL, sc_main, &args[i]), 0);
        }
        atomic_store(&go, 1);
        for (int i = 0; i < SC_THREADS; i++) pthread_join(th[i], NULL);

        assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK); /* closed by the threads */
        tp_stats s = tpt_stats(p);
        assert_int_equal(s.workers, 0);
        tpt_tally t = {0};
        for (int i = 0; i < SC_THREADS; i++) {
            tpt_tally_merge(&t, &args[i].t);
            assert_int_equal(args[i].ok_after_closed, 0);
        }
        assert_int_equal(t.user + t.timedout, 0);
        assert_counters_match(&s, &t);
        assert_records(&s, recs, SC_THREADS * SC_PER, 1);
        assert_true(t.closed > 0);
        tpt_tally_merge(&all, &t);
        tpt_finish(p);
        free(recs);
    }
    print_message("submit+close: %u rounds, %llu ok, %llu full, %llu closed\n", rounds,
                  (unsigned long long)all.ok, (unsigned long long)all.full, (unsigned long long)all.closed);
}

/* ------------------------------------------------------------ submit + cancel + stats + shutdown */

enum { MX_SUBMITTERS = 4, MX_PER = 400, MX_CANCELLERS = 2, MX_W = 3, MX_CAP = 16 };

typedef struct mx_shared {
    tp_pool *p;
    atomic_int go, stop;
    atomic_uint_least64_t ids[MX_SUBMITTERS * MX_PER];
    atomic_int nids;
    /* readers' findings */
    atomic_int bound_violations;
    atomic_int format_errors;
    atomic_int stat_reads;
    atomic_int cancel_ok, cancel_notfound, cancel_bad;
} mx_shared;

typedef struct mx_sub {
    mx_shared *sh;
    srec *recs;
    tpt_tally t;
    int ok_after_closed;
} mx_sub;

static void *mx_submitter(void *a) {
    mx_sub *x = a;
    int seen_closed = 0;
    tpt_wait_go(&x->sh->go);
    for (int k = 0; k < MX_PER; k++) {
        srec *r = &x->recs[k];
        r->kind = (k % 5 == 0) ? K_FAIL_FIRST : (k % 2) ? K_SLEEP : K_NOP;
        tp_task_opts o = {0};
        o.on_done = stress_done;
        uint64_t id = 0;
        r->rc = tp_submit(x->sh->p, stress_task, r, &o, &id);
        tpt_tally_add(&x->t, r->rc);
        if (r->rc == TP_OK) {
            if (seen_closed) x->ok_after_closed++;
            int slot = atomic_fetch_add(&x->sh->nids, 1);
            atomic_store(&x->sh->ids[slot], id);
        } else if (r->rc == TP_ECLOSED) {
            seen_closed = 1;
        } else if (r->rc == TP_EFULL) {
            sched_yield();
        }
    }
    return NULL;
}

static void *mx_canceller(void *a) {
    mx_shared *sh = a;
    uint32_t seed = (uint32_t)(uintptr_t)&seed | 1u;
    tpt_wait_go(&sh->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&sh->stop) && tp_now_ns() < end) {
        int n = atomic_load(&sh->nids);
        if (n == 0) {
            sched_yield();
            continue;
        }
        uint64_t id = atomic_load(&sh->ids[tpt_xorshift(&seed) % (uint32_t)n]);
        if (id == 0) continue; /* slot reserved, id not stored yet */
        int rc = tp_cancel(sh->p, id);
        if (rc == TP_OK)
            atomic_fetch_add(&sh->cancel_ok, 1);
        else if (rc == TP_ENOTFOUND)
            atomic_fetch_add(&sh->cancel_notfound, 1);
        else
            atomic_fetch_add(&sh->cancel_bad, 1);
        if ((tpt_xorshift(&seed) & 7) == 0) sched_yield();
    }
    return NULL;
}

static void *mx_reader(void *a) {
    mx_shared *sh = a;
    char buf[4096];
    tpt_wait_go(&sh->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&sh->stop) && tp_now_ns() < end) {
        tp_stats s;
        tp_stats_get(sh->p, &s);
        /* single fields only: a snapshot is not one instant */
        if (s.active > MX_W || s.queued > MX_CAP || s.delayed > MX_CAP || s.workers > MX_W || s.idle > MX_W ||
            s.users != 0)
            atomic_fetch_add(&sh->bound_violations, 1);
        int n = tp_stats_format(&s, TP_FORMAT_JSON, buf, sizeof buf);
        if (n <= 0 || (size_t)n >= sizeof buf || buf[0] != '{') atomic_fetch_add(&sh->format_errors, 1);
        n = tp_stats_format(&s, TP_FORMAT_PROMETHEUS, buf, sizeof buf);
        if (n <= 0 || (size_t)n >= sizeof buf) atomic_fetch_add(&sh->format_errors, 1);
        if (tp_user_active(sh->p, "nobody") != 0) atomic_fetch_add(&sh->bound_violations, 1);
        atomic_fetch_add(&sh->stat_reads, 1);
        sched_yield();
    }
    return NULL;
}

static void test_submit_cancel_stats_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    unsigned rounds = scaled(12);
    tpt_tally all = {0};
    uint64_t cancels = 0, reads = 0;
    for (unsigned round = 0; round < rounds; round++) {
        tp_config c = {0};
        c.workers = MX_W;
        c.queue_capacity = MX_CAP;
        c.max_per_user = TP_UNLIMITED;
        c.max_retries = 1;
        c.retry_delay_ns = TPT_MS(1);
        c.log = tpt_quiet_log;
        mx_shared *sh = calloc(1, sizeof *sh);
        srec *recs = calloc(MX_SUBMITTERS * MX_PER, sizeof *recs);
        assert_non_null(sh);
        assert_non_null(recs);
        sh->p = tpt_fx_pool(f, &c);
        mx_sub subs[MX_SUBMITTERS];
        memset(subs, 0, sizeof subs);
        pthread_t st[MX_SUBMITTERS], ct[MX_CANCELLERS], rt;
        for (int i = 0; i < MX_SUBMITTERS; i++) {
            subs[i].sh = sh;
            subs[i].recs = recs + (size_t)i * MX_PER;
            assert_int_equal(pthread_create(&st[i], NULL, mx_submitter, &subs[i]), 0);
        }
        for (int i = 0; i < MX_CANCELLERS; i++)
            assert_int_equal(pthread_create(&ct[i], NULL, mx_canceller, sh), 0);
        assert_int_equal(pthread_create(&rt, NULL, mx_reader, sh), 0);
        atomic_store(&sh->go, 1);

        /* Shut down somewhere in the middle of the submissions. */
        uint64_t want = (uint64_t)(MX_SUBMITTERS * MX_PER) * (1 + round % 3) / 5;
        (void)TPT_POLL(tpt_stats(sh->p).submitted >= want, TPT_WAIT_NS);
        /* the reader runs alongside, however the threads were scheduled */
        TPT_EVENTUALLY(atomic_load(&sh->stat_reads) > 0);
        int rc = tp_shutdown(sh->p, TPT_WAIT_NS);
        for (int i = 0; i < MX_SUBMITTERS; i++) pthread_join(st[i], NULL);
        atomic_store(&sh->stop, 1);
        for (int i = 0; i < MX_CANCELLERS; i++) pthread_join(ct[i], NULL);
        pthread_join(rt, NULL);
        assert_int_equal(rc, TP_OK); /* short, cooperative tasks drain in time */
        assert_int_equal(tp_wait(sh->p, TPT_WAIT_NS), TP_OK);

        tp_stats s = tpt_stats(sh->p);
        assert_int_equal(s.workers, 0);
        tpt_tally t = {0};
        for (int i = 0; i < MX_SUBMITTERS; i++) {
            tpt_tally_merge(&t, &subs[i].t);
            assert_int_equal(subs[i].ok_after_closed, 0);
        }
        assert_int_equal(t.user + t.timedout, 0);
        assert_counters_match(&s, &t);
        assert_records(&s, recs, MX_SUBMITTERS * MX_PER, 2);
        assert_int_equal(atomic_load(&sh->cancel_bad), 0);
        assert_int_equal(atomic_load(&sh->bound_violations), 0);
        assert_int_equal(atomic_load(&sh->format_errors), 0);
        assert_true(atomic_load(&sh->stat_reads) > 0);
        tpt_tally_merge(&all, &t);
        cancels += (uint64_t)atomic_load(&sh->cancel_ok);
        reads += (uint64_t)atomic_load(&sh->stat_reads);
        tpt_finish(sh->p);
        free(recs);
        free(sh);
    }
    print_message("submit+cancel+stats+shutdown: %u rounds, %llu ok, %llu full, %llu closed, "
                  "%llu cancels accepted, %llu stats reads\n",
                  rounds, (unsigned long long)all.ok, (unsigned long long)all.full,
                  (unsigned long long)all.closed, (unsigned long long)cancels, (unsigned long long)reads);
}

/* ------------------------------------------------------------ user-slot churn */

enum { UC_THREADS = 8, UC_PER = 400, UC_W = 4, UC_CAP = 16 };

typedef struct uc_shared {
    tp_pool *p;
    shared sh;
    atomic_int go, stop;
    atomic_int slot_violations; /* tp_user_active() above the limit */
} uc_shared;

typedef struct uc_arg {
    uc_shared *u;
    srec *recs;
    uint32_t seed;
    tpt_tally t;
} uc_arg;

static void *uc_main(void *a) {
    uc_arg *x = a;
    tpt_wait_go(&x->u->go);
    for (int k = 0; k < UC_PER; k++) {
        srec *r = &x->recs[k];
        r->kind = K_USER;
        r->user = (int)(tpt_xorshift(&x->seed) % NUSERS);
        r->sh = &x->u->sh;
        char name[32]; /* overwritten right after the call: the pool must copy */
        snprintf(name, sizeof name, "user%02d", r->user);
        tp_task_opts o = {0};
        o.user = name;
        o.on_done = stress_done;
        r->rc = tp_submit(x->u->p, stress_task, r, &o, NULL);
        memset(name, 'X', sizeof name - 1);
        name[sizeof name - 1] = '\0';
        tpt_tally_add(&x->t, r->rc);
        if (r->rc != TP_OK) sched_yield();
    }
    return NULL;
}

static void *uc_checker(void *a) {
    uc_shared *u = a;
    uint32_t seed = 12345;
    tpt_wait_go(&u->go);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (!atomic_load(&u->stop) && tp_now_ns() < end) {
        char name[16];
        snprintf(name, sizeof name, "user%02u", (unsigned)(tpt_xorshift(&seed) % NUSERS));
        if (tp_user_active(u->p, name) > PER_USER) atomic_fetch_add(&u->slot_violations, 1);
        tp_stats s;
        tp_stats_get(u->p, &s);
        if (s.users > NUSERS) atomic_fetch_add(&u->slot_violations, 1);
        sched_yield();
    }
    return NULL;
}

static void test_user_slot_churn(void **state) {
    tpt_fixture *f = tpt_fx(state);
    unsigned rounds = scaled(10);
    tpt_tally all = {0};
    for (unsigned round = 0; round < rounds; round++) {
        tp_config c = {0};
        c.workers = UC_W;
        c.queue_capacity = UC_CAP;
        c.max_per_user = PER_USER;
        uc_shared *u = calloc(1, sizeof *u);
        srec *recs = calloc(UC_THREADS * UC_PER, sizeof *recs);
        assert_non_null(u);
        assert_non_null(recs);
        u->p = tpt_fx_pool(f, &c);
        uc_arg args[UC_THREADS];
        memset(args, 0, sizeof args);
        pthread_t th[UC_THREADS], ck;
        for (int i = 0; i < UC_THREADS; i++) {
            args[i].u = u;
            args[i].recs = recs + (size_t)i * UC_PER;
            args[i].seed = 0x1234567u * (uint32_t)(i + 1) + round;
            assert_int_equal(pthread_create(&th[i], NULL, uc_main, &args[i]), 0);
        }
        assert_int_equal(pthread_create(&ck, NULL, uc_checker, u), 0);
        atomic_store(&u->go, 1);
        uint64_t want = (uint64_t)(UC_THREADS * UC_PER) * (2 + round % 3) / 5;
        (void)TPT_POLL(tpt_stats(u->p).submitted >= want, TPT_WAIT_NS);
        assert_int_equal(tp_close(u->p), TP_OK);
        for (int i = 0; i < UC_THREADS; i++) pthread_join(th[i], NULL);
        assert_int_equal(tp_wait(u->p, TPT_WAIT_NS), TP_OK);
        atomic_store(&u->stop, 1);
        pthread_join(ck, NULL);

        tp_stats s = tpt_stats(u->p);
        tpt_tally t = {0};
        for (int i = 0; i < UC_THREADS; i++) tpt_tally_merge(&t, &args[i].t);
        assert_int_equal(t.timedout, 0);
        assert_counters_match(&s, &t);
        assert_records(&s, recs, UC_THREADS * UC_PER, 1);
        assert_int_equal(atomic_load(&u->sh.over_limit), 0);
        assert_int_equal(atomic_load(&u->sh.wrong_user), 0);
        assert_int_equal(atomic_load(&u->slot_violations), 0);
        for (int i = 0; i < NUSERS; i++) {
            char name[16];
            snprintf(name, sizeof name, "user%02d", i);
            assert_int_equal(tp_user_active(u->p, name), 0);
            assert_int_equal(atomic_load(&u->sh.running[i]), 0);
        }
        assert_int_equal(s.users, 0);
        tpt_tally_merge(&all, &t);
        tpt_finish(u->p);
        free(recs);
        free(u);
    }
    print_message("user churn: %u rounds, %llu ok, %llu user limit, %llu full, %llu closed\n", rounds,
                  (unsigned long long)all.ok, (unsigned long long)all.user, (unsigned long long)all.full,
                  (unsigned long long)all.closed);
}

/* ------------------------------------------------------------ submit_wait producers + close */

enum { SW_PRODUCERS = 6, SW_MAXIT = 4000, SW_W = 2, SW_CAP = 2 };

typedef struct sw_arg {
    tp_pool *p;
    srec *recs;
    int n; /* attempts made */
    int long_budget;
    const char *user; /* the user this producer submits as */
    atomic_int *go;
    tpt_tally t;
    atomic_int *closed;   /* set by the main thread once it closed the pool */
    uint64_t returned_at; /* when the last call returned */
} sw_arg;

static void *sw_main(void *a) {
    sw_arg *x = a;
    tpt_wait_go(x->go);
    for (int k = 0; k < SW_MAXIT; k++) {
        srec *r = &x->recs[k];
        if (k == SW_MAXIT - 1)
            tpt_wait_go(x->closed); /* out of records: the last call comes after the close */
        r->kind = K_SLEEP;
        tp_task_opts o = {0};
        o.user = x->user;
        o.on_done = stress_done;
        uint64_t budget = x->long_budget ? TPT_WAIT_NS : TPT_MS(1);
        r->rc = tp_submit_wait(x->p, stress_task, r, &o, budget, NULL);
        x->returned_at = tp_now_ns();
        x->n = k + 1;
        tpt_tally_add(&x->t, r->rc);
        if (r->rc == TP_ECLOSED) break;
    }
    return NULL;
}

static void test_submit_wait_producers_close(void **state) {
    tpt_fixture *f = tpt_fx(state);
    unsigned rounds = scaled(8);
    tpt_tally all = {0};
    for (unsigned round = 0; round < rounds; round++) {
        tp_config c = {0};
        c.workers = SW_W;
        c.queue_capacity = SW_CAP;
        c.max_per_user = 1;
        tp_pool *p = tpt_fx_pool(f, &c);
        srec *recs = calloc((size_t)SW_PRODUCERS * SW_MAXIT, sizeof *recs);
        assert_non_null(recs);
        atomic_int go = 0, closed = 0;
        sw_arg args[SW_PRODUCERS];
        memset(args, 0, sizeof args);
        pthread_t th[SW_PRODUCERS];
        for (int i = 0; i < SW_PRODUCERS; i++) {
            args[i].p = p;
            args[i].recs = recs + (size_t)i * SW_MAXIT;
            args[i].user = i % 3 == 0 ? "pa" : i % 3 == 1 ? "pb" : "pc";
            args[i].long_budget = i < SW_PRODUCERS / 2;
            args[i].go = &go;
            args[i].closed = &closed;
            assert_int_equal(pthread_create(&th[i], NULL, sw_main, &args[i]), 0);
        }
        atomic_store(&go, 1);
        (void)TPT_POLL(tpt_stats(p).accepted >= 20 + round * 5, TPT_WAIT_NS);
        uint64_t t_close = tp_now_ns();
        assert_int_equal(tp_close(p), TP_OK);
        atomic_store(&closed, 1);
        for (int i = 0; i < SW_PRODUCERS; i++) pthread_join(th[i], NULL);
        assert_int_equal(tp_wait(p, TPT_WAIT_NS), TP_OK);

        tp_stats s = tpt_stats(p);
        tpt_tally t = {0};
        for (int i = 0; i < SW_PRODUCERS; i++) {
            sw_arg *x = &args[i];
            tpt_tally_merge(&t, &x->t);
            if (x->long_budget) /* with a 20 s budget only the close ends a wait */
                assert_int_equal(x->t.timedout, 0);
            /* every producer ends on the close, promptly */
            assert_true(x->n > 0);
            assert_int_equal(x->recs[x->n - 1].rc, TP_ECLOSED);
            assert_int_equal(x->t.closed, 1);
            assert_true(x->returned_at - t_close < TPT_WAIT_NS / 4);
        }
        assert_int_equal(t.full + t.user, 0); /* never from tp_submit_wait */
        assert_counters_match(&s, &t);
        /* records beyond each producer's attempts were never used (rc 0 ==
         * TP_OK would count them as accepted): check the used ones only */
        for (int i = 0; i < SW_PRODUCERS; i++) {
            for (int k = 0; k < args[i].n; k++) {
                srec *r = &args[i].recs[k];
                int calls = atomic_load(&r->calls);
                if (calls != (r->rc == TP_OK ? 1 : 0))
                    fail_msg("producer %d attempt %d (%s): on_done %d times", i, k, tp_err_name(r->rc),
                             calls);
            }
        }
        assert_int_equal(s.users, 0);
        tpt_tally_merge(&all, &t);
        tpt_finish(p);
        free(recs);
    }
    print_message("submit_wait producers: %u rounds, %llu ok, %llu timed out, %llu closed\n", rounds,
                  (unsigned long long)all.ok, (unsigned long long)all.timedout,
                  (unsigned long long)all.closed);
}

/* ------------------------------------------------------------ kept user slots, users coming and going */

/* A pool that stages keeps some given-back user slots (life.h, `rel`;
 * users.h, `kept`) and gives them back in batches. Several threads, each
 * the only submitter of its users (so it knows an upper bound of each
 * one's slots: accepted minus on_done run), submit as users of a sliding
 * window over more names than the table ever holds at once (idle entries
 * are taken over by new users), plain (a user and a completion queue:
 * handed over without the pool lock) and locked (on_done on the pool,
 * some with a deadline, some cancelled); tp_user_active in between; the
 * pool closed, shut down or shut down forced while they submit. No
 * TP_EUSERLIMIT for a user below its limit, no tp_user_active above the
 * bound, every on_done once, and at rest no user holds a slot. */
enum { KS_THREADS = 4, KS_NAMES = 40, KS_WINDOW = 6, KS_PER = 3000, KS_IDS = 32, KS_LIMIT = 3 };

typedef struct ks_user {
    char name[16];
    atomic_int unfinished; /* accepted, on_done not run yet */
} ks_user;

typedef struct ks_rec {
    ks_user *u;
    int rc;
    atomic_int calls;
} ks_rec;

typedef struct ks_arg {
    tp_pool *p;
    atomic_int *go;
    tp_cq *cq;
    ks_user users[KS_NAMES];
    ks_rec *recs;
    unsigned per;
    uint32_t seed;
    uint64_t ids[KS_IDS];
    unsigned nids;
    tpt_tally t;
    unsigned wrong_limit, active_over;
} ks_arg;

static int ks_task(tp_ctx *c, void *arg) {
    (void)c;
    ks_rec *r = arg;
    if (((uintptr_t)r / sizeof *r) % 5 == 0) sched_yield();
    return ((uintptr_t)r / sizeof *r) % 7 == 0 ? 5 : 0;
}

static void ks_done(void *arg, int status) {
    (void)status;
    ks_rec *r = arg;
    atomic_fetch_add(&r->calls, 1);
    atomic_fetch_sub(&r->u->unfinished, 1); /* its slot was given back (or kept) before */
}

static void *ks_main(void *a) {
    ks_arg *x = a;
    tpt_wait_go(x->go);
    unsigned base = 0;
    for (unsigned k = 0; k < x->per; k++) {
        if (k % 128 == 0) base = (base + 5) % KS_NAMES; /* users come and go */
        ks_user *u = &x->users[(base + tpt_xorshift(&x->seed) % KS_WINDOW) % KS_NAMES];
        ks_rec *r = &x->recs[k];
        r->u = u;
        tp_task_opts o = {0};
        o.user = u->name;
        o.on_done = ks_done;
        unsigned kind = tpt_xorshift(&x->seed) % 8;
        if (kind < 5)
            o.cq = x->cq; /* plain */
        else if (kind == 5)
            o.deadline_ns = tp_now_ns() + (tpt_xorshift(&x->seed) % 200) * 1000;
        int held = atomic_fetch_add(&u->unfinished, 1); /* at least the slots it holds */
        uint64_t id = 0;
        r->rc = tp_submit(x->p, ks_task, r, &o, kind >= 5 ? &id : NULL);
        tpt_tally_add(&x->t, r->rc);
        if (r->rc == TP_OK) {
            if (id) x->ids[x->nids++ % KS_IDS] = id;
        } else {
            atomic_fetch_sub(&u->unfinished, 1);
            if (r->rc == TP_EUSERLIMIT && held < KS_LIMIT) x->wrong_limit++;
        }
        if (k % 8 == 0) (void)tp_cq_drain(x->cq, 0);
        if (k % 16 == 0 && x->nids > 0)
            (void)tp_cancel(x->p, x->ids[tpt_xorshift(&x->seed) % (x->nids < KS_IDS ? x->nids : KS_IDS)]);
        if (k % 32 == 0) {
            ks_user *v = &x->users[tpt_xorshift(&x->seed) % KS_NAMES];
            int bound = atomic_load(&v->unfinished);
            if ((int)tp_user_active(x->p, v->name) > bound) x->active_over++;
        }
        if (r->rc != TP_OK) sched_yield();
    }
    return NULL;
}

static void test_user_kept_slots_users_come_and_go(void **state) {
    tpt_fixture *f = tpt_fx(state);
    unsigned rounds = 6, per = scaled(KS_PER);
    tpt_tally all = {0};
    for (unsigned round = 0; round < rounds; round++) {
        tp_config c = tpt_quiet_config(1 + round % 2, 64, KS_LIMIT);
        c.sched = round % 2 ? TP_SCHED_FAIR : TP_SCHED_FIFO; /* fixed workers: both stage */
        tp_pool *p = tpt_fx_pool(f, &c);
        atomic_int go = 0;
        ks_arg *args = calloc(KS_THREADS, sizeof *args);
        assert_non_null(args);
        pthread_t th[KS_THREADS];
        for (int i = 0; i < KS_THREADS; i++) {
            ks_arg *x = &args[i];
            x->p = p;
            x->go = &go;
            x->per = per;
            x->seed = 0x9e3779b9u * (uint32_t)(i + 1) + round;
            x->recs = calloc(per, sizeof *x->recs);
            assert_non_null(x->recs);
            assert_int_equal(tp_cq_create(&x->cq, per), TP_OK);
            for (int j = 0; j < KS_NAMES; j++)
                snprintf(x->users[j].name, sizeof x->users[j].name, "k%u-%02u", (unsigned)i % 10u,
                         (unsigned)j % 100u);
            assert_int_equal(pthread_create(&th[i], NULL, ks_main, x), 0);
        }
        atomic_store(&go, 1);
        /* ended while they submit: closed, drained, or forced */
        (void)TPT_POLL(tpt_stats(p).submitted >= (uint64_t)KS_THREADS * per / 2, TPT_WAIT_NS);
        int how = (int)(round / 2) % 3;
        if (how == 0) assert_int_equal(tp_close(p), TP_OK);
        if (how == 1) assert_int_equal(tp_shutdown(p, TPT_WAIT_NS), TP_OK);
        int forced = how == 2 && tp_shutdown(p, 1) == TP_ETIMEDOUT;
        for (int i = 0; i < KS_THREADS; i++) pthread_join(th[i], NULL);
        assert_int_equal(tp_wait(p, TPT_WAIT_NS), forced ? TP_ETIMEDOUT : TP_OK);
        for (int i = 0; i < KS_THREADS; i++) {
            ks_arg *x = &args[i];
            assert_true(TPT_POLL((tp_cq_drain(x->cq, 0), tp_cq_destroy(x->cq) == TP_OK), TPT_WAIT_NS));
            assert_int_equal(x->t.bad, 0);
            assert_int_equal(x->wrong_limit, 0);
            assert_int_equal(x->active_over, 0);
            for (unsigned k = 0; k < per; k++)
                assert_int_equal(atomic_load(&x->recs[k].calls), x->recs[k].rc == TP_OK ? 1 : 0);
            for (int j = 0; j < KS_NAMES; j++) {
                assert_int_equal(atomic_load(&x->users[j].unfinished), 0);
                assert_int_equal(tp_user_active(p, x->users[j].name), 0);
            }
            tpt_tally_merge(&all, &x->t);
            free(x->recs);
        }
        tp_stats s = tpt_stats(p);
        tpt_assert_at_rest(&s);
        free(args);
        tpt_fx_forget(p);
        assert_int_equal(tp_destroy(p), TP_OK);
    }
    print_message(
        "kept slots, users come and go: %u rounds, %llu ok, %llu user limit, %llu full, %llu closed\n",
        rounds, (unsigned long long)all.ok, (unsigned long long)all.user, (unsigned long long)all.full,
        (unsigned long long)all.closed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_concurrent_submit_close),
        TPT_TEST(test_submit_cancel_stats_shutdown),
        TPT_TEST(test_user_slot_churn),
        TPT_TEST(test_submit_wait_producers_close),
        TPT_TEST(test_user_kept_slots_users_come_and_go),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
