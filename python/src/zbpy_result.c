/* zbpy_result.c — zb._libzb.Result and zb.Action; see zbpy_result.h. */
#include "zbpy_result.h"

#include "zb_format.h"

typedef struct zbpy_result {
  PyObject_HEAD zbpy_plan plan;
} zbpy_result;

static PyTypeObject zbpy_action_type;
static PyTypeObject zbpy_figures_type;
/* The kind names as Python strings, one per zb_op, made once: a plan of
 * thousands of actions shares them. */
static PyObject *zbpy_kind_names[ZB_OP_COUNT_];

static PyStructSequence_Field zbpy_action_fields[] = {
    {"kind", "F, B (input gradient), W, BW (fused), SEND_F, RECV_F, SEND_B, RECV_B or a marker"},
    {"stage", "the stage (for SEND the sending one, for RECV the receiving one)"},
    {"microbatch", "the microbatch, or None"},
    {"peer", "the other rank of a SEND/RECV, or None"},
    {"batch", "a SEND/RECV posted in one transport group with the next action"},
    {"overlap", "a compute action run as one overlapped pair with the next (DualPipe-V)"},
    {NULL, NULL},
};

static PyStructSequence_Desc zbpy_action_desc = {
    "zb.Action",
    "One action of a rank's list: kind, stage, microbatch, peer (docs/schedules.md, Vocabulary).",
    zbpy_action_fields, 4, /* batch and overlap by name only: (kind, stage, microbatch, peer) unpacks */
};

static PyStructSequence_Field zbpy_figures_fields[] = {
    {"makespan", "one iteration, first start to last end"},
    {"bubble_ratio", "1 - busy / (p * makespan)"},
    {"bubble_ratio_paper", "the ZB paper's: (S_max - m(T_F+T_B+T_W)) / S_max"},
    {"peak_memory", "per rank, in units of one rank's M_F (1F1B's peak is p)"},
    {NULL, NULL},
};

static PyStructSequence_Desc zbpy_figures_desc = {
    "zb.Figures",
    "One simulation of a plan (docs/schedules.md, Figures).",
    zbpy_figures_fields,
    4,
};

static void zbpy_result_dealloc(PyObject *self) {
  zbpy_plan_free(&((zbpy_result *)self)->plan);
  Py_TYPE(self)->tp_free(self);
}

static const zb_schedule *zbpy_lists(zbpy_result *self, int compute) {
  return compute ? self->plan.result.compute : self->plan.result.lowered;
}

static PyObject *zbpy_int_or_none(long x) {
  if (x < 0)
    Py_RETURN_NONE;
  return PyLong_FromLong(x);
}

static PyObject *zbpy_action_new(const zb_action *a) {
  PyObject *t = PyStructSequence_New(&zbpy_action_type);
  if (!t)
    return NULL;
  zb_op op = (zb_op)a->op;
  PyObject *kind = op < ZB_OP_COUNT_ ? zbpy_kind_names[op] : Py_None;
  Py_INCREF(kind);
  PyStructSequence_SET_ITEM(t, 0, kind);
  PyStructSequence_SET_ITEM(t, 1, PyLong_FromLong((long)a->stage));
  PyStructSequence_SET_ITEM(t, 2, zbpy_int_or_none((long)a->mb));
  PyStructSequence_SET_ITEM(t, 3, zb_op_is_comm(op) ? zbpy_int_or_none((long)a->peer) : Py_NewRef(Py_None));
  PyStructSequence_SET_ITEM(t, 4, PyBool_FromLong(a->batch));
  PyStructSequence_SET_ITEM(t, 5, PyBool_FromLong(a->overlap));
  for (int k = 1; k < 4; k++)
    if (!PyStructSequence_GET_ITEM(t, k)) {
      Py_DECREF(t);
      return NULL;
    }
  return t;
}

static PyObject *zbpy_rank_actions(const zb_rank_list *l) {
  PyObject *list = PyList_New(l->n);
  for (int i = 0; list && i < l->n; i++) {
    PyObject *a = zbpy_action_new(&l->actions[i]);
    if (!a) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, a);
  }
  return list;
}

static PyObject *zbpy_result_actions(PyObject *self, PyObject *arg) {
  const zb_schedule *s = zbpy_lists((zbpy_result *)self, PyObject_IsTrue(arg));
  if (!s)
    Py_RETURN_NONE;
  PyObject *ranks = PyList_New(s->p);
  for (int r = 0; ranks && r < s->p; r++) {
    PyObject *l = zbpy_rank_actions(&s->ranks[r]);
    if (!l) {
      Py_CLEAR(ranks);
      break;
    }
    PyList_SET_ITEM(ranks, r, l);
  }
  return ranks;
}

