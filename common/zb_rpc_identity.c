/* zb_rpc_identity.c — who a server call's peer is: the zb://ROLE/NAME its
 * verified client certificate names (docs/operations.md, Security). */
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <string.h>

#include "zb_rpc_internal.h"

/* The identity a verified certificate names: its one URI SAN with the
 * zb:// scheme. A DNS, email or IP SAN never names one (whatever text it
 * holds), and a certificate with two zb:// URIs names none: which of them
 * it acts as must not be the order they were written in. */
static bool rpc_identity_of(grpc_auth_context *ctx, zb_identity *out) {
  grpc_auth_property_iterator it =
      grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_URI_PROPERTY_NAME);
  int named = 0;
  bool ok = false;
  for (const grpc_auth_property *p; (p = grpc_auth_property_iterator_next(&it));) {
    if (p->value_length < 5 || memcmp(p->value, "zb://", 5) != 0)
      continue;
    char uri[128];
    size_t n = p->value_length < sizeof uri - 1 ? p->value_length : sizeof uri - 1;
    memcpy(uri, p->value, n);
    uri[n] = '\0';
    ok = ++named == 1 && n == p->value_length && strlen(uri) == n && zb_identity_from_uri(uri, out);
  }
  return ok && named == 1;
}

void rpc_identity_of_call(grpc_call *call, bool secure, zb_identity *out) {
  memset(out, 0, sizeof *out);
  if (!secure) {
    out->role = ZB_ROLE_ADMIN;
    snprintf(out->name, sizeof out->name, "insecure");
    return;
  }
  grpc_auth_context *ctx = grpc_call_auth_context(call);
  if (!ctx)
    return;
  /* only a verified peer counts: with REQUEST (not REQUIRE) a client may
   * come without a certificate, which leaves the context unauthenticated */
  if (grpc_auth_context_peer_is_authenticated(ctx) && !rpc_identity_of(ctx, out))
    memset(out, 0, sizeof *out); /* ZB_ROLE_NONE */
  grpc_auth_context_release(ctx);
}
