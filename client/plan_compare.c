/* plan_compare.c — `zbctl plan compare`: every family on one shape, one
 * row each (makespan, both bubble ratios, peak memory, generation time),
 * as a table or JSON. See plan.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "zb_buf.h"
#include "zb_clock.h"
#include "zb_planner.h"

static const cli_opt compare_options[] = {
    {"ranks", 0, true, OPT_RANKS},
    {"microbatches", 0, true, OPT_MICROBATCHES},
    {"chunks", 0, true, OPT_CHUNKS},
    {"costs", 0, true, OPT_COSTS},
    {"mem", 0, true, OPT_MEM},
    {"mem-limit", 0, true, OPT_MEM_LIMIT},
    {"objective", 0, true, OPT_OBJECTIVE},
    {"format", 0, true, OPT_FORMAT},
    {"output", 'o', true, OPT_FORMAT},
    {"output-file", 0, true, OPT_OUTPUT},
    {"help", 'h', false, OPT_HELP},
};

static const char *const compare_format_names[] = {"table", "json"};

/* zbctl plan compare                                                  */

typedef struct compare_row {
  int v;
  zb_family chose; /* zb-auto: the family its placement search chose */
  bool ok, generated;
  double makespan, bubble, bubble_paper, peak, gen_ms;
  zb_diag why; /* when !ok */
} compare_row;

static void compare_table(const plan_args *a, int vi, double units, const compare_row *rows, zb_buf *b) {
  zb_buf_printf(b, "p=%d m=%d; one rank's share: T_F=%g T_B=%g T_W=%g T_comm=%g, M_F=%g M_B=%g M_W=%g\n",
                a->p, a->m, a->rc.t_f, a->rc.t_b, a->rc.t_w, a->rc.t_comm, a->rc.m_f, a->rc.m_b, a->rc.m_w);
  zb_buf_printf(b, "interleaved-1f1b: v=%d; zb-auto: memory limit %g M_F (%gp), objective %s\n", vi, units,
                units / a->p, a->objective == ZB_OBJ_SPAN ? "span" : "makespan");
  zb_buf_puts(b, "bubble_ratio: global, 1 - busy/(p*makespan); bubble_ratio_paper: the ZB paper's, "
                 "(S_max - m(T_F+T_B+T_W))/S_max; peak_mem: max over ranks, M_F units\n\n");
  zb_buf_printf(b, "%-16s %2s %12s %12s %18s %9s %10s\n", "schedule", "v", "makespan", "bubble_ratio",
                "bubble_ratio_paper", "peak_mem", "gen_ms");
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    const compare_row *r = &rows[f];
    if (r->ok) {
      zb_buf_printf(b, "%-16s %2d %12.6g %12.4f %18.4f %9.4g %10.3f", zb_family_name((zb_family)f), r->v,
                    r->makespan, r->bubble, r->bubble_paper, r->peak, r->gen_ms);
      if (f == ZB_FAMILY_ZB_AUTO)
        zb_buf_printf(b, "  (chose %s)", zb_family_name(r->chose));
      zb_buf_puts(b, "\n");
    } else
      zb_buf_printf(b, "%-16s %2d  %s: %s\n", zb_family_name((zb_family)f), r->v,
                    r->generated ? "FAILED" : "refused", r->why.msg);
  }
}

