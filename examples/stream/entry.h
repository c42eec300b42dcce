/*
 * entry.h -- the fields of a stream entry, parsed one by one.
 *
 * One parser for both programs: the worker parses what it reads, and
 * taskpool-enqueue validates what it is about to add with the same code, so a
 * value the worker would dead-letter is refused on the command line instead.
 *
 * Fields (other names are ignored, so producers may add their own):
 *   user        at most TP_USER_MAX bytes, no NUL; the per-user slot
 *   work        the demo handler's run time, a duration up to 1h (alias: delay)
 *   fail        `always`, or N (0..1000): the first N attempts fail (demo)
 *   payload     opaque, at most TPS_PAYLOAD_MAX bytes
 *   not_before  Unix time in ms: do not start earlier
 *   defer       a duration up to 366 days: do not start earlier than the
 *               entry's enqueue time (the ms part of its id, or the time it
 *               was read if its id is ahead of the clock) plus this
 *   attempts    1..TP_MAX_RETRIES + 1: attempts of this entry per delivery,
 *               at most the pool's MAX_RETRIES + 1
 *   priority    TP_PRIO_MIN..TP_PRIO_MAX (-2..2): the pool's priority lane;
 *               0 normal, above urgent, below background
 * A field given twice, a value that does not parse or is too long is an error
 * whose text starts with the field's name ("work: not a duration ...").
 *
 * Thread-free; no allocation; the parsed payload points into the caller's
 * buffer.
 */
#ifndef TPS_ENTRY_H
#define TPS_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "taskpool.h"

#define TPS_PAYLOAD_MAX     1024 /* bytes of a `payload` field */
#define TPS_FAIL_ALWAYS     UINT32_MAX
#define TPS_WORK_MAX_NS     (3600ull * 1000000000ull)
#define TPS_SCHED_AHEAD_MAX (366ull * 86400ull * 1000ull) /* ms: not_before / defer */
#define TPS_ATTEMPTS_MAX    (TP_MAX_RETRIES + 1u)

typedef struct tps_entry {
    char user[TP_USER_MAX + 1]; /* "" when absent */
    uint64_t work_ns;
    uint32_t fail;       /* 0, N, or TPS_FAIL_ALWAYS */
    unsigned attempts;   /* 0 when absent */
    int priority;        /* 0 when absent */
    uint64_t not_before; /* Unix ms, 0 when absent */
    uint64_t defer_ms;   /* 0 when absent */
    const char *payload; /* NULL when absent; points into the parsed value */
    size_t payload_len;
    unsigned seen; /* internal: fields met so far */
} tps_entry;

void tps_entry_init(tps_entry *e);

/* Parse one field. NULL on success (or an ignored name), else a static
 * reason naming the field. */
const char *tps_entry_field(tps_entry *e, const char *name, size_t name_len, const char *val, size_t val_len);

/* Checks across fields once all are parsed; NULL or a static reason. */
const char *tps_entry_finish(const tps_entry *e);

/* When the entry may start, Unix ms: not_before, or enqueued_ms + defer, or 0
 * (at once). */
uint64_t tps_entry_due_ms(const tps_entry *e, uint64_t enqueued_ms);

/* The ms part of an entry id "<ms>-<seq>"; 0 when it does not parse. */
uint64_t tps_id_ms(const char *id, size_t len);

/* When entry `id` was enqueued, for `defer`: the ms part of its id, but never
 * later than now_ms (the reader's clock). An id ahead of the clock (an
 * explicit id, e.g. 9999999999999-0, makes every later `*` id inherit it; or
 * a Redis server whose clock runs ahead) counts from when the entry was read:
 * it was enqueued before that, so the entry still waits at least its `defer`,
 * instead of centuries. An id that does not parse counts from now_ms too. */
uint64_t tps_enqueued_ms(const char *id, size_t len, uint64_t now_ms);

/* Unix time now, in ms. */
uint64_t tps_unix_ms(void);

#endif
