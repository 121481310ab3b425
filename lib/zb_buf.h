/* zb_buf.h — a growable byte buffer that formatters append to (libzb does
 * no I/O; callers write buf.data wherever they like). The buffer owns its
 * data; zb_buf_free() releases it and leaves an empty buffer. */
#ifndef ZB_BUF_H
#define ZB_BUF_H

#include <stddef.h>

typedef struct zb_buf {
  char *data; /* NUL-terminated while len < cap */
  size_t len;
  size_t cap;
} zb_buf;

#define ZB_BUF_INIT                                                                                          \
  { 0 }

void zb_buf_append(zb_buf *b, const char *bytes, size_t n);
void zb_buf_puts(zb_buf *b, const char *s);
void zb_buf_printf(zb_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal (quotes and escapes included). */
void zb_buf_json_str(zb_buf *b, const char *s);
/* Appends a double in a JSON-safe form (finite: %.17g trimmed; else null). */
void zb_buf_json_num(zb_buf *b, double x);
void zb_buf_free(zb_buf *b);

#endif
