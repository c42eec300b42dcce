/*
 * cq.c -- completion queues (taskpool.h, section 15; the pool's side in
 * cq.h).
 *
 * Shape. `places` counts what is in use: tasks bound to the queue that are
 * unfinished, plus completions that wait or whose on_done runs now. It is
 * taken at admission (a compare-and-swap below `capacity`, no lock) and given
 * back after a drain ran the on_done. The ring holds `capacity` completions;
 * a place is what lets a completion into it, so it never overflows.
 *
 * The ring (a bounded queue in the manner of D. Vyukov's): `word` holds a
 * free-running ticket counter (word >> 1) and one flag, LOOK (bit 0); a push
 * takes ticket T with one atomic add, writes slot T % capacity and publishes
 * it through the slot's `seq` (release; see tp__slot). A drain, under the
 * queue's lock (drainers take turns), copies the slots from `head` on while
 * their seq says they are published (acquire), hands each slot back for
 * ticket T + capacity (seq, release) and moves head past them. A push waits
 * for its slot's seq to name its ticket before it writes: the places make
 * that wait empty (the completion that held the slot `capacity` tickets
 * earlier was copied out before its place came back), the seq makes it so
 * without an argument across two counters. The drain copies up to
 * TP__CQ_CHUNK completions at a time, runs them without the lock, giving
 * each one's place back as soon as its on_done returned, and goes on with
 * the next chunk, up to the tickets that were taken when it began (at most
 * `max`), even when another drainer took some of them meanwhile; the copy is
 * what makes several drainers safe. A drain nested in an on_done runs the
 * rest of the enclosing chunk first (drain_frame), for the end order.
 *
 * Wake-ups. A push takes the slow way when its ticket came with LOOK set, or
 * when its slot says SLOT_FREE_WAKE as it publishes (it publishes with a
 * compare-and-swap from SLOT_FREE): under the queue's lock it clears LOOK
 * (in both cases: it wakes whoever set it, who looks again and sets it
 * again if it must sleep on), publishes, and wakes the descriptor if it is quiet
 * (`woken` false) and tp_cq_wait callers if any wait. Every other push takes
 * no lock and touches nothing of the queue after its publishing swap -- so a
 * tp_cq_destroy that finds every place given back never frees a queue a push
 * still uses (a slow push publishes with the lock held that destroy takes).
 * Under the lock, these ask for the slow way:
 *   - a drain that has taken everything published: it sets LOOK (an atomic
 *     or, which also tells it which tickets were taken by then) and, if the
 *     push of the ticket at head is under way, marks that slot
 *     SLOT_FREE_WAKE; then it consumes the descriptor and clears woken: the
 *     next completion wakes it. (If that push has published meanwhile, the
 *     descriptor stays readable: its completion waits.)
 *   - tp_cq_wait, the same way, before it sleeps.
 * `woken` changes only together with the descriptor, under the lock: the
 * descriptor is readable while completions wait and quiet after a drain that
 * took them all, and a burst of completions costs one write and one lock.
 *
 * Places. A tp_submit_wait caller that found every place taken sleeps on the
 * same `cv` (cq.h); a drain that gives places back wakes it only when one
 * waits (`place_waiters`): the drain's release and the waiter's check are
 * ordered by sequentially consistent atomics, so one of them always sees the
 * other.
 *
 * Lock order: a pool lock, then the queue's lock (a push, made with the pool
 * lock held, takes the queue's lock only the slow way; a pool's close wakes
 * place waiters); the queue's lock is never held while a pool lock is taken,
 * and never around an on_done. A plain mutex, as the pool's (engine.c,
 * make_sync): a waiter sleeps at once rather than spin on a CPU that the
 * holder may need.
 *
 * Layer: a leaf (see pool.h): life.c reserves, pushes and releases; engine.c
 * waits for places; the rest is the public API.
 */
#include "cq.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

/* A slot of the ring. `seq` is T << 2 | state, for ticket T: SLOT_FREE (the
 * slot waits for ticket T's completion), SLOT_FREE_WAKE (the same, and the
 * push of ticket T must take the slow way: a drainer or a tp_cq_wait caller
 * asked, see the top of the file), SLOT_FULL (ticket T's completion is in
 * it). */