static void compare_json(const plan_args *a, int vi, double units, const compare_row *rows, zb_buf *b) {
  zb_buf_printf(b, "{\n  \"ranks\": %d,\n  \"microbatches\": %d,\n  \"interleaved_chunks\": %d,\n", a->p,
                a->m, vi);
  zb_buf_puts(b, "  \"costs\": {");
  const char *names[7] = {"t_f", "t_b", "t_w", "t_comm", "m_f", "m_b", "m_w"};
  const double vals[7] = {a->rc.t_f, a->rc.t_b, a->rc.t_w, a->rc.t_comm, a->rc.m_f, a->rc.m_b, a->rc.m_w};
  for (int k = 0; k < 7; k++) {
    zb_buf_printf(b, "%s\"%s\": ", k ? ", " : "", names[k]);
    zb_buf_json_num(b, vals[k]);
  }
  zb_buf_puts(b, "},\n  \"zb_auto_mem_limit\": ");
  zb_buf_json_num(b, units);
  zb_buf_printf(b, ",\n  \"zb_auto_objective\": \"%s\",\n  \"families\": [",
                a->objective == ZB_OBJ_SPAN ? "span" : "makespan");
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    const compare_row *r = &rows[f];
    zb_buf_puts(b, f ? ",\n    {\"schedule\": " : "\n    {\"schedule\": ");
    zb_buf_json_str(b, zb_family_name((zb_family)f));
    zb_buf_printf(b, ", \"chunks\": %d", r->v);
    if (f == ZB_FAMILY_ZB_AUTO && r->ok) {
      zb_buf_puts(b, ", \"chose\": ");
      zb_buf_json_str(b, zb_family_name(r->chose));
    }
    const char *keys[5] = {"makespan", "bubble_ratio", "bubble_ratio_paper", "peak_memory", "generation_ms"};
    const double nums[5] = {r->makespan, r->bubble, r->bubble_paper, r->peak, r->gen_ms};
    for (int k = 0; k < 5; k++) {
      zb_buf_printf(b, ", \"%s\": ", keys[k]);
      zb_buf_json_num(b, r->ok ? nums[k] : NAN);
    }
    zb_buf_puts(b, ", \"error\": ");
    if (r->ok)
      zb_buf_puts(b, "null");
    else
      zb_buf_json_str(b, r->why.msg);
    zb_buf_puts(b, "}");
  }
  zb_buf_puts(b, "\n  ]\n}\n");
}

int zbctl_plan_compare(const zbctl_command *cmd, int argc, char **argv) {
  if (plan_has_help(argc, argv)) {
    fputs(cmd->help, stdout);
    return ZBCTL_EXIT_OK;
  }
  plan_args a;
  plan_args_init(&a, "plan compare");
  int code = plan_parse(compare_options, PLAN_COUNT(compare_options), compare_format_names,
                        (int)PLAN_COUNT(compare_format_names), argc, argv, &a);
  if (code >= 0)
    return code;
  if (!a.p)
    return cli_usage_error(a.cmd, "missing --ranks P");
  if (!a.m)
    return cli_usage_error(a.cmd, "missing --microbatches M");
  int vi = a.v ? a.v : 2;
  if (vi < 2)
    return cli_usage_error(a.cmd, "--chunks is interleaved-1f1b's and needs at least 2 (got %d)", vi);
  double units = a.have_limit ? plan_limit_units(&a, a.p) : a.p;
  zb_costs *probe = plan_costs(&a, a.p, 1, NULL, 0, &code);
  if (!probe)
    return code;
  zb_costs_free(probe);

  compare_row rows[ZB_FAMILY_COUNT_];
  code = ZBCTL_EXIT_OK;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    zb_family fam = (zb_family)f;
    compare_row *row = &rows[f];
    memset(row, 0, sizeof *row);
    row->v = fam == ZB_FAMILY_INTERLEAVED_1F1B ? vi : zb_family_default_chunks(fam);
    bool search = fam == ZB_FAMILY_ZB_AUTO; /* over every placement, as zbctl plan's */
    zb_costs *c = search ? NULL : zb_costs_from_rank_share(a.p, row->v, &a.rc, 0);
    zb_planner_result r = {0};
    zb_err err =
        search ? plan_auto_search(&a, &r, &row->why) : plan_family(&a, fam, row->v, c, &r, &row->why);
    if (err) {
      row->generated = r.failed > ZB_PLANNER_GENERATE;
      if (row->generated) {
        cli_error(a.cmd, "%s", row->why.msg);
        code = ZBCTL_EXIT_FAIL;
      }
    } else {
      row->ok = true;
      row->v = r.v;
      row->chose = r.chosen;
      row->makespan = r.sim->makespan;
      row->bubble = r.sim->bubble_ratio;
      row->bubble_paper = r.sim->bubble_ratio_paper;
      row->peak = zb_sim_max_peak(r.sim);
      row->gen_ms = r.generate_seconds * 1e3;
    }
    zb_planner_result_free(&r);
    zb_costs_free(c);
  }
  zb_buf b = ZB_BUF_INIT;
  if (a.format == COMPARE_FMT_JSON)
    compare_json(&a, vi, units, rows, &b);
  else
    compare_table(&a, vi, units, rows, &b);
  if (!cli_write_output(a.cmd, a.output, &b))
    code = ZBCTL_EXIT_FAIL;
  zb_buf_free(&b);
  return code;
}
