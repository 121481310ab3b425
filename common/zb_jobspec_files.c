/* zb_jobspec_files.c — the files a job spec names, read from plain paths
 * (zb_jobspec_yaml.h, zb_jobspec_files): the I/O the spec parser leaves to
 * its caller, kept apart from the pure parser. zbctl submit reads
 * model.config with it and sends the text. */
#include <stdlib.h>
#include <string.h>

#include "zb_file.h"
#include "zb_jobspec_yaml.h"

static zb_err read_plain(void *ud, const char *path, char *buf, size_t cap, zb_diag *diag) {
  (void)ud;
  uint8_t *text = NULL;
  size_t len = 0;
  zb_err err = zb_file_slurp("model.config", path, &text, &len, diag);
  if (err)
    return err;
  if (len >= cap || memchr(text, '\0', len)) {
    free(text);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "'%s': %zu bytes%s; a config.json must be at most %zu bytes of text", path, len,
                       len >= cap ? "" : " with a NUL byte", cap - 1);
  }
  memcpy(buf, text, len);
  buf[len] = '\0';
  free(text);
  return ZB_OK;
}

zb_jobspec_files zb_jobspec_files_plain(void) {
  return (zb_jobspec_files){read_plain, NULL};
}
