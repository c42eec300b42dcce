/*
 * fuzz_pool.c -- model-based fuzzing of libtaskpool.
 *
 * Each input is a short program (at most FZ_MAX_OPS operations) on two pool
 * slots: create with a varied config (1.2: FIFO or fair, prio_starve_limit,
 * low_prio_max_running, retry backoff), submit / submit_wait (priorities,
 * users, deadlines, run timeouts, retries, the default pool, completion
 * queues), cancel, open a gate, settle, close, shutdown, wait, read
 * statistics and lane figures, user weights, destroy, invalid calls, the
 * caller's log id, task groups (two per slot: create with or without cancel
 * on error, submit into one, wait with a timeout, cancel, destroy; groups
 * outliving their pool), and two completion queues shared by the slots
 * (create, drain with a max, drain from inside an on_done, tp_cq_wait, poll
 * the descriptor, destroy; a second thread draining too).
 * Tasks succeed, fail, fail a few times then succeed, sleep, block on a
 * harness gate (ignoring cancellation, or cooperating through tp_ctx_sleep or
 * tp_ctx_fd), or call the pool on themselves (EDEADLK, self-cancel).
 *
 * Every return code is checked against a model of SPEC.md that is exact where
 * the contract is deterministic and tolerant where timing decides:
 *   - A task inside its gate whose gate is closed (and that cannot leave by
 *     cancellation or timeout) is *stuck*: certainly running, holding its
 *     worker and its user slot. When every worker of a pool is stuck, every
 *     other unfinished task without a near deadline is *parked*: certainly
 *     queued or waiting for a retry. Those two states give lower bounds of the
 *     queue occupancy and of each user's slots; tasks not known to have ended
 *     give the upper bounds. tp_submit must then answer exactly EUSERLIMIT or
 *     EFULL at the lower bound, and exactly TP_OK below the upper one.
 *   - Cancel of a stuck or parked task is TP_OK; of an ended one TP_ENOTFOUND;
 *     a parked one's on_done must then run promptly (every worker is busy) with
 *     TP_ECANCELED, and it never runs again.
 *   - Shutdown, wait and submit_wait are exact when something is stuck
 *     (TP_ETIMEDOUT, not before the budget) or when nothing can block
 *     (TP_OK with a long budget), tolerant otherwise.
 *   - Admission counters (submitted, accepted, each rejected_*) are exact at
 *     every read: only the harness thread submits.
 *   - Groups: a submit into a cancelled group is exactly TP_ECANCELED and
 *     counts nothing; a wait that does not time out returns only after every
 *     member's on_done has returned, with TP_OK exactly when every member
 *     succeeded, else a status some member ended with, the same at every later
 *     wait; a wait that cannot finish (a member stuck, or parked behind stuck
 *     workers) times out, not before its timeout; after tp_group_cancel a
 *     parked member ends promptly with TP_ECANCELED without running; a member
 *     of a cancelled or cancel-on-error group may end cancelled (the model's
 *     tolerance); waiting or destroying from a member is TP_EDEADLK; a group
 *     whose pool was destroyed answers TP_ECLOSED, its result, and frees.
 *   - The exact model (section "exact order model"): in pools made for it,
 *     the harness holds the scheduler's whole state in a reference scheduler
 *     (fz_sched.c, taskpool.h section 14 as written) and predicts every
 *     start -- priorities, starvation counts, low_prio_max_running, FIFO or
 *     fair order with weights, where retries, cancels and expiry leave the
 *     others -- and the pool's start tickets must match; admission, cancel
 *     and lane figures are then exact too. It gives up where timing decides
 *     and takes over again when every task has ended or is stuck.
 *   - Completion queues (section "completion queues"): places, TP_EFULL and
 *     TP_EBUSY exact; every bound task's on_done exactly once, inside a
 *     tp_cq_drain of its queue on the draining thread, with a status its
 *     history allows (TP_ECANCELED when a forced shutdown dropped it); a
 *     drain's count, tp_cq_wait and the descriptor within what the model
 *     knows waits; completions in the order their tasks ended where the model
 *     knows that order; pools destroyed before their completions are drained.
 *   - Retry backoff: attempt k starts no earlier than the end of attempt
 *     k - 1 plus min(retry_delay x 2^(k-1), retry_delay_max).
 *   - Batches (OP_BATCH): tp_submit_batch of 2..8 tasks cut where the model
 *     says (exactly, in pools of the exact model), including queues of 40..64
 *     places (OP_CREATE3) that batches fill.
 *   - Several submitters (OP_BURST, section "submit burst"): 2..4 threads
 *     submit, batch and submit_wait at once into a pool of their own with a
 *     per-user limit; every answer is one the header allows, no user ever has
 *     more tasks running than its limit, and at rest every accepted task ended
 *     exactly once and every counter is the sum of what the threads saw.
 * At the end of every input all gates open, every pool is shut down, waited
 * for and checked at rest: the SPEC invariants, each counter against what the
 * tasks observed (started, retried, succeeded, failed, cancelled, expired),
 * each lane's starts (and its queue-wait histogram) against its tasks'
 * attempts, on_done exactly once per accepted task with a status the task's
 * history allows, never for a refused one, worker hooks paired, one log line
 * per failed attempt; then every queue is drained and destroyed. Every wait
 * in the harness is bounded; a violation prints the operations of the input
 * and aborts (libFuzzer keeps the input as a crash).
 *
 * Built two ways:
 *   - with -fsanitize=fuzzer: libFuzzer calls LLVMFuzzerTestOneInput;
 *   - with -DTP_FUZZ_REPLAY: main() runs the inputs of the files and
 *     directories named on the command line (CTest replays the corpus so in the
 *     plain, TSan and ASan builds).
 * Either way the process prints, at exit, how many operations and inputs ran
 * without a violation.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "taskpool.h"

#include "fz_sched.h"

#define FZ_SLOTS     2
#define FZ_GATES     4
#define FZ_MAX_OPS   64
#define FZ_MAX_TASKS (3 * FZ_MAX_OPS) /* batches of 2..8 leave FZ_MAX_OPS free (op_batch) */
#define FZ_USERS     5
#define FZ_GROUPS    2 /* per pool slot */
#define FZ_CQS       2 /* completion queues, shared by both pool slots */
#define FZ_ATTEMPTS  4 /* max_retries is at most 3 in a valid config */
#define FZ_MAX_TICKS (FZ_MAX_TASKS * FZ_ATTEMPTS)
#define FZ_BATCH_MAX 8 /* tasks of one tp_submit_batch (op_batch) */

#define MS          1000000ull
#define SEC         1000000000ull
#define FZ_LONG_NS  (5 * SEC)   /* a budget that must suffice when nothing blocks */
#define FZ_BOUND_NS (20 * SEC)  /* any wait for something that must happen */
#define FZ_GATE_NS  (40 * SEC)  /* a gate task's wait: longer, so the harness's own check reports first */
#define FZ_FAR_NS   (120 * SEC) /* a deadline/run timeout no input ever reaches */

/* ------------------------------------------------------------ bookkeeping */

static atomic_ullong fz_ops_total;        /* operations executed */
static atomic_ullong fz_inputs_total;     /* inputs completed */
static atomic_ullong fz_checked;          /* return codes checked against the model */
static atomic_ullong fz_exact;            /* ... of which the model allowed exactly one */
static atomic_ullong fz_exact_rc[12];     /* ... by that code (index -rc) */
static atomic_ullong fz_starts_predicted; /* starts the exact model predicted and saw happen as predicted */
static atomic_ullong fz_drained;          /* completions run by tp_cq_drain */
static atomic_ullong fz_burst_checked;    /* answers of OP_BURST's threads checked (not in fz_checked) */
static pthread_t fz_main_thread;

static pthread_mutex_t fz_trace_mu = PTHREAD_MUTEX_INITIALIZER;
static char fz_trace[4 * FZ_MAX_OPS + 32][120];
static int fz_ntrace;

static void trace(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void trace(const char *fmt, ...) {
    pthread_mutex_lock(&fz_trace_mu);
    if (fz_ntrace < (int)(sizeof fz_trace / sizeof fz_trace[0])) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fz_trace[fz_ntrace++], sizeof fz_trace[0], fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&fz_trace_mu);
}

/* A broken promise: say which, list the input's operations, abort. */
static void violation(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;
static void violation(const char *fmt, ...) {
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&once); /* one report, even if several threads see one */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\nfuzz_pool: VIOLATION: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nfuzz_pool: operations of this input so far:\n");
    pthread_mutex_lock(&fz_trace_mu);
    for (int i = 0; i < fz_ntrace; i++) fprintf(stderr, "  %2d %s\n", i, fz_trace[i]);
    pthread_mutex_unlock(&fz_trace_mu);
    fflush(stderr);
    abort();
}

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) violation(__VA_ARGS__);                                                                 \
    } while (0)

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return b >= TP_FOREVER - a ? TP_FOREVER : a + b; }
static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Return codes as bits: TP_OK is bit 0, TP_EINVAL bit 1, ... */
static unsigned bit(int rc) { return rc <= 0 && rc >= TP_EBUSY ? 1u << (unsigned)-rc : 1u << 31; }
#define B_OK bit(TP_OK)

static const char *rcname(int rc) { return tp_err_name(rc); }

static void expect_rc(int rc, unsigned allowed, const char *what) {
    atomic_fetch_add(&fz_checked, 1);
    if ((allowed & (allowed - 1)) == 0) {
        atomic_fetch_add(&fz_exact, 1);
        atomic_fetch_add(&fz_exact_rc[__builtin_ctz(allowed) % 12], 1);
    }
    if (!(bit(rc) & allowed)) {
        char buf[200] = "";
        size_t n = 0;
        for (int c = 0; c >= TP_EBUSY; c--)
            if (allowed & bit(c)) n += (size_t)snprintf(buf + n, sizeof buf - n, " %s", rcname(c));
        violation("%s returned %s (%d); the model allows:%s", what, rcname(rc), rc, buf);
    }
}

/* ------------------------------------------------------------ gates */

/* One-shot gates shared by all pools of an input; reset between inputs. A
 * gate is a flag + condvar (for tasks that ignore cancellation) and a pipe
 * that turns readable when it opens (for tasks that poll()). */
typedef struct fz_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int open;
    int fds[2];
} fz_gate;

static fz_gate fz_gates[FZ_GATES];

static void gates_init(void) {
    for (int g = 0; g < FZ_GATES; g++) {
        fz_gate *G = &fz_gates[g];
        pthread_condattr_t a;
        pthread_condattr_init(&a);
        pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
        pthread_mutex_init(&G->mu, NULL);
        pthread_cond_init(&G->cv, &a);
        pthread_condattr_destroy(&a);
        atomic_init(&G->open, 0);
        if (pipe2(G->fds, O_NONBLOCK | O_CLOEXEC) != 0) {
            perror("fuzz_pool: pipe2");
            exit(2);
        }
    }
}

static bool gate_is_open(int g) { return atomic_load(&fz_gates[g].open) != 0; }

static void gate_open(int g) {
    fz_gate *G = &fz_gates[g];
    pthread_mutex_lock(&G->mu);
    if (!atomic_load(&G->open)) {
        atomic_store(&G->open, 1);
        char b = 1;
        if (write(G->fds[1], &b, 1) != 1) violation("gate pipe write failed");
    }
    pthread_cond_broadcast(&G->cv);
    pthread_mutex_unlock(&G->mu);
}

/* Between inputs only: no thread of any pool exists then. */
static void gates_reset(void) {
    for (int g = 0; g < FZ_GATES; g++) {
        char buf[16];
        while (read(fz_gates[g].fds[0], buf, sizeof buf) > 0) {
        }
        atomic_store(&fz_gates[g].open, 0);
    }
}

/* Wait for the gate, ignoring cancellation. Bounded: a gate the harness never
 * opens is a harness bug, reported as such. */
static void gate_wait(int g) {
    fz_gate *G = &fz_gates[g];
    uint64_t end = tp_now_ns() + FZ_GATE_NS;
    struct timespec ts = {(time_t)(end / SEC), (long)(end % SEC)};
    pthread_mutex_lock(&G->mu);
    while (!atomic_load(&G->open)) {
        if (pthread_cond_timedwait(&G->cv, &G->mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&G->mu);
            violation("harness: gate %d never opened", g);
        }
    }
    pthread_mutex_unlock(&G->mu);
}

/* ------------------------------------------------------------ model state */

enum {
    K_SUCCEED,     /* returns 0 */
    K_FAIL,        /* returns `result` (non-zero) on every attempt */
    K_FLAKY,       /* fails `fail_k` attempts, then returns 0 */
    K_GATE_IGNORE, /* waits for its gate, deaf to cancellation, returns `result` */
    K_GATE_SLEEP,  /* waits for its gate in tp_ctx_sleep slices: leaves on ctx error */
    K_GATE_FD,     /* poll()s its gate and tp_ctx_fd: leaves on ctx error */
    K_SLEEP,       /* tp_ctx_sleep(sleep_ns), returns its result */
    K_SELF,        /* EDEADLK calls on its own pool, cancels itself, returns `result` */
    K_COUNT
};
static const char *const kind_name[K_COUNT] = {"succeed",    "fail",    "flaky", "gate-ignore",
                                               "gate-sleep", "gate-fd", "sleep", "self"};

enum { DL_NONE, DL_PAST, DL_NEAR, DL_FAR };

/* Statuses a task's history allows for its on_done. */
typedef struct fz_allowed {
    int n;
    int v[4];
} fz_allowed;
static const char *const fz_users[FZ_USERS] = {NULL, "", "u0", "u1", "u2"};

struct fz_pool;
struct fz_group;

/* The exact model's view of a task (see "exact order model" below): ended;
 * waiting; running, blocked on its closed gate; leaving its gate (its
 * attempt ends now); waiting for a retry; expiring unrun. */
enum { X_END, X_WAIT, X_STUCK, X_LEAVING, X_RETRY, X_GHOST };

typedef struct fz_task {
    /* Written by the harness before the submit; read-only afterwards (the
     * submit's lock orders these writes before any pool thread reads them). */
    struct fz_pool *fp;
    tp_pool *pool;
    struct fz_group *grp; /* NULL, or the group it was submitted into */
    tp_group *group;      /* grp's handle, for the task itself */
    int index, kind, gate, result, fail_k, user, dl_class;
    int prio;                                 /* TP_PRIO_MIN..TP_PRIO_MAX */
    int cqi;                                  /* the completion queue it is bound to, -1 for none */
    int cq_gen;                               /* which queue in slot cqi (slots are reused): fz_cq.gen */
    bool nest;                                /* bound: its on_done drains its queue once more (max 1) */
    bool plain;                               /* submitted with no options and no id (VIA_PLAIN) */
    int pool_gen;                             /* which pool (slots are reused): fz_pool.gen */
    uint64_t sleep_ns, deadline, run_timeout; /* run_timeout: resolved */
    uint64_t submit_ns;
    unsigned max_retries;
    uint64_t delay[FZ_ATTEMPTS]; /* delay[k]: the wait before retry k (taskpool.h: backoff) */
    bool has_done;
    char expect_log[TP_LOG_ID_MAX + 1]; /* "" -> a generated one ("tp-...") */
    char opt_log[24];
    /* Written by pool threads. */
    _Atomic uint64_t ctx_id;
    atomic_int runs;    /* attempts entered */
    atomic_int returns; /* attempts returned */
    atomic_int inside;  /* an attempt is running the task function */
    atomic_int last_rv;
    atomic_int nonzero; /* attempts that returned non-zero */
    atomic_int done_enter, done_calls, done_status;
    atomic_int first_start;              /* the pool's start ticket of attempt 0, 0 if never */
    atomic_int tick[FZ_ATTEMPTS];        /* the pool's start ticket of each attempt, 0 if never */
    _Atomic uint64_t t_end[FZ_ATTEMPTS]; /* tp_now_ns() just before each attempt returned */
    /* Written by the harness, read by the task. */
    atomic_int cancel_ok; /* a tp_cancel of it returned TP_OK */
    /* Written inside tp_cq_drain (bound tasks). */
    int drain_call, drain_idx; /* the drain call that ran its on_done, its place in that call */
    int drain_seq;             /* its on_done's place in its queue's run order (fz_cq.runs) */
    int pidx;                  /* its place in its pool's tasks[] */
    bool w1;                   /* its pool has a single worker */
    /* Harness only. */
    uint64_t id;
    bool accepted, cancel_requested, finalised_known;
    /* Completion order knowledge (fz_obs ticks): last seen certainly
     * unfinished, first known finalised (0: never). */
    uint64_t obs_unfin, obs_fin;
    bool fin_allowed_set; /* fin_allowed: its statuses, fixed when its pool went away */
    fz_allowed fin_allowed;
    int must_status; /* INT_MIN, or the status its on_done must get */
    int qpos;        /* bound: its place in its queue's completion order, -1 unknown */
    /* The exact model (X_*): its state, the next attempt, cancelled. */
    int xs, xattempt;
    bool xcancel;
    int xrv;           /* an agent's attempt result */
    uint64_t xpush_hi; /* the latest moment its last push into the queue can have been */
} fz_task;

typedef struct fz_group {
    tp_group *g;
    bool live, coe, cancel_called;
    bool refusing; /* certain to refuse submits: cancelled, or seen refusing */
    int err_seen;  /* the first non-zero result a wait returned, 0 none */
    bool detached; /* its pool was destroyed */
} fz_group;

typedef struct fz_pool {
    int slot;
    fz_group grp[FZ_GROUPS]; /* kept across pool_reset: see finish_groups */
    tp_pool *p;
    bool live;
    int gen; /* a number per created pool, unique in the input */
    unsigned workers, max_workers, cap, max_per_user, max_retries;
    uint64_t retry_delay, run_timeout, drain_timeout, submit_timeout;
    /* 1.2 configuration, resolved */
    bool fair;
    unsigned starve_limit, low_max;
    uint64_t retry_delay_max;
    unsigned weight[FZS_FLOWS]; /* tp_user_weight_set calls that returned TP_OK */
    bool closed, shut_called, maybe_forced;
    bool slow_hooks; /* set before tp_create, read-only while it lives */
    bool slow_done;  /* on_done takes 1 ms (set before tp_create) */
    int shut_rc;
    atomic_int forced; /* a forced shutdown returned: no new attempt may start */
    uint64_t submitted, accepted, rej_full, rej_user, rej_closed, rej_timeout;
    int ntasks;
    fz_task *tasks[FZ_MAX_TASKS];
    atomic_int hook_start, hook_stop, log_warn, log_error, log_other, done_total;
    atomic_int start_seq; /* tickets for first attempts, in the order they start */
    atomic_int tick_seq;  /* tickets for every attempt, in the order they start */
    tp_stats last;
    tp_lane_stats last_lane[FZS_LANES];
    /* The exact model: while `exact`, the model knows every waiting task and
     * the scheduler's whole state (sim), and predicts each start. */
    bool exact;
    bool exact_wanted; /* OP_CREATE2 without its "racy" bit: the model syncs (see below) */
    fzs sim;
    int xstuck;    /* tasks the model holds running and blocked */
    int xended;    /* accepted tasks the model holds ended */
    int pred_base; /* tickets up to this one are not predicted */
    int pred_n;    /* predicted tickets: pred_base + 1 .. pred_n */
    int16_t pred_task[FZ_MAX_TICKS + 1];
    int8_t pred_att[FZ_MAX_TICKS + 1];
    int npend; /* retries waiting for their delay, in the order they failed */
    int pend[FZ_MAX_TASKS];
} fz_pool;

static fz_pool fz_pools[FZ_SLOTS];
static fz_task fz_tasks[FZ_MAX_TASKS];
static int fz_ntasks;
static int fz_pool_gens; /* pools created in this input */

/* Completion queues: places taken, calls, the order of completions. */
typedef struct fz_cq {
    tp_cq *q;
    bool live;
    unsigned cap;
    int gen;           /* a number per created queue, unique in the input */
    int taken;         /* accepted bound tasks whose on_done has not run: the queue's places in use */
    atomic_int calls;  /* tp_cq_drain calls so far (nested ones included) */
    atomic_int ran;    /* on_done calls they returned, each call its own (nested ones included) */
    atomic_int runs;   /* on_done calls made so far, in the order they ran */
    int ndone;         /* completions drained so far: their queue positions are 0..ndone-1 */
    bool unordered_op; /* the drains of this op ran concurrently: no position is known */
} fz_cq;
static fz_cq fz_cqs[FZ_CQS];

/* A logical clock of the model's observations (completion order). */
static uint64_t fz_obs;

/* The thread's drains under way (tp_cq_drain calls it makes, innermost
 * last): a bound task's on_done must run inside one of its queue. */
static _Thread_local int fz_drain_depth;
static _Thread_local int fz_drain_cq[16];
static _Thread_local int fz_drain_call[16];
static _Thread_local int fz_drain_runs[16];
static char fz_main_log[16]; /* the harness thread's log id, "" for none */

/* ------------------------------------------------------------ hooks */

/* Worker hooks are user code and may take a while: with `slow_hooks` they do,
 * which widens the windows where a worker is starting or exiting. */
static void hook_start(void *arg) {
    fz_pool *fp = (fz_pool *)arg;
    atomic_fetch_add(&fp->hook_start, 1);
    if (fp->slow_hooks) sleep_ns(2 * MS);
}

static void hook_stop(void *arg) {
    fz_pool *fp = (fz_pool *)arg;
    if (fp->slow_hooks) sleep_ns(2 * MS);
    atomic_fetch_add(&fp->hook_stop, 1);
}

static void log_hook(void *arg, int level, const char *log_id, const char *msg) {
    fz_pool *fp = (fz_pool *)arg;
    CHECK(log_id && msg, "log hook called with a NULL log id or message");
    if (level == TP_LOG_WARN)
        atomic_fetch_add(&fp->log_warn, 1);
    else if (level == TP_LOG_ERROR)
        atomic_fetch_add(&fp->log_error, 1);
    else
        atomic_fetch_add(&fp->log_other, 1);
}

/* ------------------------------------------------------------ tasks */

static bool near_deadline(const fz_task *t) { return t->dl_class == DL_PAST || t->dl_class == DL_NEAR; }
static bool short_timeout(const fz_task *t) { return t->run_timeout < SEC; }

/* Checks at the start of every attempt. */
static void attempt_checks(tp_ctx *c, fz_task *t, int attempt) {
    fz_pool *fp = t->fp;
    CHECK(attempt <= (int)t->max_retries, "task %d: attempt %d > max_retries %u", t->index, attempt,
          t->max_retries);
    CHECK(tp_ctx_attempt(c) == (unsigned)attempt, "task %d: tp_ctx_attempt %u, but this is attempt %d",
          t->index, tp_ctx_attempt(c), attempt);
    CHECK(t->dl_class != DL_PAST, "task %d: its deadline had passed at admission, yet it ran", t->index);
    /* A cancel that returned TP_OK, or a forced shutdown that returned, lets
     * at most the attempt already running go on, and that one sees it. */
    if (atomic_load(&t->cancel_ok) || atomic_load(&fp->forced))
        CHECK(tp_ctx_err(c) == TP_ECANCELED,
              "task %d: attempt %d started after a successful cancel / forced shutdown", t->index, attempt);
    /* Retry backoff: attempt k starts no earlier than the end of attempt
     * k - 1 plus min(retry_delay x 2^(k-1), retry_delay_max) (or the fixed
     * delay): the pool reads its clock after the attempt returned, and the
     * retry is due only then. */
    if (attempt > 0 && attempt < FZ_ATTEMPTS) {
        uint64_t prev_end = atomic_load(&t->t_end[attempt - 1]), now0 = tp_now_ns();
        CHECK(prev_end != 0 && now0 - prev_end >= t->delay[attempt],
              "task %d: retry %d started %llu ns after attempt %d returned; its delay is %llu ns", t->index,
              attempt, (unsigned long long)(now0 - prev_end), attempt - 1,
              (unsigned long long)t->delay[attempt]);
    }
    uint64_t id = tp_ctx_id(c);
    uint64_t seen = 0;
    if (!atomic_compare_exchange_strong(&t->ctx_id, &seen, id))
        CHECK(seen == id, "task %d: tp_ctx_id changed between attempts", t->index);
    const char *u = tp_ctx_user(c), *want = fz_users[t->user];
    if (!want || !want[0])
        CHECK(u == NULL, "task %d: tp_ctx_user is \"%s\", expected NULL", t->index, u);
    else
        CHECK(u && strcmp(u, want) == 0, "task %d: tp_ctx_user is \"%s\", expected \"%s\"", t->index,
              u ? u : "(null)", want);
    const char *l = tp_ctx_log_id(c), *g = tp_log_id_get();
    CHECK(l != NULL, "task %d: tp_ctx_log_id is NULL", t->index);
    if (t->expect_log[0])
        CHECK(strcmp(l, t->expect_log) == 0, "task %d: log id \"%s\", expected \"%s\"", t->index, l,
              t->expect_log);
    else
        CHECK(strncmp(l, "tp-", 3) == 0, "task %d: generated log id \"%s\"", t->index, l);
    CHECK(g && strcmp(g, l) == 0, "task %d: tp_log_id_get \"%s\" != tp_ctx_log_id \"%s\"", t->index,
          g ? g : "(null)", l);
    /* Effective deadline: min(task deadline, start + run timeout), where
     * submit_ns <= start <= now. */
    uint64_t now = tp_now_ns(), d = tp_ctx_deadline(c);
    uint64_t dl = t->deadline ? t->deadline : TP_FOREVER;
    uint64_t rt = t->run_timeout;
    uint64_t hi = min64(dl, rt == TP_FOREVER ? TP_FOREVER : sat_add(now, rt));
    uint64_t lo = min64(dl, rt == TP_FOREVER ? TP_FOREVER : sat_add(t->submit_ns, rt));
    CHECK(d >= lo && d <= hi, "task %d: tp_ctx_deadline %llu outside [%llu, %llu]", t->index,
          (unsigned long long)d, (unsigned long long)lo, (unsigned long long)hi);
}