enum { SLOT_FREE = 0, SLOT_FREE_WAKE = 1, SLOT_FULL = 2 };
typedef struct tp__slot {
    _Atomic uint64_t seq;
    tp_done_fn fn;
    void *arg;
    int status;
} tp__slot;

typedef struct tp__completion {
    tp_done_fn fn;
    void *arg;
    int status;
} tp__completion;

/* Completions a drain takes under one lock hold (copied to its stack). */
#define TP__CQ_CHUNK 64u

#define TP__CQ_LOOK 1u /* bit 0 of `word`: the next push takes the slow way */

/* Cache lines by who writes them per task: none (what a push reads: the
 * ring and its size), the places (the submitter takes one per task; the
 * drainer gives each back), the ticket word (the pushing worker, per
 * task), the lock and the head (the drainer, per chunk). The places once
 * shared the first line: every take then sent the pushing workers' copy of
 * the ring's address away (tp__cq_reserve was 9 % of the compare driver's
 * samples; 1.5 % apart). */
struct tp_cq {
    _Alignas(64) unsigned capacity;
    tp__slot *ring; /* capacity slots, aligned within ring_raw (base.h, large arrays) */
    void *ring_raw;
    int fds[2];                           /* eventfd: fds[0] == fds[1]; pipe: read end, write end */
    _Alignas(64) _Atomic unsigned places; /* taken: unfinished bound tasks + completions waiting or running */
    _Atomic unsigned place_waiters;       /* submitters waiting for a place */
    _Alignas(64) _Atomic uint64_t word;   /* next ticket << 1 | TP__CQ_LOOK */
    _Alignas(64) tp__mutex mu;            /* drainers, slow pushes, the condition variable */
    uint64_t head;                        /* under mu: the next ticket to drain */
    unsigned waiters;                     /* under mu: tp_cq_wait callers */
    bool woken;                           /* under mu: the descriptor holds a wake-up */
    pthread_cond_t cv; /* a completion waits (tp_cq_wait); a place may be free (submitters) */
    void *mem;         /* what calloc returned: the queue is aligned to a cache line within it */
};

/* ------------------------------------------------------------ the descriptor */

static int fd_open(int fds[2]) {
#if defined(__linux__)
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd >= 0) {
        fds[0] = fds[1] = fd;
        return 0;
    }
#endif
    return pipe2(fds, O_NONBLOCK | O_CLOEXEC);
}

static void fd_close(int fds[2]) {
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0 && fds[1] != fds[0]) close(fds[1]);
}

/* Under the lock, by whoever sets `woken` (a full pipe is readable anyway). */
static void fd_wake(tp_cq *cq) {
    uint64_t one = 1;
    ssize_t n;
    do n = write(cq->fds[1], &one, cq->fds[0] == cq->fds[1] ? sizeof one : 1);
    while (n < 0 && errno == EINTR);
}

/* Under the lock, by whoever clears `woken`. An eventfd's one read takes
 * its whole count (it is not a semaphore eventfd): one system call, not a
 * second one that finds it empty; a pipe is read until it is empty. */
static void fd_consume(tp_cq *cq) {
    uint64_t buf[8];
    bool is_eventfd = cq->fds[0] == cq->fds[1];
    ssize_t n;
    do n = read(cq->fds[0], buf, is_eventfd ? sizeof buf[0] : sizeof buf);
    while ((n > 0 && !is_eventfd) || (n < 0 && errno == EINTR));
}

/* ------------------------------------------------------------ the ring */

static tp__slot *slot_of(const tp_cq *cq, uint64_t ticket) { return &cq->ring[ticket % cq->capacity]; }

/* Whether ticket `t`'s completion is in its slot. */
static bool published(const tp_cq *cq, uint64_t t) {
    return atomic_load_explicit(&slot_of(cq, t)->seq, memory_order_acquire) == (t << 2 | SLOT_FULL);
}

/* Ask the push of ticket `t` (taken, mu held) to take the slow way: false
 * if it has published already. */
