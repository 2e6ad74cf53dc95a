"""How many multiply-adds a second one core's dot-product instructions reach, each alone: the ceiling
a kernel built on it can approach. Why: the 8-row verify pass at long contexts is bound by
attention's float multiply-adds (docs/fastpath.md), and a cache in BF16 would let vdpbf16ps take
two products a lane per instruction instead of vfmadd231ps's one; that pays only if vdpbf16ps
issues about as often as the FMA does. Each instruction runs in 16 independent chains (more than
any latency times issue width needs) on register operands, so what is timed is issue throughput.

    python benchmarks/bench_dot_instructions.py --rounds 5

Prints, per instruction this CPU has (the others are named and skipped), the median over rounds of
instructions per second and multiply-adds per second on one core, and its ratio to vfmadd231ps's
multiply-adds.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
from pathlib import Path

from specq.kernels import build

# name: (the CPU flags it needs, compiler flags, multiply-adds per instruction, the chains' type
# and zero, the statement updating chain a##i, the declarations of its operands)
INSTRUCTIONS = {
    "vfmadd231ps zmm (float32)": (
        ("avx512f",), ("-mavx512f",), 16, "__m512", "_mm512_setzero_ps()", "a##i = _mm512_fmadd_ps(x, y, a##i);",
        "__m512 x = _mm512_set1_ps(1e-3f), y = _mm512_set1_ps(1e-3f);"),
    "vdpbf16ps zmm (bf16 pairs into float32)": (
        ("avx512_bf16",), ("-mavx512f", "-mavx512bf16"), 32, "__m512", "_mm512_setzero_ps()",
        "a##i = _mm512_dpbf16_ps(a##i, x, y);",
        "__m512bh x = (__m512bh)_mm512_set1_epi16(0x3a83), y = (__m512bh)_mm512_set1_epi16(0x3a83);"),
    "vpdpbusd zmm (int8 quads into int32)": (
        ("avx512_vnni",), ("-mavx512f", "-mavx512vnni"), 64, "__m512i", "_mm512_setzero_si512()",
        "a##i = _mm512_dpbusd_epi32(a##i, u, s);", "__m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);"),
    "vfmadd231ps ymm (float32, AVX2)": (
        ("avx2", "fma"), ("-mavx2", "-mfma"), 8, "__m256", "_mm256_setzero_ps()", "a##i = _mm256_fmadd_ps(x, y, a##i);",
        "__m256 x = _mm256_set1_ps(1e-3f), y = _mm256_set1_ps(1e-3f);"),
}

SOURCE = """#include <immintrin.h>
#include <time.h>
#define CHAINS(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
/* Seconds for `n` rounds of one instruction in each of 16 chains; the empty asm keeps every chain
 * live in a register without adding work. */
double timed(long n, float *sink) {{
    {operands}
#define DECLARE(i) {chain} a##i = {zero};
    CHAINS(DECLARE)
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < n; r++) {{
#define STEP(i) {statement} __asm__ volatile("" : "+v"(a##i));
        CHAINS(STEP)
    }}
    clock_gettime(CLOCK_MONOTONIC, &t1);
#define SINK(i) *sink += (float)a##i[0];
    CHAINS(SINK)
    return (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}}
"""


def compile_instruction(name: str, workdir: Path) -> ctypes.CDLL:
    """The timing loop of instruction `name`, compiled with its flags."""
    _, flags, _, chain, zero, statement, operands = INSTRUCTIONS[name]
    unit = workdir / f"{list(INSTRUCTIONS).index(name)}.c"
    unit.write_text(SOURCE.format(chain=chain, zero=zero, statement=statement, operands=operands))
    out = unit.with_suffix(".so")
    done = subprocess.run([build.compiler(), "-O2", *flags, "-fPIC", "-shared", str(unit), "-o",
                           str(out)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name}: the compiler failed: {done.stderr.strip().splitlines()[-1]}")
    lib = ctypes.CDLL(str(out))
    lib.timed.restype = ctypes.c_double
    lib.timed.argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    return lib


def runs_here(name: str) -> bool:
    return set(INSTRUCTIONS[name][0]) <= build.cpu_flags()


def rates(lib: ctypes.CDLL, iterations: int, rounds: int) -> list[float]:
    """Instructions per second in each round (16 chains of `iterations`)."""
    sink = ctypes.c_float()
    lib.timed(iterations // 10, ctypes.byref(sink))  # warm up: clocks and caches
    return [16 * iterations / lib.timed(iterations, ctypes.byref(sink)) for _ in range(rounds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=50_000_000, help="rounds of the 16 chains per timing")
    args = ap.parse_args()
    if args.rounds < 1 or args.iterations < 1:
        raise SystemExit("--rounds and --iterations must be positive")
    if not runs_here("vfmadd231ps zmm (float32)"):
        raise SystemExit("this CPU has no AVX-512: nothing to compare here")
    print(f"one core of: {build.cpu_model()}; {args.rounds} rounds of {args.iterations} x 16 instructions")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, _, macs, *_) in INSTRUCTIONS.items():
            if not runs_here(name):
                print(f"{name}: not on this CPU")
                continue
            per_second = statistics.median(rates(compile_instruction(name, Path(tmp)), args.iterations, args.rounds))
            reference = reference or per_second * macs
            print(f"{name}: {per_second / 1e9:.2f} G instructions/s, {per_second * macs / 1e9:.1f} G multiply-adds/s, "
                  f"{per_second * macs / reference:.2f}x vfmadd231ps zmm's")


if __name__ == "__main__":
    main()
