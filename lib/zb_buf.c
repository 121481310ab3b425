#include "zb_buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

static void zb_buf_reserve(zb_buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap)
    return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1)
    cap *= 2;
  b->data = zb_realloc(b->data, cap);
  b->cap = cap;
}

void zb_buf_append(zb_buf *b, const char *bytes, size_t n) {
  zb_buf_reserve(b, n);
  memcpy(b->data + b->len, bytes, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void zb_buf_puts(zb_buf *b, const char *s) {
  zb_buf_append(b, s, strlen(s));
}

void zb_buf_printf(zb_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n <= 0)
    return;
  zb_buf_reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void zb_buf_json_str(zb_buf *b, const char *s) {
  zb_buf_append(b, "\"", 1);
  const unsigned char *c = (const unsigned char *)s;
  while (*c) {
    size_t run = 0; /* the bytes up to the next that needs escaping, in one append */
    while (c[run] && c[run] != '"' && c[run] != '\\' && c[run] >= 0x20)
      run++;
    zb_buf_append(b, (const char *)c, run);
    c += run;
    if (!*c)
      break;
    if (*c == '"' || *c == '\\') {
      char esc[2] = {'\\', (char)*c};
      zb_buf_append(b, esc, 2);
    } else {
      zb_buf_printf(b, "\\u%04x", *c);
    }
    c++;
  }
  zb_buf_append(b, "\"", 1);
}

void zb_buf_json_num(zb_buf *b, double x) {
  if (!isfinite(x)) {
    zb_buf_puts(b, "null");
    return;
  }
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%.12g", x);
  zb_buf_puts(b, tmp);
}

void zb_buf_drain(zb_buf *b) {
  if (!b->sink || b->len == 0)
    return;
  b->sink(b->sink_ctx, b->data, b->len);
  b->len = 0;
  b->data[0] = '\0';
}

void zb_buf_flush(zb_buf *b) {
  if (b->len >= ZB_BUF_FLUSH_AT)
    zb_buf_drain(b);
}

void zb_buf_free(zb_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}
