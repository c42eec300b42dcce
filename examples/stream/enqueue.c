/*
 * enqueue.c -- taskpool-enqueue: add entries to the stream (pipelined), wait
 * for their outcomes, or put dead entries back. See usage() for the options.
 *
 * Every entry is checked with the worker's own field parser (entry.h) before
 * anything is sent: a value the worker would dead-letter is refused here,
 * exit 2. The consumer group is created at `$` when it does not exist yet, so
 * entries added before the first worker starts are not skipped by it.
 *
 * --wait remembers the last ids of the results and dead streams before it
 * adds anything, then follows both with XREAD BLOCK until every entry it
 * added has an outcome (the first one counts when an entry ran twice).
 * --requeue-dead runs one script per batch of dead records (scripts.h), so a
 * record is requeued at most once even with two operators at it.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "entry.h"
#include "redis_conn.h"
#include "scripts.h"
#include "taskpool.h"

#define WAIT_MAX 1000000u /* entries --wait can follow */
#define ID_LEN   48       /* an entry id and its NUL */
#define NFIELDS  8        /* fields of one entry at most */

enum { EXIT_OK = 0, EXIT_REDIS = 1, EXIT_USAGE = 2, EXIT_DEAD = 3, EXIT_TIMEOUT = 4, EXIT_UNKNOWN = 5 };

static void usage(FILE *f) {
    fprintf(f,
            "Usage: taskpool-enqueue [--count N] [--users U] [--work D] [--fail always|N]\n"
            "                        [--fail-every K] [--payload-bytes B] [--not-before MS | --defer D]\n"
            "                        [--attempts N] [--priority PRIO] [--pipeline P]\n"
            "                        [--wait [--timeout D]]\n"
            "       taskpool-enqueue --requeue-dead [--since ID]\n"
            "       taskpool-enqueue --help | --version\n"
            "\n"
            "Adds N entries (1000) to STREAM, P at a time (256) before reading the replies.\n"
            "Entry i gets `user u<i %% U>` (U = 10; none when 0), `work D` (the demo\n"
            "handler's run time; --delay is an alias), `fail` on every K-th entry (K = 1;\n"
            "--fail-every needs --fail), a B-byte `payload`, `not_before MS` (Unix ms) or\n"
            "`defer D` (start no earlier than D after it was added), `attempts N`\n"
            "(1..101), `priority PRIO` (-2..2: 2 urgent, 0 normal, below 0 background;\n"
            "absent = 0). Values are checked with the worker's own parser. Prints one\n"
            "JSON line: count, entries/s, first and last id. Creates GROUP at $ when\n"
            "STREAM has no such group yet.\n"
            "\n"
            "  --wait           then wait for every entry's outcome; one JSON line per\n"
            "                   outcome (id, outcome done|dead|unknown, result, reason),\n"
            "                   then a summary; at most %u entries\n"
            "  --timeout D      give up waiting after D (default: wait as long as it takes)\n"
            "  --requeue-dead   add every dead record's entry back to STREAM with its\n"
            "                   original fields and `requeued_from <old id>`, and delete\n"
            "                   the dead record, atomically per record; only the records\n"
            "                   there when it starts, and not those the worker would\n"
            "                   refuse again (listed as skipped); takes no add option\n"
            "  --since ID       requeue only dead records from this id of DEAD_STREAM on\n"
            "\n"
            "Environment (unset or empty = default):\n"
            "  REDIS_URL       redis://[user[:password]@]host[:port] or\n"
            "                  unix://[user[:password]@]/path (redis://127.0.0.1:6379)\n"
            "  REDIS_PASSWORD  the password, kept out of the process listing (unset)\n"
            "  STREAM          the stream to add to (tasks)\n"
            "  GROUP           the consumer group created when missing (taskpool)\n"
            "  RESULTS_STREAM  where --wait looks for successes (tasks:done)\n"
            "  DEAD_STREAM     where --wait and --requeue-dead look for dead records (tasks:dead)\n"
            "\n"
            "Exit status: 0 done (with --wait: every entry succeeded), 1 Redis error (an\n"
            "add that failed part way prints what it added), 2 bad arguments, 3 --wait:\n"
            "some entry is dead, 4 --wait: timed out, 5 --wait: some outcome records were\n"
            "trimmed or deleted before they were read (outcome \"unknown\").\n",
            WAIT_MAX);
}

static const char *env_or(const char *name, const char *def) {
    const char *v = svc_env(name);
    return v != NULL ? v : def;
}

static redisContext *connect_env(void) {
    tps_redis_addr a;
    char err[400];
    if (tps_redis_parse(svc_env("REDIS_URL"), svc_env("REDIS_PASSWORD"), &a, err, sizeof err) != 0) {
        fprintf(stderr, "taskpool-enqueue: %s\n", err);
        exit(EXIT_USAGE);
    }
    redisContext *c = tps_redis_connect(&a, 2000, 30000, err, sizeof err);
    if (c == NULL) {
        fprintf(stderr, "taskpool-enqueue: cannot connect to %s: %s\n", a.shown, err);
        exit(EXIT_REDIS);
    }
    return c;
}

static redisReply *command(redisContext *c, int argc, const char **argv, const size_t *argvlen) {
    redisReply *r = redisCommandArgv(c, argc, argv, argvlen);
    if (r == NULL) {
        fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
        exit(EXIT_REDIS);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "taskpool-enqueue: %s: %s\n", argv[0], r->str);
        exit(EXIT_REDIS);
    }
    return r;
}

