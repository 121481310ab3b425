"""zb.plan's arguments checked and converted as zbctl plan's options are
(client/plan_args.c): the same bounds, the same defaults, errors that name
the argument. Bad types raise TypeError; bad values ZbError (a
ValueError) with zbctl's message, the option named as the argument.
"""
import math
import operator

from ._libzb import ZbError

# zbctl plan's bounds (client/plan_args.c): far above any real pipeline
MAX_RANKS = 4096
MAX_CHUNKS = 64
MAX_MICROBATCHES = 1000000

DEFAULT_COSTS = (1.0, 1.0, 1.0, 0.0)  # T_F, T_B, T_W, T_comm
DEFAULT_MEM = (1.0, -0.5, -0.5)  # M_F, M_B, M_W
OBJECTIVES = {"makespan": 0, "span": 1}


def whole(name, value, lo, hi, optional=False):
    """An int in [lo, hi] (None when optional and absent)."""
    if value is None and optional:
        return 0
    try:
        if isinstance(value, bool):
            raise TypeError
        x = operator.index(value)  # int, and numpy's integers
    except TypeError:
        raise TypeError(f"{name} must be an int (got {type(value).__name__})") from None
    if not lo <= x <= hi:
        raise ZbError(f"{name} must be between {lo} and {hi} (got {x})")
    return x


def _number(name, value):
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        x = float(value)  # int, float, and numpy's numbers
    except TypeError:
        raise TypeError(f"{name} must hold numbers (got {type(value).__name__})") from None
    if not math.isfinite(x):
        raise ZbError(f"{name} must hold finite numbers (got {value!r})")
    return x


def numbers_of(name, value, lo, hi, default):
    """lo..hi numbers from a sequence, or from a string 'a,b,c' as zbctl
    takes them; the default for None, its missing tail filled in."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            value = [float(part) for part in value.split(",")]
        except ValueError:
            raise ZbError(f"{name} takes {lo} to {hi} comma-separated numbers (got '{value}')") from None
    if isinstance(value, (bytes, dict)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of numbers or a string 'a,b,...' (got {type(value).__name__})")
    if not lo <= len(value) <= hi:
        want = f"{lo}" if lo == hi else f"{lo} or {hi}"
        raise ZbError(f"{name} takes {want} numbers (got {len(value)})")
    got = tuple(_number(name, x) for x in value)
    return got + tuple(default[len(got):])


def mem_limit_units(value, p):
    """zbctl's --mem-limit: 'Np' (N times 1F1B's peak, N*p units) or a
    positive number of M_F units; 0 for None (no limit)."""
    if value is None:
        return 0.0
    what = "mem_limit takes 'Np' (N times 1F1B's peak) or a positive number of M_F units"
    if isinstance(value, str):
        per_p = value.endswith("p")
        text = value[:-1] if per_p else value
        try:
            x = float(text) if text and not text[0].isspace() and not text[-1].isspace() else math.nan
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x > 0):
            raise ZbError(f"{what} (got '{value}')")
        return x * p if per_p else x
    x = _number("mem_limit", value)
    if not x > 0:
        raise ZbError(f"{what} (got {value!r})")
    return x


def objective_code(value):
    if value is None:
        return -1
    if not isinstance(value, str):
        raise TypeError(f"objective must be a str (got {type(value).__name__})")
    if value not in OBJECTIVES:
        raise ZbError(f"objective must be one of makespan, span (got '{value}')")
    return OBJECTIVES[value]


def stage_rows(value):
    """stage_costs: per stage (T_F, T_B, T_W), each >= 0; None: none."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"stage_costs must be a sequence of (T_F, T_B, T_W) (got {type(value).__name__})")
    rows = []
    for k, row in enumerate(value):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            raise TypeError(f"stage_costs[{k}] must be a sequence of 3 numbers (got {type(row).__name__})")
        if len(row) != 3:
            raise ZbError(f"stage_costs[{k}]: expected (T_F, T_B, T_W), three numbers >= 0 (got {len(row)})")
        t = tuple(_number(f"stage_costs[{k}]", x) for x in row)
        if min(t) < 0:
            raise ZbError(f"stage_costs[{k}]: expected (T_F, T_B, T_W), three numbers >= 0 (got {t})")
        rows.append(t)
    return tuple(rows)
