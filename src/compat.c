/*
 * compat.c -- the 1.0 entry points of the calls whose structs grew in 1.1.
 *
 * Version 1.1 gave tp_config, tp_task_opts and tp_stats a reserved tail (see
 * "How the structs grow" in taskpool.h), so they are larger than in 1.0. A
 * program built against 1.0 passes (or receives) the 1.0 layout, which is the
 * 1.1 layout without its tail. The shared library therefore exports every
 * call that reads or writes one of these structs twice, with ELF symbol
 * versions (taskpool.map):
 *
 *   name@@TASKPOOL_1.1  the default, what programs linked against 1.1 bind to
 *   name@TASKPOOL_1.0   the wrappers below, for programs linked against 1.0
 *
 * A program linked against 1.0 -- whose library had no version script, so its
 * references carry no version -- binds to the TASKPOOL_1.0 definition: the
 * dynamic linker gives an unversioned reference the oldest version node. Each
 * wrapper copies the 1.0 prefix into a zeroed 1.1 struct (reserved words zero,
 * meaning "the default") or copies the 1.1 result back as far as the 1.0
 * layout goes, then calls the 1.1 function. Nothing else differs.
 *
 * Only the shared library on ELF platforms has symbol versions; the static
 * library is always linked with the header it was built with and leaves this
 * file empty. tests/abi/ checks both the versions (a program built against
 * the 1.0 release, run on this library) and the layout (abidiff).
 *
 * Layer 0 (pool.h): above pool.c, stats.c and default.c, whose public
 * functions are all it calls. No lock, no state.
 */
#include "base.h" /* first: it defines _GNU_SOURCE */
#include <stddef.h>
#include <string.h>

#if defined(TP__SYMVER)

/* The 1.0 layouts, frozen: the 1.1 structs are these plus a reserved tail.
 * Every field must sit at the same offset in both, which the asserts below
 * check on whatever ABI this is built for (on x86-64 the 1.0 sizes are 112,
 * 48 and 136 bytes; on i386 84, 36 and 136). */
typedef struct tp__config_1_0 {
    unsigned workers, max_workers, queue_capacity, max_per_user;
    uint64_t run_timeout_ns, submit_timeout_ns, drain_timeout_ns, idle_timeout_ns;
    unsigned max_retries;
    uint64_t retry_delay_ns;
    const char *name;
    tp_log_fn log;
    void *log_arg;
    void (*on_worker_start)(void *hook_arg);
    void (*on_worker_stop)(void *hook_arg);
    void *hook_arg;
} tp__config_1_0;

typedef struct tp__opts_1_0 {
    const char *user;
    uint64_t run_timeout_ns, deadline_ns;
    tp_done_fn on_done;
    const char *log_id;
    int priority;
} tp__opts_1_0;

typedef struct tp__stats_1_0 {
    uint64_t submitted, accepted, rejected;
    uint64_t rejected_full, rejected_user, rejected_closed, rejected_timeout;
    uint64_t started, retried, completed, succeeded, failed, cancelled, expired;
    uint32_t active, queued, delayed, workers, idle, users;
} tp__stats_1_0;

