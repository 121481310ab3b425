/* zb_buf.h — a growable byte buffer that formatters append to (libzb does
 * no I/O; callers write buf.data wherever they like). The buffer owns its
 * data; zb_buf_free() releases it and leaves an empty buffer. */
#ifndef ZB_BUF_H
#define ZB_BUF_H

#include <stddef.h>

/* Where a streaming buffer's bytes go (the caller's I/O: writing a file,
 * a socket). */
typedef void (*zb_buf_sink)(void *ctx, const char *bytes, size_t n);

typedef struct zb_buf {
  char *data; /* NUL-terminated while len < cap */
  size_t len;
  size_t cap;
  zb_buf_sink sink; /* NULL: the buffer holds everything */
  void *sink_ctx;
} zb_buf;

/* Bytes a streaming buffer holds before zb_buf_flush hands them over. */
#define ZB_BUF_FLUSH_AT ((size_t)1 << 20)

#define ZB_BUF_INIT                                                                                          \
  { 0 }

void zb_buf_append(zb_buf *b, const char *bytes, size_t n);
void zb_buf_puts(zb_buf *b, const char *s);
void zb_buf_printf(zb_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal (quotes and escapes included). */
void zb_buf_json_str(zb_buf *b, const char *s);
/* Appends a double in a JSON-safe form (finite: %.17g trimmed; else null). */
void zb_buf_json_num(zb_buf *b, double x);
/* Formatters call this where a part of a large document is complete:
 * with a sink set and ZB_BUF_FLUSH_AT bytes or more held, they are handed
 * to the sink and dropped, so the document is never held whole. Without
 * a sink, nothing. */
void zb_buf_flush(zb_buf *b);
/* Hands everything held to the sink (none: nothing). */
void zb_buf_drain(zb_buf *b);
void zb_buf_free(zb_buf *b);

#endif
