/* zbpy_module.c — the extension module zb._libzb: libzb's planner called
 * in-process from Python (python/README.md; docs/schedules.md, From
 * Python).
 *
 * Functions (called by python/zb/__init__.py, which checks and converts
 * the user's arguments first, so these take plain numbers):
 *   plan(schedule, p, m, v, t_f, t_b, t_w, t_comm, m_f, m_b, m_w,
 *        limit_units, objective, stage_times) -> Result
 *        v 0: the family's default; limit_units <= 0: none; objective
 *        -1 none, 0 makespan, 1 span; stage_times None or a tuple of
 *        (T_F, T_B, T_W) float tuples. Plans with the GIL released.
 *   families() -> tuple of the schedule family names, libzb's order.
 *   ZbError: libzb refused (a ValueError); args[0] is zb's message,
 *        .error the zb_err's name ("invalid argument", "infeasible", ...).
 *
 * Ownership: the module keeps ZbError and the types (zbpy_result.h) for
 * its lifetime; plan's stage times are copied into a buffer freed before
 * it returns.
 */
#include "zbpy_result.h"

#include <stdlib.h>

static PyObject *zbpy_error; /* zb._libzb.ZbError, shown as zb.ZbError */

/* Raises ZbError(diag message) with .error = the code's name. */
static PyObject *zbpy_raise(zb_err err, const zb_diag *d) {
  PyObject *exc = PyObject_CallFunction(zbpy_error, "s", d->msg);
  if (!exc)
    return NULL;
  PyObject *name = PyUnicode_FromString(zb_strerror(err));
  if (name && PyObject_SetAttrString(exc, "error", name) == 0)
    PyErr_SetObject(zbpy_error, exc);
  Py_XDECREF(name);
  Py_DECREF(exc);
  return NULL;
}

/* Copies a tuple of (T_F, T_B, T_W) float tuples, which _args.py built,
 * into a new array; NULL with an exception set on anything else. */
static double (*zbpy_stage_times(PyObject *rows, int *n))[3] {
  if (!PyTuple_Check(rows)) {
    PyErr_SetString(PyExc_TypeError, "stage_costs must be a tuple of (T_F, T_B, T_W) tuples");
    return NULL;
  }
  Py_ssize_t count = PyTuple_GET_SIZE(rows);
  double(*t)[3] = calloc(count ? (size_t)count : 1, sizeof *t);
  if (!t)
    return (double(*)[3])PyErr_NoMemory();
  for (Py_ssize_t s = 0; s < count; s++)
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(rows, s), "ddd", &t[s][0], &t[s][1], &t[s][2])) {
      free(t);
      return NULL;
    }
  *n = (int)count;
  return t;
}

static PyObject *zbpy_plan_fn(PyObject *self, PyObject *args) {
  (void)self;
  zbpy_request req = {0};
  zb_rank_costs *rc = &req.rank;
  int objective;
  PyObject *rows;
  if (!PyArg_ParseTuple(args, "siiiddddddddiO", &req.schedule, &req.p, &req.m, &req.v, &rc->t_f, &rc->t_b,
                        &rc->t_w, &rc->t_comm, &rc->m_f, &rc->m_b, &rc->m_w, &req.limit_units, &objective,
                        &rows))
    return NULL;
  req.have_objective = objective >= 0;
  req.objective = objective == 1 ? ZB_OBJ_SPAN : ZB_OBJ_MAKESPAN;
  double(*times)[3] = NULL;
  if (rows != Py_None && !(times = zbpy_stage_times(rows, &req.n_stage_times)))
    return NULL;
  req.stage_times = (const double(*)[3])times;
  zbpy_plan pl;
  zb_diag d = {{0}};
  zb_err err;
  Py_BEGIN_ALLOW_THREADS err = zbpy_plan_run(&req, &pl, &d);
  Py_END_ALLOW_THREADS free(times);
  if (err) {
    zbpy_plan_free(&pl);
    return zbpy_raise(err, &d);
  }
  return zbpy_result_new(&pl);
}

static PyObject *zbpy_families(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *names = PyTuple_New(ZB_FAMILY_COUNT_);
  for (int f = 0; names && f < ZB_FAMILY_COUNT_; f++) {
    PyObject *name = PyUnicode_FromString(zb_family_name((zb_family)f));
    if (!name) {
      Py_CLEAR(names);
      break;
    }
    PyTuple_SET_ITEM(names, f, name);
  }
  return names;
}

static PyMethodDef zbpy_methods[] = {
    {"plan", zbpy_plan_fn, METH_VARARGS, "plan(...) -> Result; see zb.plan"},
    {"families", zbpy_families, METH_NOARGS, "the schedule family names"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef zbpy_module = {
    PyModuleDef_HEAD_INIT,
    "zb._libzb",
    "libzb, zb's schedule core, in-process (see zb).",
    -1,
    zbpy_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__libzb(void);
PyMODINIT_FUNC PyInit__libzb(void) {
  PyObject *m = PyModule_Create(&zbpy_module);
  if (!m)
    return NULL;
  zbpy_error = PyErr_NewExceptionWithDoc("zb.ZbError", "libzb refused a request; the message is zb's own.",
                                         PyExc_ValueError, NULL);
  if (!zbpy_error || PyModule_AddObjectRef(m, "ZbError", zbpy_error) < 0 || zbpy_result_types_init(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
