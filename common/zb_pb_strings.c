/* zb_pb_strings.c — NUL bytes in a packed message's string fields
 * (zb_pb_strings.h), read straight from the wire format: tag varints,
 * then each field by its wire type. */
#include "zb_pb_strings.h"

#include <stdio.h>
#include <string.h>

enum { MAX_DEPTH = 32 };

/* Reads a varint at *p (before end); false past the end or over 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

static bool scan(const ProtobufCMessageDescriptor *desc, const uint8_t *p, const uint8_t *end, int depth,
                 char *field, size_t cap) {
  while (p < end && depth < MAX_DEPTH) {
    uint64_t tag, n;
    if (!read_varint(&p, end, &tag))
      return false;
    switch (tag & 7) {
    case 0:
      if (!read_varint(&p, end, &n))
        return false;
      continue;
    case 1: p += 8; continue;
    case 5: p += 4; continue;
    case 2: break;
    default: return false; /* groups, or not a message */
    }
    if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p))
      return false;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3));
    bool nul = f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n);
    char inner[128] = "";
    if (f && f->type == PROTOBUF_C_TYPE_MESSAGE)
      nul = scan(f->descriptor, p, p + n, depth + 1, inner, sizeof inner);
    if (nul) {
      snprintf(field, cap, "%s%s%s", f->name, inner[0] ? "." : "", inner);
      return true;
    }
    p += n;
  }
  return false;
}

bool zb_pb_string_with_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                           char *field, size_t cap) {
  if (cap)
    field[0] = '\0';
  return scan(desc, data, data + len, 0, field, cap);
}
