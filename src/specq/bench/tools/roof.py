"""The machine's int8 multiply-add rate: the roof a multi-row pass meets once its weights are read
at the memory's rate (a 16-row pass of a 7B model multiplies 16 times the step's weights).

Each thread runs CHAINS independent chains of the variant's widest int8 product (AVX-512 or AVX
VNNI's vpdpbusd; AVX2's vpmaddubsw + vpmaddwd + vpaddd) on registers, no memory. Compiled apart
from specq's kernels, with their flags: a loop that measures the machine is not part of the product.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import tempfile
import time
from pathlib import Path

from ...kernels import build
from . import shapes

CHAINS = 12  # independent accumulators per thread: more than a product's latency x throughput
SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#if defined(__AVX512VNNI__)
typedef __m512i V;
#define ONE(v) _mm512_set1_epi8(v)
#define MAC(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define LANES 64
#elif defined(__AVXVNNI__)
typedef __m256i V;
#define ONE(v) _mm256_set1_epi8(v)
#define MAC(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#define LANES 32
#else
typedef __m256i V;
#define ONE(v) _mm256_set1_epi8(v)
#define MAC(acc, a, b) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#define LANES 32
#endif
int lanes(void) { return LANES; }
/* steps x CHAINS products of ones per thread; returns the sum of one lane of every chain over the
 * threads (CHAINS x steps x 4 each), so that nothing is elided and the count can be checked */
int64_t run(int threads, int64_t steps) {
    int64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        V acc[CHAINS];
        V a = ONE(1), b = ONE(1);
        for (int j = 0; j < CHAINS; j++) acc[j] = ONE(0);
        for (int64_t i = 0; i < steps; i++) {
            for (int j = 0; j < CHAINS; j++) acc[j] = MAC(acc[j], a, b);
            __asm__ volatile("" : "+v"(a));
        }
        int32_t out[LANES / 4];
        for (int j = 1; j < CHAINS; j++) acc[0] = acc[0] + acc[j];
        __builtin_memcpy(out, &acc[0], sizeof out);
        sink += out[0];
    }
    return sink;
}
""".replace("CHAINS", str(CHAINS))


@functools.cache
def library(variant: str) -> ctypes.CDLL:
    """The loop compiled for `variant` (one of `build.VARIANTS`)."""
    with tempfile.TemporaryDirectory(prefix="specq-roof-") as tmp:  # loaded, the file may go
        (Path(tmp) / "roof.c").write_text(SOURCE)
        build.compile_units([Path(tmp) / "roof.c"], variant, Path(tmp) / "roof.so")
        lib = ctypes.CDLL(str(Path(tmp) / "roof.so"))
    lib.run.restype, lib.run.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_int64]
    return lib


def gmacs(variant: str, threads: int, rounds: int = 7, steps: int = 20_000_000) -> float:
    """Billions of int8 multiply-adds per second at `threads`, the median of `rounds` runs after
    a warm-up (the threads woken, the clock raised)."""
    lib = library(variant)
    lib.run(threads, steps // 10)
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        lib.run(threads, steps)
        seconds.append(time.perf_counter() - started)
    return threads * steps * CHAINS * lib.lanes() / statistics.median(seconds) / 1e9


def shape_of(weights: str) -> shapes.Shape | None:
    """The shape a shape file's path names (`.../qwen2.5-7b-Q4_K_M.gguf` -> qwen2.5-7b), if any."""
    return shapes.SHAPES.get(Path(weights).stem.rsplit("-", 1)[0])


def table(rows: list[dict], sizes: tuple[int, ...] = (8, 16)) -> str:
    """Each shape file's multi-row passes (bench_llamacpp.py's `forward N` rows after 128 tokens)
    against the int8 roof (`bench_kernels.py roof` rows) of the same kernels and threads: the
    multiply-adds per second each tool reached, specq's share of the roof, and the pass's floor in
    one-row steps of specq's: its multiply-adds at the roof, or one step (the weights read once),
    whichever is more. Medians over rounds."""
    roofs: dict[tuple, list[float]] = {}
    passes: dict[tuple, list[float]] = {}
    for r in rows:
        words = r.get("measurement", "").split()
        if r.get("kernel") == "roof":
            roofs.setdefault((r["variant"], r["threads"]), []).append(r["gmacs"])
        elif len(words) == 2 and words[0] == "forward" and shape_of(r["weights"]):
            key = (r["machine"], r["kernels"], r["threads"], r["weights"], r["tool"], int(words[1]))
            passes.setdefault(key, []).append(r["ms"])
    ms = {k: statistics.median(v) for k, v in passes.items()}
    lines = ["| machine | kernels | threads | weights | GMAC per row | rows | specq ms (steps) | "
             "specq GMAC/s | llama.cpp GMAC/s | roof GMAC/s | specq's share of the roof | "
             "floor, steps |", "|" + "---|" * 12]
    for machine, kernels, threads, weights in dict.fromkeys(k[:4] for k in ms if k[4] == "specq"):
        roof = statistics.median(roofs[kernels, threads]) if roofs.get((kernels, threads)) else None
        macs = shape_of(weights).macs_per_row
        step = ms.get((machine, kernels, threads, weights, "specq", 1))
        for n in sizes:
            mine = ms.get((machine, kernels, threads, weights, "specq", n))
            if mine is None or step is None:
                continue
            theirs = ms.get((machine, kernels, threads, weights, "llama.cpp", n))
            rate = n * macs / mine / 1e6
            floor = max(1.0, n * macs / roof / 1e6 / step) if roof else None
            lines.append(
                f"| {machine} | {kernels} | {threads} | {Path(weights).stem} | {macs / 1e9:.2f} | "
                f"{n} | {mine:.1f} ({mine / step:.2f}) | {rate:.0f} | "
                + (f"{n * macs / theirs / 1e6:.0f}" if theirs else "-") + " | "
                + (f"{roof:.0f} | {rate / roof:.2f} | {floor:.2f} |"
                   if roof else "- | - | - |"))
    return "\n".join(lines)
