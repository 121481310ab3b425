/* The TLS settings (common/zb_tls.h): the zb://ROLE/NAME identities a
 * certificate may carry, and zb_tls_load's refusals, each naming the file
 * or the setting at fault. The handshake itself is tested with real
 * certificates in tests/service/test_security.py. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zb_tls.h"
#include "zbtest.h"

static void test_identity_from_uri(void) {
  zb_identity id;
  CHECK(zb_identity_from_uri("zb://worker/w0", &id) && id.role == ZB_ROLE_WORKER && !strcmp(id.name, "w0"));
  CHECK(zb_identity_from_uri("zb://user/alice@example.org", &id) && id.role == ZB_ROLE_USER);
  CHECK(zb_identity_from_uri("zb://admin/root", &id) && id.role == ZB_ROLE_ADMIN && !strcmp(id.name, "root"));
  static const char *const bad[] = {
      "",
      "zb://worker/",
      "zb://guest/x",
      "https://user/alice",
      "zb://user/a/b",
      "zb://user/al ice",
      "zb://user/0123456789012345678901234567890123456789012345678901234567890123",
      "ZB://user/alice"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
    CHECK_MSG(!zb_identity_from_uri(bad[k], &id), "accepted '%s'", bad[k]);
  CHECK(!zb_identity_from_uri(NULL, &id));
  CHECK_STREQ(zb_role_name(ZB_ROLE_WORKER), "worker");
  CHECK_STREQ(zb_role_name(ZB_ROLE_NONE), "none");
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void test_load_refusals(void) {
  char dir[] = "/tmp/zb-tls-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char pem[300], txt[300], empty[300];
  snprintf(pem, sizeof pem, "%s/a.pem", dir);
  snprintf(txt, sizeof txt, "%s/b.txt", dir);
  snprintf(empty, sizeof empty, "%s/c.pem", dir);
  write_file(pem, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  write_file(txt, "not a certificate\n");
  write_file(empty, "");
  zb_tls_files none = {0}, only_ca = {0}, f = {0};
  zb_tls *t = (zb_tls *)1;
  zb_diag d = {{0}};
  CHECK(zb_tls_load(&none, &t, &d) == ZB_OK && t == NULL); /* insecure */
  snprintf(only_ca.ca, sizeof only_ca.ca, "%s", pem);
  CHECK(zb_tls_load(&only_ca, &t, &d) != ZB_OK && strstr(d.msg, "cert file not given"));
  const struct {
    const char *ca, *cert, *key, *want;
  } cases[] = {{pem, pem, "/nonexistent/k.pem", "/nonexistent/k.pem"},
               {pem, txt, pem, "not PEM"},
               {empty, pem, pem, "is empty"}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    snprintf(f.ca, sizeof f.ca, "%s", cases[k].ca);
    snprintf(f.cert, sizeof f.cert, "%s", cases[k].cert);
    snprintf(f.key, sizeof f.key, "%s", cases[k].key);
    CHECK_MSG(zb_tls_load(&f, &t, &d) != ZB_OK && strstr(d.msg, cases[k].want), "case %zu: %s", k, d.msg);
  }
  snprintf(f.ca, sizeof f.ca, "%s", pem);
  snprintf(f.cert, sizeof f.cert, "%s", pem);
  snprintf(f.key, sizeof f.key, "%s", pem);
  CHECK(zb_tls_load(&f, &t, &d) == ZB_OK && t && strstr(t->cert_pem, "BEGIN CERTIFICATE"));
  zb_tls_free(t);
  unlink(pem);
  unlink(txt);
  unlink(empty);
  rmdir(dir);
}

ZBT_MAIN(ZBT(test_identity_from_uri), ZBT(test_load_refusals))
