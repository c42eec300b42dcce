/*
 * redis_conn.h -- where Redis is and how to log in: REDIS_URL with optional
 * credentials, REDIS_PASSWORD, and a connect that authenticates.
 *
 *   redis://[user[:password]@]host[:port]     (port 6379; IPv6 as [::1])
 *   unix://[user[:password]@]/absolute/path
 *
 * User and password may be percent-encoded (%40 for '@'). REDIS_PASSWORD
 * gives the password without putting it in a process listing; giving it in
 * both places is refused. No TLS: put stunnel or a local proxy in front (see
 * the README). Shared by taskpool-stream-worker and taskpool-enqueue.
 */
#ifndef TPS_REDIS_CONN_H
#define TPS_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stddef.h>

typedef struct tps_redis_addr {
    char host[256]; /* host name or address; the socket path when port is 0 */
    int port;       /* 0: unix socket */
    char user[128]; /* "" -> the default user */
    char password[256];
    int has_password;
    char shown[448]; /* the URL with the password replaced by "***": for logs */
} tps_redis_addr;

/* Parse `url` (NULL or "" -> redis://127.0.0.1:6379); `env_password` is
 * REDIS_PASSWORD's value or NULL. 0, or -1 with a one-line reason in err that
 * never contains the password. */
int tps_redis_parse(const char *url, const char *env_password, tps_redis_addr *a, char *err, size_t errlen);

/* Connect (connect timeout and command timeout in ms), enable TCP keepalive,
 * and AUTH when credentials are given. The context, or NULL with the reason
 * in err -- the server's own error text when it refused (WRONGPASS, ...). */
redisContext *tps_redis_connect(const tps_redis_addr *a, int connect_timeout_ms, int command_timeout_ms,
                                char *err, size_t errlen);

#endif
