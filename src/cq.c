/*
 * cq.c -- completion queues (taskpool.h, section 15; the pool's side in
 * cq.h).
 *
 * Shape. `places` counts what is in use: tasks bound to the queue that are
 * unfinished, plus completions that wait or whose on_done runs now. It is
 * taken at admission (a compare-and-swap below `capacity`, no lock) and
 * given back after a drain ran the on_done. The ring holds `capacity`
 * completions; a place is what lets a completion into it, so it never
 * overflows.
 *
 * The ring (a bounded queue in the manner of D. Vyukov's): `tail` is a
 * free-running ticket counter; a push takes ticket T with one atomic add,
 * writes slot T % capacity and publishes it by storing the slot's `seq` =
 * T + 1 (release). A drain, under the queue's lock (drainers take turns),
 * copies the slots from `head` on while their seq says they are published
 * (acquire), hands each slot back for ticket T + capacity (seq, release) and
 * moves head past them. A push waits for its slot's seq to say T before it
 * writes: the places make that wait empty (the completion that held the
 * slot `capacity` tickets earlier was copied out before its place came
 * back), the seq makes it so without an argument across two counters. So
 * pushes, made by workers with their pool's lock held, take no lock of the
 * queue and never wait for a drainer. The drain copies up to TP__CQ_CHUNK
 * completions at a time, runs them without the lock, gives their places
 * back, and goes on with the next chunk, up to what waited when it began
 * (or `max`); the copy is what makes several drainers safe.
 *
 * The descriptor. An eventfd (a pipe elsewhere) holds one wake-up while
 * completions wait; `woken` says it does, and changes only together with
 * the descriptor, under the lock. A push that publishes and then finds woken
 * false takes the lock and, if woken is still false and its completion has
 * not been drained meanwhile, sets it and writes the descriptor; a drain that has taken everything published consumes the
 * descriptor, clears woken, and looks once more: a completion published
 * meanwhile is woken for by the drain or by its push (a sequentially
 * consistent fence on each side, between its store and its load, makes one
 * of them see the other). So the descriptor is readable while completions
 * wait and quiet after a drain that took them all, and a burst of
 * completions costs one write and one lock.
 *
 * Waiting. tp_cq_wait sleeps on `cv` until the slot at head is published; a
 * push looks at `waiters` after its fence and, if one waits, broadcasts with
 * the queue's lock held (the waiter registers, then looks, under that lock:
 * it sees the completion or gets the broadcast). A tp_submit_wait caller
 * that found every place taken sleeps on the same `cv` (cq.h); a drain that
 * gives places back wakes it only when one waits (`place_waiters`): the
 * drain's release and the waiter's check are ordered by sequentially
 * consistent atomics, so one of them always sees the other.
 *
 * Lock order: a pool lock, then the queue's lock (a push, made with the pool
 * lock held, takes the queue's lock only to wake the descriptor or a
 * tp_cq_wait caller; a pool's close wakes place waiters); the queue's lock is never held while a
 * pool lock is taken, and never around an on_done. It spins briefly before
 * it sleeps (adaptive), as the pool's does: it is held for a few stores.
 *
 * Layer: a leaf (see pool.h): life.c reserves, pushes and releases; engine.c
 * waits for places; the rest is the public API.
 */
#include "cq.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

/* A slot of the ring; `seq` is T when the slot is free for ticket T, T + 1
 * when ticket T's completion is in it. */
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

/* Three cache lines, by who writes them per task: the places (the
 * submitter takes one per task; the drainer gives them back per chunk), the
 * tail (the pushing worker, per task), the lock and the head (the drainer,
 * per chunk). */
