/*
 * tpt_alloc.h -- heap allocation counting in a cmocka test executable.
 *
 * Included by one translation unit of an executable (test_alloc.c,
 * test_batch.c). The counting itself -- the malloc interposer, arming,
 * the first allocation's kind, size and caller -- is tpt_alloc_count.h,
 * shared with the bench; this adds what a test does with it:
 *
 *   if (!tpt_alloc_counting_or_skip()) return;
 *   ... warm up ...
 *   tpt_alloc_arm();
 *   ... the steady state under test ...
 *   tpt_alloc_disarm();
 *   tpt_alloc_assert_none("10000 steady-state tasks");
 *
 * tpt_alloc_counting_or_skip() skips the test only where something else is
 * known to own malloc (a sanitizer, valgrind, a C library without __libc_*),
 * and fails where the interposer is compiled in but counts nothing.
 */
#ifndef TPT_ALLOC_H
#define TPT_ALLOC_H

#include "tp_test.h"
#include "tpt_alloc_count.h"

/* Returns 1 if the counter works here; skips the test (returns 0) only where
 * the interposer is known not to be in charge; fails otherwise. */
static inline int tpt_alloc_counting_or_skip(void) {
    if (tpt_alloc_probe()) return 1;
    const char *why = tpt_alloc_unavailable();
    if (why == NULL)
        fail_msg("the malloc interposer is compiled in but counts nothing: the "
                 "allocation checks would pass without checking");
    print_message("allocation counting unavailable (%s): skipped\n", why);
    skip();
    return 0;
}

/* Fails the test if anything was allocated since tpt_alloc_arm(), naming
 * `what` was measured and the first allocation. */
static inline void tpt_alloc_assert_none(const char *what) {
    long n = tpt_alloc_count();
    if (n == 0) return;
    tpt_alloc_first first = tpt_alloc_first_get();
    fail_msg("%ld heap allocation(s) during %s; first: %s of %zu bytes, called from %p", n, what,
             tpt_alloc_kind_name(first.kind), first.size, first.caller);
}

#endif /* TPT_ALLOC_H */
