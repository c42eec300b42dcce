/*
 * fz_sched.c -- the fuzz model's reference scheduler (see fz_sched.h).
 *
 * Written for reading, not speed: every operation scans the small arrays.
 * A flow's credit is 0 whenever it is out of the round, so two states that
 * schedule alike compare equal field by field.
 */
#include "fz_sched.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#define BACKGROUND_LANES 2 /* lanes 0 and 1: priorities -2 and -1 */

void fzs_init(fzs *s, bool fair, unsigned starve_limit, unsigned low_max) {
    memset(s, 0, sizeof *s);
    s->fair = fair;
    s->starve_limit = starve_limit;
    s->low_max = low_max;
    for (int f = 0; f < FZS_FLOWS; f++) s->weight[f] = 1;
}

void fzs_set_weight(fzs *s, int flow, unsigned weight) { s->weight[flow] = weight; }

static bool low_ok(const fzs *s) { return s->low_max == 0 || s->low_running < s->low_max; }

static bool ready(const fzs *s, int lane) {
    return s->n[lane] > 0 && (lane >= BACKGROUND_LANES || low_ok(s));
}

static bool flow_waits(const fzs *s, int lane, int flow) {
    for (int i = 0; i < s->n[lane]; i++)
        if (s->q[lane][i].flow == flow) return true;
    return false;
}

static bool in_round(const fzs *s, int lane, int flow) {
    for (int i = 0; i < s->nround[lane]; i++)
        if (s->round[lane][i] == flow) return true;
    return false;
}

static void round_leave(fzs *s, int lane, int flow) {
    int k = 0;
    for (int i = 0; i < s->nround[lane]; i++)
        if (s->round[lane][i] != flow) s->round[lane][k++] = s->round[lane][i];
    s->nround[lane] = k;
    s->credit[lane][flow] = 0;
}

static void round_join(fzs *s, int lane, int flow) {
    s->round[lane][s->nround[lane]++] = (int8_t)flow;
    s->credit[lane][flow] = 0; /* its turn starts when it reaches the head */
}

/* Entry i of the lane leaves; returns it. An emptied lane is no longer
 * ready (its count returns to 0); a user without waiting tasks there
 * leaves the round. */
static fzs_ent take_at(fzs *s, int lane, int i) {
    fzs_ent e = s->q[lane][i];
    memmove(&s->q[lane][i], &s->q[lane][i + 1], (size_t)(s->n[lane] - i - 1) * sizeof e);
    s->n[lane]--;
    memset(&s->q[lane][s->n[lane]], 0, sizeof e);
    if (s->n[lane] == 0) s->starve[lane] = 0;
    if (s->fair && !flow_waits(s, lane, e.flow) && in_round(s, lane, e.flow)) round_leave(s, lane, e.flow);
    return e;
}

void fzs_push(fzs *s, int lane, fzs_ent e) {
    s->q[lane][s->n[lane]++] = e;
    if (s->fair && !in_round(s, lane, e.flow)) round_join(s, lane, e.flow);
}

int fzs_pick(const fzs *s) {
    int top = -1;
    for (int lane = FZS_LANES - 1; lane >= 0; lane--) {
        if (!ready(s, lane)) continue;
        if (s->starve_limit != UINT_MAX && s->starve[lane] >= s->starve_limit) return lane;
        if (top < 0) top = lane;
    }
    return top;
}

