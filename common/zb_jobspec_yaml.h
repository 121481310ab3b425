/* zb_jobspec_yaml.h — reading a job spec from YAML text (the format is
 * documented field by field in zb_jobspec.h). Parsing is strict: an
 * unknown key, a wrong type, a missing required key or a value out of
 * range is an error whose message names the key and its line ("line 4:
 * key 'ranks': expected an integer >= 1, got 'four'"). No I/O: the caller
 * reads the file, and the files it names (model.config) through a reader
 * it passes.
 *
 * Ownership: the spec filled owns its stage_costs (zb_job_spec_free).
 */
#ifndef ZB_JOBSPEC_YAML_H
#define ZB_JOBSPEC_YAML_H

#include <stddef.h>

#include "zb_err.h"
#include "zb_jobspec.h"

/* Parses one YAML document into *out (defaults first, then the keys
 * given). On failure *out is left freed/defaulted and diag names the key
 * and line. Also runs zb_job_spec_derive() and zb_job_spec_check(). */
zb_err zb_job_spec_parse(const char *yaml, size_t len, zb_job_spec *out, zb_diag *diag);

/* How the parser reads a file the spec names (model.config): read puts its
 * text, NUL-terminated, into buf (cap bytes) and refuses one that does not
 * fit; its message names the path. Relative paths are the caller's to
 * resolve (zbctl: its working directory). */
typedef struct zb_jobspec_files {
  zb_err (*read)(void *ud, const char *path, char *buf, size_t cap, zb_diag *diag);
  void *ud;
} zb_jobspec_files;

/* A reader of plain paths (zb_jobspec_files.c; relative to the working
 * directory), for zbctl. */
zb_jobspec_files zb_jobspec_files_plain(void);

/* zb_job_spec_parse with a reader for model.config; NULL (as
 * zb_job_spec_parse): a spec with model.config is refused. */
zb_err zb_job_spec_parse_files(const char *yaml, size_t len, const zb_jobspec_files *files, zb_job_spec *out,
                               zb_diag *diag);

#endif