static int wait_gate_sleep(tp_ctx *c, fz_task *t) {
    uint64_t end = tp_now_ns() + FZ_GATE_NS;
    while (!gate_is_open(t->gate)) {
        int e = tp_ctx_sleep(c, MS);
        if (e != 0) {
            CHECK(e == tp_ctx_err(c) || (e == TP_ETIMEDOUT && tp_ctx_err(c) == TP_ECANCELED),
                  "task %d: tp_ctx_sleep returned %s, tp_ctx_err %s", t->index, rcname(e),
                  rcname(tp_ctx_err(c)));
            return e;
        }
        if (tp_now_ns() > end) violation("harness: gate %d never opened (task %d)", t->gate, t->index);
    }
    return t->result;
}

static int wait_gate_fd(tp_ctx *c, fz_task *t) {
    int cfd = tp_ctx_fd(c);
    if (cfd < 0) return wait_gate_sleep(c, t); /* no descriptor to be had (TP_ENOMEM) */
    /* The descriptor is clean for every new attempt unless it is cancelled. */
    struct pollfd pf0 = {cfd, POLLIN, 0};
    if (poll(&pf0, 1, 0) == 1 && (pf0.revents & POLLIN))
        CHECK(tp_ctx_err(c) == TP_ECANCELED,
              "task %d: cancel fd readable at the start of an uncancelled attempt", t->index);
    uint64_t end = tp_now_ns() + FZ_GATE_NS;
    for (;;) {
        if (gate_is_open(t->gate)) return t->result;
        int e = tp_ctx_err(c);
        if (e) return e;
        uint64_t now = tp_now_ns(), d = tp_ctx_deadline(c);
        if (now > end) violation("harness: gate %d never opened (task %d)", t->gate, t->index);
        uint64_t ms = d == TP_FOREVER ? 1000 : (d > now ? (d - now) / MS + 1 : 0);
        if (ms > 1000) ms = 1000;
        struct pollfd pf[2] = {{fz_gates[t->gate].fds[0], POLLIN, 0}, {cfd, POLLIN, 0}};
        int n = poll(pf, 2, (int)ms);
        if (n > 0 && (pf[1].revents & POLLIN))
            CHECK(tp_ctx_err(c) == TP_ECANCELED, "task %d: cancel fd readable but tp_ctx_err is %s", t->index,
                  rcname(tp_ctx_err(c)));
    }
}

static int self_task(tp_ctx *c, fz_task *t) {
    tp_pool *p = t->pool;
    CHECK(tp_shutdown(p, 1) == TP_EDEADLK, "task %d: tp_shutdown on its own pool is not EDEADLK", t->index);
    CHECK(tp_wait(p, 1) == TP_EDEADLK, "task %d: tp_wait on its own pool is not EDEADLK", t->index);
    CHECK(tp_destroy(p) == TP_EDEADLK, "task %d: tp_destroy on its own pool is not EDEADLK", t->index);
    if (t->group) {
        CHECK(tp_group_wait(t->group, 1) == TP_EDEADLK,
              "task %d: tp_group_wait on its own group is not EDEADLK", t->index);
        CHECK(tp_group_destroy(t->group) == TP_EDEADLK,
              "task %d: tp_group_destroy from a member is not EDEADLK", t->index);
    }
    int rc = tp_cancel(p, tp_ctx_id(c));
    CHECK(rc == TP_OK, "task %d: cancelling itself returned %s", t->index, rcname(rc));
    CHECK(tp_ctx_err(c) == TP_ECANCELED, "task %d: after cancelling itself tp_ctx_err is %s", t->index,
          rcname(tp_ctx_err(c)));
    CHECK(tp_ctx_sleep(c, 50 * MS) == TP_ECANCELED, "task %d: tp_ctx_sleep after self-cancel", t->index);
    return t->result;
}

static int task_main(tp_ctx *c, void *arg) {
    fz_task *t = (fz_task *)arg;
    int attempt = atomic_fetch_add(&t->runs, 1);
    int tick = atomic_fetch_add(&t->fp->tick_seq, 1) + 1;
    if (attempt < FZ_ATTEMPTS) atomic_store(&t->tick[attempt], tick);
    if (attempt == 0) atomic_store(&t->first_start, atomic_fetch_add(&t->fp->start_seq, 1) + 1);
    attempt_checks(c, t, attempt);
    atomic_store(&t->inside, 1);
    int rv = 0;
    switch (t->kind) {
    case K_SUCCEED: rv = 0; break;
    case K_FAIL: rv = t->result; break;
    case K_FLAKY: rv = attempt < t->fail_k ? t->result : 0; break;
    case K_GATE_IGNORE:
        gate_wait(t->gate);
        rv = t->result;
        break;
    case K_GATE_SLEEP: rv = wait_gate_sleep(c, t); break;
    case K_GATE_FD: rv = wait_gate_fd(c, t); break;
    case K_SLEEP: {
        uint64_t t0 = tp_now_ns();
        rv = tp_ctx_sleep(c, t->sleep_ns);
        uint64_t t1 = tp_now_ns();
        if (rv == 0)
            CHECK(t1 - t0 >= t->sleep_ns && tp_ctx_deadline(c) >= t0 + t->sleep_ns,
                  "task %d: tp_ctx_sleep returned 0 early or past its deadline", t->index);
        else
            CHECK(rv == TP_ECANCELED || rv == TP_ETIMEDOUT, "task %d: tp_ctx_sleep returned %d", t->index,
                  rv);
        break;
    }
    case K_SELF: rv = self_task(c, t); break;
    default: violation("harness: bad kind");
    }
    if (rv != 0) atomic_fetch_add(&t->nonzero, 1);
    if (attempt < FZ_ATTEMPTS) atomic_store(&t->t_end[attempt], tp_now_ns());
    atomic_store(&t->last_rv, rv);
    atomic_store(&t->inside, 0);
    atomic_fetch_add(&t->returns, 1);
    return rv;
}

static int cq_drain_call(int k, unsigned max);

/* on_done of a task bound to a completion queue: only inside tp_cq_drain of
 * that queue, on the thread that drains (the harness's), never on a pool
 * thread; its pool may be gone by then, so it touches only the task. */
static void bound_done(fz_task *t, int status) {
    int d = fz_drain_depth;
    CHECK(d > 0 && fz_drain_cq[d - 1] == t->cqi,
          "task %d: bound to queue %d, its on_done ran outside a tp_cq_drain of that queue (drains under "
          "way on this thread: %d)",
          t->index, t->cqi, d);
    atomic_store(&t->done_status, status);
    t->drain_call = fz_drain_call[d - 1];
    t->drain_idx = fz_drain_runs[d - 1]++;
    t->drain_seq = atomic_fetch_add(&fz_cqs[t->cqi].runs, 1) + 1;
    /* "It may be called from inside an on_done it runs": one more. */
    if (t->nest && d < 15) cq_drain_call(t->cqi, 1);
    atomic_fetch_add(&t->done_calls, 1);
}

static void task_done(void *arg, int status) {
    fz_task *t = (fz_task *)arg;
    fz_pool *fp = t->fp;
    CHECK(atomic_fetch_add(&t->done_enter, 1) == 0, "task %d (id %llu): on_done called twice", t->index,
          (unsigned long long)t->id);
    CHECK(atomic_load(&t->inside) == 0, "task %d: on_done while its function runs", t->index);
    if (t->cqi >= 0) {
        bound_done(t, status);
        return;
    }
    CHECK(!pthread_equal(pthread_self(), fz_main_thread), "task %d: on_done ran on the harness thread",
          t->index);
    CHECK(fz_drain_depth == 0, "task %d: on_done of a task without a queue ran inside tp_cq_drain", t->index);
    atomic_store(&t->done_status, status);
    /* The task's counters are updated before on_done, and so are those of
     * every task whose on_done ran before. */
    int n = atomic_fetch_add(&fp->done_total, 1) + 1;
    tp_stats s;
    tp_stats_get(t->pool, &s);
    CHECK(s.completed >= (uint64_t)n, "task %d: on_done #%d but stats.completed is %llu", t->index, n,
          (unsigned long long)s.completed);
    CHECK(tp_wait(t->pool, 1) == TP_EDEADLK, "task %d: tp_wait in on_done is not EDEADLK", t->index);
    CHECK(tp_shutdown(t->pool, 1) == TP_EDEADLK, "task %d: tp_shutdown in on_done is not EDEADLK", t->index);
    if (fp->slow_done) sleep_ns(MS);
    const char *g = tp_log_id_get();
    CHECK(g != NULL, "task %d: no log id in on_done", t->index);
    if (t->expect_log[0])
        CHECK(strcmp(g, t->expect_log) == 0, "task %d: log id in on_done \"%s\", expected \"%s\"", t->index,
              g, t->expect_log);
    atomic_fetch_add(&t->done_calls, 1);
}

/* ------------------------------------------------------------ model scan */

/* The task may be cancelled through its group: tp_group_cancel was called,
 * or the group cancels on error (any member may fail: the model does not
 * predict which ends first). */
static bool grp_may_cancel(const fz_task *t) { return t->grp && (t->grp->cancel_called || t->grp->coe); }

static bool task_ended(const fz_task *t) { return atomic_load(&t->done_calls) > 0 || t->finalised_known; }

/* Completion order knowledge: the model saw `t` certainly unfinished, or
 * learnt that it has ended, at this tick of fz_obs. A task known ended at a
 * tick before another one was seen unfinished ended first, so its completion
 * is first in a queue they share. */
static void note_unfinished(fz_task *t) { t->obs_unfin = ++fz_obs; }
static void note_finished(fz_task *t) {
    if (!t->obs_fin) t->obs_fin = ++fz_obs;
}
static void set_finalised(fz_task *t) {
    t->finalised_known = true;
    note_finished(t);
}
/* Its on_done has run and the model may read its status. */
static bool done_known(const fz_task *t) { return t->has_done && atomic_load(&t->done_calls) > 0; }

/* No attempt will start any more: one returned 0, or the last one allowed has
 * returned, or it was cancelled (by itself or by a forced shutdown) and has
 * returned. Read `returns` before `last_rv`: any 0 seen is a final one. */
static bool no_more_runs(const fz_task *t) {
    int ret = atomic_load(&t->returns);
    if (ret == 0) return false;
    if (ret >= (int)t->max_retries + 1 || t->kind == K_SELF) return true;
    return atomic_load(&t->last_rv) == 0;
}

/* Certainly inside its function, and certain to stay there until the harness
 * opens its gate (or, cooperating, cancels it or forces a shutdown). */
static bool task_stuck_(const fz_pool *fp, const fz_task *t, bool certain) {
    if (task_ended(t) || !atomic_load(&t->inside) || gate_is_open(t->gate)) return false;
    if (t->kind == K_GATE_IGNORE) return true;
    if (t->kind == K_GATE_SLEEP || t->kind == K_GATE_FD)
        return !t->cancel_requested && !fp->maybe_forced && !(certain && grp_may_cancel(t)) &&
               !short_timeout(t) && !near_deadline(t);
    return false;
}

static bool task_stuck(const fz_pool *fp, const fz_task *t) { return task_stuck_(fp, t, true); }

/* An unfinished gate task whose gate is closed: it may get stuck. */
static bool task_blocker(const fz_task *t) {
    return !task_ended(t) && (t->kind == K_GATE_IGNORE || t->kind == K_GATE_SLEEP || t->kind == K_GATE_FD) &&
           !gate_is_open(t->gate);
}

typedef struct fz_scan {
    int nstuck, nblockers, nparked, unfinished;
    bool q1; /* every worker is stuck */
    int occ_lo, occ_hi;
    int ulo[FZ_USERS], uhi[FZ_USERS];
    bool stuck[FZ_MAX_TASKS], parked[FZ_MAX_TASKS];
    /* The same without the group tolerance: a member that its group may
     * cancel is stuck or parked *for now*; settle counts it as settled. */
    int nstuck_now;
    bool settled[FZ_MAX_TASKS];
} fz_scan;

static void model_scan(const fz_pool *fp, fz_scan *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        s->stuck[i] = task_stuck(fp, t);
        s->nstuck += s->stuck[i];
        s->settled[i] = task_stuck_(fp, t, false);
        s->nstuck_now += s->settled[i];
        s->nblockers += task_blocker(t);
    }
    s->q1 = s->nstuck >= (int)fp->max_workers;
    bool q1_now = s->nstuck_now >= (int)fp->max_workers;
    /* low_prio_max_running: with that many background tasks stuck, no
     * other background task can start */
    int bg_stuck = 0, bg_now = 0;
    for (int i = 0; i < fp->ntasks; i++)
        if (fp->tasks[i]->accepted && fp->tasks[i]->prio < 0) {
            bg_stuck += s->stuck[i];
            bg_now += s->settled[i];
        }
    bool bg_blocked = fp->low_max && bg_stuck >= (int)fp->low_max;
    bool bg_blocked_now = fp->low_max && bg_now >= (int)fp->low_max;
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (!t->accepted || task_ended(t)) continue;
        s->unfinished++;
        bool gone = no_more_runs(t);
        bool q1 = s->q1 || (t->prio < 0 && bg_blocked);
        /* Parked: with every worker stuck, an unfinished task that no timer
         * or earlier cancel can end is waiting in the queue or for a retry. */
        s->parked[i] = q1 && !s->stuck[i] && !gone && !near_deadline(t) && !atomic_load(&t->cancel_ok) &&
                       !fp->maybe_forced && !grp_may_cancel(t);
        if (!s->settled[i])
            s->settled[i] = (q1_now || (t->prio < 0 && bg_blocked_now)) && !gone && !near_deadline(t) &&
                            !atomic_load(&t->cancel_ok) && !fp->maybe_forced;
        s->nparked += s->parked[i];
        if (s->stuck[i] || s->parked[i]) note_unfinished(fp->tasks[i]);
        if (s->stuck[i] || s->parked[i]) s->ulo[t->user]++;
        if (s->parked[i]) s->occ_lo++;
        if (!s->stuck[i] && !gone) s->occ_hi++;
        s->uhi[t->user]++;
    }
}

/* ------------------------------------------------------------ stats checks */

static tp_stats get_stats(const fz_pool *fp) {
    tp_stats s;
    memset(&s, 0xab, sizeof s);
    tp_stats_get(fp->p, &s);
    return s;
}

static void check_format(const tp_stats *s) {
    char big[4096], small[16];
    for (int f = TP_FORMAT_JSON; f <= TP_FORMAT_PROMETHEUS; f++) {
        int need = tp_stats_format(s, f, NULL, 0);
        CHECK(need > 0 && need < (int)sizeof big, "tp_stats_format(%d) needs %d", f, need);
        int n = tp_stats_format(s, f, big, sizeof big);
        CHECK(n == need && strlen(big) == (size_t)n, "tp_stats_format(%d) wrote %d/%zu, needed %d", f, n,
              strlen(big), need);
        memset(small, 'x', sizeof small);
        n = tp_stats_format(s, f, small, sizeof small);
        CHECK(n == need && small[sizeof small - 1] == '\0' && strlen(small) == sizeof small - 1 &&
                  memcmp(small, big, sizeof small - 1) == 0,
              "tp_stats_format(%d) into 16 bytes is not a NUL-terminated prefix", f);
        CHECK(f != TP_FORMAT_JSON || (strstr(big, "\"accepted\"") && big[0] == '{'),
              "JSON stats lack \"accepted\"");
        CHECK(f != TP_FORMAT_PROMETHEUS || strstr(big, "taskpool_accepted_total"),
              "Prometheus stats lack taskpool_accepted_total");
    }
    CHECK(tp_stats_format(s, 7, big, sizeof big) == TP_EINVAL, "tp_stats_format of an unknown format");
}

static tp_lane_stats lane_stats(const fz_pool *fp, int prio);

/* Lanes while the pool runs: each lane's `started` is monotonic and counts
 * at least the attempts its tasks have entered (read first); gauges bounded. */
static void check_lanes_running(fz_pool *fp) {
    uint64_t runs[FZS_LANES] = {0};
    for (int i = 0; i < fp->ntasks; i++)
        if (fp->tasks[i]->accepted)
            runs[fp->tasks[i]->prio - TP_PRIO_MIN] += (uint64_t)atomic_load(&fp->tasks[i]->runs);
    for (int lane = 0; lane < FZS_LANES; lane++) {
        tp_lane_stats l = lane_stats(fp, lane + TP_PRIO_MIN);
        CHECK(l.started >= runs[lane] && l.started >= fp->last_lane[lane].started,
              "pool %d: lane %d started %llu, its tasks entered %llu attempts, earlier read %llu", fp->slot,
              lane + TP_PRIO_MIN, (unsigned long long)l.started, (unsigned long long)runs[lane],
              (unsigned long long)fp->last_lane[lane].started);
        CHECK(l.running <= fp->max_workers && l.queued <= fp->cap + fp->max_workers + (unsigned)fp->ntasks,
              "pool %d: lane %d running %u queued %u", fp->slot, lane + TP_PRIO_MIN, l.running, l.queued);
        if (fp->low_max && lane < 2)
            CHECK(l.running <= fp->low_max, "pool %d: lane %d runs %u tasks, low_prio_max_running is %u",
                  fp->slot, lane + TP_PRIO_MIN, l.running, fp->low_max);
        fp->last_lane[lane] = l;
    }
}

/* While the pool runs: admission counters exact, the others bounded by what
 * the tasks have shown, every counter monotonic. */
static void check_running(fz_pool *fp, bool with_users) {
    int runs_seen = 0, retries_seen = 0, done_seen = 0;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        int r = atomic_load(&t->runs);
        runs_seen += r > 0;
        retries_seen += r > 1 ? r - 1 : 0;
        /* a bound task's completion is queued before its counters count it:
         * a drain may run its on_done first */
        done_seen += t->cqi < 0 && atomic_load(&t->done_calls) > 0;
    }
    fz_scan sc;
    model_scan(fp, &sc);
    tp_stats s = get_stats(fp);
#define EQ(field, want)                                                                                      \
    CHECK(s.field == (want), "pool %d: stats." #field " is %llu, the model says %llu", fp->slot,             \
          (unsigned long long)s.field, (unsigned long long)(want))
    EQ(submitted, fp->submitted);
    EQ(accepted, fp->accepted);
    EQ(rejected_full, fp->rej_full);
    EQ(rejected_user, fp->rej_user);
    EQ(rejected_closed, fp->rej_closed);
    EQ(rejected_timeout, fp->rej_timeout);
    EQ(rejected, fp->rej_full + fp->rej_user + fp->rej_closed + fp->rej_timeout);
#undef EQ
#define GE(field, lo)                                                                                        \
    CHECK(s.field >= (uint64_t)(lo), "pool %d: stats." #field " is %llu < %llu", fp->slot,                   \
          (unsigned long long)s.field, (unsigned long long)(lo))
#define LE(field, hi)                                                                                        \
    CHECK(s.field <= (uint64_t)(hi), "pool %d: stats." #field " is %llu > %llu", fp->slot,                   \
          (unsigned long long)s.field, (unsigned long long)(hi))
    GE(started, runs_seen);
    GE(retried, retries_seen);
    GE(completed, done_seen);
    LE(completed, fp->accepted);
    LE(started, fp->accepted);
    LE(active, fp->max_workers);
    GE(active, sc.nstuck);
    LE(workers, fp->max_workers);
    LE(idle, fp->max_workers);
    LE(queued, fp->cap + fp->max_workers);
    LE(delayed, fp->cap + fp->max_workers);
    LE(users, 3);
    /* monotonic counters */
    GE(started, fp->last.started);
    GE(retried, fp->last.retried);
    GE(completed, fp->last.completed);
    GE(succeeded, fp->last.succeeded);
    GE(failed, fp->last.failed);
    GE(cancelled, fp->last.cancelled);
    GE(expired, fp->last.expired);
#undef GE
#undef LE
    fp->last = s;
    check_lanes_running(fp);
    if (with_users) {
        /* Bounds taken before the call hold at its instant: stuck and parked
         * tasks stay so while the harness does nothing, and a task seen ended
         * stays ended. */
        model_scan(fp, &sc);
        for (int u = 0; u < FZ_USERS; u++) {
            unsigned n = tp_user_active(fp->p, fz_users[u]);
            int lo = u >= 2 ? sc.ulo[u] : 0, hi = u >= 2 ? sc.uhi[u] : 0;
            CHECK((int)n >= lo && (int)n <= hi, "pool %d: tp_user_active(%s) = %u, model [%d, %d]", fp->slot,
                  fz_users[u] ? fz_users[u] : "NULL", n, lo, hi);
        }
    }
}


static void allow(fz_allowed *a, int st) {
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == st) return;
    a->v[a->n++] = st;
}

static bool allowed_has(const fz_allowed *a, int st) {
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == st) return true;
    return false;
}

static fz_allowed final_allowed(const fz_pool *fp, const fz_task *t) {
    fz_allowed a = {0, {0}};
    bool canc = atomic_load(&t->cancel_ok) || fp->maybe_forced || grp_may_cancel(t);
    bool dl = near_deadline(t);
    int runs = atomic_load(&t->runs);
    if (t->dl_class == DL_PAST) {
        allow(&a, TP_ETIMEDOUT);
        if (canc) allow(&a, TP_ECANCELED);
        return a;
    }
    if (runs == 0) {
        if (canc) allow(&a, TP_ECANCELED);
        if (dl) allow(&a, TP_ETIMEDOUT);
        return a;
    }
    int rv = atomic_load(&t->last_rv);
    if (rv == 0) {
        allow(&a, 0);
        return a;
    }
    bool retry_left = runs - 1 < (int)t->max_retries && t->kind != K_SELF;
    if (!retry_left) {
        allow(&a, rv);
        return a;
    }
    /* A failed attempt with retries left ends the task only if a cancel, a
     * forced shutdown or the deadline stopped the retry. */
    if (canc) {
        allow(&a, rv);
        allow(&a, TP_ECANCELED);
    }
    if (dl) {
        allow(&a, rv);
        allow(&a, TP_ETIMEDOUT);
    }
    return a;
}

static void print_allowed(char *buf, size_t len, const fz_allowed *a) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < a->n && n < len; i++) n += (size_t)snprintf(buf + n, len - n, " %d", a->v[i]);
    if (a->n == 0) snprintf(buf, len, " (none: it should not have ended)");
}

/* The statuses `t` may end with: from its pool's model while the pool lives,
 * else as fixed when the pool went away (its history was final then). */
static fz_allowed task_allowed(const fz_pool *fp, const fz_task *t) {
    if (t->fin_allowed_set) return t->fin_allowed;
    return final_allowed(fp, t);
}

/* The status its on_done got (which has run) is one its history allows. */
static void check_status(const fz_pool *fp, const fz_task *t) {
    int st = atomic_load(&t->done_status);
    fz_allowed a = task_allowed(fp, t);
    if (t->must_status != INT_MIN) {
        a.n = 1;
        a.v[0] = t->must_status;
    }
    if (!allowed_has(&a, st)) {
        char buf[80];
        print_allowed(buf, sizeof buf, &a);
        violation("task %d (id %llu, %s, runs %d, last rv %d, max_retries %u, cancel_ok %d, deadline class "
                  "%d, queue %d): on_done status %d, allowed:%s",
                  t->index, (unsigned long long)t->id, kind_name[t->kind], atomic_load(&t->runs),
                  atomic_load(&t->last_rv), t->max_retries, atomic_load(&t->cancel_ok), t->dl_class, t->cqi,
                  st, buf);
    }
}

static int flow_of(const fz_task *t) { return t->user <= 1 ? 0 : t->user - 1; } /* NULL and "": anonymous */

/* FIFO within a lane (and, in a fair pool, within a user's list there): with
 * one worker, the first attempts of a lane's tasks start in admission order
 * (a retry goes to the back, but never ahead of a first attempt admitted
 * before it), whatever the other lanes do. With more workers two starts race,
 * so only one worker is checked. Holds through every timing, unlike the exact
 * model, which predicts only where it knows the whole state. */
