"""Builds zb._libzb from lib/'s C sources and python/src/.

lib/CMakeLists.txt is the one list of libzb's sources: its
add_library(zb STATIC ...) block is read here, so a file added to
libzb builds into the package without an edit here. The package is
built from the checkout (pip install ./python): lib/ lies beside
python/, found relative to this file.
"""
import glob
import os
import re

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.normpath(os.path.join(HERE, "..", "lib"))
PROTO = os.path.normpath(os.path.join(HERE, "..", "proto"))
SRC = os.path.join(HERE, "src")


def lib_sources():
    """The .c files of add_library(zb STATIC ...) in lib/CMakeLists.txt."""
    path = os.path.join(LIB, "CMakeLists.txt")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"zb: cannot read {path} ({e.strerror}): build the package from a zb checkout")
    block = re.search(r"add_library\(\s*zb\s+STATIC\s+([^)]*)\)", text)
    if not block:
        raise SystemExit(f"zb: {path} has no add_library(zb STATIC ...) block")
    names = [w for w in block.group(1).split() if w.endswith(".c")]
    if not names:
        raise SystemExit(f"zb: {path}'s add_library(zb STATIC ...) lists no .c file")
    # relative to this file: setuptools refuses absolute source paths
    return [os.path.join("..", "lib", n) for n in names]


ext = Extension(
    "zb._libzb",
    sources=[os.path.join("src", n) for n in ("zbpy_module.c", "zbpy_result.c", "zbpy_plan.c")] + lib_sources(),
    include_dirs=[LIB, SRC],
    # a changed header rebuilds the extension (setuptools compares times)
    depends=sorted(glob.glob(os.path.join(LIB, "*.h")) + glob.glob(os.path.join(SRC, "*.h"))),
    # the build's own settings (CMakeLists.txt): C11, POSIX 2008
    define_macros=[("_POSIX_C_SOURCE", "200809L")],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
    libraries=["m"],
)

class build_py_with_stubs(build_py):
    """Also generates zb.v1 (zb_pb2, zb_pb2_grpc) from proto/zb/v1/zb.proto
    with grpcio-tools, for zb.torch.attach (docs/pytorch.md). The proto's
    package zb.v1 is this package's subpackage, so the stubs' own imports
    (from zb.v1 import zb_pb2) resolve here. Without grpcio-tools (a build
    without isolation in an environment that lacks it) the package builds
    without them: planning works, attach says how to get them."""

    def run(self):
        super().run()
        try:
            from grpc_tools import protoc
        except ImportError:
            print("zb: grpcio-tools not importable: building without zb.v1 (zb.torch.attach needs it; "
                  "pip install 'grpcio-tools' into the build environment)")
            return
        out = os.path.join(self.build_lib, "zb", "v1")
        os.makedirs(out, exist_ok=True)
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        rc = protoc.main(["protoc", "-I" + PROTO, "-I" + include, "--python_out=" + self.build_lib,
                          "--grpc_python_out=" + self.build_lib, os.path.join(PROTO, "zb", "v1", "zb.proto")])
        if rc != 0:
            raise SystemExit(f"zb: grpc_tools.protoc failed ({rc}) on {PROTO}/zb/v1/zb.proto")
        with open(os.path.join(out, "__init__.py"), "w", encoding="utf-8") as f:
            f.write('"""zb.v1: the wire (proto/zb/v1/zb.proto), generated at build time."""\n')


setup(ext_modules=[ext], cmdclass={"build_py": build_py_with_stubs})
