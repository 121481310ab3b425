/* zb_pb_strings.h — string fields with a NUL byte in a packed protobuf
 * message. protobuf-c hands strings over as C strings, so "j-1\0j-2"
 * would arrive as "j-1": a request that names one thing and means
 * another. Pure: reads the wire bytes with the message's descriptor. */
#ifndef ZB_PB_STRINGS_H
#define ZB_PB_STRINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Whether some string field of the message (nested messages included) in
 * data[0..len) holds a NUL byte; its dotted name into field (cap bytes).
 * Bytes that are no valid message are left to the unpacker to refuse. */
bool zb_pb_string_with_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                           char *field, size_t cap);

#endif
