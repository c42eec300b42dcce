/*
 * test_ctx.c -- the running task's context (header section 7).
 *
 * Covers tp_ctx_id, tp_ctx_user (copied at submit), tp_ctx_attempt,
 * tp_ctx_deadline (the earlier of start + run timeout and the task deadline),
 * tp_ctx_sleep and tp_ctx_err (cancel, run timeout, deadline, precedence of
 * cancellation), tp_ctx_fd (readable on tp_cancel and on a forced shutdown,
 * not on a timeout, clean again for the next task), the run timeout not
 * counting queue time, the deadline counting it (expired without running),
 * and tp_now_ns.
 *
 * Tasks record what they saw in a `rec` (atomics; the plain `user` buffer is
 * published by the seq_cst store to `finished`), and only the main thread
 * asserts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "tp_test.h"

/* What one task saw. Zero-initialise with `rec r = {0}`. */
typedef struct rec {
    /* inputs */
    uint64_t sleep_ns; /* task_sleep: how long to sleep */
    tpt_latch *gate;   /* optional latch the task waits on first */
    /* outputs */
    atomic_int ran;      /* calls of the task function */
    atomic_int started;  /* set on entry (after the gate) */
    atomic_int phase;    /* task-specific progress marker */
    atomic_int finished; /* set last: publishes everything above */
    _Atomic uint64_t id;
    atomic_uint attempt;
    _Atomic uint64_t deadline;
    _Atomic uint64_t t_start;
    _Atomic uint64_t t_end;
    _Atomic uint64_t t_end2;
    atomic_int err_start;
    _Atomic uint64_t t_err; /* when err_start was read */
    atomic_int err_end;
    atomic_int rc;
    atomic_int rc2;
    atomic_int fd;
    atomic_int fd_ready_before; /* poll(fd, 0) result before anything */
    atomic_int fd_poll_rc;
    atomic_int fd_revents;
    atomic_int user_null;
    char user[TP_USER_MAX + 16];
    /* on_done */
    atomic_int done_calls;
    atomic_int done_status;
} rec;

static void rec_done(void *arg, int status) {
    rec *r = arg;
    atomic_store(&r->done_status, status);
    atomic_fetch_add(&r->done_calls, 1);
}

/* A quiet pool whose default run timeout is run_timeout_ns (0: the library's). */
static tp_pool *timeout_pool(tpt_fixture *f, unsigned workers, uint64_t run_timeout_ns) {
    tp_config cfg = tpt_quiet_config(workers, 0, 0);
    cfg.run_timeout_ns = run_timeout_ns;
    return tpt_fx_pool(f, &cfg);
}

