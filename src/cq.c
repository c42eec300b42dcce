/*
 * cq.c -- completion queues (taskpool.h, section 15; the pool's side in
 * cq.h).
 *
 * Shape. `places` counts what is in use: tasks bound to the queue that are
 * unfinished, plus completions that wait or whose on_done runs now. It is
 * taken at admission (a compare-and-swap below `capacity`, no lock) and
 * given back after a drain ran the on_done. The ring holds `capacity`
 * completions with free-running 64-bit head and tail counters, so it cannot
 * overflow. A drain copies up to TP__CQ_CHUNK completions out of the ring
 * under the lock (moving head past them), runs them without the lock, gives
 * their places back, and goes on with the next chunk, up to what waited
 * when it began (or `max`). The copy is what makes several drainers safe: a
 * drainer that finishes first gives places back whose slots the tail may
 * then reuse, while another drainer's batch, taken earlier, is still being
 * run -- from its own copy.
 *
 * The descriptor. An eventfd (a pipe elsewhere) holds one wake-up while the
 * ring is not empty: written by the push that finds the ring empty, consumed
 * by the drain that empties it, both under the queue's lock. So it is
 * readable exactly while completions wait, and a burst of completions costs
 * one write.
 *
 * Waiting. tp_cq_wait sleeps on `cv` until the ring is not empty. A
 * tp_submit_wait caller that found every place taken sleeps on the same
 * `cv` (cq.h); a drain that gives places back wakes it only when one waits
 * (`place_waiters`): the drain's release and the waiter's check are ordered
 * by sequentially consistent atomics, so one of them always sees the other.
 *
 * Lock order: a pool lock, then the queue's lock (tp__cq_push is called with
 * the pool lock held, in the section that counts the task and frees its user
 * slot: life.c finalise); the queue's lock is never
 * held while a pool lock is taken, and never around an on_done. It spins
 * briefly before it sleeps (adaptive), as the pool's does: it is held for a
 * few stores.
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

typedef struct tp__completion {
    tp_done_fn fn;
    void *arg;
    int status;
} tp__completion;

/* Completions a drain takes under one lock hold (copied to its stack). */
#define TP__CQ_CHUNK 64u

/* Three cache lines, by who writes them per task: the places (the
 * submitter takes one per task; the drainer gives them back per chunk), the
 * lock and the tail (the pushing worker, per task), the head (the drainer,
 * per chunk). */
struct tp_cq {
    _Alignas(64) _Atomic unsigned places; /* taken: unfinished bound tasks + completions waiting or running */
    _Atomic unsigned place_waiters;       /* submitters waiting for a place */
    unsigned capacity;
    _Alignas(64) tp__mutex mu;
    /* under mu */
    tp__completion *ring;
    uint64_t tail;              /* free-running (never wraps); slot = index % capacity */
    unsigned waiters;           /* tp_cq_wait callers in cv */
    bool woken;                 /* the descriptor holds a wake-up */
    int fds[2];                 /* eventfd: fds[0] == fds[1]; pipe: read end, write end */
    _Alignas(64) uint64_t head; /* under mu: free-running, as tail */
    pthread_cond_t cv;          /* a completion waits (tp_cq_wait); a place may be free (submitters) */
    void *mem;                  /* what calloc returned: the queue is aligned to a cache line within it */
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

static void fd_wake(tp_cq *cq) {
    uint64_t one = 1;
    ssize_t n;
    do n = write(cq->fds[1], &one, cq->fds[0] == cq->fds[1] ? sizeof one : 1);
    while (n < 0 && errno == EINTR);
    cq->woken = true; /* a full pipe is readable anyway */
}

static void fd_consume(tp_cq *cq) {
    uint64_t buf[8];
    ssize_t n;
    do n = read(cq->fds[0], buf, cq->fds[0] == cq->fds[1] ? sizeof buf[0] : sizeof buf);
    while (n > 0 || (n < 0 && errno == EINTR));
    cq->woken = false;
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
    cq->ring = (tp__completion *)calloc(capacity, sizeof *cq->ring);
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
        unsigned waiting = (unsigned)(cq->tail - cq->head);
        if (done == 0 && want == 0) want = waiting;
        unsigned k = want - done;
        if (k > waiting) k = waiting;
        if (k > TP__CQ_CHUNK) k = TP__CQ_CHUNK;
        for (unsigned i = 0; i < k; i++) batch[i] = cq->ring[(cq->head + i) % cq->capacity];
        cq->head += k;
        if (k && cq->head == cq->tail && cq->woken) fd_consume(cq);
        tp__mutex_unlock(&cq->mu);
        if (k == 0) break;
        for (unsigned i = 0; i < k; i++) batch[i].fn(batch[i].arg, batch[i].status);
        tp__cq_release(cq, k);
        done += k;
        if (done >= want) break;
    }
    return (int)done;
}

int tp_cq_wait(tp_cq *cq, uint64_t timeout_ns) {
    if (!cq) return TP_EINVAL;
    uint64_t deadline = timeout_ns == TP_FOREVER ? TP_FOREVER : tp__deadline_after(tp_now_ns(), timeout_ns);
    int rc = TP_OK;
    tp__mutex_lock(&cq->mu);
    cq->waiters++;
    while (cq->tail == cq->head) {
        if (deadline != TP_FOREVER && tp_now_ns() >= deadline) {
            rc = TP_ETIMEDOUT;
            break;
        }
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
    tp__mutex_lock(&cq->mu);
    TP__ASSERT(cq->tail - cq->head < cq->capacity); /* each completion holds a place */
    tp__completion *c = &cq->ring[cq->tail++ % cq->capacity];
    c->fn = fn;
    c->arg = arg;
    c->status = status;
    if (!cq->woken) fd_wake(cq);
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
