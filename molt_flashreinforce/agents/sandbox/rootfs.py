"""The sandbox's minimal root filesystem, as bubblewrap arguments.

``RootFs.discover()`` looks once at this machine's interpreter and returns what a call sees:

* read-only: ``/usr`` (and the ``/bin``, ``/lib``... links or directories of a merged or split
  root), the base interpreter (not a virtual environment's wrapper), its standard library and
  shared library, and the tool packages (``TOOL_PACKAGES``, those installed) mounted into the
  interpreter's own site-packages, whose host contents are hidden;
* private and size-capped: the scratch directory ``/scratch`` (the working directory, ``HOME``
  and ``TMPDIR``; a tmpfs that disappears with the call) and ``/dev/shm``; a minimal ``/dev``
  and a ``/proc`` of the call's PID namespace;
* nothing else: no ``/tmp``, ``/home``, ``/root``, ``/run``, ``/var``, ``/etc``, no repository,
  data, Ray or socket directory, unless it lives under ``/usr``.

``RootFs.bwrap_args`` adds the namespaces (all of bubblewrap's: user, mount, PID, network,
IPC, UTS, cgroup), a new terminal session, death with the parent and no further user
namespaces. The code file and the seccomp filter come in through file descriptors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass

# What the math tool task imports; mpmath comes with sympy. Missing ones are skipped.
TOOL_PACKAGES = ("numpy", "sympy", "mpmath")
SCRATCH = "/scratch"
_ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class RootFs:
    interpreter: str  # the base interpreter's real path, the same inside and outside
    mounts: tuple[str, ...]  # the bubblewrap arguments that build the root
    # Untraversable ancestor -> directories below it that bubblewrap must reach (launcher.py).
    hidden: dict[str, list[str]]

    @classmethod
    def discover(cls, packages: tuple[str, ...] = TOOL_PACKAGES) -> RootFs:
        interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        args = ["--ro-bind", "/usr", "/usr"]
        for entry in _ROOT_ENTRIES:
            path = "/" + entry
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        layout = _layout(interpreter)
        sources = [path for path in _interpreter_paths(interpreter, layout) if not _covered(path)]
        for path in sources:
            args += ["--ro-bind", path, path]
        site_dirs = [path for path in layout["site"] if os.path.isdir(path)]
        for site in site_dirs:
            args += ["--tmpfs", site]
        if site_dirs:
            for source in _package_paths(packages):
                sources.append(source)
                args += ["--ro-bind", source, os.path.join(site_dirs[0], os.path.basename(source))]
            for site in site_dirs:
                args += ["--remount-ro", site]
        return cls(interpreter=interpreter, mounts=tuple(args), hidden=_hidden(sources))

    def bwrap_args(self, *, code_fd: int, seccomp_fd: int, scratch_bytes: int, shm_bytes: int) -> list[str]:
        return [
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            *self.mounts,
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev",
            "--size", str(scratch_bytes), "--tmpfs", SCRATCH,
            "--file", str(code_fd), os.path.join(SCRATCH, "main.py"),
            "--remount-ro", "/",
            "--chdir", SCRATCH,
            "--seccomp", str(seccomp_fd),
            "--",
        ]  # fmt: skip


def _covered(path: str) -> bool:
    return path == "/usr" or path.startswith("/usr/")


def _hidden(sources: list[str]) -> dict[str, list[str]]:
    """Group the directories of ``sources`` under their outermost untraversable ancestor."""
    hidden: dict[str, list[str]] = {}
    for source in sources:
        directory = source if os.path.isdir(source) else os.path.dirname(source)
        current = ""
        for part in directory.split("/")[1:]:
            current += "/" + part
            if not os.stat(current).st_mode & stat.S_IXOTH:
                if directory not in hidden.setdefault(current, []):
                    hidden[current].append(directory)
                break
    return hidden


_LAYOUT_PROBE = """
import json, os, site, sysconfig
library = os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or "")
print(json.dumps({
    "stdlib": [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")],
    "library": library if os.path.isfile(library) else None,
    "site": site.getsitepackages(),
}))
"""


def _layout(interpreter: str) -> dict:
    """Where the base interpreter (not a virtual environment) keeps its library and sites."""
    probe = [interpreter, "-I", "-c", _LAYOUT_PROBE]
    out = subprocess.run(probe, capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def _interpreter_paths(interpreter: str, layout: dict) -> list[str]:
    """The interpreter, its standard library and its shared library, outermost first."""
    paths = {interpreter, *(os.path.realpath(p) for p in layout["stdlib"])}
    if layout["library"]:
        paths.add(os.path.realpath(layout["library"]))
    ordered = sorted(p for p in paths if os.path.exists(p))
    return [p for p in ordered if not any(p.startswith(q + "/") for q in ordered if q != p)]


def _package_paths(packages: tuple[str, ...]) -> list[str]:
    """Installed directories (or single files) of ``packages``, with their bundled libraries."""
    found = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            location = os.path.realpath(list(spec.submodule_search_locations)[0])
        else:
            location = os.path.realpath(spec.origin)
        found.append(location)
        bundled = location + ".libs"  # auditwheel puts a wheel's shared libraries beside it
        if os.path.isdir(bundled):
            found.append(bundled)
    return found