static int poll_in(int fd, int timeout_ms, int *revents) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN, .revents = 0};
    int rc;
    do {
        rc = poll(&pfd, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (revents) *revents = pfd.revents;
    return rc;
}

static void rec_common(tp_ctx *c, rec *r) {
    atomic_store(&r->t_start, tp_now_ns());
    atomic_store(&r->err_start, tp_ctx_err(c));
    atomic_store(&r->t_err, tp_now_ns());
    atomic_store(&r->id, tp_ctx_id(c));
    atomic_store(&r->attempt, tp_ctx_attempt(c));
    atomic_store(&r->deadline, tp_ctx_deadline(c));
    const char *u = tp_ctx_user(c);
    atomic_store(&r->user_null, u == NULL);
    if (u) {
        strncpy(r->user, u, sizeof r->user - 1);
        r->user[sizeof r->user - 1] = '\0';
    }
    atomic_fetch_add(&r->ran, 1);
    atomic_store(&r->started, 1);
}

/* An attempt sees no error as it starts, unless its worker was stalled past
 * the attempt's deadline before it looked: then TP_ETIMEDOUT is right. (The
 * deadline itself, which a wrong run timeout would set early, is checked by
 * the callers against the submit.) */
static void assert_err_start_clear(rec *r) {
    int e = atomic_load(&r->err_start);
    if (e == 0) return;
    assert_int_equal(e, TP_ETIMEDOUT);
    assert_true(atomic_load(&r->t_err) >= atomic_load(&r->deadline));
}

/* Records the context, then returns 0. */
static int task_record(tp_ctx *c, void *arg) {
    rec *r = arg;
    if (r->gate) tpt_latch_wait(r->gate);
    rec_common(c, r);
    atomic_store(&r->finished, 1);
    return 0;
}

/* Records, sleeps r->sleep_ns with tp_ctx_sleep, records the result, then
 * sleeps again 20 s (must return at once when the first was cut short). */
static int task_sleep(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    int rc = tp_ctx_sleep(c, r->sleep_ns);
    atomic_store(&r->t_end, tp_now_ns());
    atomic_store(&r->rc, rc);
    atomic_store(&r->err_end, tp_ctx_err(c));
    if (rc != 0) {
        int rc2 = tp_ctx_sleep(c, TPT_S(20));
        atomic_store(&r->t_end2, tp_now_ns());
        atomic_store(&r->rc2, rc2);
    }
    atomic_store(&r->finished, 1);
    return rc;
}

/* Polls tp_ctx_err (without tp_ctx_sleep) until it is non-zero, bounded. */
static int task_poll_err(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    int err;
    while ((err = tp_ctx_err(c)) == 0 && tp_now_ns() < end) {
        tpt_pause(); /* between polls of a bounded loop */
    }
    atomic_store(&r->t_end, tp_now_ns());
    atomic_store(&r->err_end, err);
    atomic_store(&r->finished, 1);
    return err;
}

/* Times out (run timeout in opts), then waits for a tp_cancel: the error must
 * turn from TP_ETIMEDOUT to TP_ECANCELED (cancellation takes precedence). */
static int task_timeout_then_cancel(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    int rc = tp_ctx_sleep(c, TPT_S(20));
    atomic_store(&r->rc, rc);
    atomic_store(&r->phase, 1); /* main may cancel now */
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    int err;
    while ((err = tp_ctx_err(c)) != TP_ECANCELED && tp_now_ns() < end) {
        tpt_pause(); /* between polls of a bounded loop */
    }
    atomic_store(&r->err_end, err);
    atomic_store(&r->finished, 1);
    return err;
}

/* Gets the cancel fd, checks it is not readable, shows that a bounded poll
 * times out, then polls it for up to 20 s. */
static int task_fd_wait(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    int fd = tp_ctx_fd(c);
    atomic_store(&r->fd, fd);
    if (fd < 0) {
        atomic_store(&r->finished, 1);
        return fd;
    }
    atomic_store(&r->fd_ready_before, poll_in(fd, 0, NULL));
    /* A real (short) wait: not cancelled, so it must time out. */
    atomic_store(&r->rc2, poll_in(fd, 20, NULL));
    atomic_store(&r->phase, 1); /* main may cancel now */
    int rev = 0;
    int prc = poll_in(fd, 20000, &rev);
    atomic_store(&r->t_end, tp_now_ns());
    atomic_store(&r->fd_poll_rc, prc);
    atomic_store(&r->fd_revents, rev);
    atomic_store(&r->err_end, tp_ctx_err(c));
    atomic_store(&r->finished, 1);
    return tp_ctx_err(c);
}

/* Checks the cancel fd is not readable right now. */
static int task_fd_check(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    int fd = tp_ctx_fd(c);
    atomic_store(&r->fd, fd);
    if (fd >= 0) atomic_store(&r->fd_ready_before, poll_in(fd, 0, NULL));
    atomic_store(&r->finished, 1);
    return 0;
}

/* Waits (via tp_ctx_err only) for its cancellation, and only then asks for the
 * cancel fd for the first time: it must already be readable. */
static int task_cancel_then_fd(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    uint64_t end = tp_now_ns() + TPT_WAIT_NS;
    while (tp_ctx_err(c) == 0 && tp_now_ns() < end) {
        tpt_pause(); /* between polls of a bounded loop */
    }
    atomic_store(&r->err_end, tp_ctx_err(c));
    int fd = tp_ctx_fd(c);
    atomic_store(&r->fd, fd);
    if (fd >= 0) {
        int rev = 0;
        atomic_store(&r->fd_poll_rc, poll_in(fd, 0, &rev));
        atomic_store(&r->fd_revents, rev);
    }
    atomic_store(&r->finished, 1);
    return 0;
}

/* Lets its timeout (run timeout or deadline, from opts) pass, then checks the
 * cancel fd stays unreadable for a while. */
static int task_fd_timeout(tp_ctx *c, void *arg) {
    rec *r = arg;
    rec_common(c, r);
    int fd = tp_ctx_fd(c);
    atomic_store(&r->fd, fd);
    int rc = tp_ctx_sleep(c, TPT_S(20));
    atomic_store(&r->rc, rc);
    atomic_store(&r->err_end, tp_ctx_err(c));
    if (fd >= 0) {
        int rev = 0;
        atomic_store(&r->fd_poll_rc, poll_in(fd, 100, &rev));
        atomic_store(&r->fd_revents, rev);
    }
    atomic_store(&r->finished, 1);
    return 0;
}

/* ------------------------------------------------------------ id, user, attempt */

static void test_ctx_id_matches_submitted(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 2, 0);
    enum { N = 32 };
    static rec r[N];
    uint64_t ids[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        ids[i] = 0;
        assert_int_equal(tp_submit(p, task_record, &r[i], NULL, &ids[i]), TP_OK);
        assert_true(ids[i] != 0);
        for (int j = 0; j < i; j++) assert_true(ids[i] != ids[j]);
    }
    for (int i = 0; i < N; i++) {
        TPT_EVENTUALLY(atomic_load(&r[i].finished));
        assert_int_equal(atomic_load(&r[i].id), ids[i]);
        assert_int_equal(atomic_load(&r[i].ran), 1);
    }
    tpt_finish(p);
}

