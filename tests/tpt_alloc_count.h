/*
 * tpt_alloc_count.h -- count the heap allocations of a process: the malloc
 * interposer shared by the tests (through tpt_alloc.h: test_alloc.c,
 * test_batch.c) and the bench (bench/allocs.c).
 *
 * Where it lives, and why. Both the tests' "no allocation per task" checks
 * and the bench's allocs/task figure need the same instrument, so there is
 * one copy, in tests/ with the other test instruments (hence its tpt_
 * prefix). It uses libc only -- no cmocka, no tp_test.h -- because the bench
 * must build where cmocka is absent; the bench includes it by its relative
 * path ("../tests/tpt_alloc_count.h"), which needs no include directory that
 * would also expose tp_test.h to it, and tests/ is in every source tree the
 * bench is built from. What depends on cmocka (skip or fail a test) stays in
 * tests/tpt_alloc.h.
 *
 * Use: include it from exactly one translation unit of an executable. It
 * defines malloc, calloc, realloc, free and the aligned variants, forwarding
 * to glibc's __libc_* entry points (no dlsym(), so nothing allocates while
 * resolving the real functions). glibc lets an executable's definitions
 * interpose every caller's, the statically linked library's included (a
 * shared libtaskpool would be counted too). Between tpt_alloc_arm() and
 * tpt_alloc_disarm() every allocation in the process is counted, and the
 * kind, size and caller of the first one are kept for whoever has to find
 * it. free is never counted.
 *
 * Where counting cannot work, tpt_alloc_unavailable() says why: a sanitizer
 * owns malloc (the interposer is not compiled under one), a C library without
 * __libc_malloc, or valgrind, which replaces malloc even in the executable
 * (recognised by its preload library in /proc/self/maps). tpt_alloc_probe()
 * checks at run time that an armed malloc, called through its symbol as other
 * code calls it, is seen. A caller that finds the probe failing although no
 * reason applies has a broken interposer, and must say so rather than
 * report a count of 0.
 */
#ifndef TPT_ALLOC_COUNT_H
#define TPT_ALLOC_COUNT_H

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether this build interposes: not under a sanitizer (gcc and clang
 * announce them differently), and only on glibc. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TPT_ALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define TPT_ALLOC_SANITIZED 1
#endif
#endif
#ifndef TPT_ALLOC_SANITIZED
#define TPT_ALLOC_SANITIZED 0
#endif

/* Kinds of allocation, for the first one counted. */
enum { TPT_ALLOC_MALLOC = 1, TPT_ALLOC_CALLOC = 2, TPT_ALLOC_REALLOC = 3, TPT_ALLOC_ALIGNED = 4 };

static atomic_int tpt_alloc_armed_;
static atomic_long tpt_alloc_n_;
static _Atomic size_t tpt_alloc_first_size_;
static void *_Atomic tpt_alloc_first_caller_;
static atomic_int tpt_alloc_first_kind_;

#if !TPT_ALLOC_SANITIZED && defined(__GLIBC__)
#define TPT_ALLOC_INTERPOSE 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

static inline void tpt_alloc_count_(int kind, size_t size, void *caller) {
    /* relaxed: the arming thread reads the count after its own
     * synchronisation with the counting threads (every task ended) */
    if (atomic_load_explicit(&tpt_alloc_armed_, memory_order_relaxed) &&
        atomic_fetch_add_explicit(&tpt_alloc_n_, 1, memory_order_relaxed) == 0) {
        atomic_store_explicit(&tpt_alloc_first_size_, size, memory_order_relaxed);
        atomic_store_explicit(&tpt_alloc_first_caller_, caller, memory_order_relaxed);
        atomic_store_explicit(&tpt_alloc_first_kind_, kind, memory_order_relaxed);
    }
}

