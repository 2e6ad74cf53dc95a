"""Two builds of specq's kernels side by side in one process, on whole cached passes of one model:
the same weights, the same caches, the decoder layers' C call switched between the two builds pass
by pass (which goes first flips every round). Why: a change to decoder.c worth a few percent is
smaller than this VM's drift between processes (`bench_versions.py` compares commits across
processes, where memory placement alone moves a pass by more than 10%).

Each side is a directory holding every kernel source (.c and .h), compiled here with the flags
specq's build uses for this machine's variant; the output head and the embedding stay on the
checkout's own build. For example the committed decoder against a changed one:

    mkdir -p /tmp/a && git archive HEAD src/specq/kernels | tar -x -C /tmp/a --strip-components 3
    python benchmarks/bench_kernels_ab.py /tmp/a src/specq/kernels --rows 1,8 --contexts 128,1024 --rounds 10

Prints, per (rows, context), the median milliseconds of each side, the paired median of B/A with
its range over rounds, and whether the two sides' logits were bit-identical.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import specq
from specq.kernels import build, decoder


def compile_side(sources: Path, out: Path) -> Path:
    """sources/*.c compiled as specq's build would for this machine's variant, into `out`."""
    try:
        build.compile_units(sorted(sources.glob("*.c")), build.variant(), out)
    except build.KernelUnavailable as e:
        raise SystemExit(f"{sources}: {e}") from e
    return out


def summary(ms: dict[tuple[int, int], list[tuple[float, float]]], same: dict[tuple[int, int], bool]) -> list[str]:
    """One line per (rows, context) from each round's (A, B) milliseconds and whether the logits
    were bit-identical in every round."""
    lines = []
    for (n, c), pairs in ms.items():
        ratios = [b / a for a, b in pairs]
        lines.append(f"{n} rows at {c}: A {statistics.median(a for a, _ in pairs):.1f} ms, "
                     f"B {statistics.median(b for _, b in pairs):.1f} ms, B/A paired median "
                     f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}], "
                     f"logits {'bit-identical' if same[(n, c)] else 'differ'}")
    return lines


Timed = Callable[[int, int, int], tuple[float, torch.Tensor]]


def paired_rounds(timed: Timed, rows: list[int], contexts: list[int], rounds: int
                  ) -> tuple[dict[tuple[int, int], list[tuple[float, float]]], dict[tuple[int, int], bool]]:
    """Each round's (A, B) milliseconds per (rows, context), from `timed(side, rows, context)` ->
    (milliseconds, output), the side that goes first flipping every round; and whether the two
    sides' outputs were bit-identical in every round."""
    ms: dict[tuple[int, int], list[tuple[float, float]]] = {(n, c): [] for n in rows for c in contexts}
    same = {key: True for key in ms}
    for r in range(rounds):
        for (n, c) in ms:
            order = (0, 1) if r % 2 == 0 else (1, 0)
            got = {side: timed(side, n, c) for side in order}
            ms[(n, c)].append((got[0][0], got[1][0]))
            same[(n, c)] &= torch.equal(got[0][1], got[1][1])
    return ms, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="directory of side A's kernel sources")
    ap.add_argument("b", type=Path, help="directory of side B's kernel sources")
    ap.add_argument("--ref", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=3, help="timed passes per side, measurement and round (median)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(n) for n in args.rows.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [compile_side(src, Path(tmp) / f"{side}.so") for src, side in ((args.a, "a"), (args.b, "b"))]
        libs = [decoder.typed(ctypes.CDLL(str(path))) for path in paths]
        net = specq.load(args.ref).net
        ids = torch.randint(100, 40000, (max(contexts) + max(rows),), generator=torch.Generator().manual_seed(0))
        caches = {}
        with torch.inference_mode():
            for c in contexts:
                caches[c] = net.new_cache(c + max(rows))
                net(ids[:c], caches[c])

        def timed(side: int, n: int, c: int) -> tuple[float, torch.Tensor]:
            decoder._library = lambda _variant: libs[side]
            times = []
            for _ in range(args.calls):
                began = time.perf_counter()
                with torch.inference_mode():
                    logits = net(ids[c:c + n], caches[c])
                times.append((time.perf_counter() - began) * 1000)
                caches[c].crop(c)
            return statistics.median(times), logits

        print("\n".join(summary(*paired_rounds(timed, rows, contexts, args.rounds))))


if __name__ == "__main__":
    main()
