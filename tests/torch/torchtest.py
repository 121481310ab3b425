"""What the zb.torch tests share: they run under the Python that has
torch (tests/torch/run-torch-python.sh) with the zb package installed into
it (ctest's fixture torch_install_zb: pip install ./python). Exits 77 (a
ctest skip) where torch is missing; a missing zb package is a failure,
since the fixture installs it."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch is not importable by", sys.executable)
        sys.exit(77)
    import zb  # noqa: F401  (installed by the fixture; an ImportError here fails the test)


def zbctl_path():
    path = os.environ.get("ZBCTL_BIN", os.path.join(SRC, "build", "dev", "client", "zbctl"))
    if not os.access(path, os.X_OK):
        print("SKIP: no zbctl at", path, "(set ZBCTL_BIN)")
        sys.exit(77)
    return path
