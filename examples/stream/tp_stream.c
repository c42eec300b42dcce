/*
 * tp_stream.c -- the Redis Streams consumer (see tp_stream.h for the design).
 *
 * Ownership, in one place: every field below the "I/O thread only" line is
 * read and written by the I/O thread alone. The pool's threads touch a slot
 * only between tp_submit() and the end of the task (the task reads the
 * message, writes `attempts`, `canceled`, `timed_out`, `gave_up`,
 * `retry_due`, the times and the result); every task is bound to the
 * consumer's completion queue (tp_cq), so its on_done runs on the I/O
 * thread inside tp_cq_drain(), and
 * the queue's lock orders the task's writes before it. Counters shown in
 * tps_stats are atomics. The timer heap (timers.h) is the I/O thread's alone.
 *
 * An entry's life in its slot:
 *   FREE -> (read, claimed, or due) -> [BACKLOG | OVERFLOW] -> POOL -> DONE -> FREE
 *   and short cuts: malformed, delivered too often or deleted -> DONE (dead);
 *   not due yet -> FREE, its id in the timer heap until due;
 *   held in the backlog at a stop, cancelled by a forced shutdown, refused
 *   by a closed pool, or read while stopping -> UNRUN -> FREE without an
 *   outcome: let_go leaves it pending in the group for another consumer,
 *   its delivery given back if it never ran, or writes its dead record if it
 *   was deleted from the stream meanwhile (UNRUN -> DONE).
 * A slot is FREE again only after its outcome record was written and the
 * entry acknowledged (write_outcomes), or after let_go, or when it ends
 * after a claim script recorded its entry meanwhile (recorded_list).
 *
 * Delivery counts: what Redis's count of a held entry must be at each step
 * is counts.h's table (pure rules); this file asks it at each step (admit,
 * claim, dispatch_due, let_go) and sends the XCLAIMs it calls for (through
 * scripts that check first whether the entry is still ours: scripts.h).
 *
 * The backlog (entries read but not in the pool) is kept per user and, within
 * a user, per priority lane; what each held entry waits for is stated at
 * hold() and is always an event that will come (see tp_stream.h).
 */
#define _GNU_SOURCE
#include "tp_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/time.h>
#include <unistd.h>

#include "counts.h"
#include "redis_conn.h"
#include "scripts.h"
#include "timers.h"

#define NIL                UINT32_MAX
#define LANES              (TP_PRIO_MAX - TP_PRIO_MIN + 1)
#define LANE_NORMAL        (0 - TP_PRIO_MIN) /* the lane of priority 0; lower lanes are background */
#define WRITE_BATCH        256u              /* outcomes per write round */
#define CLAIM_ARGS_MAX     1024u     /* arguments per hold script, two per id (heartbeat, lower_waiting) */
#define CLAIM_SCAN_MAX     10000u    /* pending entries a claim looks at, at most */
#define DUE_BATCH          256u      /* scheduled entries fetched per round */
#define LET_GO_BATCH       128u      /* entries per let-go script call */
#define OWN_WAIT_MAX       64u       /* own deleted ids waiting for the read in flight (own_deleted) */
#define TRIM_LIMIT         "1000000" /* entries one trim removes at most (about 10,000 nodes, a few ms) */
#define NUMS_PER_RECORD    5u        /* numbers printed per outcome record (write_outcomes) */
#define FIND_RECORDS_MAX   "100000"  /* records find_lost_writes looks at, at most */
#define REAP_IDLE_CLAIMS   5u        /* other consumers idle this many claim_idle, nothing pending: deleted */
#define BACKOFF_MIN_MS     100
#define BACKOFF_MAX_MS     2000 /* and at most claim_idle / 4 */
#define WRITE_RETRY_MIN_MS 200  /* a refused outcome batch is retried after this, */
#define WRITE_RETRY_MAX_MS 5000 /* doubling up to this */
#define CONNECT_TIMEOUT_MS 1000
#define COMMAND_TIMEOUT_MS 5000

enum { S_FREE, S_BACKLOG, S_OVERFLOW, S_POOL, S_DONE, S_UNRUN };
enum { OUT_OK, OUT_DEAD };
enum { SUB_NEW, SUB_DUE, SUB_AGAIN }; /* submit(): read or claimed, came due, from the backlog or overflow */

typedef struct slot {
    struct tps_consumer *c;
    uint32_t next; /* free list, a user's lane in the backlog, an overflow lane or the done list */
    uint8_t state;
    uint8_t outcome;
    uint8_t fresh;     /* claimed in the current claim batch */
    uint8_t claimed;   /* came by a claim (its delivery count is XPENDING's, see counts.h) */
    uint8_t due_guess; /* due_ms counts `defer` from when it was read: its id is ahead of the clock */
    uint8_t back;      /* S_UNRUN: give its delivery back when it is let go (let_go) */
    uint8_t unpended;  /* a hold script of ours acknowledged it deleted: its record is ours */
    uint8_t unsure;    /* a hold script's reply was lost while we held it: it may have done so (hold_lost) */
    uint8_t recorded;  /* a claim script of ours recorded it dead meanwhile: nothing more is written */
    uint8_t has_payload;
    uint8_t due;      /* its time has come: not scheduled again */
    uint8_t no_ack;   /* not pending any more (Redis 7 dropped it, or our script acknowledged it deleted) */
    uint8_t gave_up;  /* the entry's `attempts` ran out before the pool's retries */
    uint8_t written;  /* record written, acknowledgement still to do (write_outcomes) */
    uint64_t sent_ns; /* its record was sent then and the reply not read: maybe written */
    int8_t prio;      /* the entry's `priority` */
    /* written by the task, read in on_done (after the completion queue) */
    unsigned attempts;
    int canceled;
    int timed_out;
    int retry_due;                    /* the last attempt failed and the pool would retry it (run_task) */
    uint64_t started_ms, finished_ms; /* Unix ms: first attempt's start, last attempt's end */
    size_t result_len;
    /* the message */
    unsigned deliveries;
    unsigned max_attempts; /* 0: as the pool says */
    uint32_t fail;
    uint64_t work_ns;
    uint64_t due_ms; /* Unix ms; 0: at once */
    size_t id_len;
    size_t payload_len;
    const char *reason; /* dead: static text, or reason_buf */
    char reason_buf[96];
    char id[TPS_ID_MAX + 1];
    char user[TP_USER_MAX + 1];
    char payload[TPS_PAYLOAD_MAX];
    char result[TPS_RESULT_MAX];
} slot;

typedef struct due_ent { /* a scheduled entry taken from the heap to be fetched */
    char id[TPS_SCHED_ID_MAX + 1];
    size_t len;
    uint64_t due_ms;
    unsigned deliveries;
    unsigned flags;   /* TPS_SCHED_* */
    int gone;         /* deleted from the stream: a dead record if it is still ours */
    uint32_t slot;    /* the slot it was fetched into (admitted at the end), or NIL */
    int tell;         /* Redis must be told its run's count before it is admitted (counts.h) */
    const char *perr; /* its fields' error, if any */
} due_ent;

/* A user's held entries (user "" for entries without one), in a record that
 * stays put while it is in use (n_held > 0): records are linked into the
 * background round by index. */
typedef struct user_q {
    uint32_t head[LANES], tail[LANES]; /* FIFO per lane (priority - TP_PRIO_MIN) */
    uint32_t n_held, n_low;            /* held entries; of which in background lanes */
    uint32_t rr_prev, rr_next;         /* the background round, while n_low > 0 */
    uint32_t next_free;
    uint8_t at_limit; /* a submit met TP_EUSERLIMIT since the user's last completion */
    char user[TP_USER_MAX + 1];
} user_q;

struct tps_consumer {
    /* configuration, immutable after tps_create */
    char stream[TPS_NAME_MAX + 1], group[TPS_NAME_MAX + 1], consumer[TPS_NAME_MAX + 1];
    char results[TPS_NAME_MAX + 1], dead[TPS_NAME_MAX + 1];
    char writer[17]; /* every record's `writer`: 16 random hex digits of this tps_create (find_lost_writes) */
    char group_start[2];
    char results_maxlen[24], dead_maxlen[24]; /* "0": unbounded */
    tps_redis_addr addr;
    tp_pool *pool;
    unsigned pool_capacity, queue_capacity, nslots, max_deliveries, block_ms, max_retries;
    unsigned low_cap; /* background entries in the pool at most; 0: no limit */
    unsigned backoff_max_ms;
    uint64_t claim_idle_ns, trim_interval_ns;
    tps_handler handler;
    void *handler_arg;
    tps_log_fn log;
    void *log_arg;

    /* completions: pool threads -> I/O thread (on_done runs in tp_cq_drain) */
    tp_cq *cq;

    /* control: application thread -> I/O thread */
    int ctl_fd; /* an eventfd: tps_stop_reading and tps_finish wake the I/O thread with it */
    atomic_int ctl_pending;
    atomic_int stop_reading, finishing;
    atomic_ullong finish_deadline;
    int finish_result;
    int destroying; /* tps_destroy drains the queue: on_done submits nothing more */
    pthread_t thread;
    int started;

    /* counters */
    atomic_ullong n_read, n_claimed, n_acked, n_succeeded, n_dead, n_malformed, n_ack_missed, n_abandoned,
        n_user_waits, n_low_prio_waits, n_reconnects, n_deleted, n_scheduled, n_write_failures, n_trimmed,
        g_held, g_backlog, g_unwritten, g_connected, g_waiting;

    /* ---- I/O thread only ---- */
    slot *slots;
    uint32_t free_head, n_free, n_pool, n_backlog;
    uint32_t n_low_admitted; /* background entries in the pool or the overflow lists */
    uint32_t overflow_head[LANES], overflow_tail[LANES], n_overflow;
    uint32_t done_head, done_tail, n_done;
    uint32_t unrun_head, unrun_tail, n_unrun; /* S_UNRUN: to let go (let_go) */
    uint32_t *ids;                            /* open addressing: slot index + 1, 0 = empty */
    uint32_t ids_mask;
    tps_sched *sched; /* entries not due yet */
    user_q *users;    /* nslots records: no more users than held entries */
    uint32_t *uidx;   /* open addressing over the records in use: record index + 1, 0 = empty */
    uint32_t uidx_mask, users_free;
    uint32_t rr_head, rr_tail, rr_len; /* the background round: users with held background entries */
    redisContext *rd, *wr;             /* reader, writer */
    /* The writer's and the reader's CLIENT ID and their server's run_id (0
     * and "": unknown), and those of the last ones closed that no
     * fence_old_connections has killed yet; fence_logged: the fence's
     * unavailability was logged once. */
    long long wr_id, rd_id, old_wr_id, old_rd_id;
    char run_id[41], old_run_id[41];
    int fence_logged;
    int reap_logged;           /* a refused reap_consumers was logged */
    unsigned read_outstanding; /* COUNT of the XREADGROUP in flight, 0 if none */
    uint32_t count_replies;    /* hold replies pipelined by set_count(), own_deleted(), heartbeat_own() */
    uint32_t n_lower;          /* heap entries flagged TPS_SCHED_LOWER since lower_waiting() */
    uint64_t read_sent_ns;
    uint64_t read_seq; /* reads ended (reply taken in, or the reader closed): own_deleted */
    int connected_once, connect_failed, stopped_applied;
    int read_failed; /* receive_read failed inside write_outcomes: io_main disconnects */
    unsigned backoff_ms, write_retry_ms, let_go_retry_ms;
    uint64_t let_go_retry_at; /* 0, or while a refused let-go script waits for its retry */
    uint64_t next_connect_ns, next_heartbeat_ns, next_claim_ns, next_trim_ns;
    uint64_t write_blocked_until; /* 0, or while a refused batch waits for its retry: no reading */
    char claim_cursor[TPS_ID_MAX + 1];
    /* The floors of find_lost_writes: an id the results (dead) stream had
     * reached before any record in flight was sent ("0-0": unknown). */
    char results_floor[TPS_ID_MAX + 1], dead_floor[TPS_ID_MAX + 1];
    due_ent *due_buf;    /* scratch of dispatch_due() */
    char (*numbuf)[24];  /* scratch of write_outcomes(): numbers of one batch */
    uint32_t *claim_got; /* scratch of claim(): slots claimed in one batch */
    struct own_wait {    /* own_deleted: ids in no slot, seen while a read was in flight */
        uint64_t seq;    /* read_seq then: settled once a read ended after it */
        size_t len;
        char id[TPS_ID_MAX + 1];
    } own_wait[OWN_WAIT_MAX];
    uint32_t n_own_wait;
    struct own_wait own_settle[OWN_WAIT_MAX]; /* scratch of own_wait_take(): the ids being settled */
    const char **claim_err;
    const char **argv; /* scratch for building commands */
    size_t *argvlen;
    size_t argcap;
};

/* ------------------------------------------------------------------ logging */

static void logkv(tps_consumer *c, int level, const char *event, const char *const *kv, size_t n) {
    if (c->log != NULL) c->log(c->log_arg, level, event, kv, n);
}

static void log1(tps_consumer *c, int level, const char *event, const char *k, const char *v) {
    const char *kv[2] = {k, v};
    logkv(c, level, event, kv, k != NULL ? 1 : 0);
}

static uint64_t ms_ns(uint64_t ms) { return ms * 1000000ull; }

static void cnt_add(atomic_ullong *a, uint64_t v) { atomic_fetch_add_explicit(a, v, memory_order_relaxed); }
static void cnt_set(atomic_ullong *a, uint64_t v) { atomic_store_explicit(a, v, memory_order_relaxed); }

static void update_gauges(tps_consumer *c) {
    cnt_set(&c->g_held, c->nslots - c->n_free);
    cnt_set(&c->g_backlog, c->n_backlog + c->n_overflow);
    cnt_set(&c->g_unwritten, c->n_done);
    cnt_set(&c->g_waiting, tps_sched_count(c->sched));
}

/* ------------------------------------------------------------------ hashing */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t ids_find(tps_consumer *c, const char *id, size_t len) {
    for (uint32_t i = hash_bytes(id, len) & c->ids_mask;; i = (i + 1) & c->ids_mask) {
        uint32_t v = c->ids[i];
        if (v == 0) return NIL;
        slot *s = &c->slots[v - 1];
        if (s->id_len == len && memcmp(s->id, id, len) == 0) return v - 1;
    }
}

/* Whether `id` waits in the timer heap (its lookup skipped while it is empty). */
static int in_heap(tps_consumer *c, const char *id, size_t len) {
    return tps_sched_count(c->sched) > 0 && tps_sched_has(c->sched, id, len);
}

static void ids_insert(tps_consumer *c, uint32_t idx) {
    slot *s = &c->slots[idx];
    uint32_t i = hash_bytes(s->id, s->id_len) & c->ids_mask;
    while (c->ids[i] != 0) i = (i + 1) & c->ids_mask;
    c->ids[i] = idx + 1;
}

/* Linear probing with backward-shift deletion: no tombstones. */
static void ids_remove(tps_consumer *c, uint32_t idx) {
    slot *s = &c->slots[idx];
    uint32_t i = hash_bytes(s->id, s->id_len) & c->ids_mask;
    while (c->ids[i] != idx + 1) i = (i + 1) & c->ids_mask;
    for (uint32_t j = (i + 1) & c->ids_mask; c->ids[j] != 0; j = (j + 1) & c->ids_mask) {
        slot *o = &c->slots[c->ids[j] - 1];
        uint32_t home = hash_bytes(o->id, o->id_len) & c->ids_mask;
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & c->ids_mask) >= ((j - i) & c->ids_mask)) {
            c->ids[i] = c->ids[j];
            i = j;
        }
    }
    c->ids[i] = 0;
}

/* The user's record, taking a free one when `create`; NULL when absent. */
static user_q *users_get(tps_consumer *c, const char *user, int create) {
    size_t len = strlen(user);
    for (uint32_t i = hash_bytes(user, len) & c->uidx_mask;; i = (i + 1) & c->uidx_mask) {
        uint32_t v = c->uidx[i];
        if (v == 0) {
            if (!create) return NULL;
            uint32_t r = c->users_free; /* never NIL: a record per held entry at most */
            user_q *q = &c->users[r];
            c->users_free = q->next_free;
            memcpy(q->user, user, len + 1);
            for (int l = 0; l < LANES; l++) q->head[l] = q->tail[l] = NIL;
            q->n_held = q->n_low = 0;
            q->rr_prev = q->rr_next = NIL;
            q->at_limit = 0;
            c->uidx[i] = r + 1;
            return q;
        }
        if (strcmp(c->users[v - 1].user, user) == 0) return &c->users[v - 1];
    }
}

/* The record holds nothing any more: out of the index, back to the free list. */
static void users_release(tps_consumer *c, user_q *q) {
    uint32_t r = (uint32_t)(q - c->users);
    uint32_t i = hash_bytes(q->user, strlen(q->user)) & c->uidx_mask;
    while (c->uidx[i] != r + 1) i = (i + 1) & c->uidx_mask;
    for (uint32_t j = (i + 1) & c->uidx_mask; c->uidx[j] != 0; j = (j + 1) & c->uidx_mask) {
        const char *name = c->users[c->uidx[j] - 1].user;
        uint32_t home = hash_bytes(name, strlen(name)) & c->uidx_mask;
        if (((j - home) & c->uidx_mask) >= ((j - i) & c->uidx_mask)) {
            c->uidx[i] = c->uidx[j];
            i = j;
        }
    }
    c->uidx[i] = 0;
    q->next_free = c->users_free;
    c->users_free = r;
}

