/* zbctl.h — what zbctl's nouns share: the subcommand table's entry type,
 * the exit codes, and small helpers for arguments, files and output
 * (cli.c). Every helper that can fail prints one line to stderr itself
 * ("zbctl CMD: ...") and returns false, so handlers only map to an exit
 * code. Nothing here keeps state between calls.
 */
#ifndef ZBCTL_H
#define ZBCTL_H

#include <stdbool.h>
#include <stddef.h>

#include "zb_buf.h"
#include "zb_file.h"

/* Exit codes of every subcommand. */
enum { ZBCTL_EXIT_OK = 0, ZBCTL_EXIT_FAIL = 1, ZBCTL_EXIT_USAGE = 2 };

typedef struct zbctl_command zbctl_command;

/* A subcommand: gets its own table entry (for its name and help) and the
 * arguments after the noun and verb; returns an exit code. */
typedef int (*zbctl_handler)(const zbctl_command *cmd, int argc, char **argv);

/* One row of the subcommand table (zbctl.c). verb NULL: what `zbctl NOUN
 * ARGS` runs when ARGS does not start with one of the noun's verbs. */
struct zbctl_command {
  const char *noun;
  const char *verb;
  zbctl_handler run;
  const char *summary; /* one line for `zbctl --help` */
  const char *help;    /* the full text of `zbctl NOUN [VERB] --help` */
};

/* Handlers of the `plan` noun and their help texts (plan.c). */
int zbctl_plan_run(const zbctl_command *cmd, int argc, char **argv);
int zbctl_plan_compare(const zbctl_command *cmd, int argc, char **argv);
extern const char zbctl_plan_help[];
extern const char zbctl_plan_compare_help[];

#ifdef ZB_WITH_SERVICE
/* The service commands (job.c): they talk to zb-coordinator. */
#include "zb_jobspec.h"
int zbctl_submit(const zbctl_command *cmd, int argc, char **argv);
int zbctl_list(const zbctl_command *cmd, int argc, char **argv);
int zbctl_get(const zbctl_command *cmd, int argc, char **argv);
int zbctl_watch(const zbctl_command *cmd, int argc, char **argv);
int zbctl_cancel(const zbctl_command *cmd, int argc, char **argv);
int zbctl_resume(const zbctl_command *cmd, int argc, char **argv);
int zbctl_update_schedule(const zbctl_command *cmd, int argc, char **argv);
int zbctl_workers(const zbctl_command *cmd, int argc, char **argv);
extern const char zbctl_submit_help[], zbctl_list_help[], zbctl_get_help[], zbctl_watch_help[],
    zbctl_cancel_help[], zbctl_resume_help[], zbctl_update_help[], zbctl_workers_help[];
int zbctl_trace(const zbctl_command *cmd, int argc, char **argv);
extern const char zbctl_trace_help[];
/* What the service commands share (job.c). The coordinator's address
 * without --coordinator: $ZB_COORDINATOR, else 127.0.0.1:7070. */
#include <protobuf-c/protobuf-c.h>

#include "zb_rpc.h"
const char *zbctl_default_coordinator(void);
/* zbctl's TLS files from $ZBCTL_TLS_CA, $ZBCTL_TLS_CERT, $ZBCTL_TLS_KEY
 * (unset: plaintext). */
void zbctl_tls_from_env(zb_tls_files *f);
/* A channel to coordinator, TLS when files name any file; NULL after
 * printing why the files do not load. */
zb_rpc_client *zbctl_client(const char *cmd, const char *coordinator, const zb_tls_files *files);
/* One unary call of method with req; a failure is printed ("zbctl CMD:
 * NOT_FOUND: ...", with a hint when the coordinator cannot be reached) and
 * gives ZBCTL_EXIT_FAIL. On success *resp is the caller's
 * (protobuf_c_message_free_unpacked). */
int zbctl_remote_call(const char *cmd, const char *coordinator, int timeout_ms, const char *method,
                      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                      ProtobufCMessage **resp);
/* `zbctl plan --remote`: spec's shape, schedule and costs through the Plan
 * RPC; prints an ascii summary or JSON. Returns an exit code. */
