/* zb_tls.h — mutual TLS on the control plane (docs/operations.md,
 * Security): the PEM files a process presents and trusts, and the
 * identity a peer's certificate carries.
 *
 * Every party (coordinator, worker, zbctl) holds the cluster's CA, its own
 * certificate and its key. The coordinator asks every client for a
 * certificate signed by that CA; the clients check the coordinator's
 * against it. A client certificate names its holder with a URI subject
 * alternative name "zb://ROLE/NAME": ROLE is worker, user or admin; NAME
 * is the worker id or the user name (scripts/make-certs.sh makes them).
 *
 * Ownership: zb_tls_load's result is the caller's (zb_tls_free). */
#ifndef ZB_TLS_H
#define ZB_TLS_H

#include <stdbool.h>

#include "zb_err.h"

/* Where the PEM files are; all three empty: no TLS (insecure mode). */
typedef struct zb_tls_files {
  char ca[512];   /* the CA certificate(s) to trust */
  char cert[512]; /* this party's certificate (chain) */
  char key[512];  /* its private key */
} zb_tls_files;

/* The files' contents, NUL-terminated PEM. */
typedef struct zb_tls {
  char *ca_pem, *cert_pem, *key_pem;
} zb_tls;

/* True when any of the three paths is set. */
bool zb_tls_files_set(const zb_tls_files *f);
/* Reads the three files (*out stays NULL when none is set: insecure).
 * Fails naming the file that is missing, unreadable, empty or not PEM,
 * or the path left out when only some are set. */
zb_err zb_tls_load(const zb_tls_files *f, zb_tls **out, zb_diag *diag);
void zb_tls_free(zb_tls *t);

typedef enum zb_role {
  ZB_ROLE_NONE = 0, /* no certificate, or none of ours */
  ZB_ROLE_WORKER,
  ZB_ROLE_USER,
  ZB_ROLE_ADMIN,
} zb_role;

/* Who is calling. In insecure mode every caller is an admin named
 * "insecure". */
typedef struct zb_identity {
  zb_role role;
  char name[64];
} zb_identity;

/* Parses "zb://ROLE/NAME" (NAME: 1..63 of [A-Za-z0-9._@-]); false for
 * anything else. Pure. */
bool zb_identity_from_uri(const char *uri, zb_identity *out);
/* "worker", "user", "admin", "none". */
const char *zb_role_name(zb_role r);

#endif
