/*
 * http.c -- request-head parsing and response writing (see http.h).
 */
#define _GNU_SOURCE
#include "http.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "taskpool.h"

size_t http_head_length(const char *buf, size_t len) {
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    return end == NULL ? 0 : (size_t)(end - buf) + 4;
}

/* RFC 9110 token characters (method, header names). */
static int is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static int valid_request_id(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > HTTP_REQID_MAX) return 0;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '_' || c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

/* Does the comma-separated list `v` contain `token` (case-insensitive)? */
static int list_has(const char *v, const char *token) {
    size_t tn = strlen(token);
    while (*v != '\0') {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        const char *start = v;
        while (*v != '\0' && *v != ',') v++;
        const char *end = v;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if ((size_t)(end - start) == tn && strncasecmp(start, token, tn) == 0) return 1;
    }
    return 0;
}

int http_parse_head(char *buf, size_t len, http_request *req) {
    memset(req, 0, sizeof *req);
    req->query = "";
    if (len < 4 || memchr(buf, '\0', len) != NULL) return 400;
    buf[len - 2] = '\0'; /* the final CRLF: every line below ends in \r\n */

    /* Request line: METHOD SP target SP HTTP/1.x */
    char *line = buf, *eol = strstr(line, "\r\n");
    if (eol == NULL) return 400;
    *eol = '\0';
    char *sp1 = strchr(line, ' ');
    if (sp1 == NULL || sp1 == line) return 400;
    *sp1 = '\0';
    for (const char *m = line; *m != '\0'; m++)
        if (!is_tchar((unsigned char)*m)) return 400;
    char *target = sp1 + 1, *sp2 = strchr(target, ' ');
    if (sp2 == NULL || target[0] != '/') return 400;
    *sp2 = '\0';
    const char *version = sp2 + 1;
    if (strncmp(version, "HTTP/", 5) != 0) return 400;
    if (strcmp(version, "HTTP/1.1") == 0)
        req->minor = 1;
    else if (strcmp(version, "HTTP/1.0") == 0)
        req->minor = 0;
    else
        return 505;
    for (const char *t = target; *t != '\0'; t++)
        if ((unsigned char)*t <= ' ' || (unsigned char)*t == 0x7f) return 400;
    req->method = line;
    char *q = strchr(target, '?');
    if (q != NULL) {
        *q = '\0';
        req->query = q + 1;
    }
    req->path = target;
    req->keep_alive = req->minor >= 1;

    /* Header lines: name ":" OWS value OWS */
    int have_length = 0;
    for (line = eol + 2; *line != '\0'; line = eol + 2) {
        eol = strstr(line, "\r\n");
        if (eol == NULL) return 400;
        *eol = '\0';
        char *colon = strchr(line, ':');
        if (colon == NULL || colon == line)
            return 400; /* also rejects obsolete line folding (a line starting with SP) */
        for (const char *n = line; n < colon; n++)
            if (!is_tchar((unsigned char)*n)) return 400;
        *colon = '\0';
        char *value = colon + 1, *vend = eol;
        while (*value == ' ' || *value == '\t') value++;
        while (vend > value && (vend[-1] == ' ' || vend[-1] == '\t')) *--vend = '\0';
        for (const char *v = value; *v != '\0'; v++)
            if (((unsigned char)*v < ' ' && *v != '\t') || (unsigned char)*v == 0x7f) return 400;
        if (strcasecmp(line, "Connection") == 0) {
            if (list_has(value, "close"))
                req->keep_alive = 0;
            else if (list_has(value, "keep-alive"))
                req->keep_alive = 1;
        } else if (strcasecmp(line, "Content-Length") == 0) {
            uint64_t n = 0;
            if (*value == '\0') return 400;
            for (const char *d = value; *d != '\0'; d++) {
                if (*d < '0' || *d > '9' || n > (UINT64_MAX - 9) / 10) return 400;
                n = n * 10 + (uint64_t)(*d - '0');
            }
            if (have_length && n != req->content_length)
                return 400; /* conflicting lengths: a request-smuggling shape */
            have_length = 1;
            req->content_length = n;
        } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
            req->chunked = 1;
        } else if (strcasecmp(line, "Host") == 0) {
            req->host_count++;
        } else if (strcasecmp(line, "X-Request-Id") == 0) {
            if (valid_request_id(value)) req->request_id = value;
        }
    }
    if (req->chunked && have_length) return 400;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int http_query_get(const char *query, const char *name, char *out, size_t outlen) {
    size_t nlen = strlen(name);
    const char *p = query;
    while (*p != '\0') {
        const char *amp = strchr(p, '&');
        const char *end = amp != NULL ? amp : p + strlen(p);
        if ((size_t)(end - p) >= nlen && strncmp(p, name, nlen) == 0 && (p + nlen == end || p[nlen] == '=')) {
            const char *v = p + nlen < end ? p + nlen + 1 : end;
            size_t o = 0;
            for (; v < end; v++) {
                int c = (unsigned char)*v;
                if (c == '%') {
                    if (end - v < 3 || hexval(v[1]) < 0 || hexval(v[2]) < 0) return -1;
                    c = hexval(v[1]) * 16 + hexval(v[2]);
                    v += 2;
                    if (c == 0) return -1;
                } else if (c == '+') {
                    c = ' ';
                }
                if (o + 1 >= outlen) return -1;
                out[o++] = (char)c;
            }
            out[o] = '\0';
            return 1;
        }
        p = amp != NULL ? amp + 1 : end;
    }
    return 0;
}

