"""Build ``libplugin_MooncakeCore.so`` from the C++ source shipped in this package.

The nixl wheels carry no C++ headers and were built with GCC 14 / C++20 /
``_GLIBCXX_USE_CXX11_ABI=1``; Debian's g++ 12 produces a compatible plugin from our own ABI
declarations (``csrc/nixl_abi.h``). Building at install time instead of shipping a binary
keeps the wheel pure Python and the plugin matched to the machine's libstdc++.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from mooncake_connectors.nixl import backend

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "mooncake_core_plugin.cpp"
BUILD_ID_MARKER = b"mooncake-core-nixl-build:"
CXXFLAGS = ["-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-Wall", "-Wextra"]
LIBS = ["-ldl", "-pthread"]


class CompilerMissing(RuntimeError):
    """No C++ compiler on this machine."""


class BuildFailed(RuntimeError):
    """The compiler rejected the plugin source."""


def package_version() -> str:
    try:
        return metadata.version("mooncake-core")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_id() -> str:
    """Hash of everything that goes into the binary: sources, adapter ABI, package version."""
    h = hashlib.sha256()
    for p in sorted(CSRC.glob("*")):
        if p.suffix in (".cpp", ".h"):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(f"abi={backend.ADAPTER_ABI} version={package_version()}".encode())
    return h.hexdigest()[:16]


def installed_build_id(path: Path) -> str | None:
    """The build id embedded in an existing plugin binary, None if absent or unreadable."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    i = data.find(BUILD_ID_MARKER)
    if i < 0:
        return None
    j = data.find(b"\0", i)
    return data[i + len(BUILD_ID_MARKER):j].decode(errors="replace")


def find_compiler(cxx: str | None = None) -> str:
    """Path of the C++ compiler: ``cxx``, else $CXX, else g++ / c++ on PATH."""
    for cand in [c for c in (cxx, os.environ.get("CXX")) if c] + ["g++", "c++"]:
        path = shutil.which(cand)
        if path:
            return path
        if cand in (cxx, os.environ.get("CXX")):
            raise CompilerMissing(f"C++ compiler {cand!r} (from {'--cxx' if cand == cxx else '$CXX'}) not found")
    raise CompilerMissing("no C++ compiler found (looked for $CXX, g++, c++). The MooncakeCore NIXL plugin is "
                          "built on this machine; install the Debian package g++ (apt-get install g++) and run "
                          "`mooncake_nixl_plugin install` again")


def compile_plugin(out: Path, cxx: str | None = None, *, timeout: float = 300.0) -> str:
    """Compile the plugin to ``out`` (written atomically); returns the build id."""
    compiler = find_compiler(cxx)
    bid = build_id()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mooncake-nixl-build-") as tmp:
        obj = Path(tmp) / out.name
        cmd = [compiler, *CXXFLAGS, f'-DMOONCAKE_NIXL_BUILD_ID="{bid}"',
               f'-DMOONCAKE_NIXL_VERSION="{package_version()}"', "-I", str(CSRC), "-o", str(obj), str(SOURCE), *LIBS]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"{compiler} did not finish within {timeout:.0f} s") from None
        if r.returncode != 0:
            raise BuildFailed(f"{compiler} failed (exit {r.returncode}):\n{r.stderr.strip()}")
        staged = out.with_name(f".{out.name}.tmp{os.getpid()}")
        shutil.copyfile(obj, staged)
        os.chmod(staged, 0o755)
        os.replace(staged, out)  # never a half-written plugin where NIXL looks
    return bid