static bool ask_slow(tp_cq *cq, uint64_t t) {
    uint64_t seq = t << 2 | SLOT_FREE;
    if (atomic_compare_exchange_strong(&slot_of(cq, t)->seq, &seq, t << 2 | SLOT_FREE_WAKE)) return true;
    return seq == (t << 2 | SLOT_FREE_WAKE);
}

/* ------------------------------------------------------------ public calls */

int tp_cq_create(tp_cq **out, unsigned capacity) {
    if (!out || capacity == 0 || capacity > TP_MAX_QUEUE_CAPACITY) return TP_EINVAL;
    void *mem;
    tp_cq *cq = (tp_cq *)tp__calloc_big(1, sizeof *cq, &mem);
    if (!cq) return TP_ENOMEM;
    cq->mem = mem;
    cq->capacity = capacity;
    atomic_init(&cq->word, TP__CQ_LOOK); /* the descriptor is quiet: the first push wakes it */
    cq->fds[0] = cq->fds[1] = -1;
    cq->ring = (tp__slot *)tp__calloc_big(capacity, sizeof *cq->ring, &cq->ring_raw);
    if (cq->ring)
        for (unsigned i = 0; i < capacity; i++) atomic_init(&cq->ring[i].seq, (uint64_t)i << 2 | SLOT_FREE);
    int made = 0;
    if (cq->ring && tp__mutex_init(&cq->mu, false) == 0) {
        made = 1;
        if (tp__cond_init(&cq->cv) == 0) {
            made = 2;
            if (fd_open(cq->fds) == 0) {
                *out = cq;
                return TP_OK;
            }
        }
    }
    if (made == 2) pthread_cond_destroy(&cq->cv);
    if (made >= 1) tp__mutex_destroy(&cq->mu);
    free(cq->ring_raw);
    free(cq->mem);
    return TP_ENOMEM;
}

int tp_cq_fd(const tp_cq *cq) { return cq ? cq->fds[0] : TP_EINVAL; }

/* Tickets taken beyond head (published or about to be); mu held. */
static uint64_t taken_beyond_head(const tp_cq *cq, uint64_t word) { return (word >> 1) - cq->head; }

/* The drains under way on this thread, innermost first: the chunk each one
 * copied out of the ring and how far it has run it. A drain called from
 * inside an on_done runs the rest of its queue's enclosing chunk first, so
 * that one thread runs a queue's completions in the order the tasks ended
 * (taskpool.h, section 15); the enclosing call then runs none of them
 * again. At most one frame of a queue holds completions not yet run: a
 * nested drain takes a chunk of its own only once it has run the enclosing
 * one's rest. */
typedef struct drain_frame {
    tp_cq *cq;
    const tp__completion *batch;
    unsigned got;  /* completions in batch */
    unsigned next; /* the next one to run */
    struct drain_frame *up;
} drain_frame;
static _Thread_local drain_frame *tls_drains;

/* Run frame f's next completion, then give its place back: the next on_done
 * may submit into it. */
static void run_next(drain_frame *f) {
    tp__completion c = f->batch[f->next++];
    c.fn(c.arg, c.status);
    tp__cq_release(f->cq, 1);
}