#define TP__SAME_OFFSET(old, new, field)                                                                     \
    _Static_assert(offsetof(old, field) == offsetof(new, field), #new "." #field " moved since 1.0")
TP__SAME_OFFSET(tp__config_1_0, tp_config, max_per_user);
TP__SAME_OFFSET(tp__config_1_0, tp_config, run_timeout_ns);
TP__SAME_OFFSET(tp__config_1_0, tp_config, idle_timeout_ns);
TP__SAME_OFFSET(tp__config_1_0, tp_config, max_retries);
TP__SAME_OFFSET(tp__config_1_0, tp_config, retry_delay_ns);
TP__SAME_OFFSET(tp__config_1_0, tp_config, name);
TP__SAME_OFFSET(tp__config_1_0, tp_config, log_arg);
TP__SAME_OFFSET(tp__config_1_0, tp_config, hook_arg);
TP__SAME_OFFSET(tp__opts_1_0, tp_task_opts, run_timeout_ns);
TP__SAME_OFFSET(tp__opts_1_0, tp_task_opts, on_done);
TP__SAME_OFFSET(tp__opts_1_0, tp_task_opts, log_id);
TP__SAME_OFFSET(tp__opts_1_0, tp_task_opts, priority);
TP__SAME_OFFSET(tp__stats_1_0, tp_stats, rejected_timeout);
TP__SAME_OFFSET(tp__stats_1_0, tp_stats, expired);
TP__SAME_OFFSET(tp__stats_1_0, tp_stats, active);
TP__SAME_OFFSET(tp__stats_1_0, tp_stats, users);
_Static_assert(sizeof(tp__config_1_0) <= offsetof(tp_config, reserved),
               "tp_config's tail overlaps 1.0 fields");
_Static_assert(sizeof(tp__opts_1_0) <= offsetof(tp_task_opts, reserved),
               "tp_task_opts' tail overlaps 1.0 fields");
_Static_assert(sizeof(tp__stats_1_0) <= offsetof(tp_stats, reserved), "tp_stats' tail overlaps 1.0 fields");

#define TP__CONFIG_1_0 sizeof(tp__config_1_0)
#define TP__OPTS_1_0   sizeof(tp__opts_1_0)
#define TP__STATS_1_0  sizeof(tp__stats_1_0)

#define TP__EXPORT                 __attribute__((visibility("default"), used))
#define TP__SYMVER_1_0(impl, name) __asm__(".symver " #impl "," #name "@TASKPOOL_1.0")

static const tp_config *config_1_0(tp_config *tmp, const tp_config *old) {
    if (!old) return NULL;
    memset(tmp, 0, sizeof *tmp);
    memcpy(tmp, old, TP__CONFIG_1_0);
    return tmp;
}

static const tp_task_opts *opts_1_0(tp_task_opts *tmp, const tp_task_opts *old) {
    if (!old) return NULL;
    memset(tmp, 0, sizeof *tmp);
    memcpy(tmp, old, TP__OPTS_1_0);
    return tmp;
}

TP__EXPORT int tp__create_1_0(tp_pool **out, const tp_config *cfg);
TP__EXPORT int tp__default_create_1_0(const tp_config *cfg);
TP__EXPORT int tp__submit_1_0(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out);
TP__EXPORT int tp__submit_wait_1_0(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts,
                                   uint64_t budget_ns, uint64_t *id_out);
TP__EXPORT int tp__default_submit_1_0(tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out);
TP__EXPORT void tp__stats_get_1_0(tp_pool *p, tp_stats *out);
TP__EXPORT int tp__stats_format_1_0(const tp_stats *s, int format, char *buf, size_t len);

int tp__create_1_0(tp_pool **out, const tp_config *cfg) {
    tp_config c;
    return tp_create(out, config_1_0(&c, cfg));
}
TP__SYMVER_1_0(tp__create_1_0, tp_create);

int tp__default_create_1_0(const tp_config *cfg) {
    tp_config c;
    return tp_default_create(config_1_0(&c, cfg));
}
TP__SYMVER_1_0(tp__default_create_1_0, tp_default_create);

int tp__submit_1_0(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    tp_task_opts o;
    return tp_submit(p, fn, arg, opts_1_0(&o, opts), id_out);
}
TP__SYMVER_1_0(tp__submit_1_0, tp_submit);

int tp__submit_wait_1_0(tp_pool *p, tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t budget_ns,
                        uint64_t *id_out) {
    tp_task_opts o;
    return tp_submit_wait(p, fn, arg, opts_1_0(&o, opts), budget_ns, id_out);
}
TP__SYMVER_1_0(tp__submit_wait_1_0, tp_submit_wait);

int tp__default_submit_1_0(tp_fn fn, void *arg, const tp_task_opts *opts, uint64_t *id_out) {
    tp_task_opts o;
    return tp_default_submit(fn, arg, opts_1_0(&o, opts), id_out);
}
TP__SYMVER_1_0(tp__default_submit_1_0, tp_default_submit);

void tp__stats_get_1_0(tp_pool *p, tp_stats *out) {
    if (!p || !out) return;
    tp_stats s;
    tp_stats_get(p, &s);
    memcpy(out, &s, TP__STATS_1_0);
}
TP__SYMVER_1_0(tp__stats_get_1_0, tp_stats_get);

int tp__stats_format_1_0(const tp_stats *s, int format, char *buf, size_t len) {
    if (!s) return tp_stats_format(NULL, format, buf, len);
    tp_stats full;
    memset(&full, 0, sizeof full);
    memcpy(&full, s, TP__STATS_1_0);
    return tp_stats_format(&full, format, buf, len);
}
TP__SYMVER_1_0(tp__stats_format_1_0, tp_stats_format);

#else
typedef int tp__compat_unused; /* ISO C forbids an empty translation unit */
#endif /* TP__SYMVER */
