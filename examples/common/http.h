/*
 * http.h -- the piece of HTTP/1.1 the examples need: request heads in,
 * responses out. The server around it is httpd.h.
 *
 * Parsing works in place on a complete request head (request line, header
 * lines, empty line) that the server has already read into its buffer:
 * delimiters are overwritten with NULs and the request keeps pointers into
 * the buffer. Only what the examples use is interpreted (method, target,
 * version, Host, Connection, Content-Length, Transfer-Encoding,
 * X-Request-Id); the rest is checked for shape and skipped. Anything
 * malformed is refused with a status code rather than guessed at: the
 * framing rules that keep a request from being read two ways (one
 * Content-Length, never with Transfer-Encoding, no bare CR or LF, no NUL, no
 * obsolete line folding) are RFC 9112's, and so are the request-target forms
 * (origin-form and absolute-form, RFC 3986 characters only) and the rule
 * that an HTTP/1.1 request carries exactly one valid Host.
 *
 * Hand-written, not a library: the examples depend on libc and pthreads
 * only, and this is the whole of what they parse.
 *
 * Sockets are non-blocking; http_send_all waits with poll() against an
 * absolute deadline and an optional cancellation descriptor, retries on EINTR
 * and partial writes, and uses MSG_NOSIGNAL so a vanished peer never raises
 * SIGPIPE.
 */
#ifndef SVC_HTTP_H
#define SVC_HTTP_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_HEAD_MAX  (16 * 1024) /* larger request heads get 431 */
#define HTTP_BODY_MAX  (64 * 1024) /* larger bodies get 413 (the examples read none) */
#define HTTP_REQID_MAX 64          /* longest X-Request-Id taken from a client */

/* The form of the request-target (RFC 9112 section 3.2). */
enum { HTTP_FORM_ORIGIN, HTTP_FORM_ABSOLUTE, HTTP_FORM_AUTHORITY, HTTP_FORM_ASTERISK };

typedef struct http_request {
    const char *method; /* a token, case-sensitive */
    const char *target; /* the request-target as sent (logs) */
    const char *path;   /* absolute path, up to '?' ("/" for "http://host") */
    const char *query;  /* after '?', "" if none */
    int form;           /* HTTP_FORM_* */
    int minor;          /* HTTP/1.<minor>: 0 or 1 (1.2 to 1.9 are read as 1.1) */
    int keep_alive;     /* after the version default and the Connection header */
    uint64_t content_length;
    int chunked;            /* a Transfer-Encoding header was present */
    const char *request_id; /* a valid X-Request-Id, or NULL */
    const char *error;      /* why http_parse_head refused it */
} http_request;

/* Scan buf[0..len) for the end of a request head, resuming at *scanned (0
 * for a new head; updated). Returns the head's length through the blank
 * line, or 0 while it is incomplete; sets *bad when it can never be a valid
 * head (a NUL, a bare CR or a bare LF): answer 400 at once rather than wait
 * for a terminator a lenient client will never send. */
size_t http_head_end(const char *buf, size_t len, size_t *scanned, int *bad);

/* Parse the head buf[0..len) in place. 0, or the status to refuse with (400
 * malformed, 505 a well-formed version other than 1.x), with req->error
 * saying why; req->method and req->target are set as far as they were read
 * (else NULL), for the log line. */
int http_parse_head(char *buf, size_t len, http_request *req);

/* Find `name` in a query string and percent-decode its value into out.
 * 1 found, 0 absent, -1 malformed escape, NUL byte or value too long. */
int http_query_get(const char *query, const char *name, char *out, size_t outlen);

/* Check the parameter names of a query string against `allowed` (a
 * NULL-terminated list; NULL for none). 0 if every name is allowed and none
 * repeats; else -1 with the offending name (cut to outlen - 1 bytes, as
 * sent) in `bad`: an unknown name, a repeated one, or an empty one. */
int http_query_check(const char *query, const char *const *allowed, char *bad, size_t badlen);

/* "OK", "Not Found", ... for the statuses the examples use. */
const char *http_reason(int status);

/* Write all of buf. poll()s for room until deadline_ns (tp_now_ns clock);
 * gives up early when cancel_fd (if >= 0) turns readable. 0 or -1. */
int http_send_all(int fd, const char *buf, size_t len, uint64_t deadline_ns, int cancel_fd);

/* Build a complete response into out: status line, Content-Type,
 * Content-Length, `extra` header lines (each ending in \r\n, may be NULL),
 * Connection: close when !keep_alive (or keep-alive for an HTTP/1.0 client
 * that asked), then the body unless `head_only` (the answer to HEAD: the same
 * headers, Content-Length included, and no body; the body need not fit then,
 * and a caller may send a large one itself after the head). Returns the
 * length, or 0 if it does not fit. */
size_t http_format_response(char *out, size_t cap, int status, const char *content_type, const char *body,
                            size_t body_len, const char *extra, int keep_alive, int minor, int head_only);

#endif