int tp_cq_drain(tp_cq *cq, unsigned max) {
    if (!cq) return TP_EINVAL;
    tp__completion batch[TP__CQ_CHUNK];
    /* What waits at the first take, at most `max`: the tickets below `stop`.
     * Completions that arrive later (an on_done may submit and wait for
     * more) are the next call's, so one call runs a bounded number of
     * on_done; and a ticket, not a count, bounds it: when another drainer
     * (or one nested in an on_done) takes some of them meanwhile, this call
     * does not make up for them with later ones. */
    unsigned done = 0;
    for (drain_frame *f = tls_drains; f; f = f->up) {
        if (f->cq != cq) continue;
        while (f->next < f->got && (max == 0 || done < max)) {
            run_next(f);
            done++;
        }
    }
    if (max != 0 && done == max) return (int)done;
    drain_frame self = {cq, batch, 0, 0, tls_drains};
    uint64_t stop = 0;
    bool first = true;
    for (;;) {
        tp__mutex_lock(&cq->mu);
        if (first) {
            uint64_t taken = taken_beyond_head(cq, atomic_load_explicit(&cq->word, memory_order_relaxed));
            if (max != 0 && taken > max - done) taken = max - done;
            stop = cq->head + taken; /* taken <= capacity: every ticket beyond head holds a place */
            first = false;
        }
        uint64_t left = stop > cq->head ? stop - cq->head : 0;
        unsigned k = left < TP__CQ_CHUNK ? (unsigned)left : TP__CQ_CHUNK;
        unsigned got = 0;
        for (; got < k && published(cq, cq->head + got); got++) {
            uint64_t t = cq->head + got;
            tp__slot *sl = slot_of(cq, t);
            batch[got] = (tp__completion){sl->fn, sl->arg, sl->status};
            atomic_store_explicit(&sl->seq, (t + cq->capacity) << 2 | SLOT_FREE,
                                  memory_order_release); /* free for that ticket */
        }
        cq->head += got;
        if (cq->woken && !published(cq, cq->head)) {
            /* Taken all that is published: the descriptor goes quiet, and
             * the next push wakes it: a push that takes its ticket from now
             * on sees LOOK; the one of ticket head, if taken already, is
             * asked through its slot (see the top of the file). */
            uint64_t w = atomic_fetch_or(&cq->word, TP__CQ_LOOK);
            if (taken_beyond_head(cq, w) == 0 || ask_slow(cq, cq->head)) {
                fd_consume(cq);
                cq->woken = false;
            } /* else it has just published: it waits, the descriptor says so */
        }
        tp__mutex_unlock(&cq->mu);
        /* Each place comes back as soon as its own on_done has returned:
         * the next on_done of this chunk may submit into it. A drain nested
         * in one of them runs the rest of the chunk (self.next moves). */
        self.got = got;
        self.next = 0;
        tls_drains = &self;
        while (self.next < self.got) {
            run_next(&self);
            done++;
        }
        tls_drains = self.up;
        /* all that waited at the first take (up to stop), or all that is
         * published: done, with one hold of the lock per batch */
        if (got < k || got == left) break;
    }
    return (int)done;
}

int tp_cq_wait(tp_cq *cq, uint64_t timeout_ns) {
    if (!cq) return TP_EINVAL;
    uint64_t deadline = timeout_ns == TP_FOREVER ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__mutex_lock(&cq->mu);
    cq->waiters++;
    for (;;) {
        if (published(cq, cq->head)) break;
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        /* About to sleep (only then: a poll, or a wait that finds a
         * completion, leaves the next push its fast way): a push that takes
         * its ticket from now on sees LOOK and wakes us; one that took it
         * already is asked through its slot. */
        uint64_t w = atomic_fetch_or(&cq->word, TP__CQ_LOOK);
        if (published(cq, cq->head)) break;
        if (taken_beyond_head(cq, w) > 0 && !ask_slow(cq, cq->head)) continue; /* published meanwhile */
        tp__mutex_wait(&cq->mu, &cq->cv, deadline);
    }
    cq->waiters--;
    tp__mutex_unlock(&cq->mu);
    return rc;
}

int tp_cq_destroy(tp_cq *cq) {
    if (!cq) return TP_EINVAL;
    /* No call may run concurrently with this one (taskpool.h); the lock
     * orders this read after the last drain's release all the same. */
    tp__mutex_lock(&cq->mu);
    bool busy = atomic_load(&cq->places) != 0;
    tp__mutex_unlock(&cq->mu);
    if (busy) return TP_EBUSY;
    fd_close(cq->fds);
    pthread_cond_destroy(&cq->cv);
    tp__mutex_destroy(&cq->mu);
    free(cq->ring_raw);
    free(cq->mem);
    return TP_OK;
}

/* ------------------------------------------------------------ the pool's side */

bool tp__cq_reserve(tp_cq *cq) {
    unsigned n = atomic_load_explicit(&cq->places, memory_order_relaxed);
    do
        if (n >= cq->capacity) return false;
    while (!atomic_compare_exchange_weak_explicit(&cq->places, &n, n + 1, memory_order_acquire,
                                                  memory_order_relaxed));
    return true;
}