static void test_ctx_user_none(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *a = tpt_fx_new(f, rec);
    rec *b = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    assert_int_equal(tp_submit(p, task_record, a, NULL, NULL), TP_OK);
    assert_int_equal(tp_submit(p, task_record, b, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&a->finished) && atomic_load(&b->finished));
    assert_true(atomic_load(&a->user_null));
    assert_true(atomic_load(&b->user_null));

    /* "" means no user: either NULL or "" is an honest answer. */
    rec *e = tpt_fx_new(f, rec);
    o.user = "";
    assert_int_equal(tp_submit(p, task_record, e, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&e->finished));
    assert_true(atomic_load(&e->user_null) || e->user[0] == '\0');
    tpt_finish(p);
}

static void test_ctx_user_is_copied(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    /* Hold the only worker so the user task runs after we clobber the buffer. */
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    char ubuf[TP_USER_MAX + 1];
    strcpy(ubuf, "alice");
    tp_task_opts o = {0};
    o.user = ubuf;
    rec *r = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_record, r, &o, NULL), TP_OK);
    memset(ubuf, 'Z', sizeof ubuf - 1);
    ubuf[sizeof ubuf - 1] = '\0';
    strcpy(ubuf, "mallory");

    tpt_latch_open(gate);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_false(atomic_load(&r->user_null));
    assert_string_equal(r->user, "alice");
    assert_int_equal(atomic_load(&r->attempt), 0);
    tpt_finish(p);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

static void test_ctx_attempt_zero_first_run(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_retries = 3; /* retries configured, but the task succeeds */
    cfg.retry_delay_ns = TPT_MS(1);
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    rec *r = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_record, r, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->attempt), 0);
    assert_int_equal(atomic_load(&r->ran), 1);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.retried, 0);
}

/* ------------------------------------------------------------ deadline */

