/* zb_utf8.h — validating UTF-8 in strings the service keeps and sends back.
 * Pure: no I/O, no allocation; the caller owns every string.
 */
#ifndef ZB_UTF8_H
#define ZB_UTF8_H

#include <stddef.h>

/* Length of the longest valid UTF-8 prefix of s. proto3 strings must be
 * UTF-8: clients that check (Python's, Go's) refuse a whole message that
 * carries one invalid string, so nothing kept and sent back may hold one,
 * neither as received nor cut short by a fixed-size copy. */
size_t zb_utf8_prefix(const char *s);

#endif