static void check_fifo(const fz_pool *fp) {
    if (fp->max_workers != 1) return;
    for (int lane = TP_PRIO_MIN; lane <= TP_PRIO_MAX; lane++)
        for (int f = 0; f < (fp->fair ? FZS_FLOWS : 1); f++) {
            int last = 0, last_index = -1;
            for (int i = 0; i < fp->ntasks; i++) {
                const fz_task *t = fp->tasks[i];
                int seq = atomic_load(&t->first_start);
                if (!t->accepted || seq == 0 || t->prio != lane || (fp->fair && flow_of(t) != f)) continue;
                CHECK(seq > last,
                      "pool %d: task %d was admitted after task %d (priority %d%s) but started before it "
                      "(FIFO within a lane%s)",
                      fp->slot, t->index, last_index, lane, fp->fair ? ", same user" : "",
                      fp->fair ? " and user" : "");
                last = seq;
                last_index = t->index;
            }
        }
}

/* Every task of the pool has ended and every on_done has returned. */
static void check_tasks_ended(const fz_pool *fp) {
    check_fifo(fp);
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        CHECK(atomic_load(&t->inside) == 0, "pool %d task %d still inside its function at rest", fp->slot,
              t->index);
        if (!t->accepted) {
            CHECK(atomic_load(&t->runs) == 0 && atomic_load(&t->done_enter) == 0,
                  "pool %d task %d was refused, yet ran %d times / got %d on_done", fp->slot, t->index,
                  atomic_load(&t->runs), atomic_load(&t->done_enter));
            continue;
        }
        CHECK(atomic_load(&t->runs) == atomic_load(&t->returns), "pool %d task %d: runs != returns", fp->slot,
              t->index);
        uint64_t cid = atomic_load(&t->ctx_id);
        CHECK(cid == 0 || t->plain || cid == t->id,
              "pool %d task %d: ran with tp_ctx_id %llu, submit gave %llu", fp->slot, t->index,
              (unsigned long long)cid, (unsigned long long)t->id);
        if (!t->has_done) continue;
        int calls = atomic_load(&t->done_calls), enter = atomic_load(&t->done_enter);
        if (t->cqi >= 0 && calls == 0 && enter == 0) {
            set_finalised((fz_task *)t); /* ended: its completion waits in its queue */
            continue;
        }
        CHECK(calls == 1 && enter == 1, "pool %d task %d (id %llu, %s): on_done ran %d times at rest",
              fp->slot, t->index, (unsigned long long)t->id, kind_name[t->kind], calls);
        check_status(fp, t);
    }
}

static tp_hist fz_hist; /* big: one for every check, on the harness thread */

static uint64_t hist_count(const fz_pool *fp, int which) {
    memset(&fz_hist, 0xab, sizeof fz_hist);
    int rc = tp_hist_get(fp->p, which, &fz_hist);
    CHECK(rc == TP_OK, "tp_hist_get(%d) returned %s", which, rcname(rc));
    uint64_t sum = 0;
    for (unsigned b = 0; b < TP_HIST_BUCKETS; b++) sum += fz_hist.buckets[b];
    CHECK(sum == fz_hist.count, "tp_hist_get(%d): count %llu, buckets sum to %llu", which,
          (unsigned long long)fz_hist.count, (unsigned long long)sum);
    return fz_hist.count;
}

static tp_lane_stats lane_stats(const fz_pool *fp, int prio) {
    tp_lane_stats l;
    memset(&l, 0xab, sizeof l);
    int rc = tp_lane_stats_get(fp->p, prio, &l);
    CHECK(rc == TP_OK, "tp_lane_stats_get(%d) returned %s", prio, rcname(rc));
    for (int k = 0; k < 6; k++)
        CHECK(l.reserved[k] == 0, "tp_lane_stats_get(%d): reserved[%d] not zero", prio, k);
    return l;
}

/* At rest (taskpool.h section 14): the lanes' `started` sum to started +
 * retried, queued == running == 0; each lane's queue-wait histogram counts
 * one observation per start in it, and the five sum to TP_HIST_QUEUE_WAIT's.
 * The model knows each lane's starts exactly: its tasks' attempts. */
static void check_lanes_at_rest(const fz_pool *fp, const tp_stats *s) {
    uint64_t sum = 0, hsum = 0;
    for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
        tp_lane_stats l = lane_stats(fp, prio);
        uint64_t runs = 0;
        for (int i = 0; i < fp->ntasks; i++)
            if (fp->tasks[i]->accepted && fp->tasks[i]->prio == prio)
                runs += (uint64_t)atomic_load(&fp->tasks[i]->runs);
        CHECK(l.started == runs && l.queued == 0 && l.running == 0,
              "at rest: lane %d started %llu queued %u running %u; its tasks ran %llu attempts", prio,
              (unsigned long long)l.started, l.queued, l.running, (unsigned long long)runs);
        uint64_t h = hist_count(fp, TP_HIST_QUEUE_WAIT_PRIO(prio));
        CHECK(h == l.started, "at rest: lane %d's queue-wait histogram counts %llu, the lane started %llu",
              prio, (unsigned long long)h, (unsigned long long)l.started);
        sum += l.started;
        hsum += h;
    }
    CHECK(sum == s->started + s->retried, "at rest: the lanes started %llu, stats.started + retried = %llu",
          (unsigned long long)sum, (unsigned long long)(s->started + s->retried));
    uint64_t all = hist_count(fp, TP_HIST_QUEUE_WAIT);
    CHECK(hsum == all, "at rest: the lanes' queue-wait histograms count %llu, TP_HIST_QUEUE_WAIT %llu",
          (unsigned long long)hsum, (unsigned long long)all);
    CHECK(s->oldest_wait_ns == 0, "at rest: oldest_wait_ns %llu with nothing queued",
          (unsigned long long)s->oldest_wait_ns);
}

/* After tp_wait returned with the pool drained: SPEC section 7 exactly, and
 * every counter against the tasks' own records. */
static void check_at_rest(fz_pool *fp) {
    check_running(fp, false);
    check_tasks_ended(fp);
    tp_stats s = get_stats(fp);
    CHECK(s.submitted == s.accepted + s.rejected, "at rest: submitted != accepted + rejected");
    CHECK(s.accepted == s.completed, "at rest: accepted %llu != completed %llu",
          (unsigned long long)s.accepted, (unsigned long long)s.completed);
    CHECK(s.completed == s.succeeded + s.failed, "at rest: completed != succeeded + failed");
    CHECK(s.cancelled <= s.failed && s.expired <= s.cancelled, "at rest: cancelled/expired out of order");
    CHECK(s.active == 0 && s.queued == 0 && s.delayed == 0 && s.users == 0,
          "at rest: active %u queued %u delayed %u users %u", s.active, s.queued, s.delayed, s.users);
    CHECK(s.workers == 0 && s.idle == 0, "at rest: workers %u idle %u", s.workers, s.idle);
    uint64_t started = 0, retried = 0, nonzero = 0;
    uint64_t lo[4] = {0}, hi[4] = {0}; /* succeeded, failed, cancelled, expired */
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        int r = atomic_load(&t->runs);
        started += r > 0;
        retried += r > 1 ? (uint64_t)(r - 1) : 0;
        nonzero += (uint64_t)atomic_load(&t->nonzero);
        fz_allowed a;
        if (done_known(t)) {
            a.n = 1;
            a.v[0] = atomic_load(&t->done_status);
        } else {
            a = final_allowed(fp, t);
        }
        bool can[4] = {false}, must[4] = {true, true, true, true};
        for (int k = 0; k < a.n; k++) {
            int st = a.v[k];
            bool c[4] = {st == 0, st != 0, st == TP_ECANCELED || st == TP_ETIMEDOUT,
                         st == TP_ETIMEDOUT && r == 0};
            for (int j = 0; j < 4; j++) {
                can[j] = can[j] || c[j];
                must[j] = must[j] && c[j];
            }
        }
        for (int j = 0; j < 4; j++) {
            lo[j] += a.n > 0 && must[j];
            hi[j] += can[j];
        }
    }
    CHECK(s.started == started, "at rest: stats.started %llu, tasks started %llu",
          (unsigned long long)s.started, (unsigned long long)started);
    CHECK(s.retried == retried, "at rest: stats.retried %llu, extra attempts %llu",
          (unsigned long long)s.retried, (unsigned long long)retried);
    const char *names[4] = {"succeeded", "failed", "cancelled", "expired"};
    uint64_t got[4] = {s.succeeded, s.failed, s.cancelled, s.expired};
    for (int j = 0; j < 4; j++)
        CHECK(got[j] >= lo[j] && got[j] <= hi[j], "at rest: stats.%s %llu, the tasks say [%llu, %llu]",
              names[j], (unsigned long long)got[j], (unsigned long long)lo[j], (unsigned long long)hi[j]);
    int hs = atomic_load(&fp->hook_start), he = atomic_load(&fp->hook_stop);
    CHECK(hs == he && hs >= (int)fp->workers, "at rest: worker hooks started %d, stopped %d (workers %u)", hs,
          he, fp->workers);
    uint64_t warn = (uint64_t)atomic_load(&fp->log_warn), err = (uint64_t)atomic_load(&fp->log_error);
    CHECK(warn + err == nonzero, "at rest: %llu failed attempts, %llu WARN + %llu ERROR log lines",
          (unsigned long long)nonzero, (unsigned long long)warn, (unsigned long long)err);
    CHECK(warn >= s.retried, "at rest: %llu retries but only %llu WARN lines", (unsigned long long)s.retried,
          (unsigned long long)warn);
    check_lanes_at_rest(fp, &s);
}

/* ------------------------------------------------------------ exact order model */

/*
 * While a pool is `exact`, the model knows its whole scheduler state (fp->sim:
 * fz_sched.c, taskpool.h section 14 as written) and which tasks run blocked
 * on a closed gate (X_STUCK), and predicts every start. A worker that becomes
 * free (a gate opens, a cancel frees a cooperating task, a submit finds an
 * idle worker) takes the task fz_sched picks and runs it: the task's kind
 * says whether it returns at once (and with what) or blocks; a failed attempt
 * waits for its retry, or the task ends; then the worker takes the next one,
 * until every worker is blocked or nothing may start. Each start is a
 * predicted ticket; the pool's actual tickets (task_main) must match, which
 * checks priorities, the starvation counts, low_prio_max_running, FIFO and
 * fair order, weights, and where retries, cancels and expiry put tasks.
 *
 * Before an operation that changes what waits (a submit, a cancel, a gate, a
 * weight, a group cancel, close, shutdown, destroy) the harness syncs: it
 * waits until the pool has done what the model predicted -- every predicted
 * start happened and no other, every task the model ended is counted
 * completed, each lane's queued and running figures equal the model's, no
 * retry waits for its delay -- and checks the tickets. So every operation
 * acts on a state the model holds exactly.
 *
 * The model is exact only where the contract is: it gives up (exact = false)
 * at the first thing timing decides -- two workers that could start tasks at
 * once, a retry whose return could fall before a start and change it, an
 * attempt whose result timing decides, a near deadline that a free worker
 * could beat, a cancel-on-error group, a forced shutdown, an elastic pool
 * after close -- once the starts it predicted before that point have happened
 * and match. It takes over again whenever every accepted task has ended or is
 * blocked on a closed gate (the counters say so): the scheduler is then empty,
 * and an empty scheduler's state is known.
 *
 * Syncing takes away the races between the harness and the workers, so the
 * model runs only in pools made by OP_CREATE2 without its "racy" bit; the
 * others (and every OP_CREATE pool) keep the tolerant model alone.
 */

static fz_task *xtask(int index) { return &fz_tasks[index]; }
static int lane_of(const fz_task *t) { return t->prio - TP_PRIO_MIN; }

static fzs_ent ent_of(const fz_pool *fp, const fz_task *t) {
    fzs_ent e = {(int16_t)t->index, (int8_t)t->xattempt, (int8_t)(fp->fair ? flow_of(t) : 0)};
    return e;
}

static bool coop_kind(const fz_task *t) { return t->kind == K_GATE_SLEEP || t->kind == K_GATE_FD; }

/* What the model and the pool did, for a violation report. */
static void ex_report(const fz_pool *fp, const char *what) {
    static char buf[4096];
    fzs_describe(&fp->sim, buf, sizeof buf);
    fprintf(stderr, "\nfuzz_pool: exact model of pool %d (%s, %u workers, starve limit %u, low max %u): %s\n",
            fp->slot, fp->fair ? "fair" : "fifo", fp->max_workers, fp->starve_limit, fp->low_max, what);
    fprintf(stderr, "  model (task.attempt): %s\n  model stuck:", buf);
    for (int i = 0; i < fp->ntasks; i++)
        if (fp->tasks[i]->xs == X_STUCK) fprintf(stderr, " %d", fp->tasks[i]->index);
    fprintf(stderr, "\n  predicted starts:");
    for (int n = fp->pred_base + 1; n <= fp->pred_n; n++)
        fprintf(stderr, " #%d=%d.%d", n, fp->pred_task[n], fp->pred_att[n]);
    fprintf(stderr, "\n  actual starts:   ");
    int ticks = atomic_load(&fp->tick_seq);
    for (int n = fp->pred_base + 1; n <= ticks; n++)
        for (int i = 0; i < fp->ntasks; i++)
            for (int a = 0; a < FZ_ATTEMPTS; a++)
                if (atomic_load(&fp->tasks[i]->tick[a]) == n)
                    fprintf(stderr, " #%d=%d.%d", n, fp->tasks[i]->index, a);
    fprintf(stderr, "\n  tasks (index: priority user kind):");
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (t->accepted)
            fprintf(stderr, " %d:%+d/%s/%s", t->index, t->prio, fz_users[t->user] ? fz_users[t->user] : "-",
                    kind_name[t->kind]);
    }
    fprintf(stderr, "\n");
}

/* Every predicted start not yet checked has happened, as the ticket the
 * model gave it (waiting for each, bounded). */
static void ex_verify(fz_pool *fp) {
    uint64_t end = tp_now_ns() + FZ_BOUND_NS;
    for (int n = fp->pred_base + 1; n <= fp->pred_n; n++) {
        fz_task *t = xtask(fp->pred_task[n]);
        int a = fp->pred_att[n], got;
        while ((got = atomic_load(&t->tick[a])) == 0) {
            if (tp_now_ns() > end) {
                ex_report(fp, "a predicted start did not happen");
                violation("pool %d: start #%d should be task %d attempt %d, which did not start in %llu s",
                          fp->slot, n, t->index, a, (unsigned long long)(FZ_BOUND_NS / SEC));
            }
            sleep_ns(100000);
        }
        if (got == n) atomic_fetch_add(&fz_starts_predicted, 1);
        if (got != n) {
            ex_report(fp, "start order");
            violation(
                "pool %d: start #%d should be task %d attempt %d (taskpool.h section 14), which started "
                "as #%d",
                fp->slot, n, t->index, a, got);
        }
    }
    if (fp->pred_n > fp->pred_base) {
        char buf[100];
        int k = 0;
        for (int n = fp->pred_base + 1; n <= fp->pred_n && k < (int)sizeof buf - 12; n++)
            k += snprintf(buf + k, sizeof buf - (size_t)k, " %d.%d", fp->pred_task[n], fp->pred_att[n]);
        trace("  (slot %d started as predicted, #%d on (task.attempt):%s)", fp->slot, fp->pred_base + 1, buf);
    }
    fp->pred_base = fp->pred_n;
}

/* Why the exact model gave up, how often (reported at exit). */
static struct {
    const char *why;
    unsigned long long n;
} fz_lost[24];

static void ex_lose(fz_pool *fp, const char *why) {
    if (!fp->exact) return;
    for (int i = 0; i < 24; i++)
        if (!fz_lost[i].why || fz_lost[i].why == why) {
            fz_lost[i].why = why;
            fz_lost[i].n++;
            break;
        }
    ex_verify(fp);
    fp->exact = false;
    trace("  (exact model of slot %d off: %s)", fp->slot, why);
}

/* The pool has done what the model predicted (see above); then what the
 * model holds is known: ended tasks are finalised, waiting ones unfinished. */
static void ex_sync(fz_pool *fp) {
    if (!fp->live || !fp->exact) return;
    uint64_t t0 = tp_now_ns(), end = t0 + FZ_BOUND_NS;
    int stuck[FZS_LANES];
    for (;;) {
        memset(stuck, 0, sizeof stuck);
        for (int i = 0; i < fp->ntasks; i++)
            if (fp->tasks[i]->accepted && fp->tasks[i]->xs == X_STUCK) stuck[lane_of(fp->tasks[i])]++;
        int ticks = atomic_load(&fp->tick_seq);
        if (ticks > fp->pred_n) {
            ex_report(fp, "a start the model did not predict");
            violation("pool %d: %d starts, the exact model predicted %d", fp->slot, ticks, fp->pred_n);
        }
        tp_stats s = get_stats(fp);
        if (s.completed > (uint64_t)fp->xended) {
            ex_report(fp, "a task ended that the model holds unfinished");
            violation("pool %d: %llu tasks completed, the exact model ended %d", fp->slot,
                      (unsigned long long)s.completed, fp->xended);
        }
        bool ok = ticks == fp->pred_n && s.completed == (uint64_t)fp->xended && s.delayed == 0 &&
                  s.active == (uint32_t)fp->xstuck;
        tp_lane_stats l[FZS_LANES];
        for (int lane = 0; lane < FZS_LANES; lane++) {
            l[lane] = lane_stats(fp, lane + TP_PRIO_MIN);
            ok =
                ok && l[lane].queued == (uint32_t)fp->sim.n[lane] && l[lane].running == (uint32_t)stuck[lane];
        }
        if (ok) break;
        if (tp_now_ns() > end) {
            ex_report(fp, "the pool did not reach the predicted state");
            fprintf(stderr,
                    "  pool: %d starts (model %d), completed %llu (model %d), delayed %u, active %u "
                    "(model %d)\n  lanes queued/running (model):",
                    ticks, fp->pred_n, (unsigned long long)s.completed, fp->xended, s.delayed, s.active,
                    fp->xstuck);
            for (int lane = 0; lane < FZS_LANES; lane++)
                fprintf(stderr, " %u/%u (%d/%d)", l[lane].queued, l[lane].running, fp->sim.n[lane],
                        stuck[lane]);
            fprintf(stderr, "\n");
            violation("pool %d: not in the state the exact model predicted after %llu s", fp->slot,
                      (unsigned long long)(FZ_BOUND_NS / SEC));
        }
        sleep_ns(100000);
    }
    ex_verify(fp);
    uint64_t now = tp_now_ns(), oldest_hi = 0;
    bool any = false;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        if (t->xs == X_GHOST) t->xs = X_END;
        if (t->xs == X_END && !task_ended(t)) set_finalised(t);
        if (t->xs == X_WAIT || t->xs == X_STUCK) note_unfinished(t);
        if (t->xs == X_WAIT) {
            if (!t->xpush_hi) t->xpush_hi = now; /* a retry: back in the queue by now */
            if (!any || t->xpush_hi < oldest_hi) oldest_hi = t->xpush_hi;
            any = true;
        }
    }
    /* oldest_wait_ns: 0 with nothing queued; else at least the time since
     * the push of any waiting task (halved: the histogram clock is
     * calibrated, not exact). */
    uint64_t before = tp_now_ns();
    tp_stats s = get_stats(fp);
    if (!any)
        CHECK(s.oldest_wait_ns == 0, "pool %d: oldest_wait_ns %llu with nothing queued", fp->slot,
              (unsigned long long)s.oldest_wait_ns);
    else if (before - oldest_hi > 4 * MS)
        CHECK(s.oldest_wait_ns >= (before - oldest_hi) / 2,
              "pool %d: oldest_wait_ns %llu, but a task has waited since %llu ns ago", fp->slot,
              (unsigned long long)s.oldest_wait_ns, (unsigned long long)(before - oldest_hi));
}

/* The model takes over: every accepted task has ended or is stuck, which the
 * counters confirm (completed == accepted - stuck, nothing queued, delayed
 * or running but the stuck ones), so the scheduler is empty. */
static void ex_enter(fz_pool *fp) {
    if (fp->exact || !fp->exact_wanted || !fp->live || fp->maybe_forced || atomic_load(&fp->forced)) return;
    if (fp->closed && fp->max_workers > fp->workers) return; /* elastic, closed: workers may be missing */
    for (int k = 0; k < FZ_GROUPS; k++)
        if (fp->grp[k].live && fp->grp[k].coe) return; /* its members may be cancelled at any moment */
    fz_scan sc;
    model_scan(fp, &sc);
    int nstuck = 0, runs = 0;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        runs += atomic_load(&t->runs);
        if (sc.stuck[i]) {
            nstuck++;
            continue;
        }
        if (atomic_load(&t->inside)) return;
    }
    tp_stats s = get_stats(fp);
    if (s.completed + (uint64_t)nstuck != fp->accepted || s.queued || s.delayed ||
        s.active != (uint32_t)nstuck)
        return;
    if (atomic_load(&fp->tick_seq) != runs) return;
    fzs_init(&fp->sim, fp->fair, fp->starve_limit, fp->low_max);
    for (int f = 0; f < FZS_FLOWS; f++) fzs_set_weight(&fp->sim, f, fp->weight[f]);
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        t->xattempt = atomic_load(&t->runs);
        t->xcancel = t->cancel_requested || atomic_load(&t->cancel_ok) || t->kind == K_SELF;
        if (sc.stuck[i]) {
            t->xs = X_STUCK;
            if (t->prio < 0) fp->sim.low_running++;
        } else {
            t->xs = X_END;
            if (!task_ended(t)) set_finalised(t);
        }
    }
    fp->xstuck = nstuck;
    fp->xended = (int)fp->accepted - nstuck;
    fp->pred_base = fp->pred_n = runs;
    fp->npend = 0;
    fp->exact = true;
    trace("  (exact model of slot %d on: %d stuck)", fp->slot, nstuck);
}

enum { O_STUCK, O_RV, O_UNKNOWN };

/* What attempt `attempt` of `t` does once started, as its kind says. */
static int ex_outcome(fz_task *t, int attempt, int *rv) {
    bool retry_possible = attempt < (int)t->max_retries;
    switch (t->kind) {
    case K_SUCCEED: *rv = 0; return O_RV;
    case K_FAIL: *rv = t->result; return O_RV;
    case K_FLAKY: *rv = attempt < t->fail_k ? t->result : 0; return O_RV;
    case K_SELF: /* cancels itself: never retried */
        *rv = t->result;
        t->xcancel = true;
        return O_RV;
    case K_SLEEP: /* a short run timeout races with the sleep: matters only if a retry can follow */
        *rv = 0;
        return short_timeout(t) && retry_possible ? O_UNKNOWN : O_RV;
    case K_GATE_IGNORE:
        if (gate_is_open(t->gate)) {
            *rv = t->result;
            return O_RV;
        }
        return O_STUCK;
    default: /* K_GATE_SLEEP, K_GATE_FD: leave on the run timeout */
        if (gate_is_open(t->gate)) {
            *rv = t->result;
            return O_RV;
        }
        if (short_timeout(t)) {
            *rv = TP_ETIMEDOUT;
            return O_RV;
        }
        return O_STUCK;
    }
}

/* An attempt of `t` ended with rv: it waits for a retry, or it ended.
 * False when that depends on timing: a failure with retries left and a
 * deadline still ahead but near (no retry is scheduled past it). */
static bool ex_end_attempt(fz_pool *fp, fz_task *t, int rv) {
    fzs_done(&fp->sim, lane_of(t));
    int a = t->xattempt - 1;
    bool retry = rv != 0 && !t->xcancel && a < (int)t->max_retries;
    if (retry && (t->dl_class == DL_PAST || t->dl_class == DL_NEAR)) {
        if (tp_now_ns() < t->deadline) return false; /* it may end before or after its deadline */
        retry = false;                               /* it ends after now: past its deadline */
    }
    if (retry) {
        t->xs = X_RETRY;
        t->xpush_hi = 0;
        fp->pend[fp->npend++] = t->index;
    } else {
        t->xs = X_END;
        fp->xended++;
    }
    return true;
}

static uint64_t pend_delay(const fz_task *t) { return t->delay[t->xattempt]; }

/* Retry pend[k] is back: it waits at the back of its lane. */
static void ex_push_pending(fz_pool *fp, int k) {
    fz_task *t = xtask(fp->pend[k]);
    memmove(&fp->pend[k], &fp->pend[k + 1], (size_t)(fp->npend - k - 1) * sizeof fp->pend[0]);
    fp->npend--;
    t->xs = X_WAIT;
    fzs_push(&fp->sim, lane_of(t), ent_of(fp, t));
}

/* Retries come back when due: failed earlier with a delay no longer than a
 * later one's, a retry is due first (and the pool's delayed list, in the
 * order they failed, agrees); otherwise their order is timing's. */
static bool ex_first_pending_is_first(const fz_pool *fp) {
    for (int j = 1; j < fp->npend; j++)
        if (pend_delay(xtask(fp->pend[0])) > pend_delay(xtask(fp->pend[j]))) return false;
    return true;
}

/* Every worker is blocked: the retries come back, in the order they are due
 * (an order only matters within a lane). */
static void ex_flush_pending(fz_pool *fp) {
    for (int i = 0; i < fp->npend; i++)
        for (int j = i + 1; j < fp->npend; j++) {
            const fz_task *a = xtask(fp->pend[i]), *b = xtask(fp->pend[j]);
            if (lane_of(a) == lane_of(b) && pend_delay(a) > pend_delay(b)) {
                ex_lose(fp, "two retries of a lane may come back in either order");
                return;
            }
        }
    while (fp->npend) ex_push_pending(fp, 0);
}