int http_query_check(const char *query, const char *const *allowed, char *bad, size_t badlen) {
    const char *p = query;
    if (*p == '\0') return 0;
    for (;;) {
        size_t n = strcspn(p, "=&");
        int known = 0;
        for (size_t i = 0; n > 0 && allowed != NULL && allowed[i] != NULL; i++)
            if (strlen(allowed[i]) == n && strncmp(p, allowed[i], n) == 0) known = 1;
        /* Repeated: the same name earlier in the query (?delay=1s&delay=2s
         * would be read as whichever the parser meets first). */
        for (const char *q = query; known && q < p;) {
            size_t m = strcspn(q, "=&");
            if (m == n && strncmp(q, p, n) == 0) known = 0;
            q += strcspn(q, "&");
            q += *q == '&';
        }
        if (!known) {
            size_t k = n < badlen - 1 ? n : badlen - 1;
            memcpy(bad, p, k);
            bad[k] = '\0';
            return -1;
        }
        p += strcspn(p, "&");
        if (*p == '\0') return 0;
        p++;
    }
}

const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

int http_send_all(int fd, const char *buf, size_t len, uint64_t deadline_ns, int cancel_fd) {
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1; /* EPIPE, ECONNRESET, ...: the peer is gone */
        uint64_t now = tp_now_ns();
        if (now >= deadline_ns) return -1;
        uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
        struct pollfd pf[2] = {{.fd = fd, .events = POLLOUT}, {.fd = cancel_fd, .events = POLLIN}};
        int r = poll(pf, 2, left_ms > 1000 ? 1000 : (int)left_ms);
        if (r < 0 && errno != EINTR) return -1;
        if (r > 0 && (pf[1].revents & POLLIN)) return -1;
    }
    return 0;
}

size_t http_format_response(char *out, size_t cap, int status, const char *content_type, const char *body,
                            size_t body_len, const char *extra, int keep_alive, int minor, int head_only) {
    const char *conn = !keep_alive ? "Connection: close\r\n" : minor == 0 ? "Connection: keep-alive\r\n" : "";
    int n = snprintf(out, cap, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n",
                     status, http_reason(status), content_type, body_len, extra != NULL ? extra : "", conn);
    if (n < 0 || (size_t)n >= cap) return 0;
    if (head_only) /* the head alone: the body, if any, is the caller's to send */
        return (size_t)n;
    if (body_len > cap - (size_t)n) return 0;
    memcpy(out + n, body, body_len);
    return (size_t)n + body_len;
}
