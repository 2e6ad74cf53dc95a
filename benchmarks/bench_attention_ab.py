"""Two builds of decoder.c's attention side by side in one process, alone: the rows' rotary
embedding, cache write, scores, softmax and weighted sums of every layer (`attend_rows`), on random
queries and caches of a model's shape, the two builds alternated call by call. Why: attention is a
tenth of an 8-row pass at long contexts, so a change to it worth a tenth of its time moves a whole
pass (`bench_kernels_ab.py`) by less than this VM's noise.

Each side is a directory holding decoder.c (and what it includes), compiled here with the flags
specq's build uses for this machine's variant. For example the committed attention against a
changed one, at Qwen2.5-Coder-1.5B's shape (the defaults):

    mkdir -p /tmp/a && git archive HEAD src/specq/kernels | tar -x -C /tmp/a --strip-components 3
    python benchmarks/bench_attention_ab.py /tmp/a src/specq/kernels --rows 1,8 --contexts 128,1024 --rounds 20

Prints, per (rows, context), the median milliseconds of each side (all layers, one call), the
paired median of B/A with its range over rounds, and whether the two sides' outputs were
bit-identical.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
from pathlib import Path

import torch

from bench_kernels_ab import paired_rounds, summary
from specq.kernels import build

# attend_rows over `layers` layers of one cache, timed in C.
DRIVER = """#include "{source}"
#include <time.h>
double attention_layers(int layers, const float *qkv, int n, int H, int Hkv, int D, const float *cos,
                        const float *sin, float *k, float *v, int capacity, int start, float scale, float *out,
                        int threads) {{
    struct timespec t0, t1;
    int failed = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int l = 0; l < layers; l++) {{
        const size_t layer = (size_t)l * Hkv * capacity * D;
        failed |= attend_rows(qkv, n, H, Hkv, D, cos, sin, k + layer, v + layer, capacity, start, NULL, NULL, 0, scale,
                              out, threads);
    }}
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return failed ? -1.0 : (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}}
"""


# The linear layers decoder.c calls, not linked (attention alone): in a unit of their own, so that
# their signatures, which attention does not use, may differ between the sides' sources.
STUBS = """int linear_a8(void) { return -1; }
void linear_f32(void) {}
"""


def compile_side(sources: Path, out: Path) -> ctypes.CDLL:
    """sources/decoder.c with the timing driver, compiled as specq's build would for this machine."""
    unit, stubs = out.with_suffix(".c"), out.with_name(out.stem + "-stubs.c")
    unit.write_text(DRIVER.format(source=(sources / "decoder.c").resolve()))
    stubs.write_text(STUBS)
    try:
        build.compile_units([unit, stubs], build.variant(), out)
    except build.KernelUnavailable as e:
        raise SystemExit(f"{sources}: {e}") from e
    lib = ctypes.CDLL(str(out))
    lib.attention_layers.restype = ctypes.c_double
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="directory of side A's kernel sources")
    ap.add_argument("b", type=Path, help="directory of side B's kernel sources")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=3, help="timed calls per side, measurement and round (median)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rows = [int(n) for n in args.rows.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    H, Hkv, D = args.heads, args.kv_heads, args.head_dim
    capacity = max(contexts) + max(rows)
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(args.layers, Hkv, capacity, D, generator=g) for _ in range(2))
    qkv = torch.randn(max(rows), (H + 2 * Hkv) * D, generator=g)
    angles = torch.rand(max(rows), D, generator=g) * 6.3
    cos, sin = angles.cos(), angles.sin()
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        libs = [compile_side(src, Path(tmp) / f"{side}.so") for src, side in ((args.a, "a"), (args.b, "b"))]

        def timed(side: int, n: int, c: int) -> tuple[float, torch.Tensor]:
            out = torch.empty(n, H * D)
            seconds = [libs[side].attention_layers(args.layers, ptr(qkv), n, H, Hkv, D, ptr(cos), ptr(sin), ptr(k),
                                                   ptr(v), capacity, c, ctypes.c_float(D ** -0.5), ptr(out),
                                                   args.threads) for _ in range(args.calls)]
            if min(seconds) < 0:
                raise SystemExit(f"{(args.a, args.b)[side]}: attend_rows failed (out of memory)")
            return statistics.median(seconds) * 1000, out

        print("\n".join(summary(*paired_rounds(timed, rows, contexts, args.rounds))).replace("logits", "outputs"))


if __name__ == "__main__":
    main()