/* Every record free again (tps_create, apply_stop). */
static void users_reset(tps_consumer *c) {
    memset(c->uidx, 0, (size_t)(c->uidx_mask + 1) * sizeof *c->uidx);
    for (uint32_t r = 0; r < c->nslots; r++) c->users[r].next_free = r + 1 < c->nslots ? r + 1 : NIL;
    c->users_free = 0;
    c->rr_head = c->rr_tail = NIL;
    c->rr_len = 0;
}

/* The background round: a FIFO of records, each user with held background
 * entries once. */
static void round_append(tps_consumer *c, user_q *q) {
    uint32_t r = (uint32_t)(q - c->users);
    q->rr_next = NIL;
    q->rr_prev = c->rr_tail;
    if (c->rr_tail != NIL)
        c->users[c->rr_tail].rr_next = r;
    else
        c->rr_head = r;
    c->rr_tail = r;
    c->rr_len++;
}

static void round_remove(tps_consumer *c, user_q *q) {
    if (q->rr_prev != NIL)
        c->users[q->rr_prev].rr_next = q->rr_next;
    else
        c->rr_head = q->rr_next;
    if (q->rr_next != NIL)
        c->users[q->rr_next].rr_prev = q->rr_prev;
    else
        c->rr_tail = q->rr_prev;
    q->rr_prev = q->rr_next = NIL;
    c->rr_len--;
}

/* ------------------------------------------------------------------ slots and lists */

static uint32_t slot_alloc(tps_consumer *c) {
    uint32_t i = c->free_head;
    if (i == NIL) return NIL;
    c->free_head = c->slots[i].next;
    c->n_free--;
    slot *s = &c->slots[i];
    s->next = NIL;
    s->fresh = s->claimed = s->due_guess = s->back = s->unpended = s->unsure = s->recorded = 0;
    s->has_payload = 0;
    s->due = s->no_ack = s->gave_up = s->written = 0;
    s->sent_ns = 0;
    s->prio = 0;
    s->attempts = 0;
    s->canceled = s->timed_out = s->retry_due = 0;
    s->started_ms = s->finished_ms = 0;
    s->result_len = 0;
    s->deliveries = 1;
    s->max_attempts = 0;
    s->fail = 0;
    s->work_ns = 0;
    s->due_ms = 0;
    s->payload_len = 0;
    s->reason = NULL;
    s->user[0] = '\0';
    return i;
}

/* Forget the entry (after its outcome is written, or to leave it pending). */
static void slot_free(tps_consumer *c, uint32_t i) {
    ids_remove(c, i);
    c->slots[i].state = S_FREE;
    c->slots[i].next = c->free_head;
    c->free_head = i;
    c->n_free++;
}

static void list_push(tps_consumer *c, uint32_t *head, uint32_t *tail, uint32_t i) {
    c->slots[i].next = NIL;
    if (*head == NIL)
        *head = i;
    else
        c->slots[*tail].next = i;
    *tail = i;
}

static void list_push_front(tps_consumer *c, uint32_t *head, uint32_t *tail, uint32_t i) {
    c->slots[i].next = *head;
    *head = i;
    if (*tail == NIL) *tail = i;
}

static uint32_t list_pop(tps_consumer *c, uint32_t *head, uint32_t *tail) {
    uint32_t i = *head;
    if (i != NIL) {
        *head = c->slots[i].next;
        if (*head == NIL) *tail = NIL;
    }
    return i;
}

static void finish_dead(tps_consumer *c, uint32_t i, const char *reason) {
    slot *s = &c->slots[i];
    s->state = S_DONE;
    s->outcome = OUT_DEAD;
    s->reason = reason;
    list_push(c, &c->done_head, &c->done_tail, i);
    c->n_done++;
}

/* The end of a slot whose entry a claim script recorded dead meanwhile
 * (recorded_list): no second record; the log says what became of it. */
static void outcome_dropped(tps_consumer *c, const slot *s) {
    const char *kv[] = {
        "id",      s->id,
        "outcome", s->state != S_DONE ? "unfinished" : s->outcome == OUT_OK ? "succeeded" : "failed",
        "reason",  "recorded dead by a script meanwhile (after a stall)"};
    logkv(c, TP_LOG_WARN, "outcome_dropped", kv, 3);
}

/* Slot i is let go without an outcome of ours (a stop, a forced shutdown, a
 * closed pool): S_UNRUN until let_go() has looked at it in Redis (a deleted
 * entry gets its dead record) and, with `back`, given its delivery back; or
 * at once its dead record, if a script of ours acknowledged it deleted; or
 * freed, if a peer's claim script recorded it meanwhile (recorded_list). */
static void let_go_later(tps_consumer *c, uint32_t i, int back) {
    slot *s = &c->slots[i];
    if (s->recorded) { /* recorded and acknowledged already (recorded_list) */
        outcome_dropped(c, s);
        slot_free(c, i);
        return;
    }
    if (s->unpended) { /* acknowledged deleted by a script of ours: its record, nothing to ask Redis */
        cnt_add(&c->n_deleted, 1);
        finish_dead(c, i,
                    s->attempts == 0 ? "entry deleted before it ran" : "entry deleted before its run ended");
        return;
    }
    c->slots[i].state = S_UNRUN;
    c->slots[i].back = (uint8_t)back;
    list_push(c, &c->unrun_head, &c->unrun_tail, i);
    c->n_unrun++;
}

static unsigned lane_of(const slot *s) { return (unsigned)(s->prio - TP_PRIO_MIN); }

/* ------------------------------------------------------------------ message parsing */

int tps_default_handler(tp_ctx *ctx, const tps_msg *msg, void *arg) {
    (void)arg;
    if (msg->fail == TPS_FAIL_ALWAYS || tp_ctx_attempt(ctx) < msg->fail) return TPS_RUN_FAILED;
    if (msg->work_ns > 0) {
        int rc = tp_ctx_sleep(ctx, msg->work_ns);
        if (rc == TP_ETIMEDOUT) return TPS_RUN_TIMEDOUT;
        if (rc != 0) return TPS_RUN_CANCELED;
    }
    if (msg->payload != NULL) (void)tps_set_result(msg, msg->payload, msg->payload_len);
    return 0;
}

int tps_set_result(const tps_msg *msg, const void *data, size_t len) {
    slot *s = msg->internal;
    if (len > TPS_RESULT_MAX) return -1;
    memcpy(s->result, data, len);
    s->result_len = len;
    return 0;
}

/* Fill slot s from a fields array [name, value, ...] (entry.h); NULL on
 * success or a static reason. */
static const char *parse_fields(slot *s, const redisReply *f) {
    if (f == NULL || f->type != REDIS_REPLY_ARRAY) return "entry: no fields (deleted from the stream?)";
    if (f->elements % 2 != 0) return "entry: odd number of field elements";
    tps_entry e;
    tps_entry_init(&e);
    for (size_t k = 0; k + 1 < f->elements; k += 2) {
        const redisReply *name = f->element[k], *val = f->element[k + 1];
        if (name->type != REDIS_REPLY_STRING || val->type != REDIS_REPLY_STRING)
            return "entry: a field is not a string";
        const char *why = tps_entry_field(&e, name->str, name->len, val->str, val->len);
        if (why != NULL) return why;
    }
    const char *why = tps_entry_finish(&e);
    if (why != NULL) return why;
    memcpy(s->user, e.user, strlen(e.user) + 1);
    s->work_ns = e.work_ns;
    s->fail = e.fail;
    s->max_attempts = e.attempts;
    s->prio = (int8_t)e.priority;
    uint64_t now = tps_unix_ms(), at = tps_enqueued_ms(s->id, s->id_len, now);
    s->due_ms = tps_entry_due_ms(&e, at);
    /* A due time counted from this read is no evidence that the entry never
     * ran before (each claim puts it off again): never set back (counts.h). */
    s->due_guess = (uint8_t)(e.defer_ms != 0 && e.not_before == 0 && at != tps_id_ms(s->id, s->id_len));
    if (e.payload != NULL) {
        memcpy(s->payload, e.payload, e.payload_len);
        s->payload_len = e.payload_len;
        s->has_payload = 1;
    }
    return NULL;
}

/* ------------------------------------------------------------------ the task */

/* Attempts an entry may take per delivery: its `attempts` field lowers the
 * pool's max_retries + 1, never raises it (the pool does the retrying). */
static unsigned max_attempts(const tps_consumer *c, const slot *s) {
    unsigned pool = c->max_retries + 1;
    return s->max_attempts != 0 && s->max_attempts < pool ? s->max_attempts : pool;
}

static int run_task(tp_ctx *ctx, void *arg) {
    slot *s = arg;
    tps_consumer *c = s->c;
    unsigned limit = max_attempts(c, s);
    tps_msg m = {
        .id = s->id,
        .user = s->user[0] != '\0' ? s->user : NULL,
        .work_ns = s->work_ns,
        .fail = s->fail,
        .priority = s->prio,
        .payload = s->has_payload ? s->payload : NULL,
        .payload_len = s->payload_len,
        .deliveries = s->deliveries,
        .max_attempts = limit,
        .internal = s,
    };
    s->attempts = tp_ctx_attempt(ctx) + 1;
    if (s->attempts == 1) s->started_ms = tps_unix_ms();
    s->result_len = 0;
    int rc = c->handler(ctx, &m, c->handler_arg);
    s->finished_ms = tps_unix_ms();
    int err = tp_ctx_err(ctx);
    s->canceled = err == TP_ECANCELED;
    s->timed_out = err == TP_ETIMEDOUT;
    if (rc != 0 && !s->canceled && s->attempts >= limit && s->attempts < c->max_retries + 1) {
        /* The entry's own limit: a running task cancelled by itself ends
         * with what it returns and is not retried. */
        s->gave_up = 1;
        (void)tp_cancel(c->pool, tp_ctx_id(ctx));
    }
    /* What the pool decides after this return (life.c: a failed attempt not
     * cancelled -- a run timeout is not a cancellation -- with retries left,
     * is retried): if on_done comes instead, the pool ended the task
     * without that retry. */
    s->retry_due = rc != 0 && !s->canceled && !s->gave_up && s->attempts < c->max_retries + 1;
    return rc;
}

/* ------------------------------------------------------------------ the backlog
 *
 * An entry that is read (or claimed, or came due) but cannot go into the pool
 * now is *held* in its user's record, in the FIFO of its priority lane. Two
 * reasons, each with the event that ends the wait:
 *   the user is at MAX_PER_USER (tp_submit said TP_EUSERLIMIT, or an earlier
 *     entry of the user in the same or a higher lane is held): one of the
 *     user's entries is in the pool (or the overflow lists), and its end
 *     submits the user's best held entry of a lane >= 0 (dispatch_user);
 *   a background entry (priority < 0) while low_cap of them are in the pool:
 *     one of those ends, and the background round submits the next held
 *     background entry, one user after the other (release_low).
 * An entry never waits behind held entries of a lower lane: an urgent entry
 * of a user passes the user's held normal entries, and goes into the pool at
 * once unless the user is at its limit (then it is the next of the user's
 * entries to start). Within a lane, a held entry keeps its read order, except
 * that an entry that came due goes before the lane's entries that did not
 * (it was read earlier and has waited for its time already).
 */

enum { HOLD_BACK, HOLD_FRONT, HOLD_DUE };

/* Is any entry of a lane >= `lane` held for this user? */
static int held_from(const user_q *q, unsigned lane) {
    for (unsigned l = lane; l < LANES; l++)
        if (q->head[l] != NIL) return 1;
    return 0;
}

static void hold(tps_consumer *c, uint32_t i, int where) {
    slot *s = &c->slots[i];
    user_q *q = users_get(c, s->user, 1);
    unsigned l = lane_of(s);
    s->state = S_BACKLOG;
    if (where == HOLD_FRONT) {
        list_push_front(c, &q->head[l], &q->tail[l], i);
    } else if (where == HOLD_DUE && q->head[l] != NIL && c->slots[q->head[l]].due) {
        uint32_t k = q->head[l]; /* after the lane's due entries, before the others */
        while (c->slots[k].next != NIL && c->slots[c->slots[k].next].due) k = c->slots[k].next;
        s->next = c->slots[k].next;
        c->slots[k].next = i;
        if (s->next == NIL) q->tail[l] = i;
    } else if (where == HOLD_DUE) {
        list_push_front(c, &q->head[l], &q->tail[l], i);
    } else {
        list_push(c, &q->head[l], &q->tail[l], i);
    }
    q->n_held++;
    if (s->prio < 0 && q->n_low++ == 0) round_append(c, q);
    c->n_backlog++;
}

/* Take the head of lane l of q; q may be released. */
static uint32_t unhold(tps_consumer *c, user_q *q, unsigned l) {
    uint32_t i = list_pop(c, &q->head[l], &q->tail[l]);
    q->n_held--;
    if (l < LANE_NORMAL && --q->n_low == 0) round_remove(c, q);
    if (q->n_held == 0) users_release(c, q);
    c->n_backlog--;
    return i;
}

static int low_capped(const tps_consumer *c, const slot *s) {
    return s->prio < 0 && c->low_cap != 0 && c->n_low_admitted >= c->low_cap;
}

static void on_done(void *arg, int status);

/*
 * Submit slot i, or hold it. SUB_NEW / SUB_DUE: a new entry (read, claimed,
 * or came due), held when an entry of its user in the same or a higher lane
 * is held already (their order is kept), or when it is a background entry
 * and low_cap of them are in the pool. SUB_AGAIN: an entry taken from the
 * head of a held lane or of an overflow lane, submitted as it is, and put back
 * at the head of its list when refused again.
 */
static void submit(tps_consumer *c, uint32_t i, int how) {
    slot *s = &c->slots[i];
    int counted = s->state == S_OVERFLOW && s->prio < 0; /* in n_low_admitted already */
    if (how != SUB_AGAIN) {
        user_q *q = users_get(c, s->user, 0);
        int capped = low_capped(c, s);
        if (capped || (q != NULL && held_from(q, lane_of(s)))) {
            hold(c, i, how == SUB_DUE ? HOLD_DUE : HOLD_BACK);
            cnt_add(capped ? &c->n_low_prio_waits : &c->n_user_waits, 1);
            return;
        }
    }
    tp_task_opts o = {.user = s->user[0] != '\0' ? s->user : NULL,
                      .on_done = on_done,
                      .log_id = s->id,
                      .priority = s->prio,
                      .cq = c->cq};
    int rc = tp_submit(c->pool, run_task, s, &o, NULL);
    if (rc == TP_OK) {
        s->state = S_POOL;
        c->n_pool++;
        if (s->prio < 0 && !counted) c->n_low_admitted++;
    } else if (rc == TP_EUSERLIMIT) {
        if (counted) c->n_low_admitted--;
        hold(c, i, how == SUB_AGAIN ? HOLD_FRONT : HOLD_BACK); /* SUB_NEW: its lane is empty */
        users_get(c, s->user, 0)->at_limit = 1;
        if (how != SUB_AGAIN) cnt_add(&c->n_user_waits, 1);
    } else if (rc == TP_ECLOSED) {
        if (counted) c->n_low_admitted--;
        let_go_later(c, i, 1); /* shutting down: it never ran, left pending for another consumer */
    } else {                   /* TP_EFULL (a moment before a worker picks), TP_ENOMEM */
        unsigned l = lane_of(s);
        if (s->prio < 0 && !counted) c->n_low_admitted++;
        s->state = S_OVERFLOW;
        if (how == SUB_AGAIN)
            list_push_front(c, &c->overflow_head[l], &c->overflow_tail[l], i);
        else
            list_push(c, &c->overflow_head[l], &c->overflow_tail[l], i);
        c->n_overflow++;
    }
}

static void arg(tps_consumer *c, size_t *argc, const char *s, size_t len);
static void args(tps_consumer *c, size_t *argc, const char *s);

/* The start of the hold script (scripts.h) for ids this consumer holds,
 * with a delivery count to set ("" for none); the ids follow, each with
 * hold_arg. The argument count. */
static size_t hold_begin(tps_consumer *c, const char *count) {
    size_t argc = 0;
    args(c, &argc, "EVAL");
    args(c, &argc, tps_script_hold);
    args(c, &argc, "2");
    args(c, &argc, c->stream);
    args(c, &argc, c->dead);
    args(c, &argc, c->group);
    args(c, &argc, c->consumer);
    args(c, &argc, count);
    args(c, &argc, c->dead_maxlen);
    return argc;
}

/* An id for the hold script: `in_slot` if a slot of ours holds it (its
 * record, if deleted, is ours to write: "K"), else the script records it
 * ("R": waiting for its time, or let go unheld). */
static void hold_arg(tps_consumer *c, size_t *argc, const char *id, size_t len, int in_slot) {
    arg(c, argc, id, len);
    args(c, argc, in_slot ? "K" : "R");
}

static int removed_by_us(tps_consumer *c, const char *id, size_t len);