/* Whether retry `r` coming back before the start from lane `li` or after it
 * makes no difference: the same task starts and the states are equal. */
static bool ex_commutes(const fz_pool *fp, int li, const fz_task *r) {
    static fzs a, b;
    a = fp->sim;
    fzs_push(&a, lane_of(r), ent_of(fp, r));
    int la = fzs_pick(&a);
    if (la < 0) return false;
    fzs_ent ea = fzs_start(&a, la);
    b = fp->sim;
    fzs_ent eb = fzs_start(&b, li);
    fzs_push(&b, lane_of(r), ent_of(fp, r));
    return ea.task == eb.task && ea.attempt == eb.attempt && fzs_equal(&a, &b);
}

static void push_pend(const fz_pool *fp, fzs *s, int from, int to) {
    for (int i = from; i < to; i++) {
        const fz_task *r = xtask(fp->pend[i]);
        fzs_push(s, lane_of(r), ent_of(fp, r));
    }
}

/* Several retries wait for their delay, all of one length: they come back in
 * the order they failed, and the service thread may queue several in one
 * pass (a late wake-up), so the ones back by the start from lane `li` are a
 * prefix of the pending list. Whatever prefix it is, the same task must
 * start and the state once all are back must be the same. (Each retry
 * commuting alone is not enough: a retry of a user and one of another user
 * can each come back after a start without changing it, while both back
 * first reorder the fair round.) */
static bool ex_prefixes_commute(const fz_pool *fp, int li) {
    static fzs a, b;
    b = fp->sim;
    fzs_ent eb = fzs_start(&b, li);
    push_pend(fp, &b, 0, fp->npend);
    for (int p = 2; p <= fp->npend; p++) {
        a = fp->sim;
        push_pend(fp, &a, 0, p);
        int la = fzs_pick(&a);
        if (la < 0) return false;
        fzs_ent ea = fzs_start(&a, la);
        push_pend(fp, &a, p, fp->npend);
        if (ea.task != eb.task || ea.attempt != eb.attempt || !fzs_equal(&a, &b)) return false;
    }
    return true;
}

static bool pend_delays_equal(const fz_pool *fp) {
    for (int j = 1; j < fp->npend; j++)
        if (pend_delay(xtask(fp->pend[0])) != pend_delay(xtask(fp->pend[j]))) return false;
    return true;
}

/* Workers are free: the `n` agents (blocked tasks now returning xrv) end
 * their attempts, then free workers take tasks until every worker is blocked
 * or nothing may start. */
static void ex_run(fz_pool *fp, fz_task **agents, int n) {
    if (!fp->exact) return;
    int W = (int)fp->max_workers;
    if (n >= 2) {
        for (int i = 0; i < n; i++) {
            const fz_task *t = agents[i];
            if (t->xrv != 0 && !t->xcancel && t->xattempt - 1 < (int)t->max_retries) {
                ex_lose(fp, "blocked tasks end at once and one may retry");
                return;
            }
        }
        for (int i = 0; i < n; i++) ex_end_attempt(fp, agents[i], agents[i]->xrv); /* none retries */
        if (fzs_startable(&fp->sim) > 0) ex_lose(fp, "workers freed at once while tasks wait");
        return;
    }
    if (n == 1 && !ex_end_attempt(fp, agents[0], agents[0]->xrv)) {
        ex_lose(fp, "a failure that may retry or not, its deadline near");
        return;
    }
    static fzs next;
    for (;;) {
        int free = W - fp->xstuck;
        if (free <= 0) {
            ex_flush_pending(fp);
            return;
        }
        int li = fzs_pick(&fp->sim);
        if (li < 0) {
            if (fp->npend == 0) return; /* idle */
            if (!ex_first_pending_is_first(fp)) {
                ex_lose(fp, "retries that may come back in either order");
                return;
            }
            ex_push_pending(fp, 0);
            continue;
        }
        for (int i = 0; i < fp->npend; i++)
            if (!ex_commutes(fp, li, xtask(fp->pend[i]))) {
                ex_lose(fp, "a retry could come back before a start and change it");
                return;
            }
        if (fp->npend >= 2 && !pend_delays_equal(fp)) {
            ex_lose(fp, "retries of different delays could come back together before a start");
            return;
        }
        if (fp->npend >= 2 && !ex_prefixes_commute(fp, li)) {
            ex_lose(fp, "retries coming back together could change a start");
            return;
        }
        next = fp->sim;
        fzs_ent e = fzs_start(&next, li);
        if (free >= 2 && (fzs_startable(&next) > 0 || fp->npend > 0)) {
            ex_lose(fp, "two free workers could start tasks at once");
            return;
        }
        fp->sim = next;
        fz_task *t = xtask(e.task);
        CHECK(fp->pred_n < FZ_MAX_TICKS && e.attempt < FZ_ATTEMPTS, "harness: too many predicted starts");
        fp->pred_n++;
        fp->pred_task[fp->pred_n] = e.task;
        fp->pred_att[fp->pred_n] = e.attempt;
        t->xattempt = e.attempt + 1;
        int rv = 0;
        switch (ex_outcome(t, e.attempt, &rv)) {
        case O_STUCK:
            t->xs = X_STUCK;
            fp->xstuck++;
            break;
        case O_RV:
            if (!ex_end_attempt(fp, t, rv)) {
                ex_lose(fp, "a failure that may retry or not, its deadline near");
                return;
            }
            break;
        default: ex_lose(fp, "an attempt whose result timing decides"); return;
        }
    }
}

/* An accepted submit: the task waits now (or, with a deadline that has
 * passed or soon will while every worker is blocked, it will expire unrun:
 * a ghost the next sync waits out, which changes nothing the model holds).
 * run: free workers start what the model picks (a batch pushes all its tasks
 * first: they were admitted under one hold of the pool lock). */
static void ex_push_(fz_pool *fp, fz_task *t, bool run) {
    if (!fp->exact) return;
    if (t->grp && t->grp->coe) {
        ex_lose(fp, "a cancel-on-error group");
        return;
    }
    int free = (int)fp->max_workers - fp->xstuck;
    int lane = lane_of(t);
    t->xattempt = 0;
    t->xcancel = false;
    if (t->dl_class == DL_PAST || t->dl_class == DL_NEAR) {
        bool startable = lane >= 2 || fp->sim.low_max == 0 || fp->sim.low_running < fp->sim.low_max;
        if (t->dl_class == DL_NEAR && free > 0 && startable) {
            ex_lose(fp, "a near deadline and a free worker");
            return;
        }
        t->xs = X_GHOST;
        fp->xended++;
        return;
    }
    t->xs = X_WAIT;
    t->xpush_hi = tp_now_ns();
    fzs_push(&fp->sim, lane, ent_of(fp, t));
    if (free > 0 && run) ex_run(fp, NULL, 0);
}

static void ex_push(fz_pool *fp, fz_task *t) { ex_push_(fp, t, true); }

/* Gate g opened: the tasks blocked on it return their result. */
static void ex_gate(fz_pool *fp, int g) {
    if (!fp->live || !fp->exact) return;
    fz_task *agents[FZ_MAX_TASKS];
    int n = 0;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted || t->xs != X_STUCK || t->gate != g) continue;
        t->xrv = t->result;
        t->xs = X_LEAVING;
        fp->xstuck--;
        agents[n++] = t;
    }
    if (n) ex_run(fp, agents, n);
}

/* Open gate g with the model watching: every exact pool is synced first (a
 * gate changes what its blocked tasks do), then told. */
static void harness_open_gate(int g) {
    if (gate_is_open(g)) return;
    for (int s = 0; s < FZ_SLOTS; s++) ex_sync(&fz_pools[s]);
    gate_open(g);
    for (int s = 0; s < FZ_SLOTS; s++) ex_gate(&fz_pools[s], g);
}

/* A cancel (or group cancel) reached `t`, which the model holds waiting or
 * blocked: waiting, it ends unrun; blocked and cooperating, it returns
 * TP_ECANCELED at once (collected in agents); blocked and deaf, it is not
 * retried when its gate opens. */
static void ex_cancelled(fz_pool *fp, fz_task *t, fz_task **agents, int *n) {
    if (!fp->exact) return;
    if (t->xs == X_WAIT) {
        fzs_remove(&fp->sim, t->index);
        t->xs = X_END;
        fp->xended++;
    } else if (t->xs == X_STUCK) {
        t->xcancel = true;
        if (coop_kind(t)) {
            t->xrv = TP_ECANCELED;
            t->xs = X_LEAVING;
            fp->xstuck--;
            agents[(*n)++] = t;
        }
    }
}

/* ------------------------------------------------------------ input decoding */

typedef struct fz_in {
    const uint8_t *p;
    size_t n, i;
} fz_in;

static uint8_t take(fz_in *in) { return in->i < in->n ? in->p[in->i++] : 0; }

/* ------------------------------------------------------------ operations */

static void pool_reset(fz_pool *fp) {
    int slot = fp->slot;
    for (int k = 0; k < FZ_GROUPS; k++) CHECK(!fp->grp[k].live, "harness: a group outlives pool_reset");
    memset(fp, 0, sizeof *fp);
    fp->slot = slot;
}

static const uint64_t retry_ns[4] = {1 * MS, 2 * MS, 4 * MS, 8 * MS};
static const uint64_t drain_ns[4] = {1 * MS, 5 * MS, 20 * MS, 50 * MS};
static const uint64_t submit_ns[4] = {1 * MS, 3 * MS, 10 * MS, 0};
static const unsigned mpu_of[5] = {0, 1, 2, 3, TP_UNLIMITED};
/* Large queues (40..64 places): OP_CREATE3 and OP_BURST */
static const unsigned big_cap_of[8] = {40, 41, 47, 48, 55, 56, 63, 64};

/* Config from 4 bytes. Returns true for a valid one (*c filled, fp's resolved
 * fields set); false for a deliberately invalid one. */
static bool decode_config(fz_pool *fp, const uint8_t b[4], tp_config *c) {
    memset(c, 0, sizeof *c);
    c->workers = 1 + (b[0] >> 1) % 3u;
    unsigned extra = (b[0] >> 3) % 3u;
    c->max_workers = extra ? c->workers + extra : ((b[0] & 0x20) ? c->workers : 0);
    c->queue_capacity = 1 + b[1] % 4u;
    c->max_per_user = mpu_of[(b[1] >> 2) % 5u];
    c->max_retries = (b[1] >> 5) % 4u;
    c->retry_delay_ns = retry_ns[b[2] % 4u];
    static const uint64_t rt[4] = {0, TP_FOREVER, FZ_FAR_NS, 3 * MS};
    c->run_timeout_ns = rt[(b[2] >> 2) % 4u];
    c->drain_timeout_ns = drain_ns[(b[2] >> 4) % 4u];
    static const uint64_t idle[4] = {0, 1 * MS, 5 * MS, TP_FOREVER};
    c->idle_timeout_ns = idle[(b[2] >> 6) % 4u];
    c->submit_timeout_ns = submit_ns[b[3] % 4u];
    /* The name is cosmetic; its bit also doubles the queue (up to 8), so
     * cancels deep inside a longer queue are reachable. */
    c->name = (b[3] & 4) ? "fz" : NULL;
    if (b[3] & 4) c->queue_capacity *= 2;
    fp->slow_hooks = (b[3] & 8) != 0;
    fp->slow_done = (b[3] & 16) != 0;
    /* bit 7 (without bits 5 and 6: an invalid config): the exact model
     * (OP_CREATE2 sets it again) */
    fp->exact_wanted = (b[3] & 0x80) != 0;
    c->log = log_hook;
    c->log_arg = fp;
    c->on_worker_start = hook_start;
    c->on_worker_stop = hook_stop;
    c->hook_arg = fp;
    if ((b[3] & 0xe0) == 0xe0) {
        switch ((b[0] >> 1) % 5u) {
        case 0: c->workers = 2, c->max_workers = 1; break;
        case 1: c->max_retries = TP_MAX_RETRIES + 1; break;
        case 2: c->queue_capacity = TP_MAX_QUEUE_CAPACITY + 1; break;
        case 3: c->workers = TP_MAX_WORKERS + 1; break;
        default: c->name = "a-pool-name-longer-than-31-bytes"; break;
        }
        return false;
    }
    fp->workers = c->workers;
    fp->max_workers = c->max_workers ? c->max_workers : c->workers;
    fp->cap = c->queue_capacity;
    fp->max_per_user = c->max_per_user ? c->max_per_user : 2;
    fp->max_retries = c->max_retries;
    fp->retry_delay = c->retry_delay_ns;
    fp->run_timeout = c->run_timeout_ns ? c->run_timeout_ns : 600 * SEC;
    fp->drain_timeout = c->drain_timeout_ns;
    fp->submit_timeout = c->submit_timeout_ns ? c->submit_timeout_ns : SEC;
    fp->fair = false;
    fp->starve_limit = 16;
    fp->low_max = 0;
    fp->retry_delay_max = 0;
    for (int f = 0; f < FZS_FLOWS; f++) fp->weight[f] = 1;
    return true;
}

/* The 1.2 fields from 3 more bytes (OP_CREATE2): the scheduler, the
 * starvation limit, low_prio_max_running, retry backoff; or one of the
 * invalid 1.2 configs. Called after decode_config accepted b[]. */
static const unsigned starve_of[5] = {0, 1, 2, 3, TP_UNLIMITED};
static bool decode_config12(fz_pool *fp, const uint8_t e[3], tp_config *c) {
    c->sched = (e[0] & 1) ? TP_SCHED_FAIR : TP_SCHED_FIFO;
    c->prio_starve_limit = starve_of[(e[0] >> 1) % 5u];
    c->low_prio_max_running = (e[0] >> 4) % (fp->max_workers + 1);
    static const uint64_t mult[6] = {0, 1, 2, 4, 16, 64}; /* retry_delay_max_ns = retry_delay_ns x this */
    c->retry_delay_max_ns = c->retry_delay_ns * mult[e[1] % 6u];
    if ((e[2] & 0xf0) == 0xf0) {
        switch (e[2] % 5u) {
        case 0: c->sched = 2; break;
        case 1: c->low_prio_max_running = fp->max_workers + 1; break;
        case 2: c->retry_delay_max_ns = c->retry_delay_ns - 1; break;
        case 3: c->reserved32 = 1; break;
        default: c->reserved[4] = 1; break;
        }
        return false;
    }
    fp->fair = c->sched == TP_SCHED_FAIR;
    /* Bit 0 of e[2]: no exact model, so nothing waits for the pool (submits
     * race with the workers as in a 1.1 pool). */
    fp->exact_wanted = !(e[2] & 1);
    fp->starve_limit = c->prio_starve_limit ? c->prio_starve_limit : 16;
    fp->low_max = c->low_prio_max_running;
    fp->retry_delay_max = c->retry_delay_max_ns;
    return true;
}

/* The wait before retry k (k >= 1), as taskpool.h states it. */
static uint64_t retry_delay_k(const fz_pool *fp, unsigned k) {
    if (!fp->retry_delay_max) return fp->retry_delay;
    uint64_t d = fp->retry_delay;
    for (unsigned i = 1; i < k && d < fp->retry_delay_max; i++) d *= 2;
    return d < fp->retry_delay_max ? d : fp->retry_delay_max;
}

static void finish_pool(fz_pool *fp, bool full);
static void op_group_destroy(fz_pool *fp, fz_group *G);
static void finish_groups(fz_pool *fp);

/* e: NULL for a 1.1 config (OP_CREATE), else the 1.2 bytes (OP_CREATE2);
 * big_cap: 0, or the queue capacity of a valid config (OP_CREATE3). */
static void op_create(fz_pool *fp, const uint8_t b[4], const uint8_t *e, unsigned big_cap) {
    if (fp->live) finish_pool(fp, true);
    pool_reset(fp);
    tp_config c;
    bool valid = decode_config(fp, b, &c);
    if (valid && e) valid = decode_config12(fp, e, &c);
    if (valid && big_cap) c.queue_capacity = fp->cap = big_cap;
    tp_pool *p = (tp_pool *)(uintptr_t)0x1;
    int rc = tp_create(&p, &c);
    trace("create slot %d: workers %u max %u cap %u mpu %u retries %u retry %llums rt %llu drain %llums "
          "idle %llu%s -> %s",
          fp->slot, c.workers, c.max_workers, c.queue_capacity, c.max_per_user, c.max_retries,
          (unsigned long long)(c.retry_delay_ns / MS), (unsigned long long)c.run_timeout_ns,
          (unsigned long long)(c.drain_timeout_ns / MS), (unsigned long long)c.idle_timeout_ns,
          fp->slow_hooks ? " slow-hooks" : "", rcname(rc));
    if (e)
        trace("  %s starve %u low_max %u retry max %lluus%s", c.sched == TP_SCHED_FAIR ? "fair" : "fifo",
              c.prio_starve_limit, c.low_prio_max_running, (unsigned long long)(c.retry_delay_max_ns / 1000),
              c.sched > 1 || c.reserved32 || c.reserved[4] ? " (invalid)" : "");
    if (fp->slow_done) trace("  (slow on_done)");
    if (!valid) {
        CHECK(rc == TP_EINVAL && p == (tp_pool *)(uintptr_t)0x1, "tp_create of an invalid config returned %s",
              rcname(rc));
        return;
    }
    CHECK(rc == TP_OK && p != NULL && p != (tp_pool *)(uintptr_t)0x1, "tp_create returned %s", rcname(rc));
    fp->p = p;
    fp->live = true;
    fp->gen = ++fz_pool_gens;
    fzs_init(&fp->sim, fp->fair, fp->starve_limit, fp->low_max);
    fp->exact = fp->exact_wanted; /* an empty pool: the model knows everything */
    if (fp->exact) trace("  (exact model of slot %d on)", fp->slot);
}

static void ensure_pool(fz_pool *fp) {
    if (fp->live) return;
    static const uint8_t zero[4];
    op_create(fp, zero, NULL, 0);
}

/* VIA_BATCH: tp_submit_batch with this one task, which must answer exactly
 * as tp_submit would (SPEC 11.2), with accepted_out and ids_out to match.
 * VIA_PLAIN: tp_submit(p, fn, arg, NULL, NULL), no options and no id asked,
 * or options with only a user and (b[3] & 0x80) an on_done bound to a
 * completion queue: a FIFO pool with fixed workers accepts it without its
 * lock (src/stage.h; with a user, while the user is well below its limit).
 * The task has the pool's defaults and no id (it is never cancelled by id;
 * its tp_ctx_id is not compared); only a bound one has an on_done. */
enum { VIA_SUBMIT, VIA_WAIT, VIA_DEFAULT, VIA_GROUP, VIA_BATCH, VIA_PLAIN };

static fz_group *ensure_group(fz_pool *fp, int k, bool coe);

static fz_cq *ensure_cq(int k, uint8_t b);
static void cq_check_fd(int k, const char *when);

static const int prio_of[8] = {0, 1, -1, 2, -2, 0, 1, -1};

/* A new task of pool fp, in its list, with the pool's defaults. */
static fz_task *task_new(fz_pool *fp) {
    CHECK(fz_ntasks < FZ_MAX_TASKS, "harness: too many tasks");
    fz_task *t = &fz_tasks[fz_ntasks];
    memset(t, 0, sizeof *t);
    t->index = fz_ntasks++;
    t->fp = fp;
    t->pool = fp->p;
    t->pool_gen = fp->gen;
    t->cqi = -1;
    t->must_status = INT_MIN;
    t->qpos = -1;
    t->max_retries = fp->max_retries;
    t->run_timeout = fp->run_timeout;
    for (unsigned k = 1; k < FZ_ATTEMPTS; k++) t->delay[k] = retry_delay_k(fp, k);
    atomic_store(&t->last_rv, INT_MIN);
    t->pidx = fp->ntasks;
    t->w1 = fp->max_workers == 1;
    fp->tasks[fp->ntasks++] = t;
    return t;
}

/* Task t of an OP_SUBMIT-like op from its bytes: its fields and options.
 * in_batch: one of a batch of several (op_batch), which has no deadline that
 * may pass while the batch is admitted. */
static tp_task_opts submit_setup(fz_pool *fp, fz_task *t, const uint8_t b[5], int via, fz_group *G,
                                 bool in_batch) {
    t->grp = G;
    t->group = G ? G->g : NULL;
    t->kind = (b[0] >> 1) % K_COUNT;
    t->user = b[1] % FZ_USERS;
    t->gate = (b[1] >> 3) % FZ_GATES;
    t->dl_class = b[2] % 4;
    static const uint64_t rts[4] = {0, 2 * MS, TP_FOREVER, FZ_FAR_NS};
    uint64_t rt = rts[(b[2] >> 2) % 4];
    static const int results[4] = {0, 1, -77, TP_ETIMEDOUT};
    t->result = results[(b[2] >> 4) % 4];
    t->fail_k = b[2] >> 6;
    if (t->kind == K_FAIL || t->kind == K_FLAKY) t->result = t->result ? t->result : 1;
    t->sleep_ns = (1 + b[4] % 3) * MS;
    t->has_done = (b[3] & 7) != 7;
    t->run_timeout = rt ? rt : fp->run_timeout;
    t->prio = prio_of[(b[0] >> 4) & 7];
    t->cqi = (b[3] & 0x80) ? (b[0] >> 7) & 1 : -1;
    t->nest = (b[4] >> 5) & 1;
    if (via == VIA_PLAIN) { /* the defaults: what a NULL opts means, but the user */
        t->dl_class = DL_NONE;
        rt = 0;
        t->run_timeout = fp->run_timeout;
        t->prio = 0;
        t->has_done = t->cqi >= 0; /* bound: on_done and the queue, nothing else */
        t->nest = t->nest && t->cqi >= 0;
        t->plain = true;
    }
    tp_task_opts o;
    memset(&o, 0, sizeof o);
    o.user = fz_users[t->user];
    o.run_timeout_ns = rt;
    o.priority = t->prio;
    if (t->cqi >= 0) {
        fz_cq *C = ensure_cq(t->cqi, b[4]);
        o.cq = C->q;
        t->cq_gen = C->gen;
    }
    if (t->has_done) o.on_done = task_done;
    if ((b[3] & 8) && via != VIA_PLAIN) {
        snprintf(t->opt_log, sizeof t->opt_log, "L%d", t->index);
        o.log_id = t->opt_log;
        memcpy(t->expect_log, t->opt_log, sizeof t->opt_log);
    } else if (fz_main_log[0]) {
        snprintf(t->expect_log, sizeof t->expect_log, "%s", fz_main_log);
    }
    if (in_batch && near_deadline(t)) t->dl_class = DL_NONE;
    t->submit_ns = tp_now_ns();
    switch (t->dl_class) {
    case DL_PAST: t->deadline = 1; break;
    case DL_NEAR: t->deadline = t->submit_ns + (1 + b[4] % 4) * MS; break;
    case DL_FAR: t->deadline = t->submit_ns + FZ_FAR_NS; break;
    default: t->deadline = 0;
    }
    o.deadline_ns = t->deadline;
    return o;
}