static PyObject *zbpy_result_figures(PyObject *self, PyObject *arg) {
  const zb_planner_result *r = &((zbpy_result *)self)->plan.result;
  const zb_sim_result *sim = PyObject_IsTrue(arg) ? r->sim_compute : r->sim;
  if (!sim)
    Py_RETURN_NONE;
  PyObject *peak = PyTuple_New(sim->p);
  for (int k = 0; peak && k < sim->p; k++) {
    PyObject *x = PyFloat_FromDouble(sim->peak_memory_units[k]);
    if (!x) {
      Py_CLEAR(peak);
      break;
    }
    PyTuple_SET_ITEM(peak, k, x);
  }
  PyObject *f = peak ? PyStructSequence_New(&zbpy_figures_type) : NULL;
  if (!f) {
    Py_XDECREF(peak);
    return NULL;
  }
  const double x[3] = {sim->makespan, sim->bubble_ratio, sim->bubble_ratio_paper};
  for (int k = 0; k < 3; k++)
    PyStructSequence_SET_ITEM(f, k, PyFloat_FromDouble(x[k]));
  PyStructSequence_SET_ITEM(f, 3, peak);
  for (int k = 0; k < 3; k++)
    if (!PyStructSequence_GET_ITEM(f, k)) {
      Py_DECREF(f);
      return NULL;
    }
  return f;
}

static PyObject *zbpy_result_info(PyObject *self, PyObject *unused) {
  (void)unused;
  const zbpy_plan *pl = &((zbpy_result *)self)->plan;
  const zb_planner_result *r = &pl->result;
  int stages = r->p * r->v;
  PyObject *placement = PyTuple_New(stages);
  for (int s = 0; placement && s < stages; s++) {
    PyObject *rank = PyLong_FromLong(zb_placement_rank(r->placement, r->p, r->v, s));
    if (!rank) {
      Py_CLEAR(placement);
      break;
    }
    PyTuple_SET_ITEM(placement, s, rank);
  }
  if (!placement)
    return NULL;
  return Py_BuildValue("(ssiiisN)", pl->name, zb_family_name(r->chosen), r->p, r->v, r->m,
                       r->placement == ZB_PLACE_V ? "v" : "loop", placement);
}

/* One of libzb's writers into a new str, the GIL released while it
 * writes. */
enum zbpy_format { ZBPY_JSON, ZBPY_CSV, ZBPY_CSV_COMM };

static PyObject *zbpy_result_write(zbpy_result *self, enum zbpy_format f) {
  zb_buf b = ZB_BUF_INIT;
  const zb_planner_result *r = &self->plan.result;
  Py_BEGIN_ALLOW_THREADS switch (f) {
  case ZBPY_JSON: zbpy_plan_json(&self->plan, &b); break;
  case ZBPY_CSV: zb_csv_write(r->compute, &b); break;
  case ZBPY_CSV_COMM: zb_csv_write_comms(r->lowered, &b); break;
  }
  Py_END_ALLOW_THREADS PyObject *text = PyUnicode_DecodeUTF8(b.data ? b.data : "", (Py_ssize_t)b.len, NULL);
  zb_buf_free(&b);
  return text;
}

static PyObject *zbpy_result_json(PyObject *self, PyObject *unused) {
  (void)unused;
  return zbpy_result_write((zbpy_result *)self, ZBPY_JSON);
}
static PyObject *zbpy_result_csv(PyObject *self, PyObject *unused) {
  (void)unused;
  return zbpy_result_write((zbpy_result *)self, ZBPY_CSV);
}
static PyObject *zbpy_result_csv_comm(PyObject *self, PyObject *unused) {
  (void)unused;
  return zbpy_result_write((zbpy_result *)self, ZBPY_CSV_COMM);
}

static PyMethodDef zbpy_result_methods[] = {
    {"info", zbpy_result_info, METH_NOARGS, "(name, family, p, v, m, placement kind, stage -> rank)"},
    {"figures", zbpy_result_figures, METH_O, "figures(compute_only) -> zb.Figures"},
    {"actions", zbpy_result_actions, METH_O, "actions(compute_only): per rank, a list of zb.Action"},
    {"json", zbpy_result_json, METH_NOARGS, "zbctl plan -o json"},
    {"csv", zbpy_result_csv, METH_NOARGS, "zbctl plan -o csv"},
    {"csv_comm", zbpy_result_csv_comm, METH_NOARGS, "zbctl plan -o csv-comm"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject zbpy_result_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zb._libzb.Result",
    .tp_basicsize = sizeof(zbpy_result),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One plan made by libzb (wrapped by zb.Plan).",
    .tp_dealloc = zbpy_result_dealloc,
    .tp_methods = zbpy_result_methods,
};

int zbpy_result_types_init(PyObject *m) {
  for (int op = 0; op < ZB_OP_COUNT_; op++)
    if (!(zbpy_kind_names[op] = PyUnicode_InternFromString(zb_op_name((zb_op)op))))
      return -1;
  if (PyType_Ready(&zbpy_result_type) < 0 ||
      PyStructSequence_InitType2(&zbpy_action_type, &zbpy_action_desc) < 0 ||
      PyStructSequence_InitType2(&zbpy_figures_type, &zbpy_figures_desc) < 0)
    return -1;
  if (PyModule_AddObjectRef(m, "Result", (PyObject *)&zbpy_result_type) < 0 ||
      PyModule_AddObjectRef(m, "Figures", (PyObject *)&zbpy_figures_type) < 0)
    return -1;
  return PyModule_AddObjectRef(m, "Action", (PyObject *)&zbpy_action_type);
}

PyObject *zbpy_result_new(zbpy_plan *pl) {
  zbpy_result *self = PyObject_New(zbpy_result, &zbpy_result_type);
  if (!self) {
    zbpy_plan_free(pl);
    return NULL;
  }
  self->plan = *pl;
  memset(pl, 0, sizeof *pl);
  return (PyObject *)self;
}
