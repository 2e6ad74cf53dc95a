"""Short `specq qad` trainings side by side, to choose what trains and at what rate: each
configuration starts from the same quantized target and trains `steps` steps (batch 4) on the
teacher data `specq qad smollm2-135m SPEC --seq-len 128 --text-windows 640 --new-tokens 64` caches
(run that first), then reports the held-out KL and top-1 against the float teacher on every third
held-out record, before and after. Also prints the gradients' median size per parameter group
(whether gradients reach the parameters, and how far above Adam's epsilon they are).

    python benchmarks/qad_settings.py SPEC CONFIGS STEPS [--out docs/results/qad.jsonl]

CONFIGS: a JSON list of {"lr": scales' peak rate (relative; 0: frozen), "code_lr": codes' peak
rate (grid steps; 0: frozen), optional "vec": the norms' rate (default 1/20 of the larger)}.
One thread (`torch.set_num_threads(1)`), one row per configuration (kind `qad_setting`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

import specq
from specq.paths import cache_dir
from specq.training import qad
from specq.training.distill import TeacherSet, distill, evaluate
from specq.training.train import DistillSettings, teacher_data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("configs", type=json.loads)
    ap.add_argument("steps", type=int)
    ap.add_argument("--out", type=Path, default=None, help="append one JSON row per configuration")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = specq.load("smollm2-135m", backend=None)
    quantized = specq.load(f"smollm2-135m@{args.spec}", backend=None)
    settings = DistillSettings(seq_len=128, text_windows=640, new_tokens=64)
    train, held = teacher_data(target, settings, cache_dir() / "qad" / "smollm2-135m")
    rows = range(0, len(held), 3)
    held = TeacherSet([held.ids[i] for i in rows], [held.start[i] for i in rows], [held.top_ids[i] for i in rows],
                      [held.top_logp[i] for i in rows])
    print(f"train {len(train)} records ({train.positions()} positions), held out {held.positions()} positions",
          flush=True)
    for cfg in args.configs:
        codes, scales = cfg["code_lr"] > 0, cfg["lr"] > 0
        net = qad.student(quantized.net, target.net if codes and "awq" not in args.spec else None, codes=codes,
                          scales=scales)
        before = evaluate(net, held, forward=qad.qad_forward)
        d, _ = qad.qad_forward(net, train, [0, 1, 2, 3])
        d["kl"].mean().backward()
        grads = {}
        for layer in (m for m in net.modules() if isinstance(m, qad.FakeQuantLinear)):
            for name in ("latent", "log_gain"):
                p = getattr(layer, name)
                if p.grad is not None:
                    grads.setdefault(name, []).append(p.grad.abs().flatten())
        grads = {k: torch.cat(v).median().item() for k, v in grads.items()}
        net.zero_grad(set_to_none=True)
        lr = max(cfg["lr"], cfg["code_lr"])
        vec = cfg.get("vec", qad.VECTOR_LR_SCALE * lr)
        groups = qad.param_groups(net, cfg["code_lr"] / lr, cfg["lr"] / lr, vec / lr)
        result = distill(net, train, held, steps=args.steps, lr=lr, batch=4, checkpoint_dir=None, eval_every=10**6,
                         forward=qad.qad_forward, groups=groups, progress=False)
        row = {"kind": "qad_setting", "command": "python " + shlex.join(sys.argv), "spec": args.spec, "config": cfg,
               "steps": result["steps"], "s_per_step": round(result["elapsed_s"] / result["steps"], 2),
               "grad_median": grads, "held_out_positions": held.positions(), "held_out_before": before,
               "held_out_after": result["held_out"], "threads": torch.get_num_threads()}
        emit(row, args.out)
    return 0


def emit(row: dict, out: str | None) -> None:
    """Print a result row as a JSON line, and append it to `out` when given."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
