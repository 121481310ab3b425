/* zb_tls.c — see zb_tls.h. */
#include "zb_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

/* PEM files are small; anything larger is not one of ours. */
enum { TLS_MAX_PEM = 1 << 20 };

bool zb_tls_files_set(const zb_tls_files *f) {
  return f && (f->ca[0] || f->cert[0] || f->key[0]);
}

static zb_err tls_read(const char *what, const char *path, char **out, zb_diag *diag) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return zb_diag_set(diag, ZB_ERR_IO, "tls %s: cannot open %s: %s", what, path, strerror(errno));
  char *buf = zb_malloc(TLS_MAX_PEM + 1);
  size_t n = fread(buf, 1, TLS_MAX_PEM + 1, fp);
  bool bad = ferror(fp);
  fclose(fp);
  buf[n <= TLS_MAX_PEM ? n : TLS_MAX_PEM] = '\0';
  const char *why = bad ? "cannot be read" : n == 0 ? "is empty" : n > TLS_MAX_PEM ? "is over 1 MiB" : NULL;
  if (!why && !strstr(buf, "-----BEGIN "))
    why = "is not PEM (no -----BEGIN line)";
  if (why) {
    free(buf);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tls %s: %s %s", what, path, why);
  }
  *out = buf;
  return ZB_OK;
}

zb_err zb_tls_load(const zb_tls_files *f, zb_tls **out, zb_diag *diag) {
  *out = NULL;
  if (!zb_tls_files_set(f))
    return ZB_OK;
  const char *missing = !f->ca[0] ? "ca" : !f->cert[0] ? "cert" : !f->key[0] ? "key" : NULL;
  if (missing)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "tls: %s file not given (TLS needs all three: ca, cert and key; none for insecure mode)", missing);
  zb_tls *t = zb_calloc(1, sizeof *t);
  zb_err err = tls_read("ca", f->ca, &t->ca_pem, diag);
  if (!err)
    err = tls_read("cert", f->cert, &t->cert_pem, diag);
  if (!err)
    err = tls_read("key", f->key, &t->key_pem, diag);
  if (err) {
    zb_tls_free(t);
    return err;
  }
  *out = t;
  return ZB_OK;
}

void zb_tls_free(zb_tls *t) {
  if (!t)
    return;
  free(t->ca_pem);
  free(t->cert_pem);
  if (t->key_pem) /* a key: do not leave it in freed memory */
    memset(t->key_pem, 0, strlen(t->key_pem));
  free(t->key_pem);
  free(t);
}

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '@' || c == '-';
}

bool zb_identity_from_uri(const char *uri, zb_identity *out) {
  static const struct {
    const char *prefix;
    zb_role role;
  } roles[] = {
      {"zb://worker/", ZB_ROLE_WORKER}, {"zb://user/", ZB_ROLE_USER}, {"zb://admin/", ZB_ROLE_ADMIN}};
  for (size_t k = 0; uri && k < sizeof roles / sizeof roles[0]; k++) {
    size_t pl = strlen(roles[k].prefix);
    if (strncmp(uri, roles[k].prefix, pl) != 0)
      continue;
    const char *name = uri + pl;
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof out->name)
      return false;
    for (size_t i = 0; i < n; i++)
      if (!name_char(name[i]))
        return false;
    out->role = roles[k].role;
    memcpy(out->name, name, n + 1);
    return true;
  }
  return false;
}

const char *zb_role_name(zb_role r) {
  switch (r) {
  case ZB_ROLE_WORKER: return "worker";
  case ZB_ROLE_USER: return "user";
  case ZB_ROLE_ADMIN: return "admin";
  case ZB_ROLE_NONE: break;
  }
  return "none";
}