/* A JSON string of n bytes (control characters, quotes and backslashes escaped). */
static void json_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* ------------------------------------------------------------------ --wait: the ids we added */

typedef struct idset {
    char (*id)[ID_LEN];
    unsigned char *done;
    uint32_t *tab, mask, n;
} idset;

static uint32_t hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The index of id, or UINT32_MAX; with `add`, adds it when absent. */
static uint32_t idset_find(idset *s, const char *id, size_t len, int add) {
    if (len >= ID_LEN) return UINT32_MAX;
    for (uint32_t i = hash(id, len) & s->mask;; i = (i + 1) & s->mask) {
        uint32_t v = s->tab[i];
        if (v == 0) {
            if (!add) return UINT32_MAX;
            memcpy(s->id[s->n], id, len);
            s->id[s->n][len] = '\0';
            s->tab[i] = ++s->n;
            return s->n - 1;
        }
        if (strncmp(s->id[v - 1], id, len) == 0 && s->id[v - 1][len] == '\0') return v - 1;
    }
}

/* The last id of a stream, "0-0" when empty or absent. */
static void last_id(redisContext *c, const char *key, char *out, size_t cap) {
    const char *av[] = {"XREVRANGE", key, "+", "-", "COUNT", "1"};
    size_t al[] = {9, strlen(key), 1, 1, 5, 1};
    redisReply *r = command(c, 6, av, al);
    snprintf(out, cap, "0-0");
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 && r->element[0]->type == REDIS_REPLY_ARRAY &&
        r->element[0]->elements >= 1 && r->element[0]->element[0]->type == REDIS_REPLY_STRING)
        snprintf(out, cap, "%s", r->element[0]->element[0]->str);
    freeReplyObject(r);
}

static const redisReply *field(const redisReply *f, const char *name) {
    for (size_t k = 0; f != NULL && f->type == REDIS_REPLY_ARRAY && k + 1 < f->elements; k += 2)
        if (f->element[k]->type == REDIS_REPLY_STRING && strcmp(f->element[k]->str, name) == 0 &&
            f->element[k + 1]->type == REDIS_REPLY_STRING)
            return f->element[k + 1];
    return NULL;
}

/* What XINFO STREAM says of a stream (Redis >= 7 for entries-added and
 * max-deleted-entry-id; -1 and "" when not said). exists 0: no such key. */
typedef struct stream_state {
    int exists;
    long long length, added;
    char last_generated[ID_LEN], first[ID_LEN], max_deleted[ID_LEN];
} stream_state;

static void stream_parse(const redisReply *r, stream_state *st) {
    memset(st, 0, sizeof *st);
    st->length = st->added = -1;
    st->exists = r->type == REDIS_REPLY_ARRAY;
    for (size_t k = 0; st->exists && k + 1 < r->elements; k += 2) {
        const redisReply *n = r->element[k], *v = r->element[k + 1];
        if (n->type != REDIS_REPLY_STRING) continue;
        if (strcmp(n->str, "length") == 0 && v->type == REDIS_REPLY_INTEGER)
            st->length = v->integer;
        else if (strcmp(n->str, "entries-added") == 0 && v->type == REDIS_REPLY_INTEGER)
            st->added = v->integer;
        else if (strcmp(n->str, "last-generated-id") == 0 && v->type == REDIS_REPLY_STRING)
            snprintf(st->last_generated, ID_LEN, "%s", v->str);
        else if (strcmp(n->str, "max-deleted-entry-id") == 0 && v->type == REDIS_REPLY_STRING)
            snprintf(st->max_deleted, ID_LEN, "%s", v->str);
        else if (strcmp(n->str, "first-entry") == 0 && v->type == REDIS_REPLY_ARRAY && v->elements >= 1 &&
                 v->element[0]->type == REDIS_REPLY_STRING)
            snprintf(st->first, ID_LEN, "%s", v->element[0]->str);
    }
}

#define UNREAD_COUNT_MAX 1000 /* counted exactly up to this many; more: -1 */

/* What XINFO STREAM says of `key` and, in the same moment (one script:
 * scripts.h), how many records it holds after id `after` (*unread; -1 when
 * more than UNREAD_COUNT_MAX, or without `after`). Only an absent key is
 * "no stream"; any error reply (a permission, a key of another type) exits
 * as a Redis error: taken for "no stream", it would hide trimmed outcome
 * records from --wait for good. */
static void stream_get_unread(redisContext *c, const char *key, const char *after, stream_state *st,
                              long long *unread) {
    char from[ID_LEN + 1] = "", count[16];
    if (after != NULL) snprintf(from, sizeof from, "(%s", after);
    snprintf(count, sizeof count, "%d", UNREAD_COUNT_MAX + 1);
    const char *av[] = {"EVAL", tps_script_stream_state, "1", key, from, count};
    size_t al[] = {4, strlen(tps_script_stream_state), 1, strlen(key), strlen(from), strlen(count)};
    redisReply *r = redisCommandArgv(c, 6, av, al);
    if (r == NULL) {
        fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
        exit(EXIT_REDIS);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "taskpool-enqueue: the state of stream %s: %s\n", key, r->str);
        exit(EXIT_REDIS);
    }
    *unread = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_ARRAY &&
        r->element[1]->type == REDIS_REPLY_INTEGER) {
        stream_parse(r->element[0], st);
        if (r->element[1]->integer >= 0 && r->element[1]->integer <= UNREAD_COUNT_MAX)
            *unread = r->element[1]->integer;
    } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
        stream_parse(r, st); /* exists 0 */
    } else {
        fprintf(stderr, "taskpool-enqueue: the state of stream %s: unexpected reply\n", key);
        exit(EXIT_REDIS);
    }
    freeReplyObject(r);
}