static uint64_t run_deadline(tpt_fixture *f, tp_pool *p, const tp_task_opts *o, uint64_t *t_sub,
                             uint64_t *t_start) {
    rec *r = tpt_fx_new(f, rec);
    *t_sub = tp_now_ns();
    assert_int_equal(tp_submit(p, task_record, r, o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    *t_start = atomic_load(&r->t_start);
    return atomic_load(&r->deadline);
}

static void test_ctx_deadline_forever(void **state) {
    tpt_fixture *f = tpt_fx(state);
    uint64_t ts, tst;
    /* Pool without run timeout, task without deadline. */
    tp_pool *p = timeout_pool(f, 1, TP_FOREVER);
    assert_true(run_deadline(f, p, NULL, &ts, &tst) == TP_FOREVER);
    tp_task_opts o = {0};
    assert_true(run_deadline(f, p, &o, &ts, &tst) == TP_FOREVER);
    /* Only a task deadline: that is the effective one. */
    o.deadline_ns = tp_now_ns() + TPT_S(60);
    assert_true(run_deadline(f, p, &o, &ts, &tst) == o.deadline_ns);
    tpt_finish(p);

    /* Pool default run timeout, task says TP_FOREVER, no deadline. */
    p = timeout_pool(f, 1, 0);
    memset(&o, 0, sizeof o);
    o.run_timeout_ns = TP_FOREVER;
    assert_true(run_deadline(f, p, &o, &ts, &tst) == TP_FOREVER);
    tpt_finish(p);
}

/* The run timeout counts from the start of the attempt, also for tasks
 * that start straight after another on the same worker (armed from that
 * one's end): start + run timeout, the same answer every time, and asking
 * late does not move it. */
static int task_deadline_twice(tp_ctx *c, void *arg) {
    rec *r = arg;
    uint64_t t_in = tp_now_ns();
    if (r->sleep_ns) tpt_sleep_ns(r->sleep_ns); /* ask late */
    atomic_store(&r->t_end, tp_now_ns());
    uint64_t d1 = tp_ctx_deadline(c);
    int err = tp_ctx_err(c);
    uint64_t d2 = tp_ctx_deadline(c);
    atomic_store(&r->t_start, t_in);
    atomic_store(&r->deadline, d1);
    atomic_store(&r->rc, d1 == d2 ? 0 : -1);
    atomic_store(&r->err_start, err);
    atomic_store(&r->finished, 1);
    return 0;
}

static void test_ctx_deadline_counts_from_start(void **state) {
    tpt_fixture *f = tpt_fx(state);
    const uint64_t rt = TPT_S(30);
    tp_pool *p = timeout_pool(f, 1, rt);
    enum { N = 64 };
    rec *r[N];
    uint64_t t_sub = tp_now_ns();
    for (int i = 0; i < N; i++) {
        r[i] = tpt_fx_new(f, rec);
        r[i]->sleep_ns = i % 8 == 7 ? TPT_MS(20) : 0;
        assert_int_equal(tp_submit(p, task_deadline_twice, r[i], NULL, NULL), TP_OK);
    }
    for (int i = 0; i < N; i++) {
        TPT_EVENTUALLY(atomic_load(&r[i]->finished));
        uint64_t d = atomic_load(&r[i]->deadline);
        assert_int_equal(atomic_load(&r[i]->rc), 0);        /* stable */
        assert_int_equal(atomic_load(&r[i]->err_start), 0); /* far from it */
        /* counted from the start (at the latest when the task was entered),
         * not from the late question */
        assert_true(d >= t_sub + rt);
        assert_true(d <= atomic_load(&r[i]->t_start) + rt);
    }
    tpt_finish(p);
}

/* The same bounds for many tasks: as a saturated pool starts them straight
 * after one another (a worker that comes from the end of another attempt),
 * and one at a time, each submitted as soon as the last has started (a task
 * admitted a moment before its start): never before the submit, never after
 * the task is entered. Each submit's time is read just before the call that
 * accepted it. (A start derived from the last attempt's end and a TSC
 * anchor, tried once, failed this test without its admission check.) */
typedef struct start_rec {
    uint64_t t_sub;
    atomic_ullong t_in, d;
} start_rec;

static atomic_long start_ran;

static int task_start_bounds(tp_ctx *c, void *arg) {
    start_rec *r = arg;
    atomic_store(&r->t_in, tp_now_ns());
    atomic_store(&r->d, tp_ctx_deadline(c));
    atomic_fetch_add(&start_ran, 1);
    return 0;
}

static void test_ctx_run_timeout_start_bounds(void **state) {
    tpt_fixture *f = tpt_fx(state);
    const uint64_t rt = TPT_S(30);
    tp_config cfg = tpt_quiet_config(2, 64, 0);
    cfg.run_timeout_ns = rt;
    tp_pool *p = tpt_fx_pool(f, &cfg);
    const long n = TPT_SANITIZED || tpt_slowdown() > 1 ? 4000 : 40000;
    start_rec *r = tpt_fx_array(f, start_rec, n);
    atomic_store(&start_ran, 0);
    for (long i = 0; i < n; i++) {
        if (i % 1000 >= 500) { /* one at a time: wait (busy) for the last to start */
            uint64_t until = tp_now_ns() + TPT_WAIT_NS;
            while (atomic_load(&start_ran) < i && tp_now_ns() < until)
                sched_yield(); /* memcheck runs one thread at a time */
            assert_int_equal(atomic_load(&start_ran), i);
        }
        int rc;
        uint64_t until = tp_now_ns() + TPT_WAIT_NS;
        do {
            r[i].t_sub = tp_now_ns();
            rc = tp_submit(p, task_start_bounds, &r[i], NULL, NULL);
            if (rc == TP_EFULL) sched_yield();
        } while (rc == TP_EFULL && tp_now_ns() < until);
        assert_int_equal(rc, TP_OK);
    }
    tpt_finish(p);
    for (long i = 0; i < n; i++) {
        uint64_t d = atomic_load(&r[i].d);
        if (d < r[i].t_sub + rt || d > atomic_load(&r[i].t_in) + rt)
            fail_msg("task %ld: start %lld ns after its submit, %lld ns before it was entered", i,
                     (long long)(d - rt - r[i].t_sub), (long long)(atomic_load(&r[i].t_in) + rt - d));
    }
}

static void test_ctx_deadline_earlier_of_two(void **state) {
    tpt_fixture *f = tpt_fx(state);
    uint64_t ts, tst, d;
    tp_pool *p = timeout_pool(f, 1, 0); /* default run timeout: 10 min */
    const uint64_t ten_min = TPT_S(600);

    /* Pool default run timeout only: start + 10 min. */
    d = run_deadline(f, p, NULL, &ts, &tst);
    assert_true(d >= ts + ten_min);
    assert_true(d <= tst + ten_min);

    /* Task run timeout 5 s beats a deadline 60 s away. */
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_S(5);
    o.deadline_ns = tp_now_ns() + TPT_S(60);
    d = run_deadline(f, p, &o, &ts, &tst);
    assert_true(d >= ts + TPT_S(5));
    assert_true(d <= tst + TPT_S(5));

    /* A deadline 5 s away beats a 60 s run timeout: exactly the deadline. */
    o.run_timeout_ns = TPT_S(60);
    o.deadline_ns = tp_now_ns() + TPT_S(5);
    d = run_deadline(f, p, &o, &ts, &tst);
    assert_true(d == o.deadline_ns);

    /* Task deadline with the pool's 10 min run timeout. */
    o.run_timeout_ns = 0;
    o.deadline_ns = tp_now_ns() + TPT_S(7);
    d = run_deadline(f, p, &o, &ts, &tst);
    assert_true(d == o.deadline_ns);
    tpt_finish(p);

    /* Pool run timeout (not the default) applies when the task says 0. */
    p = timeout_pool(f, 1, TPT_S(3));
    d = run_deadline(f, p, NULL, &ts, &tst);
    assert_true(d >= ts + TPT_S(3));
    assert_true(d <= tst + TPT_S(3));
    tpt_finish(p);
}

/* ------------------------------------------------------------ sleep, err */

static void test_ctx_sleep_full_time(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *r = tpt_fx_new(f, rec);
    r->sleep_ns = TPT_MS(30);
    assert_int_equal(tp_submit(p, task_sleep, r, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->rc), 0);
    assert_int_equal(atomic_load(&r->err_start), 0);
    assert_int_equal(atomic_load(&r->err_end), 0);
    assert_true(atomic_load(&r->t_end) - atomic_load(&r->t_start) >= TPT_MS(30));

    rec *z = tpt_fx_new(f, rec);
    z->sleep_ns = 0;
    assert_int_equal(tp_submit(p, task_sleep, z, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&z->finished));
    assert_int_equal(atomic_load(&z->rc), 0);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.succeeded, 2);
}

static void test_ctx_sleep_cancelled(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *r = tpt_fx_new(f, rec);
    r->sleep_ns = TPT_S(20);
    tp_task_opts o = {0};
    o.on_done = rec_done;
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_sleep, r, &o, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->started));
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->rc), TP_ECANCELED);
    assert_int_equal(atomic_load(&r->err_end), TP_ECANCELED);
    assert_true(atomic_load(&r->t_end) - atomic_load(&r->t_start) < TPT_S(10));
    /* Already cancelled: a new sleep returns at once. */
    assert_int_equal(atomic_load(&r->rc2), TP_ECANCELED);
    assert_true(atomic_load(&r->t_end2) - atomic_load(&r->t_end) < TPT_S(10));
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->done_status), TP_ECANCELED);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    tpt_assert_counts(s, TPT_EQ(started, 1), TPT_EQ(failed, 1), TPT_EQ(cancelled, 1), TPT_EQ(expired, 0));
}

