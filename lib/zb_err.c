#include "zb_err.h"

#include <stdarg.h>
#include <stdio.h>

const char *zb_strerror(zb_err err) {
  switch (err) {
  case ZB_OK: return "ok";
  case ZB_ERR_INVALID_ARG: return "invalid argument";
  case ZB_ERR_UNSUPPORTED: return "unsupported shape";
  case ZB_ERR_PARSE: return "parse error";
  case ZB_ERR_INVALID_SCHEDULE: return "invalid schedule";
  case ZB_ERR_INFEASIBLE: return "infeasible";
  case ZB_ERR_DEADLOCK: return "deadlock";
  case ZB_ERR_IO: return "I/O error";
  }
  return "unknown error";
}

zb_err zb_diag_set(zb_diag *diag, zb_err err, const char *fmt, ...) {
  if (diag) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(diag->msg, sizeof diag->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}