static void stream_get(redisContext *c, const char *key, stream_state *st) {
    long long unread;
    stream_get_unread(c, key, NULL, st, &unread);
}

/* One outcome stream that --wait reads. */
typedef struct follow {
    const char *key;
    char last[ID_LEN];     /* the last record read: XREAD goes on after it */
    long long added0;      /* entries-added when reading began; -1 unknown */
    long long n_read;      /* records read since */
    long long lost_seen;   /* unread records known lost, at the last reconcile() */
    char del_seen[ID_LEN]; /* max-deleted-entry-id at the last reconcile() */
} follow;

/* Reading starts after the last id the stream ever generated (an emptied
 * stream's too), or at 0-0 when there is no such stream yet. */
static void follow_start(redisContext *c, follow *f, const char *key) {
    stream_state st;
    stream_get(c, key, &st);
    memset(f, 0, sizeof *f);
    f->key = key;
    snprintf(f->last, ID_LEN, "%s", st.exists && st.last_generated[0] ? st.last_generated : "0-0");
    f->added0 = st.exists ? st.added : 0;
}

/* "<ms>-<seq>" (or "<ms>") into two numbers; 0 when it does not parse. */
static int parse_id(const char *s, uint64_t *ms, uint64_t *seq) {
    char *end;
    *ms = strtoull(s, &end, 10);
    *seq = 0;
    if (end == s) return 0;
    if (*end == '-') *seq = strtoull(end + 1, &end, 10);
    return *end == '\0';
}

static int id_after(const char *a, const char *b) { /* a > b */
    uint64_t am, as, bm, bs;
    if (!parse_id(a, &am, &as) || !parse_id(b, &bm, &bs)) return 0;
    return am > bm || (am == bm && as > bs);
}

/* Were records added after reading began removed before they were read,
 * since the last time this said so? Every record added since (entries-added
 * counts them) was read, or is still there after the last one read, or was
 * removed unread (a trim, MAXLEN, or XDEL); the stream's state and the count
 * after the last record read are taken in one moment (one script), so this holds
 * exactly, however far reading has got since the removal (it used to look
 * only while the stream's first record was past the last one read, and a
 * reader that caught up in one read after a trim never saw it). XDEL shows
 * in max-deleted-entry-id too. Both need Redis >= 7; an older server cannot
 * tell (0). */
static int overtaken(redisContext *c, follow *f) {
    stream_state st;
    long long unread;
    stream_get_unread(c, f->key, f->last, &st, &unread);
    if (!st.exists) return 0;
    long long lost = 0;
    if (st.added >= 0 && f->added0 >= 0 && unread >= 0) lost = st.added - f->added0 - f->n_read - unread;
    int deleted = st.max_deleted[0] != '\0' && id_after(st.max_deleted, f->last) &&
                  strcmp(st.max_deleted, f->del_seen) != 0;
    if (lost <= f->lost_seen && !deleted) return 0;
    if (lost > f->lost_seen) f->lost_seen = lost;
    snprintf(f->del_seen, ID_LEN, "%s", st.max_deleted);
    return 1;
}

/* What --wait follows. done[k]: 0 no outcome yet, 1 seen, 2 candidate of
 * reconcile() (acknowledged, its record not seen yet). `one`: the results
 * and dead streams are the same stream (read as res). */
typedef struct waiter {
    redisContext *c;
    idset *ids;
    const char *stream, *group;
    follow res, dead;
    int one;
    uint32_t left, n_ok, n_dead, n_unknown;
    uint64_t t0;               /* when waiting began */
    char delivered[ID_LEN];    /* the group's last delivered id, for reconcile() */
    uint32_t *ambiguous_since; /* per id, s after t0 (reconcile(); allocated when first needed) */
    uint32_t n_ambiguous;      /* ids reconcile() is giving their grace */
} waiter;

static void print_outcome(const char *id, size_t id_len, const char *outcome, const redisReply *res,
                          const char *reason, size_t reason_len) {
    printf("{\"msg\":\"outcome\",\"id\":");
    json_str(id, id_len);
    printf(",\"outcome\":\"%s\"", outcome);
    if (res != NULL) {
        printf(",\"result\":");
        json_str(res->str, res->len);
    }
    if (reason != NULL) {
        printf(",\"reason\":");
        json_str(reason, reason_len);
    }
    printf("}\n");
}

/* One XREAD of the outcome streams (block_ms 0: do not block); the number
 * of records it returned. */
