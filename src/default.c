/*
 * default.c -- the process-wide default pool.
 *
 * The registration is one atomic pointer, so tp_default() and the forwarding
 * calls never block. tp_default_create() takes a small mutex so two
 * concurrent creates cannot both register; it is never held while a pool lock
 * is taken except inside tp_create(), which takes no other pool's lock.
 * Keeping a pool alive while others may still reach it through tp_default()
 * is the caller's job (swap it out first, then shut it down).
 *
 * Layer: 1 in pool.h; it calls only public functions. Lock order:
 * g_create_mu, then (inside tp_create) a pool lock.
 */
#include "base.h"

static _Atomic(tp_pool *) g_default;
static pthread_mutex_t g_create_mu = PTHREAD_MUTEX_INITIALIZER;

int tp_default_create(const tp_config *cfg) {
    pthread_mutex_lock(&g_create_mu);
    int rc = TP_EINVAL;
    tp_pool *lost = NULL; /* made, but a swap registered another first */
    if (!atomic_load_explicit(&g_default, memory_order_acquire)) {
        tp_pool *p = NULL;
        rc = tp_create(&p, cfg);
        if (rc == TP_OK) {
            /* A tp_default_swap() may have registered a pool meanwhile: never
             * overwrite it. release: a thread that loads the pointer sees a
             * fully built pool. */
            tp_pool *none = NULL;
            if (!atomic_compare_exchange_strong_explicit(&g_default, &none, p, memory_order_acq_rel,
                                                         memory_order_acquire)) {
                lost = p;
                rc = TP_EINVAL;
            }
        }
    }
    pthread_mutex_unlock(&g_create_mu);
    /* Destroyed outside the registry lock: its worker hooks run during the
     * destroy and may call tp_default_create() themselves. */
    if (lost) tp_destroy(lost);
    return rc;
}

tp_pool *tp_default(void) { return atomic_load_explicit(&g_default, memory_order_acquire); }

tp_pool *tp_default_swap(tp_pool *p) {
    /* acq_rel: publish the new pool, and see the old one fully built */
    return atomic_exchange_explicit(&g_default, p, memory_order_acq_rel);
}

int tp_default_submit(tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    tp_pool *p = tp_default();
    return p ? tp_submit(p, fn, arg, opts, id_out) : TP_ENODEFAULT;
}

int tp_default_shutdown(uint64_t budget_ns) {
    tp_pool *p = tp_default();
    return p ? tp_shutdown(p, budget_ns) : TP_ENODEFAULT;
}

int tp_default_wait(uint64_t timeout_ns) {
    tp_pool *p = tp_default();
    return p ? tp_wait(p, timeout_ns) : TP_ENODEFAULT;
}
