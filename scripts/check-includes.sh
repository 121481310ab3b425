#!/usr/bin/env bash
# check-includes.sh — the layers of the coordinator's headers
# (docs/architecture.md, Processes): the quoted includes among daemon/'s
# files form no cycle, and the lower layers do not reach up: job_core
# (the job lifecycle's rules), the store and the config include neither
# coordinator.h nor anything of RPC, gRPC or libuv, so they build and test
# without them. In the worker, the executor and the transports reach no
# model header, even through others (docs/model.md, Backends): they see
# the backend's vtable only. Prints each offending include and exits 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bad=0
# the lower layers: what they may not include
for f in daemon/job_core.h daemon/job_core.c daemon/zb_store.h daemon/zb_store.c daemon/zb_store_internal.h \
         daemon/zb_store_upkeep.c daemon/coord_config.h daemon/coord_config.c; do
  while IFS= read -r hit; do
    echo "check-includes: $f includes $hit (a lower layer reaching up)" >&2
    bad=1
  done < <(grep -oE '#include [<"](coordinator\.h|metrics_internal\.h|zb_rpc[a-z_]*\.h|grpc/[^">]+|uv\.h)[">]' "$f" |
           sed -E 's/#include //')
done
# no cycle among daemon/'s headers (quoted includes that resolve in daemon/)
python3 - <<'PY' || bad=1
import os, re, sys
d = "daemon"
graph = {}
for name in os.listdir(d):
    if name.endswith(".h"):
        text = open(os.path.join(d, name)).read()
        graph[name] = [h for h in re.findall(r'#include "([^"]+)"', text) if os.path.exists(os.path.join(d, h))]
state = {}
def visit(n, path):
    if state.get(n) == 1:
        print("check-includes: include cycle: " + " -> ".join(path[path.index(n):] + [n]), file=sys.stderr)
        return False
    if state.get(n) == 2:
        return True
    state[n] = 1
    ok = all(visit(m, path + [n]) for m in graph.get(n, []))
    state[n] = 2
    return ok
sys.exit(0 if all(visit(n, []) for n in sorted(graph)) else 1)
PY
# the worker's executor and transports: no model header, transitively
python3 - <<'PY' || bad=1
import glob, os, re, sys
dirs = ["worker", "lib", "common", "util", "train", "model"]
def find(h):
    for d in dirs:
        if os.path.exists(os.path.join(d, h)):
            return os.path.join(d, h)
    return None
model = {"zb_model.h", "zb_device.h", "zb_arch.h", "zb_backend_cpu.h", "model_internal.h"}
ok = True
for f in ["worker/executor.c", "worker/zb_executor.h"] + sorted(glob.glob("worker/transport*.[ch]")) + ["worker/zb_transport.h"]:
    seen, frontier = set(), [f]
    while frontier:
        cur = frontier.pop()
        for h in re.findall(r'#include "([^"]+)"', open(cur).read()):
            if h in model:
                print("check-includes: %s reaches %s (through %s)" % (f, h, cur), file=sys.stderr)
                ok = False
            p = find(h)
            if p and p not in seen:
                seen.add(p)
                frontier.append(p)
sys.exit(0 if ok else 1)
PY
[[ $bad == 0 ]] && echo "check-includes: daemon/ headers form no cycle; job_core, the store and the config stand below coordinator.h; the executor and the transports reach no model header"
exit $bad