static size_t read_outcomes(waiter *w, uint64_t block_ms) {
    char bms[24];
    snprintf(bms, sizeof bms, "%llu", (unsigned long long)block_ms);
    const char *av[10] = {"XREAD", "COUNT", "1000"};
    int ac = 3;
    if (block_ms > 0) av[ac++] = "BLOCK", av[ac++] = bms;
    av[ac++] = "STREAMS";
    av[ac++] = w->res.key;
    if (!w->one) av[ac++] = w->dead.key;
    av[ac++] = w->res.last;
    if (!w->one) av[ac++] = w->dead.last;
    size_t al[10];
    for (int k = 0; k < ac; k++) al[k] = strlen(av[k]);
    redisReply *r = command(w->c, ac, av, al);
    size_t n = 0;
    for (size_t s = 0; r->type == REDIS_REPLY_ARRAY && s < r->elements; s++) {
        const redisReply *st = r->element[s];
        if (st->type != REDIS_REPLY_ARRAY || st->elements < 2 || st->element[0]->type != REDIS_REPLY_STRING)
            continue;
        int is_dead = !w->one && strcmp(st->element[0]->str, w->dead.key) == 0;
        follow *f = is_dead ? &w->dead : &w->res;
        const redisReply *ents = st->element[1];
        for (size_t e = 0; ents->type == REDIS_REPLY_ARRAY && e < ents->elements; e++) {
            const redisReply *ent = ents->element[e];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 2) continue;
            n++;
            f->n_read++;
            snprintf(f->last, ID_LEN, "%s", ent->element[0]->str);
            const redisReply *id = field(ent->element[1], "id"), *reason = field(ent->element[1], "reason");
            if (id == NULL) continue;
            uint32_t k = idset_find(w->ids, id->str, id->len, 0);
            if (k == UINT32_MAX || w->ids->done[k] == 1) continue; /* 0, or reconcile()'s 2 and 3 */
            w->ids->done[k] = 1;
            w->left--;
            int this_dead = is_dead || reason != NULL;
            this_dead ? w->n_dead++ : w->n_ok++;
            print_outcome(id->str, id->len, this_dead ? "dead" : "done", field(ent->element[1], "result"),
                          reason != NULL ? reason->str : NULL, reason != NULL ? reason->len : 0);
        }
    }
    freeReplyObject(r);
    fflush(stdout); /* a reader on a pipe sees each batch as it comes */
    return n;
}

/* Pipeline one command per id of `pick` (argv built by `build`), then
 * hand each reply to `take`; in batches of 1000. Exits on a lost connection
 * or an error reply. */
static void per_id(waiter *w, int (*pick)(waiter *, uint32_t),
                   void (*build)(waiter *, uint32_t, const char **), int argc,
                   void (*take)(waiter *, uint32_t, const redisReply *)) {
    idset *ids = w->ids;
    const char *name = ""; /* the command's, for an error */
    for (uint32_t k = 0; k < ids->n;) {
        uint32_t asked[1000], n = 0;
        for (; k < ids->n && n < 1000; k++) {
            if (!pick(w, k)) continue;
            const char *av[8];
            size_t al[8];
            build(w, k, av);
            name = av[0];
            for (int a = 0; a < argc; a++) al[a] = strlen(av[a]);
            if (redisAppendCommandArgv(w->c, argc, av, al) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", w->c->errstr[0] ? w->c->errstr : "out of memory");
                exit(EXIT_REDIS);
            }
            asked[n++] = k;
        }
        for (uint32_t a = 0; a < n; a++) {
            redisReply *r = NULL;
            if (redisGetReply(w->c, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", w->c->errstr);
                exit(EXIT_REDIS);
            }
            if (r->type == REDIS_REPLY_ERROR) { /* not "no outcome": a refusal */
                fprintf(stderr, "taskpool-enqueue: %s: %s\n", name, r->str);
                exit(EXIT_REDIS);
            }
            take(w, asked[a], r);
            freeReplyObject(r);
        }
    }
}

/* reconcile()'s states of ids->done (0 no outcome yet, 1 seen): */
enum { W_CANDIDATE = 2, W_AMBIGUOUS = 3 };
#define AMBIGUOUS_GRACE_S 10u

static int pick_undelivered(waiter *w, uint32_t k) {
    unsigned char d = w->ids->done[k];
    return (d == 0 || d == W_AMBIGUOUS) && !id_after(w->ids->id[k], w->delivered);
}
static void build_xpending(waiter *w, uint32_t k, const char **av) {
    const char *a[] = {"XPENDING", w->stream, w->group, w->ids->id[k], w->ids->id[k], "1"};
    memcpy(av, a, sizeof a);
}
static void take_xpending(waiter *w, uint32_t k, const redisReply *r) {
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 0 && w->ids->done[k] == 0)
        w->ids->done[k] = W_CANDIDATE;
}
static int pick_candidate(waiter *w, uint32_t k) { return w->ids->done[k] == W_CANDIDATE; }
static void build_xrange(waiter *w, uint32_t k, const char **av) {
    const char *a[] = {"XRANGE", w->stream, w->ids->id[k], w->ids->id[k]};
    memcpy(av, a, sizeof a);
}
static void take_xrange(waiter *w, uint32_t k, const redisReply *r) {
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 0) { /* gone from the stream too: ambiguous */
        w->ids->done[k] = W_AMBIGUOUS;
        w->ambiguous_since[k] = (uint32_t)((tp_now_ns() - w->t0) / 1000000000u);
    }
}

/* Outcome records were removed before they were read. An entry that is
 * delivered and no longer pending in the group was acknowledged, and the
 * worker writes an entry's record before acknowledging it, so if no read
 * finds the record now, it was among the removed ones: the entry ends as
 * "unknown". Unless the entry is gone from the stream too: then Redis may
 * have dropped it from the pending list unacknowledged (deleted while it
 * ran or waited; its record comes when it ends), or TRIM_DONE removed it
 * after its acknowledgement; such an entry is "unknown" only when no record
 * came within AMBIGUOUS_GRACE_S (wait_outcomes looks again meanwhile). */
