/* zb_pbjson.h — any protobuf-c message as JSON (proto3 JSON mapping:
 * lowerCamel is not used; field names as in the .proto, enums by name,
 * 64-bit integers as numbers, default values included so scripts see
 * every field). For zbctl's --output json. */
#ifndef ZB_PBJSON_H
#define ZB_PBJSON_H

#include <protobuf-c/protobuf-c.h>

#include "zb_buf.h"

/* Appends msg as a JSON object; indent >= 0 pretty-prints at that depth. */
void zb_pbjson_write(const ProtobufCMessage *msg, int indent, zb_buf *out);

#endif
