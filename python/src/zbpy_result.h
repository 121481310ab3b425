/* zbpy_result.h — the Python face of one plan: the extension types
 * zb._libzb.Result (a planned zbpy_plan and what can be read of it),
 * zb.Action (one action of a rank's list) and zb.Figures (one
 * simulation's figures).
 *
 * Result is made only by zb._libzb.plan (zbpy_module.c); python/zb/
 * __init__.py wraps it in zb.Plan, which is what users see. Its methods:
 *   info()          (schedule name, chosen family, p, v, m, placement
 *                   "loop" or "v", stage -> rank tuple)
 *   figures(c)      zb.Figures of the lowered plan, or of the compute-
 *                   only lists when c is true
 *   actions(c)      per rank, a list of zb.Action: the lowered lists, or
 *                   the compute-only ones when c is true
 *   json(), csv(), csv_comm()   libzb's writers, zbctl plan -o's bytes
 * The writers and the list building run with the GIL released where no
 * Python object is touched.
 *
 * zb.Action is a struct sequence (a named tuple made in C, immutable):
 * kind (zb_op_name: "F", "B" the input gradient, "W", "BW" fused,
 * "SEND_F", "RECV_F", "SEND_B", "RECV_B", and the markers), stage,
 * microbatch (None for the FSDP kinds), peer (the other rank of a
 * SEND/RECV, else None); by name only (unpacking gives the four above):
 * batch (a SEND/RECV posted in one transport group with the next
 * action) and overlap (this compute action and the next run as one
 * overlapped pair, DualPipe-V's "(0F3;3B1)OVERLAP_F_B").
 *
 * zb.Figures is a struct sequence too: makespan, bubble_ratio,
 * bubble_ratio_paper, peak_memory (a tuple, per rank, in units of one
 * rank's M_F). Both are C types so that importing zb stays cheap (no
 * dataclasses, no collections).
 *
 * Ownership: a Result owns its zbpy_plan and frees it when Python frees
 * the Result (tp_dealloc); everything it returns is a new Python object
 * that owns nothing of libzb's.
 */
#ifndef ZBPY_RESULT_H
#define ZBPY_RESULT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "zbpy_plan.h"

/* Readies the types (once, at module init); adds them to module m.
 * Returns -1 with a Python exception set on failure. */
int zbpy_result_types_init(PyObject *m);
/* A new Result owning *pl (moved: *pl is zeroed), or NULL with an
 * exception set (pl then freed). */
PyObject *zbpy_result_new(zbpy_plan *pl);

#endif