struct tp_cq {
    _Alignas(64) _Atomic unsigned places; /* taken: unfinished bound tasks + completions waiting or running */
    _Atomic unsigned place_waiters;       /* submitters waiting for a place */
    unsigned capacity;
    tp__slot *ring;                     /* capacity slots */
    int fds[2];                         /* eventfd: fds[0] == fds[1]; pipe: read end, write end */
    _Alignas(64) _Atomic uint64_t tail; /* the next ticket: free-running (never wraps) */
    _Atomic bool woken;                 /* the descriptor holds a wake-up */
    _Atomic unsigned waiters;           /* tp_cq_wait callers (registered under mu) */
    _Alignas(64) tp__mutex mu;          /* drainers, and the condition variable */
    uint64_t head;                      /* under mu: the next ticket to drain */
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

static void fd_consume(tp_cq *cq) {
    uint64_t buf[8];
    ssize_t n;
    do n = read(cq->fds[0], buf, cq->fds[0] == cq->fds[1] ? sizeof buf[0] : sizeof buf);
    while (n > 0 || (n < 0 && errno == EINTR));
}

/* ------------------------------------------------------------ the ring */

static tp__slot *slot_of(const tp_cq *cq, uint64_t ticket) { return &cq->ring[ticket % cq->capacity]; }

/* Whether ticket `t`'s completion is in its slot. */
static bool published(const tp_cq *cq, uint64_t t) {
    return atomic_load_explicit(&slot_of(cq, t)->seq, memory_order_acquire) == t + 1;
}

/* ------------------------------------------------------------ public calls */

int tp_cq_create(tp_cq **out, unsigned capacity) {
    if (!out || capacity == 0 || capacity > TP_MAX_QUEUE_CAPACITY) return TP_EINVAL;
    void *mem;
    tp_cq *cq = (tp_cq *)tp__calloc_lines(1, sizeof *cq, &mem);
    if (!cq) return TP_ENOMEM;
    cq->mem = mem;
    cq->capacity = capacity;
    cq->fds[0] = cq->fds[1] = -1;
    cq->ring = (tp__slot *)calloc(capacity, sizeof *cq->ring);
    if (cq->ring)
        for (unsigned i = 0; i < capacity; i++) atomic_init(&cq->ring[i].seq, i); /* free for ticket i */
    int made = 0;
    if (cq->ring && tp__mutex_init(&cq->mu, true) == 0) {
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
    free(cq->ring);
    free(cq->mem);
    return TP_ENOMEM;
}

int tp_cq_fd(const tp_cq *cq) { return cq ? cq->fds[0] : TP_EINVAL; }

int tp_cq_drain(tp_cq *cq, unsigned max) {
    if (!cq) return TP_EINVAL;
    tp__completion batch[TP__CQ_CHUNK];
    unsigned done = 0, want = max; /* 0: what waits now, fixed at the first take */
    for (;;) {
        tp__mutex_lock(&cq->mu);
        if (done == 0 && want == 0) {
            /* tickets taken: published, or about to be (a push under way) */
            uint64_t taken = atomic_load_explicit(&cq->tail, memory_order_relaxed) - cq->head;
            want = taken > UINT_MAX ? UINT_MAX : (unsigned)taken;
        }
        unsigned k = want - done;
        if (k > TP__CQ_CHUNK) k = TP__CQ_CHUNK;
        unsigned got = 0;
        for (; got < k && published(cq, cq->head + got); got++) {
            uint64_t t = cq->head + got;
            tp__slot *sl = slot_of(cq, t);
            batch[got] = (tp__completion){sl->fn, sl->arg, sl->status};
            atomic_store_explicit(&sl->seq, t + cq->capacity,
                                  memory_order_release); /* free for that ticket */
        }
        cq->head += got;
        bool more = got == k && published(cq, cq->head);
        if (!more && atomic_load_explicit(&cq->woken, memory_order_relaxed)) {
            /* Taken all that is published: the descriptor goes quiet, unless
             * a completion was published meanwhile (see the top of the file). */
            fd_consume(cq);
            atomic_store_explicit(&cq->woken, false, memory_order_relaxed);
            atomic_thread_fence(memory_order_seq_cst);
            if (published(cq, cq->head)) {
                atomic_store_explicit(&cq->woken, true, memory_order_relaxed);
                fd_wake(cq);
            }
        }
        tp__mutex_unlock(&cq->mu);
        if (got == 0) break;
        for (unsigned i = 0; i < got; i++) batch[i].fn(batch[i].arg, batch[i].status);
        tp__cq_release(cq, got);
        done += got;
        if (done >= want || got < k) break;
    }
    return (int)done;
}

int tp_cq_wait(tp_cq *cq, uint64_t timeout_ns) {
    if (!cq) return TP_EINVAL;
    uint64_t deadline = timeout_ns == TP_FOREVER ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__mutex_lock(&cq->mu);
    atomic_fetch_add(&cq->waiters, 1);
    atomic_thread_fence(memory_order_seq_cst); /* before the look below (see the top of the file) */
    while (!published(cq, cq->head)) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
        tp__mutex_wait(&cq->mu, &cq->cv, deadline);
    }
    atomic_fetch_sub(&cq->waiters, 1);
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
    free(cq->ring);
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

void tp__cq_push(tp_cq *cq, tp_done_fn fn, void *arg, int status) {
    uint64_t t = atomic_fetch_add_explicit(&cq->tail, 1, memory_order_relaxed);
    tp__slot *sl = slot_of(cq, t);
    /* Free at once: its last completion was copied out before its place
     * came back (see the top of the file). */
    while (atomic_load_explicit(&sl->seq, memory_order_acquire) != t) tp__cpu_relax();
    sl->fn = fn;
    sl->arg = arg;
    sl->status = status;
    atomic_store_explicit(&sl->seq, t + 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst); /* the store above, before the loads below */
    if (!atomic_load_explicit(&cq->woken, memory_order_relaxed) ||
        atomic_load_explicit(&cq->waiters, memory_order_relaxed)) {
        /* The queue may have been empty, or someone waits in tp_cq_wait:
         * wake both under the lock (see the top of the file). */
        tp__mutex_lock(&cq->mu);
        if (!atomic_load_explicit(&cq->woken, memory_order_relaxed) && cq->head <= t) {
            /* (a drain that took this completion meanwhile found it without
             * the descriptor: no wake-up is owed for it) */
            atomic_store_explicit(&cq->woken, true, memory_order_relaxed);
            fd_wake(cq);
        }
        if (atomic_load_explicit(&cq->waiters, memory_order_relaxed)) pthread_cond_broadcast(&cq->cv);
        tp__mutex_unlock(&cq->mu);
    }
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
