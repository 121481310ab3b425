#!/bin/sh
# run-torch-python.sh DEFAULT_PYTHON SCRIPT ARGS...: runs SCRIPT with the
# Python that has torch: $ZB_TORCH_PYTHON, else DEFAULT_PYTHON (the
# checkout's build/venv-hf). Without that interpreter: exit 77, a skip
# that says which path it looked for.
py="${ZB_TORCH_PYTHON:-$1}"
shift
if [ ! -x "$py" ]; then
  echo "skip: no Python with torch at $py (set ZB_TORCH_PYTHON to one)"
  exit 77
fi
exec "$py" "$@"
