/* transport.c — what every transport shares (zb_transport.h). */
#include <stdio.h>

#include "zb_transport.h"

const char *zb_tag_format(zb_tag tag, char *buf, size_t len) {
  const char *k = tag.kind == ZB_OP_F             ? "F"
                  : tag.kind == ZB_OP_B           ? "B"
                  : tag.kind == ZB_OP_REDUCE_GRAD ? "R"
                                                  : "?";
  snprintf(buf, len, "%s s%d mb%d", k, (int)tag.stage, (int)tag.mb);
  return buf;
}