static void reconcile(waiter *w) {
    w->delivered[0] = '\0';
    const char *gav[] = {"XINFO", "GROUPS", w->stream};
    size_t gal[] = {5, 6, strlen(w->stream)};
    redisReply *g = redisCommandArgv(w->c, 3, gav, gal);
    if (g == NULL) {
        fprintf(stderr, "taskpool-enqueue: %s\n", w->c->errstr);
        exit(EXIT_REDIS);
    }
    if (g->type == REDIS_REPLY_ERROR &&
        strcmp(g->str, "ERR no such key") != 0) { /* no stream: nothing to tell */
        fprintf(stderr, "taskpool-enqueue: XINFO GROUPS %s: %s\n", w->stream, g->str);
        exit(EXIT_REDIS);
    }
    for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k < g->elements; k++) {
        const redisReply *name = field(g->element[k], "name"),
                         *last = field(g->element[k], "last-delivered-id");
        if (name != NULL && last != NULL && strcmp(name->str, w->group) == 0)
            snprintf(w->delivered, sizeof w->delivered, "%s", last->str);
    }
    freeReplyObject(g);
    if (w->delivered[0] == '\0') return;
    idset *ids = w->ids;
    if (w->ambiguous_since == NULL &&
        (w->ambiguous_since = calloc(ids->n, sizeof *w->ambiguous_since)) == NULL) {
        fprintf(stderr, "taskpool-enqueue: out of memory\n");
        exit(EXIT_REDIS);
    }
    per_id(w, pick_undelivered, build_xpending, 6, take_xpending);
    per_id(w, pick_candidate, build_xrange, 4, take_xrange);
    /* Records written before those acknowledgements are readable now, unless removed. */
    while (read_outcomes(w, 0) > 0) {
    }
    static const char why[] = "its outcome record was trimmed or deleted before --wait read it";
    uint32_t now_s = (uint32_t)((tp_now_ns() - w->t0) / 1000000000u);
    w->n_ambiguous = 0;
    for (uint32_t k = 0; k < ids->n; k++) {
        unsigned char d = ids->done[k];
        if (d == W_AMBIGUOUS && now_s - w->ambiguous_since[k] < AMBIGUOUS_GRACE_S) {
            w->n_ambiguous++;
            continue;
        }
        if (d != W_CANDIDATE && d != W_AMBIGUOUS) continue;
        ids->done[k] = 1;
        w->left--;
        w->n_unknown++;
        print_outcome(ids->id[k], strlen(ids->id[k]), "unknown", NULL, why, sizeof why - 1);
    }
    fflush(stdout);
}

static int wait_outcomes(waiter *w, uint64_t timeout_ns) {
    uint64_t t0 = tp_now_ns(), next_check = 0, next_ambiguous = 0;
    uint64_t deadline = timeout_ns != 0 && timeout_ns < UINT64_MAX - t0 ? t0 + timeout_ns : UINT64_MAX;
    w->t0 = t0;
    w->left = w->ids->n;
    while (w->left > 0) {
        uint64_t now = tp_now_ns();
        if (now >= deadline) break;
        uint64_t block = (deadline - now) / 1000000u;
        if (block > 1000) block = 1000;
        if (block == 0) block = 1;
        (void)read_outcomes(w, block);
        now = tp_now_ns();
        if (w->left > 0 && now >= next_check) { /* twice a second at most */
            next_check = now + 500000000u;
            int lost = overtaken(w->c, &w->res);
            if (!w->one && overtaken(w->c, &w->dead)) lost = 1;
            if (lost || (w->n_ambiguous > 0 && now >= next_ambiguous)) {
                reconcile(w);
                next_ambiguous = now + 2000000000u; /* entries in their grace: looked at every 2 s */
            }
        }
    }
    printf(
        "{\"msg\":\"waited\",\"succeeded\":%u,\"dead\":%u,\"unknown\":%u,\"missing\":%u,\"seconds\":%.3f}\n",
        w->n_ok, w->n_dead, w->n_unknown, w->left, (double)(tp_now_ns() - t0) / 1e9);
    fflush(stdout);
    return w->left > 0 ? EXIT_TIMEOUT : w->n_dead > 0 ? EXIT_DEAD : w->n_unknown > 0 ? EXIT_UNKNOWN : EXIT_OK;
}

/* ------------------------------------------------------------------ --requeue-dead */

/* NULL when the fields of dead record `rec` (its `entry.<name>` copies) make
 * an entry the worker accepts, else the reason (static or in buf). */
