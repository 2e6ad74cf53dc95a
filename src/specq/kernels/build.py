"""Compile the C kernels shipped with specq (every `kernels/*.c`, into one shared object) once per
machine and load it with ctypes.

The shared object lives under `$SPECQ_CACHE/kernels/`, keyed by the sources, the flags and the
compiler's version, so a second process loads it in milliseconds. One object for all sources lets
one kernel call another (`decoder.c`'s layer stack calls the linear layers of `int8dot.c` and
`f32dot.c`). C without torch headers keeps the compile to a second or two (a torch C++ extension takes about a minute on two cores). The
kernels use OpenMP: `-fopenmp` links `libgomp.so.1`, which resolves to the copy torch has
already loaded, so specq's kernels and torch's ops share one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from ..paths import cache_dir

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared")


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here (no C compiler, or it failed); callers fall back."""


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH")
    return cc


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"{cc} --version failed: {e}") from e


@functools.cache
def available() -> bool:
    """Whether this CPU has AVX2 and specq's kernels build and load here; where not, the fast path
    keeps torch's ops."""
    import torch

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        load()
    except KernelUnavailable:
        return False
    return True


@functools.cache
def load() -> ctypes.CDLL:
    """specq's compiled kernels, built into the cache on first use."""
    files = sorted((f for f in resources.files("specq.kernels").iterdir() if f.name.endswith((".c", ".h"))),
                   key=lambda f: f.name)
    sources = {f.name: f.read_bytes() for f in files}  # headers too: they change what compiles
    cc = _compiler()
    key = hashlib.sha256(b"".join(name.encode() + src for name, src in sources.items())
                         + " ".join(FLAGS).encode() + _version(cc).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"specq-{key}.so"
    if not target.exists():
        units = [name for name in sources if name.endswith(".c")]
        print(f"specq: compiling specq's CPU kernels ({', '.join(units)}; once per machine, a few seconds)",
              file=sys.stderr)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            for name, source in sources.items():
                (Path(tmp) / name).write_bytes(source)
            out = Path(tmp) / "specq.so"
            done = subprocess.run([cc, *FLAGS, *(str(Path(tmp) / name) for name in units), "-o", str(out), "-lm"],
                                  capture_output=True, text=True)
            if done.returncode:
                raise KernelUnavailable(f"compiling specq's kernels failed: {done.stderr.strip().splitlines()[-1:]}")
            os.replace(out, target)  # atomic: a concurrent process sees no half-written file
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"loading {target} failed: {e}") from e
