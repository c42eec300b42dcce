/*
 * fz_sched.h -- the fuzz model's reference scheduler: taskpool.h section 14
 * (SPEC section 12) written as directly as the text reads, with nothing
 * shared with src/scheduler.c.
 *
 * It is a value: a plain struct with no pointers, copied freely, so the model
 * can ask "what if this retry came back before that start?" by running both
 * orders on two copies and comparing them (fzs_equal).
 *
 * The rules it encodes, in the header's words:
 *   - five lanes, TP_PRIO_MIN..TP_PRIO_MAX; a lane is *ready* when it has a
 *     waiting task that may start now; a lane below 0 only while fewer than
 *     low_prio_max_running tasks of priority < 0 run (when that is set);
 *   - a start goes to the highest ready lane, unless a ready lane's count
 *     has reached prio_starve_limit: then to the highest such lane; each
 *     ready lane counts the starts that went to a higher lane while it
 *     stayed ready, and its count returns to 0 when it starts a task or
 *     stops being ready;
 *   - within a lane: admission order (FIFO), or in a fair pool the round of
 *     users (deficit round robin with a quantum of `weight` tasks): the head
 *     user starts up to `weight` tasks in a row, then goes to the back, or
 *     leaves the round as soon as it has no waiting task in the lane; a user
 *     that gets a waiting task while out of the round joins at the back; a
 *     weight applies from the user's next turn;
 *   - a retry goes to the back of its lane (and of its user's list there).
 * A user's list in a lane is the lane's entries of that user in arrival
 * order, so one arrival list per lane holds both orders.
 */
#ifndef FZ_SCHED_H
#define FZ_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#define FZS_LANES 5   /* lane i holds priority i + TP_PRIO_MIN */
#define FZS_FLOWS 4   /* the anonymous user and three named ones */
#define FZS_MAX   192 /* entries a lane can hold (the harness's task limit, FZ_MAX_TASKS) */

typedef struct fzs_ent {
    int16_t task;   /* the harness's task index */
    int8_t attempt; /* 0 for the first run, k for the k-th retry */
    int8_t flow;    /* 0: anonymous, 1..3: named users */
} fzs_ent;

typedef struct fzs {
    /* configuration (weights change through fzs_set_weight) */
    bool fair;
    unsigned starve_limit; /* resolved: 16 for 0; UINT_MAX (TP_UNLIMITED): strict */
    unsigned low_max;      /* 0: no limit */
    unsigned weight[FZS_FLOWS];
    /* state */
    int n[FZS_LANES];
    fzs_ent q[FZS_LANES][FZS_MAX]; /* arrival order */
    int nround[FZS_LANES];
    int8_t round[FZS_LANES][FZS_FLOWS];    /* fair: the flows with waiting tasks, head first */
    unsigned credit[FZS_LANES][FZS_FLOWS]; /* fair: starts left in the turn under way; 0: none */
    unsigned starve[FZS_LANES];
    unsigned low_running; /* running tasks of priority < 0 */
} fzs;

void fzs_init(fzs *s, bool fair, unsigned starve_limit, unsigned low_max);
void fzs_set_weight(fzs *s, int flow, unsigned weight);
/* A task waits now, at the back of lane `lane` (0..4). */
void fzs_push(fzs *s, int lane, fzs_ent e);
/* The lane the next start takes, -1 when no lane is ready. */
int fzs_pick(const fzs *s);
/* Start the task lane `lane` (fzs_pick's answer) gives: counts and rounds
 * move; the entry is returned. */
fzs_ent fzs_start(fzs *s, int lane);
/* An attempt of a task of lane `lane` ended (it no longer runs). */
void fzs_done(fzs *s, int lane);
/* A waiting task leaves without a start (cancel, expiry); false if absent. */
bool fzs_remove(fzs *s, int task);
/* Whether `task` waits, and in which lane (-1: it does not). */
int fzs_lane_of(const fzs *s, int task);
/* Tasks that could start now, one per free worker (ready lanes' entries,
 * background ones up to the room low_max leaves). */
int fzs_startable(const fzs *s);
int fzs_total(const fzs *s);
bool fzs_equal(const fzs *a, const fzs *b);
/* The lanes' contents, for reports: "lane -2: 3.0 4.1 | ...". */
void fzs_describe(const fzs *s, char *buf, unsigned len);

#endif /* FZ_SCHED_H */