static void op_submit(fz_pool *fp, const uint8_t b[5], int via) {
    ensure_pool(fp);
    ex_sync(fp);
    ex_enter(fp);
    fz_group *G = via == VIA_GROUP ? ensure_group(fp, (b[4] >> 6) & 1, (b[4] >> 7) & 1) : NULL;
    fz_task *t = task_new(fp);
    tp_task_opts o = submit_setup(fp, t, b, via, G, false);
    uint64_t rt = o.run_timeout_ns;

    /* prediction */
    fz_scan sc;
    model_scan(fp, &sc);
    bool ul_certain = false, ul_possible = false;
    if (t->user >= 2 && fp->max_per_user != TP_UNLIMITED) {
        ul_certain = sc.ulo[t->user] >= (int)fp->max_per_user;
        ul_possible = sc.uhi[t->user] >= (int)fp->max_per_user;
    }
    bool full_certain = sc.occ_lo >= (int)fp->cap, full_possible = sc.occ_hi >= (int)fp->cap;
    /* A bound task also needs a place of its queue (after the user's limit
     * and the queue's space): the harness knows them exactly. */
    bool cq_full = t->cqi >= 0 && fz_cqs[t->cqi].taken >= (int)fz_cqs[t->cqi].cap;
    if (cq_full) full_certain = full_possible = true;
    bool blocked_certain = ul_certain || full_certain, blocked_possible = ul_possible || full_possible;
    unsigned allowed;
    uint64_t budget = 0, resolved = 0;
    if (via == VIA_WAIT) {
        static const uint64_t budgets[4] = {0, 1 * MS, 3 * MS, SEC};
        budget = budgets[(b[3] >> 5) % 4];
        resolved = budget ? budget : fp->submit_timeout;
        if (blocked_possible && resolved >= 100 * MS) budget = resolved = 2 * MS;
        if (fp->closed)
            allowed = bit(TP_ECLOSED);
        else if (blocked_certain)
            allowed = bit(TP_ETIMEDOUT);
        else if (blocked_possible || resolved < SEC)
            allowed = B_OK | bit(TP_ETIMEDOUT);
        else
            allowed = B_OK;
    } else if (fp->closed) {
        allowed = bit(TP_ECLOSED);
    } else if (ul_certain) {
        allowed = bit(TP_EUSERLIMIT);
    } else {
        allowed = ul_possible ? bit(TP_EUSERLIMIT) : 0;
        if (full_certain)
            allowed |= bit(TP_EFULL);
        else
            allowed |= B_OK | (full_possible ? bit(TP_EFULL) : 0);
    }
    /* A cancelled group refuses before anything else (after the arguments);
     * a cancel-on-error group may have cancelled itself meanwhile. */
    if (G && G->refusing)
        allowed = bit(TP_ECANCELED);
    else if (G && G->coe)
        allowed |= bit(TP_ECANCELED);
    /* The exact model knows what waits and every user's slots. */
    if (fp->exact) {
        int x;
        if (G && G->refusing) {
            x = TP_ECANCELED;
        } else if (fp->closed) {
            x = TP_ECLOSED;
        } else {
            int slots = 0;
            for (int i = 0; i < fp->ntasks; i++)
                if (fp->tasks[i]->accepted && fp->tasks[i]->user == t->user && fp->tasks[i]->xs != X_END)
                    slots++;
            if (t->user >= 2 && fp->max_per_user != TP_UNLIMITED && slots >= (int)fp->max_per_user)
                x = TP_EUSERLIMIT;
            else if (fzs_total(&fp->sim) >= (int)fp->cap || cq_full)
                x = TP_EFULL;
            else
                x = TP_OK;
            if (via == VIA_WAIT && x != TP_OK) x = TP_ETIMEDOUT;
        }
        CHECK(allowed & bit(x),
              "harness: the exact model predicts %s for this submit, the other model disallows it",
              rcname(x));
        /* a short budget may run out before the lock is taken, room or not */
        allowed = via == VIA_WAIT && x == TP_OK && resolved < SEC ? B_OK | bit(TP_ETIMEDOUT) : bit(x);
    }
    /* A bound task without an on_done is a bad argument: first, counted nowhere. */
    bool einval = t->cqi >= 0 && !t->has_done;
    if (einval) allowed = bit(TP_EINVAL);
    t->obs_unfin = ++fz_obs; /* not admitted yet: certainly unfinished now */

    uint64_t id = 0, t0 = tp_now_ns();
    int rc;
    if (via == VIA_WAIT) {
        rc = tp_submit_wait(fp->p, task_main, t, &o, budget, &id);
    } else if (via == VIA_DEFAULT) {
        CHECK(tp_default_swap(fp->p) == NULL, "tp_default_swap: a default pool was registered");
        CHECK(tp_default() == fp->p, "tp_default() is not the pool just registered");
        rc = tp_default_submit(task_main, t, &o, &id);
        CHECK(tp_default_swap(NULL) == fp->p, "tp_default_swap(NULL) did not return the registered pool");
    } else if (via == VIA_GROUP) {
        rc = tp_group_submit(G->g, task_main, t, &o, &id);
    } else if (via == VIA_BATCH) {
        tp_task bt = {.fn = task_main, .arg = t, .opts = &o};
        size_t k = 99;
        rc = tp_submit_batch(fp->p, &bt, 1, &id, &k);
        CHECK(k == (rc == TP_OK ? 1u : 0u), "submit_batch: %s with accepted_out %zu", rcname(rc), k);
        CHECK(rc == TP_OK || id == 0, "submit_batch: ids_out written for a refused task");
    } else if (via == VIA_PLAIN) {
        tp_task_opts bo;
        memset(&bo, 0, sizeof bo);
        bo.on_done = o.on_done;
        bo.cq = o.cq;
        bo.user = o.user;
        rc = tp_submit(fp->p, task_main, t, t->cqi >= 0 || t->user ? &bo : NULL, NULL);
    } else {
        rc = tp_submit(fp->p, task_main, t, &o, &id);
    }
    uint64_t elapsed = tp_now_ns() - t0;
    trace(
        "%s slot %d task %d %s prio %d cq %d user %s gate %d dl %d rt %llu res %d done %d log %s budget %llu "
        "[occ %d..%d user %d..%d stuck %d] -> %s id %llu",
        via == VIA_WAIT      ? "submit_wait"
        : via == VIA_DEFAULT ? "default_submit"
        : via == VIA_GROUP   ? "group_submit"
        : via == VIA_BATCH   ? "submit_batch"
        : via == VIA_PLAIN   ? "submit_plain"
                             : "submit",
        fp->slot, t->index, kind_name[t->kind], t->prio, t->cqi,
        fz_users[t->user] ? fz_users[t->user] : "NULL", t->gate, t->dl_class, (unsigned long long)rt,
        t->result, t->has_done, o.log_id ? o.log_id : "-", (unsigned long long)budget, sc.occ_lo, sc.occ_hi,
        sc.ulo[t->user], sc.uhi[t->user], sc.nstuck, rcname(rc), (unsigned long long)id);
    expect_rc(rc, allowed, "submit");
    if (rc == TP_EINVAL) return; /* counts nothing */
    if (rc == TP_ECANCELED) {    /* a cancelled group: not counted, not a member */
        CHECK(G != NULL, "submit: TP_ECANCELED without a group");
        G->refusing = true; /* cancelled groups stay so */
        return;
    }
    fp->submitted++;
    switch (rc) {
    case TP_OK:
        CHECK(via == VIA_PLAIN || id != 0, "submit: TP_OK with id 0");
        for (int i = 0; i < fp->ntasks - 1 && id != 0; i++)
            CHECK(!fp->tasks[i]->accepted || fp->tasks[i]->id != id, "submit: id %llu given twice",
                  (unsigned long long)id);
        t->id = id;
        t->accepted = true;
        fp->accepted++;
        if (t->cqi >= 0) fz_cqs[t->cqi].taken++;
        ex_push(fp, t);
        break;
    case TP_EFULL: fp->rej_full++; break;
    case TP_EUSERLIMIT: fp->rej_user++; break;
    case TP_ECLOSED: fp->rej_closed++; break;
    case TP_ETIMEDOUT:
        fp->rej_timeout++;
        CHECK(elapsed >= resolved, "submit_wait: TP_ETIMEDOUT after %llu ns, budget %llu ns",
              (unsigned long long)elapsed, (unsigned long long)resolved);
        break;
    default: break;
    }
}

/* OP_BATCH: tp_submit_batch of n (2..8) tasks made from one submit's bytes
 * (one user, lane and kind; ids asked, so never staged). It admits a prefix,
 * each task checked as tp_submit would check it with the earlier ones of the
 * batch admitted (they are queued: no worker takes one while the batch holds
 * the pool lock). The exact model predicts where the batch is cut and with
 * what; the other model bounds it: the cut is no earlier than the first task
 * that may be refused and no later than the first that must be. */
static void op_batch(fz_pool *fp, const uint8_t b[5], int n) {
    ensure_pool(fp);
    ex_sync(fp);
    ex_enter(fp);
    fz_task *t[FZ_BATCH_MAX];
    tp_task_opts o[FZ_BATCH_MAX];
    tp_task bt[FZ_BATCH_MAX];
    uint64_t ids[FZ_BATCH_MAX];
    fz_scan sc;
    model_scan(fp, &sc); /* before the new tasks are in the pool's list */
    memset(bt, 0, sizeof bt);
    for (int i = 0; i < n; i++) {
        t[i] = task_new(fp);
        o[i] = submit_setup(fp, t[i], b, VIA_BATCH, NULL, true);
        bt[i] = (tp_task){.fn = task_main, .arg = t[i], .opts = &o[i]};
        ids[i] = 0;
    }
    const fz_task *t0 = t[0];
    /* a bound task without an on_done is a bad argument: the batch stops at once */
    bool einval = t0->cqi >= 0 && !t0->has_done;
    bool limited = t0->user >= 2 && fp->max_per_user != TP_UNLIMITED;
    int cq_taken = t0->cqi >= 0 ? fz_cqs[t0->cqi].taken : 0;
    int cq_cap = t0->cqi >= 0 ? (int)fz_cqs[t0->cqi].cap : INT_MAX;
    /* allowed[i]: what task i may get, the tasks before it admitted */
    unsigned allowed[FZ_BATCH_MAX];
    for (int i = 0; i < n; i++) {
        bool ul_certain = limited && sc.ulo[t0->user] + i >= (int)fp->max_per_user;
        bool ul_possible = limited && sc.uhi[t0->user] + i >= (int)fp->max_per_user;
        bool cq_full = cq_taken + i >= cq_cap;
        bool full_certain = sc.occ_lo + i >= (int)fp->cap || cq_full;
        bool full_possible = sc.occ_hi + i >= (int)fp->cap || cq_full;
        unsigned a;
        if (fp->closed) {
            a = bit(TP_ECLOSED);
        } else if (ul_certain) {
            a = bit(TP_EUSERLIMIT);
        } else {
            a = ul_possible ? bit(TP_EUSERLIMIT) : 0;
            a |= full_certain ? bit(TP_EFULL) : B_OK | (full_possible ? bit(TP_EFULL) : 0);
        }
        if (einval) a = bit(TP_EINVAL);
        allowed[i] = a;
    }
    int xcut = -1, xrc = TP_OK; /* the exact model's cut */
    if (fp->exact && !einval) {
        int slots = 0;
        for (int i = 0; i < fp->ntasks; i++)
            if (fp->tasks[i]->accepted && fp->tasks[i]->user == t0->user && fp->tasks[i]->xs != X_END)
                slots++;
        xcut = n;
        for (int i = 0; i < n && xcut == n; i++) {
            int x = fp->closed                                                          ? TP_ECLOSED
                    : limited && slots + i >= (int)fp->max_per_user                     ? TP_EUSERLIMIT
                    : fzs_total(&fp->sim) + i >= (int)fp->cap || cq_taken + i >= cq_cap ? TP_EFULL
                                                                                        : TP_OK;
            CHECK(allowed[i] & bit(x),
                  "harness: the exact model predicts %s for task %d of this batch, the other model disallows "
                  "it",
                  rcname(x), i);
            if (x != TP_OK) xcut = i, xrc = x;
        }
    }
    for (int i = 0; i < n; i++) t[i]->obs_unfin = ++fz_obs;
    size_t k = 99;
    int rc = tp_submit_batch(fp->p, bt, (size_t)n, ids, &k);
    trace("batch slot %d tasks %d..%d -> %s k %zu%s: %s prio %d cq %d user %s gate %d dl %d res %d done %d "
          "[occ %d..%d user %d..%d stuck %d]",
          fp->slot, t0->index, t0->index + n - 1, rcname(rc), k, xcut >= 0 ? " (exact)" : "",
          kind_name[t0->kind], t0->prio, t0->cqi, fz_users[t0->user] ? fz_users[t0->user] : "NULL", t0->gate,
          t0->dl_class, t0->result, t0->has_done, sc.occ_lo, sc.occ_hi, sc.ulo[t0->user], sc.uhi[t0->user],
          sc.nstuck);
    atomic_fetch_add(&fz_checked, 1);
    CHECK(k <= (size_t)n && (rc == TP_OK) == (k == (size_t)n),
          "tp_submit_batch of %d tasks: %s with accepted_out %zu", n, rcname(rc), k);
    for (size_t i = 0; i < k; i++)
        CHECK(allowed[i] & B_OK, "tp_submit_batch of %d: task %zu admitted, the model allows only refusals",
              n, i);
    if (k < (size_t)n) expect_rc(rc, allowed[k], "tp_submit_batch: the task where the batch stopped");
    if (xcut >= 0) {
        CHECK(k == (size_t)xcut && rc == xrc,
              "tp_submit_batch of %d: the exact model cuts it at %d with %s; it stopped at %zu with %s", n,
              xcut, rcname(xrc), k, rcname(rc));
        atomic_fetch_add(&fz_exact, 1);
    }
    for (size_t i = k; i < (size_t)n; i++)
        CHECK(ids[i] == 0, "tp_submit_batch wrote ids_out[%zu] of a task not admitted", i);
    if (rc == TP_EINVAL) return; /* counts nothing */
    for (size_t i = 0; i < k; i++) {
        fz_task *ti = t[i];
        CHECK(ids[i] != 0, "tp_submit_batch: task %zu admitted with id 0", i);
        for (int j = 0; j < fp->ntasks; j++)
            CHECK(fp->tasks[j] == ti || !fp->tasks[j]->accepted || fp->tasks[j]->id != ids[i],
                  "tp_submit_batch: id %llu given twice", (unsigned long long)ids[i]);
        ti->id = ids[i];
        ti->accepted = true;
        fp->submitted++;
        fp->accepted++;
        if (ti->cqi >= 0) fz_cqs[ti->cqi].taken++;
        ex_push_(fp, ti, false);
    }
    if (fp->exact && k > 0 && (int)fp->max_workers - fp->xstuck > 0) ex_run(fp, NULL, 0);
    if (k == (size_t)n) return;
    fp->submitted++;
    switch (rc) {
    case TP_EFULL: fp->rej_full++; break;
    case TP_EUSERLIMIT: fp->rej_user++; break;
    case TP_ECLOSED: fp->rej_closed++; break;
    default: violation("tp_submit_batch: a refusal %s the model cannot count", rcname(rc));
    }
}

/* Wait, bounded, for the task's on_done to have returned. */
static void await_done(const fz_task *t, const char *why) {
    uint64_t end = tp_now_ns() + FZ_BOUND_NS;
    while (atomic_load(&t->done_calls) == 0) {
        if (tp_now_ns() > end)
            violation("task %d: no on_done %llu s after %s", t->index,
                      (unsigned long long)(FZ_BOUND_NS / SEC), why);
        sleep_ns(100000);
    }
}

static void op_cancel(fz_pool *fp, uint8_t sel, uint8_t extra) {
    ensure_pool(fp);
    ex_sync(fp);
    ex_enter(fp);
    fz_task *acc[FZ_MAX_TASKS];
    int n = 0;
    uint64_t max_id = 0;
    bool any_plain = false;
    for (int i = 0; i < fp->ntasks; i++)
        if (fp->tasks[i]->accepted) {
            if (fp->tasks[i]->plain) { /* no id known: not cancelled by id */
                any_plain = true;
                continue;
            }
            acc[n++] = fp->tasks[i];
            if (fp->tasks[i]->id > max_id) max_id = fp->tasks[i]->id;
        }
    int k = sel % (n + 2);
    if (k == n) {
        int rc = tp_cancel(fp->p, 0);
        trace("cancel slot %d id 0 -> %s", fp->slot, rcname(rc));
        expect_rc(rc, bit(TP_EINVAL), "tp_cancel(id 0)");
        return;
    }
    if (k == n + 1) {
        /* above every id given so far, or, with tasks whose id the harness
         * does not know, above any id the pool will give */
        uint64_t id = any_plain ? UINT64_MAX - extra : max_id + 1 + extra;
        int rc = tp_cancel(fp->p, id);
        trace("cancel slot %d unknown id %llu -> %s", fp->slot, (unsigned long long)id, rcname(rc));
        expect_rc(rc, bit(TP_ENOTFOUND), "tp_cancel(unknown id)");
        return;
    }
    fz_task *t = acc[n - 1 - k]; /* the newest first */
    int ti = -1;
    for (int i = 0; i < fp->ntasks; i++)
        if (fp->tasks[i] == t) ti = i;
    fz_scan sc;
    model_scan(fp, &sc);
    bool parked = sc.parked[ti];
    unsigned allowed;
    if (task_ended(t))
        allowed = bit(TP_ENOTFOUND);
    else if (sc.stuck[ti] || parked)
        allowed = B_OK;
    else
        allowed = B_OK | bit(TP_ENOTFOUND);
    if (fp->exact) { /* synced: the model knows where the task is */
        unsigned x = t->xs == X_END ? bit(TP_ENOTFOUND) : B_OK;
        CHECK(allowed & x,
              "harness: the exact model predicts %s for this cancel, the other model disallows it",
              rcname(t->xs == X_END ? TP_ENOTFOUND : TP_OK));
        allowed = x;
        parked = t->xs == X_WAIT; /* queued for certain: it ends now */
    }
    t->cancel_requested = true;
    int runs_before = atomic_load(&t->runs);
    int rc = tp_cancel(fp->p, t->id);
    trace("cancel slot %d task %d id %llu (%s, stuck %d parked %d ended %d) -> %s", fp->slot, t->index,
          (unsigned long long)t->id, kind_name[t->kind], sc.stuck[ti], parked, task_ended(t), rcname(rc));
    expect_rc(rc, allowed, "tp_cancel");
    if (rc != TP_OK) return;
    atomic_store(&t->cancel_ok, 1);
    if (fp->exact) {
        fz_task *agents[1];
        int na = 0;
        ex_cancelled(fp, t, agents, &na);
        if (na) ex_run(fp, agents, na);
    }
    if (parked) {
        /* Queued or waiting for a retry while every worker is busy: it ends
         * now, unrun, and its on_done runs promptly on the service thread. */
        set_finalised(t);
        if (t->has_done && t->cqi >= 0) {
            t->must_status = TP_ECANCELED; /* its completion waits in its queue */
        } else if (t->has_done) {
            await_done(t, "cancelling it while every worker was busy");
            CHECK(atomic_load(&t->done_status) == TP_ECANCELED, "task %d: cancelled while queued, status %d",
                  t->index, atomic_load(&t->done_status));
        }
        CHECK(atomic_load(&t->runs) == runs_before, "task %d ran after being cancelled in the queue",
              t->index);
    }
}

/* Poll until the pool is quiescent: every accepted task has ended, or is
 * stuck, or is parked behind stuck workers. Tasks without on_done are not
 * observable and do not count. A pool that does not get there is a lost
 * wake-up or a lost task. */
/* Every accepted task that is not certainly unfinished (stuck, parked) has
 * ended, when stats.completed says so: then they are all finalised. The only
 * way to see that a bound task ended without draining its queue. */
static bool count_rule(fz_pool *fp, const fz_scan *sc) {
    int certain = 0;
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (t->accepted && !task_ended(t) && (sc->stuck[i] || sc->parked[i])) certain++;
    }
    tp_stats s = get_stats(fp);
    CHECK(s.completed + (uint64_t)certain <= fp->accepted,
          "pool %d: stats.completed %llu, yet %d of the %llu accepted tasks are certainly unfinished",
          fp->slot, (unsigned long long)s.completed, certain, (unsigned long long)fp->accepted);
    if (s.completed + (uint64_t)certain < fp->accepted) return false;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (t->accepted && !task_ended(t) && !sc->stuck[i] && !sc->parked[i]) set_finalised(t);
    }
    return true;
}

static bool quiescent(fz_pool *fp) {
    fz_scan sc;
    model_scan(fp, &sc);
    bool need_count = false, tolerant = false;
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (!t->accepted || task_ended(t) || sc.stuck[i] || sc.parked[i]) continue;
        if (sc.settled[i]) { /* stuck or parked for now: its group may still cancel it */
            tolerant = true;
            continue;
        }
        /* Closed: an elastic pool starts no worker any more, so a task may
         * wait behind its stuck minimum workers. */
        if (fp->closed && sc.nstuck_now >= (int)fp->workers) {
            tolerant = true;
            continue;
        }
        if (t->has_done && t->cqi < 0) return false; /* its on_done will show it */
        if (t->cqi >= 0) need_count = true;          /* only the counters show that it ended */
    }
    if (!need_count || tolerant) return true;
    return count_rule(fp, &sc);
}

static void settle(fz_pool *fp) {
    if (!fp->live) return;
    ex_sync(fp);
    uint64_t end = tp_now_ns() + FZ_BOUND_NS;
    while (!quiescent(fp)) {
        if (tp_now_ns() > end) {
            tp_stats s = get_stats(fp);
            fprintf(stderr, "fuzz_pool: pool %d stats: active %u queued %u delayed %u workers %u idle %u\n",
                    fp->slot, s.active, s.queued, s.delayed, s.workers, s.idle);
            for (int i = 0; i < fp->ntasks; i++) {
                const fz_task *t = fp->tasks[i];
                fprintf(stderr, "  task %d %s acc %d runs %d inside %d done %d gate %d open %d\n", t->index,
                        kind_name[t->kind], t->accepted, atomic_load(&t->runs), atomic_load(&t->inside),
                        atomic_load(&t->done_calls), t->gate, gate_is_open(t->gate));
            }
            violation("pool %d not quiescent after %llu s", fp->slot,
                      (unsigned long long)(FZ_BOUND_NS / SEC));
        }
        sleep_ns(100000);
    }
    ex_enter(fp);
}

static void mark_forced(fz_pool *fp, const fz_scan *before) {
    /* Forced: queued and retry-waiting tasks were ended unrun (parked ones for
     * certain); running ones see cancellation. */
    for (int i = 0; i < fp->ntasks; i++)
        if (before->parked[i]) {
            /* queued or waiting for a retry: TP_ECANCELED, unrun (through
             * its queue for a bound task) */
            set_finalised(fp->tasks[i]);
            fp->tasks[i]->must_status = TP_ECANCELED;
        }
    fp->maybe_forced = true;
    atomic_store(&fp->forced, 1);
}

/* tp_shutdown returned TP_OK or tp_wait returned: every on_done has returned
 * -- or, for a bound task, its completion is in its queue. */
static void check_all_done_now(const fz_pool *fp, const char *after) {
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted) continue;
        if (t->cqi >= 0)
            set_finalised(t);
        else if (t->has_done)
            CHECK(atomic_load(&t->done_calls) == 1,
                  "pool %d task %d: on_done has not returned when %s returned", fp->slot, t->index, after);
    }
}

static void op_shutdown(fz_pool *fp, uint8_t cls) {
    ensure_pool(fp);
    ex_sync(fp);
    if (fp->xstuck > 0 || fp->max_workers > fp->workers) ex_lose(fp, "a shutdown");
    fz_scan sc;
    model_scan(fp, &sc);
    static const uint64_t budgets[4] = {0, 1 * MS, 5 * MS, FZ_LONG_NS};
    uint64_t budget = budgets[cls % 4];
    if (budget == FZ_LONG_NS && sc.nblockers > 0) budget = 2 * MS;
    uint64_t resolved = budget ? budget : fp->drain_timeout;
    unsigned allowed;
    if (fp->shut_called)
        allowed = bit(fp->shut_rc);
    else if (sc.nstuck > 0)
        allowed = bit(TP_ETIMEDOUT);
    else if (resolved >= FZ_LONG_NS)
        allowed = B_OK;
    else
        allowed = B_OK | bit(TP_ETIMEDOUT);
    uint64_t t0 = tp_now_ns();
    int rc = tp_shutdown(fp->p, budget);
    uint64_t elapsed = tp_now_ns() - t0;
    trace("shutdown slot %d budget %llu [stuck %d blockers %d] -> %s", fp->slot, (unsigned long long)budget,
          sc.nstuck, sc.nblockers, rcname(rc));
    expect_rc(rc, allowed, "tp_shutdown");
    if (!fp->shut_called && rc == TP_ETIMEDOUT)
        CHECK(elapsed >= resolved, "tp_shutdown: TP_ETIMEDOUT after %llu ns, budget %llu ns",
              (unsigned long long)elapsed, (unsigned long long)resolved);
    if (!fp->shut_called && rc == TP_ETIMEDOUT) mark_forced(fp, &sc);
    if (rc != TP_OK) ex_lose(fp, "a forced shutdown");
    fp->closed = true;
    fp->shut_called = true;
    fp->shut_rc = rc;
    if (rc == TP_OK) check_all_done_now(fp, "tp_shutdown");
}

static void op_wait(fz_pool *fp, uint8_t cls) {
    ensure_pool(fp);
    fz_scan sc;
    model_scan(fp, &sc);
    bool can_finish = fp->closed && sc.nblockers == 0;
    static const uint64_t tos[4] = {0, 1 * MS, 3 * MS, FZ_LONG_NS};
    uint64_t to = tos[cls % 4];
    if (!can_finish && (to == 0 || to == FZ_LONG_NS)) to = 2 * MS;
    bool forced = atomic_load(&fp->forced) != 0;
    unsigned allowed;
    if (!fp->closed || forced || sc.nstuck > 0)
        allowed = bit(TP_ETIMEDOUT);
    else if (to == 0 || to == FZ_LONG_NS)
        allowed = B_OK;
    else
        allowed = B_OK | bit(TP_ETIMEDOUT);
    uint64_t t0 = tp_now_ns();
    int rc = tp_wait(fp->p, to);
    uint64_t elapsed = tp_now_ns() - t0;
    trace("wait slot %d timeout %llu [closed %d stuck %d blockers %d] -> %s", fp->slot,
          (unsigned long long)to, fp->closed, sc.nstuck, sc.nblockers, rcname(rc));
    expect_rc(rc, allowed, "tp_wait");
    if (rc == TP_ETIMEDOUT && !forced)
        CHECK(elapsed >= to, "tp_wait: TP_ETIMEDOUT after %llu ns, timeout %llu ns",
              (unsigned long long)elapsed, (unsigned long long)to);
    if (rc == TP_OK) {
        check_all_done_now(fp, "tp_wait");
        check_at_rest(fp);
    }
}