static const char *requeue_check(const redisReply *rec) {
    if (rec->type != REDIS_REPLY_ARRAY || rec->elements < 2 || rec->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL; /* the script says what it is */
    const redisReply *f = rec->element[1];
    tps_entry e;
    tps_entry_init(&e);
    for (size_t k = 0; k + 1 < f->elements; k += 2) {
        const redisReply *name = f->element[k], *val = f->element[k + 1];
        if (name->type != REDIS_REPLY_STRING || val->type != REDIS_REPLY_STRING || name->len <= 6 ||
            memcmp(name->str, "entry.", 6) != 0)
            continue;
        const char *why = tps_entry_field(&e, name->str + 6, name->len - 6, val->str, val->len);
        if (why != NULL) return why;
    }
    return tps_entry_finish(&e);
}

/* Requeue the dead records that exist when it starts (up to the dead
 * stream's last id then: a requeued entry that dies again while this runs
 * is not requeued again by the same run). */
static int requeue_dead(redisContext *c, const char *stream, const char *dead, const char *since) {
    char start[ID_LEN + 1], end[ID_LEN];
    snprintf(start, sizeof start, "%s", since != NULL ? since : "-");
    last_id(c, dead, end, sizeof end);
    unsigned requeued = 0, skipped = 0;
    while (strcmp(end, "0-0") != 0) {
        const char *av[] = {"XRANGE", dead, start, end, "COUNT", "256"};
        size_t al[6];
        for (int k = 0; k < 6; k++) al[k] = strlen(av[k]);
        redisReply *r = command(c, 6, av, al);
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
            freeReplyObject(r);
            break;
        }
        const char *eav[3 + 2 + 256];
        size_t eal[3 + 2 + 256];
        int n = 0;
        eav[n++] = "EVAL";
        eav[n++] = tps_script_requeue;
        eav[n++] = "2";
        eav[n++] = stream;
        eav[n++] = dead;
        for (size_t e = 0; e < r->elements; e++) {
            const redisReply *rec = r->element[e];
            if (rec->type != REDIS_REPLY_ARRAY || rec->elements < 1 ||
                rec->element[0]->type != REDIS_REPLY_STRING)
                continue;
            /* the next page starts after the last record seen ("(" = exclusive) */
            snprintf(start, sizeof start, "(%s", rec->element[0]->str);
            const char *why = requeue_check(rec);
            if (why == NULL) {
                eav[n++] = rec->element[0]->str;
                continue;
            }
            skipped++; /* it would die again at once */
            printf("{\"msg\":\"skipped\",\"dead_record\":\"%s\",\"status\":\"malformed\",\"reason\":",
                   rec->element[0]->str);
            json_str(why, strlen(why));
            printf("}\n");
        }
        if (n > 5) {
            for (int k = 0; k < n; k++) eal[k] = strlen(eav[k]);
            redisReply *q = command(c, n, eav, eal);
            for (size_t k = 0; q->type == REDIS_REPLY_ARRAY && k < q->elements; k++) {
                const redisReply *row = q->element[k];
                if (row->type != REDIS_REPLY_ARRAY || row->elements != 3) continue;
                int ok = strcmp(row->element[1]->str, "requeued") == 0;
                ok ? requeued++ : skipped++;
                printf("{\"msg\":\"%s\",\"dead_record\":\"%s\",\"status\":\"%s\"",
                       ok ? "requeued" : "skipped", row->element[0]->str, row->element[1]->str);
                if (ok) printf(",\"new_id\":\"%s\"", row->element[2]->str);
                printf("}\n");
            }
            freeReplyObject(q);
        }
        freeReplyObject(r);
        fflush(stdout);
    }
    printf("{\"msg\":\"requeue_done\",\"stream\":");
    json_str(stream, strlen(stream));
    printf(",\"dead_stream\":");
    json_str(dead, strlen(dead));
    printf(",\"requeued\":%u,\"skipped\":%u}\n", requeued, skipped);
    fflush(stdout);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ adding */

typedef struct fields {
    unsigned users, fail_every, payload_bytes;
    const char *work, *fail, *payload, *not_before, *defer, *attempts, *priority;
    char user[32];
} fields;

/* The name/value pairs of entry i; returns their count (names and values). */
static int build_fields(fields *f, unsigned i, const char **v, size_t *l) {
    int n = 0;
#define F(name, val, len) (v[n] = (name), l[n] = strlen(name), v[n + 1] = (val), l[n + 1] = (len), n += 2)
    if (f->users > 0) F("user", f->user, (size_t)snprintf(f->user, sizeof f->user, "u%u", i % f->users));
    F("work", f->work, strlen(f->work));
    if (f->fail != NULL && i % f->fail_every == 0) F("fail", f->fail, strlen(f->fail));
    if (f->payload != NULL) F("payload", f->payload, f->payload_bytes);
    if (f->not_before != NULL) F("not_before", f->not_before, strlen(f->not_before));
    if (f->defer != NULL) F("defer", f->defer, strlen(f->defer));
    if (f->attempts != NULL) F("attempts", f->attempts, strlen(f->attempts));
    if (f->priority != NULL) F("priority", f->priority, strlen(f->priority));
#undef F
    return n;
}

/* NULL when the worker accepts entry i, else its reason. */
static const char *check_fields(fields *f, unsigned i) {
    const char *v[2 * NFIELDS];
    size_t l[2 * NFIELDS];
    int n = build_fields(f, i, v, l);
    tps_entry e;
    tps_entry_init(&e);
    for (int k = 0; k < n; k += 2) {
        const char *why = tps_entry_field(&e, v[k], l[k], v[k + 1], l[k + 1]);
        if (why != NULL) return why;
    }
    return tps_entry_finish(&e);
}

/* A run of decimal digits of length n that fits in 64 bits. */
static int u64_digits(const char *s, size_t n) {
    static const char max[] = "18446744073709551615";
    return n > 0 && (n < sizeof max - 1 || (n == sizeof max - 1 && strncmp(s, max, n) <= 0));
}

static int valid_id(const char *s) { /* <ms>[-<seq>] for --since, each part 64 bits */
    size_t n = strspn(s, "0123456789");
    if (!u64_digits(s, n)) return 0;
    if (s[n] == '\0') return 1;
    size_t m = strspn(s + n + 1, "0123456789");
    return s[n] == '-' && u64_digits(s + n + 1, m) && s[n + 1 + m] == '\0';
}

/* Create the consumer group at `$` when the stream has none of that name
 * yet (MKSTREAM), so that entries added before the first worker starts are
 * not skipped by it. 1 created, 0 it existed, -1 error (printed). */
static int ensure_group(redisContext *c, const char *stream, const char *group) {
    const char *gav[] = {"XGROUP", "CREATE", stream, group, "$", "MKSTREAM"};
    size_t gal[6];
    for (int k = 0; k < 6; k++) gal[k] = strlen(gav[k]);
    redisReply *g = redisCommandArgv(c, 6, gav, gal);
    if (g == NULL || (g->type == REDIS_REPLY_ERROR && strncmp(g->str, "BUSYGROUP", 9) != 0)) {
        fprintf(stderr, "taskpool-enqueue: XGROUP CREATE: %s\n", g != NULL ? g->str : c->errstr);
        if (g != NULL) freeReplyObject(g);
        return -1;
    }
    int created = g->type != REDIS_REPLY_ERROR;
    freeReplyObject(g);
    return created;
}

int main(int argc, char **argv) {
    unsigned count = 1000, users = 10, fail_every = 1, payload_bytes = 0, pipeline = 256;
    const char *work = "0", *fail = NULL, *not_before = NULL, *defer = NULL, *attempts = NULL, *since = NULL,
               *priority = NULL;
    int wait = 0, requeue = 0, fail_every_given = 0;
    const char *add_opt = NULL; /* an option of adding or waiting, for --requeue-dead's check */
    uint64_t timeout_ns = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned *num = NULL, min = 1, max = 100000000;
        const char **str = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return EXIT_OK;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            printf("taskpool-enqueue (libtaskpool %s)\n", tp_version());
            return EXIT_OK;
        } else if (strcmp(a, "--wait") == 0) {
            wait = 1;
            add_opt = a;
            continue;
        } else if (strcmp(a, "--requeue-dead") == 0) {
            requeue = 1;
            continue;
        } else if (strcmp(a, "--count") == 0) {
            num = &count, min = 0;
        } else if (strcmp(a, "--users") == 0) {
            num = &users, min = 0;
        } else if (strcmp(a, "--fail-every") == 0) {
            num = &fail_every;
        } else if (strcmp(a, "--payload-bytes") == 0) {
            num = &payload_bytes, min = 0, max = 1 << 20; /* the entry parser says how much is allowed */
        } else if (strcmp(a, "--pipeline") == 0) {
            num = &pipeline, max = 100000;
        } else if (strcmp(a, "--work") == 0 || strcmp(a, "--delay") == 0) {
            str = &work;
        } else if (strcmp(a, "--fail") == 0) {
            str = &fail;
        } else if (strcmp(a, "--not-before") == 0) {
            str = &not_before;
        } else if (strcmp(a, "--defer") == 0) {
            str = &defer;
        } else if (strcmp(a, "--attempts") == 0) {
            str = &attempts;
        } else if (strcmp(a, "--priority") == 0) {
            str = &priority;
        } else if (strcmp(a, "--since") == 0) {
            str = &since;
        } else if (strcmp(a, "--timeout") == 0) {
            add_opt = a;
            if (v == NULL || svc_parse_duration(v, &timeout_ns) != 0 || timeout_ns == 0) {
                fprintf(stderr, "taskpool-enqueue: --timeout needs a duration like 30s\n");
                return EXIT_USAGE;
            }
            i++;
            continue;
        } else {
            fprintf(stderr, "taskpool-enqueue: unknown option or argument '%s' (try --help)\n", a);
            return EXIT_USAGE;
        }
        if (v == NULL || strncmp(v, "--", 2) == 0) { /* no value is an option's name */
            fprintf(stderr, "taskpool-enqueue: %s needs a value (try --help)\n", a);
            return EXIT_USAGE;
        }
        if (str != &since) add_opt = a;
        if (num == &fail_every) fail_every_given = 1;
        if (num != NULL && svc_parse_uint(v, min, max, num) != 0) {
            fprintf(stderr, "taskpool-enqueue: %s \"%s\": expected a whole number from %u to %u\n", a, v, min,
                    max);
            return EXIT_USAGE;
        }
        if (str != NULL) *str = v;
        i++;
    }
    const char *stream = env_or("STREAM", "tasks"), *group = env_or("GROUP", "taskpool");
    const char *results = env_or("RESULTS_STREAM", "tasks:done"), *dead = env_or("DEAD_STREAM", "tasks:dead");
    if (strcmp(stream, results) == 0 || strcmp(stream, dead) == 0) {
        fprintf(stderr, "taskpool-enqueue: RESULTS_STREAM and DEAD_STREAM must differ from STREAM\n");
        return EXIT_USAGE;
    }
    if (requeue) {
        if (add_opt != NULL) {
            fprintf(stderr, "taskpool-enqueue: %s does not go with --requeue-dead\n", add_opt);
            return EXIT_USAGE;
        }
        if (since != NULL && !valid_id(since)) {
            fprintf(stderr, "taskpool-enqueue: --since \"%s\": expected a stream id like 1700000000000-0\n",
                    since);
            return EXIT_USAGE;
        }
        redisContext *c = connect_env();
        int rc = ensure_group(c, stream, group) < 0 ? EXIT_REDIS : requeue_dead(c, stream, dead, since);
        redisFree(c);
        return rc;
    }
    if (fail_every_given && fail == NULL) {
        fprintf(stderr, "taskpool-enqueue: --fail-every goes with --fail\n");
        return EXIT_USAGE;
    }
    if (since != NULL || (timeout_ns != 0 && !wait)) {
        fprintf(stderr, "taskpool-enqueue: %s goes with %s\n", since != NULL ? "--since" : "--timeout",
                since != NULL ? "--requeue-dead" : "--wait");
        return EXIT_USAGE;
    }
    if (wait && count > WAIT_MAX) {
        fprintf(stderr, "taskpool-enqueue: --wait follows at most %u entries\n", WAIT_MAX);
        return EXIT_USAGE;
    }
    char *payload = NULL;
    redisContext *c = NULL;
    int rc = EXIT_OK;
    idset ids = {0};
    if (payload_bytes > 0) {
        payload = malloc(payload_bytes);
        if (payload == NULL) {
            rc = EXIT_REDIS;
            goto out;
        }
        memset(payload, 'x', payload_bytes);
    }
    if (wait) {
        uint32_t t = 16;
        while (t < 2 * count) t <<= 1;
        ids.mask = t - 1;
        ids.tab = calloc(t, sizeof *ids.tab);
        ids.id = calloc(count > 0 ? count : 1, sizeof *ids.id);
        ids.done = calloc(count > 0 ? count : 1, 1);
        if (ids.tab == NULL || ids.id == NULL || ids.done == NULL) {
            fprintf(stderr, "taskpool-enqueue: out of memory for --wait\n");
            rc = EXIT_REDIS;
            goto out;
        }
    }
    fields f = {.users = users,
                .fail_every = fail_every,
                .work = work,
                .fail = fail,
                .payload = payload,
                .payload_bytes = payload_bytes,
                .not_before = not_before,
                .defer = defer,
                .attempts = attempts,
                .priority = priority};
    /* Entries differ only in the user's number and whether `fail` is there:
     * the first two show every shape the worker will see. */
    for (unsigned i = 0; i < 2; i++) {
        const char *why = check_fields(&f, i);
        if (why != NULL) {
            fprintf(stderr, "taskpool-enqueue: the worker would dead-letter these entries: %s\n", why);
            rc = EXIT_USAGE;
            goto out;
        }
    }
    c = connect_env();
    int group_created = ensure_group(c, stream, group);
    if (group_created < 0) {
        rc = EXIT_REDIS;
        goto out;
    }
    char first[ID_LEN] = "", last[ID_LEN] = "";
    waiter w = {.c = c, .ids = &ids, .stream = stream, .group = group, .one = strcmp(results, dead) == 0};
    if (wait) { /* where the outcome streams end before anything is added */
        follow_start(c, &w.res, results);
        follow_start(c, &w.dead, dead);
    }
    uint64_t t0 = tp_now_ns();
    unsigned added = 0;
    int failed = 0, lost = 0; /* an XADD refused; the connection lost (replies unknown) */
    for (unsigned sent = 0; sent < count && !failed;) {
        unsigned n = count - sent < pipeline ? count - sent : pipeline;
        for (unsigned k = 0; k < n; k++) {
            const char *av[3 + 2 * NFIELDS];
            size_t al[3 + 2 * NFIELDS];
            av[0] = "XADD", al[0] = 4;
            av[1] = stream, al[1] = strlen(stream);
            av[2] = "*", al[2] = 1;
            int nf = build_fields(&f, sent + k, av + 3, al + 3);
            if (redisAppendCommandArgv(c, 3 + nf, av, al) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
                rc = EXIT_REDIS;
                goto out; /* nothing of this batch was sent */
            }
        }
        /* Every reply of the batch is read, even after a refusal (e.g. OOM),
         * so that the report names exactly what was added. */
        for (unsigned k = 0; k < n && !lost; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "taskpool-enqueue: %s\n", c->errstr);
                failed = lost = 1;
                break;
            }
            if (r->type != REDIS_REPLY_STRING) {
                if (!failed)
                    fprintf(stderr, "taskpool-enqueue: XADD: %s\n",
                            r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
                failed = 1;
                freeReplyObject(r);
                continue;
            }
            added++;
            if (first[0] == '\0') snprintf(first, sizeof first, "%s", r->str);
            snprintf(last, sizeof last, "%s", r->str);
            if (wait) (void)idset_find(&ids, r->str, r->len, 1);
            freeReplyObject(r);
        }
        sent += n;
    }
    if (failed) { /* say what is in the stream now, for whoever retries */
        printf("{\"msg\":\"enqueue_failed\",\"stream\":");
        json_str(stream, strlen(stream));
        printf(",\"%s\":%u,\"first_id\":\"%s\",\"last_id\":\"%s\"}\n", lost ? "added_at_least" : "added",
               added, first, last);
        fflush(stdout);
        rc = EXIT_REDIS;
        goto out;
    }
    double secs = (double)(tp_now_ns() - t0) / 1e9;
    printf("{\"msg\":\"enqueued\",\"stream\":");
    json_str(stream, strlen(stream));
    printf(",\"count\":%u,\"seconds\":%.3f,\"entries_per_s\":%.0f,\"first_id\":\"%s\",\"last_id\":\"%s\","
           "\"group\":",
           count, secs, secs > 0 ? count / secs : 0.0, first, last);
    json_str(group, strlen(group));
    printf(",\"group_created\":%s}\n", group_created ? "true" : "false");
    fflush(stdout);
    if (wait) rc = wait_outcomes(&w, timeout_ns);
    free(w.ambiguous_since);
out:
    if (c != NULL) redisFree(c);
    free(payload);
    free(ids.tab);
    free(ids.id);
    free(ids.done);
    return rc;
}