/* A hold script's reply was lost (the connection failed, or timed out while
 * Redis went on): it may have acknowledged deleted entries of our slots,
 * whose records are ours, and we will not hear of them (those outside a
 * slot it recorded itself). Every slot that could be in one is marked: one
 * found deleted and no longer pending when it is let go gets its record
 * from us (let_go; a slot in the pool writes its outcome anyway) -- two
 * records if a peer's claim took it meanwhile, which it does only after a
 * stall longer than claim_idle; never none. S_FREE slots too: one taken
 * but not admitted yet (dispatch_due's) reads it, and slot_alloc clears it. */
static void hold_lost(tps_consumer *c) {
    for (uint32_t i = 0; i < c->nslots; i++)
        if (c->slots[i].state != S_UNRUN) c->slots[i].unsure = 1;
}

/* Ids a script recorded dead itself (deleted from the stream: scripts.h):
 * counted and logged as the worker's own dead records are, and out of the
 * heap if one waited there. The claim script leaves this consumer's own
 * entries to the hold script (own_deleted), and a hold script records only
 * ids outside our slots; yet one may still be in a slot of ours: an entry a
 * peer claimed from this worker while it stalled (Redis busy, or this
 * process stopped, longer than claim_idle), which this worker still holds,
 * and which then went idle under the peer's name. Its record is written,
 * so the slot writes none: its task runs (or runs on: it cannot be taken
 * back), and its outcome is dropped when it ends (write_outcomes,
 * let_go_later, let_go). */
static void recorded_list(tps_consumer *c, const redisReply *r) {
    for (size_t k = 0; k < r->elements; k++) {
        const redisReply *id = r->element[k];
        if (id->type != REDIS_REPLY_STRING || id->len == 0 || id->len > TPS_ID_MAX) continue;
        if (tps_sched_count(c->sched) > 0) (void)tps_sched_remove(c->sched, id->str, id->len);
        uint32_t i = ids_find(c, id->str, id->len);
        if (i != NIL) c->slots[i].recorded = c->slots[i].no_ack = 1;
        cnt_add(&c->n_deleted, 1);
        cnt_add(&c->n_dead, 1);
        cnt_add(&c->n_acked, 1);
        const char *kv[] = {"id", id->str, "reason", "entry deleted before it ran"};
        logkv(c, TP_LOG_WARN, "dead", kv, 2);
    }
}

/* A hold script's reply {recorded, acknowledged} (scripts.h). */
static void hold_reply(tps_consumer *c, const redisReply *r);

/* The ids a hold script acknowledged because they were deleted from the
 * stream, for slots of ours ("K": its reply's second list): their records
 * are ours. */
static void removed_list(tps_consumer *c, const redisReply *r) {
    uint32_t lost = 0;
    for (size_t k = 0; k < r->elements; k++) {
        const redisReply *id = r->element[k];
        if (id->type == REDIS_REPLY_STRING && id->len > 0 && id->len <= TPS_ID_MAX)
            lost += removed_by_us(c, id->str, id->len) != 0;
    }
    if (lost > 0) { /* cannot happen: each is in a slot (replies are read at once); say so if it does */
        char num[16];
        snprintf(num, sizeof num, "%u", lost);
        log1(c, TP_LOG_ERROR, "deleted_entries_unrecorded", "count", num);
    }
}

static void hold_reply(tps_consumer *c, const redisReply *r) {
    if (r->elements >= 1 && r->element[0]->type == REDIS_REPLY_ARRAY) recorded_list(c, r->element[0]);
    if (r->elements >= 2 && r->element[1]->type == REDIS_REPLY_ARRAY) removed_list(c, r->element[1]);
}

/* Read the replies of `n` hold scripts pipelined on the writer (heartbeat,
 * lower_waiting, set_count): their ids to hold_reply, a refusal logged as
 * `event` (the entries keep their idle time or count: the next heartbeat,
 * or a claim, settles them). -1 when the connection failed: the replies
 * not read are lost, and hold_lost() marks the slots. */
static int read_hold_replies(tps_consumer *c, uint32_t n, const char *event) {
    for (; n > 0; n--) {
        redisReply *r = NULL;
        if (redisGetReply(c->wr, (void **)&r) != REDIS_OK) {
            hold_lost(c);
            return -1;
        }
        if (r->type == REDIS_REPLY_ARRAY)
            hold_reply(c, r);
        else
            log1(c, TP_LOG_WARN, event, "error", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
    }
    return 0;
}

/* Set an entry's delivery count in Redis (the hold script: XCLAIM to
 * ourselves with RETRYCOUNT and JUSTID, if it is still pending as ours;
 * `in_slot`: see hold_arg), pipelined on the writer: called from claim()
 * (and admit() under it) and dispatch_due(), which read the replies
 * (read_count_replies) before anything else is sent; never while the
 * writer has other commands in flight (write_outcomes). */
static void set_count(tps_consumer *c, const char *id, size_t len, unsigned deliveries, int in_slot) {
    char n[16];
    snprintf(n, sizeof n, "%u", deliveries);
    size_t argc = hold_begin(c, n);
    hold_arg(c, &argc, id, len, in_slot);
    if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) == REDIS_OK) c->count_replies++;
}

/* Read the replies of set_count(); -1 when the connection failed (the
 * counts stay one higher: never lower than the runs). */
static int read_count_replies(tps_consumer *c) {
    uint32_t n = c->count_replies;
    c->count_replies = 0;
    return read_hold_replies(c, n, "set_count_failed");
}

/* A new entry in slot i (read, claimed or due): dead, waiting for its time,
 * or into the pool, with the delivery count that counts.h's rules give it
 * (a claim that will not run now is set back: MAX_DELIVERIES judges the
 * deliveries that could run). A set-back or the count of a guessed-time
 * claim that finds the heap full is an XCLAIM with RETRYCOUNT (set_count);
 * if it is lost (connection, crash) the count stays one higher: never
 * lower than the deliveries that could run. */
static void admit(tps_consumer *c, uint32_t i, const char *parse_error) {
    slot *s = &c->slots[i];
    tps_admit_in in = {
        .from = s->due       ? TPS_FROM_DUE
                : s->claimed ? TPS_FROM_CLAIM
                             : TPS_FROM_READ,
        .deliveries = s->deliveries,
        .malformed = parse_error != NULL,
        .stopping = atomic_load(&c->stop_reading),
        .not_due = parse_error == NULL && !s->due && s->due_ms > tps_unix_ms(),
        .due_guess = s->due_guess,
    };
    tps_admit_plan p = tps_counts_admit(&in, c->max_deliveries);
    s->deliveries = p.deliveries;
    if (p.set_back) /* waiting for its time, or released: out of the slot */
        set_count(c, s->id, s->id_len, s->deliveries,
                  p.verdict != TPS_ADMIT_WAIT && p.verdict != TPS_ADMIT_RELEASE);
    switch (p.verdict) {
    case TPS_ADMIT_DEAD_COUNT:
        snprintf(s->reason_buf, sizeof s->reason_buf, "delivered %u times (MAX_DELIVERIES %u)", s->deliveries,
                 c->max_deliveries);
        finish_dead(c, i, s->reason_buf);
        break;
    case TPS_ADMIT_DEAD_MALFORMED:
        cnt_add(&c->n_malformed, 1);
        finish_dead(c, i, parse_error);
        break;
    case TPS_ADMIT_RELEASE:
        if (p.let_go_back)
            let_go_later(c, i, 1);
        else
            slot_free(c, i);
        break;
    case TPS_ADMIT_WAIT: {
        /* The heap has room for every entry a read can bring (read_room),
         * also while a claim adds to it: a claimed entry leaves the room
         * the read in flight may need, and finds the heap full when only
         * that is left; then it stays pending unheld and is claimed again
         * later (when its time has come, the claim runs it: up to
         * claim_idle * 1.5 late while the heap is that full). Should a
         * read's entry find it full all the same, it is let go with its
         * delivery given back, not left with a count that no run made. */
        uint32_t keep = in.from == TPS_FROM_CLAIM ? c->read_outstanding : 0;
        int rc = tps_sched_room(c->sched) > keep
                     ? tps_sched_add(c->sched, s->id, s->id_len, s->due_ms, p.heap_runs, p.heap_flags)
                     : -1;
        if (rc == 0 && (p.heap_flags & TPS_SCHED_LOWER)) c->n_lower++;
        if (rc == 0) cnt_add(&c->n_scheduled, 1);
        if (rc < 0) {
            log1(c, TP_LOG_WARN, "scheduled_full", "id", s->id);
            if (p.set_back_if_full)
                set_count(c, s->id, s->id_len, s->deliveries - 1, 0); /* it surely did not run */
            if (in.from == TPS_FROM_READ) {
                let_go_later(c, i, 1);
                break;
            }
        }
        slot_free(c, i);
        break;
    }
    case TPS_ADMIT_RUN: submit(c, i, s->due ? SUB_DUE : SUB_NEW); break;
    }
}

/* One of the user's entries ended, so the user has a free place in the
 * pool: its best held entry of a lane >= 0 goes in. With only background
 * entries held, one goes in if low_cap still allows after the round had its
 * go (release_low), i.e. when every other user of the round is blocked too;
 * else they wait for their turn in the round. */
static void dispatch_user(tps_consumer *c, const char *user) {
    user_q *q = users_get(c, user, 0);
    if (q == NULL) return;
    q->at_limit = 0;
    for (int l = LANES - 1; l >= 0; l--) {
        if (q->head[l] == NIL) continue;
        if (l < LANE_NORMAL && c->low_cap != 0 && c->n_low_admitted >= c->low_cap) return;
        submit(c, unhold(c, q, (unsigned)l), SUB_AGAIN);
        return;
    }
}

/* Room for background entries: the users of the round, in turn, each submit
 * their best held background entry, skipping users at their limit (whose own
 * completions come first) and users with held entries of a lane >= 0 (those
 * go first). Each user is visited at most once per call. */
static void release_low(tps_consumer *c) {
    for (uint32_t n = c->rr_len; n > 0 && c->rr_head != NIL && c->n_low_admitted < c->low_cap; n--) {
        user_q *q = &c->users[c->rr_head];
        round_remove(c, q); /* to the back of the round */
        round_append(c, q);
        if (q->at_limit || held_from(q, LANE_NORMAL)) continue;
        unsigned l = LANE_NORMAL - 1;
        while (q->head[l] == NIL) l--; /* n_low > 0: some background lane holds one */
        uint32_t i = unhold(c, q, l);
        submit(c, i, SUB_AGAIN);
        if (c->slots[i].state == S_OVERFLOW) return; /* the pool is full: the overflow goes first */
    }
}

/* After an entry of `user` ended: the background round when a background
 * place freed (first, so that the user whose entry ended takes its turn like
 * any other), then the user's next, then what the pool refused for room,
 * highest lane first. */
static void dispatch_after(tps_consumer *c, const char *user, int was_low) {
    if (was_low && c->low_cap != 0) release_low(c);
    if (user != NULL) dispatch_user(c, user);
    uint32_t n = c->n_overflow;
    for (int l = LANES - 1; l >= 0 && n > 0; l--) {
        while (c->overflow_head[l] != NIL && n-- > 0) {
            uint32_t i = list_pop(c, &c->overflow_head[l], &c->overflow_tail[l]);
            c->n_overflow--;
            /* It already passed its user's lane when it was first submitted:
             * going to the back of that lane now could leave it behind
             * entries that wait for a completion which will never come. */
            submit(c, i, SUB_AGAIN);
            if (c->slots[i].state == S_OVERFLOW) return; /* still full: wait for the next completion */
        }
    }
}

/* A task's end, on the I/O thread inside tp_cq_drain (the completion queue
 * orders the task's writes to the slot before this).
 *
 * `status` is the last attempt's return, or TP_ECANCELED for a task the pool
 * ended without running it (again): a handler may return any non-zero value,
 * TP_ECANCELED included, so the slot says which it was, not the status.
 *   never started, or a retry was due (a forced shutdown dropped it while it
 *     waited, or came between the failed attempt's return and the pool's
 *     decision, with that attempt's return as status): abandoned, left
 *     pending for another consumer;
 *   0: a success, also when a forced shutdown cancelled the run meanwhile
 *     (taskpool.h: the work was done; running it again elsewhere is worse);
 *   non-zero after a forced shutdown cancelled the run: abandoned too;
 *   non-zero otherwise: dead (no attempt left, or the entry's `attempts`). */
static void on_done(void *arg, int status) {
    slot *s = arg;
    tps_consumer *c = s->c;
    uint32_t i = (uint32_t)(s - c->slots);
    int was_low = s->prio < 0;
    c->n_pool--;
    if (was_low) c->n_low_admitted--;
    char user[TP_USER_MAX + 1];
    memcpy(user, s->user, strlen(s->user) + 1);
    int unrun = s->attempts == 0 || s->retry_due;
    if (unrun || (status != 0 && s->canceled && !s->gave_up)) {
        cnt_add(&c->n_abandoned, 1); /* forced shutdown: stays pending */
        if (c->destroying)
            slot_free(c, i);
        else
            let_go_later(c, i, s->attempts == 0); /* never started: its delivery is given back */
    } else if (status == 0) {
        s->state = S_DONE;
        s->outcome = OUT_OK;
        list_push(c, &c->done_head, &c->done_tail, i);
        c->n_done++;
    } else {
        snprintf(s->reason_buf, sizeof s->reason_buf, "%s after %u attempts (status %d)%s",
                 s->timed_out ? "timed out" : "failed", s->attempts, status,
                 s->gave_up ? " (the entry's attempts)" : "");
        finish_dead(c, i, s->reason_buf);
    }
    if (!c->destroying) dispatch_after(c, user, was_low);
}

/* ------------------------------------------------------------------ connections */

static void arg(tps_consumer *c, size_t *argc, const char *s, size_t len) {
    c->argv[*argc] = s;
    c->argvlen[*argc] = len;
    (*argc)++;
}

static void args(tps_consumer *c, size_t *argc, const char *s) { arg(c, argc, s, strlen(s)); }

static void disconnect(tps_consumer *c, const char *why, const char *detail) {
    if (c->rd == NULL && c->wr == NULL) return;
    char saved[128]; /* detail may point into a context freed below */
    snprintf(saved, sizeof saved, "%s", detail != NULL ? detail : "");
    if (c->rd != NULL) redisFree(c->rd);
    if (c->wr != NULL) redisFree(c->wr);
    c->rd = c->wr = NULL;
    if (c->wr_id != 0) { /* the next connections kill them (fence_old_connections) */
        c->old_wr_id = c->wr_id;
        c->old_rd_id = c->rd_id;
        memcpy(c->old_run_id, c->run_id, sizeof c->run_id);
        c->wr_id = c->rd_id = 0;
    }
    c->read_seq += c->read_outstanding > 0;
    c->read_outstanding = 0;
    c->read_failed = 0;
    c->count_replies = 0; /* replies of the closed writer */
    cnt_set(&c->g_connected, 0);
    char ms[24];
    snprintf(ms, sizeof ms, "%u", c->backoff_ms);
    const char *kv[] = {"reason", why, "error", saved, "retry_in_ms", ms};
    logkv(c, TP_LOG_WARN, "disconnected", kv, 3);
    c->next_connect_ns = tp_now_ns() + ms_ns(c->backoff_ms);
}

/* Run one command on the writer; the reply or NULL (connection failed; an
 * error reply is returned as is). */
static redisReply *wr_command(tps_consumer *c, size_t argc) {
    redisReply *r = NULL;
    if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK ||
        redisGetReply(c->wr, (void **)&r) != REDIS_OK)
        return NULL;
    return r;
}

/* A record id from a reply as a stream's floor (find_in); "" or anything
 * not an id leaves it. */
static void set_floor(char *floor, const redisReply *r) {
    if (r->type == REDIS_REPLY_STRING && r->len > 0 && r->len <= TPS_ID_MAX) {
        memcpy(floor, r->str, r->len);
        floor[r->len] = '\0';
    }
}

/* The floors of find_in at a connect with no record in flight: each
 * stream's newest id now (XREVRANGE + - COUNT 1; "0-0" for an empty or
 * absent stream), below every record sent from now on. With records in
 * flight the floors stay: a record Redis added from a lost call is newer
 * than a snapshot taken now, and must not be below the floor. -1 when the
 * connection failed. */
static int note_floors(tps_consumer *c) {
    for (uint32_t i = 0; i < c->nslots; i++)
        if (c->slots[i].sent_ns != 0) return 0;
    for (int k = 0; k < 2; k++) {
        size_t argc = 0;
        args(c, &argc, "XREVRANGE");
        args(c, &argc, k == 0 ? c->results : c->dead);
        args(c, &argc, "+");
        args(c, &argc, "-");
        args(c, &argc, "COUNT");
        args(c, &argc, "1");
        redisReply *r = wr_command(c, argc);
        if (r == NULL) return -1;
        char *floor = k == 0 ? c->results_floor : c->dead_floor;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 0)
            strcpy(floor, "0-0");
        else if (r->type == REDIS_REPLY_ARRAY && r->element[0]->type == REDIS_REPLY_ARRAY &&
                 r->element[0]->elements > 0)
            set_floor(floor, r->element[0]->element[0]);
        freeReplyObject(r); /* an error leaves the floor as it was: lower, never higher */
    }
    return 0;
}

