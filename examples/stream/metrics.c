/*
 * metrics.c -- GET /metrics over HTTP/1.0-style one-shot connections.
 */
#define _GNU_SOURCE
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "config.h" /* svc_parse_uint */

#define BODY_MAX (64 * 1024)

struct metrics_server {
    int fd;
    int stop[2];
    pthread_t thread;
    metrics_render_fn render;
    void *arg;
    char body[BODY_MAX];
};

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void serve(metrics_server *m, int fd) {
    struct timeval tv = {.tv_sec = 1, .tv_usec = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1) {
        ssize_t r = recv(fd, req + n, sizeof req - 1 - n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n") != NULL || strstr(req, "\n\n") != NULL) break;
    }
    req[n] = '\0';
    char head[256];
    if (strncmp(req, "GET /metrics ", 13) == 0 || strncmp(req, "GET /metrics?", 13) == 0) {
        int len = m->render(m->arg, m->body, sizeof m->body);
        if (len < 0 || (size_t)len >= sizeof m->body) len = 0;
        int h = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         "Content-Length: %d\r\nConnection: close\r\n\r\n",
                         len);
        send_all(fd, head, (size_t)h);
        send_all(fd, m->body, (size_t)len);
    } else {
        static const char nf[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n"
                                 "Connection: close\r\n\r\nnot found\n";
        send_all(fd, nf, sizeof nf - 1);
    }
    close(fd);
}

static void *loop(void *arg) {
    metrics_server *m = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = m->fd, .events = POLLIN}, {.fd = m->stop[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        if (pf[1].revents) return NULL;
        if (pf[0].revents & POLLIN) {
            int fd = accept4(m->fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                serve(m, fd);
            else if (errno == EMFILE || errno == ENFILE)
                (void)poll(NULL, 0, 50);
        }
    }
}

metrics_server *metrics_start(const char *addr, metrics_render_fn render, void *arg, char *bound,
                              size_t boundlen, char *err, size_t errlen) {
    const char *colon = strrchr(addr, ':');
    char host[256];
    unsigned port;
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host ||
        svc_parse_uint(colon + 1, 0, 65535, &port) != 0) {
        snprintf(err, errlen, "METRICS_ADDR=\"%s\": expected host:port", addr);
        return NULL;
    }
    size_t hlen = (size_t)(colon - addr);
    const char *h = addr;
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int rc = getaddrinfo(hlen > 0 ? host : NULL, portstr, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "METRICS_ADDR=\"%s\": %s", addr, gai_strerror(rc));
        return NULL;
    }
    metrics_server *m = calloc(1, sizeof *m);
    if (m == NULL) {
        freeaddrinfo(ai);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->fd = -1;
    int saved = 0;
    for (struct addrinfo *a = ai; a != NULL && m->fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 16) == 0) {
            m->fd = fd;
        } else {
            saved = errno;
            close(fd);
        }
    }
    freeaddrinfo(ai);
    if (m->fd < 0) {
        snprintf(err, errlen, "METRICS_ADDR=\"%s\": %s", addr, strerror(saved));
        free(m);
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned p = 0;
    if (getsockname(m->fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof ip);
            p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            snprintf(bound, boundlen, "%s:%u", ip, p);
        } else {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof ip);
            p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            snprintf(bound, boundlen, "[%s]:%u", ip, p);
        }
    }
    m->render = render;
    m->arg = arg;
    if (pipe2(m->stop, O_CLOEXEC) != 0 || pthread_create(&m->thread, NULL, loop, m) != 0) {
        snprintf(err, errlen, "cannot start the metrics thread");
        close(m->fd);
        free(m);
        return NULL;
    }
    return m;
}

void metrics_stop(metrics_server *m) {
    if (m == NULL) return;
    if (write(m->stop[1], "x", 1) < 0) {
        /* a fresh pipe cannot be full */
    }
    pthread_join(m->thread, NULL);
    close(m->fd);
    close(m->stop[0]);
    close(m->stop[1]);
    free(m);
}
