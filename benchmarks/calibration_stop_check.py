"""Which early-stop setting did the calibration experiment's rows use? Re-measure the distilled
draft's greedy and T=1 acceptance at given stop thresholds, on the experiment's prompts and
settings (6 held-out chat prompts, gamma 4, 64 tokens, T=1 seeds 0-5); the stored rows match
one threshold and not the other (docs/results/calibration_stop_check.json).

    python benchmarks/calibration_stop_check.py int8 int3-g64-rtn --stops 0 0.4 --out X.json
"""

from __future__ import annotations

import argparse
import json

import torch

import specq
from specq.core.stats import bootstrap_ci
from specq.data import chat_prompts
from specq.training.calibrate import has_chat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--stops", nargs="+", type=float, default=[0.0, 0.4])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompts = chat_prompts("held_out")[:6]
    draft = specq.load("smollm2-135m-draft")
    rows = {}
    for spec in args.specs:
        target = specq.load(f"smollm2-135m@{spec}")
        for stop in args.stops:
            greedy = [specq.generate(target, p, draft, gamma=4, max_new_tokens=64, chat=has_chat(target),
                                     draft_confidence=stop).stats for p in prompts]
            sampled = [specq.generate(target, p, draft, gamma=4, max_new_tokens=64, temperature=1.0, seed=i,
                                      chat=True, draft_confidence=stop).stats for i, p in enumerate(prompts)]
            rows[f"{spec} stop {stop}"] = {"greedy_acceptance": bootstrap_ci([s.acceptance_rate for s in greedy]),
                                           "greedy_tau": bootstrap_ci([s.tau for s in greedy]),
                                           "sampling_acceptance": bootstrap_ci([s.acceptance_rate for s in sampled])}
            print(spec, stop, {k: round(v[0], 3) for k, v in rows[f"{spec} stop {stop}"].items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
