/*
 * tp_stream.h -- a Redis Streams consumer that feeds a libtaskpool pool.
 *
 * The durable, cross-machine queue is a Redis stream read through a consumer
 * group; the pool bounds concurrency and per-user slots on this machine; this
 * module is the bridge. Run N processes with the same STREAM and GROUP and
 * each entry runs on one of them -- at least once, never acknowledged before
 * its outcome is written.
 *
 * Threads. hiredis connections are not thread-safe, so exactly one thread
 * touches Redis: the I/O thread started by tps_start(). It owns two
 * connections to the same server:
 *   reader  XREADGROUP ... COUNT <free capacity> BLOCK <ms> STREAMS s >,
 *           sent without waiting for the answer; the thread poll()s its socket
 *           together with the completion queue's descriptor and a control
 *           eventfd (tps_stop_reading, tps_finish);
 *   writer  everything else, synchronously: outcome records, the claim
 *           and the idle-time heartbeat (scripts that XCLAIM, scripts.h),
 *           XGROUP CREATE, the fetch of scheduled entries that came due, the
 *           trim.
 * The pool's threads never call Redis, nor anything of the consumer: every
 * task is bound to the consumer's completion queue (tp_cq, taskpool.h section
 * 15), so its on_done runs on the I/O thread, inside tp_cq_drain(), when
 * tp_cq_fd() polls readable. The queue has a place for every slot, so it
 * never refuses; a forced shutdown's TP_ECANCELED endings arrive through it
 * too. on_done files the outcome and submits what the end lets go in (the
 * user's next held entry, a background entry, an overflow). The outcomes are
 * written in batches: one pipelined XADD to the results stream per success,
 * one outcome script (scripts.h) for the batch's dead records, then, with
 * the replies in, one XACK for the successes whose record was written. So an
 * entry is acknowledged only once its record is written; when a record is
 * refused (say the results key became a string), its outcome stays in its
 * slot, reading stops, and the write is retried with backoff, logged each
 * time. A record written whose XACK failed is not written again: only the
 * XACK is retried.
 *
 * Memory is fixed at tps_create(): `pool_capacity + backlog` entry slots
 * (the most entries this process holds at any time), the completion queue's
 * ring, as many user records, two hash tables (held ids, users with held
 * entries) and the timer heap of scheduled entries (timers.h). Reading,
 * running and writing an entry allocates nothing here (hiredis allocates its
 * replies).
 *
 * Scheduled entries (`not_before`, `defer`): an entry read before its time
 * gives its slot back and waits in the timer heap as an id and a due time,
 * pending in the group (the heartbeat keeps it ours). When it is due, the
 * I/O thread reads its fields again (XRANGE) and submits it ahead of any new
 * read, in its own priority lane (a due entry is not raised: give entries
 * that must start on time a priority above the work that fills the queue).
 * If it must be held (below), it goes before the held entries of its user
 * and lane that did not wait for a time, since it was read before them. An
 * entry deleted from the stream meanwhile goes to the dead stream, once (when
 * the heartbeat finds it gone, or at its time; a peer's claim leaves it to
 * its live holder: see Recovery).
 * The heap's capacity caps the reads: with it full, nothing more is read
 * until one is due (claims go on: a claimed entry that finds no room stays
 * pending, its delivery undone, and is claimed again later).
 *
 * Priorities and fair shares are the pool's (taskpool.h section 14): an
 * entry's `priority` is its tp_task_opts.priority, its `user` its user, and
 * the pool picks the next start among the entries in its queue (lanes, the
 * round of a fair pool, weights). The consumer only keeps out of the pool
 * what could not start there anyway, so the pool's queue holds startable
 * entries and reading goes on past entries that must wait:
 *
 * Back-pressure and the local backlog. XREADGROUP's COUNT is the pool's free
 * room (pool_capacity - entries in the pool, and at most the free places in
 * its queue when queue_capacity is given), capped by the free slots; with no
 * room, nothing is read, and the thread sleeps in poll(). An entry that cannot
 * start is held in the local backlog, in its user's record, in the FIFO of its
 * priority lane, and submitted when the event it waits for comes -- never
 * retried in a loop:
 *   - its user is at the pool's max_per_user (tp_submit -> TP_EUSERLIMIT), or
 *     an entry of its user in the same or a higher lane is held already:
 *     when one of the user's tasks ends, the user's best held entry (highest
 *     lane first, then read order) goes in. An urgent entry thus never waits
 *     behind its user's held normal entries: it goes into the pool at once if
 *     the user has a free place, else it is the user's next;
 *   - a background entry (priority < 0) while 2 x low_prio_max_running of
 *     them are in the pool (that many may run, as many wait behind them):
 *     when one of those ends, the users with held background entries take
 *     turns (one entry each, users at their limit skipped), so a user's
 *     background burst does not hold up another user's either. Without this,
 *     background entries that may not start would fill the pool's queue and
 *     stop the reading of the normal entries behind them while workers idle.
 * Priorities and fairness therefore act on what this process holds: the pool
 * plus the local backlog. The stream is read in order, so an entry behind
 * more unread entries than that waits until the reading reaches it; size
 * QUEUE_CAPACITY and LOCAL_BACKLOG for the bursts to be fair across. When
 * slots run out (outcomes not yet written count too, e.g. while Redis is
 * away), reading stops.
 *
 * Recovery. Every claim_idle / 2 the thread claims entries idle longer than
 * claim_idle from any consumer (dead ones included), and every
 * claim_idle / 3 it resets the idle time of every entry it holds (XCLAIM to
 * itself with JUSTID, which does not count a delivery), so a live but busy
 * consumer is never robbed. After a reconnect the first claim waits one
 * claim_idle, so that peers reconnecting a moment later refresh their
 * entries first (the reconnect backoff is capped at claim_idle / 4 for this).
 * Both are scripts (scripts.h), not XAUTOCLAIM and a plain XCLAIM: since
 * Redis 7 those drop every deleted entry they pass from the pending list,
 * XAUTOCLAIM whoever holds it, so a peer's sweep wrote a dead record for a
 * live worker's deleted entry and the worker, unable to tell, wrote its own.
 * The claim script acknowledges a deleted entry only when it is idle longer
 * than claim_idle (its holder is presumed dead), and the heartbeat's only
 * when it is pending as this consumer's; whichever did owns its dead record,
 * `entry deleted before it ran`. The script writes it itself, with the XACK,
 * where the entry is not in a worker's slot (a dead peer's, or one waiting
 * for its time), so no lost reply or crash leaves it without; one held in
 * a slot (backlog, pool) writes its outcome when it ends instead. An entry
 * delivered more than
 * max_deliveries times goes to the dead stream without running. Only
 * deliveries that could run count (Redis's count, set with XCLAIM ...
 * RETRYCOUNT and read per claimed entry with XPENDING): while an entry waits
 * for its time its count is its runs so far (a read's 1 is lowered to 0 at
 * once; a claim before its time is set back), and it is raised when the
 * entry comes due and runs; what a stop or a forced shutdown lets go of
 * unrun (entries in the backlog, tasks cancelled before they started, a
 * read that came while stopping) is given back with its delivery undone,
 * and a claim of an entry this consumer holds already (a late heartbeat) is
 * set back too. A give-back goes through a script that changes nothing
 * unless the entry is still pending as this consumer's with the count it
 * holds (a peer that claimed it meanwhile keeps its count), and a let-go
 * entry deleted from the stream gets its dead record then. So restarts and
 * crashes before an entry's time, and stops (even forced) while it waits in
 * a backlog or the pool's queue, cannot send it to the dead stream, and a
 * poison entry still runs at most max_deliveries times (its run is counted
 * before it starts). The rules, step by step, are one table in counts.h
 * (unit-tested without Redis in tests/test_stream_units.c). Counted all the
 * same: what a crash finds in the backlog or the pool's queue; what a forced
 * shutdown lets go of when Redis stays away, or refuses the script (BUSY...),
 * through tps_finish's budget (it waits for a reconnection, or retries,
 * until then, and logs `let_go_unfinished`); each
 * claim of an entry whose id is ahead of the clock (its `defer` counts from
 * each claim, so its time says nothing about whether it ran; unless the
 * timer heap refuses it); a read in flight when a stop drops the reader, and
 * a read moments before a crash. A held entry in a slot (backlog, pool)
 * that the heartbeat found deleted gets its record when it runs, or at a
 * stop; a crash before either loses it (the heartbeat acknowledged it). Its
 * record does not hang on the script's reply: when one is lost (the
 * connection failed, or timed out while Redis went on), every slot counts as
 * possibly acknowledged, and one let go later whose entry is deleted and not
 * pending at all gets its record from this worker. A
 * deleted entry gets two records only as any entry can run twice: when its
 * worker stalls longer than claim_idle (a peer's claim takes it over, or
 * records it deleted, while the stalled worker still runs it). A claim
 * leaves the worker's own deleted entries to the hold script (the one the
 * heartbeat uses), so a stall of its own, or a lost reply, does not make
 * it record what a slot of its own holds; and an entry a peer took over
 * and then abandoned, that the worker's claim records while the worker
 * still holds it, gets no second record from its slot (logged
 * `outcome_dropped`). Nor is one the worker holds in no slot yet recorded
 * behind its back: an entry a read delivered, whose reply waits unread
 * while a stall passes claim_idle, is recorded only after that read has
 * ended (it is in a slot by then); so the deleted entries an earlier
 * process of the same name left pending are recorded by the first claim
 * or heartbeat after the read in flight when a claim found them, 64 at
 * most per claim (the rest are found again when the claims come round).
 * After each claim pass that ran (room in the pool) the thread deletes the group's other consumers with
 * nothing pending and idle REAP_IDLE_CLAIMS (5) x claim_idle, and 3 x
 * BLOCK, or longer (XGROUP DELCONSUMER, in one script with the XINFO
 * CONSUMERS check: scripts.h, tps_script_reap): those of workers that are
 * gone (with the default CONSUMER, <hostname>-<pid>, one per restart). A
 * live worker reads every BLOCK or holds entries; one deleted all the same
 * loses nothing (nothing pending), and its next read creates it again.
 * When a connection fails, both are closed and reopened with exponential
 * backoff (100 ms to 2 s); tasks keep running and their outcomes wait in
 * their slots.
 *
 * Messages: the fields of entry.h. A value that does not parse, a repeated
 * field or an oversized one sends the entry to the dead stream with a reason
 * naming the field.
 *
 * Shutdown: tps_stop_reading(); tp_shutdown(pool, budget); tps_finish().
 * tps_finish drains the completion queue until a drain finds none and every
 * outcome is written and everything let go of is given back (or its
 * budget runs out). Tasks that end cancelled (forced shutdown: TP_ECANCELED
 * through the queue) write nothing and stay pending in the group, idle for
 * claim_idle already, so a peer takes them at its next claim; those that
 * never started without the delivery that brought them; one deleted from
 * the stream meanwhile gets its dead record instead. A cancelled run that
 * returns 0 is a success like any other (tps_handler). tps_finish does not
 * wait for runs still going: one that ends after it is neither recorded nor
 * let go, and a peer claims it after claim_idle.
 */