static void op_stats(fz_pool *fp) {
    ensure_pool(fp);
    trace("stats slot %d", fp->slot);
    check_running(fp, true);
    tp_stats s = get_stats(fp);
    check_format(&s);
}

/* Shut down, wait, check at rest (full) and destroy; or just destroy. Gates
 * that would keep tp_destroy waiting forever are opened first. */
static void finish_pool(fz_pool *fp, bool full) {
    if (!fp->live) return;
    ex_sync(fp);
    ex_lose(fp, "the pool is finished");
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!t->accepted || task_ended(t)) continue;
        if (full || t->kind == K_GATE_IGNORE) harness_open_gate(t->gate);
    }
    if (full) {
        /* groups first (their members drain: every gate is open) */
        for (int k = 0; k < FZ_GROUPS; k++)
            if (fp->grp[k].live) op_group_destroy(fp, &fp->grp[k]);
        uint64_t t0 = tp_now_ns();
        int rc = tp_shutdown(fp->p, FZ_BOUND_NS);
        trace("finish slot %d: shutdown -> %s", fp->slot, rcname(rc));
        expect_rc(rc, fp->shut_called ? bit(fp->shut_rc) : B_OK, "tp_shutdown at the end");
        if (!fp->shut_called) fp->shut_rc = rc;
        fp->shut_called = fp->closed = true;
        rc = tp_wait(fp->p, FZ_BOUND_NS);
        trace("finish slot %d: wait -> %s", fp->slot, rcname(rc));
        CHECK(tp_now_ns() - t0 < FZ_BOUND_NS, "pool %d did not drain in %llu s", fp->slot,
              (unsigned long long)(FZ_BOUND_NS / SEC));
        expect_rc(rc, bit(fp->shut_rc), "tp_wait at the end");
        check_at_rest(fp);
        CHECK(tp_destroy(fp->p) == TP_OK, "tp_destroy failed");
    } else {
        if (!fp->shut_called) fp->maybe_forced = true; /* its drain may be forced */
        int rc = tp_destroy(fp->p);
        trace("destroy slot %d -> %s", fp->slot, rcname(rc));
        CHECK(rc == TP_OK, "tp_destroy returned %s", rcname(rc));
        check_tasks_ended(fp);
        finish_groups(fp); /* they outlived their pool */
    }
    /* Completions of this pool may still wait in their queues: their
     * statuses are fixed now, for the drain after the pool is gone. */
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (t->accepted && t->cqi >= 0 && !t->fin_allowed_set) {
            t->fin_allowed = final_allowed(fp, t);
            t->fin_allowed_set = true;
        }
    }
    fp->live = false;
    fp->p = NULL;
    for (int k = 0; k < FZ_CQS; k++)
        if (fz_cqs[k].live) cq_check_fd(k, "after its pool was destroyed");
}

/* A second application thread: after 2 ms it closes or shuts down the pool
 * while the harness thread is blocked in a call on it. */
typedef struct fz_helper {
    tp_pool *p;
    int what; /* 0: tp_close, 1: tp_shutdown(budget) */
    uint64_t budget;
    int rc;
} fz_helper;

static void *helper_main(void *arg) {
    fz_helper *h = (fz_helper *)arg;
    sleep_ns(2 * MS);
    h->rc = h->what == 0 ? tp_close(h->p) : tp_shutdown(h->p, h->budget);
    return NULL;
}

static void op_concurrent_drain(fz_pool *fp, int mode, uint8_t b1);

static void op_concurrent(fz_pool *fp, const uint8_t b[5]) {
    ensure_pool(fp);
    int mode = (b[0] >> 1) % 5;
    if (mode == 4) {
        op_concurrent_drain(fp, mode, b[1]); /* queues only: the pool is not touched */
        return;
    }
    ex_sync(fp);
    ex_lose(fp, "a second thread");
    fz_scan sc;
    model_scan(fp, &sc);
    fz_helper h = {fp->p, mode == 2, 3 * MS, 99};
    pthread_t th;
    if (mode == 0) {
        /* submit_wait blocked for room when the close comes: TP_ECLOSED at
         * once; with room it may be accepted first. */
        fz_task *t = task_new(fp);
        t->kind = K_SUCCEED;
        t->user = b[1] % FZ_USERS;
        t->has_done = true;
        if (fz_main_log[0]) snprintf(t->expect_log, sizeof t->expect_log, "%s", fz_main_log);
        /* bit 7: bound to a queue (a full queue's place is waited for too) */
        if (b[1] & 0x80) t->cqi = (b[1] >> 6) & 1;
        bool ul_certain =
            t->user >= 2 && fp->max_per_user != TP_UNLIMITED && sc.ulo[t->user] >= (int)fp->max_per_user;
        bool blocked = ul_certain || sc.occ_lo >= (int)fp->cap;
        tp_task_opts o;
        memset(&o, 0, sizeof o);
        o.user = fz_users[t->user];
        o.on_done = task_done;
        if (t->cqi >= 0) {
            fz_cq *C = ensure_cq(t->cqi, b[1]);
            o.cq = C->q;
            t->cq_gen = C->gen;
            blocked = blocked || C->taken >= (int)C->cap;
        }
        t->submit_ns = tp_now_ns();
        CHECK(pthread_create(&th, NULL, helper_main, &h) == 0, "harness: pthread_create");
        uint64_t id = 0, t0 = tp_now_ns();
        t->obs_unfin = ++fz_obs;
        int rc = tp_submit_wait(fp->p, task_main, t, &o, FZ_LONG_NS, &id);
        uint64_t el = tp_now_ns() - t0;
        pthread_join(th, NULL);
        trace("concurrent slot %d: submit_wait task %d user %s [blocked %d closed %d] while closing -> %s "
              "(%llu us)",
              fp->slot, t->index, o.user ? o.user : "NULL", blocked, fp->closed, rcname(rc),
              (unsigned long long)(el / 1000));
        expect_rc(rc, fp->closed || blocked ? bit(TP_ECLOSED) : B_OK | bit(TP_ECLOSED),
                  "submit_wait during a close");
        CHECK(el < FZ_LONG_NS, "submit_wait was not woken by the close");
        fp->submitted++;
        if (rc == TP_OK) {
            t->id = id;
            t->accepted = true;
            fp->accepted++;
            if (t->cqi >= 0) fz_cqs[t->cqi].taken++;
        } else {
            fp->rej_closed++;
        }
        fp->closed = true;
        return;
    }
    if (mode == 3) {
        op_concurrent_drain(fp, mode, b[1]);
        return;
    }
    if (mode == 1) {
        /* tp_wait alone waits for someone else's close. */
        bool drains = sc.nblockers == 0 && !atomic_load(&fp->forced);
        uint64_t to = drains ? FZ_LONG_NS : 10 * MS;
        CHECK(pthread_create(&th, NULL, helper_main, &h) == 0, "harness: pthread_create");
        uint64_t t0 = tp_now_ns();
        int rc = tp_wait(fp->p, to);
        uint64_t el = tp_now_ns() - t0;
        pthread_join(th, NULL);
        trace("concurrent slot %d: wait %llu while closing [stuck %d blockers %d] -> %s", fp->slot,
              (unsigned long long)to, sc.nstuck, sc.nblockers, rcname(rc));
        unsigned allowed = atomic_load(&fp->forced) || sc.nstuck > 0 ? bit(TP_ETIMEDOUT)
                           : drains                                  ? B_OK
                                                                     : B_OK | bit(TP_ETIMEDOUT);
        expect_rc(rc, allowed, "tp_wait during a close");
        if (rc == TP_ETIMEDOUT && !atomic_load(&fp->forced)) CHECK(el >= to, "tp_wait timed out early");
        fp->closed = true;
        if (rc == TP_OK) {
            check_all_done_now(fp, "tp_wait");
            check_at_rest(fp);
        }
        return;
    }
    /* Two shutdowns at once: one countdown, one outcome, the same result. */
    CHECK(pthread_create(&th, NULL, helper_main, &h) == 0, "harness: pthread_create");
    sleep_ns(2 * MS);
    uint64_t t0 = tp_now_ns();
    int rc = tp_shutdown(fp->p, 3 * MS);
    uint64_t el = tp_now_ns() - t0;
    pthread_join(th, NULL);
    trace("concurrent slot %d: two shutdowns [stuck %d shut before %d] -> %s and %s", fp->slot, sc.nstuck,
          fp->shut_called, rcname(rc), rcname(h.rc));
    unsigned allowed = fp->shut_called ? bit(fp->shut_rc)
                       : sc.nstuck > 0 ? bit(TP_ETIMEDOUT)
                                       : B_OK | bit(TP_ETIMEDOUT);
    expect_rc(rc, allowed, "tp_shutdown concurrent with another");
    CHECK(rc == h.rc, "two concurrent tp_shutdown calls returned %s and %s", rcname(rc), rcname(h.rc));
    CHECK(el < FZ_LONG_NS, "tp_shutdown took %llu ns", (unsigned long long)el);
    if (!fp->shut_called && rc == TP_ETIMEDOUT) mark_forced(fp, &sc);
    fp->closed = fp->shut_called = true;
    fp->shut_rc = rc;
    if (rc == TP_OK) check_all_done_now(fp, "tp_shutdown");
}

static int nop_task(tp_ctx *c, void *arg) {
    (void)c;
    (void)arg;
    violation("a task submitted with invalid arguments ran");
}

static void op_invalid(fz_pool *fp, uint8_t what) {
    ensure_pool(fp);
    tp_task_opts o;
    memset(&o, 0, sizeof o);
    char longs[TP_USER_MAX + 2];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    uint64_t id = 42;
    int rc = 0, w = what % 18;
    tp_cq *q = (tp_cq *)(uintptr_t)0x1;
    switch (w) {
    case 0: rc = tp_submit(NULL, task_main, NULL, NULL, &id); break;
    case 1: rc = tp_submit(fp->p, NULL, NULL, NULL, &id); break;
    case 2:
        o.priority = what & 16 ? TP_PRIO_MAX + 1 : TP_PRIO_MIN - 1;
        rc = tp_submit(fp->p, nop_task, NULL, &o, &id);
        break;
    case 3:
        o.user = longs;
        rc = tp_submit(fp->p, nop_task, NULL, &o, &id);
        break;
    case 4:
        o.log_id = longs;
        rc = tp_submit_wait(fp->p, nop_task, NULL, &o, MS, &id);
        break;
    case 5: rc = tp_submit_wait(fp->p, NULL, NULL, NULL, MS, &id); break;
    case 6: rc = tp_cancel(NULL, 1); break;
    case 7: rc = tp_close(NULL); break;
    case 8: rc = tp_shutdown(NULL, 1); break;
    case 9: rc = tp_wait(NULL, 1); break;
    case 10: rc = tp_destroy(NULL); break;
    case 12:
        rc = tp_cq_create(&q, (what / 18) & 1 ? TP_MAX_QUEUE_CAPACITY + 1 : 0);
        CHECK(q == (tp_cq *)(uintptr_t)0x1, "tp_cq_create wrote *out on TP_EINVAL");
        break;
    case 13: rc = tp_cq_create(NULL, 1); break;
    case 14:
        CHECK(tp_cq_fd(NULL) == TP_EINVAL && tp_cq_drain(NULL, 0) == TP_EINVAL &&
                  tp_cq_wait(NULL, 0) == TP_EINVAL,
              "tp_cq_fd/drain/wait(NULL) is not TP_EINVAL");
        rc = tp_cq_destroy(NULL);
        break;
    case 15: rc = tp_user_weight_set(NULL, "u0", 2); break;
    case 16: rc = tp_lane_stats_get(fp->p, (what / 18) & 1 ? 3 : -3, NULL); break;
    case 17: { /* a bound task without an on_done, in a batch of two: the first is cut */
        tp_cq *cq = ensure_cq(0, 0)->q;
        tp_task_opts bad;
        memset(&bad, 0, sizeof bad);
        bad.cq = cq;
        tp_task tasks[2] = {{.fn = nop_task, .opts = &bad}, {.fn = nop_task}};
        size_t k = 7;
        rc = tp_submit_batch(fp->p, tasks, 2, NULL, &k);
        CHECK(k == 0, "tp_submit_batch: accepted_out %zu for a first task without on_done", k);
        break;
    }
    default:
        rc = TP_EINVAL;
        tp_stats_get(NULL, NULL);
        tp_stats_get(fp->p, NULL);
        CHECK(tp_user_active(NULL, "u0") == 0 && tp_user_active(fp->p, NULL) == 0 &&
                  tp_user_active(fp->p, "") == 0,
              "tp_user_active of no user is not 0");
        for (int c = 1; c >= TP_EBUSY - 2; c--)
            CHECK(tp_strerror(c) && tp_err_name(c), "tp_strerror/tp_err_name(%d) is NULL", c);
        CHECK(tp_default() == NULL, "a default pool is registered");
        CHECK(tp_default_submit(task_main, NULL, NULL, NULL) == TP_ENODEFAULT,
              "tp_default_submit without a default");
        CHECK(tp_default_shutdown(1) == TP_ENODEFAULT && tp_default_wait(1) == TP_ENODEFAULT,
              "tp_default_shutdown/wait without a default");
        break;
    }
    trace("invalid slot %d case %d -> %s", fp->slot, w, rcname(rc));
    expect_rc(rc, bit(TP_EINVAL), "an invalid call");
}

/* ------------------------------------------------------------ completion queues */

/*
 * The model of a completion queue (taskpool.h section 15): its places are
 * exactly the accepted bound tasks whose on_done has not run (the harness is
 * the only drainer), so TP_EFULL for want of a place and TP_EBUSY are exact.
 * A completion is in the queue from the task's end to its drain; the model
 * knows a bound task has ended when its pool said so (a cancel while it was
 * queued, a forced shutdown that dropped it, tp_wait, the counters: see
 * count_rule, the exact model's sync) and that it has not when it is stuck or
 * parked. That bounds how many completions wait ([lo, hi]), which a drain's
 * count, the descriptor and tp_cq_wait must agree with. Order: a task known
 * ended before another was seen unfinished is drained first; in a pool with
 * one worker, tasks that ended by running end in the order their last
 * attempts started.
 */

static fz_cq *ensure_cq(int k, uint8_t b) {
    fz_cq *C = &fz_cqs[k];
    if (C->live) return C;
    unsigned cap = 1 + (b >> 1) % 4u;
    tp_cq *q = (tp_cq *)(uintptr_t)0x1;
    int rc = tp_cq_create(&q, cap);
    trace("cq create #%d capacity %u -> %s", k, cap, rcname(rc));
    CHECK(rc == TP_OK && q != NULL && q != (tp_cq *)(uintptr_t)0x1, "tp_cq_create(%u) returned %s", cap,
          rcname(rc));
    int fd = tp_cq_fd(q);
    CHECK(fd >= 0, "tp_cq_fd of a new queue returned %d", fd);
    static int gens;
    memset(C, 0, sizeof *C);
    C->q = q;
    C->live = true;
    C->cap = cap;
    C->gen = ++gens;
    return C;
}

/* tp_cq_drain on this thread, recorded so that bound_done can tell it runs
 * inside it and in which call. */
static int cq_drain_call(int k, unsigned max) {
    fz_cq *C = &fz_cqs[k];
    int d = fz_drain_depth;
    fz_drain_cq[d] = k;
    fz_drain_call[d] = atomic_fetch_add(&C->calls, 1) + 1;
    fz_drain_runs[d] = 0;
    fz_drain_depth = d + 1;
    int rc = tp_cq_drain(C->q, max);
    fz_drain_depth = d;
    CHECK(rc >= 0 && rc == fz_drain_runs[d] && (max == 0 || rc <= (int)max),
          "tp_cq_drain(#%d, max %u) returned %d after %d on_done calls", k, max, rc, fz_drain_runs[d]);
    atomic_fetch_add(&C->ran, rc);
    return rc;
}

/* Whether the model knows `t` (bound, accepted, not drained) is unfinished:
 * stuck or parked, or held waiting, blocked or retrying by the exact model
 * (whose predictions hold whatever a queue does). */
static bool cq_task_unfinished(fz_task *t, fz_scan *sc, const bool *scanned) {
    fz_pool *fp = t->fp;
    if (!fp->live || fp->gen != t->pool_gen) return false;
    if (scanned[fp->slot] && (sc[fp->slot].stuck[t->pidx] || sc[fp->slot].parked[t->pidx])) return true;
    return fp->exact && t->xs != X_END && t->xs != X_GHOST;
}

/* How many completions wait in queue k: at least *lo, at most *hi; known[i]
 * marks the tasks whose completion certainly waits. */
static void cq_bounds(int k, int *lo, int *hi, bool *known) {
    fz_scan sc[FZ_SLOTS];
    bool scanned[FZ_SLOTS] = {false};
    for (int s = 0; s < FZ_SLOTS; s++)
        if (fz_pools[s].live) {
            model_scan(&fz_pools[s], &sc[s]);
            scanned[s] = true;
        }
    *lo = *hi = 0;
    for (int i = 0; i < fz_ntasks; i++) {
        fz_task *t = &fz_tasks[i];
        if (known) known[i] = false;
        if (t->cqi != k || !t->accepted || atomic_load(&t->done_enter)) continue;
        if (task_ended(t)) {
            ++*lo;
            ++*hi;
            if (known) known[i] = true;
        } else if (!cq_task_unfinished(t, sc, scanned)) {
            ++*hi;
        }
    }
}

static bool cq_readable(const fz_cq *C) {
    struct pollfd pf = {tp_cq_fd(C->q), POLLIN, 0};
    int n;
    do n = poll(&pf, 1, 0); /* a signal (libFuzzer's timers) may interrupt even a 0 timeout */
    while (n < 0 && errno == EINTR);
    CHECK(n >= 0, "poll on tp_cq_fd failed: %s", strerror(errno));
    return n == 1 && (pf.revents & POLLIN);
}

/* The descriptor is readable iff completions wait. */
static void cq_check_fd(int k, const char *when) {
    fz_cq *C = &fz_cqs[k];
    int lo, hi;
    cq_bounds(k, &lo, &hi, NULL);
    bool r = cq_readable(C);
    CHECK(!(lo > 0 && !r), "cq #%d %s: %d completions wait, yet tp_cq_fd is not readable", k, when, lo);
    CHECK(!(hi == 0 && r), "cq #%d %s: no completion can wait, yet tp_cq_fd is readable", k, when);
}

static bool order_known(const fz_task *a, const fz_task *b); /* a certainly ended before b */

/* The tasks drained since `since_call` (drain calls of queue k): their
 * statuses, their places back, their positions in the queue's order, and the
 * order against what the model knows. */
static int cq_account(int k, bool ordered) {
    fz_cq *C = &fz_cqs[k];
    fz_task *got[FZ_MAX_TASKS];
    int n = 0;
    for (int i = 0; i < fz_ntasks; i++) {
        fz_task *t = &fz_tasks[i];
        if (t->cqi != k || !t->accepted || t->qpos >= 0 || atomic_load(&t->done_calls) == 0) continue;
        CHECK(atomic_load(&t->done_calls) == 1 && atomic_load(&t->done_enter) == 1,
              "task %d: its on_done ran %d times", t->index, atomic_load(&t->done_enter));
        got[n++] = t;
        check_status(t->fp->live && t->fp->gen == t->pool_gen ? t->fp : NULL, t);
        note_finished(t);
    }
    /* queue order: the order the on_done calls ran in (a drain nested in an
     * on_done runs the rest of the enclosing drain's chunk first) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            fz_task *a = got[j - 1], *b = got[j];
            if (a->drain_seq < b->drain_seq) break;
            got[j - 1] = b;
            got[j] = a;
        }
    for (int i = 0; i < n; i++) got[i]->qpos = ordered ? C->ndone + i : C->ndone;
    atomic_fetch_add(&fz_drained, (unsigned long long)n);
    C->ndone += n;
    C->taken -= n;
    CHECK(C->taken >= 0, "harness: cq #%d places below 0", k);
    /* every pair drained so far, against what the model knows */
    for (int i = 0; i < fz_ntasks; i++) {
        const fz_task *a = &fz_tasks[i];
        if (a->cqi != k || a->cq_gen != C->gen || a->qpos < 0) continue;
        for (int j = 0; j < fz_ntasks; j++) {
            const fz_task *b = &fz_tasks[j];
            if (b->cqi != k || b->cq_gen != C->gen || b->qpos < 0 || b->qpos <= a->qpos) continue;
            /* a came out first: b must not have ended before a for certain */
            if (order_known(b, a))
                violation("cq #%d: task %d's completion came before task %d's, but task %d ended first "
                          "(completions come in the order the tasks ended)",
                          k, a->index, b->index, b->index);
        }
    }
    return n;
}

/* The end of task `t` (bound, drained) before the end of `u`, for certain:
 * known ended at an observation before one that saw `u` unfinished; or, in
 * the same pool with a single worker, both ended by running (the ending
 * attempt was the last: it succeeded, none was left, or it cancelled
 * itself) and t's last attempt started first (the worker finalises a task
 * before it takes the next). */
static bool ended_by_running(const fz_task *t) {
    int runs = atomic_load(&t->runs);
    if (runs == 0) return false;
    return atomic_load(&t->last_rv) == 0 || runs == (int)t->max_retries + 1 || t->kind == K_SELF;
}

static bool order_known(const fz_task *t, const fz_task *u) {
    if (t->obs_fin && u->obs_unfin && t->obs_fin < u->obs_unfin) return true;
    if (t->pool_gen == u->pool_gen && t->w1 && ended_by_running(t) && ended_by_running(u)) {
        int rt = atomic_load(&t->runs), ru = atomic_load(&u->runs);
        if (rt > FZ_ATTEMPTS || ru > FZ_ATTEMPTS) return false;
        int kt = atomic_load(&t->tick[rt - 1]), ku = atomic_load(&u->tick[ru - 1]);
        return kt && ku && kt < ku;
    }
    return false;
}

/* tp_cq_drain(max) on the harness thread. */
static void op_cq_drain(int k, unsigned max) {
    fz_cq *C = &fz_cqs[k];
    bool known[FZ_MAX_TASKS];
    int lo, hi;
    cq_bounds(k, &lo, &hi, known);
    int first_call = atomic_load(&C->calls) + 1;
    int runs_before = atomic_load(&C->runs);
    int rc = cq_drain_call(k, max);
    /* what it took: run by it or by drains nested in its on_done calls,
     * which run the rest of its chunk first (and may take later ones) */
    int all = atomic_load(&C->runs) - runs_before;
    trace("cq drain #%d max %u [waiting %d..%d] -> %d (%d with nested drains)", k, max, lo, hi, rc, all);
    unsigned m = max ? max : UINT_MAX;
    CHECK(
        (unsigned)all >= (m < (unsigned)lo ? m : (unsigned)lo) &&
            (unsigned)rc <= (m < (unsigned)hi ? m : (unsigned)hi),
        "tp_cq_drain(#%d, max %u) returned %d (%d with nested drains); between %d and %d completions waited",
        k, max, rc, all, lo, hi);
    int n = cq_account(k, true);
    CHECK(n >= rc, "tp_cq_drain(#%d) returned %d, %d on_done calls seen", k, rc, n);
    if (max == 0) /* the first call takes all that wait: the known ones among them */
        for (int i = 0; i < fz_ntasks; i++)
            if (known[i])
                CHECK(fz_tasks[i].drain_call >= first_call, /* it, or a drain nested in it */
                      "tp_cq_drain(#%d, all): task %d's completion waited, yet it was not drained", k, i);
    cq_check_fd(k, "after a drain");
}

static void op_cq(uint8_t a0, uint8_t b1) {
    int k = a0 & 1;
    fz_cq *C = &fz_cqs[k];
    int what = (a0 >> 1) % 8;
    if (!C->live) {
        ensure_cq(k, b1);
        if (what == 0) return;
    }
    switch (what) {
    case 0:
    case 5:
        trace("cq poll #%d", k);
        cq_check_fd(k, "polled");
        break;
    case 1: op_cq_drain(k, b1 % 4u); break;
    case 2: op_cq_drain(k, 0); break;
    case 6: op_cq_drain(k, 1); break;
    case 3: {
        int lo, hi;
        cq_bounds(k, &lo, &hi, NULL);
        static const uint64_t tos[4] = {0, 1 * MS, 3 * MS, TP_FOREVER};
        uint64_t to = tos[b1 % 4u];
        if (to == TP_FOREVER && lo == 0) to = 2 * MS;
        uint64_t t0 = tp_now_ns();
        int rc = tp_cq_wait(C->q, to);
        uint64_t el = tp_now_ns() - t0;
        trace("cq wait #%d timeout %llu [waiting %d..%d] -> %s", k, (unsigned long long)to, lo, hi,
              rcname(rc));
        expect_rc(rc, lo > 0 ? B_OK : hi == 0 ? bit(TP_ETIMEDOUT) : B_OK | bit(TP_ETIMEDOUT), "tp_cq_wait");
        if (rc == TP_ETIMEDOUT)
            CHECK(el >= to, "tp_cq_wait: TP_ETIMEDOUT after %llu ns, timeout %llu", (unsigned long long)el,
                  (unsigned long long)to);
        break;
    }
    default: { /* 4, 7: destroy; TP_EBUSY exactly while a place is taken */
        int rc = tp_cq_destroy(C->q);
        trace("cq destroy #%d [places %d] -> %s", k, C->taken, rcname(rc));
        expect_rc(rc, C->taken > 0 ? bit(TP_EBUSY) : B_OK, "tp_cq_destroy");
        if (rc == TP_OK) C->live = false;
        break;
    }
    }
}

