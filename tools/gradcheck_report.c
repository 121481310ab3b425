/* gradcheck_report.c — what one iteration's check found, as a summary
 * line (the tensor table is printed while comparing) or as one JSON object
 * (--json) (gradcheck.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "gradcheck.h"
#include "zb_buf.h"

/* A JSON string, escaped by libzb's one JSON writer (zb_buf.h). */
static void json_str(const char *s) {
  zb_buf b = ZB_BUF_INIT;
  zb_buf_json_str(&b, s);
  fwrite(b.data, 1, b.len, stdout);
  zb_buf_free(&b);
}

/* A number, or null where it is unknown or not finite (JSON has no NaN). */
static void json_num(const char *key, double v, bool have) {
  printf(",\"%s\":", key);
  if (have && isfinite(v))
    printf("%.9g", v);
  else
    fputs("null", stdout);
}

void gc_report(const gc_iter *it) {
  const gc_opts *o = it->o;
  bool ok = it->status == 0;
  if (o->json) {
    printf("{\"iteration\":%d,\"job_id\":", it->iteration);
    json_str(it->job_id);
    printf(",\"stages\":%d,\"microbatches\":%d,\"data_parallel\":%d", it->stages, it->microbatches,
           it->data_parallel);
    json_num("tensors", it->tensors, it->mapped);
    json_num("parameters", (double)it->params, it->mapped);
    json_num("max_rel_err", it->max_rel, it->compared);
    fputs(",\"worst_tensor\":", stdout);
    if (it->compared)
      json_str(it->worst);
    else
      fputs("null", stdout);
    json_num("loss", it->loss, it->compared);
    json_num("loss_ref", it->loss_ref, it->compared);
    json_num("loss_rel_err", it->loss_rel, it->compared);
    printf(",\"replicas_identical\":%s", it->replicas_identical < 0 ? "null"
                                         : it->replicas_identical   ? "true"
                                                                    : "false");
    printf(",\"init_identical\":%s,\"skipped\":%s,\"ok\":%s,\"error\":",
           it->init < 0 ? "null"
           : it->init   ? "true"
                        : "false",
           it->skipped ? "true" : "false", ok ? "true" : "false");
    if (it->error[0])
      json_str(it->error);
    else
      fputs("null", stdout);
    fputs("}\n", stdout);
    return;
  }
  printf("iteration %d: ", it->iteration);
  if (!it->mapped) {
    printf("%s (%s)\n", it->status == 2 ? "NOT CHECKED" : "FAILED", it->error);
    return;
  }
  printf("%d stages, %d tensors, %zu parameters", it->stages, it->tensors, it->params);
  if (it->init >= 0)
    printf("; initial weights %s", it->init ? "identical" : "DIFFER");
  if (it->replicas_identical >= 0)
    printf("; %d replicas %s", it->data_parallel, it->replicas_identical ? "bit-identical" : "DIFFER");
  if (it->skipped && it->status == 0) {
    printf("; skipped (non-finite gradients, not compared)\n");
    return;
  }
  if (it->compared)
    printf("; max %s error %.1e (%s), loss %.6g vs %.6g (rel %.1e)",
           it->abs_used ? "relative (absolute where g_ref = 0)" : "relative", it->max_rel, it->worst,
           it->loss, it->loss_ref, it->loss_rel);
  printf(": %s (tolerance %g)\n", ok ? "OK" : it->status == 2 ? "NOT CHECKED" : "FAILED", o->tol);
}
