"""Compile the C kernels shipped with specq (every `kernels/*.c`, into one shared object) once per
machine and instruction-set variant, pick the best variant this CPU runs, and load it with ctypes.

Variants (`VARIANTS`) are the same sources compiled with more instruction sets enabled; the sources
choose their code with `#if defined(__AVX512F__)` and the like. The CPU's flags are read once from
/proc/cpuinfo (torch's `get_cpu_capability` names AVX-512 only coarsely and not VNNI); the best
variant it runs that also compiles serves the whole process, and `SPECQ_KERNELS` forces a lower one,
or `torch` for none of specq's kernels (for tests and comparisons). Within one variant every row of
a kernel is computed the same whatever the row count; across variants the float reductions may be
summed in another order, so results may differ in rounding (each kernel's source says where).
`variant()` names the one running (for `--explain` and the stats to print).

Each shared object lives under `$SPECQ_CACHE/kernels/`, keyed by the sources, the flags and the
compiler's version, so a second process loads it in milliseconds. One object for all sources lets
one kernel call another (`decoder.c`'s layer stack calls the linear layers of `int8dot.c` and
`f32dot.c`). C without torch headers keeps the compile to a second or two (a torch C++ extension
takes about a minute on two cores). The kernels use OpenMP: `-fopenmp` links `libgomp.so.1`, which
resolves to the copy torch has already loaded, so specq's kernels and torch's ops
share one thread pool.
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

from ..errors import SpecqError
from ..paths import cache_dir

FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared")

_AVX2 = {"avx2": "-mavx2", "fma": "-mfma", "f16c": "-mf16c"}
_AVX512 = {**_AVX2, "avx512f": "-mavx512f", "avx512bw": "-mavx512bw", "avx512vl": "-mavx512vl",
           "avx512dq": "-mavx512dq"}
# name: the CPU flags it needs (as /proc/cpuinfo names them), each with the compiler flag that
# enables it; worst first, so the best a CPU runs is the last it has every flag of.
VARIANTS = {
    "avx2": _AVX2,
    # AVX2 machines with AVX-VNNI (Alder Lake and later)
    "avxvnni": {**_AVX2, "avx_vnni": "-mavxvnni"},
    "avx512": _AVX512,
    "avx512vnni": {**_AVX512, "avx512_vnni": "-mavx512vnni"},
}
TORCH = "torch"  # no variant: torch's ops
ENV = "SPECQ_KERNELS"


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here (no C compiler, or it
    failed); callers fall back."""


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in Linux's /proc/cpuinfo (None where it cannot be read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.split(":", 1)[0].strip() == field), None)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (none where it cannot be read: then no
    variant runs and torch's ops serve)."""
    return frozenset((_cpuinfo("flags") or "").split())


@functools.cache
def cpu_model() -> str | None:
    """This CPU's model name as /proc/cpuinfo gives it (None where it cannot be read): what a speed
    measured here depends on beside the variant, recorded with results."""
    return _cpuinfo("model name")


def runnable() -> tuple[str, ...]:
    """The variants this CPU runs, worst first."""
    return tuple(name for name, needs in VARIANTS.items() if needs.keys() <= cpu_flags())


def forced() -> str | None:
    """The variant `SPECQ_KERNELS` asks for (None where unset); an unknown name, or one this CPU
    does not run, is a `SpecqError`. Cheap: the CLI checks it before loading any model."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if name != TORCH and name not in VARIANTS:
        raise SpecqError(f"{ENV}={name}: unknown kernel variant (choose from "
                         f"{', '.join([TORCH, *VARIANTS])})")
    if name != TORCH and name not in runnable():
        missing = sorted(VARIANTS[name].keys() - cpu_flags())
        raise SpecqError(f"{ENV}={name}: this CPU lacks {', '.join(missing)} "
                         f"(it runs {', '.join([TORCH, *runnable()])})")
    return name


@functools.cache
def variant() -> str:
    """The variant this process runs specq's kernels with, chosen once: `SPECQ_KERNELS`'s, else the
    best this CPU runs that compiles here (a compiler too old for its flags: the next one down);
    `torch` where none does (specq's kernels are off, torch's ops serve). Each failure is a note on
    stderr."""
    name = forced()
    candidates = [] if name == TORCH else [name] if name else list(reversed(runnable()))
    if candidates and not _has_compiler():
        return TORCH
    for candidate in candidates:
        try:
            _load(candidate)
            return candidate
        except KernelUnavailable as e:
            print(f"specq: {e}; not using the {candidate} kernels", file=sys.stderr)
    return TORCH


def available() -> bool:
    """Whether specq's kernels run here (a variant this CPU runs builds and loads); where not, the
    fast path keeps torch's ops."""
    return variant() != TORCH


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH")
    return cc


def _has_compiler() -> bool:
    """Whether a C compiler is here (else one note: no variant can build)."""
    try:
        compiler()
    except KernelUnavailable as e:
        print(f"specq: {e}: specq's CPU kernels are off, torch's ops run", file=sys.stderr)
        return False
    return True


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"{cc} --version failed: {e}") from e


def load(name: str | None = None) -> ctypes.CDLL:
    """specq's kernels compiled for variant `name` (one of `VARIANTS`; by default `variant()`'s),
    built into the cache on first use."""
    name = name or variant()
    if name == TORCH:
        raise KernelUnavailable(f"specq's kernels are off ({ENV}={TORCH}, or none builds or runs "
                                "here)")
    return _load(name)


def _flags(name: str) -> tuple[str, ...]:
    """The compiler flags of variant `name`."""
    return (*FLAGS, *VARIANTS[name].values())


def compile_units(units: list[Path], name: str, out: Path, cc: str | None = None) -> None:
    """C sources `units` compiled for variant `name` into one shared object `out` (with `cc`, by
    default this machine's compiler); KernelUnavailable with the compiler's
    last line if it fails."""
    done = subprocess.run([cc or compiler(), *_flags(name), *map(str, units), "-o",
                           str(out), "-lm"],
                          capture_output=True, text=True)
    if done.returncode:
        raise KernelUnavailable(f"compiling specq's {name} kernels failed: "
                                f"{done.stderr.strip().splitlines()[-1:]}")


@functools.cache
def _load(name: str) -> ctypes.CDLL:
    files = sorted((f for f in resources.files("specq.kernels").iterdir()
                    if f.name.endswith((".c", ".h"))),
                   key=lambda f: f.name)
    sources = {f.name: f.read_bytes() for f in files}  # headers too: they change what compiles
    cc = compiler()
    key = hashlib.sha256(b"".join(unit.encode() + src for unit, src in sources.items())
                         + " ".join(_flags(name)).encode() + _version(cc).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"specq-{name}-{key}.so"
    if not target.exists():
        units = [unit for unit in sources if unit.endswith(".c")]
        print(f"specq: compiling specq's CPU kernels ({name}: {', '.join(units)}; once per machine "
              "and variant, a few seconds)", file=sys.stderr)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            for unit, source in sources.items():
                (Path(tmp) / unit).write_bytes(source)
            out = Path(tmp) / "specq.so"
            compile_units([Path(tmp) / unit for unit in units], name, out, cc)
            os.replace(out, target)  # atomic: a concurrent process sees no half-written file
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"loading {target} failed: {e}") from e
