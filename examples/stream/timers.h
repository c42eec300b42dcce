/*
 * timers.h -- the entries a worker holds until their time (`not_before`,
 * `defer`): a bounded min-heap on the due time plus a hash on the entry id.
 *
 * A scheduled entry keeps only its id, due time and delivery count here
 * (about 100 bytes with the heap and index), not a slot, a pool place or a worker: it stays pending in
 * the consumer group (the heartbeat keeps it this worker's) and its fields
 * are read again from the stream when it is due. Capacity is fixed at create.
 *
 * Thread-free (the consumer's I/O thread owns it); allocates only at create.
 */
#ifndef TPS_TIMERS_H
#define TPS_TIMERS_H

#include <stddef.h>
#include <stdint.h>

#define TPS_SCHED_ID_MAX 41

typedef struct tps_sched tps_sched;

/* NULL when out of memory. cap >= 1. */
tps_sched *tps_sched_create(uint32_t cap);
void tps_sched_destroy(tps_sched *s);

uint32_t tps_sched_count(const tps_sched *s);
uint32_t tps_sched_room(const tps_sched *s);

/* Flags the consumer keeps with an entry. */
#define TPS_SCHED_LOWER  4u /* Redis's delivery count is one above the entry's: to be set (read entries) */
#define TPS_SCHED_RAISED 8u /* Redis's count is one above, and stays: it counts the coming run already */

/* 0 added; 1 already held (nothing changed); -1 full or id too long. */
int tps_sched_add(tps_sched *s, const char *id, size_t len, uint64_t due_ms, unsigned deliveries,
                  unsigned flags);
int tps_sched_has(const tps_sched *s, const char *id, size_t len);
/* 1 with the entry's delivery count and flags when id is held, else 0. */
int tps_sched_get(const tps_sched *s, const char *id, size_t len, unsigned *deliveries, unsigned *flags);

/* Set then clear flags of id, and bring its due time forward to
 * due_at_most if that is earlier (UINT64_MAX: keep it). 1 done, 0 not held. */
int tps_sched_mark(tps_sched *s, const char *id, size_t len, unsigned set, unsigned clear,
                   uint64_t due_at_most);

/* Clear `flag` on every held id. */
void tps_sched_unflag(tps_sched *s, unsigned flag);

/* The flags of the i-th held id (0 <= i < count; the order of tps_sched_id). */
unsigned tps_sched_flags(const tps_sched *s, uint32_t i);

/* Forget id: 1 removed, 0 not held. */
int tps_sched_remove(tps_sched *s, const char *id, size_t len);

/* The earliest due time, UINT64_MAX when empty. */
uint64_t tps_sched_next(const tps_sched *s);

/* Remove the earliest entry if it is due at now_ms: 1 with its id (NUL-
 * terminated, id must hold TPS_SCHED_ID_MAX + 1 bytes), length, due time,
 * deliveries and flags; 0 when nothing is due. */
int tps_sched_pop(tps_sched *s, uint64_t now_ms, char *id, size_t *len, uint64_t *due_ms,
                  unsigned *deliveries, unsigned *flags);

/* The i-th held id (0 <= i < count), in no particular order, and its
 * delivery count if `deliveries` is not NULL. */
const char *tps_sched_id(const tps_sched *s, uint32_t i, size_t *len, unsigned *deliveries);

void tps_sched_clear(tps_sched *s);

#endif
