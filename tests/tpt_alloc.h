/*
 * tpt_alloc.h -- count the heap allocations of a test executable.
 *
 * Included by one translation unit of an executable (test_alloc.c,
 * test_batch.c): it defines malloc, calloc, realloc, free and the aligned
 * variants, forwarding to glibc's __libc_* entry points. While `armed` is
 * set every allocation is counted in `n_alloc` (with the size and caller of
 * the first one, to help whoever has to find it).
 *
 * counting_or_skip() says whether counting works in this process: it skips
 * the test only where something else is known to own malloc (a sanitizer,
 * valgrind, a C library without __libc_*), and fails where the interposer is
 * compiled in but counts nothing.
 */
#ifndef TPT_ALLOC_H
#define TPT_ALLOC_H

#include <errno.h>
#include <malloc.h>

#include "tp_test.h"

static atomic_int armed;
static atomic_long n_alloc;
static _Atomic size_t first_size;
static void *_Atomic first_caller;
static atomic_int first_kind; /* 1 malloc 2 calloc 3 realloc 4 memalign */

#if !TPT_SANITIZED && defined(__GLIBC__)
#define TPT_INTERPOSE 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

static inline void count(int kind, size_t size, void *caller) {
    if (atomic_load_explicit(&armed, memory_order_relaxed)) {
        if (atomic_fetch_add(&n_alloc, 1) == 0) {
            atomic_store(&first_size, size);
            atomic_store(&first_caller, caller);
            atomic_store(&first_kind, kind);
        }
    }
}

void *malloc(size_t n) {
    count(1, n, __builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    count(2, a * b, __builtin_return_address(0));
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    count(3, n, __builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n) {
    count(4, n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
    count(4, n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
int posix_memalign(void **r, size_t a, size_t n) {
    if (a < sizeof(void *) || (a & (a - 1)) != 0) return EINVAL;
    count(4, n, __builtin_return_address(0));
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *r = p;
    return 0;
}
void *valloc(size_t n) {
    count(4, n, __builtin_return_address(0));
    return __libc_valloc(n);
}
void *pvalloc(size_t n) {
    count(4, n, __builtin_return_address(0));
    return __libc_pvalloc(n);
}
#else
#define TPT_INTERPOSE 0
#endif

/* ------------------------------------------------------------ is it counting? */

/* Whether valgrind runs this process: its preload library is mapped. */
static int under_valgrind(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    if (m == NULL) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, m) != NULL) found = strstr(line, "vgpreload") != NULL;
    fclose(m);
    return found;
}

/* Why this process cannot count allocations, or NULL if it must. */
static const char *counting_unavailable(void) {
    if (TPT_SANITIZED) return "a sanitizer owns malloc (the interposer is not compiled)";
    if (!TPT_INTERPOSE) return "not glibc: no __libc_malloc to forward to";
    if (under_valgrind()) return "valgrind replaces malloc";
    return NULL;
}

/* The allocation functions as other code reaches them: through the symbol.
 * A direct call from this file may be inlined into the definition above and
 * never reach the symbol -- valgrind replaces that, and a probe calling
 * malloc() directly would then see a counter the library's calls never move. */
static __attribute__((unused)) void *(*volatile sym_malloc)(size_t) = malloc;
static __attribute__((unused)) void *(*volatile sym_calloc)(size_t, size_t) = calloc;
static __attribute__((unused)) void *(*volatile sym_realloc)(void *, size_t) = realloc;
static __attribute__((unused)) void *(*volatile sym_aligned_alloc)(size_t, size_t) = aligned_alloc;
static __attribute__((unused)) int (*volatile sym_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static __attribute__((unused)) void *(*volatile sym_memalign)(size_t, size_t) = memalign;
static __attribute__((unused)) void (*volatile sym_free)(void *) = free;

/* Whether our malloc really is the one called. */
static int interposer_active(void) {
    if (!TPT_INTERPOSE) return 0;
    atomic_store(&n_alloc, 0);
    atomic_store(&armed, 1);
    void *volatile x = sym_malloc(40);
    char *volatile y = sym_calloc(2, 8);
    atomic_store(&armed, 0);
    sym_free(x);
    sym_free(y);
    long n = atomic_load(&n_alloc);
    atomic_store(&n_alloc, 0);
    return n >= 2;
}

/* Returns 1 if the counter works here; skips the test (returns 0) only where
 * the interposer is known not to be in charge; fails otherwise. */
static int counting_or_skip(void) {
    if (interposer_active()) return 1;
    const char *why = counting_unavailable();
    if (why == NULL)
        fail_msg("the malloc interposer is compiled in but counts nothing: the "
                 "allocation checks would pass without checking");
    print_message("allocation counting unavailable (%s): skipped\n", why);
    skip();
    return 0;
}

#endif /* TPT_ALLOC_H */