/* A drain on a second thread: mode 3, while the harness waits in
 * tp_submit_wait for a place of the full queue (the drain gives places back:
 * TP_OK when a completion certainly waited); mode 4, while the harness drains
 * the same queue (each completion runs once; their order is then unknown). */
typedef struct fz_drainer {
    int k;
    int rc;
} fz_drainer;

static void *drainer_main(void *arg) {
    fz_drainer *d = (fz_drainer *)arg;
    sleep_ns(2 * MS);
    d->rc = cq_drain_call(d->k, 0);
    return NULL;
}

static void op_concurrent_drain(fz_pool *fp, int mode, uint8_t b1) {
    int k = b1 & 1;
    fz_cq *C = ensure_cq(k, b1);
    int lo, hi;
    cq_bounds(k, &lo, &hi, NULL);
    fz_drainer d = {k, -1};
    pthread_t th;
    fz_scan sc;
    model_scan(fp, &sc);
    bool room = !fp->closed && sc.occ_hi < (int)fp->cap; /* a task without a user is admitted */
    if (mode == 3 && C->taken >= (int)C->cap && room) {
        fz_task *t = task_new(fp);
        t->kind = K_SUCCEED;
        t->has_done = true;
        t->cqi = k;
        t->cq_gen = C->gen;
        if (fz_main_log[0]) snprintf(t->expect_log, sizeof t->expect_log, "%s", fz_main_log);
        tp_task_opts o;
        memset(&o, 0, sizeof o);
        o.on_done = task_done;
        o.cq = C->q;
        t->submit_ns = tp_now_ns();
        t->obs_unfin = ++fz_obs;
        CHECK(pthread_create(&th, NULL, drainer_main, &d) == 0, "harness: pthread_create");
        uint64_t id = 0, budget = lo > 0 ? FZ_LONG_NS : 10 * MS, t0 = tp_now_ns();
        int rc = tp_submit_wait(fp->p, task_main, t, &o, budget, &id);
        uint64_t el = tp_now_ns() - t0;
        pthread_join(th, NULL);
        trace("concurrent slot %d: submit_wait task %d for a place of cq #%d [waiting %d..%d] while another "
              "thread drains -> %s (%llu us), drained %d",
              fp->slot, t->index, k, lo, hi, rcname(rc), (unsigned long long)(el / 1000), d.rc);
        expect_rc(rc, lo > 0 ? B_OK : B_OK | bit(TP_ETIMEDOUT), "submit_wait for a queue place");
        fp->submitted++;
        if (rc == TP_OK) {
            t->id = id;
            t->accepted = true;
            fp->accepted++;
        } else {
            fp->rej_timeout++;
        }
        /* Its place counts before the account: the drain gives each place
         * back as soon as that on_done returned, so the submit may have been
         * admitted mid-drain, and a drain nested in a later on_done of the
         * same drain may already have run its completion. */
        if (rc == TP_OK) C->taken++;
        cq_account(k, true); /* one drainer: its order is known */
        return;
    }
    int ran0 = atomic_load(&C->ran);
    CHECK(pthread_create(&th, NULL, drainer_main, &d) == 0, "harness: pthread_create");
    sleep_ns(2 * MS);
    int rc = cq_drain_call(k, 0);
    pthread_join(th, NULL);
    /* An on_done may drain once more (t->nest): those calls' on_done count
     * in `ran`, not in the two calls' results. */
    int ran = atomic_load(&C->ran) - ran0, nested = ran - rc - d.rc;
    trace("concurrent: cq #%d drained by two threads [waiting %d..%d] -> %d and %d, %d in nested drains", k,
          lo, hi, rc, d.rc, nested);
    CHECK(ran >= lo, "two drains of cq #%d ran %d completions, %d waited", k, ran, lo);
    int n = cq_account(k, false);
    CHECK(n == ran, "two drains of cq #%d returned %d + %d (and %d in nested drains), %d on_done calls seen",
          k, rc, d.rc, nested, n);
    cq_check_fd(k, "after two drains");
}

/* The end of an input: every pool is gone, so every completion waits; one
 * drain runs them all, each once, and the queues are destroyed. */
static void finish_cqs(void) {
    for (int k = 0; k < FZ_CQS; k++) {
        fz_cq *C = &fz_cqs[k];
        if (!C->live) continue;
        int lo, hi;
        cq_bounds(k, &lo, &hi, NULL);
        CHECK(lo == hi && lo == C->taken, "harness: cq #%d at the end: waiting %d..%d, places %d", k, lo, hi,
              C->taken);
        cq_check_fd(k, "at the end");
        op_cq_drain(k, 0);
        CHECK(C->taken == 0, "cq #%d: %d completions were not drained", k, C->taken);
        int rc = tp_cq_destroy(C->q);
        trace("cq destroy #%d -> %s", k, rcname(rc));
        expect_rc(rc, B_OK, "tp_cq_destroy at the end");
        C->live = false;
    }
    for (int i = 0; i < fz_ntasks; i++) {
        const fz_task *t = &fz_tasks[i];
        if (t->cqi < 0) continue;
        CHECK(atomic_load(&t->done_enter) == (t->accepted && t->has_done ? 1 : 0),
              "task %d bound to cq #%d (accepted %d): its on_done ran %d times", t->index, t->cqi,
              t->accepted, atomic_load(&t->done_enter));
    }
}

/* ------------------------------------------------------------ submit burst */

/*
 * OP_BURST: 2..4 application threads submit at once into a pool of their own
 * (fixed or elastic workers, FIFO or fair, a per-user limit of 1, 2, 3 or
 * none, a queue of 1..8 or 40..64 places, retries), released together by a
 * barrier; the harness thread may close the pool meanwhile. Each thread
 * makes a planned series of calls -- tp_submit with options (users, on_done,
 * an id), tp_submit_batch of 2..8 tasks (with ids and on_done, or plain),
 * tp_submit_wait with a 1..3 ms budget, plain tp_submit -- and checks every
 * answer against what the header allows at that moment (which refusal comes
 * depends on the other threads). Inside every attempt the task counts, with
 * atomics, the tasks of its user running: never more than max_per_user. At
 * rest (tp_shutdown, tp_wait): every accepted task ran its attempts and its
 * on_done exactly once with its status, no refused one ran, the ids are
 * unique, each thread's accepted + refused == its submitted, and every
 * tp_stats counter equals the sum of what the threads were answered; in a
 * FIFO pool with one fixed worker each thread's tasks first started in the
 * order it submitted them.
 */
#define FZ_BURST_THREADS 4
#define FZ_BURST_CALLS   8
#define FZ_BURST_BATCH   8
#define FZ_BURST_TASKS   (FZ_BURST_THREADS * FZ_BURST_CALLS * FZ_BURST_BATCH)

enum { BC_SUBMIT, BC_BATCH, BC_WAIT, BC_PLAIN, BC_PLAIN_BATCH, BC_COUNT };
static const char *const bc_name[BC_COUNT] = {"submit", "batch", "wait", "plain", "plain-batch"};
enum { BK_SUCCEED, BK_FAIL, BK_SLEEP, BK_COUNT };

typedef struct fz_btask {
    int thread, call, user, kind; /* user: fz_users[], 0 (NULL) for a plain task */
    bool plain;                   /* no options, no id: no on_done */
    uint64_t id;                  /* the id its call gave, 0 none */
    bool accepted;
    atomic_int runs, done_calls, done_status, tick; /* tick: its first start's ticket */
} fz_btask;

typedef struct fz_bcall {
    int type, n, first; /* its tasks: fz_b.bt[first .. first + n) */
    uint64_t budget;    /* BC_WAIT */
    int rc;
    size_t k;       /* tasks accepted */
    uint64_t el_ns; /* how long the call took */
} fz_bcall;

typedef struct fz_bthread {
    int index, ncalls;
    pthread_t th;
    fz_bcall calls[FZ_BURST_CALLS];
    /* what its calls were answered, counted as the pool counts them */
    uint64_t submitted, accepted, refused, rej_full, rej_user, rej_closed, rej_timeout;
} fz_bthread;

typedef struct fz_burst {
    tp_pool *p;
    unsigned workers, max_workers, cap, mpu, retries;
    bool fair, closing;
    atomic_int closed; /* tp_close has been called (set just before the call) */
    int nthreads, ntasks;
    pthread_barrier_t start;
    fz_btask bt[FZ_BURST_TASKS];
    fz_bthread th[FZ_BURST_THREADS];
    atomic_int running[FZ_USERS]; /* tasks of each user inside their function now */
    atomic_int peak[FZ_USERS];    /* the most seen at once */
    atomic_int ticket, logs;
} fz_burst;

static fz_burst fz_b;

/* Failed attempts are logged: counted, not printed. */
static void burst_log(void *arg, int level, const char *log_id, const char *msg) {
    (void)level;
    CHECK(log_id && msg, "burst: log hook called with a NULL log id or message");
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* As expect_rc, counted apart (fz_burst_checked): which answer comes depends
 * on the other threads, so these are not the model's predictions. */
static void burst_expect(int rc, unsigned allowed, const char *what) {
    atomic_fetch_add(&fz_burst_checked, 1);
    if (!(bit(rc) & allowed)) expect_rc(rc, allowed, what);
}

static int burst_task(tp_ctx *c, void *arg) {
    fz_btask *t = (fz_btask *)arg;
    fz_burst *B = &fz_b;
    int attempt = atomic_fetch_add(&t->runs, 1);
    if (attempt == 0) atomic_store(&t->tick, atomic_fetch_add(&B->ticket, 1) + 1);
    int r = atomic_fetch_add(&B->running[t->user], 1) + 1;
    int m = atomic_load(&B->peak[t->user]);
    while (r > m && !atomic_compare_exchange_weak(&B->peak[t->user], &m, r)) {
    }
    if (t->user >= 2 && B->mpu != TP_UNLIMITED)
        CHECK(r <= (int)B->mpu, "burst: %d tasks of user %s run at once, max_per_user is %u", r,
              fz_users[t->user], B->mpu);
    CHECK(tp_ctx_attempt(c) == (unsigned)attempt, "burst: task %d.%d: tp_ctx_attempt %u in attempt %d",
          t->thread, t->call, tp_ctx_attempt(c), attempt);
    const char *u = tp_ctx_user(c), *want = fz_users[t->user];
    if (!want || !want[0])
        CHECK(u == NULL, "burst: task %d.%d: tp_ctx_user \"%s\", expected NULL", t->thread, t->call, u);
    else
        CHECK(u && strcmp(u, want) == 0, "burst: task %d.%d: tp_ctx_user \"%s\", expected \"%s\"", t->thread,
              t->call, u ? u : "(null)", want);
    int rv = t->kind == BK_FAIL ? 1 : 0;
    if (t->kind == BK_SLEEP) {
        int e = tp_ctx_sleep(c, 30000);
        CHECK(e == 0, "burst: task %d.%d: tp_ctx_sleep returned %s", t->thread, t->call, rcname(e));
    }
    atomic_fetch_sub(&B->running[t->user], 1);
    return rv;
}

static void burst_done(void *arg, int status) {
    fz_btask *t = (fz_btask *)arg;
    CHECK(atomic_fetch_add(&t->done_calls, 1) == 0, "burst: task %d.%d (id %llu): on_done called twice",
          t->thread, t->call, (unsigned long long)t->id);
    atomic_store(&t->done_status, status);
}

/* The refusals a call may get for task t while the others submit. */
static unsigned burst_refusals(const fz_burst *B, const fz_btask *t) {
    unsigned a = bit(TP_EFULL);
    if (!t->plain && t->user >= 2 && B->mpu != TP_UNLIMITED) a |= bit(TP_EUSERLIMIT);
    if (B->closing) a |= bit(TP_ECLOSED);
    return a;
}

static void burst_count_refusal(fz_bthread *T, int rc) {
    T->refused++;
    switch (rc) {
    case TP_EFULL: T->rej_full++; break;
    case TP_EUSERLIMIT: T->rej_user++; break;
    case TP_ECLOSED: T->rej_closed++; break;
    case TP_ETIMEDOUT: T->rej_timeout++; break;
    default: violation("burst: a refusal %s the model cannot count", rcname(rc));
    }
}

static void *burst_main(void *arg) {
    fz_bthread *T = (fz_bthread *)arg;
    fz_burst *B = &fz_b;
    pthread_barrier_wait(&B->start);
    for (int ci = 0; ci < T->ncalls; ci++) {
        fz_bcall *C = &T->calls[ci];
        fz_btask *t0 = &B->bt[C->first];
        tp_task_opts o[FZ_BURST_BATCH];
        tp_task tasks[FZ_BURST_BATCH];
        uint64_t ids[FZ_BURST_BATCH];
        memset(o, 0, sizeof o);
        memset(tasks, 0, sizeof tasks);
        for (int i = 0; i < C->n; i++) {
            o[i].user = fz_users[t0[i].user];
            o[i].on_done = burst_done;
            tasks[i].fn = burst_task;
            tasks[i].arg = &t0[i];
            tasks[i].opts = t0[i].plain ? NULL : &o[i];
            ids[i] = 0xdeadbeef;
        }
        uint64_t id = 0, t_start = tp_now_ns();
        int rc;
        size_t k = 99;
        switch (C->type) {
        case BC_SUBMIT: rc = tp_submit(B->p, burst_task, t0, &o[0], &id); break;
        case BC_PLAIN: rc = tp_submit(B->p, burst_task, t0, NULL, NULL); break;
        case BC_WAIT: rc = tp_submit_wait(B->p, burst_task, t0, &o[0], C->budget, &id); break;
        case BC_BATCH: rc = tp_submit_batch(B->p, tasks, (size_t)C->n, ids, &k); break;
        default: rc = tp_submit_batch(B->p, tasks, (size_t)C->n, NULL, &k); break;
        }
        C->el_ns = tp_now_ns() - t_start;
        if (C->type != BC_BATCH && C->type != BC_PLAIN_BATCH) {
            k = rc == TP_OK;
            ids[0] = id;
        }
        C->rc = rc;
        C->k = k;
        /* what the header allows now */
        if (C->type == BC_WAIT) {
            burst_expect(rc, B_OK | bit(TP_ETIMEDOUT) | (B->closing ? bit(TP_ECLOSED) : 0),
                         "burst: tp_submit_wait while others submit");
            if (rc == TP_ETIMEDOUT)
                CHECK(C->el_ns >= C->budget,
                      "burst: tp_submit_wait: TP_ETIMEDOUT after %llu ns, budget %llu ns",
                      (unsigned long long)C->el_ns, (unsigned long long)C->budget);
        } else {
            CHECK(k <= (size_t)C->n, "burst: %s: accepted_out %zu of %d", bc_name[C->type], k, C->n);
            CHECK((rc == TP_OK) == (k == (size_t)C->n), "burst: %s of %d: %s with accepted_out %zu",
                  bc_name[C->type], C->n, rcname(rc), k);
            if (rc != TP_OK)
                burst_expect(rc, burst_refusals(B, &t0[k]), "burst: a submit while others submit");
        }
        if (rc == TP_ECLOSED)
            CHECK(atomic_load(&B->closed), "burst: %s: TP_ECLOSED before tp_close was called",
                  bc_name[C->type]);
        for (int i = 0; i < C->n; i++) {
            bool plain_ids = C->type == BC_PLAIN || C->type == BC_PLAIN_BATCH;
            if ((size_t)i < k) {
                t0[i].accepted = true;
                t0[i].id = plain_ids ? 0 : ids[i];
                if (!plain_ids)
                    CHECK(ids[i] != 0 && ids[i] != 0xdeadbeef, "burst: %s: task %d accepted with id %llu",
                          bc_name[C->type], i, (unsigned long long)ids[i]);
            } else if (C->type == BC_BATCH) {
                CHECK(ids[i] == 0xdeadbeef,
                      "burst: tp_submit_batch wrote ids_out[%d] of a task not accepted (k %zu)", i, k);
            }
        }
        T->submitted += k + (k < (size_t)C->n);
        T->accepted += k;
        if (k < (size_t)C->n) burst_count_refusal(T, rc);
    }
    return NULL;
}

static uint32_t burst_rng(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

static void op_burst(const uint8_t b[5]) {
    fz_burst *B = &fz_b;
    memset(B, 0, sizeof *B);
    B->nthreads = 2 + (b[0] >> 1) % 3u;
    B->workers = 1 + (b[0] >> 3) % 3u;
    B->max_workers = B->workers + ((b[0] >> 5) & 1);
    B->fair = (b[0] >> 6) & 1;
    B->closing = (b[0] >> 7) & 1;
    B->cap = (b[1] & 1) ? big_cap_of[(b[1] >> 1) % 8u] : 1 + (b[1] >> 1) % 8u;
    unsigned mpu = mpu_of[(b[1] >> 4) % 5u];
    B->mpu = mpu ? mpu : 2; /* resolved */
    B->retries = b[2] % 3u;
    uint32_t seed = 0x9e3779b9u ^ ((uint32_t)b[2] << 8) ^ ((uint32_t)b[3] << 16) ^ ((uint32_t)b[4] << 24);
    int kinds_mask = 1 + (b[2] >> 2) % 7u; /* which task kinds this burst uses */
    /* the plan: every call and task decided before the threads start */
    for (int ti = 0; ti < B->nthreads; ti++) {
        fz_bthread *T = &B->th[ti];
        T->index = ti;
        T->ncalls = 1 + (int)(burst_rng(&seed) % FZ_BURST_CALLS);
        for (int ci = 0; ci < T->ncalls; ci++) {
            fz_bcall *C = &T->calls[ci];
            C->type = (int)(burst_rng(&seed) % BC_COUNT);
            C->n = C->type == BC_BATCH || C->type == BC_PLAIN_BATCH ? 2 + (int)(burst_rng(&seed) % 7) : 1;
            C->budget = (1 + burst_rng(&seed) % 3) * MS;
            C->first = B->ntasks;
            bool plain = C->type == BC_PLAIN || C->type == BC_PLAIN_BATCH;
            for (int i = 0; i < C->n; i++) {
                fz_btask *t = &B->bt[B->ntasks++];
                t->thread = ti;
                t->call = ci;
                t->plain = plain;
                t->user = plain ? 0 : (int)(burst_rng(&seed) % FZ_USERS);
                do t->kind = (int)(burst_rng(&seed) % BK_COUNT);
                while (!((kinds_mask >> t->kind) & 1));
            }
        }
    }
    tp_config c;
    memset(&c, 0, sizeof c);
    c.workers = B->workers;
    c.max_workers = B->max_workers;
    c.queue_capacity = B->cap;
    c.max_per_user = mpu;
    c.max_retries = B->retries;
    c.retry_delay_ns = 200000;
    c.sched = B->fair ? TP_SCHED_FAIR : TP_SCHED_FIFO;
    c.name = "fzb";
    c.log = burst_log;
    c.log_arg = &B->logs;
    int rc = tp_create(&B->p, &c);
    trace("burst: %d threads, %d tasks; workers %u max %u cap %u mpu %u retries %u %s kinds %d%s -> %s",
          B->nthreads, B->ntasks, B->workers, B->max_workers, B->cap, B->mpu, B->retries,
          B->fair ? "fair" : "fifo", kinds_mask, B->closing ? " close" : "", rcname(rc));
    CHECK(rc == TP_OK, "burst: tp_create returned %s", rcname(rc));
    CHECK(pthread_barrier_init(&B->start, NULL, (unsigned)B->nthreads + 1) == 0, "harness: barrier");
    for (int ti = 0; ti < B->nthreads; ti++)
        CHECK(pthread_create(&B->th[ti].th, NULL, burst_main, &B->th[ti]) == 0, "harness: pthread_create");
    pthread_barrier_wait(&B->start);
    if (B->closing) {
        sleep_ns(50000 * (1 + b[3] % 4u));
        atomic_store(&B->closed, 1);
        expect_rc(tp_close(B->p), B_OK, "burst: tp_close while others submit");
    }
    for (int ti = 0; ti < B->nthreads; ti++) pthread_join(B->th[ti].th, NULL);
    pthread_barrier_destroy(&B->start);
    for (int ti = 0; ti < B->nthreads; ti++) {
        fz_bthread *T = &B->th[ti];
        char buf[120];
        size_t n = 0;
        for (int ci = 0; ci < T->ncalls && n < sizeof buf - 24; ci++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, " %s/%d:%zu%s", bc_name[T->calls[ci].type],
                                  T->calls[ci].n, T->calls[ci].k,
                                  T->calls[ci].rc == TP_OK ? "" : tp_err_name(T->calls[ci].rc) + 3);
        trace("  thread %d:%s", ti, buf);
    }
    /* at rest */
    uint64_t t0 = tp_now_ns();
    rc = tp_shutdown(B->p, FZ_BOUND_NS);
    expect_rc(rc, B_OK, "burst: tp_shutdown after the burst");
    rc = tp_wait(B->p, FZ_BOUND_NS);
    expect_rc(rc, B_OK, "burst: tp_wait after the burst");
    CHECK(tp_now_ns() - t0 < FZ_BOUND_NS, "burst: the pool did not drain in %llu s",
          (unsigned long long)(FZ_BOUND_NS / SEC));
    uint64_t sub = 0, acc = 0, full = 0, user = 0, closed = 0, tmo = 0;
    for (int ti = 0; ti < B->nthreads; ti++) {
        fz_bthread *T = &B->th[ti];
        CHECK(T->accepted + T->refused == T->submitted,
              "burst: thread %d: %llu accepted + %llu refused != %llu submitted", ti,
              (unsigned long long)T->accepted, (unsigned long long)T->refused,
              (unsigned long long)T->submitted);
        sub += T->submitted;
        acc += T->accepted;
        full += T->rej_full;
        user += T->rej_user;
        closed += T->rej_closed;
        tmo += T->rej_timeout;
    }
    uint64_t succeeded = 0, failed = 0, retried = 0;
    int last_tick[FZ_BURST_THREADS] = {0};
    bool fifo1 = !B->fair && B->max_workers == 1;
    for (int i = 0; i < B->ntasks; i++) {
        fz_btask *t = &B->bt[i];
        int runs = atomic_load(&t->runs), dc = atomic_load(&t->done_calls);
        if (!t->accepted) {
            CHECK(runs == 0 && dc == 0, "burst: task %d.%d was refused, yet it ran %d times, on_done %d",
                  t->thread, t->call, runs, dc);
            continue;
        }
        int want_runs = t->kind == BK_FAIL ? 1 + (int)B->retries : 1;
        CHECK(runs == want_runs, "burst: task %d.%d (%s, id %llu): %d attempts at rest, expected %d",
              t->thread, t->call, t->kind == BK_FAIL ? "fails" : "succeeds", (unsigned long long)t->id, runs,
              want_runs);
        if (!t->plain) {
            CHECK(dc == 1, "burst: task %d.%d (id %llu): on_done ran %d times at rest", t->thread, t->call,
                  (unsigned long long)t->id, dc);
            int st = atomic_load(&t->done_status), want = t->kind == BK_FAIL ? 1 : 0;
            CHECK(st == want, "burst: task %d.%d (id %llu): on_done status %d, expected %d", t->thread,
                  t->call, (unsigned long long)t->id, st, want);
        }
        if (t->kind == BK_FAIL) {
            failed++;
            retried += B->retries;
        } else {
            succeeded++;
        }
        for (int j = 0; j < i && t->id; j++)
            CHECK(!B->bt[j].accepted || B->bt[j].id != t->id, "burst: id %llu given to tasks %d.%d and %d.%d",
                  (unsigned long long)t->id, B->bt[j].thread, B->bt[j].call, t->thread, t->call);
        if (fifo1) {
            int tk = atomic_load(&t->tick);
            CHECK(tk > last_tick[t->thread],
                  "burst: FIFO, one worker: thread %d's task of call %d started as #%d, after #%d of a later "
                  "one",
                  t->thread, t->call, tk, last_tick[t->thread]);
            last_tick[t->thread] = tk;
        }
    }
    tp_stats s;
    tp_stats_get(B->p, &s);
#define BURST_EQ(field, want)                                                                                \
    CHECK(s.field == (want), "burst: at rest stats." #field " is %llu, the threads saw %llu",                \
          (unsigned long long)s.field, (unsigned long long)(want))
    BURST_EQ(submitted, sub);
    BURST_EQ(accepted, acc);
    BURST_EQ(rejected_full, full);
    BURST_EQ(rejected_user, user);
    BURST_EQ(rejected_closed, closed);
    BURST_EQ(rejected_timeout, tmo);
    BURST_EQ(rejected, full + user + closed + tmo);
    BURST_EQ(started, acc);
    BURST_EQ(retried, retried);
    BURST_EQ(completed, acc);
    BURST_EQ(succeeded, succeeded);
    BURST_EQ(failed, failed);
    BURST_EQ(cancelled, 0);
    BURST_EQ(expired, 0);
    BURST_EQ(active, 0);
    BURST_EQ(queued, 0);
    BURST_EQ(delayed, 0);
    BURST_EQ(users, 0);
#undef BURST_EQ
    CHECK(atomic_load(&B->logs) == (int)(failed * (1 + B->retries)),
          "burst: %d log lines for %llu failed attempts", atomic_load(&B->logs),
          (unsigned long long)(failed * (1 + B->retries)));
    for (int u = 2; u < FZ_USERS; u++)
        CHECK(tp_user_active(B->p, fz_users[u]) == 0, "burst: at rest user %s holds %u slots", fz_users[u],
              tp_user_active(B->p, fz_users[u]));
    trace("  burst at rest: submitted %llu accepted %llu full %llu user %llu closed %llu timeout %llu; peaks "
          "u0 %d u1 %d u2 %d",
          (unsigned long long)sub, (unsigned long long)acc, (unsigned long long)full,
          (unsigned long long)user, (unsigned long long)closed, (unsigned long long)tmo,
          atomic_load(&B->peak[2]), atomic_load(&B->peak[3]), atomic_load(&B->peak[4]));
    CHECK(tp_destroy(B->p) == TP_OK, "burst: tp_destroy failed");
    B->p = NULL;
}

/* ------------------------------------------------------------ weights, lanes */

/* tp_user_weight_set: TP_EINVAL in a FIFO pool, for a weight out of
 * 1..TP_WEIGHT_MAX or a name too long; else TP_OK, and the user's next turns
 * take that quantum (the exact model's sim learns it: a turn under way keeps
 * its credit). */
static void op_weight(fz_pool *fp, uint8_t b1) {
    ensure_pool(fp);
    ex_sync(fp);
    ex_enter(fp);
    static const unsigned weights[8] = {1, 2, 3, 4, TP_WEIGHT_MAX, 0, TP_WEIGHT_MAX + 1, 2};
    int user = b1 % FZ_USERS;
    unsigned w = weights[(b1 >> 3) % 8];
    bool long_name = (b1 >> 6) == 3;
    char longs[TP_USER_MAX + 2];
    memset(longs, 'w', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    const char *name = long_name ? longs : fz_users[user];
    bool valid = fp->fair && w >= 1 && w <= TP_WEIGHT_MAX && !long_name;
    int rc = tp_user_weight_set(fp->p, name, w);
    trace("weight slot %d user %s = %u -> %s", fp->slot,
          long_name ? "(too long)"
          : name    ? name
                    : "NULL",
          w, rcname(rc));
    expect_rc(rc, valid ? B_OK : bit(TP_EINVAL), "tp_user_weight_set");
    if (rc != TP_OK) return;
    int flow = user <= 1 ? 0 : user - 1;
    fp->weight[flow] = w;
    if (fp->exact) fzs_set_weight(&fp->sim, flow, w);
}

/* Lane figures and the lanes' queue-wait histograms while the pool runs,
 * plus the invalid calls; exact where the model is (after a sync). */
static void op_lanes(fz_pool *fp, uint8_t a0) {
    ensure_pool(fp);
    trace("lanes slot %d%s", fp->slot, (a0 & 2) ? " (synced)" : "");
    if (a0 & 2) ex_sync(fp); /* the exact model's figures are exact only at a sync */
    tp_lane_stats l;
    memset(&l, 0x5a, sizeof l);
    tp_lane_stats keep = l;
    expect_rc(tp_lane_stats_get(fp->p, TP_PRIO_MAX + 1, &l), bit(TP_EINVAL), "tp_lane_stats_get(priority 3)");
    expect_rc(tp_lane_stats_get(fp->p, TP_PRIO_MIN - 1, &l), bit(TP_EINVAL),
              "tp_lane_stats_get(priority -3)");
    expect_rc(tp_lane_stats_get(NULL, 0, &l), bit(TP_EINVAL), "tp_lane_stats_get(NULL pool)");
    expect_rc(tp_lane_stats_get(fp->p, 0, NULL), bit(TP_EINVAL), "tp_lane_stats_get(NULL out)");
    CHECK(memcmp(&l, &keep, sizeof l) == 0, "tp_lane_stats_get wrote *out on TP_EINVAL");
    expect_rc(tp_hist_get(fp->p, TP_HIST_QUEUE_WAIT_PRIO(TP_PRIO_MAX + 1), &fz_hist), bit(TP_EINVAL),
              "tp_hist_get(queue wait of priority 3)");
    expect_rc(tp_hist_get(fp->p, 2, &fz_hist), bit(TP_EINVAL), "tp_hist_get(2)");
    check_lanes_running(fp);
    for (int prio = TP_PRIO_MIN; prio <= TP_PRIO_MAX; prio++) {
        uint64_t h = hist_count(fp, TP_HIST_QUEUE_WAIT_PRIO(prio));
        tp_lane_stats ls = lane_stats(fp, prio);
        if (fp->exact && (a0 & 2)) {
            /* synced: every predicted start happened and the model knows every task's place */
            uint64_t runs = 0;
            int stuck = 0;
            for (int i = 0; i < fp->ntasks; i++) {
                const fz_task *t = fp->tasks[i];
                if (!t->accepted || t->prio != prio) continue;
                runs += (uint64_t)atomic_load(&t->runs);
                stuck += t->xs == X_STUCK;
            }
            CHECK(
                ls.started == runs && ls.queued == (uint32_t)fp->sim.n[prio - TP_PRIO_MIN] &&
                    ls.running == (uint32_t)stuck && h == runs,
                "pool %d: lane %d started %llu queued %u running %u, histogram %llu; the exact model: %llu, "
                "%d, %d",
                fp->slot, prio, (unsigned long long)ls.started, ls.queued, ls.running, (unsigned long long)h,
                (unsigned long long)runs, fp->sim.n[prio - TP_PRIO_MIN], stuck);
        }
    }
}

/* ------------------------------------------------------------ groups */

static fz_group *ensure_group(fz_pool *fp, int k, bool coe) {
    fz_group *G = &fp->grp[k];
    if (G->live) return G;
    if (coe) ex_lose(fp, "a cancel-on-error group");
    memset(G, 0, sizeof *G);
    tp_group *g = (tp_group *)(uintptr_t)0x1;
    int rc = tp_group_create(fp->p, coe ? TP_GROUP_CANCEL_ON_ERROR : 0, &g);
    trace("group create slot %d #%d%s -> %s", fp->slot, k, coe ? " cancel-on-error" : "", rcname(rc));
    CHECK(rc == TP_OK && g != NULL && g != (tp_group *)(uintptr_t)0x1, "tp_group_create returned %s",
          rcname(rc));
    G->g = g;
    G->live = true;
    G->coe = coe;
    return G;
}

/* Every member has ended and its on_done has returned (a wait returned, or a
 * destroy): check that, learn it, and check the group's result `rc`. */
static void group_finished(fz_pool *fp, fz_group *G, int rc, const char *after) {
    bool all_ok_known = true, any_fail = false, rc_possible = rc == 0;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (t->grp != G || !t->accepted) continue;
        set_finalised(t); /* retired: ended, on_done returned (or its completion is queued) */
        if (t->has_done && t->cqi < 0)
            CHECK(atomic_load(&t->done_calls) == 1, "group: member task %d has no on_done when %s returned",
                  t->index, after);
        if (done_known(t)) {
            int st = atomic_load(&t->done_status);
            if (st != 0) any_fail = true, all_ok_known = false;
            if (st == rc) rc_possible = true;
        } else {
            all_ok_known = false;
            fz_allowed a = final_allowed(fp, t);
            if (allowed_has(&a, rc)) rc_possible = true;
        }
    }
    CHECK(rc_possible, "group: %s returned %s (%d), which no member ended with", after, rcname(rc), rc);
    if (all_ok_known) CHECK(rc == 0, "group: every member succeeded, yet %s returned %d", after, rc);
    if (any_fail) CHECK(rc != 0, "group: a member failed, yet %s returned TP_OK", after);
    if (G->err_seen)
        CHECK(rc == G->err_seen, "group: %s returned %d, an earlier wait %d (first error)", after, rc,
              G->err_seen);
    if (rc != 0) G->err_seen = rc;
}

static void op_group_wait(fz_pool *fp, fz_group *G, int cls) {
    fz_scan sc;
    model_scan(fp, &sc);
    bool cannot_finish = false;
    for (int i = 0; i < fp->ntasks; i++) {
        const fz_task *t = fp->tasks[i];
        if (t->grp == G && t->accepted && (sc.stuck[i] || sc.parked[i])) cannot_finish = true;
    }
    static const uint64_t tos[4] = {1 * MS, 3 * MS, 0, FZ_LONG_NS};
    uint64_t to = tos[cls % 4];
    if ((to == 0 || to == FZ_LONG_NS) && (cannot_finish || sc.nblockers > 0)) to = 2 * MS;
    uint64_t t0 = tp_now_ns();
    int rc = tp_group_wait(G->g, to);
    uint64_t el = tp_now_ns() - t0;
    trace("group wait slot %d timeout %llu [stuck/parked member %d, blockers %d] -> %s", fp->slot,
          (unsigned long long)to, cannot_finish, sc.nblockers, rcname(rc));
    atomic_fetch_add(&fz_checked, 1);
    if (cannot_finish) {
        expect_rc(rc, bit(TP_ETIMEDOUT), "tp_group_wait with a member that cannot end");
        CHECK(el >= to, "tp_group_wait: TP_ETIMEDOUT after %llu ns, timeout %llu", (unsigned long long)el,
              (unsigned long long)to);
        return;
    }
    /* TP_ETIMEDOUT is the wait's own timeout only once it has passed */
    bool finished = rc != TP_ETIMEDOUT || to == 0 || el < to;
    if (to == 0 || to == FZ_LONG_NS)
        CHECK(finished, "tp_group_wait did not finish in %llu ns", (unsigned long long)to);
    if (finished) group_finished(fp, G, rc, "tp_group_wait");
}

static void op_group_cancel(fz_pool *fp, fz_group *G) {
    ex_sync(fp);
    fz_scan sc;
    model_scan(fp, &sc);
    bool member[FZ_MAX_TASKS] = {false}; /* unfinished before the cancel (its on_done may run at once) */
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (t->grp == G && t->accepted && !task_ended(t)) t->cancel_requested = member[i] = true;
    }
    int rc = tp_group_cancel(G->g);
    trace("group cancel slot %d -> %s", fp->slot, rcname(rc));
    expect_rc(rc, B_OK, "tp_group_cancel");
    G->cancel_called = G->refusing = true;
    fz_task *agents[FZ_MAX_TASKS];
    int na = 0;
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (!member[i]) continue;
        int runs_before = atomic_load(&t->runs);
        atomic_store(&t->cancel_ok, 1);
        bool parked = sc.parked[i] || (fp->exact && t->xs == X_WAIT);
        ex_cancelled(fp, t, agents, &na);
        if (!parked) continue;
        /* parked while every worker is busy: it ends now, unrun, promptly */
        set_finalised(t);
        if (t->has_done && t->cqi >= 0) {
            t->must_status = TP_ECANCELED; /* its completion waits in its queue */
        } else if (t->has_done) {
            await_done(t, "tp_group_cancel while every worker was busy");
            CHECK(atomic_load(&t->done_status) == TP_ECANCELED,
                  "task %d: cancelled with its group while queued, status %d", t->index,
                  atomic_load(&t->done_status));
        }
        CHECK(atomic_load(&t->runs) == runs_before, "task %d ran after its group was cancelled", t->index);
    }
    ex_run(fp, agents, na);
}

