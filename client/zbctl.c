/* zbctl.c — main and the one table of subcommands. A row names a noun and
 * an optional verb; `zbctl NOUN [VERB] ARGS...` runs the row's handler
 * with ARGS. New nouns (the service client: submit, list, get, watch,
 * cancel, workers, update-schedule) are new rows and new files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zbctl.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const zbctl_command zbctl_commands[] = {
    {"plan", NULL, zbctl_plan_run, "generate, validate and simulate one schedule (offline)", zbctl_plan_help},
    {"plan", "compare", zbctl_plan_compare, "every schedule family side by side on one shape (offline)",
     zbctl_plan_compare_help},
#ifdef ZB_WITH_SERVICE
    {"submit", NULL, zbctl_submit, "submit a job spec (YAML) to zb-coordinator; prints the job id",
     zbctl_submit_help},
    {"list", NULL, zbctl_list, "list jobs", zbctl_list_help},
    {"get", NULL, zbctl_get, "show one job", zbctl_get_help},
    {"watch", NULL, zbctl_watch, "stream a job's progress until it ends", zbctl_watch_help},
    {"cancel", NULL, zbctl_cancel, "cancel a pending or running job", zbctl_cancel_help},
    {"resume", NULL, zbctl_resume, "resume a cancelled or failed cpu job from its checkpoints",
     zbctl_resume_help},
    {"update-schedule", NULL, zbctl_update_schedule, "switch a running job to another schedule",
     zbctl_update_help},
    {"trace", NULL, zbctl_trace, "one iteration's measured per-op timeline beside its plan",
     zbctl_trace_help},
    {"workers", NULL, zbctl_workers, "list attached workers", zbctl_workers_help},
#endif
};

enum { ZBCTL_N_COMMANDS = sizeof zbctl_commands / sizeof zbctl_commands[0] };

static void zbctl_usage(FILE *f) {
  fputs("usage: zbctl [--help | --version] COMMAND [ARGS...]\n"
        "\n"
        "zbctl plans, checks and simulates pipeline-parallel schedules (zero-bubble\n"
        "and the classic families) with libzb, and drives zb-coordinator: submits\n"
        "jobs and streams their throughput, bubble and memory figures.\n"
        "\n"
        "Commands:\n",
        f);
  for (int k = 0; k < ZBCTL_N_COMMANDS; k++) {
    const zbctl_command *c = &zbctl_commands[k];
    char name[48];
    snprintf(name, sizeof name, "%s%s%s", c->noun, c->verb ? " " : "", c->verb ? c->verb : "");
    fprintf(f, "  %-16s %s\n", name, c->summary);
  }
  fputs("\n"
        "Run 'zbctl COMMAND --help' for a command's options.\n"
        "Exit status: 0 success, 1 failure, 2 usage error.\n",
        f);
}

/* The row for `noun` whose verb is `verb` (NULL: the noun's default row). */
static const zbctl_command *zbctl_find(const char *noun, const char *verb) {
  for (int k = 0; k < ZBCTL_N_COMMANDS; k++) {
    const zbctl_command *c = &zbctl_commands[k];
    if (strcmp(c->noun, noun) != 0)
      continue;
    if (verb ? (c->verb && strcmp(c->verb, verb) == 0) : c->verb == NULL)
      return c;
  }
  return NULL;
}

static bool zbctl_has_noun(const char *noun) {
  for (int k = 0; k < ZBCTL_N_COMMANDS; k++)
    if (strcmp(zbctl_commands[k].noun, noun) == 0)
      return true;
  return false;
}

/* The flags every service command takes may come before the command too
 * (zbctl -o json --coordinator h:7070 list): each returns how many words
 * one such flag takes at argv[i] (1 or 2), or 0. */
static int global_flag(int argc, char **argv, int i) {
  static const char *const names[] = {"--coordinator", "--output",   "-o",       "--timeout-ms",
                                      "--tls-ca",      "--tls-cert", "--tls-key"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    size_t n = strlen(names[k]);
    if (strncmp(argv[i], names[k], n) == 0 && argv[i][n] == '=')
      return 1;
    if (strcmp(argv[i], names[k]) == 0)
      return i + 1 < argc ? 2 : 0;
  }
  return 0;
}

/* argv with the global flags before the command moved after it, so each
 * command's own parser sees them; *argc adjusted. Owned by the caller. */
static char **hoist_globals(int *argc, char **argv) {
  char **out = calloc((size_t)*argc + 1, sizeof *out);
  int i = 1, n = 1, g = 0;
  char **globals = calloc((size_t)*argc + 1, sizeof *globals);
  out[0] = argv[0];
  for (int w; i < *argc && (w = global_flag(*argc, argv, i)) > 0; i += w)
    for (int k = 0; k < w; k++)
      globals[g++] = argv[i + k];
  while (i < *argc)
    out[n++] = argv[i++];
  for (int k = 0; k < g; k++)
    out[n++] = globals[k];
  free(globals);
  *argc = n;
  return out;
}

static int run_command(int argc, char **argv);

int main(int argc, char **argv) {
  char **args = hoist_globals(&argc, argv);
  int rc = run_command(argc, args);
  free(args);
  return rc;
}

static int run_command(int argc, char **argv) {
  if (argc < 2) {
    zbctl_usage(stderr);
    return ZBCTL_EXIT_USAGE;
  }
  const char *first = argv[1];
  if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0 || strcmp(first, "help") == 0) {
    zbctl_usage(stdout);
    return ZBCTL_EXIT_OK;
  }
  if (strcmp(first, "--version") == 0) {
    printf("zbctl %s\n", ZB_VERSION);
    return ZBCTL_EXIT_OK;
  }
  if (first[0] == '-') {
    fprintf(stderr, "zbctl: unknown option '%s' (see 'zbctl --help')\n", first);
    return ZBCTL_EXIT_USAGE;
  }
  if (!zbctl_has_noun(first)) {
    fprintf(stderr, "zbctl: unknown command '%s' (see 'zbctl --help')\n", first);
    return ZBCTL_EXIT_USAGE;
  }
  const zbctl_command *cmd = argc > 2 ? zbctl_find(first, argv[2]) : NULL;
  int skip = 2;
  if (!cmd) {
    cmd = zbctl_find(first, NULL);
    skip = 1;
  }
  if (!cmd) {
    fprintf(stderr, "zbctl: '%s' needs a subcommand (see 'zbctl --help')\n", first);
    return ZBCTL_EXIT_USAGE;
  }
  return cmd->run(cmd, argc - 1 - skip, argv + 1 + skip);
}
