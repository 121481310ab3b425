/* zb_utf8.c — the longest valid UTF-8 prefix of a string (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
#include "zb_utf8.h"

size_t zb_utf8_prefix(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t k = 0;
  while (s[k]) {
    unsigned c = s[k];
    int n = c < 0x80                 ? 0
            : c >= 0xc2 && c <= 0xdf ? 1
            : (c & 0xf0) == 0xe0     ? 2
            : c >= 0xf0 && c <= 0xf4 ? 3
                                     : -1;
    if (n < 0)
      break;
    /* the second byte's range excludes overlong forms, surrogates and
     * code points past U+10FFFF */
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    int i = 1;
    for (; i <= n; i++, lo = 0x80, hi = 0xbf)
      if (s[k + (size_t)i] < lo || s[k + (size_t)i] > hi)
        break;
    if (i <= n)
      break;
    k += (size_t)n + 1;
  }
  return k;
}
