/* connect.c — how zbctl reaches the coordinator: its address
 * (--coordinator, $ZB_COORDINATOR, 127.0.0.1:7070) and the TLS files of
 * the caller's certificate ($ZBCTL_TLS_CA, _CERT, _KEY or the --tls-*
 * flags; docs/operations.md, Security). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zbctl.h"

void zbctl_tls_from_env(zb_tls_files *f) {
  memset(f, 0, sizeof *f);
  const char *env[3] = {getenv("ZBCTL_TLS_CA"), getenv("ZBCTL_TLS_CERT"), getenv("ZBCTL_TLS_KEY")};
  char *dst[3] = {f->ca, f->cert, f->key};
  for (int k = 0; k < 3; k++)
    snprintf(dst[k], sizeof f->ca, "%s", env[k] ? env[k] : "");
}

zb_rpc_client *zbctl_client(const char *cmd, const char *coordinator, const zb_tls_files *files) {
  zb_tls *tls = NULL;
  zb_diag d;
  if (zb_tls_load(files, &tls, &d) != ZB_OK) {
    cli_error(cmd, "%s", d.msg);
    return NULL;
  }
  zb_rpc_client *c = zb_rpc_client_new_tls(coordinator, 64 << 20, tls);
  zb_tls_free(tls);
  return c;
}

const char *zbctl_default_coordinator(void) {
  const char *env = getenv("ZB_COORDINATOR");
  return env && env[0] ? env : "127.0.0.1:7070";
}