#ifndef TP_STREAM_H
#define TP_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "entry.h"
#include "taskpool.h"

#define TPS_ID_MAX     41   /* "<ms>-<seq>", two 20-digit numbers and a dash */
#define TPS_RESULT_MAX 1024 /* bytes a handler may return (tps_set_result) */
#define TPS_NAME_MAX   255  /* bytes of a stream, group or consumer name */

typedef struct tps_consumer tps_consumer; /* opaque */

/* One parsed entry, as given to the handler. Valid during the call only. */
typedef struct tps_msg {
    const char *id;      /* the stream entry id */
    const char *user;    /* NULL when the entry has none */
    uint64_t work_ns;    /* `work` (alias `delay`), 0 when absent */
    uint32_t fail;       /* `fail`: 0, N, or TPS_FAIL_ALWAYS */
    int priority;        /* `priority`, TP_PRIO_MIN..TP_PRIO_MAX (0 when absent) */
    const char *payload; /* NULL when absent; not NUL-terminated */
    size_t payload_len;
    unsigned deliveries;   /* how often Redis has delivered it, this time included */
    unsigned max_attempts; /* attempts this delivery may take: the entry's `attempts`, at most the pool's */
    void *internal;        /* the consumer's; for tps_set_result */
} tps_msg;

/* The work of one entry, run on a pool worker. Return 0 for success, anything
 * else (negative values and TP_ error codes included) for a failed attempt,
 * retried as the pool's max_retries (tps_config.max_retries must be the
 * same) and the entry's `attempts` say. After a forced shutdown cancelled the
 * run (tp_ctx_err() is TP_ECANCELED), 0 still means the work was done: the
 * success is recorded, if the run returns before tps_finish() is done; a
 * failure is not, and the entry stays pending for another consumer. NULL in
 * tps_config.handler means tps_default_handler. */
