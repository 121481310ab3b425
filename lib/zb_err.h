/* zb_err.h — the one result enum of libzb and its message table.
 *
 * Every libzb function that can fail returns a zb_err and writes its outputs
 * through pointers. Functions that can explain a failure also take a
 * zb_diag*, which may be NULL, and fill it with a human sentence.
 */
#ifndef ZB_ERR_H
#define ZB_ERR_H

#include <stddef.h>

typedef enum zb_err {
  ZB_OK = 0,
  ZB_ERR_INVALID_ARG = -1,      /* a parameter is out of range or inconsistent */
  ZB_ERR_UNSUPPORTED = -2,      /* the family cannot serve this shape */
  ZB_ERR_PARSE = -3,            /* malformed action string, CSV or number */
  ZB_ERR_INVALID_SCHEDULE = -4, /* the validator found a violation */
  ZB_ERR_INFEASIBLE = -5,       /* no schedule fits the memory limit */
  ZB_ERR_DEADLOCK = -6,         /* simulation could not make progress */
  ZB_ERR_IO = -7,               /* I/O failed: a file, the database, or a network peer (service code) */
} zb_err;

/* A short human explanation of the last failure; filled by functions that
 * take one. msg is always NUL-terminated. */
typedef struct zb_diag {
  char msg[256];
} zb_diag;

/* Static name of an error code ("invalid argument", ...). Never NULL. */
const char *zb_strerror(zb_err err);

/* printf-style fill of diag (no-op when diag is NULL); returns err so a
 * caller can write `return zb_diag_set(d, ZB_ERR_PARSE, "...", ...)`. */
zb_err zb_diag_set(zb_diag *diag, zb_err err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