/* A task that sleeps until its run timeout (`run_timeout`, from its start)
 * or its deadline (run_timeout 0: o->deadline_ns). false: it expired before
 * it started (a deadline only; a stalled machine), nothing else asserted. */
static bool sleep_until_timeout(tpt_fixture *f, tp_pool *p, const tp_task_opts *o, uint64_t run_timeout) {
    rec *r = tpt_fx_new(f, rec);
    r->sleep_ns = TPT_S(20);
    tp_task_opts oo = {0};
    if (o) oo = *o;
    oo.on_done = rec_done;
    uint64_t t_sub = tp_now_ns();
    assert_int_equal(tp_submit(p, task_sleep, r, &oo, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    if (!run_timeout && !atomic_load(&r->ran)) return false;
    assert_true(atomic_load(&r->finished));
    if (run_timeout)
        assert_true(atomic_load(&r->deadline) >= t_sub + run_timeout);
    else
        assert_int_equal(atomic_load(&r->deadline), o->deadline_ns);
    assert_err_start_clear(r);
    assert_int_equal(atomic_load(&r->rc), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->err_end), TP_ETIMEDOUT);
    /* It returned because the effective deadline passed, not before. */
    assert_true(atomic_load(&r->t_end) >= atomic_load(&r->deadline));
    assert_true(atomic_load(&r->t_end) - atomic_load(&r->t_start) < TPT_S(10));
    assert_int_equal(atomic_load(&r->rc2), TP_ETIMEDOUT);
    assert_true(atomic_load(&r->t_end2) - atomic_load(&r->t_end) < TPT_S(10));
    return true;
}

static void test_ctx_sleep_run_timeout(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_MS(50);
    assert_true(sleep_until_timeout(f, p, &o, TPT_MS(50)));
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.cancelled, 1); /* returned TP_ETIMEDOUT */
    assert_int_equal(s.expired, 0);

    /* The pool's run timeout works the same. */
    p = timeout_pool(f, 1, TPT_MS(50));
    assert_true(sleep_until_timeout(f, p, NULL, TPT_MS(50)));
    tpt_finish(p);
}

/* The task must start before its deadline `span` away: under
 * tpt_with_time_to_spare. */
static bool sleep_to_deadline(tpt_fixture *f, uint64_t span, void *arg) {
    (void)arg;
    tp_pool *p = timeout_pool(f, 1, TP_FOREVER);
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + span;
    bool ran = sleep_until_timeout(f, p, &o, 0);
    tpt_finish(p);
    return ran;
}

static void test_ctx_sleep_deadline(void **state) {
    tpt_with_time_to_spare(tpt_fx(state), TPT_MS(300), sleep_to_deadline, NULL);
}

/* Deadline passed while running: the task must start before its deadline
 * `span` away (under tpt_with_time_to_spare). */