/* 0 when `key` is a stream or absent; -1 with the reason in err otherwise
 * (the server's own error text, e.g. NOAUTH, when it refused TYPE). */
static int check_type(tps_consumer *c, const char *key, char *err, size_t errlen) {
    size_t argc = 0;
    args(c, &argc, "TYPE");
    args(c, &argc, key);
    redisReply *r = wr_command(c, argc);
    if (r == NULL) {
        snprintf(err, errlen, "TYPE %s: %s", key, c->wr->errstr);
        return -1;
    }
    int ok = r->type == REDIS_REPLY_STATUS && (strcmp(r->str, "stream") == 0 || strcmp(r->str, "none") == 0);
    if (!ok && r->type == REDIS_REPLY_STATUS) {
        snprintf(err, errlen, "key %s holds a %s, not a stream", key, r->str);
        const char *kv[] = {"key", key, "type", r->str};
        logkv(c, TP_LOG_ERROR, "wrong_key_type", kv, 2);
    } else if (!ok) {
        snprintf(err, errlen, "TYPE %s: %s", key, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    freeReplyObject(r);
    return ok ? 0 : -1;
}

static void fence_unavailable(tps_consumer *c, const char *why) {
    if (c->fence_logged) return;
    c->fence_logged = 1;
    log1(c, TP_LOG_WARN, "lost_write_fence_unavailable", "error", why);
}

/* Whether an error reply's code says "not now" (the server is loading,
 * busy with a script, or its cluster or master is down). */
static int transient_error(const char *e) {
    static const char *const codes[] = {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"};
    size_t n = strcspn(e, " ");
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strlen(codes[i]) == n && strncmp(e, codes[i], n) == 0) return 1;
    return 0;
}

/* A reply to one of the fence's commands: 1 when it is of `type`; -1 with
 * the error in err for an error that says "not now" (transient_error): the
 * connect fails and is retried, the old ids kept; 0 for any other reply
 * (NOPERM of an ACL, a command unknown or renamed away, a server or proxy
 * that does not have it, a reply of another type): the fence is not
 * available here (logged once) and the worker runs unfenced -- at worst a
 * second record, never a lost one, where a connect refused for good would
 * stop the worker. */
static int fence_reply(tps_consumer *c, const redisReply *r, int type, const char *what, char *err,
                       size_t errlen) {
    if (r->type == type) return 1;
    if (r->type == REDIS_REPLY_ERROR && transient_error(r->str)) {
        snprintf(err, errlen, "%s: %s", what, r->str);
        return -1;
    }
    char why[200];
    snprintf(why, sizeof why, "%s: %s", what, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    fence_unavailable(c, why);
    return 0;
}

/* CLIENT ID of `ctx` (the `role` connection) into *id (0: the fence is
 * not available). -1 with the reason in err when the connection failed or
 * Redis said "not now". */
static int client_id(tps_consumer *c, redisContext *ctx, const char *role, long long *id, char *err,
                     size_t errlen) {
    char what[32];
    snprintf(what, sizeof what, "CLIENT ID (%s)", role);
    *id = 0;
    size_t argc = 0;
    args(c, &argc, "CLIENT");
    args(c, &argc, "ID");
    redisReply *r = NULL;
    if (redisAppendCommandArgv(ctx, (int)argc, c->argv, c->argvlen) != REDIS_OK ||
        redisGetReply(ctx, (void **)&r) != REDIS_OK) {
        snprintf(err, errlen, "%s: %s", what, ctx->errstr);
        return -1;
    }
    int ok = fence_reply(c, r, REDIS_REPLY_INTEGER, what, err, errlen);
    if (ok == 1 && r->integer > 0)
        *id = r->integer;
    else if (ok == 1)
        fence_unavailable(c, "CLIENT ID: not a positive id");
    freeReplyObject(r);
    return ok < 0 ? -1 : 0;
}

/* CLIENT KILL ID `id` on the writer, logged (killed, or gone already, or the
 * fence not available). -1 as client_id. */
static int kill_client(tps_consumer *c, const char *role, long long id, char *err, size_t errlen) {
    char num[24];
    snprintf(num, sizeof num, "%lld", id);
    size_t argc = 0;
    args(c, &argc, "CLIENT");
    args(c, &argc, "KILL");
    args(c, &argc, "ID");
    args(c, &argc, num);
    redisReply *r = wr_command(c, argc);
    if (r == NULL) {
        snprintf(err, errlen, "CLIENT KILL: %s", c->wr->errstr);
        return -1;
    }
    int ok = fence_reply(c, r, REDIS_REPLY_INTEGER, "CLIENT KILL", err, errlen);
    if (ok == 1) {
        const char *kv[] = {"connection", role, "client_id", num, "killed", r->integer > 0 ? "1" : "0"};
        logkv(c, r->integer > 0 ? TP_LOG_WARN : TP_LOG_INFO, "old_connection_fenced", kv, 3);
    }
    freeReplyObject(r);
    return ok < 0 ? -1 : 0;
}

/*
 * The fence before the lost-write search (find_lost_writes). A closed
 * connection's commands may still reach Redis after the new connection's
 * search looked for their records (a partition that heals late, a stalled
 * server that reads the old socket late): a record found missing and
 * written again would then be written twice, and a late XREADGROUP would
 * take entries for a reader that is gone (run only once claimed, a
 * delivery counted). Killing the old connections by their CLIENT ID first
 * ends that: once CLIENT KILL has answered, every command an old connection
 * had sent has run or never will (Redis runs what it read of a client before
 * it sees the client's end, and a killed client's unread commands are
 * dropped with it), so the search that follows sees all they can ever
 * write. The ids are taken at connect with the server's run_id: a server
 * restarted since (another run_id) took the old connections with it, and
 * its ids start again, so an old id would name another client. Not
 * available (an ACL without CLIENT or INFO, a command renamed away, a Redis
 * before 5.0, a server or proxy without them; see fence_reply): logged
 * once, and the search runs unfenced as before (a second record possible,
 * never a lost one). What it does not cover: a command that ran before the
 * kill (an XREADGROUP that was waiting in Redis or ran when a stalled server
 * resumed still took its entries: claimed after claim_idle), and a proxy
 * between the worker and Redis that shares server connections among its
 * clients (the ids are the proxy's). Runs at connect, before the new connections read an entry or write a record or
 * an acknowledgement; sets the new connections' ids. 0, or -1 with the
 * reason in err when a connection failed or Redis said "not now" (the old
 * ids stay for the next connect).
 */
static int fence_old_connections(tps_consumer *c, long long *wr_id, long long *rd_id, char run_id[41],
                                 char *err, size_t errlen) {
    *rd_id = 0;
    run_id[0] = 0;
    if (client_id(c, c->wr, "writer", wr_id, err, errlen) != 0) return -1;
    if (*wr_id == 0) return 0;
    if (client_id(c, c->rd, "reader", rd_id, err, errlen) != 0) return -1;
    if (*rd_id == 0) { /* both or neither */
        *wr_id = 0;
        return 0;
    }
    size_t argc = 0;
    args(c, &argc, "INFO");
    args(c, &argc, "server");
    redisReply *r = wr_command(c, argc);
    if (r == NULL) {
        snprintf(err, errlen, "INFO: %s", c->wr->errstr);
        return -1;
    }
    int ok = fence_reply(c, r, REDIS_REPLY_STRING, "INFO server", err, errlen);
    const char *at = ok == 1 ? strstr(r->str, "run_id:") : NULL;
    if (at != NULL && strspn(at + 7, "0123456789abcdef") == 40) {
        memcpy(run_id, at + 7, 40);
        run_id[40] = 0;
    } else {
        if (ok == 1) fence_unavailable(c, "INFO server: no run_id");
        *wr_id = *rd_id = 0;
    }
    freeReplyObject(r);
    if (ok < 0) return -1;
    if (*wr_id == 0) return 0;
    if (strcmp(run_id, c->old_run_id) == 0) { /* else restarted: nothing of the old connections can run */
        if (c->old_wr_id != 0 && kill_client(c, "writer", c->old_wr_id, err, errlen) != 0) return -1;
        c->old_wr_id = 0; /* killed, gone, or the fence not available (not asked again) */
        if (c->old_rd_id != 0 && kill_client(c, "reader", c->old_rd_id, err, errlen) != 0) return -1;
    }
    c->old_wr_id = c->old_rd_id = 0;
    return 0;
}

static void try_connect(tps_consumer *c) {
    char err[300];
    c->wr = tps_redis_connect(&c->addr, CONNECT_TIMEOUT_MS, COMMAND_TIMEOUT_MS, err, sizeof err);
    if (c->wr != NULL)
        c->rd = tps_redis_connect(&c->addr, CONNECT_TIMEOUT_MS, COMMAND_TIMEOUT_MS, err, sizeof err);
    if (c->rd == NULL) {
        if (c->wr != NULL) redisFree(c->wr);
        c->wr = NULL;
        goto failed;
    }
    /* Refuse to work while a results or dead key is not a stream: the outcome
     * script would refuse every batch anyway. */
    if (check_type(c, c->results, err, sizeof err) != 0 || check_type(c, c->dead, err, sizeof err) != 0)
        goto failed_free;
    size_t argc = 0;
    args(c, &argc, "XGROUP");
    args(c, &argc, "CREATE");
    args(c, &argc, c->stream);
    args(c, &argc, c->group);
    args(c, &argc, c->group_start);
    args(c, &argc, "MKSTREAM");
    redisReply *r = wr_command(c, argc);
    if (r == NULL) {
        snprintf(err, sizeof err, "%s", c->wr->errstr);
        goto failed_free;
    }
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0) {
        snprintf(err, sizeof err, "XGROUP CREATE: %s", r->str);
        freeReplyObject(r);
        goto failed_free;
    }
    if (r->type != REDIS_REPLY_ERROR) {
        const char *kv[] = {"group", c->group, "start", c->group_start};
        logkv(c, TP_LOG_INFO, "group_created", kv, 2);
    }
    freeReplyObject(r);
    long long wr_id, rd_id;
    char run_id[41];
    if (fence_old_connections(c, &wr_id, &rd_id, run_id, err, sizeof err) != 0) goto failed_free;
    c->wr_id = wr_id;
    c->rd_id = rd_id;
    memcpy(c->run_id, run_id, sizeof c->run_id);
    if (note_floors(c) != 0) {
        snprintf(err, sizeof err, "XREVRANGE: %s", c->wr->errstr);
        goto failed_free;
    }

    uint64_t now = tp_now_ns();
    /* Refresh our entries' idle time before anyone (we included) claims them.
     * After a reconnect, peers may still be reconnecting: their entries look
     * idle until their own heartbeat runs, so the first claim waits one
     * claim_idle (peers retry within backoff_max_ms <= claim_idle / 4). So
     * does the first claim of a worker whose first connection failed: Redis
     * was away, and the live peers' entries look idle for the outage. */
    c->next_heartbeat_ns = now;
    c->next_claim_ns = c->connected_once || c->connect_failed ? now + c->claim_idle_ns : now;
    if (c->connected_once) cnt_add(&c->n_reconnects, 1);
    c->connected_once = 1;
    c->backoff_ms = BACKOFF_MIN_MS;
    cnt_set(&c->g_connected, 1);
    {
        char held[24];
        snprintf(held, sizeof held, "%u", c->nslots - c->n_free + tps_sched_count(c->sched));
        const char *kv[] = {"url", c->addr.shown, "consumer", c->consumer, "held", held};
        logkv(c, TP_LOG_INFO, "connected", kv, 3);
    }
    return;

failed_free:
    redisFree(c->rd);
    redisFree(c->wr);
    c->rd = c->wr = NULL;
failed:;
    char ms[24];
    snprintf(ms, sizeof ms, "%u", c->backoff_ms);
    const char *kv[] = {"url", c->addr.shown, "error", err, "retry_in_ms", ms};
    logkv(c, TP_LOG_WARN, "connect_failed", kv, 3);
    c->connect_failed = 1;
    c->next_connect_ns = tp_now_ns() + ms_ns(c->backoff_ms);
    c->backoff_ms = c->backoff_ms * 2 > c->backoff_max_ms ? c->backoff_max_ms : c->backoff_ms * 2;
}

/* ------------------------------------------------------------------ Redis work */

/* A refused record or acknowledgement: keep those outcomes, stop reading,
 * retry later, loudly. */
static void write_refused(tps_consumer *c, const char *error) {
    char retry[24], n[24];
    snprintf(retry, sizeof retry, "%u", c->write_retry_ms);
    snprintf(n, sizeof n, "%u", c->n_done);
    const char *kv[] = {
        "error",       error,
        "unwritten",   n,
        "retry_in_ms", retry,
        "effect",      "those entries stay unacknowledged; reading stopped until they can be written"};
    logkv(c, TP_LOG_ERROR, "outcome_write_failed", kv, 4);
    cnt_add(&c->n_write_failures, 1);
    c->write_blocked_until = tp_now_ns() + ms_ns(c->write_retry_ms);
    c->write_retry_ms =
        c->write_retry_ms * 2 > WRITE_RETRY_MAX_MS ? WRITE_RETRY_MAX_MS : c->write_retry_ms * 2;
}

/* Append the field pairs of slot s's record, in the README's order:
 * [reason], consumer, writer, attempts, deliveries, [user], [started_ms,
 * finished_ms], [result]; `num` holds NUMS_PER_RECORD numbers for it, the
 * last one the pair count (for the outcome script). Returns the pair count. */
static unsigned record_fields(tps_consumer *c, size_t *argc, const slot *s, char (*num)[24]) {
    int ran = s->started_ms != 0;
    unsigned pairs = 4 + (s->outcome == OUT_DEAD) + (s->user[0] != '\0') + 2 * ran + (s->result_len > 0);
    snprintf(num[0], 24, "%u", s->attempts);
    snprintf(num[1], 24, "%u", s->deliveries);
    snprintf(num[2], 24, "%llu", (unsigned long long)s->started_ms);
    snprintf(num[3], 24, "%llu", (unsigned long long)s->finished_ms);
    snprintf(num[4], 24, "%u", pairs);
    if (s->outcome == OUT_DEAD) {
        args(c, argc, "reason");
        args(c, argc, s->reason);
    }
    args(c, argc, "consumer");
    args(c, argc, c->consumer);
    args(c, argc, "writer");
    args(c, argc, c->writer);
    args(c, argc, "attempts");
    args(c, argc, num[0]);
    args(c, argc, "deliveries");
    args(c, argc, num[1]);
    if (s->user[0] != '\0') {
        args(c, argc, "user");
        args(c, argc, s->user);
    }
    if (ran) {
        args(c, argc, "started_ms");
        args(c, argc, num[2]);
        args(c, argc, "finished_ms");
        args(c, argc, num[3]);
    }
    if (s->result_len > 0) {
        args(c, argc, "result");
        arg(c, argc, s->result, s->result_len);
    }
    return pairs;
}

/* RESP written by hand for the results' XADDs: hiredis's formatter (a
 * printf-like call per argument) cost the I/O thread about as much as all
 * the rest it does per record. A record's command is at most RECORD_MAX
 * bytes: names of at most TPS_NAME_MAX, an id, a user, a result and four
 * numbers with their headers. */
#define RECORD_MAX (4 * TPS_NAME_MAX + TPS_ID_MAX + TP_USER_MAX + TPS_RESULT_MAX + 576)

static char *resp_num(char *p, uint64_t v) {
    char tmp[20];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0) *p++ = tmp[--n];
    return p;
}

static char *resp_head(char *p, char type, size_t n) {
    *p++ = type;
    p = resp_num(p, n);
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static char *resp_arg(char *p, const char *s, size_t n) {
    p = resp_head(p, '$', n);
    memcpy(p, s, n);
    p += n;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static char *resp_str(char *p, const char *s) { return resp_arg(p, s, strlen(s)); }

static char *resp_u64(char *p, uint64_t v) {
    char tmp[20];
    return resp_arg(p, tmp, (size_t)(resp_num(tmp, v) - tmp));
}

/* XADD <results> [MAXLEN ~ n] * id <id> <the record's fields> into buf (of
 * RECORD_MAX bytes); its length. The fields as record_fields() has them. */
static size_t format_result(const tps_consumer *c, const slot *s, char *buf) {
    int capped = strcmp(c->results_maxlen, "0") != 0, ran = s->started_ms != 0;
    size_t pairs = 5 + (s->user[0] != '\0') + 2 * (size_t)ran + (s->result_len > 0); /* id included */
    char *p = resp_head(buf, '*', 3 + 3 * (size_t)capped + 2 * pairs);
    p = resp_arg(p, "XADD", 4);
    p = resp_str(p, c->results);
    if (capped) {
        p = resp_arg(p, "MAXLEN", 6);
        p = resp_arg(p, "~", 1);
        p = resp_str(p, c->results_maxlen);
    }
    p = resp_arg(p, "*", 1);
    p = resp_arg(p, "id", 2);
    p = resp_arg(p, s->id, s->id_len);
    p = resp_arg(p, "consumer", 8);
    p = resp_str(p, c->consumer);
    p = resp_arg(p, "writer", 6);
    p = resp_str(p, c->writer);
    p = resp_arg(p, "attempts", 8);
    p = resp_u64(p, s->attempts);
    p = resp_arg(p, "deliveries", 10);
    p = resp_u64(p, s->deliveries);
    if (s->user[0] != '\0') {
        p = resp_arg(p, "user", 4);
        p = resp_str(p, s->user);
    }
    if (ran) {
        p = resp_arg(p, "started_ms", 10);
        p = resp_u64(p, s->started_ms);
        p = resp_arg(p, "finished_ms", 11);
        p = resp_u64(p, s->finished_ms);
    }
    if (s->result_len > 0) {
        p = resp_arg(p, "result", 6);
        p = resp_arg(p, s->result, s->result_len);
    }
    return (size_t)(p - buf);
}

/* The reply's error text (copied: the reply is freed), for write_refused. */
static void refusal(char *buf, size_t len, const redisReply *r) {
    if (buf[0] == '\0') snprintf(buf, len, "%s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
}

static int receive_read(tps_consumer *c);

/* Records in flight when the connection failed (sent_ns: a result's XADD,
 * or the outcome script with a dead record; the writer's replies are read
 * under COMMAND_TIMEOUT_MS): a Redis that stalled longer still runs what it
 * had read, so the record may exist. A read-only script per stream looks
 * for this process's records of them (`writer`) among those added since
 * (tps_script_find_records), back to the stream's floor (results_floor,
 * dead_floor): an id that stream had before they were sent, taken from a
 * reply (the last record we added there) or, with nothing in flight, at
 * the connect (note_floors). Ids, not times: a record added after the
 * send has a greater id than any the stream had before it, whatever the
 * clocks say -- a cut-off in time would need Redis's clock (TIME, which
 * the README's ACL does not allow; the worker's own clock may be off from
 * Redis's by any amount, and either may step). The one exception: a stream
 * deleted and created again meanwhile starts from Redis's clock again. The
 * ones found count as written (a result's
 * XACK follows; a dead record's was its script's), the others are written
 * again. An outcome script refused with an error may have written some of
 * its records before the failing call (Redis keeps a script's writes): its
 * slots stay unsure too, and are looked for before the retry. A refused
 * search, or one cut short by FIND_RECORDS_MAX, is logged and the rest
 * written again (at least once).
 * A command of the closed connection cannot reach Redis after the search:
 * the new connection killed the old one before it (fence_old_connections;
 * unfenced where Redis refuses that). -1 when the connection failed (they
 * stay unsure). Called with nothing in flight on the writer. */
static int find_in(tps_consumer *c, const char *key, const char *floor, int outcome, const uint32_t *batch,
                   uint32_t n) {
    size_t argc = 0;
    args(c, &argc, "EVAL");
    args(c, &argc, tps_script_find_records);
    args(c, &argc, "1");
    args(c, &argc, key);
    args(c, &argc, c->writer);
    args(c, &argc, floor);
    args(c, &argc, FIND_RECORDS_MAX);
    size_t first = argc;
    for (uint32_t k = 0; k < n; k++) {
        slot *s = &c->slots[batch[k]];
        if (s->sent_ns == 0 || s->outcome != outcome) continue;
        if (s->written || s->recorded) {
            s->sent_ns = 0;
            continue;
        }
        arg(c, &argc, s->id, s->id_len);
    }
    if (argc == first) return 0;
    redisReply *r = wr_command(c, argc);
    if (r == NULL) return -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_INTEGER &&
        r->element[1]->type == REDIS_REPLY_ARRAY) {
        const redisReply *ids = r->element[1];
        uint32_t nfound = 0;
        for (size_t j = 0; j < ids->elements; j++) {
            if (ids->element[j]->type != REDIS_REPLY_STRING) continue;
            for (uint32_t k = 0; k < n; k++) {
                slot *s = &c->slots[batch[k]];
                if (s->sent_ns != 0 && s->outcome == outcome && s->id_len == ids->element[j]->len &&
                    memcmp(s->id, ids->element[j]->str, s->id_len) == 0) {
                    s->written = 1;
                    /* A dead record is found only if its script ran: the
                     * script's XACK, its last call, did too. */
                    if (outcome == OUT_DEAD) s->no_ack = 1;
                    nfound++;
                }
            }
        }
        char found[16];
        snprintf(found, sizeof found, "%u", nfound);
        const char *kv[] = {"stream", key,  "found", found, "cut_short", r->element[0]->integer ? "1" : "0",
                            "floor",  floor};
        logkv(c, r->element[0]->integer ? TP_LOG_WARN : TP_LOG_INFO, "lost_writes_checked", kv, 4);
    } else { /* every record in flight is written again: those Redis added are there twice */
        char why[200] = "";
        refusal(why, sizeof why, r);
        log1(c, TP_LOG_ERROR, "lost_writes_check_failed", "error", why);
    }
    freeReplyObject(r);
    for (uint32_t k = 0; k < n; k++)
        if (c->slots[batch[k]].outcome == outcome) c->slots[batch[k]].sent_ns = 0;
    return 0;
}

static int find_lost_writes(tps_consumer *c, const uint32_t *batch, uint32_t n) {
    int any = 0;
    for (uint32_t k = 0; k < n && !any; k++) any = c->slots[batch[k]].sent_ns != 0;
    if (!any) return 0;
    return find_in(c, c->results, c->results_floor, OUT_OK, batch, n) != 0 ||
                   find_in(c, c->dead, c->dead_floor, OUT_DEAD, batch, n) != 0
               ? -1
               : 0;
}

/* While the writer waits for Redis: take in a read reply that has arrived,
 * so that its entries run in the pool meanwhile. A failure is left to
 * io_main (the writer is in use here). */
static void read_meanwhile(tps_consumer *c) {
    if (c->rd == NULL || c->read_outstanding == 0 || c->read_failed) return;
    struct pollfd pf = {.fd = c->rd->fd, .events = POLLIN};
    if (poll(&pf, 1, 0) > 0 && receive_read(c) != 0) c->read_failed = 1;
}

/*
 * Write the finished entries' outcomes, WRITE_BATCH at a time, and
 * acknowledge an entry only once its record is in Redis:
 *   1. pipelined, one XADD to the results stream per success whose record is
 *      not written yet (plain commands: no script on the hot path), and one
 *      outcome script (scripts.h) for the batch's dead records, which copies
 *      each entry's fields into its record and acknowledges it last;
 *   2. with the XADD replies in: one XACK for the successes whose record
 *      was written -- never for one whose XADD was refused.
 * What was refused stays in the done list in its order (a success whose
 * record is written keeps `written`, so only its XACK is sent again), reading
 * stops and the write is retried later (write_refused). -1 when the
 * connection failed (the outcomes stay; what was written is remembered);
 * 0 otherwise.
 */
static int write_outcomes(tps_consumer *c) {
    if (c->write_blocked_until != 0 && tp_now_ns() < c->write_blocked_until) return 0;
    while (c->n_done > 0) {
        uint32_t batch[WRITE_BATCH], n = 0, n_xadd = 0, n_dead = 0;
        for (uint32_t i = c->done_head; i != NIL && n < WRITE_BATCH; i = c->slots[i].next) batch[n++] = i;
        char refused[200] = "";
        if (find_lost_writes(c, batch, n) != 0) return -1;
        /* 1. the records */
        uint64_t now = tp_now_ns();
        for (uint32_t k = 0; k < n; k++) {
            slot *s = &c->slots[batch[k]];
            if (s->recorded) continue; /* recorded dead by a claim script (recorded_list) */
            if (s->written) continue;
            if (s->outcome != OUT_OK) {
                n_dead++;
                continue;
            }
            char cmd[RECORD_MAX];
            if (redisAppendFormattedCommand(c->wr, cmd, format_result(c, s, cmd)) != REDIS_OK) return -1;
            s->sent_ns = now;
            n_xadd++;
        }
        if (n_dead > 0) {
            size_t argc = 0;
            args(c, &argc, "EVAL");
            args(c, &argc, tps_script_outcomes);
            args(c, &argc, "3");
            args(c, &argc, c->stream);
            args(c, &argc, c->results);
            args(c, &argc, c->dead);
            args(c, &argc, c->group);
            args(c, &argc, c->results_maxlen);
            args(c, &argc, c->dead_maxlen);
            for (uint32_t k = 0; k < n; k++) {
                slot *s = &c->slots[batch[k]];
                if (s->outcome != OUT_DEAD || s->recorded || s->written) continue;
                s->sent_ns = now;
                char(*num)[24] = &c->numbuf[(size_t)k * NUMS_PER_RECORD];
                args(c, &argc, "D");
                args(c, &argc, s->no_ack ? "0" : "1");
                arg(c, &argc, s->id, s->id_len);
                size_t at = argc;
                args(c, &argc, ""); /* the pair count, known below */
                (void)record_fields(c, &argc, s, num);
                c->argv[at] = num[4];
                c->argvlen[at] = strlen(num[4]);
            }
            if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) return -1;
        }
        /* Send it all, then let the entries of a read that came in run while
         * Redis adds the records (admit() may append dead records to the done
         * list: behind this batch, which stays at its head). */
        for (int sent = 0; !sent;)
            if (redisBufferWrite(c->wr, &sent) != REDIS_OK) return -1;
        read_meanwhile(c);
        for (uint32_t k = 0; k < n && n_xadd > 0; k++) { /* the XADD replies, in the order sent */
            slot *s = &c->slots[batch[k]];
            if (s->outcome != OUT_OK || s->written || s->recorded) continue;
            redisReply *r = NULL;
            if (redisGetReply(c->wr, (void **)&r) != REDIS_OK) return -1;
            if (r->type == REDIS_REPLY_STRING) {
                s->written = 1;
                set_floor(c->results_floor, r);
            } else
                refusal(refused, sizeof refused, r);
            s->sent_ns = 0; /* written, or refused: not run */
            freeReplyObject(r);
            n_xadd--;
        }
        int dead_ok = 0;
        long long dead_acked = 0;
        if (n_dead > 0) {
            redisReply *r = NULL;
            if (redisGetReply(c->wr, (void **)&r) != REDIS_OK) return -1;
            if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                r->element[0]->type == REDIS_REPLY_INTEGER) {
                dead_ok = 1;
                dead_acked = r->element[0]->integer;
                set_floor(c->dead_floor, r->element[1]);
            } else {
                refusal(refused, sizeof refused, r);
            }
            freeReplyObject(r);
            if (dead_ok) /* else refused: maybe half-written, looked for before the retry (find_in) */
                for (uint32_t k = 0; k < n; k++)
                    if (c->slots[batch[k]].outcome == OUT_DEAD) c->slots[batch[k]].sent_ns = 0;
        }
        /* 2. the acknowledgements of the written successes */
        size_t argc = 0;
        args(c, &argc, "XACK");
        args(c, &argc, c->stream);
        args(c, &argc, c->group);
        size_t first = argc;
        for (uint32_t k = 0; k < n; k++) {
            slot *s = &c->slots[batch[k]];
            if (s->written && !s->no_ack && !s->recorded) arg(c, &argc, s->id, s->id_len);
        }
        int ack_ok = 1;
        long long acked = 0;
        if (argc > first) {
            redisReply *r = wr_command(c, argc);
            if (r == NULL) return -1; /* the records stay written; the XACK is sent again */
            if (r->type == REDIS_REPLY_INTEGER) {
                acked = r->integer;
            } else {
                ack_ok = 0;
                refusal(refused, sizeof refused, r);
            }
            freeReplyObject(r);
        }
        /* 3. free what is done; the rest stays at the head of the list, in order */
        uint32_t keep_head = NIL, keep_tail = NIL, kept = 0;
        uint64_t ok = 0, dead = 0, dead_to_ack = 0;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = list_pop(c, &c->done_head, &c->done_tail);
            slot *s = &c->slots[i];
            if (s->recorded) { /* counted by recorded_list */
                outcome_dropped(c, s);
                slot_free(c, i);
                continue;
            }
            /* written: the record is there (a result's XADD, or a dead record
             * find_lost_writes found), its XACK this batch's; else a dead
             * record is done with the outcome script */
            int done = s->written ? ack_ok || s->no_ack : s->outcome == OUT_DEAD && dead_ok;
            if (!done) {
                list_push(c, &keep_head, &keep_tail, i);
                kept++;
                continue;
            }
            if (s->outcome == OUT_OK) {
                ok++;
            } else {
                dead++;
                dead_to_ack += !s->no_ack && !s->written; /* a found one was not in the script */
                const char *kv[] = {"id", s->id, "reason", s->reason, "user", s->user};
                logkv(c, TP_LOG_WARN, "dead", kv, s->user[0] != '\0' ? 3 : 2);
            }
            slot_free(c, i);
        }
        if (keep_head != NIL) {
            c->slots[keep_tail].next = c->done_head;
            if (c->done_head == NIL) c->done_tail = keep_tail;
            c->done_head = keep_head;
        }
        uint64_t ok_to_ack = ack_ok ? (uint64_t)(argc - first) : 0;
        if (ack_ok && acked < (long long)ok_to_ack)
            cnt_add(&c->n_ack_missed, (uint64_t)((long long)ok_to_ack - acked));
        if (dead_ok && dead_acked < (long long)dead_to_ack)
            cnt_add(&c->n_ack_missed, (uint64_t)((long long)dead_to_ack - dead_acked));
        c->n_done -= n - kept;
        cnt_add(&c->n_acked, ok + dead);
        cnt_add(&c->n_succeeded, ok);
        cnt_add(&c->n_dead, dead);
        if (refused[0] != '\0') {
            write_refused(c, refused);
            return 0;
        }
        if (c->write_blocked_until != 0) {
            log1(c, TP_LOG_INFO, "outcome_write_recovered", NULL, NULL);
            c->write_blocked_until = 0;
        }
        c->write_retry_ms = WRITE_RETRY_MIN_MS;
    }
    return 0;
}

