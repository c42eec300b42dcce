/*
 * scripts.h -- the Lua scripts the stream programs run on the Redis server.
 *
 * The rule they keep: an entry is acknowledged only after its outcome record
 * was added. Not MULTI/EXEC: Redis does not roll back a transaction, and a
 * command that fails inside EXEC does not stop the ones after it, so an XACK
 * queued after a failing XADD still acknowledges an entry whose outcome was
 * never written. A script stops at the first failing call: the XACK comes
 * last, so an entry is acknowledged only after every record of its batch was
 * added (a batch that fails half-way may leave some records written twice
 * after the retry -- at least once, never zero times).
 *
 * Successes do not go through a script any more: the worker pipelines one
 * plain XADD per result and sends the XACK of those whose XADD replied with
 * an id only after reading the replies (tp_stream.c, write_outcomes), which
 * keeps the rule without the script's cost (about 4 us per record in Redis,
 * more than the XADD itself: every argument becomes a Lua string and back).
 * Dead records, rare, still use the outcome script, which also copies the
 * entry's fields into the record.
 *
 * They are sent with EVAL each time (Redis caches the compiled script), so a
 * Redis restart needs no reload and an ACL user needs +eval, not +script.
 */
#ifndef TPS_SCRIPTS_H
#define TPS_SCRIPTS_H

/*
 * Outcomes (the worker sends dead records only; "R" records still work).
 * KEYS: stream, results, dead. ARGV: group, results maxlen, dead
 * maxlen ("0": unbounded, else XADD MAXLEN ~ n), then per record: "R" or "D"
 * (results or dead), "1" or "0" (acknowledge the entry or not), entry id,
 * the number of field pairs, the pairs. A dead record also gets a copy of the
 * original entry's fields as `entry.<name>` (taskpool-enqueue --requeue-dead
 * uses them; the entry may have been trimmed by then), unless the entry has
 * more than 1000 fields: then `entry_not_copied <number of fields>` instead
 * (Lua's unpack() takes about 8000 values at most: one wide entry's record
 * would fail its whole batch, and with it every outcome after it). Refuses with a
 * WRONGTYPE error, writing nothing, when results or dead is not a stream,
 * and with NOPERM when the user may not XACK (it would write the records,
 * fail at the XACK, and write them again at every retry).
 * Returns {XACK's count, the id of the last dead record it added ("" if
 * none)}: the worker's floor for a later search of the dead stream
 * (tps_script_find_records).
 */
extern const char tps_script_outcomes[];

/*
 * Find our records among the newest (read-only): after a lost reply, which
 * of the records in flight did Redis add? KEYS: the results or the dead
 * stream. ARGV: this process's `writer` token (random, per tps_create: no
 * other process, group or stream has it), the floor (a stream id the
 * stream had reached before the records were sent: every record added
 * after the send has a greater id; "0-0": all), at most how many records to
 * look at, then the entry ids. Looks from the newest record back to the
 * floor (excluded), at each record's `id` and `writer` fields (within the
 * first five of ours). Returns {1 if the limit cut the search short else 0,
 * {ids found}}. Stream commands only: no TIME, which the README's ACL
 * user may not run.
 */
extern const char tps_script_find_records[];

/*
 * Trim the stream below what every group of it still needs: the oldest
 * pending entry of each group, or, with nothing pending, its last delivered
 * id (entries after it are not read yet). KEYS: stream. ARGV: the most
 * entries to remove in this call (XTRIM's LIMIT; `~` alone would stop at 100
 * nodes). Returns {minid, trimmed} ({"", 0} when the stream has no group).
 */
extern const char tps_script_trim[];

/*
 * Requeue dead records. KEYS: stream, dead. ARGV: dead record ids. For each:
 * XADD stream * <its entry.* fields> requeued_from <original id>, then XDEL
 * the dead record, atomically. Returns {dead id, status, new id} per record;
 * status "requeued", "gone" (no such dead record any more), "no_fields"
 * (the original entry was gone when it died: nothing to put back) or
 * "not_copied" (the entry was too wide to copy: see above).
 */
extern const char tps_script_requeue[];

/*
 * A stream's state for taskpool-enqueue --wait, in one moment (a script:
 * MULTI needs @transaction, which the README's ACL does not grant). KEYS:
 * the stream. ARGV: "" or a range start ("(<id>": after that id), and a
 * count. Returns 0 when there is no such key, else {XINFO STREAM's reply,
 * how many records XRANGE <start> + COUNT <count> returns (-1 without a
 * start)}. Any other refusal (not a stream, a permission) is an error reply.
 */