static bool deadline_while_polling(tpt_fixture *f, uint64_t span, void *arg) {
    (void)arg;
    tp_pool *p = timeout_pool(f, 2, 0);
    rec *d = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.on_done = rec_done;
    o.deadline_ns = tp_now_ns() + span;
    assert_int_equal(tp_submit(p, task_poll_err, d, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&d->done_calls) == 1);
    bool ran = atomic_load(&d->ran) == 1;
    if (ran) {
        assert_true(atomic_load(&d->finished));
        assert_int_equal(atomic_load(&d->err_end), TP_ETIMEDOUT);
        assert_true(atomic_load(&d->t_end) >= o.deadline_ns);
    }
    tpt_finish(p);
    return ran;
}

static void test_ctx_err_states(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 2, 0);

    /* Cancelled while running. */
    rec *c = tpt_fx_new(f, rec);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_poll_err, c, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&c->started));
    assert_int_equal(atomic_load(&c->err_start), 0);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&c->finished));
    assert_int_equal(atomic_load(&c->err_end), TP_ECANCELED);

    /* Run timeout passed. */
    rec *t = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_MS(30);
    uint64_t t_sub = tp_now_ns();
    assert_int_equal(tp_submit(p, task_poll_err, t, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&t->finished));
    assert_true(atomic_load(&t->deadline) >= t_sub + TPT_MS(30));
    assert_err_start_clear(t);
    assert_int_equal(atomic_load(&t->err_end), TP_ETIMEDOUT);
    assert_true(atomic_load(&t->t_end) >= atomic_load(&t->deadline));

    tpt_finish(p);
    tpt_with_time_to_spare(f, TPT_MS(300), deadline_while_polling, NULL);
}

static void test_ctx_err_cancel_takes_precedence(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_MS(30);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_timeout_then_cancel, r, &o, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->phase) == 1);
    assert_int_equal(atomic_load(&r->rc), TP_ETIMEDOUT);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->err_end), TP_ECANCELED);
    tpt_finish(p);
}

/* ------------------------------------------------------------ cancel fd */

static void test_ctx_fd_cancel_then_clean(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0); /* one worker: the next task reuses it */
    rec *r = tpt_fx_new(f, rec);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_fd_wait, r, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->phase) == 1 || atomic_load(&r->finished));
    assert_true(atomic_load(&r->fd) >= 0);
    assert_int_equal(atomic_load(&r->fd_ready_before), 0);
    assert_int_equal(atomic_load(&r->rc2), 0); /* the 20 ms poll timed out */
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->fd_poll_rc), 1);
    assert_true(atomic_load(&r->fd_revents) & POLLIN);
    assert_int_equal(atomic_load(&r->err_end), TP_ECANCELED);
    assert_true(atomic_load(&r->t_end) - atomic_load(&r->t_start) < TPT_S(10));

    /* Same worker, next task: the descriptor is clean again. */
    for (int i = 0; i < 3; i++) {
        rec *n = tpt_fx_new(f, rec);
        assert_int_equal(tp_submit(p, task_fd_check, n, NULL, NULL), TP_OK);
        TPT_EVENTUALLY(atomic_load(&n->finished));
        assert_true(atomic_load(&n->fd) >= 0);
        assert_int_equal(atomic_load(&n->fd_ready_before), 0);
    }

    /* And it works again for a second cancellation on that worker. */
    rec *r2 = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_fd_wait, r2, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r2->phase) == 1 || atomic_load(&r2->finished));
    assert_int_equal(atomic_load(&r2->fd_ready_before), 0);
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r2->finished));
    assert_int_equal(atomic_load(&r2->fd_poll_rc), 1);
    assert_true(atomic_load(&r2->fd_revents) & POLLIN);
    tpt_finish(p);
}

static void test_ctx_fd_forced_shutdown(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.on_done = rec_done;
    assert_int_equal(tp_submit(p, task_fd_wait, r, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->phase) == 1 || atomic_load(&r->finished));
    assert_true(atomic_load(&r->fd) >= 0);
    assert_int_equal(atomic_load(&r->fd_ready_before), 0);
    assert_int_equal(tp_shutdown(p, TPT_MS(50)), TP_ETIMEDOUT);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->fd_poll_rc), 1);
    assert_true(atomic_load(&r->fd_revents) & POLLIN);
    assert_int_equal(atomic_load(&r->err_end), TP_ECANCELED);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->done_status), TP_ECANCELED);
    tpt_finish_forced(p);
}

/* false: the task expired before it started (a deadline only; a stalled
 * machine), nothing else asserted. */
static bool fd_not_readable_on_timeout(tpt_fixture *f, tp_pool *p, const tp_task_opts *o) {
    rec *r = tpt_fx_new(f, rec);
    tp_task_opts oo = *o;
    oo.on_done = rec_done;
    assert_int_equal(tp_submit(p, task_fd_timeout, r, &oo, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    if (o->deadline_ns && !atomic_load(&r->ran)) return false;
    assert_true(atomic_load(&r->finished));
    assert_true(atomic_load(&r->fd) >= 0);
    assert_int_equal(atomic_load(&r->rc), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->err_end), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->fd_poll_rc), 0); /* 100 ms, nothing */
    assert_int_equal(atomic_load(&r->fd_revents) & POLLIN, 0);

    rec *n = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_fd_check, n, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&n->finished));
    assert_int_equal(atomic_load(&n->fd_ready_before), 0);
    return true;
}