/* The id of held entry i for the heartbeat (slots, then the timer heap),
 * NULL when slot i holds none (or, while stopping, only a released one). */
static const char *held_id(tps_consumer *c, uint32_t i, int stopping, size_t *len) {
    if (i >= c->nslots) return tps_sched_id(c->sched, i - c->nslots, len, NULL); /* waiting for its time */
    const slot *s = &c->slots[i];
    /* S_UNRUN: let go already (its script checks whose it is; taking it
     * back from a peer that claimed it meanwhile would be wrong) */
    if (s->state == S_FREE || s->state == S_UNRUN || s->recorded ||
        (stopping && (s->state == S_BACKLOG || s->state == S_OVERFLOW)))
        return NULL;
    *len = s->id_len;
    return s->id;
}

/* Entries read and put in the heap still show Redis's count 1 for a run
 * that has not happened (TPS_SCHED_LOWER): set it to what the heap keeps
 * (0 for all of them: one hold script per CLAIM_ARGS_MAX / 2 ids). Until then a
 * crash only counts one delivery too many. */
static int lower_waiting(tps_consumer *c) {
    if (c->n_lower == 0) return 0;
    uint32_t count = tps_sched_count(c->sched), i = 0, sent = 0;
    while (i < count) {
        size_t argc = hold_begin(c, "0"), first = argc, len;
        for (; i < count && argc - first < CLAIM_ARGS_MAX; i++) {
            if (!(tps_sched_flags(c->sched, i) & TPS_SCHED_LOWER)) continue;
            const char *id = tps_sched_id(c->sched, i, &len, NULL); /* a read entry: 0 runs */
            hold_arg(c, &argc, id, len, 0);
        }
        if (argc == first) continue;
        if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) return -1;
        sent++;
    }
    tps_sched_unflag(c->sched, TPS_SCHED_LOWER); /* before the replies change the heap */
    c->n_lower = 0;
    return read_hold_replies(c, sent, "set_count_failed");
}

static void heartbeat_own(tps_consumer *c);

/* The hold script (scripts.h) over every held id: resets their idle time,
 * counts no delivery, and acknowledges those deleted from the stream: it
 * records a waiting one itself, and a slot's record is then ours
 * (removed_by_us). An id no longer pending as ours
 * is left alone: a peer claimed it (this worker stalled), or a peer's claim
 * removed it deleted and wrote its record, or the group was reset. Then the
 * noted own deleted ids that are ready (heartbeat_own). */
static int heartbeat(tps_consumer *c) {
    int stopping = atomic_load(&c->stop_reading);
    uint32_t i = 0, sent = 0, nheld = c->nslots + tps_sched_count(c->sched);
    while (i < nheld) {
        size_t argc = hold_begin(c, ""), len;
        size_t first = argc;
        for (; i < nheld && argc - first < CLAIM_ARGS_MAX; i++) {
            const char *id = held_id(c, i, stopping, &len);
            if (id != NULL) hold_arg(c, &argc, id, len, i < c->nslots);
        }
        if (argc == first) break;
        if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) return -1;
        sent++;
    }
    if (c->n_own_wait > 0) heartbeat_own(c); /* its call is counted in count_replies */
    sent += c->count_replies;
    c->count_replies = 0;
    return read_hold_replies(c, sent, "heartbeat_failed");
}

/* How many entries a read or claim may bring now: pool room, free slots,
 * and for a read (`timers`) room in the timer heap (any of them may be
 * scheduled); none while a refused outcome batch waits for its retry. A
 * claim does not wait for the heap: a dead peer's entries must be recovered
 * even while it is full (a claimed entry that finds no room stays pending
 * unheld, its delivery undone, and is claimed again later). */
