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
 *           together with a wake-up pipe;
 *   writer  everything else, synchronously: outcome transactions, XAUTOCLAIM,
 *           the idle-time heartbeat (XCLAIM ... JUSTID), XGROUP CREATE.
 * The pool's threads never call Redis: a task's on_done pushes the entry's
 * slot onto a bounded completion ring and wakes the I/O thread, which batches
 * the outcomes into one pipelined transaction
 *     MULTI, XADD <results|dead> * id <entry id> ... (one per entry),
 *     XACK <stream> <group> <every id of the batch>, EXEC
 * so an entry is acknowledged in the same transaction that records its outcome.
 *
 * Memory is fixed at tps_create(): `pool_capacity + backlog` entry slots
 * (the most entries this process holds at any time), the completion ring and
 * two hash tables (held ids, users with a backlog). Reading, running and
 * writing an entry allocates nothing here (hiredis allocates its replies).
 *
 * Back-pressure. XREADGROUP's COUNT is the pool's free room
 * (pool_capacity - entries in the pool, and at most the free places in its
 * queue when queue_capacity is given), capped by the free slots; with no
 * room, nothing is read, and the thread sleeps in poll(). An entry whose
 * user is at the pool's max_per_user (tp_submit -> TP_EUSERLIMIT) waits in
 * that user's FIFO in the local backlog and is submitted when one of the
 * user's tasks ends -- never retried in a loop. When slots run out (outcomes
 * not yet written count too, e.g. while Redis is away), reading stops.
 *
 * Recovery. Every claim_idle / 2 the thread XAUTOCLAIMs entries idle longer
 * than claim_idle from any consumer (dead ones included), and every
 * claim_idle / 3 it resets the idle time of every entry it holds (XCLAIM to
 * itself with JUSTID, which does not count a delivery), so a live but busy
 * consumer is never robbed. An entry delivered more than max_deliveries
 * times goes to the dead stream without running. When a connection fails,
 * both are closed and reopened with exponential backoff (100 ms to 2 s);
 * tasks keep running and their outcomes wait in their slots.
 *
 * Messages. Fields `user` (optional, at most TP_USER_MAX bytes), `delay` (a
 * duration such as 20ms, default 0), `fail` (`always`, or N: the first N
 * attempts of this delivery fail), `payload` (opaque, at most TPS_PAYLOAD_MAX
 * bytes). Other field names are ignored. A value that does not parse, a
 * repeated field or an oversized one sends the entry to the dead stream with
 * a reason naming the field.
 *
 * Shutdown: tps_stop_reading(); tp_shutdown(pool, budget); tps_finish().
 * Tasks that end cancelled (forced shutdown) write nothing and stay pending
 * in the group, so another consumer claims them after claim_idle.
 */
#ifndef TP_STREAM_H
#define TP_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "taskpool.h"

#define TPS_ID_MAX      41   /* "<ms>-<seq>", two 20-digit numbers and a dash */
#define TPS_PAYLOAD_MAX 1024 /* bytes of a `payload` field */
#define TPS_FAIL_ALWAYS UINT32_MAX
#define TPS_NAME_MAX    255 /* bytes of a stream, group or consumer name */

typedef struct tps_consumer tps_consumer; /* opaque */

/* One parsed entry, as given to the handler. Valid during the call only. */
typedef struct tps_msg {
    const char *id;      /* the stream entry id */
    const char *user;    /* NULL when the entry has none */
    uint64_t delay_ns;   /* `delay`, 0 when absent */
    uint32_t fail;       /* `fail`: 0, N, or TPS_FAIL_ALWAYS */
    const char *payload; /* NULL when absent; not NUL-terminated */
    size_t payload_len;
    unsigned deliveries; /* how often Redis has delivered it, this time included */
} tps_msg;

/* The work of one entry, run on a pool worker. Return 0 for success, anything
 * else for a failed attempt (retried as the pool's max_retries says). NULL in
 * tps_config.handler means tps_default_handler. */
typedef int (*tps_handler)(tp_ctx *ctx, const tps_msg *msg, void *arg);

/* The contract's behaviour: fail while tp_ctx_attempt() < msg->fail, else
 * tp_ctx_sleep(delay) and succeed. Returns TPS_RUN_FAILED (an injected failure),
 * TPS_RUN_TIMEDOUT (the run timeout cut the sleep short), TPS_RUN_CANCELED
 * (tp_cancel or a forced shutdown), or 0. */
enum { TPS_RUN_FAILED = 1, TPS_RUN_TIMEDOUT = 2, TPS_RUN_CANCELED = 3 };
int tps_default_handler(tp_ctx *ctx, const tps_msg *msg, void *arg);