/* The deadline case needs the task started before its deadline `span`
 * away: under tpt_with_time_to_spare. */
static bool fd_deadline(tpt_fixture *f, uint64_t span, void *arg) {
    (void)arg;
    tp_pool *p = timeout_pool(f, 1, 0);
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + span;
    bool ran = fd_not_readable_on_timeout(f, p, &o);
    tpt_finish(p);
    return ran;
}

static void test_ctx_fd_not_readable_on_timeout(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tp_task_opts o = {0};
    o.run_timeout_ns = TPT_MS(30);
    assert_true(fd_not_readable_on_timeout(f, p, &o));
    tpt_finish(p);
    tpt_with_time_to_spare(f, TPT_MS(300), fd_deadline, NULL);
}

static void test_ctx_fd_cancelled_before_first_use(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0); /* fresh worker: no descriptor made yet */
    rec *r = tpt_fx_new(f, rec);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_cancel_then_fd, r, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->started));
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->finished));
    assert_int_equal(atomic_load(&r->err_end), TP_ECANCELED);
    assert_true(atomic_load(&r->fd) >= 0);
    assert_int_equal(atomic_load(&r->fd_poll_rc), 1);
    assert_true(atomic_load(&r->fd_revents) & POLLIN);

    /* And the next task on that worker starts clean. */
    rec *n = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_fd_check, n, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&n->finished));
    assert_int_equal(atomic_load(&n->fd_ready_before), 0);
    tpt_finish(p);
}

static void test_ctx_fd_clean_after_unobserved_cancel(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    /* The worker's descriptor exists... */
    rec *a = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_fd_check, a, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&a->finished));
    assert_int_equal(atomic_load(&a->fd_ready_before), 0);
    /* ...a task that never looks at it is cancelled... */
    rec *b = tpt_fx_new(f, rec);
    uint64_t id = 0;
    assert_int_equal(tp_submit(p, task_poll_err, b, NULL, &id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&b->started));
    assert_int_equal(tp_cancel(p, id), TP_OK);
    TPT_EVENTUALLY(atomic_load(&b->finished));
    assert_int_equal(atomic_load(&b->err_end), TP_ECANCELED);
    /* ...and the next task still finds it clean. */
    rec *c = tpt_fx_new(f, rec);
    assert_int_equal(tp_submit(p, task_fd_check, c, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&c->finished));
    assert_int_equal(atomic_load(&c->fd_ready_before), 0);
    tpt_finish(p);
}

/* ------------------------------------------------------------ queue time */

static void test_ctx_run_timeout_excludes_queue_time(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    const uint64_t T = TPT_MS(250);
    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.run_timeout_ns = T;
    o.on_done = rec_done;
    uint64_t t_sub = tp_now_ns();
    assert_int_equal(tp_submit(p, task_record, r, &o, NULL), TP_OK);
    /* Precondition, not synchronisation: queued for longer than T. */
    tpt_sleep_until(t_sub + 2 * T);
    assert_int_equal(atomic_load(&r->ran), 0);
    assert_int_equal(tpt_stats(p).queued, 1);
    uint64_t t_open = tp_now_ns();
    tpt_latch_open(gate);

    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->ran), 1);
    assert_int_equal(atomic_load(&r->done_status), 0);
    /* The attempt started after the release: its deadline is start + T. */
    assert_true(atomic_load(&r->deadline) >= t_open + T);
    assert_true(atomic_load(&r->deadline) <= atomic_load(&r->t_start) + T);
    assert_err_start_clear(r);
    tp_stats s = tpt_finish(p);
    assert_int_equal(s.expired, 0);
    assert_int_equal(s.succeeded, 2);
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

static void test_ctx_deadline_includes_queue_time(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);
    TPT_EVENTUALLY(tpt_stats(p).started == 1);

    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.deadline_ns = tp_now_ns() + TPT_MS(50);
    o.on_done = rec_done;
    assert_int_equal(tp_submit(p, task_record, r, &o, NULL), TP_OK);
    tpt_sleep_until(o.deadline_ns + TPT_MS(1));
    tpt_latch_open(gate);

    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->done_status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->ran), 0);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    tpt_assert_counts(s, TPT_EQ(accepted, 2), TPT_EQ(started, 1), /* only the blocker */
                      TPT_EQ(succeeded, 1), TPT_EQ(failed, 1), TPT_EQ(cancelled, 1), TPT_EQ(expired, 1),
                      TPT_EQ(retried, 0));
    assert_int_equal(atomic_load(&gate->timeouts), 0);
}