typedef int (*tps_handler)(tp_ctx *ctx, const tps_msg *msg, void *arg);

/* From a handler, during its call: `len` bytes (at most TPS_RESULT_MAX) to
 * write into the entry's outcome record as `result` (copied). Each attempt
 * starts with no result; the last attempt's counts. 0, or -1 when too long
 * (nothing is kept). */
int tps_set_result(const tps_msg *msg, const void *data, size_t len);

/* The demo's behaviour: fail while tp_ctx_attempt() < msg->fail, else
 * tp_ctx_sleep(work) and succeed with the payload as the result (an echo).
 * Returns TPS_RUN_FAILED (an injected failure), TPS_RUN_TIMEDOUT (the run
 * timeout cut the sleep short), TPS_RUN_CANCELED (tp_cancel or a forced
 * shutdown), or 0. */
enum { TPS_RUN_FAILED = 1, TPS_RUN_TIMEDOUT = 2, TPS_RUN_CANCELED = 3 };
int tps_default_handler(tp_ctx *ctx, const tps_msg *msg, void *arg);

/* Log hook: `event` is a short name ("connected", "dead", ...); `kv` holds
 * `nkv` key/value string pairs (kv[2i] key, kv[2i+1] value). Called on the I/O
 * thread or on the thread calling the tps_ function; valid during the call. */
