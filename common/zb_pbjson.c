#include "zb_pbjson.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static void pbjson_nl(zb_buf *b, int indent) {
  if (indent < 0)
    return;
  zb_buf_puts(b, "\n");
  for (int k = 0; k < indent; k++)
    zb_buf_puts(b, "  ");
}

/* One value of field f at p (a scalar, string, enum or message). */
static void pbjson_value(const ProtobufCFieldDescriptor *f, const void *p, int indent, zb_buf *b) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: zb_buf_printf(b, "%d", *(const int32_t *)p); break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: zb_buf_printf(b, "%u", *(const uint32_t *)p); break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: zb_buf_printf(b, "%lld", (long long)*(const int64_t *)p); break;
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: zb_buf_printf(b, "%llu", (unsigned long long)*(const uint64_t *)p); break;
  case PROTOBUF_C_TYPE_FLOAT: zb_buf_json_num(b, *(const float *)p); break;
  case PROTOBUF_C_TYPE_DOUBLE: zb_buf_json_num(b, *(const double *)p); break;
  case PROTOBUF_C_TYPE_BOOL: zb_buf_puts(b, *(const protobuf_c_boolean *)p ? "true" : "false"); break;
  case PROTOBUF_C_TYPE_ENUM: {
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
    if (ev)
      zb_buf_json_str(b, ev->name);
    else
      zb_buf_printf(b, "%d", *(const int *)p);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: zb_buf_json_str(b, *(char *const *)p ? *(char *const *)p : ""); break;
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *bd = p;
    zb_buf_puts(b, "\"");
    for (size_t k = 0; k < bd->len; k++)
      zb_buf_printf(b, "%02x", bd->data[k]);
    zb_buf_puts(b, "\"");
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
    if (m)
      zb_pbjson_write(m, indent, b);
    else
      zb_buf_puts(b, "null");
    break;
  }
  }
}

static size_t pbjson_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE: return 8;
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  default: return 4;
  }
}

void zb_pbjson_write(const ProtobufCMessage *msg, int indent, zb_buf *b) {
  const ProtobufCMessageDescriptor *d = msg->descriptor;
  int inner = indent < 0 ? -1 : indent + 1;
  zb_buf_puts(b, "{");
  bool first = true;
  for (unsigned k = 0; k < d->n_fields; k++) {
    const ProtobufCFieldDescriptor *f = &d->fields[k];
    const char *base = (const char *)msg;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) { /* only the member that is set */
      uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
      if (which != f->id)
        continue;
    }
    if (!first)
      zb_buf_puts(b, ",");
    first = false;
    pbjson_nl(b, inner);
    zb_buf_json_str(b, f->name);
    zb_buf_puts(b, indent < 0 ? ":" : ": ");
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *arr = *(char *const *)(base + f->offset);
      size_t sz = pbjson_size(f->type);
      zb_buf_puts(b, "[");
      for (size_t i = 0; i < n; i++) {
        if (i)
          zb_buf_puts(b, indent < 0 ? "," : ", ");
        pbjson_value(f, arr + i * sz, inner, b);
      }
      zb_buf_puts(b, "]");
    } else {
      pbjson_value(f, base + f->offset, inner, b);
    }
  }
  if (!first)
    pbjson_nl(b, indent);
  zb_buf_puts(b, "}");
}