static void test_ctx_deadline_already_passed_accepted(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.deadline_ns = 1; /* long gone */
    o.on_done = rec_done;
    assert_int_equal(tp_submit(p, task_record, r, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);
    assert_int_equal(atomic_load(&r->done_status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->ran), 0);
    tp_stats s = tpt_finish(p);
    tpt_assert_counts(s, TPT_EQ(started, 0), TPT_EQ(expired, 1), TPT_EQ(cancelled, 1), TPT_EQ(failed, 1));
}

/* A queued task whose deadline passes ends at its deadline even while every
 * worker is busy: on_done promptly with TP_ETIMEDOUT, counted expired, its
 * queue place and user slot freed -- without waiting for a worker. */
static void test_ctx_expiry_prompt_while_workers_busy(void **state) {
    tpt_fixture *f = tpt_fx(state);
    tp_pool *p = timeout_pool(f, 1, 0);
    tpt_latch *gate = tpt_fx_latch(f);
    assert_int_equal(tp_submit(p, tpt_block_task, gate, NULL, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&gate->waiting) == 1);

    rec *r = tpt_fx_new(f, rec);
    tp_task_opts o = {0};
    o.user = "u";
    o.deadline_ns = tp_now_ns() + TPT_MS(30);
    o.on_done = rec_done;
    assert_int_equal(tp_submit(p, task_record, r, &o, NULL), TP_OK);
    int active = (int)tp_user_active(p, "u");
    if (tp_now_ns() < o.deadline_ns) assert_int_equal(active, 1); /* read before it could expire */
    TPT_EVENTUALLY(atomic_load(&r->done_calls) == 1);             /* the worker is still blocked */
    assert_int_equal(atomic_load(&gate->waiting), 1);
    assert_int_equal(atomic_load(&r->done_status), TP_ETIMEDOUT);
    assert_int_equal(atomic_load(&r->ran), 0);
    assert_int_equal(tp_user_active(p, "u"), 0);
    tp_stats live = tpt_stats(p);
    tpt_assert_counts(live, TPT_EQ(queued, 0), TPT_EQ(expired, 1), TPT_EQ(users, 0));

    tpt_latch_open(gate);
    tp_stats s = tpt_finish(p);
    assert_int_equal(atomic_load(&r->done_calls), 1);
    tpt_assert_counts(s, TPT_EQ(started, 1), /* only the blocker */
                      TPT_EQ(expired, 1), TPT_EQ(cancelled, 1));
}

/* ------------------------------------------------------------ clock */

static void test_now_ns_monotonic(void **state) {
    (void)state;
    uint64_t prev = tp_now_ns();
    assert_true(prev > 0);
    for (int i = 0; i < 10000; i++) {
        uint64_t t = tp_now_ns();
        assert_true(t >= prev);
        prev = t;
    }
    /* It is CLOCK_MONOTONIC, in nanoseconds. */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t n = tp_now_ns();
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t na = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec;
    uint64_t nb = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
    assert_true(na <= n);
    assert_true(n <= nb);
    /* It advances as CLOCK_MONOTONIC does: once the reference clock, read
     * after t0, shows 2 ms gone (polled for 2 ms), so does tp_now_ns. */
    uint64_t t0 = tp_now_ns();
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t r0 = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec, r = r0;
    while (r - r0 < TPT_MS(2)) {
        clock_gettime(CLOCK_MONOTONIC, &b);
        r = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
    }
    assert_true(tp_now_ns() - t0 >= TPT_MS(2));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_ctx_id_matches_submitted),
        TPT_TEST(test_ctx_user_none),
        TPT_TEST(test_ctx_user_is_copied),
        TPT_TEST(test_ctx_attempt_zero_first_run),
        TPT_TEST(test_ctx_deadline_forever),
        TPT_TEST(test_ctx_run_timeout_start_bounds),
        TPT_TEST(test_ctx_deadline_earlier_of_two),
        TPT_TEST(test_ctx_deadline_counts_from_start),
        TPT_TEST(test_ctx_sleep_full_time),
        TPT_TEST(test_ctx_sleep_cancelled),
        TPT_TEST(test_ctx_sleep_run_timeout),
        TPT_TEST(test_ctx_sleep_deadline),
        TPT_TEST(test_ctx_err_states),
        TPT_TEST(test_ctx_err_cancel_takes_precedence),
        TPT_TEST(test_ctx_fd_cancel_then_clean),
        TPT_TEST(test_ctx_fd_forced_shutdown),
        TPT_TEST(test_ctx_fd_not_readable_on_timeout),
        TPT_TEST(test_ctx_fd_cancelled_before_first_use),
        TPT_TEST(test_ctx_fd_clean_after_unobserved_cancel),
        TPT_TEST(test_ctx_run_timeout_excludes_queue_time),
        TPT_TEST(test_ctx_deadline_includes_queue_time),
        TPT_TEST(test_ctx_deadline_already_passed_accepted),
        TPT_TEST(test_ctx_expiry_prompt_while_workers_busy),
        TPT_TEST(test_now_ns_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
