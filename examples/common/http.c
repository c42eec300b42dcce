/*
 * http.c -- request-head parsing and response writing (see http.h).
 *
 * The character classes are RFC 3986's (request-target, Host) and RFC 9110's
 * (tokens); every check is a plain scan of a NUL-terminated piece of the head,
 * which the parser has already cut out with NULs.
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

size_t http_head_end(const char *buf, size_t len, size_t *scanned, int *bad) {
    for (size_t i = *scanned; i < len; i++) {
        char ch = buf[i];
        if (ch == '\0' || (ch == '\n' && (i == 0 || buf[i - 1] != '\r')) ||
            (ch != '\n' && i > 0 && buf[i - 1] == '\r')) {
            *bad = 1;
            return 0;
        }
        if (ch == '\n' && i >= 3 && buf[i - 2] == '\n') return i + 1; /* \r\n\r\n */
    }
    *scanned = len;
    return 0;
}

static int is_alnum(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* RFC 9110 token characters (method, header names). */
static int is_tchar(unsigned char c) {
    return is_alnum(c) || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* RFC 3986 unreserved and sub-delims: what a reg-name holds besides %XX. */
static int is_regname(unsigned char c) {
    return is_alnum(c) || (c != '\0' && strchr("-._~!$&'()*+,;=", c) != NULL);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A percent-encoded octet at s ("%" HEXDIG HEXDIG)? */
static int is_pct(const char *s) { return s[0] == '%' && hexval(s[1]) >= 0 && hexval(s[2]) >= 0; }

/* path-abempty [ "?" query ] (RFC 3986): pchar and "/", and "?" once the
 * query has begun. No fragment, no space, no byte outside ASCII. */
static int valid_path_query(const char *s) {
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '%') {
            if (!is_pct(s)) return 0;
            s += 2;
        } else if (!is_regname(c) && c != ':' && c != '@' && c != '/' && c != '?') {
            return 0;
        }
    }
    return 1;
}

/* uri-host [ ":" port ] (RFC 9110 section 7.2), host non-empty if `need`.
 * An IP literal is checked for its characters only. */
static int valid_authority(const char *s, int need) {
    const char *h = s;
    if (*s == '[') {
        for (s++; is_regname((unsigned char)*s) || *s == ':'; s++) {
        }
        if (*s != ']' || s == h + 1) return 0;
        s++;
    } else {
        for (; *s != '\0' && *s != ':'; s++) {
            if (*s == '%' && is_pct(s))
                s += 2;
            else if (!is_regname((unsigned char)*s))
                return 0;
        }
    }
    if (need && s == h) return 0;
    if (*s == ':')
        for (s++; *s >= '0' && *s <= '9'; s++) {
        }
    return *s == '\0';
}

static int valid_request_id(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > HTTP_REQID_MAX) return 0;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (!(is_alnum(c) || c == '-' || c == '_' || c == '.' || c == ':')) return 0;
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

static int refuse(http_request *req, int status, const char *why) {
    req->error = why;
    return status;
}

/* The request-target (RFC 9112 section 3.2): origin-form, absolute-form
 * with an http(s) URI (its authority replaces Host, which must still be
 * there), authority-form or "*" (legal only with CONNECT and OPTIONS: httpd.c
 * answers the other methods 400, and OPTIONS * 404, as no route is "*").
 * Splits path and query in place. */
static int parse_target(char *target, http_request *req) {
    char *path = target;
    if (target[0] == '/') {
        req->form = HTTP_FORM_ORIGIN;
    } else if (strcmp(target, "*") == 0) {
        req->form = HTTP_FORM_ASTERISK;
        req->path = target;
        return 0;
    } else if (strncasecmp(target, "http://", 7) == 0 || strncasecmp(target, "https://", 8) == 0) {
        req->form = HTTP_FORM_ABSOLUTE;
        char *auth = strchr(target, ':') + 3;
        path = auth + strcspn(auth, "/?");
        char saved = *path;
        *path = '\0';
        int ok = valid_authority(auth, 1); /* an empty host or userinfo ('@') is invalid */
        *path = saved;
        if (!ok) return -1;
    } else {
        req->form = HTTP_FORM_AUTHORITY;
        req->path = target;
        return valid_authority(target, 1) && strchr(target, ':') != NULL ? 0 : -1;
    }
    if (!valid_path_query(path)) return -1;
    char *q = strchr(path, '?');
    if (q != NULL) {
        req->query = q + 1;
        if (q == path) { /* "http://host?query": the path is "/" */
            req->path = "/";
            return 0;
        }
        *q = '\0';
    }
    req->path = *path != '\0' ? path : "/";
    return 0;
}

int http_parse_head(char *buf, size_t len, http_request *req) {
    memset(req, 0, sizeof *req);
    req->query = "";
    if (len < 4 || memcmp(buf + len - 4, "\r\n\r\n", 4) != 0)
        return refuse(req, 400, "malformed request head");
    size_t scanned = 0;
    int bad = 0;
    if (http_head_end(buf, len, &scanned, &bad) != len || bad)
        return refuse(req, 400, "malformed request head (a NUL, or CR and LF not paired)");
    buf[len - 2] = '\0'; /* the final CRLF: every line below ends in \r\n */

    /* Request line: method SP request-target SP HTTP-version, one SP each. */
    char *line = buf, *eol = strstr(line, "\r\n");
    *eol = '\0';
    char *sp1 = strchr(line, ' ');
    if (sp1 == NULL) return refuse(req, 400, "malformed request line");
    *sp1 = '\0';
    req->method = line;
    if (*line == '\0') return refuse(req, 400, "malformed request line");
    for (const char *m = line; *m != '\0'; m++)
        if (!is_tchar((unsigned char)*m)) return refuse(req, 400, "malformed method");
    char *target = sp1 + 1, *sp2 = strchr(target, ' ');
    if (sp2 == NULL) return refuse(req, 400, "malformed request line");
    *sp2 = '\0';
    req->target = target;
    const char *v = sp2 + 1;
    /* HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive, nothing after. */
    if (strlen(v) != 8 || strncmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return refuse(req, 400, "malformed HTTP version");
    if (v[5] != '1') return refuse(req, 505, "HTTP/1.0 or HTTP/1.1 only");
    req->minor = v[7] == '0' ? 0 : 1;
    req->keep_alive = req->minor >= 1;
    if (parse_target(target, req) != 0) return refuse(req, 400, "invalid request target");

    /* Header lines: name ":" OWS value OWS */
    int have_length = 0, host_count = 0;
    for (line = eol + 2; *line != '\0'; line = eol + 2) {
        eol = strstr(line, "\r\n");
        *eol = '\0';
        char *colon = strchr(line, ':');
        if (colon == NULL || colon == line) /* also obsolete line folding (a line starting with SP) */
            return refuse(req, 400, "malformed header line");
        for (const char *n = line; n < colon; n++)
            if (!is_tchar((unsigned char)*n)) return refuse(req, 400, "malformed header name");
        *colon = '\0';
        char *value = colon + 1, *vend = eol;
        while (*value == ' ' || *value == '\t') value++;
        while (vend > value && (vend[-1] == ' ' || vend[-1] == '\t')) *--vend = '\0';
        for (const char *c = value; *c != '\0'; c++)
            if (((unsigned char)*c < ' ' && *c != '\t') || (unsigned char)*c == 0x7f)
                return refuse(req, 400, "control character in a header value");
        if (strcasecmp(line, "Connection") == 0) {
            if (list_has(value, "close"))
                req->keep_alive = 0;
            else if (list_has(value, "keep-alive"))
                req->keep_alive = 1;
        } else if (strcasecmp(line, "Content-Length") == 0) {
            uint64_t n = 0;
            if (*value == '\0') return refuse(req, 400, "malformed Content-Length");
            for (const char *d = value; *d != '\0'; d++) {
                if (*d < '0' || *d > '9' || n > (UINT64_MAX - 9) / 10)
                    return refuse(req, 400, "malformed Content-Length");
                n = n * 10 + (uint64_t)(*d - '0');
            }
            if (have_length && n != req->content_length) /* a request-smuggling shape */
                return refuse(req, 400, "conflicting Content-Length headers");
            have_length = 1;
            req->content_length = n;
        } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
            req->chunked = 1;
        } else if (strcasecmp(line, "Host") == 0) {
            host_count++;
            if (!valid_authority(value, 0)) return refuse(req, 400, "invalid Host header");
        } else if (strcasecmp(line, "X-Request-Id") == 0) {
            if (valid_request_id(value)) req->request_id = value;
        }
    }
    if (req->chunked && have_length) return refuse(req, 400, "Content-Length with Transfer-Encoding");
    /* RFC 9112 section 3.2: exactly one Host in HTTP/1.1, at most one in 1.0. */
    if (host_count > 1) return refuse(req, 400, "more than one Host header");
    if (req->minor >= 1 && host_count == 0) return refuse(req, 400, "missing Host header");
    return 0;
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