int zbctl_plan_remote(const char *coordinator, int timeout_ms, const zb_job_spec *spec, const char *objective,
                      bool json);
/* job_measured.c: a sampled iteration's aligned figures, comm wait and
 * stragglers (nothing for other iterations); a job's learned costs beside
 * the spec's (nothing before any). */
struct Zb__V1__IterationMetrics;
struct Zb__V1__Job;
void zbctl_print_sampled(const struct Zb__V1__IterationMetrics *it);
void zbctl_print_learned(const struct Zb__V1__Job *j);
/* job_grid.c: where a job's ranks run (zbctl get): host runs, and for a
 * data-parallel job the replicas x stages grid. */
void zbctl_print_placement(const struct Zb__V1__Job *j);
/* watch_stream.c: every event of job_id from the first, in order, to
 * on_event, until the stream ends; a stream the coordinator cut because
 * this client fell behind is taken up again after the last event (said on
 * stderr once). Returns the final status; details as zb_rpc_stream_status. */
struct Zb__V1__JobEvent;
typedef void (*zbctl_watch_event_fn)(const struct Zb__V1__JobEvent *ev, void *ctx);
grpc_status_code zbctl_watch_events(zb_rpc_client *c, const char *job_id, zbctl_watch_event_fn on_event,
                                    void *ctx, char *details, size_t cap);
#endif

/* ---- argument parsing (cli.c) ---- */

/* An option a subcommand accepts: "--name" (and "-c" when short_name is
 * not 0); has_arg options take the next argument or "--name=VALUE". id is
 * what cli_next() returns for it and must be > 0. */
typedef struct cli_opt {
  const char *name;
  char short_name;
  bool has_arg;
  int id;
} cli_opt;

/* Walks argv of one subcommand. cmd names it in messages ("plan"). */
typedef struct cli_parser {
  const char *cmd;
  int argc;
  char **argv;
  int i;
} cli_parser;

enum { CLI_END = 0, CLI_ERROR = -1 };

/* Next option of ps; stores its value (or NULL) in *arg. Returns the
 * option's id, CLI_END after the last argument, or CLI_ERROR after
 * printing a usage message (unknown option, missing value, value given to
 * a flag, stray positional argument). */
int cli_next(cli_parser *ps, const cli_opt *opts, size_t n_opts, const char **arg);

/* Prints "zbctl CMD: MESSAGE" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like cli_error, then a pointer to CMD's help; returns ZBCTL_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whole-string number parsing of the value of option `flag`; print the
 * problem and return false when s is not a number in [lo, hi]. */
bool cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
bool cli_parse_double(const char *cmd, const char *flag, const char *s, double *out);
/* A comma-separated list of between min_n and max_n finite numbers; the
 * count read goes to *n. */
bool cli_parse_doubles(const char *cmd, const char *flag, const char *s, int min_n, int max_n, double *out,
                       int *n);

/* ---- files and output (cli.c) ---- */

/* Reads the whole of path ("-": stdin) into a new NUL-terminated buffer
 * that the caller frees. */
bool cli_read_file(const char *cmd, const char *path, char **data, size_t *len);
/* Writes b to stdout (path NULL or "-"), or to path atomically
 * (zb_file_write_atomic), so readers never see a part. */
bool cli_write_output(const char *cmd, const char *path, const zb_buf *b);

/* Output written while it is formatted: a zb_buf whose sink is stdout
 * (path NULL or "-") or path's temporary file, published atomically by
 * cli_stream_end only once complete (zb_file.h), so a large document is
 * never held whole and readers never see a part. */
typedef struct cli_stream {
  const char *cmd, *path;
  bool file, failed;
  int saved_errno;
  zb_file_writer w;
} cli_stream;
/* Opens the output and makes b (empty) stream into it; false (said why)
 * when the file cannot be opened. */
bool cli_stream_begin(cli_stream *o, const char *cmd, const char *path, zb_buf *b);
/* Writes what b still holds and closes the output: false (said why) when
 * any write failed, the file then left as it was. */
bool cli_stream_end(cli_stream *o, zb_buf *b);

#endif
