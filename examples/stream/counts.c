/*
 * counts.c -- the delivery-count rules (see counts.h for the table).
 */
#include "counts.h"

#include "timers.h"

tps_admit_plan tps_counts_admit(const tps_admit_in *in, unsigned max_deliveries) {
    tps_admit_plan p = {.verdict = TPS_ADMIT_RUN, .deliveries = in->deliveries};
    /* A claim that will not run now (a stop, or a known time later) was no
     * run: set back. A guessed time keeps it: the claim may be its run. */
    if (in->from == TPS_FROM_CLAIM && p.deliveries > 0 && !in->malformed &&
        (in->stopping || (in->not_due && !in->due_guess))) {
        p.deliveries--;
        p.set_back = 1;
    }
    if (p.deliveries > max_deliveries)
        p.verdict = TPS_ADMIT_DEAD_COUNT;
    else if (in->malformed)
        p.verdict = TPS_ADMIT_DEAD_MALFORMED;
    else if (in->stopping) {
        /* Released unrun: a claim was set back above; a read's or a due
         * entry's delivery is given back when it is let go. */
        p.verdict = TPS_ADMIT_RELEASE;
        p.let_go_back = in->from != TPS_FROM_CLAIM && p.deliveries > 0;
    } else if (in->not_due) {
        /* The heap keeps the runs so far. A read's 1 is lowered soon
         * (LOWER); a guessed-time claim's stands for the coming run (RAISED). */
        int read = in->from == TPS_FROM_READ && p.deliveries > 0;
        int guess = in->from == TPS_FROM_CLAIM && in->due_guess && p.deliveries > 0;
        p.verdict = TPS_ADMIT_WAIT;
        p.heap_runs = p.deliveries - (read || guess ? 1u : 0u);
        p.heap_flags = read ? TPS_SCHED_LOWER : guess ? TPS_SCHED_RAISED : 0u;
        p.set_back_if_full = guess;
    }
    return p;
}

unsigned tps_counts_claimed(unsigned xpending) { return xpending != 0 ? xpending : 2u; }

unsigned tps_counts_due(unsigned heap_runs, unsigned heap_flags, int *set) {
    *set = !(heap_flags & (TPS_SCHED_LOWER | TPS_SCHED_RAISED));
    return heap_runs + 1;
}

unsigned tps_counts_put_back(unsigned heap_runs, unsigned heap_flags) {
    return heap_runs + (heap_flags & TPS_SCHED_RAISED ? 1u : 0u);
}

unsigned tps_counts_given_back(unsigned deliveries) { return deliveries > 0 ? deliveries - 1 : 0; }