static uint32_t read_room(tps_consumer *c, int timers_too) {
    if (c->write_blocked_until != 0) return 0;
    uint32_t in = c->n_pool + c->n_overflow;
    uint32_t room = c->pool_capacity > in ? c->pool_capacity - in : 0;
    if (c->queue_capacity != 0 && room > 0) {
        /* Submitted in a burst, the entries may all sit in the queue before
         * a worker wakes: ask for no more than it has places for. */
        tp_stats st;
        tp_stats_get(c->pool, &st);
        uint32_t waiting = st.queued + st.delayed + c->n_overflow;
        uint32_t places = c->queue_capacity > waiting ? c->queue_capacity - waiting : 0;
        if (places < room) room = places;
    }
    uint32_t free = c->n_free > c->read_outstanding ? c->n_free - c->read_outstanding : 0;
    uint32_t timers = tps_sched_room(c->sched);
    timers = timers > c->read_outstanding ? timers - c->read_outstanding : 0;
    if (free < room) room = free;
    return !timers_too || room < timers ? room : timers;
}

/* Slot i for an entry deleted from the stream before it ran, still pending
 * as ours: a dead record, and its XACK. */
static void deleted_entry(tps_consumer *c, uint32_t i, const char *id, size_t len) {
    slot *s = &c->slots[i];
    memcpy(s->id, id, len);
    s->id[len] = '\0';
    s->id_len = len;
    ids_insert(c, i);
    s->deliveries = 0; /* as the scripts' records of deleted entries say (scripts.h) */
    cnt_add(&c->n_deleted, 1);
    finish_dead(c, i, "entry deleted before it ran");
}

/* An entry deleted from the stream that a hold script of ours has just
 * acknowledged for a slot (scripts.h, "K"): its record is ours to write, and
 * nobody else's. The slot's task writes it when it runs, or let_go does
 * (unpended). Nonzero when it is in no slot, which does not happen: "K" goes
 * only with a slot's id, and a hold script's reply is read before anything
 * frees a slot (heartbeat; set_count and own_deleted: read_count_replies). */
static int removed_by_us(tps_consumer *c, const char *id, size_t len) {
    uint32_t i = ids_find(c, id, len);
    if (i == NIL) return 1;
    c->slots[i].unpended = c->slots[i].no_ack = 1; /* nothing left to acknowledge */
    return 0;
}

/* One id of own_deleted for the hold script: "K" if a slot holds it, else
 * "R"; none if let go (S_UNRUN: let_go's script finds it "gone"). A full
 * call is sent, pipelined, and a new one begun. */
static void own_arg(tps_consumer *c, size_t *argc, size_t *first, const char *id, size_t len) {
    uint32_t i = ids_find(c, id, len);
    if (i != NIL && c->slots[i].state == S_UNRUN) return;
    if (*argc - *first >= CLAIM_ARGS_MAX) {
        if (redisAppendCommandArgv(c->wr, (int)*argc, c->argv, c->argvlen) == REDIS_OK) c->count_replies++;
        *argc = *first = hold_begin(c, "");
    }
    hold_arg(c, argc, id, len, i != NIL);
}

static int own_listed(const struct own_wait *w, uint32_t n, const redisReply *id) {
    for (uint32_t k = 0; k < n; k++)
        if (w[k].len == id->len && memcmp(w[k].id, id->str, id->len) == 0) return 1;
    return 0;
}

/* The noted ids (own_wait) that a read has ended since: moved out of the
 * table into own_settle, whose copies the caller's hold calls point at
 * until they are sent, so that the table has room for new notes meanwhile.
 * Returns how many. */
static uint32_t own_wait_take(tps_consumer *c) {
    uint32_t k, kept = 0, n = 0;
    for (k = 0; k < c->n_own_wait; k++) {
        if (c->own_wait[k].seq != c->read_seq)
            c->own_settle[n++] = c->own_wait[k];
        else
            c->own_wait[kept++] = c->own_wait[k];
    }
    c->n_own_wait = kept;
    return n;
}

/*
 * This consumer's own deleted entries, idle, that a claim listed and left
 * pending (scripts.h): settled with the hold script, as the heartbeat
 * settles them ("K" for a slot: its record is the slot's, removed_by_us;
 * "R" for one waiting for its time, or not held at all -- an earlier
 * process of this name, or one released -- which the script records),
 * pipelined like set_count and read with its replies (read_count_replies).
 *
 * One in no slot and not in the heap, while a read is in flight, may be in
 * that read's reply, not taken in yet (delivered, deleted, then a stall
 * longer than claim_idle): recorded now, the read would run it too. So it
 * is noted (own_wait, with read_seq) and settled once a read has ended (the
 * one in flight delivered it or not; a later read does not deliver a
 * pending entry): in a slot by then, or truly unheld. The next claim or
 * heartbeat settles it (heartbeat_own), whichever comes first. The table
 * holds OWN_WAIT_MAX; more are listed again by a later claim.
 */
static void own_deleted(tps_consumer *c, const redisReply *r) {
    size_t first = hold_begin(c, ""), argc = first;
    uint32_t k, n = own_wait_take(c);
    for (k = 0; k < n; k++) own_arg(c, &argc, &first, c->own_settle[k].id, c->own_settle[k].len);
    if (r->elements > 0) {
        char num[24];
        snprintf(num, sizeof num, "%zu", r->elements);
        log1(c, TP_LOG_INFO, "own_deleted", "count", num);
    }
    for (size_t e = 0; e < r->elements; e++) {
        const redisReply *id = r->element[e];
        if (id->type != REDIS_REPLY_STRING || id->len == 0 || id->len > TPS_ID_MAX) continue;
        if (own_listed(c->own_settle, n, id)) continue; /* noted, and settled above */
        if (c->read_outstanding > 0 && ids_find(c, id->str, id->len) == NIL &&
            !in_heap(c, id->str, id->len)) {
            if (!own_listed(c->own_wait, c->n_own_wait, id) && c->n_own_wait < OWN_WAIT_MAX) {
                struct own_wait *w = &c->own_wait[c->n_own_wait++];
                w->seq = c->read_seq;
                w->len = id->len;
                memcpy(w->id, id->str, id->len);
            }
            continue;
        }
        own_arg(c, &argc, &first, id->str, id->len);
    }
    if (argc > first && redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) == REDIS_OK)
        c->count_replies++;
}

/* The heartbeat's part of own_deleted: the noted ids that a read has ended
 * since and that are in no slot and not in the heap (those were in the
 * heartbeat's own calls), settled now -- a claim does not run while the
 * pool is full, a write is blocked, or the worker stops reading. */
static void heartbeat_own(tps_consumer *c) {
    size_t first = hold_begin(c, ""), argc = first;
    uint32_t n = own_wait_take(c);
    for (uint32_t k = 0; k < n; k++) {
        const struct own_wait *w = &c->own_settle[k];
        if (ids_find(c, w->id, w->len) != NIL || in_heap(c, w->id, w->len)) continue;
        own_arg(c, &argc, &first, w->id, w->len);
    }
    if (argc > first && redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) == REDIS_OK)
        c->count_replies++;
}

/* Take one entry [id, fields] into a fresh slot; NIL when it is held already
 * or malformed beyond an id. */
static uint32_t take_entry(tps_consumer *c, const redisReply *e, const char **perr) {
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 1 || e->element[0]->type != REDIS_REPLY_STRING ||
        e->element[0]->len == 0 || e->element[0]->len > TPS_ID_MAX)
        return NIL;
    const redisReply *id = e->element[0];
    if (ids_find(c, id->str, id->len) != NIL || in_heap(c, id->str, id->len)) return NIL;
    uint32_t i = slot_alloc(c);
    if (i == NIL) return NIL;
    slot *s = &c->slots[i];
    memcpy(s->id, id->str, id->len);
    s->id[id->len] = '\0';
    s->id_len = id->len;
    ids_insert(c, i);
    *perr = parse_fields(s, e->elements > 1 ? e->element[1] : NULL);
    return i;
}

/* After a claim that ran: delete the group's other consumers with nothing pending
 * and idle REAP_IDLE_CLAIMS x claim_idle (and 3 x BLOCK) or longer
 * (tps_script_reap): those of workers that are gone, whose entries the
 * claims have taken over. A live worker reads every BLOCK at least, or
 * holds entries; one deleted all the same (stalled that long with nothing
 * held) loses nothing, and its next read creates it again. A refusal is
 * logged once; -1 when the connection failed. */
static int reap_consumers(tps_consumer *c) {
    uint64_t ms = c->claim_idle_ns / 1000000ull * REAP_IDLE_CLAIMS;
    if (ms < 3ull * c->block_ms) ms = 3ull * c->block_ms;
    char idle[24];
    snprintf(idle, sizeof idle, "%llu", (unsigned long long)ms);
    size_t argc = 0;
    args(c, &argc, "EVAL");
    args(c, &argc, tps_script_reap);
    args(c, &argc, "1");
    args(c, &argc, c->stream);
    args(c, &argc, c->group);
    args(c, &argc, c->consumer);
    args(c, &argc, idle);
    redisReply *r = wr_command(c, argc);
    if (r == NULL) return -1;
    if (r->type == REDIS_REPLY_ARRAY) {
        for (size_t k = 0; k < r->elements; k++)
            if (r->element[k]->type == REDIS_REPLY_STRING) {
                const char *kv[] = {"consumer", r->element[k]->str, "idle_ms_at_least", idle};
                logkv(c, TP_LOG_INFO, "consumer_deleted", kv, 2);
            }
    } else if (!c->reap_logged) {
        c->reap_logged = 1;
        log1(c, TP_LOG_WARN, "consumer_delete_failed", "error",
             r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    freeReplyObject(r);
    return 0;
}

/* The claim script (scripts.h: XAUTOCLAIM's work, but a live holder's
 * deleted entries are left to it), then one XPENDING per claimed entry for
 * its delivery count. */
static int claim(tps_consumer *c) {
    uint32_t room = read_room(c, 0);
    if (room == 0) return 0;
    char idle[24], count[16], scan[16];
    snprintf(idle, sizeof idle, "%llu", (unsigned long long)(c->claim_idle_ns / 1000000ull));
    snprintf(count, sizeof count, "%u", room);
    snprintf(scan, sizeof scan, "%u",
             room < CLAIM_SCAN_MAX / 10 ? room * 10 : CLAIM_SCAN_MAX); /* as XAUTOCLAIM */
    size_t argc = 0;
    args(c, &argc, "EVAL");
    args(c, &argc, tps_script_claim);
    args(c, &argc, "2");
    args(c, &argc, c->stream);
    args(c, &argc, c->dead);
    args(c, &argc, c->group);
    args(c, &argc, c->consumer);
    args(c, &argc, idle);
    args(c, &argc, c->claim_cursor);
    args(c, &argc, count);
    args(c, &argc, scan);
    args(c, &argc, c->dead_maxlen);
    redisReply *r = wr_command(c, argc);
    if (r == NULL) return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        log1(c, TP_LOG_WARN, "claim_failed", "error",
             r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
        return 0;
    }
    size_t cl = r->element[0]->len < TPS_ID_MAX ? r->element[0]->len : TPS_ID_MAX;
    memcpy(c->claim_cursor, r->element[0]->str, cl);
    c->claim_cursor[cl] = '\0';
    /* Idle pending entries deleted from the stream (XTRIM, XDEL), which the
     * script recorded dead (a lost reply loses only their count here). */
    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_ARRAY) recorded_list(c, r->element[2]);
    const redisReply *ents = r->element[1];
    uint32_t *got = c->claim_got, n = 0;
    const char **errs = c->claim_err;
    for (size_t k = 0; k < ents->elements; k++) {
        const char *perr = NULL;
        uint32_t i = take_entry(c, ents->element[k], &perr);
        if (i == NIL) continue; /* held already (below), malformed beyond an id, or no free slot */
        c->slots[i].fresh = 1;
        errs[n] = perr;
        got[n++] = i;
    }
    /* Their delivery counts: one XPENDING per entry, pipelined (a range
     * would also list what this consumer holds in between). */
    uint32_t asked = 0;
    for (; asked < n; asked++) {
        const slot *s = &c->slots[got[asked]];
        argc = 0;
        args(c, &argc, "XPENDING");
        args(c, &argc, c->stream);
        args(c, &argc, c->group);
        arg(c, &argc, s->id, s->id_len);
        arg(c, &argc, s->id, s->id_len);
        args(c, &argc, "1");
        if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) break;
    }
    int rc = 0;
    for (uint32_t k = 0; k < n; k++) {
        slot *s = &c->slots[got[k]];
        s->deliveries = 0;
        redisReply *p = NULL;
        if (k >= asked || rc != 0 || redisGetReply(c->wr, (void **)&p) != REDIS_OK) {
            rc = -1;
            continue;
        }
        if (p->type == REDIS_REPLY_ARRAY && p->elements == 1 && p->element[0]->type == REDIS_REPLY_ARRAY &&
            p->element[0]->elements >= 4 && p->element[0]->element[3]->type == REDIS_REPLY_INTEGER)
            s->deliveries = (unsigned)p->element[0]->element[3]->integer;
        freeReplyObject(p);
    }
    if (rc != 0) { /* the connection failed: still pending, claimed again later */
        freeReplyObject(r);
        for (uint32_t k = 0; k < n; k++) slot_free(c, got[k]);
        return -1;
    }
    /* Entries that were ours already (a heartbeat came late): the claim
     * counted a delivery that is none; put back the count we hold. */
    for (size_t k = 0; k < ents->elements; k++) {
        const redisReply *e = ents->element[k];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 1 || e->element[0]->type != REDIS_REPLY_STRING)
            continue;
        const redisReply *id = e->element[0];
        uint32_t held = ids_find(c, id->str, id->len);
        unsigned d, fl;
        if (held != NIL && !c->slots[held].fresh && c->slots[held].state != S_UNRUN)
            set_count(c, id->str, id->len, c->slots[held].deliveries,
                      1); /* S_UNRUN: let_go sees another count */
        else if (held == NIL && tps_sched_get(c->sched, id->str, id->len, &d, &fl)) {
            set_count(c, id->str, id->len, tps_counts_put_back(d, fl), 0);
            (void)tps_sched_mark(c->sched, id->str, id->len, 0, TPS_SCHED_LOWER, UINT64_MAX);
        }
    }
    if (r->elements >= 4 && r->element[3]->type == REDIS_REPLY_ARRAY) own_deleted(c, r->element[3]);
    if (n > 0) {
        char num[16];
        snprintf(num, sizeof num, "%u", n);
        log1(c, TP_LOG_INFO, "claimed", "count", num);
        cnt_add(&c->n_claimed, n);
    }
    for (uint32_t k = 0; k < n; k++) {
        slot *s = &c->slots[got[k]];
        s->fresh = 0;
        s->claimed = 1;
        s->deliveries = tps_counts_claimed(s->deliveries); /* 0: not listed (acked meanwhile?) */
        admit(c, got[k], errs[k]);
    }
    freeReplyObject(r);
    return read_count_replies(c); /* set_count(), from here and admit() */
}

/* Scheduled entries whose time has come: read their fields again (XRANGE,
 * pipelined) and admit them, before anything new is read. An entry gone from
 * the stream meanwhile gets a dead record (if it is still pending as ours;
 * else whoever dropped it wrote one). -1 when the connection failed (the
 * entries not fetched go back into the heap; those fetched stay pending
 * unheld, and a claim brings them back). */