fzs_ent fzs_start(fzs *s, int lane) {
    /* every ready lane below counts a start that passed it by */
    for (int i = 0; i < lane; i++)
        if (ready(s, i)) s->starve[i]++;
    s->starve[lane] = 0;
    int at = 0;
    if (s->fair) {
        int f = s->round[lane][0];
        if (s->credit[lane][f] == 0) s->credit[lane][f] = s->weight[f]; /* its turn starts */
        while (s->q[lane][at].flow != f) at++;
        s->credit[lane][f]--;
        bool turn_over = s->credit[lane][f] == 0;
        fzs_ent e = take_at(s, lane, at); /* leaves the round if that was its last */
        if (turn_over && in_round(s, lane, f)) {
            round_leave(s, lane, f);
            round_join(s, lane, f); /* to the back, for its next turn */
        }
        if (lane < BACKGROUND_LANES) s->low_running++;
        if (!low_ok(s)) s->starve[0] = s->starve[1] = 0; /* the background lanes stop being ready */
        return e;
    }
    fzs_ent e = take_at(s, lane, at);
    if (lane < BACKGROUND_LANES) s->low_running++;
    if (!low_ok(s)) s->starve[0] = s->starve[1] = 0;
    return e;
}

void fzs_done(fzs *s, int lane) {
    if (lane < BACKGROUND_LANES) s->low_running--;
}

int fzs_lane_of(const fzs *s, int task) {
    for (int lane = 0; lane < FZS_LANES; lane++)
        for (int i = 0; i < s->n[lane]; i++)
            if (s->q[lane][i].task == task) return lane;
    return -1;
}

bool fzs_remove(fzs *s, int task) {
    for (int lane = 0; lane < FZS_LANES; lane++)
        for (int i = 0; i < s->n[lane]; i++)
            if (s->q[lane][i].task == task) {
                take_at(s, lane, i);
                return true;
            }
    return false;
}

int fzs_startable(const fzs *s) {
    int high = 0, low = 0;
    for (int lane = 0; lane < FZS_LANES; lane++) {
        if (lane < BACKGROUND_LANES)
            low += s->n[lane];
        else
            high += s->n[lane];
    }
    if (s->low_max) {
        int room = s->low_running < s->low_max ? (int)(s->low_max - s->low_running) : 0;
        if (low > room) low = room;
    }
    return high + low;
}

int fzs_total(const fzs *s) {
    int n = 0;
    for (int lane = 0; lane < FZS_LANES; lane++) n += s->n[lane];
    return n;
}

bool fzs_equal(const fzs *a, const fzs *b) {
    if (a->fair != b->fair || a->starve_limit != b->starve_limit || a->low_max != b->low_max ||
        a->low_running != b->low_running)
        return false;
    for (int f = 0; f < FZS_FLOWS; f++)
        if (a->weight[f] != b->weight[f]) return false;
    for (int lane = 0; lane < FZS_LANES; lane++) {
        if (a->n[lane] != b->n[lane] || a->nround[lane] != b->nround[lane] ||
            a->starve[lane] != b->starve[lane])
            return false;
        for (int i = 0; i < a->n[lane]; i++)
            if (a->q[lane][i].task != b->q[lane][i].task || a->q[lane][i].attempt != b->q[lane][i].attempt)
                return false;
        for (int i = 0; i < a->nround[lane]; i++)
            if (a->round[lane][i] != b->round[lane][i]) return false;
        for (int f = 0; f < FZS_FLOWS; f++)
            if (a->credit[lane][f] != b->credit[lane][f]) return false;
    }
    return true;
}

void fzs_describe(const fzs *s, char *buf, unsigned len) {
    unsigned k = 0;
    buf[0] = '\0';
    for (int lane = 0; lane < FZS_LANES && k < len; lane++) {
        k += (unsigned)snprintf(buf + k, len - k, "%slane %d [starve %u]:", lane ? " | " : "", lane - 2,
                                s->starve[lane]);
        for (int i = 0; i < s->n[lane] && k < len; i++)
            k += (unsigned)snprintf(buf + k, len - k, " %d.%d", s->q[lane][i].task, s->q[lane][i].attempt);
        if (s->fair && k < len) {
            k += (unsigned)snprintf(buf + k, len - k, " round");
            for (int i = 0; i < s->nround[lane] && k < len; i++) {
                int f = s->round[lane][i];
                k += (unsigned)snprintf(buf + k, len - k, " f%d/%u", f, s->credit[lane][f]);
            }
        }
    }
    if (k < len) snprintf(buf + k, len - k, " | low running %u", s->low_running);
}
