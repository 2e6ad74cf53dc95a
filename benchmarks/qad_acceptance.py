"""Acceptance of the shipped drafts on quantized targets with and without `specq qad`: greedy
speculative runs (gamma tokens per proposal, no early draft stop) on the held-out chat prompts,
the per-prompt acceptance rate and tau with bootstrap 95% CIs (`training.calibrate.acceptance`).

    python benchmarks/qad_acceptance.py --targets int4-g64-rtn,int4-g64-rtn-qad \
        --drafts smollm2-135m-draft,smollm2-135m-draft-int4-g64-rtn [--prompts 8] [--gamma 4] \
        [--tokens 64] [--backend eager] [--out docs/results/qad.jsonl]

One thread; one row per (target, draft) (kind `qad_acceptance`). A `-qad` target must have been
made first (`specq qad smollm2-135m SPEC`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

import specq
from specq import data
from specq.training.calibrate import acceptance

from qad_settings import emit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", required=True, help="precisions of smollm2-135m, comma-separated")
    ap.add_argument("--drafts", required=True, help="draft refs, comma-separated")
    ap.add_argument("--prompts", type=int, default=8, help="the first N held-out chat prompts")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", default="eager")
    ap.add_argument("--out", type=Path, default=None, help="append one JSON row per (target, draft)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompts = data.chat_prompts("held_out")[:args.prompts]
    for spec in args.targets.split(","):
        target = specq.load(f"smollm2-135m@{spec}", backend=args.backend)
        for ref in args.drafts.split(","):
            draft = specq.load(ref, backend=args.backend)
            result = acceptance(target, draft, prompts, args.gamma, args.tokens)
            row = {"kind": "qad_acceptance", "command": "python " + shlex.join(sys.argv),
                   "target": f"smollm2-135m@{spec}", "draft": ref, "backend": args.backend, "gamma": args.gamma,
                   "prompts": len(prompts), "max_new_tokens": args.tokens, "threads": torch.get_num_threads(),
                   **{k: result[k] for k in ("acceptance_rate", "tau")}}
            emit(row, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
