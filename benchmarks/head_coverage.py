"""How much of the target's own output a feature draft's head can draft: the share of the
target's greedy tokens in the held-out answers of a `specq distill` work directory that each
draft's head covers (a token outside the head is never drafted).

    python benchmarks/head_coverage.py WORK DRAFT [DRAFT ...]

WORK is the `--work` directory of a feature-draft `specq distill` run (its held-out answers are
cached there); each DRAFT a feature-draft directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specq.model.feature_draft import load
from specq.training.distill import TeacherSet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("drafts", nargs="+", type=Path)
    args = parser.parse_args()
    shards = sorted(args.work.glob("teacher/held-answers-*/shard_*[0-9].pt"))
    if not shards:
        raise SystemExit(f"no held-out answers under {args.work}/teacher")
    held = TeacherSet([], [], [], [])
    for shard in shards:
        held += TeacherSet.load(shard)
    answers = torch.cat([ids[start + 1:] for ids, start in zip(held.ids, held.start)])
    print(f"held-out answer tokens: {answers.numel()} ({len(held)} answers)")
    for directory in args.drafts:
        head = load(directory).vocab_ids
        covered = torch.isin(answers, head).float().mean().item()
        print(f"{directory}: head {head.numel()} tokens, covers {covered:.3f} of them")


if __name__ == "__main__":
    main()