void tp__cq_release(tp_cq *cq, unsigned n) {
    /* seq_cst, with the load below: a waiter that registered before this
     * release is seen, or it sees the place (see the top of the file) */
    atomic_fetch_sub(&cq->places, n);
    if (atomic_load(&cq->place_waiters) == 0) return;
    tp__mutex_lock(&cq->mu);
    pthread_cond_broadcast(&cq->cv);
    tp__mutex_unlock(&cq->mu);
}

/* Ticket t's completion into its slot. */
static tp__slot *slot_fill(tp_cq *cq, uint64_t t, tp_done_fn fn, void *arg, int status) {
    tp__slot *sl = slot_of(cq, t);
    /* Free at once: its last completion was copied out before its place
     * came back (see the top of the file). */
    while ((atomic_load_explicit(&sl->seq, memory_order_acquire) & ~(uint64_t)3) != t << 2) tp__cpu_relax();
    sl->fn = fn;
    sl->arg = arg;
    sl->status = status;
    return sl;
}

#if defined(TP__DEBUG)
_Atomic(tp__cq_test_hook) tp__test_cq_ticket_taken; /* cq.h */
_Atomic unsigned long tp__test_cq_slow_pushes;      /* cq.h */
#endif

void tp__cq_push(tp_cq *cq, tp_done_fn fn, void *arg, int status) {
    uint64_t w = atomic_fetch_add_explicit(&cq->word, 2, memory_order_relaxed);
    uint64_t t = w >> 1;
#if defined(TP__DEBUG)
    tp__cq_test_hook hook = atomic_load_explicit(&tp__test_cq_ticket_taken, memory_order_acquire);
    if (hook) hook(cq);
#endif
    if (!(w & TP__CQ_LOOK)) {
        tp__slot *sl = slot_fill(cq, t, fn, arg, status);
        uint64_t seq = t << 2 | SLOT_FREE;
        if (atomic_compare_exchange_strong_explicit(&sl->seq, &seq, t << 2 | SLOT_FULL, memory_order_release,
                                                    memory_order_relaxed))
            return; /* published; nothing of cq is touched after it */
        /* SLOT_FREE_WAKE: asked to take the slow way; not published yet.
         * Whoever asked set LOOK too (under the lock, after this ticket was
         * taken): this push wakes them, so it clears LOOK as the other slow
         * way does, and the next push goes the fast way. */
        tp__mutex_lock(&cq->mu);
        atomic_fetch_and(&cq->word, ~(uint64_t)TP__CQ_LOOK);
    } else {
        /* The slow way (see the top of the file). */
        tp__mutex_lock(&cq->mu);
        atomic_fetch_and(&cq->word, ~(uint64_t)TP__CQ_LOOK);
        slot_fill(cq, t, fn, arg, status);
    }
    atomic_store_explicit(&slot_of(cq, t)->seq, t << 2 | SLOT_FULL, memory_order_release);
#if defined(TP__DEBUG)
    atomic_fetch_add(&tp__test_cq_slow_pushes, 1);
#endif
    if (!cq->woken) {
        cq->woken = true;
        fd_wake(cq);
    }
    if (cq->waiters) pthread_cond_broadcast(&cq->cv);
    tp__mutex_unlock(&cq->mu);
}

void tp__cq_wait_place_begin(tp__cq_waiter *w) {
    tp__mutex_lock(&w->cq->mu);
    atomic_fetch_add(&w->cq->place_waiters, 1); /* seq_cst: before the check in tp__cq_wait_place */
}

void tp__cq_wait_place(tp__cq_waiter *w, uint64_t deadline) {
    tp_cq *cq = w->cq;
    TP__ASSERT_HELD(&cq->mu);
    while (!w->closed && atomic_load(&cq->places) >= cq->capacity) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) break;
        tp__mutex_wait(&cq->mu, &cq->cv, deadline);
    }
}

void tp__cq_wait_place_end(tp__cq_waiter *w) {
    atomic_fetch_sub(&w->cq->place_waiters, 1);
    tp__mutex_unlock(&w->cq->mu);
}

void tp__cq_wake_closed(tp__cq_waiter *w) {
    tp__mutex_lock(&w->cq->mu);
    w->closed = true;
    pthread_cond_broadcast(&w->cq->cv);
    tp__mutex_unlock(&w->cq->mu);
}
