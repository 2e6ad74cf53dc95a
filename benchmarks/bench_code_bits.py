"""The same weights in int8dot's narrow codes (2 or 3 bits a code) and in its 4-bit codes, alternated
in one process: what reading fewer bytes buys a layer, and what the narrow codes' unpacking costs.

GGUF's Q2_K and Q3_K tensors run as 2- and 3-bit codes (their two-level scales and offsets, groups
of 16); before, they ran as 4-bit codes. Each form is timed over enough random copies of one
Qwen2.5-Coder-1.5B layer shape that a sweep reads them from memory, the forms alternated round by
round (which goes first flips every round), each round's narrow / 4-bit ratio paired.

    python benchmarks/bench_code_bits.py [--layer w13] [--bits 2,3] [--rows 1,8] [--rounds 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench_int8dot import SHAPES, STREAM_BYTES, sweep_us
from specq.kernels import int8dot

GROUP = 16  # Q2_K's and Q3_K's


def copies(out: int, n_in: int, bits: int, g: torch.Generator) -> dict[int, list[int8dot.Int8DotWeight]]:
    """Random codes in [0, 2^bits) with two-level scales and offsets, packed at `bits` and at 4 bits,
    enough copies that the 4-bit form's sweep streams STREAM_BYTES."""
    forms = {bits: [], 4: []}
    while sum(w.nbytes() for w in forms[4]) < STREAM_BYTES:
        codes = torch.randint(0, 1 << bits, (out, n_in), generator=g)
        d = torch.rand(out, n_in // int8dot.SUPER, generator=g) * 1e-3
        sub = torch.randint(0, 16, (out, n_in // GROUP), generator=g, dtype=torch.int8)
        for b in forms:
            forms[b].append(int8dot.pack_two_level(b, codes, d, -d, sub, sub, int8dot.SUPER_SHIFT))
    return forms


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="w13", choices=sorted(SHAPES))
    ap.add_argument("--bits", default="2,3")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    out, n_in = SHAPES[args.layer]
    print(f"{args.layer} ({out} x {n_in}), groups of {GROUP}, two-level scales, {int8dot.build.variant()}, "
          f"{args.threads} threads, {args.rounds} rounds; us per call, median over rounds")
    for bits in (int(b) for b in args.bits.split(",")):
        forms = copies(out, n_in, bits, g)
        for b in forms:  # page in
            sweep_us(torch.randn(1, n_in, generator=g), forms[b])
        share = forms[bits][0].nbytes() / forms[4][0].nbytes()
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, n_in, generator=g)
            times, ratios = {bits: [], 4: []}, []
            for r in range(args.rounds):
                for b in ((bits, 4) if r % 2 == 0 else (4, bits)):
                    times[b].append(sweep_us(x, forms[b]))
                ratios.append(times[bits][-1] / times[4][-1])
            print(f"{bits}-bit codes ({share:.3f} of the 4-bit bytes), {rows} row{'s' * (rows > 1)}: "
                  f"{statistics.median(times[bits]):.0f} us against {statistics.median(times[4]):.0f}, "
                  f"{bits}-bit / 4-bit paired median {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)
        del forms


if __name__ == "__main__":
    main()
