/*
 * counts.h -- the delivery counts of the entries a worker holds: what Redis's
 * count means at each step of an entry's stay, and what it must be set to.
 * Pure rules, no I/O and no state: tp_stream.c asks them at each step and
 * sends the commands they call for; tests/test_stream_units.c checks every
 * row of the table below without Redis.
 *
 * MAX_DELIVERIES judges Redis's count, which XREADGROUP and a claim (XCLAIM) raise
 * by one per delivery. A delivery that cannot run (the entry waits for its
 * time, or a stop leaves it) must not count, or an entry whose worker is
 * restarted MAX_DELIVERIES times before its time goes to the dead stream
 * unrun. So while this worker holds an entry, Redis's count is its runs so
 * far, plus one for a run that is under way or about to start:
 *
 *   step (event)                        Redis's count after it     kept here
 *   ----------------------------------  -------------------------  ---------------------
 *   read, due now                       1 (this run)               slot: 1
 *   read, not due                       1, lowered to 0 soon       heap: 0, LOWER
 *     (lower_waiting sends it)          0                          heap: 0
 *   claimed, due now                    n (this run)               slot: n
 *   claimed, not due (time known)       n - 1: set back now        heap: n - 1
 *   claimed, not due (time a guess)     n: its coming run          heap: n - 1, RAISED
 *     and the heap is full              n - 1: set back now        (not held)
 *   claimed while stopping              n - 1: set back now        (not held)
 *   read or due while stopping          n - 1: let go (below)      (released)
 *   waiting, comes due                  heap + 1: set, unless      slot: heap + 1
 *                                       LOWER or RAISED (shown)
 *   claimed, held here already          put back what we keep      unchanged
 *     (a late heartbeat)                (slot; heap + RAISED)      (LOWER done)
 *   held unrun at a stop (backlog)      n - 1: let go              (released)
 *   cancelled unstarted (forced stop),  n - 1: let go              (released)
 *     or refused by a closed pool
 *   cancelled after it started          unchanged (it ran)         (released)
 *   waiting at a stop                   unchanged (LOWER sent)     (released)
 *   crash                               unchanged                  (lost)
 *
 * "n" is the count XPENDING reports after the claim (2 if it lists none).
 * "Let go" is tp_stream.c's let_go, at the top of its loop: a script
 * (scripts.h, tps_script_let_go) sets the count and an idle time of
 * CLAIM_IDLE (a peer claims it at its next claim) only if the entry is still
 * pending as this worker's with the count it holds, so a live peer that
 * claimed it meanwhile keeps its count; a deleted entry gets its dead record.
 * A time is a guess when the entry's id is ahead of the clock (due_guess in
 * tp_stream.c): each claim then counts as its run, since the run may have
 * happened. An entry judged (dead, or a run) always holds what it runs with,
 * so a handler that crashes at once is counted. What a crash leaves one too
 * high (entries read or claimed but not started: the backlog, the pool's
 * queue) is documented in tp_stream.h, "Recovery".
 */
#ifndef TPS_COUNTS_H
#define TPS_COUNTS_H

/* How an entry came to the worker. */
typedef enum {
    TPS_FROM_READ,  /* XREADGROUP: Redis's count is 1 */
    TPS_FROM_CLAIM, /* a claim: Redis's count is what XPENDING says */
    TPS_FROM_DUE    /* out of the timer heap: tps_counts_due() gave its count */
} tps_from;

/* What becomes of an entry that came. */
typedef enum {
    TPS_ADMIT_RUN,            /* into the pool (or the backlog): it runs with `deliveries` */
    TPS_ADMIT_WAIT,           /* into the timer heap with heap_runs and heap_flags */
    TPS_ADMIT_RELEASE,        /* a stop: left pending in the group, not held */
    TPS_ADMIT_DEAD_COUNT,     /* delivered more than MAX_DELIVERIES times */
    TPS_ADMIT_DEAD_MALFORMED, /* its fields are wrong (checked after the count) */
} tps_admit_verdict;

typedef struct tps_admit_in {
    tps_from from;
    unsigned deliveries; /* Redis's count as it came */
    int malformed;       /* its fields could not be parsed */
    int stopping;        /* the worker stops reading */
    int not_due;         /* its time is later (never for TPS_FROM_DUE or a malformed entry) */
    int due_guess;       /* that time counts from the read: its id is ahead of the clock */
} tps_admit_in;

typedef struct tps_admit_plan {
    tps_admit_verdict verdict;
    unsigned deliveries;  /* the count judged and kept in the slot, after a set-back */
    int set_back;         /* set Redis's count to `deliveries` now (it came one higher) */
    unsigned heap_runs;   /* TPS_ADMIT_WAIT: the runs the heap keeps */
    unsigned heap_flags;  /* TPS_ADMIT_WAIT: TPS_SCHED_LOWER or TPS_SCHED_RAISED, or 0 */
    int set_back_if_full; /* TPS_ADMIT_WAIT: if the heap has no room, set Redis's count to
                             deliveries - 1 (the claim counted a run that did not happen) */
    int let_go_back;      /* TPS_ADMIT_RELEASE: give back its delivery (let go, checked) */
} tps_admit_plan;

/* The plan for an entry that came (read, claimed, or due). */
tps_admit_plan tps_counts_admit(const tps_admit_in *in, unsigned max_deliveries);

/* XPENDING's count for a claimed entry, or 0 when it did not list it (acked
 * meanwhile?): the count the claim is judged with. */
unsigned tps_counts_claimed(unsigned xpending);

/* A waiting entry (heap_runs, heap_flags) comes due: the count it runs with.
 * *set: whether Redis must be told first (not if it shows it already: a
 * LOWER not sent yet, or RAISED). */
unsigned tps_counts_due(unsigned heap_runs, unsigned heap_flags, int *set);

/* A claim brought back a waiting entry of ours (a late heartbeat): the count
 * to put back. The LOWER flag is done by it. */
unsigned tps_counts_put_back(unsigned heap_runs, unsigned heap_flags);

/* An entry that never ran, held in the backlog at a stop or cancelled in the
 * pool's queue by a forced shutdown, that came with `deliveries`: the count
 * to give it back with. */
unsigned tps_counts_given_back(unsigned deliveries);

#endif
