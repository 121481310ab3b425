/* cli.c — argument, file and output helpers shared by zbctl's nouns. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zb_alloc.h"
#include "zb_file.h"
#include "zbctl.h"

static void cli_verror(const char *cmd, const char *fmt, va_list ap) {
  fprintf(stderr, "zbctl%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

void cli_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror(cmd, fmt, ap);
  va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror(cmd, fmt, ap);
  va_end(ap);
  fprintf(stderr, "(see 'zbctl %s --help')\n", cmd ? cmd : "");
  return ZBCTL_EXIT_USAGE;
}

static const cli_opt *cli_find_long(const cli_opt *opts, size_t n, const char *name, size_t len) {
  for (size_t k = 0; k < n; k++)
    if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0)
      return &opts[k];
  return NULL;
}

static const cli_opt *cli_find_short(const cli_opt *opts, size_t n, char c) {
  for (size_t k = 0; k < n; k++)
    if (opts[k].short_name && opts[k].short_name == c)
      return &opts[k];
  return NULL;
}

int cli_next(cli_parser *ps, const cli_opt *opts, size_t n_opts, const char **arg) {
  *arg = NULL;
  if (ps->i >= ps->argc)
    return CLI_END;
  const char *a = ps->argv[ps->i++];
  const cli_opt *o = NULL;
  const char *inline_val = NULL;
  if (strncmp(a, "--", 2) == 0 && a[2] != '\0') {
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    o = cli_find_long(opts, n_opts, name, len);
    if (o && eq)
      inline_val = eq + 1;
  } else if (a[0] == '-' && a[1] != '\0' && a[2] == '\0') {
    o = cli_find_short(opts, n_opts, a[1]);
  } else {
    cli_usage_error(ps->cmd, "unexpected argument '%s'", a);
    return CLI_ERROR;
  }
  if (!o) {
    cli_usage_error(ps->cmd, "unknown option '%s'", a);
    return CLI_ERROR;
  }
  if (!o->has_arg) {
    if (inline_val) {
      cli_usage_error(ps->cmd, "option --%s takes no value", o->name);
      return CLI_ERROR;
    }
    return o->id;
  }
  if (inline_val) {
    *arg = inline_val;
    return o->id;
  }
  if (ps->i >= ps->argc) {
    cli_usage_error(ps->cmd, "option --%s needs a value", o->name);
    return CLI_ERROR;
  }
  *arg = ps->argv[ps->i++];
  return o->id;
}

bool cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = (s[0] && !isspace((unsigned char)s[0])) ? strtol(s, &end, 10) : 0;
  if (!s[0] || isspace((unsigned char)s[0]) || *end != '\0' || errno == ERANGE) {
    cli_usage_error(cmd, "%s takes a whole number (got '%s')", flag, s);
    return false;
  }
  if (x < lo || x > hi) {
    cli_usage_error(cmd, "%s must be between %ld and %ld (got %ld)", flag, lo, hi, x);
    return false;
  }
  *out = (int)x;
  return true;
}

/* Parses s[0..n) as one finite number. */
static bool cli_number(const char *s, size_t n, double *out) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp || isspace((unsigned char)s[0]))
    return false;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  double x = strtod(tmp, &end);
  if (*end != '\0' || errno == ERANGE || !isfinite(x))
    return false;
  *out = x;
  return true;
}

bool cli_parse_double(const char *cmd, const char *flag, const char *s, double *out) {
  if (!cli_number(s, strlen(s), out)) {
    cli_usage_error(cmd, "%s takes a finite number (got '%s')", flag, s);
    return false;
  }
  return true;
}

bool cli_parse_doubles(const char *cmd, const char *flag, const char *s, int min_n, int max_n, double *out,
                       int *n) {
  int k = 0;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (k == max_n || !cli_number(p, len, &out[k])) {
      if (min_n == max_n)
        cli_usage_error(cmd, "%s takes %d comma-separated numbers (got '%s')", flag, min_n, s);
      else
        cli_usage_error(cmd, "%s takes %d to %d comma-separated numbers (got '%s')", flag, min_n, max_n, s);
      return false;
    }
    k++;
    if (!comma)
      break;
    p = comma + 1;
  }
  if (k < min_n) {
    cli_usage_error(cmd, "%s takes at least %d comma-separated numbers (got '%s')", flag, min_n, s);
    return false;
  }
  *n = k;
  return true;
}

bool cli_read_file(const char *cmd, const char *path, char **data, size_t *len) {
  uint8_t *text;
  zb_diag d;
  if (zb_file_slurp("input", path, &text, len, &d) != ZB_OK) {
    cli_error(cmd, "%s", d.msg);
    return false;
  }
  *data = (char *)text;
  return true;
}

bool cli_write_output(const char *cmd, const char *path, const zb_buf *b) {
  if (!path || strcmp(path, "-") == 0) {
    if (b->len && fwrite(b->data, 1, b->len, stdout) != b->len) {
      cli_error(cmd, "cannot write to stdout: %s", strerror(errno));
      return false;
    }
    if (fflush(stdout) != 0) {
      cli_error(cmd, "cannot write to stdout: %s", strerror(errno));
      return false;
    }
    return true;
  }
  zb_diag d;
  if (zb_file_write_atomic("output", path, b->data, b->len, &d) != ZB_OK) {
    cli_error(cmd, "%s", d.msg);
    return false;
  }
  return true;
}

static void cli_stream_sink(void *ctx, const char *bytes, size_t n) {
  cli_stream *o = ctx;
  if (o->file) {
    zb_file_write(&o->w, bytes, n);
  } else if (!o->failed && fwrite(bytes, 1, n, stdout) != n) {
    o->failed = true;
    o->saved_errno = errno;
  }
}

bool cli_stream_begin(cli_stream *o, const char *cmd, const char *path, zb_buf *b) {
  memset(o, 0, sizeof *o);
  o->cmd = cmd;
  o->path = path;
  o->file = path && strcmp(path, "-") != 0;
  zb_diag d;
  if (o->file && zb_file_begin(&o->w, "output", path, &d) != ZB_OK) {
    cli_error(cmd, "%s", d.msg);
    return false;
  }
  o->w.plain = true;
  b->sink = cli_stream_sink;
  b->sink_ctx = o;
  return true;
}

bool cli_stream_end(cli_stream *o, zb_buf *b) {
  zb_buf_drain(b);
  b->sink = NULL;
  if (o->file) {
    zb_diag d;
    if (zb_file_commit(&o->w, &d) != ZB_OK) {
      cli_error(o->cmd, "%s", d.msg);
      return false;
    }
    return true;
  }
  if (!o->failed && fflush(stdout) != 0) {
    o->failed = true;
    o->saved_errno = errno;
  }
  if (o->failed)
    cli_error(o->cmd, "cannot write to stdout: %s", strerror(o->saved_errno));
  return !o->failed;
}