extern const char tps_script_stream_state[];

/*
 * Delete the group's consumers left by workers that are gone (a restart
 * under the default CONSUMER, <hostname>-<pid>, leaves one behind each
 * time). KEYS: stream. ARGV: group, this consumer, the least idle ms.
 * Deletes (XGROUP DELCONSUMER) every other consumer with nothing pending
 * and idle at least that long (XINFO CONSUMERS: idle counts from its last
 * read or claim). Check and delete are one script: no read of the
 * consumer's can come in between, and one that comes after just creates it
 * again (XREADGROUP does); with nothing pending, nothing is lost. Returns
 * the names deleted.
 */
extern const char tps_script_reap[];

/*
 * Let go of entries a worker holds without writing their outcome (a stop, a
 * forced shutdown), checking each against Redis first. KEYS: stream. ARGV:
 * group, consumer, idle ms, then per entry: id, the delivery count the
 * worker holds, and the count to leave it with.
 * Per entry, in order: "given" (pending as this consumer's with the count
 * held: count set, idle set, so a peer claims it at its next claim); "gone"
 * (deleted from the stream, still pending as ours: the worker writes its
 * dead record and acknowledges it); "dropped" (deleted and no longer pending:
 * the worker writes its record, with nothing to acknowledge, only if a hold
 * script of its own acknowledged it, below -- else a peer has ended it);
 * "other" (pending as another consumer's, or with another count, or not
 * pending: left as it is, so a live peer that claimed it meanwhile keeps its
 * count).
 */
extern const char tps_script_let_go[];

/*
 * Why the next two exist: since Redis 7, XCLAIM and XAUTOCLAIM drop from the
 * pending list every entry they pass that was deleted from the stream
 * (XDEL, XTRIM), XAUTOCLAIM whoever holds it and however idle; so a peer's
 * sweep removed a live worker's deleted entry and wrote its dead record, and
 * the holder, which cannot tell who removed it, wrote its own. With these,
 * the one whose script removes a deleted entry from the pending list owns
 * its record, and a sweep removes only what it could claim: entries idle
 * longer than the claim time, whose holder is presumed dead. Where the
 * entry will not run from a worker's slot, the script writes the dead
 * record itself, in the same call as the XACK, so that no lost reply or
 * crash can leave it with none: `entry deleted before it ran`, with the
 * consumer, attempts 0 and deliveries 0, as the worker writes it (skipped,
 * the entry left pending, while the dead key holds something other than a
 * stream, or while the user may not XADD to it or XACK: redis.acl_check_cmd
 * first, else the record would be written again at every call).
 */

/*
 * Keep entries this consumer holds (the heartbeat, and setting delivery
 * counts). KEYS: stream, dead. ARGV: group, consumer, a delivery count (""
 * for none), dead maxlen ("0": unbounded), then per entry: id, and "R" if
 * the worker holds it outside a slot (waiting for its time, or let go
 * unheld) or "K" if in a slot, whose task or let-go writes its record. Per
 * entry, only if it is pending as this consumer's: still in the stream,
 * XCLAIM to ourselves with JUSTID (resets its idle time; with the count,
 * RETRYCOUNT); deleted, its dead record (R) and XACK. Returns {ids recorded
 * (R), ids acknowledged whose records are the caller's (K)}. Entries pending
 * as another consumer's, or not pending, are left as they are.
 */
extern const char tps_script_hold[];

/*
 * Claim entries idle longer than the claim time from any consumer: what
 * XAUTOCLAIM does, without touching a live holder's deleted entries. KEYS:
 * stream, dead. ARGV: group, consumer, min idle ms, cursor ("0-0" at the
 * start: else the last id looked at), the most entries to claim, the most
 * pending entries to look at, dead maxlen. An idle entry deleted from the
 * stream gets its dead record and XACK when another consumer holds it (one
 * presumed dead); one pending as this consumer's is only listed and left
 * pending: it may be this process's own, in a slot and idle after a stall
 * (Redis busy, or this process stopped, longer than the claim time), whose
 * record the slot writes -- or an earlier process's of the same name. The
 * caller settles those with the hold script ("K" for its slots, else "R"),
 * so a lost reply leaves them pending, never recorded behind a slot's back.
 * Returns {next cursor ("0-0" when the pending list's end was reached),
 * entries claimed as [id, fields] (XCLAIM: the delivery count rises by
 * one), ids recorded, ids of this consumer's deleted entries}; the last
 * three together are at most the most asked.
 */
extern const char tps_script_claim[];

#endif
