/*
 * test_fuzz_found.c -- regression tests for bugs found by the model-based
 * fuzz harness (tests/fuzz/). Each test builds the failing state deterministically
 * with latches and says which fuzz check catches it.
 */
#include "tp_test.h"

/* ------------------------------------------------------------ elastic spawn */

static tpt_latch *stop_gate; /* the running test's, from its fixture */
static atomic_int hold_stop; /* while set, the stop hook waits for stop_gate */
static atomic_int in_stop;   /* stop hooks waiting now */

static void holding_stop(void *arg) {
    (void)arg;
    if (!atomic_load(&hold_stop)) return;
    atomic_fetch_add(&in_stop, 1);
    tpt_latch_wait(stop_gate);
    atomic_fetch_sub(&in_stop, 1);
}

/*
 * An elastic worker that idled out leaves the counted workers before its stop
 * hook runs, but its slot is taken until the hook returns. A submit in that
 * window finds the pool below max_workers with no idle worker, tries to add
 * one, finds no free slot and skips. Once the slot is free nothing tried
 * again: the task waited in the queue, with the pool below its maximum, until
 * a busy worker happened to finish (here: never, while the latch is shut).
 * Found while writing the fuzz model's quiescence check ("a queued task with
 * a free worker slot gets a worker"); on the unfixed library the harness
 * reports it with the seed tests/fuzz/corpus/elastic_exit_window (slow worker
 * hooks widen the window) as "pool 0 not quiescent: active 1 queued 1
 * workers 1 idle 0".
 */
static void test_elastic_spawn_skipped_while_a_worker_exits(void **state) {
    tpt_fixture *f = tpt_fx(state);
    stop_gate = tpt_fx_latch(f);
    atomic_store(&hold_stop, 0);
    atomic_store(&in_stop, 0);
    tp_config cfg = {0};
    cfg.workers = 1;
    cfg.max_workers = 2;
    cfg.idle_timeout_ns = TPT_MS(1);
    cfg.on_worker_stop = holding_stop;
    cfg.log = tpt_quiet_log;
    tp_pool *p = tpt_fx_pool(f, &cfg);

    tpt_latch *gate = tpt_fx_latch(f);
    tpt_fill_workers(p, gate, 1, NULL); /* the minimum worker is busy */

    /* A second worker starts for this task, runs it, idles out and stops in
     * its stop hook. */
    atomic_store(&hold_stop, 1);
    tpt_done *first = tpt_fx_new(f, tpt_done);
    tp_task_opts o = {.on_done = tpt_done_fn};
    assert_int_equal(tp_submit(p, tpt_nop_task, first, &o, NULL), TP_OK);
    TPT_EVENTUALLY(atomic_load(&first->calls) == 1);
    TPT_EVENTUALLY(atomic_load(&in_stop) == 1 && tpt_stats(p).workers == 1);

    /* Below max_workers, no idle worker: this task needs a new one. */
    atomic_store(&hold_stop, 0);
    tpt_done *second = tpt_fx_new(f, tpt_done);
    assert_int_equal(tp_submit(p, tpt_nop_task, second, &o, NULL), TP_OK);
    tpt_latch_open(stop_gate); /* the exiting worker frees its slot */

    TPT_EVENTUALLY(atomic_load(&second->calls) == 1);
    assert_int_equal(atomic_load(&second->status), 0);
    assert_int_equal(atomic_load(&gate->waiting), 1); /* the busy worker did not run it */

    tpt_latch_open(gate);
    tpt_finish(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TPT_TEST(test_elastic_spawn_skipped_while_a_worker_exits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
