"""Does calibrating the draft on a quantized target restore acceptance? And does acceptance
track 1 - TV (theory) or 1 - KL (a claim seen in reports)?

For the target at fp32 and quantized with GPTQ and RTN at 8/4/3/2 bits, one row per precision:
- how far the quantized target moved: JS divergence, beta and top-1 agreement vs the fp32
  target on held-out text and the fp32 target's held-out chat answers (`specq compare`);
- (a) the draft distilled on the fp32 target and (b) that draft calibrated on this target
  (`specq calibrate`): measured acceptance rate and tau in greedy speculative runs, measured
  acceptance in sampling runs (T = 1), bootstrap CIs over prompts; and the predictions
  top-1 agreement (greedy), 1 - TV(target, draft) and 1 - KL(draft || target) (sampling), all
  on the target's own held-out answers.

    python benchmarks/calibration_experiment.py --draft smollm2-135m-draft --out experiment.json

Rows are written as they finish (atomically); a rerun skips finished rows. To use two cores,
split --specs over two processes with different --out files and merge with --table A.json B.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import specq
from specq import atomic
from specq.core.stats import bootstrap_ci
from specq.data import chat_prompts
from specq.training.calibrate import CalibrationSettings, acceptance, calibrate
from specq.training.divergence import compare, held_out_chunks

SPECS = ["fp32", "int8", "int8-gptq", "int4-g64-gptq", "int4-g64-rtn", "int3-g64-gptq", "int3-g64-rtn",
         "int2-g32-gptq", "int2-g32-rtn"]


# No early draft stop, in the greedy runs (calibrate.acceptance) and the T=1 runs alike: every
# proposal is gamma tokens, whatever generate's default is (it changed during the first run).
DRAFT_CONFIDENCE = 0.0


def sampling_acceptance(target, draft, prompts: list[str], gamma: int, tokens: int) -> list[float]:
    """Acceptance rate per prompt of speculative sampling at temperature 1 (seeded)."""
    return [specq.generate(target, p, draft, gamma=gamma, max_new_tokens=tokens, temperature=1.0, seed=i,
                           chat=True, draft_confidence=DRAFT_CONFIDENCE).stats.acceptance_rate
            for i, p in enumerate(prompts)]


def draft_row(target, draft, prompts, chunks, args) -> dict:
    """Measured acceptance (greedy and T=1) and its predictions for one (target, draft) pair."""
    greedy = acceptance(target, draft, prompts, args.gamma, args.tokens)
    sampled = sampling_acceptance(target, draft, prompts, args.gamma, args.tokens)
    predicted = compare(target, draft, chunks, resamples=args.resamples)
    return {"greedy_acceptance": greedy["acceptance_rate"], "greedy_tau": greedy["tau"],
            "sampling_acceptance": bootstrap_ci(sampled, resamples=args.resamples),
            "top1": predicted["top1"], "one_minus_tv": predicted["beta"],
            "kl_draft_target": predicted["kl_ba"]}


def load_target(spec: str, fp32, args):
    return fp32 if spec == "fp32" else specq.load(f"{args.target}@{spec}")


def target_part(spec: str, target, fp32, fp32_chunks, args, cache: Path) -> tuple[dict, list[list[int]]]:
    """How far `target` (at `spec`) moved from fp32, and its own held-out answers (the contexts
    for the draft predictions). Independent of the draft: cached in `cache`."""
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    if spec not in saved:
        moved = compare(fp32, target, fp32_chunks, resamples=args.resamples)
        saved[spec] = {"moved": moved, "chunks": held_out_chunks(target, 0, 0, args.prompts, answer_tokens=args.tokens)}
        atomic.write_text(cache, json.dumps(saved))
    return saved[spec]["moved"], saved[spec]["chunks"]


def run_spec(spec: str, fp32, base_draft, fp32_chunks, args, work: Path) -> dict:
    started = time.perf_counter()
    target = load_target(spec, fp32, args)
    moved, own_chunks = target_part(spec, target, fp32, fp32_chunks, args, work / "targets.json")
    prompts = chat_prompts("held_out")[:args.prompts]
    row = {"spec": spec, "js_vs_fp32": moved["js"], "beta_vs_fp32": moved["beta"], "top1_vs_fp32": moved["top1"],
           "ppl": moved["ppl_b"], "distilled": draft_row(target, base_draft, prompts, own_chunks, args)}
    if spec != "fp32":
        settings = CalibrationSettings(prompts=args.calib_prompts, held_out=args.prompts, max_new_tokens=args.tokens,
                                       steps=args.calib_steps, gamma=args.gamma)
        out = work / f"draft-for-{spec}"
        report = calibrate(target, base_draft, settings, out=out, progress=False, measure=False)  # measured below
        row["calibrated"] = draft_row(target, specq.load(str(out)), prompts, own_chunks, args)
        row["calibration"] = {"settings": report["settings"], "train_positions": report["train_positions"]}
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m-draft", help="the draft distilled on the fp32 target")
    ap.add_argument("--specs", nargs="+", default=SPECS)
    ap.add_argument("--out", default="calibration_experiment.json")
    ap.add_argument("--work", default=None, help="calibrated drafts (default: OUT's stem + .drafts)")
    ap.add_argument("--prompts", type=int, default=6, help="held-out chat prompts per measurement")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per speculative run")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--calib-prompts", type=int, default=48)
    ap.add_argument("--calib-steps", type=int, default=60)
    ap.add_argument("--text-chunks", type=int, default=8)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--targets-only", action="store_true",
                    help="only compute the draft-independent part (JS vs fp32, the targets' own answers)")
    ap.add_argument("--table", nargs="+", default=None, metavar="RESULTS",
                    help="only print the table of these result files (e.g. of runs split over processes)")
    args = ap.parse_args()
    if args.table:
        rows = {}
        for path in args.table:
            rows.update(json.loads(Path(path).read_text())["rows"])
        print(table({spec: rows[spec] for spec in SPECS if spec in rows} | rows))
        return
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_suffix(".drafts")
    done = json.loads(out.read_text()) if out.exists() else {
        "config": vars(args) | {"draft_confidence": DRAFT_CONFIDENCE}, "rows": {}}
    fp32 = specq.load(args.target)
    work.mkdir(parents=True, exist_ok=True)
    chunks_file = work / "fp32_chunks.json"
    if not chunks_file.exists():
        atomic.write_text(chunks_file, json.dumps(held_out_chunks(fp32, args.text_chunks, 128, args.prompts,
                                                                  answer_tokens=args.tokens)))
    fp32_chunks = json.loads(chunks_file.read_text())
    if args.targets_only:
        for spec in args.specs:
            target_part(spec, load_target(spec, fp32, args), fp32, fp32_chunks, args, work / "targets.json")
        return
    base_draft = specq.load(args.draft)
    for spec in args.specs:
        if spec in done["rows"]:
            continue
        row = run_spec(spec, fp32, base_draft, fp32_chunks, args, work)
        done["rows"][spec] = row
        atomic.write_text(out, json.dumps(done, indent=1))
        d, c = row["distilled"], row.get("calibrated", row["distilled"])
        print(f"{spec:14s} JS {row['js_vs_fp32']['mean']:.4f}  greedy acc {d['greedy_acceptance'][0]:.3f} -> "
              f"{c['greedy_acceptance'][0]:.3f}  T=1 acc {d['sampling_acceptance'][0]:.3f} -> "
              f"{c['sampling_acceptance'][0]:.3f}  ({row['seconds']:.0f} s)", flush=True)
    print(table(done["rows"]))


def _ci(x) -> str:
    mean, low, high = (x["mean"], x["low"], x["high"]) if isinstance(x, dict) else x
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def table(rows: dict) -> str:
    """The Markdown table of docs/drafts.md (benchmarks/doc_tables.py writes it there)."""
    lines = ["| target | JS vs fp32 | beta vs fp32 | draft | greedy acceptance | tau (greedy) | top-1 (pred.) "
             "| T=1 acceptance | 1 - TV (pred.) | 1 - KL(q‖p) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spec, row in rows.items():
        for which in ("distilled", "calibrated"):
            if which not in row:
                continue
            r = row[which]
            lines.append(f"| {spec} | {row['js_vs_fp32']['mean']:.4f} | {row['beta_vs_fp32']['mean']:.3f} | {which} "
                         f"| {_ci(r['greedy_acceptance'])} | {_ci(r['greedy_tau'])} | {r['top1']['mean']:.3f} "
                         f"| {_ci(r['sampling_acceptance'])} | {r['one_minus_tv']['mean']:.3f} "
                         f"| {1 - r['kl_draft_target']['mean']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