static int dispatch_due(tps_consumer *c) {
    uint64_t now_ms = tps_unix_ms();
    if (tps_sched_next(c->sched) > now_ms) return 0;
    due_ent *due = c->due_buf;
    uint32_t n = 0, ngone = 0, cap = c->n_free > c->read_outstanding ? c->n_free - c->read_outstanding : 0;
    if (cap > DUE_BATCH) cap = DUE_BATCH;
    int failed = 0;
    while (n < cap && tps_sched_pop(c->sched, now_ms, due[n].id, &due[n].len, &due[n].due_ms,
                                    &due[n].deliveries, &due[n].flags)) {
        due[n].gone = 0;
        due[n].slot = NIL;
        due[n].tell = 0;
        size_t argc = 0;
        args(c, &argc, "XRANGE");
        args(c, &argc, c->stream);
        arg(c, &argc, due[n].id, due[n].len);
        arg(c, &argc, due[n].id, due[n].len);
        n++;
        if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) {
            failed = 1;
            break;
        }
    }
    uint32_t k = 0;
    for (; k < n && !failed; k++) {
        redisReply *r = NULL;
        if (redisGetReply(c->wr, (void **)&r) != REDIS_OK) {
            failed = 1;
            break;
        }
        due[k].gone = r->type == REDIS_REPLY_ARRAY && r->elements == 0;
        if (due[k].gone) {
            ngone++;
        } else if (r->type == REDIS_REPLY_ARRAY) {
            due[k].perr = NULL;
            uint32_t i = take_entry(c, r->element[0], &due[k].perr);
            due[k].slot = i; /* admitted below, once Redis counts its run */
            if (i != NIL) {  /* this run counts */
                c->slots[i].deliveries = tps_counts_due(due[k].deliveries, due[k].flags, &due[k].tell);
                c->slots[i].due = 1;
            }
        } else {
            log1(c, TP_LOG_WARN, "due_fetch_failed", "error",
                 r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            (void)tps_sched_add(c->sched, due[k].id, due[k].len, due[k].due_ms, due[k].deliveries,
                                due[k].flags);
        }
        freeReplyObject(r);
    }
    for (; k < n; k++)
        (void)tps_sched_add(c->sched, due[k].id, due[k].len, due[k].due_ms, due[k].deliveries, due[k].flags);
    /* Deleted while it waited: a dead record, unless it is no longer pending
     * as ours (a claim's script, after this worker stalled, or a hold script
     * of ours has acknowledged it and written its record already; or a peer
     * has it): one record per entry. */
    uint32_t asked = 0;
    for (k = 0; k < n && !failed && ngone > 0; k++) {
        if (!due[k].gone) continue;
        size_t argc = 0;
        args(c, &argc, "XPENDING");
        args(c, &argc, c->stream);
        args(c, &argc, c->group);
        arg(c, &argc, due[k].id, due[k].len);
        arg(c, &argc, due[k].id, due[k].len);
        args(c, &argc, "1");
        if (redisAppendCommandArgv(c->wr, (int)argc, c->argv, c->argvlen) != REDIS_OK) {
            failed = 1; /* the entry stays pending: a claim finds it deleted */
            break;
        }
        asked++;
    }
    for (k = 0; k < n && asked > 0; k++) {
        if (!due[k].gone) continue;
        asked--;
        redisReply *p = NULL;
        if (failed || redisGetReply(c->wr, (void **)&p) != REDIS_OK) {
            failed = 1;
            continue;
        }
        const redisReply *row = p->type == REDIS_REPLY_ARRAY && p->elements == 1 ? p->element[0] : NULL;
        if (row != NULL && row->type == REDIS_REPLY_ARRAY && row->elements >= 2 &&
            row->element[1]->type == REDIS_REPLY_STRING && strcmp(row->element[1]->str, c->consumer) == 0)
            deleted_entry(c, slot_alloc(c), due[k].id, due[k].len); /* cap <= free slots */
        due[k].gone = 0;
        freeReplyObject(p);
    }
    for (k = 0; k < n && failed; k++) /* not settled: back into the heap, to be fetched again */
        if (due[k].gone)
            (void)tps_sched_add(c->sched, due[k].id, due[k].len, due[k].due_ms, due[k].deliveries,
                                due[k].flags);
    /* Redis counts each one's run before it can start (a handler that
     * crashes at once must still be counted), unless it shows it already
     * (TPS_SCHED_LOWER not yet done, or RAISED); then they are admitted. An
     * entry that does not run after all (dead, or a stop) stays one high.
     * Without a connection they are not admitted: still pending, one claim
     * brings them back. */
    for (k = 0; k < n && !failed; k++)
        if (due[k].slot != NIL && due[k].perr == NULL && due[k].tell)
            set_count(c, due[k].id, due[k].len, c->slots[due[k].slot].deliveries, 1);
    if (read_count_replies(c) != 0) failed = 1;
    for (k = 0; k < n; k++) {
        uint32_t i = due[k].slot;
        if (i == NIL) continue;
        if (failed) { /* pending unheld: a claim brings it back; unless a lost set_count acked it deleted */
            if (c->slots[i].unsure)
                let_go_later(c, i, 0); /* let_go records it if it is deleted and not pending */
            else
                slot_free(c, i);
            continue;
        }
        admit(c, i, due[k].perr);
        if (c->log != NULL) {
            char late[24];
            uint64_t wall = tps_unix_ms();
            snprintf(late, sizeof late, "%llu",
                     (unsigned long long)(wall > due[k].due_ms ? wall - due[k].due_ms : 0));
            const char *kv[] = {"id", due[k].id, "late_ms", late};
            logkv(c, TP_LOG_DEBUG, "due", kv, 2);
        }
    }
    return failed ? -1 : 0;
}

/* TRIM_DONE: drop the stream's entries below what every group still needs
 * (scripts.h). -1 when the connection failed. */
static int trim(tps_consumer *c) {
    size_t argc = 0;
    args(c, &argc, "EVAL");
    args(c, &argc, tps_script_trim);
    args(c, &argc, "1");
    args(c, &argc, c->stream);
    args(c, &argc, TRIM_LIMIT);
    redisReply *r = wr_command(c, argc);
    if (r == NULL) return -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_INTEGER) {
        if (r->element[1]->integer > 0) {
            char num[24];
            snprintf(num, sizeof num, "%lld", r->element[1]->integer);
            const char *kv[] = {"count", num, "below", r->element[0]->str};
            logkv(c, TP_LOG_DEBUG, "trimmed", kv, 2);
            cnt_add(&c->n_trimmed, (uint64_t)r->element[1]->integer);
            /* at the limit: more to trim, go on at the next turn of the loop */
            if (r->element[1]->integer >= atoll(TRIM_LIMIT) / 2) c->next_trim_ns = tp_now_ns();
        }
    } else {
        log1(c, TP_LOG_WARN, "trim_failed", "error",
             r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    freeReplyObject(r);
    return 0;
}

static int send_read(tps_consumer *c, uint32_t count) {
    char cnt[16], block[16];
    snprintf(cnt, sizeof cnt, "%u", count);
    snprintf(block, sizeof block, "%u", c->block_ms);
    size_t argc = 0;
    args(c, &argc, "XREADGROUP");
    args(c, &argc, "GROUP");
    args(c, &argc, c->group);
    args(c, &argc, c->consumer);
    args(c, &argc, "COUNT");
    args(c, &argc, cnt);
    args(c, &argc, "BLOCK");
    args(c, &argc, block);
    args(c, &argc, "STREAMS");
    args(c, &argc, c->stream);
    args(c, &argc, ">");
    if (redisAppendCommandArgv(c->rd, (int)argc, c->argv, c->argvlen) != REDIS_OK) return -1;
    int done = 0;
    while (!done)
        if (redisBufferWrite(c->rd, &done) != REDIS_OK) return -1;
    c->read_outstanding = count;
    c->read_sent_ns = tp_now_ns();
    return 0;
}

/* The reader's socket is readable: consume what arrived; the reply when whole. */
static int receive_read(tps_consumer *c) {
    if (redisBufferRead(c->rd) != REDIS_OK) return -1;
    redisReply *r = NULL;
    if (redisGetReplyFromReader(c->rd, (void **)&r) != REDIS_OK) return -1;
    if (r == NULL) return 0; /* partial */
    c->read_outstanding = 0;
    c->read_seq++;
    if (r->type == REDIS_REPLY_ERROR) {
        /* NOGROUP after a Redis restart without persistence: recreate it. */
        log1(c, TP_LOG_WARN, "read_failed", "error", r->str);
        int nogroup = strncmp(r->str, "NOGROUP", 7) == 0;
        freeReplyObject(r);
        return nogroup ? -1 : 0;
    }
    if (r->type == REDIS_REPLY_ARRAY) {
        for (size_t k = 0; k < r->elements; k++) {
            const redisReply *st = r->element[k];
            if (st->type != REDIS_REPLY_ARRAY || st->elements < 2 ||
                st->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            const redisReply *ents = st->element[1];
            for (size_t e = 0; e < ents->elements; e++) {
                const char *perr = NULL;
                uint32_t i = take_entry(c, ents->element[e], &perr);
                if (i == NIL) continue;
                cnt_add(&c->n_read, 1);
                admit(c, i, perr);
            }
        }
    }
    freeReplyObject(r);
    return 0;
}

/* Let go of the S_UNRUN slots (let_go_later), LET_GO_BATCH per script call
 * (scripts.h, tps_script_let_go): each entry still pending as ours with the
 * count we hold gets the count counts.h gives it back with (when `back`)
 * and an idle time of claim_idle, so a peer takes it at its next claim; a
 * deleted one gets its dead record if it is still pending as ours, or if our
 * own hold script acknowledged it (`unpended`: nobody else would
 * write it); one that a peer claimed or ended meanwhile is left as it is.
 * S_UNRUN slots are not in the heartbeat (held_id). Called where the
 * writer has nothing in flight (the top of io_main, apply_stop). Without
 * a connection the slots wait for the next one (not heartbeated: a peer may
 * claim them meanwhile, and the script then leaves them to it); a refused
 * script (BUSY, LOADING, NOPERM...) keeps them too, and is retried after
 * WRITE_RETRY_MIN_MS, doubling up to WRITE_RETRY_MAX_MS. A stop waits for
 * both within tps_finish's budget; what is left then stays pending as it is
 * (counts one higher: never lower than the deliveries that could have run;
 * a deleted `unsure` one that a lost script acknowledged gets no record). */
static void let_go(tps_consumer *c) {
    char idle[24], held[LET_GO_BATCH][16], give[LET_GO_BATCH][16];
    snprintf(idle, sizeof idle, "%llu", (unsigned long long)(c->claim_idle_ns / 1000000ull));
    if (c->let_go_retry_at != 0 && tp_now_ns() < c->let_go_retry_at) return;
    while (c->n_unrun > 0 && c->wr != NULL) {
        size_t argc = 0;
        args(c, &argc, "EVAL");
        args(c, &argc, tps_script_let_go);
        args(c, &argc, "1");
        args(c, &argc, c->stream);
        args(c, &argc, c->group);
        args(c, &argc, c->consumer);
        args(c, &argc, idle);
        uint32_t n = 0;
        for (uint32_t i = c->unrun_head; i != NIL && n < LET_GO_BATCH; i = c->slots[i].next, n++) {
            const slot *s = &c->slots[i];
            snprintf(held[n], sizeof held[n], "%u", s->deliveries);
            /* it ran (cancelled while it ran): its count stays, and so it idles too */
            snprintf(give[n], sizeof give[n], "%u",
                     s->back ? tps_counts_given_back(s->deliveries) : s->deliveries);
            arg(c, &argc, s->id, s->id_len);
            args(c, &argc, held[n]);
            args(c, &argc, give[n]);
        }
        redisReply *r = wr_command(c, argc);
        if (r == NULL) { /* kept: let go after a reconnect */
            disconnect(c, "letting go", c->wr->errstr);
            return;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != n) { /* kept: let go at the retry */
            char retry[16];
            snprintf(retry, sizeof retry, "%u", c->let_go_retry_ms);
            const char *kv[] = {"error", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply",
                                "retry_ms", retry};
            logkv(c, TP_LOG_WARN, "let_go_failed", kv, 2);
            c->let_go_retry_at = tp_now_ns() + ms_ns(c->let_go_retry_ms);
            c->let_go_retry_ms =
                c->let_go_retry_ms * 2 > WRITE_RETRY_MAX_MS ? WRITE_RETRY_MAX_MS : c->let_go_retry_ms * 2;
            freeReplyObject(r);
            return;
        }
        c->let_go_retry_at = 0;
        c->let_go_retry_ms = WRITE_RETRY_MIN_MS;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = list_pop(c, &c->unrun_head, &c->unrun_tail);
            c->n_unrun--;
            const redisReply *e = r->element[k];
            const char *st = e->type == REDIS_REPLY_STRING ? e->str : "other";
            slot *s = &c->slots[i];
            if (s->recorded) { /* recorded meanwhile (recorded_list): "dropped" */
                outcome_dropped(c, s);
                slot_free(c, i);
                continue;
            }
            /* dropped: deleted and not pending. Its record is ours only if a
             * script of ours acknowledged it, or may have (hold_lost); else a
             * peer's claim did, after this worker stalled, and wrote one, or
             * a peer ran it */
            if (strcmp(st, "gone") == 0 || (strcmp(st, "dropped") == 0 && (s->unpended || s->unsure))) {
                s->no_ack = st[0] == 'd'; /* nothing left to acknowledge */
                cnt_add(&c->n_deleted, 1);
                finish_dead(c, i,
                            s->attempts == 0 ? "entry deleted before it ran"
                                             : "entry deleted before its run ended");
            } else {
                slot_free(c, i);
            }
        }
        freeReplyObject(r);
    }
}

/* Stop: let go of what has not entered the pool (it stays pending in Redis,
 * its delivery given back, or its dead record written if it was deleted:
 * let_go); entries waiting for their time stay pending as they are (the
 * hold script recorded those it found deleted). */
static void apply_stop(tps_consumer *c) {
    c->stopped_applied = 1;
    if (c->rd != NULL) { /* an XREADGROUP in flight may deliver more: drop the reader */
        redisFree(c->rd);
        c->rd = NULL;
        c->read_seq += c->read_outstanding > 0;
        c->read_outstanding = 0;
    }
    if (c->wr != NULL && lower_waiting(c) != 0) /* the heap is forgotten below: its counts go right now */
        disconnect(c, "setting delivery counts", c->wr->errstr);
    uint32_t released = 0;
    c->n_low_admitted = 0;
    for (uint32_t i = 0; i < c->nslots; i++) { /* their lists are dropped below */
        slot *s = &c->slots[i];
        if (s->state == S_BACKLOG || s->state == S_OVERFLOW) {
            let_go_later(c, i, 1);
            released++;
        } else if (s->state == S_POOL && s->prio < 0) {
            c->n_low_admitted++;
        }
    }
    users_reset(c);
    c->n_backlog = c->n_overflow = 0;
    for (int l = 0; l < LANES; l++) c->overflow_head[l] = c->overflow_tail[l] = NIL;
    let_go(c);
    released += tps_sched_count(c->sched); /* waiting for their time: pending, another worker claims them */
    tps_sched_clear(c->sched);
    c->n_lower = 0;
    char num[16];
    snprintf(num, sizeof num, "%u", released);
    log1(c, TP_LOG_INFO, "reading_stopped", "released", num);
}

static void drain_ctl(tps_consumer *c) {
    atomic_store(&c->ctl_pending, 0);
    uint64_t v;
    while (read(c->ctl_fd, &v, sizeof v) > 0) {
    }
}

static void *io_main(void *arg) {
    tps_consumer *c = arg;
    c->next_connect_ns = tp_now_ns();
    for (;;) {
        drain_ctl(c);
        (void)tp_cq_drain(c->cq, 0);                       /* the tasks' ends: on_done, here */
        let_go(c);                                         /* what was let go meanwhile (S_UNRUN) */
        if (c->n_overflow > 0) dispatch_after(c, NULL, 0); /* room may have appeared without a completion */
        int stopping = atomic_load(&c->stop_reading);
        if (stopping && !c->stopped_applied) apply_stop(c);
        uint64_t now = tp_now_ns();
        if (atomic_load(&c->finishing)) {
            /* The pool has drained (or its shutdown was forced and its
             * workers had their second to return): every completion of a
             * task that ended is in the queue. Nothing is left when a drain
             * finds none and every outcome is written. */
            int more = tp_cq_drain(c->cq, 0) > 0;
            if (c->n_done == 0 && c->n_unrun == 0 && !more) {
                c->finish_result = 0;
                break;
            }
            if (now >= atomic_load(&c->finish_deadline)) {
                c->finish_result = c->n_done == 0 ? 0 : -1;
                if (c->n_unrun > 0) { /* pending as they are: their counts stay one higher */
                    char num[16];
                    snprintf(num, sizeof num, "%u", c->n_unrun);
                    log1(c, TP_LOG_WARN, "let_go_unfinished", "count", num);
                }
                break;
            }
        }
        if (c->wr == NULL && now >= c->next_connect_ns) {
            try_connect(c);
            now = tp_now_ns();
        }
        if (c->wr != NULL) {
            const char *fail = NULL;
            /* Due entries first: they are the only work here with a time
             * to keep; outcomes can wait the few ms a fetch takes. */
            if (lower_waiting(c) != 0) fail = "setting delivery counts";
            if (fail == NULL && !stopping && c->write_blocked_until == 0 && dispatch_due(c) != 0)
                fail = "fetching due entries";
            /* The next read goes out before the outcomes are written (when
             * there is room already), so that Redis serves it while this
             * thread formats the records, and its reply waits in the socket. */
            if (fail == NULL && !stopping && c->rd != NULL && c->read_outstanding == 0) {
                uint32_t room = read_room(c, 1);
                if (room > 0 && send_read(c, room) != 0) fail = "reading";
            }
            if (fail == NULL && c->n_done > 0 && write_outcomes(c) != 0) fail = "writing outcomes";
            /* Never starved by a steady stream of outcomes: a held entry whose
             * idle time passed CLAIM_IDLE would be claimed by another worker. */
            if (fail == NULL && now >= c->next_heartbeat_ns) {
                if (heartbeat(c) != 0) fail = "heartbeat";
                c->next_heartbeat_ns = now + c->claim_idle_ns / 3;
            }
            if (fail == NULL && !stopping && now >= c->next_claim_ns && c->write_blocked_until == 0) {
                /* a claim that ran (room for what it takes), then the reap:
                 * a full worker sends neither */
                uint32_t room = read_room(c, 0);
                if (claim(c) != 0 || (room > 0 && reap_consumers(c) != 0)) fail = "claiming";
                c->next_claim_ns = now + c->claim_idle_ns / 2;
            }
            if (c->n_done > 0 && fail == NULL && write_outcomes(c) != 0) fail = "writing outcomes";
            if (fail == NULL && c->trim_interval_ns != 0 && now >= c->next_trim_ns) {
                c->next_trim_ns = now + c->trim_interval_ns;
                if (trim(c) != 0) fail = "trimming";
            }
            if (fail == NULL && !stopping && c->rd != NULL && c->read_outstanding == 0) {
                uint32_t room = read_room(c, 1);
                if (room > 0 && send_read(c, room) != 0) fail = "reading";
            }
            if (fail == NULL && c->read_failed) fail = "reading";
            if (fail == NULL && c->read_outstanding > 0 &&
                now > c->read_sent_ns + ms_ns(c->block_ms) + ms_ns(COMMAND_TIMEOUT_MS))
                fail = "read timed out";
            if (fail != NULL)
                disconnect(c, fail,
                           c->wr != NULL && c->wr->err   ? c->wr->errstr
                           : c->rd != NULL && c->rd->err ? c->rd->errstr
                                                         : NULL);
        }
        update_gauges(c);

        /* Sleep until the reader has data, a completion arrives or a timer is due. */
        now = tp_now_ns();
        uint64_t due = now + ms_ns(1000);
        if (c->wr == NULL) {
            if (c->next_connect_ns < due) due = c->next_connect_ns;
        } else {
            if (c->next_heartbeat_ns < due) due = c->next_heartbeat_ns;
            if (!stopping && c->next_claim_ns < due) due = c->next_claim_ns;
            if (c->trim_interval_ns != 0 && c->next_trim_ns < due) due = c->next_trim_ns;
            if (c->n_unrun > 0 && c->let_go_retry_at < due) /* slots let go during this turn, or a retry */
                due = c->let_go_retry_at > now ? c->let_go_retry_at : now;
            if (c->write_blocked_until != 0) {
                if (c->write_blocked_until < due) due = c->write_blocked_until;
            } else if (c->n_done > 0) {
                due = now; /* e.g. dead records made by the due fetch */
            } else if (!stopping && tps_sched_count(c->sched) > 0 && c->n_free > c->read_outstanding) {
                uint64_t next = tps_sched_next(c->sched), wall = tps_unix_ms();
                uint64_t in = next > wall ? ms_ns(next - wall) : 0;
                if (now + in < due) due = now + in;
            }
        }
        if (c->n_overflow > 0 && now + ms_ns(10) < due) due = now + ms_ns(10);
        if (atomic_load(&c->finishing) && atomic_load(&c->finish_deadline) < due)
            due = atomic_load(&c->finish_deadline);
        int timeout = due > now ? (int)((due - now + 999999) / 1000000) : 0;
        struct pollfd pf[3] = {{.fd = tp_cq_fd(c->cq), .events = POLLIN},
                               {.fd = c->ctl_fd, .events = POLLIN},
                               {.fd = -1, .events = POLLIN}};
        if (c->rd != NULL && c->read_outstanding > 0) pf[2].fd = c->rd->fd;
        int n = poll(pf, 3, timeout);
        if (n > 0 && (pf[2].revents & (POLLIN | POLLHUP | POLLERR)) && c->rd != NULL && receive_read(c) != 0)
            disconnect(c, "reading", c->rd != NULL && c->rd->err ? c->rd->errstr : NULL);
    }
    if (c->rd != NULL) redisFree(c->rd);
    if (c->wr != NULL) redisFree(c->wr);
    c->rd = c->wr = NULL;
    cnt_set(&c->g_connected, 0);
    update_gauges(c);
    return NULL;
}

/* ------------------------------------------------------------------ public API */

static int copy_name(char *dst, const char *src, const char *def, const char *what, char *err,
                     size_t errlen) {
    const char *v = src != NULL && *src != '\0' ? src : def;
    if (strlen(v) > TPS_NAME_MAX) {
        snprintf(err, errlen, "%s is longer than %d bytes", what, TPS_NAME_MAX);
        return -1;
    }
    strcpy(dst, v);
    return 0;
}

static uint32_t pow2_at_least(uint32_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* The consumer's arrays, allocated at create; each may be NULL. */
static void free_buffers(tps_consumer *c) {
    free(c->slots);
    free(c->ids);
    free(c->users);
    free(c->uidx);
    free(c->argv);
    free(c->argvlen);
    free(c->claim_got);
    free(c->claim_err);
    free(c->due_buf);
    free(c->numbuf);
    tps_sched_destroy(c->sched);
}

/* 16 random hex digits for c->writer: getrandom(), or, where it fails, the
 * clock, the pid and the address mixed (splitmix64). */
static void make_writer(tps_consumer *c) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        v = tp_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)c;
        v += 0x9e3779b97f4a7c15ull;
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
        v ^= v >> 31;
    }
    snprintf(c->writer, sizeof c->writer, "%016llx", (unsigned long long)v);
}