/* Every gate opens first: tp_group_destroy waits without a limit. */
static void op_group_destroy(fz_pool *fp, fz_group *G) {
    for (int g = 0; g < FZ_GATES; g++) harness_open_gate(g);
    int rc = tp_group_destroy(G->g);
    trace("group destroy slot %d -> %s", fp->slot, rcname(rc));
    expect_rc(rc, B_OK, "tp_group_destroy");
    for (int i = 0; i < fp->ntasks; i++) {
        fz_task *t = fp->tasks[i];
        if (t->grp != G || !t->accepted) continue;
        set_finalised(t);
        if (t->has_done && t->cqi < 0)
            CHECK(atomic_load(&t->done_calls) == 1,
                  "group: member task %d has no on_done after tp_group_destroy", t->index);
        t->grp = NULL; /* the model keeps its tolerance through cancel_ok */
        if (G->cancel_called || G->coe) atomic_store(&t->cancel_ok, 1);
    }
    G->live = false;
}

/* The pool is gone: its groups are detached. */
static void finish_groups(fz_pool *fp) {
    for (int k = 0; k < FZ_GROUPS; k++) {
        fz_group *G = &fp->grp[k];
        if (!G->live) continue;
        int rc = tp_group_wait(G->g, 1);
        trace("group #%d of destroyed slot %d: wait -> %s", k, fp->slot, rcname(rc));
        group_finished(fp, G, rc, "tp_group_wait on a detached group");
        /* arguments first, then cancelled (tp_group_cancel, or a cancel-on-error
         * group whose member failed), then closed */
        expect_rc(tp_group_submit(G->g, NULL, NULL, NULL, NULL), bit(TP_EINVAL),
                  "tp_group_submit without fn, pool destroyed");
        bool cancelled = G->cancel_called || (G->coe && rc != TP_OK);
        expect_rc(tp_group_submit(G->g, nop_task, NULL, NULL, NULL),
                  bit(cancelled ? TP_ECANCELED : TP_ECLOSED), "tp_group_submit, pool destroyed");
        expect_rc(tp_group_cancel(G->g), B_OK, "tp_group_cancel, pool destroyed");
        expect_rc(tp_group_destroy(G->g), B_OK, "tp_group_destroy, pool destroyed");
        for (int i = 0; i < fp->ntasks; i++) {
            fz_task *t = fp->tasks[i];
            if (t->grp != G) continue;
            t->grp = NULL; /* the model keeps its tolerance through cancel_ok */
            if (G->cancel_called || G->coe) atomic_store(&t->cancel_ok, 1);
        }
        G->live = false;
    }
}

static void op_group(fz_pool *fp, uint8_t a0, uint8_t b1) {
    ensure_pool(fp);
    int k = (a0 >> 3) & 1;
    fz_group *G = ensure_group(fp, k, (a0 >> 4) & 1);
    switch ((a0 >> 1) % 4) {
    case 0: op_group_wait(fp, G, b1); break;
    case 1: op_group_cancel(fp, G); break;
    case 2: op_group_destroy(fp, G); break;
    default: op_group_wait(fp, G, 3); break;
    }
}

static void op_logid(uint8_t b) {
    static const char *const ids[3] = {NULL, "m1", "m2"};
    const char *l = ids[b % 3];
    tp_log_id_set(l);
    snprintf(fz_main_log, sizeof fz_main_log, "%s", l ? l : "");
    const char *g = tp_log_id_get();
    trace("log id %s", l ? l : "NULL");
    CHECK(l ? (g && strcmp(g, l) == 0) : g == NULL, "tp_log_id_get after tp_log_id_set(%s)", l ? l : "NULL");
}

enum {
    OP_CREATE,
    OP_SUBMIT,
    OP_SUBMIT2,
    OP_CANCEL,
    OP_GATE,
    OP_SETTLE,
    OP_CLOSE,
    OP_SHUTDOWN,
    OP_WAIT,
    OP_STATS,
    OP_DESTROY,
    OP_INVALID,
    OP_LOGID,
    OP_DEFAULT,
    OP_CONCURRENT,
    OP_GROUP,
    OP_GSUBMIT,
    OP_CREATE2, /* 1.2: priorities, fair shares, retry backoff */
    OP_WEIGHT,
    OP_LANES,
    OP_CQ,
    OP_COUNT,
    /* Later ops take op bytes that no input of corpus/ has at an op's place
     * (the others decode as byte % OP_COUNT, as before, so those inputs keep
     * their meaning): */
    OP_BATCH = OP_COUNT, /* 244..251: tp_submit_batch of 2..8 tasks */
    OP_BURST,            /* 252, 253: several threads submit at once (a pool of its own) */
    OP_CREATE3,          /* 254: OP_CREATE2 with a queue of 40..64 places */
};

static void run_input(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    for (int s = 0; s < FZ_SLOTS; s++) {
        fz_pools[s].slot = s;
        pool_reset(&fz_pools[s]);
    }
    memset(fz_tasks, 0, sizeof fz_tasks);
    fz_ntasks = 0;
    fz_ntrace = 0;
    fz_pool_gens = 0;
    for (int k = 0; k < FZ_CQS; k++) CHECK(!fz_cqs[k].live, "harness: a queue outlived its input");
    memset(fz_cqs, 0, sizeof fz_cqs);
    gates_reset();
    fz_main_log[0] = '\0';
    tp_log_id_set(NULL);

    for (int ops = 0; ops < FZ_MAX_OPS && in.i < in.n; ops++) {
        uint8_t ob = take(&in), a0 = take(&in);
        int op = ob >= 244 && ob <= 251   ? OP_BATCH
                 : ob == 252 || ob == 253 ? OP_BURST
                 : ob == 254              ? OP_CREATE3
                                          : ob % OP_COUNT;
        fz_pool *fp = &fz_pools[a0 & 1];
        switch (op) {
        case OP_CREATE: {
            uint8_t b[4] = {a0, take(&in), take(&in), take(&in)};
            op_create(fp, b, NULL, 0);
            break;
        }
        case OP_CREATE2:
        case OP_CREATE3: {
            uint8_t b[4] = {a0, take(&in), take(&in), take(&in)};
            uint8_t e[3] = {take(&in), take(&in), take(&in)};
            op_create(fp, b, e, op == OP_CREATE3 ? big_cap_of[take(&in) % 8u] : 0);
            break;
        }
        case OP_BATCH: {
            uint8_t b[5] = {a0, take(&in), take(&in), take(&in), take(&in)};
            int n = 2 + take(&in) % (FZ_BATCH_MAX - 1);      /* 2..8 */
            if (n > FZ_MAX_TASKS - FZ_MAX_OPS - fz_ntasks) { /* room for one task per op left */
                op_submit(fp, b, VIA_BATCH);
                break;
            }
            op_batch(fp, b, n);
            break;
        }
        case OP_WEIGHT: op_weight(fp, take(&in)); break;
        case OP_LANES: op_lanes(fp, a0); break;
        case OP_CQ: op_cq(a0, take(&in)); break;
        case OP_BURST: {
            uint8_t b[5] = {a0, take(&in), take(&in), take(&in), take(&in)};
            op_burst(b);
            break;
        }
        case OP_SUBMIT:
        case OP_SUBMIT2:
        case OP_DEFAULT:
        case OP_GSUBMIT: {
            uint8_t b[5] = {a0, take(&in), take(&in), take(&in), take(&in)};
            /* OP_SUBMIT2 with bit 5 of b[3] (a budget bit, unused without
             * bit 4): the same submit as a batch of one */
            int via = op == OP_DEFAULT                    ? VIA_DEFAULT
                      : op == OP_GSUBMIT                  ? VIA_GROUP
                      : (b[3] & 16)                       ? VIA_WAIT
                      : (op == OP_SUBMIT2 && (b[3] & 32)) ? VIA_BATCH
                      : (op == OP_SUBMIT && (b[3] & 32))  ? VIA_PLAIN
                                                          : VIA_SUBMIT;
            op_submit(fp, b, via);
            break;
        }
        case OP_GROUP: op_group(fp, a0, take(&in)); break;
        case OP_CONCURRENT: {
            uint8_t b[5] = {a0, take(&in), 0, 0, 0};
            op_concurrent(fp, b);
            break;
        }
        case OP_CANCEL: {
            uint8_t sel = take(&in);
            op_cancel(fp, sel, take(&in));
            break;
        }
        case OP_GATE:
            trace("open gate %d", (a0 >> 1) % FZ_GATES);
            harness_open_gate((a0 >> 1) % FZ_GATES);
            break;
        case OP_SETTLE:
            switch ((a0 >> 1) % 4) {
            case 0:
                trace("settle slot %d", fp->slot);
                settle(fp);
                break;
            case 1:
                trace("sleep 1 ms");
                sleep_ns(MS);
                break;
            case 2:
                trace("sleep 3 ms");
                sleep_ns(3 * MS);
                break;
            default:
                trace("settle all");
                for (int s = 0; s < FZ_SLOTS; s++) settle(&fz_pools[s]);
            }
            break;
        case OP_CLOSE:
            ensure_pool(fp);
            ex_sync(fp);
            trace("close slot %d", fp->slot);
            expect_rc(tp_close(fp->p), B_OK, "tp_close");
            fp->closed = true;
            /* an elastic pool adds no worker after close: a free one may be missing */
            if (fp->max_workers > fp->workers && (fp->xstuck > 0 || fzs_total(&fp->sim) > 0))
                ex_lose(fp, "an elastic pool closed");
            break;
        case OP_SHUTDOWN: op_shutdown(fp, a0 >> 1); break;
        case OP_WAIT: op_wait(fp, a0 >> 1); break;
        case OP_STATS: op_stats(fp); break;
        case OP_DESTROY: finish_pool(fp, (a0 >> 1) & 1); break;
        case OP_INVALID: op_invalid(fp, a0 >> 1); break;
        case OP_LOGID: op_logid(a0 >> 1); break;
        default: break;
        }
        if (fp->live && op != OP_STATS) check_running(fp, false);
        atomic_fetch_add(&fz_ops_total, 1);
    }
    /* The end: everything opens, every pool drains and is checked at rest,
     * then every completion queue is drained and destroyed. */
    for (int g = 0; g < FZ_GATES; g++) harness_open_gate(g);
    for (int s = 0; s < FZ_SLOTS; s++) finish_pool(&fz_pools[s], true);
    finish_cqs();
    CHECK(tp_default() == NULL, "a default pool is still registered");
    tp_log_id_set(NULL);
    atomic_fetch_add(&fz_inputs_total, 1);
    if (getenv("TP_FUZZ_TRACE")) { /* to see what an input does */
        for (int i = 0; i < fz_ntrace; i++) fprintf(stderr, "  %2d %s\n", i, fz_trace[i]);
        fprintf(stderr, "fuzz_pool: input passed\n");
    }
}

/* ------------------------------------------------------------ entry points */

static void report_at_exit(void) {
    fprintf(stderr,
            "fuzz_pool: %llu operations in %llu inputs, 0 violations (%llu return codes checked, %llu "
            "exactly predicted)\n",
            (unsigned long long)atomic_load(&fz_ops_total), (unsigned long long)atomic_load(&fz_inputs_total),
            (unsigned long long)atomic_load(&fz_checked), (unsigned long long)atomic_load(&fz_exact));
}

static void report_exact(void) {
    fprintf(stderr,
            "fuzz_pool: %llu starts predicted exactly (taskpool.h section 14), %llu completions drained, "
            "%llu answers to concurrent submitters checked\n",
            (unsigned long long)atomic_load(&fz_starts_predicted),
            (unsigned long long)atomic_load(&fz_drained), (unsigned long long)atomic_load(&fz_burst_checked));
    if (getenv("TP_FUZZ_STATS"))
        for (int i = 0; i < 24 && fz_lost[i].why; i++)
            fprintf(stderr, "fuzz_pool: exact model given up %llu times: %s\n", fz_lost[i].n, fz_lost[i].why);
    char buf[400];
    size_t n = 0;
    for (int c = 0; c >= TP_EBUSY; c--) {
        unsigned long long k = atomic_load(&fz_exact_rc[-c]);
        if (k) n += (size_t)snprintf(buf + n, sizeof buf - n, " %s %llu", tp_err_name(c), k);
    }
    fprintf(stderr, "fuzz_pool: exactly predicted:%s\n", n ? buf : " none");
}

static void fz_init(void) {
    fz_main_thread = pthread_self();
    gates_init();
    atexit(report_at_exit);
    atexit(report_exact); /* runs first */
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run_input(data, size);
    uint64_t inputs = atomic_load(&fz_inputs_total);
    if ((inputs & (inputs - 1)) == 0 || inputs % 5000 == 0) /* progress, for a run killed early */
        fprintf(stderr, "fuzz_pool: progress: %llu operations in %llu inputs\n",
                (unsigned long long)atomic_load(&fz_ops_total), (unsigned long long)inputs);
    return 0;
}

#ifdef TP_FUZZ_REPLAY
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_pool: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    run_input(buf, n);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int replay_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz_pool: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return replay_file(path);
    DIR *d = opendir(path);
    if (!d) return 1;
    char *names[4096];
    int n = 0, bad = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n]) break;
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        bad |= replay_file(names[i]);
        free(names[i]);
    }
    if (n == 0) {
        fprintf(stderr, "fuzz_pool: no inputs in %s\n", path);
        bad = 1;
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...  (replays fuzz inputs)\n", argv[0]);
        return 2;
    }
    fz_init();
    int bad = 0;
    int rounds = 1;
    const char *r = getenv("TP_FUZZ_ROUNDS");
    if (r && atoi(r) > 0) rounds = atoi(r);
    for (int k = 0; k < rounds; k++)
        for (int i = 1; i < argc; i++) bad |= replay_path(argv[i]);
    return bad;
}
#endif