typedef void (*tps_log_fn)(void *log_arg, int level, const char *event, const char *const *kv, size_t nkv);

typedef struct tps_config {
    const char *redis_url;         /* redis_conn.h; NULL -> redis://127.0.0.1:6379 */
    const char *redis_password;    /* REDIS_PASSWORD, or NULL */
    const char *stream;            /* NULL -> "tasks" */
    const char *group;             /* NULL -> "taskpool"; created with MKSTREAM when missing */
    const char *group_start;       /* where a missing group starts: "$" (NULL) or "0" */
    const char *consumer;          /* NULL -> "<hostname>-<pid>" */
    const char *results_stream;    /* NULL -> "tasks:done"; must differ from stream */
    const char *dead_stream;       /* NULL -> "tasks:dead"; must differ from stream */
    uint64_t results_maxlen;       /* 0 -> unbounded; else XADD MAXLEN ~ n */
    uint64_t dead_maxlen;          /* likewise */
    uint64_t trim_interval_ns;     /* 0 -> no trim; else trim the stream below what every group needs */
    unsigned scheduled_max;        /* entries waiting for their time; 0 -> 10000 */
    tp_pool *pool;                 /* required; the caller creates and shuts it down */
    unsigned pool_capacity;        /* required: the pool's workers + queue_capacity */
    unsigned max_retries;          /* the pool's max_retries (an entry's `attempts` can only lower it) */
    unsigned queue_capacity;       /* the pool's queue_capacity; 0 -> unknown. When given, a read never
                                 * asks for more than the queue can take at once, so tp_submit does
                                 * not meet TP_EFULL in the instant before the workers pick up */
    unsigned backlog;              /* entries held locally beyond the pool; 0 -> pool_capacity */
    unsigned low_prio_max_running; /* the pool's low_prio_max_running (0: none): background
                                    * entries beyond twice this wait in the local backlog */
    uint64_t claim_idle_ns;        /* 0 -> 30 s; at least 10 ms */
    unsigned max_deliveries;       /* 0 -> 5 */
    unsigned block_ms;             /* XREADGROUP BLOCK; 0 -> 1000 */
    tps_handler handler;           /* NULL -> tps_default_handler */
    void *handler_arg;
    tps_log_fn log; /* NULL -> no logging */
    void *log_arg;
} tps_config;