/* Log hook: `event` is a short name ("connected", "dead", ...); `kv` holds
 * `nkv` key/value string pairs (kv[2i] key, kv[2i+1] value). Called on the I/O
 * thread or on the thread calling the tps_ function; valid during the call. */
typedef void (*tps_log_fn)(void *log_arg, int level, const char *event, const char *const *kv, size_t nkv);

typedef struct tps_config {
    const char *redis_url;      /* redis://host:port or unix:///path; NULL -> redis://127.0.0.1:6379 */
    const char *stream;         /* NULL -> "tasks" */
    const char *group;          /* NULL -> "taskpool"; created with MKSTREAM when missing */
    const char *consumer;       /* NULL -> "<hostname>-<pid>" */
    const char *results_stream; /* NULL -> "tasks:done" */
    const char *dead_stream;    /* NULL -> "tasks:dead" */
    tp_pool *pool;              /* required; the caller creates and shuts it down */
    unsigned pool_capacity;     /* required: the pool's workers + queue_capacity */
    unsigned queue_capacity;    /* the pool's queue_capacity; 0 -> unknown. When given, a read never
                                 * asks for more than the queue can take at once, so tp_submit does
                                 * not meet TP_EFULL in the instant before the workers pick up */
    unsigned backlog;           /* entries held locally beyond the pool; 0 -> pool_capacity */
    uint64_t claim_idle_ns;     /* 0 -> 30 s; at least 10 ms */
    unsigned max_deliveries;    /* 0 -> 5 */
    unsigned block_ms;          /* XREADGROUP BLOCK; 0 -> 1000 */
    tps_handler handler;        /* NULL -> tps_default_handler */
    void *handler_arg;
    tps_log_fn log; /* NULL -> no logging */
    void *log_arg;
} tps_config;

/* Counters, monotonic unless marked "now". */
typedef struct tps_stats {
    uint64_t read;       /* entries received by XREADGROUP */
    uint64_t claimed;    /* entries taken over by XAUTOCLAIM */
    uint64_t acked;      /* entries acknowledged (outcome written), dead included */
    uint64_t succeeded;  /* ... of which in the results stream */
    uint64_t dead;       /* ... of which in the dead stream */
    uint64_t malformed;  /* dead because the entry did not parse */
    uint64_t ack_missed; /* outcomes written for entries some other consumer had acknowledged */
    uint64_t abandoned;  /* ended cancelled: left pending for another consumer */
    uint64_t user_waits; /* entries that went to the local backlog (TP_EUSERLIMIT) */
    uint64_t reconnects; /* successful connections after the first */
    uint64_t held;       /* now: entries this process holds (backlog, pool, unwritten) */
    uint64_t backlog;    /* now: entries in the local backlog */
    uint64_t unwritten;  /* now: finished entries whose outcome is not written yet */
    uint64_t connected;  /* now: 1 when both connections are up */
} tps_stats;

/*
 * tps_create -- validate `cfg`, allocate every slot and table. Connects
 * nothing yet. 0 on success; -1 with a one-line reason in err otherwise
 * (invalid URL, a name too long, pool NULL, pool_capacity 0, no memory).
 */
int tps_create(tps_consumer **out, const tps_config *cfg, char *err, size_t errlen);

/* Start the I/O thread. 0, or -1 when the thread could not start. Block
 * SIGTERM/SIGINT before calling if the caller wants them on its own thread. */
int tps_start(tps_consumer *c);

/* Stop reading and claiming new entries; entries in the local backlog are
 * released (left pending for others). Tasks in the pool keep running and
 * their outcomes keep being written. Never blocks. Idempotent. */
void tps_stop_reading(tps_consumer *c);

/*
 * tps_finish -- call after the pool has drained or its shutdown was forced
 * (tp_shutdown returned). Waits up to `budget_ns` until every outcome of a
 * finished task is written (reconnecting if need be), then stops the I/O
 * thread. Returns 0 when nothing was left unwritten, -1 otherwise (those
 * entries stay pending in the group and run again elsewhere).
 */
int tps_finish(tps_consumer *c, uint64_t budget_ns);

/* Free everything. Only after tps_finish(), and only if no task of the pool
 * can still run (tp_wait returned with the workers gone). */
void tps_destroy(tps_consumer *c);

void tps_stats_get(tps_consumer *c, tps_stats *out);

/* Prometheus text for `s` (tps_stream_<name>_total counters, gauges without
 * _total). Behaves like snprintf. */
int tps_stats_format(const tps_stats *s, char *buf, size_t len);

/* The consumer name in use (the default one once resolved). */
const char *tps_consumer_name(const tps_consumer *c);

#endif