int tps_create(tps_consumer **out, const tps_config *cfg, char *err, size_t errlen) {
    if (out == NULL || cfg == NULL || cfg->pool == NULL || cfg->pool_capacity == 0) {
        snprintf(err, errlen, "tps_create: a pool and its capacity are required");
        return -1;
    }
    if (cfg->pool_capacity > (1u << 20) || cfg->backlog > (1u << 20)) {
        snprintf(err, errlen, "tps_create: pool_capacity and backlog must be at most 1048576");
        return -1;
    }
    if (cfg->claim_idle_ns != 0 && cfg->claim_idle_ns < 10 * 1000000ull) {
        snprintf(err, errlen, "CLAIM_IDLE must be at least 10ms");
        return -1;
    }
    tps_consumer *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char defname[TPS_NAME_MAX + 1], host[200] = "host";
    (void)gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(defname, sizeof defname, "%s-%ld", host, (long)getpid());
    if (tps_redis_parse(cfg->redis_url, cfg->redis_password, &c->addr, err, errlen) != 0 ||
        copy_name(c->stream, cfg->stream, "tasks", "STREAM", err, errlen) != 0 ||
        copy_name(c->group, cfg->group, "taskpool", "GROUP", err, errlen) != 0 ||
        copy_name(c->consumer, cfg->consumer, defname, "CONSUMER", err, errlen) != 0 ||
        copy_name(c->results, cfg->results_stream, "tasks:done", "RESULTS_STREAM", err, errlen) != 0 ||
        copy_name(c->dead, cfg->dead_stream, "tasks:dead", "DEAD_STREAM", err, errlen) != 0) {
        free(c);
        return -1;
    }
    make_writer(c);
    const char *clash = strcmp(c->results, c->stream) == 0 ? "RESULTS_STREAM"
                        : strcmp(c->dead, c->stream) == 0  ? "DEAD_STREAM"
                                                           : NULL;
    if (clash != NULL) { /* every outcome would be read back as a new entry */
        snprintf(err, errlen, "%s must differ from STREAM (\"%s\")", clash, c->stream);
        free(c);
        return -1;
    }
    const char *start = cfg->group_start != NULL && *cfg->group_start != '\0' ? cfg->group_start : "$";
    if (strcmp(start, "$") != 0 && strcmp(start, "0") != 0) {
        snprintf(err, errlen, "GROUP_START=\"%s\": expected $ (new entries only) or 0 (the whole stream)",
                 start);
        free(c);
        return -1;
    }
    strcpy(c->group_start, start);
    snprintf(c->results_maxlen, sizeof c->results_maxlen, "%llu", (unsigned long long)cfg->results_maxlen);
    snprintf(c->dead_maxlen, sizeof c->dead_maxlen, "%llu", (unsigned long long)cfg->dead_maxlen);
    c->trim_interval_ns = cfg->trim_interval_ns;
    c->max_retries = cfg->max_retries;
    /* Background entries in the pool: those that may run, and as many
     * queued behind them, so a worker finds the next one at once. */
    c->low_cap = 2 * cfg->low_prio_max_running;
    c->pool = cfg->pool;
    c->pool_capacity = cfg->pool_capacity;
    c->queue_capacity = cfg->queue_capacity < cfg->pool_capacity ? cfg->queue_capacity : 0;
    c->nslots = cfg->pool_capacity + (cfg->backlog != 0 ? cfg->backlog : cfg->pool_capacity);
    c->claim_idle_ns = cfg->claim_idle_ns != 0 ? cfg->claim_idle_ns : 30ull * 1000000000ull;
    c->max_deliveries = cfg->max_deliveries != 0 ? cfg->max_deliveries : 5;
    c->block_ms = cfg->block_ms != 0 ? cfg->block_ms : 1000;
    c->handler = cfg->handler != NULL ? cfg->handler : tps_default_handler;
    c->handler_arg = cfg->handler_arg;
    c->log = cfg->log;
    c->log_arg = cfg->log_arg;
    strcpy(c->claim_cursor, "0-0");
    strcpy(c->results_floor, "0-0");
    strcpy(c->dead_floor, "0-0");
    c->backoff_ms = BACKOFF_MIN_MS;
    uint64_t quarter_ms = c->claim_idle_ns / 4 / 1000000u;
    c->backoff_max_ms = quarter_ms < BACKOFF_MIN_MS   ? BACKOFF_MIN_MS
                        : quarter_ms > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                      : (unsigned)quarter_ms;
    c->write_retry_ms = c->let_go_retry_ms = WRITE_RETRY_MIN_MS;
    c->ctl_fd = -1;

    uint32_t idsz = pow2_at_least(2 * c->nslots);
    c->ids_mask = idsz - 1;
    c->uidx_mask = idsz - 1;
    /* the largest command: an outcome batch, at most 4 + 2 x 9 arguments per record */
    c->argcap = (c->nslots > WRITE_BATCH * 22 ? c->nslots : WRITE_BATCH * 22) + CLAIM_ARGS_MAX + 32;
    c->slots = calloc(c->nslots, sizeof *c->slots);
    c->ids = calloc(idsz, sizeof *c->ids);
    c->users = calloc(c->nslots, sizeof *c->users);
    c->uidx = calloc(idsz, sizeof *c->uidx);
    c->argv = calloc(c->argcap, sizeof *c->argv);
    c->argvlen = calloc(c->argcap, sizeof *c->argvlen);
    c->claim_got = calloc(c->nslots, sizeof *c->claim_got);
    c->claim_err = calloc(c->nslots, sizeof *c->claim_err);
    c->due_buf = calloc(DUE_BATCH, sizeof *c->due_buf);
    c->numbuf = calloc((size_t)WRITE_BATCH * NUMS_PER_RECORD, sizeof *c->numbuf);
    c->sched = tps_sched_create(cfg->scheduled_max != 0 ? cfg->scheduled_max : 10000);
    /* Every task is bound to the completion queue. Its places are taken by
     * entries in the pool and by completions not drained yet, each a slot of
     * its own: nslots places are never all taken (a refusal would only send
     * the entry to the overflow list). */
    unsigned cq_places = c->nslots < TP_MAX_QUEUE_CAPACITY ? c->nslots : TP_MAX_QUEUE_CAPACITY;
    if (c->due_buf == NULL || c->numbuf == NULL || c->sched == NULL || c->claim_got == NULL ||
        c->claim_err == NULL || c->slots == NULL || c->ids == NULL || c->users == NULL || c->uidx == NULL ||
        c->argv == NULL || c->argvlen == NULL || (c->ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
        tp_cq_create(&c->cq, cq_places) != TP_OK) {
        snprintf(err, errlen, "out of memory");
        if (c->ctl_fd >= 0) close(c->ctl_fd);
        free_buffers(c);
        free(c);
        return -1;
    }
    for (uint32_t i = 0; i < c->nslots; i++) {
        c->slots[i].c = c;
        c->slots[i].state = S_FREE;
        c->slots[i].next = i + 1 < c->nslots ? i + 1 : NIL;
    }
    users_reset(c);
    c->free_head = 0;
    c->n_free = c->nslots;
    for (int l = 0; l < LANES; l++) c->overflow_head[l] = c->overflow_tail[l] = NIL;
    c->done_head = c->done_tail = NIL;
    c->unrun_head = c->unrun_tail = NIL;
    *out = c;
    return 0;
}

int tps_start(tps_consumer *c) {
    if (pthread_create(&c->thread, NULL, io_main, c) != 0) return -1;
    c->started = 1;
    return 0;
}

static void wake(tps_consumer *c) {
    if (atomic_exchange(&c->ctl_pending, 1) == 0) {
        uint64_t one = 1;
        if (write(c->ctl_fd, &one, sizeof one) < 0) {
            /* EAGAIN: the counter is full, so the thread is awake anyway */
        }
    }
}

void tps_stop_reading(tps_consumer *c) {
    atomic_store(&c->stop_reading, 1);
    wake(c);
}

int tps_finish(tps_consumer *c, uint64_t budget_ns) {
    if (!c->started) return 0;
    atomic_store(&c->stop_reading, 1);
    uint64_t now = tp_now_ns();
    atomic_store(&c->finish_deadline, budget_ns > UINT64_MAX - now ? UINT64_MAX : now + budget_ns);
    atomic_store(&c->finishing, 1);
    wake(c);
    pthread_join(c->thread, NULL);
    c->started = 0;
    return c->finish_result;
}

void tps_destroy(tps_consumer *c) {
    if (c == NULL) return;
    if (c->started) (void)tps_finish(c, 0);
    /* Completions that came after the I/O thread stopped: their entries are
     * forgotten (still pending in the group) without a submit. */
    c->destroying = 1;
    while (tp_cq_drain(c->cq, 0) > 0) {
    }
    if (tp_cq_destroy(c->cq) != TP_OK) /* a task still runs: the caller broke the contract */
        log1(c, TP_LOG_ERROR, "completion_queue_busy", "effect", "the queue is not freed");
    close(c->ctl_fd);
    free_buffers(c);
    free(c);
}

const char *tps_consumer_name(const tps_consumer *c) { return c->consumer; }

const char *tps_redis_shown(const tps_consumer *c) { return c->addr.shown; }

void tps_stats_get(tps_consumer *c, tps_stats *o) {
#define LD(x) atomic_load_explicit(&c->x, memory_order_relaxed)
    o->read = LD(n_read);
    o->claimed = LD(n_claimed);
    o->acked = LD(n_acked);
    o->succeeded = LD(n_succeeded);
    o->dead = LD(n_dead);
    o->malformed = LD(n_malformed);
    o->ack_missed = LD(n_ack_missed);
    o->abandoned = LD(n_abandoned);
    o->user_waits = LD(n_user_waits);
    o->low_prio_waits = LD(n_low_prio_waits);
    o->reconnects = LD(n_reconnects);
    o->deleted = LD(n_deleted);
    o->scheduled = LD(n_scheduled);
    o->write_failures = LD(n_write_failures);
    o->trimmed = LD(n_trimmed);
    o->held = LD(g_held);
    o->backlog = LD(g_backlog);
    o->unwritten = LD(g_unwritten);
    o->connected = LD(g_connected);
    o->waiting = LD(g_waiting);
#undef LD
}

int tps_stats_format(const tps_stats *s, char *buf, size_t len) {
    static const struct {
        const char *name, *help;
        size_t off;
        int counter;
    } rows[] = {
#define R(f, c, h) {#f, h, offsetof(tps_stats, f), c}
        R(read, 1, "Entries received by XREADGROUP."),
        R(claimed, 1, "Entries taken over from idle consumers by a claim."),
        R(acked, 1, "Entries acknowledged after their outcome was written."),
        R(succeeded, 1, "Entries written to the results stream."),
        R(dead, 1, "Entries written to the dead stream."),
        R(malformed, 1, "Dead entries whose fields did not parse."),
        R(ack_missed, 1, "Outcomes written for entries another consumer had acknowledged (duplicates)."),
        R(abandoned, 1, "Entries cancelled by a forced shutdown, left pending for another consumer."),
        R(user_waits, 1, "Entries that waited in the local backlog for a user slot."),
        R(low_prio_waits, 1, "Background entries that waited in the local backlog for LOW_PRIO_MAX_RUNNING."),
        R(reconnects, 1, "Connections re-established after a loss."),
        R(deleted, 1,
          "Dead records of entries deleted from the stream before they ran, or before a cancelled run "
          "ended."),
        R(scheduled, 1, "Entries that waited for their time (not_before, defer)."),
        R(write_failures, 1, "Outcome batches the server refused (kept and retried; nothing acknowledged)."),
        R(trimmed, 1, "Entries removed from the stream by TRIM_DONE."),
        R(held, 0, "Entries held by this process now."),
        R(backlog, 0, "Entries in the local backlog now."),
        R(unwritten, 0, "Finished entries whose outcome is not written yet."),
        R(connected, 0, "1 while connected to Redis."),
        R(waiting, 0, "Scheduled entries waiting for their time now."),
#undef R
    };
    size_t n = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)s + rows[i].off, sizeof v);
        const char *suf = rows[i].counter ? "_total" : "";
        int w = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0,
                         "# HELP tps_stream_%s%s %s\n# TYPE tps_stream_%s%s %s\ntps_stream_%s%s %llu\n",
                         rows[i].name, suf, rows[i].help, rows[i].name, suf,
                         rows[i].counter ? "counter" : "gauge", rows[i].name, suf, (unsigned long long)v);
        if (w < 0) return -1;
        n += (size_t)w;
    }
    return (int)n;
}
