/*
 * error.c -- error messages and names, and the version string.
 *
 * Both tables are generated from TP_ERRNO_MAP in taskpool.h, so a code cannot
 * exist without its message and name.
 *
 * Layer: the bottom (6 in pool.h): every file may call tp__assert_fail; it
 * calls nothing. No locks.
 */
#include "base.h"

#define TP__STR2(x) #x
#define TP__STR(x)  TP__STR2(x)

const char *tp_version(void) {
    return TP__STR(TP_VERSION_MAJOR) "." TP__STR(TP_VERSION_MINOR) "." TP__STR(TP_VERSION_PATCH);
}

const char *tp_strerror(int err) {
    switch (err) {
    case TP_OK: return "success";
#define TP__MSG(name, value, msg)                                                                            \
    case TP_##name: return msg;
        TP_ERRNO_MAP(TP__MSG)
#undef TP__MSG
    default: return "unknown error";
    }
}

const char *tp_err_name(int err) {
    switch (err) {
    case TP_OK: return "TP_OK";
#define TP__NAME(name, value, msg)                                                                           \
    case TP_##name: return "TP_" #name;
        TP_ERRNO_MAP(TP__NAME)
#undef TP__NAME
    default: return "TP_UNKNOWN";
    }
}

#if defined(TP__DEBUG)
#include <stdio.h>
#include <stdlib.h>

void tp__assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "taskpool: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}
#endif