void *malloc(size_t n) {
    tpt_alloc_count_(TPT_ALLOC_MALLOC, n, __builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    tpt_alloc_count_(TPT_ALLOC_CALLOC, a * b, __builtin_return_address(0));
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    tpt_alloc_count_(TPT_ALLOC_REALLOC, n, __builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n) {
    tpt_alloc_count_(TPT_ALLOC_ALIGNED, n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
    tpt_alloc_count_(TPT_ALLOC_ALIGNED, n, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
int posix_memalign(void **r, size_t a, size_t n) {
    if (a < sizeof(void *) || (a & (a - 1)) != 0) return EINVAL;
    tpt_alloc_count_(TPT_ALLOC_ALIGNED, n, __builtin_return_address(0));
    void *p = __libc_memalign(a, n);
    if (p == NULL) return ENOMEM;
    *r = p;
    return 0;
}
void *valloc(size_t n) {
    tpt_alloc_count_(TPT_ALLOC_ALIGNED, n, __builtin_return_address(0));
    return __libc_valloc(n);
}
void *pvalloc(size_t n) {
    tpt_alloc_count_(TPT_ALLOC_ALIGNED, n, __builtin_return_address(0));
    return __libc_pvalloc(n);
}
#else
#define TPT_ALLOC_INTERPOSE 0
#endif

/* ------------------------------------------------------------ counting */

/* Start counting from 0. */
static inline void tpt_alloc_arm(void) {
    atomic_store(&tpt_alloc_n_, 0);
    atomic_store(&tpt_alloc_armed_, 1);
}

/* Stop counting; returns the allocations counted since tpt_alloc_arm(). */
static inline long tpt_alloc_disarm(void) {
    atomic_store(&tpt_alloc_armed_, 0);
    return atomic_load(&tpt_alloc_n_);
}

/* The allocations counted since tpt_alloc_arm(), armed or not. */
static inline long tpt_alloc_count(void) { return atomic_load(&tpt_alloc_n_); }

/* The first allocation counted since tpt_alloc_arm() (valid if the count is
 * not 0). */
typedef struct tpt_alloc_first {
    int kind; /* TPT_ALLOC_* */
    size_t size;
    void *caller;
} tpt_alloc_first;

static inline tpt_alloc_first tpt_alloc_first_get(void) {
    tpt_alloc_first f;
    f.kind = atomic_load(&tpt_alloc_first_kind_);
    f.size = atomic_load(&tpt_alloc_first_size_);
    f.caller = atomic_load(&tpt_alloc_first_caller_);
    return f;
}

static inline const char *tpt_alloc_kind_name(int kind) {
    switch (kind) {
    case TPT_ALLOC_MALLOC: return "malloc";
    case TPT_ALLOC_CALLOC: return "calloc";
    case TPT_ALLOC_REALLOC: return "realloc";
    case TPT_ALLOC_ALIGNED: return "an aligned allocation";
    default: return "an allocation";
    }
}

/* ------------------------------------------------------------ is it counting? */

/* The allocation functions as other code reaches them: through the symbol.
 * A direct call from the including file may be inlined into the definitions
 * above and never reach the symbol -- which valgrind, for one, replaces: a
 * probe calling malloc() directly would then see a counter the library's
 * calls never move. The volatile pointers also keep the compiler from pairing
 * a malloc with its free and dropping both. */
static __attribute__((unused)) void *(*volatile tpt_sym_malloc)(size_t) = malloc;
static __attribute__((unused)) void *(*volatile tpt_sym_calloc)(size_t, size_t) = calloc;
static __attribute__((unused)) void *(*volatile tpt_sym_realloc)(void *, size_t) = realloc;
static __attribute__((unused)) void *(*volatile tpt_sym_aligned_alloc)(size_t, size_t) = aligned_alloc;
static
    __attribute__((unused)) int (*volatile tpt_sym_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static __attribute__((unused)) void *(*volatile tpt_sym_memalign)(size_t, size_t) = memalign;
static __attribute__((unused)) void (*volatile tpt_sym_free)(void *) = free;

/* Whether valgrind runs this process: its preload library is mapped. */
static inline int tpt_alloc_under_valgrind(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    if (m == NULL) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, m) != NULL) found = strstr(line, "vgpreload") != NULL;
    fclose(m);
    return found;
}

/* Why this process cannot count allocations, or NULL if it must. */
static inline const char *tpt_alloc_unavailable(void) {
    if (TPT_ALLOC_SANITIZED) return "a sanitizer owns malloc (the interposer is not compiled)";
    if (!TPT_ALLOC_INTERPOSE) return "not glibc: no __libc_malloc to forward to";
    if (tpt_alloc_under_valgrind()) return "valgrind replaces malloc";
    return NULL;
}

/* Whether our malloc really is the one called: an armed malloc and calloc,
 * through their symbols, are both counted. Leaves the count at 0, disarmed. */
static inline int tpt_alloc_probe(void) {
    if (!TPT_ALLOC_INTERPOSE) return 0;
    tpt_alloc_arm();
    void *volatile x = tpt_sym_malloc(40);
    char *volatile y = tpt_sym_calloc(2, 8);
    long n = tpt_alloc_disarm();
    tpt_sym_free(x);
    tpt_sym_free(y);
    atomic_store(&tpt_alloc_n_, 0);
    return n >= 2;
}

#endif /* TPT_ALLOC_COUNT_H */