/* Counters, monotonic unless marked "now". */
typedef struct tps_stats {
    uint64_t read;           /* entries received by XREADGROUP */
    uint64_t claimed;        /* entries taken over by a claim */
    uint64_t acked;          /* entries acknowledged (outcome written), dead included */
    uint64_t succeeded;      /* ... of which in the results stream */
    uint64_t dead;           /* ... of which in the dead stream */
    uint64_t malformed;      /* dead because the entry did not parse */
    uint64_t ack_missed;     /* outcomes written for entries some other consumer had acknowledged */
    uint64_t abandoned;      /* dropped by a forced shutdown: left pending for another consumer */
    uint64_t user_waits;     /* entries that went to the local backlog (TP_EUSERLIMIT) */
    uint64_t low_prio_waits; /* background entries that went to the local backlog (low_prio_max_running) */
    uint64_t reconnects;     /* successful connections after the first */
    uint64_t deleted;   /* dead: deleted from the stream before it ran, or before its cancelled run ended */
    uint64_t scheduled; /* entries that waited for their time (not_before, defer) */
    uint64_t write_failures; /* outcome batches the server refused (kept, retried) */
    uint64_t trimmed;        /* entries removed from the stream by the trim */
    uint64_t held;           /* now: entries this process holds (backlog, pool, unwritten) */
    uint64_t backlog;        /* now: entries in the local backlog */
    uint64_t unwritten;      /* now: finished entries whose outcome is not written yet */
    uint64_t connected;      /* now: 1 when both connections are up */
    uint64_t waiting;        /* now: scheduled entries waiting for their time */
} tps_stats;

/*
 * tps_create -- validate `cfg`, allocate every slot and table. Connects
 * nothing yet. 0 on success; -1 with a one-line reason in err otherwise
 * (invalid URL, a name too long, results or dead equal to the stream, pool
 * NULL, pool_capacity 0, no memory).
 */
int tps_create(tps_consumer **out, const tps_config *cfg, char *err, size_t errlen);

/* Start the I/O thread. 0, or -1 when the thread could not start. Block
 * SIGTERM/SIGINT before calling if the caller wants them on its own thread. */
int tps_start(tps_consumer *c);

/* Stop reading and claiming new entries; entries in the local backlog are
 * released (left pending for others, with the delivery that brought them
 * here undone, since they never ran, and idle for claim_idle already, so a
 * peer takes them at its next claim); entries waiting for their time are
 * left pending with their count (their runs so far); held entries deleted
 * from the stream meanwhile get their dead record here. Tasks in
 * the pool keep running and their outcomes keep being written. Does not
 * block on the pool; sends the releases to Redis and reads their replies
 * (a few ms; with no connection, the counts stay as they are). Idempotent. */
void tps_stop_reading(tps_consumer *c);

/*
 * tps_finish -- call after the pool has drained or its shutdown was forced
 * (tp_shutdown returned). Waits up to `budget_ns` until every outcome of a
 * finished task is written (reconnecting if need be), then stops the I/O
 * thread. Returns 0 when nothing was left unwritten, -1 otherwise (those
 * entries stay pending in the group and run again elsewhere).
 */
int tps_finish(tps_consumer *c, uint64_t budget_ns);

/* Free everything (completions still queued are drained first, submitting
 * nothing, so the pool may be destroyed already). Only after tps_finish(),
 * and only if no task of the pool can still run (tp_wait returned with the
 * workers gone). */
void tps_destroy(tps_consumer *c);

void tps_stats_get(tps_consumer *c, tps_stats *out);

/* Prometheus text for `s` (tps_stream_<name>_total counters, gauges without
 * _total). Behaves like snprintf. */
int tps_stats_format(const tps_stats *s, char *buf, size_t len);

/* The consumer name in use (the default one once resolved). */
const char *tps_consumer_name(const tps_consumer *c);

/* REDIS_URL with the password hidden, for logs. */
const char *tps_redis_shown(const tps_consumer *c);

#endif
