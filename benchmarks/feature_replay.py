"""Does decoding feed a feature draft what training fed it? A check of the decoding path.

Each prompt is decoded with gamma 1 (every step proposes one token, read from the target's hidden
states of the verify passes, in the KV-cached pass of the kernels), then replayed teacher-forced:
the target's uncached pass over the whole output gives the hidden states training reads
(`Llama.hidden_states`), the draft predicts every position from them, and the same steps are
walked (one token proposed after each step, two emitted when it is accepted). Equal counts mean the
decoding path reads the states training did; the last column is the draft's top-1 agreement at
every generated position, teacher-forced.

    python benchmarks/feature_replay.py --draft ./qwen-1.5b-feature > docs/results/feature-replay-coder-1.5b.txt
"""

from __future__ import annotations

import argparse

import torch

import specq
from specq import api
from specq.bench.prompts import load_set


@torch.inference_mode()
def replay(target, draft, prompt_ids: list[int], new_ids: list[int]) -> tuple[int, int, float]:
    """(accepted, steps) of a gamma-1 run replayed teacher-forced, and top-1 over every new position."""
    ids = torch.tensor(prompt_ids + new_ids)
    features = target.net.hidden_states(ids)
    logits, _ = draft.net(ids[1:].unsqueeze(0), features[:-1].unsqueeze(0))
    predicted = draft.net.vocab_ids[logits[0].argmax(-1)]  # row r: (x_{r+1}, f_r) -> x_{r+2}
    at, steps, accepted = len(prompt_ids) + 1, 0, 0  # the first new token comes from the prefill
    while at < len(ids):
        hit = bool(predicted[at - 2] == ids[at])
        steps, accepted, at = steps + 1, accepted + hit, at + (2 if hit else 1)
    everywhere = (predicted[len(prompt_ids) - 1:len(ids) - 2] == ids[len(prompt_ids) + 1:]).float().mean().item()
    return accepted, steps, everywhere


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", required=True, help="a feature draft's folder")
    ap.add_argument("--sets", default="chat:3,code:2", help="prompt sets and how many prompts of each")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = specq.load(args.target), specq.load(args.draft)
    print("| set | prompt | decoding: accepted / steps | replayed teacher-forced | top-1, every position |")
    print("|---|---|---|---|---|")
    for item in args.sets.split(","):
        name, n = item.split(":")
        for prompt in load_set(name, int(n)):
            out = specq.generate(target, prompt.text, draft, gamma=1, max_new_tokens=args.tokens, chat=prompt.chat,
                                 draft_confidence=0.0, ignore_eos=True)
            accepted, steps, everywhere = replay(target, draft, api.encode_prompt(target, prompt.text, prompt.chat),
                                                 out.token_ids)
            print(f"| {name} | {prompt.index} | {out.stats.accepted} / {out.stats.steps} | {accepted} / {steps} | "
                  f"{everywhere:.3f} |", flush=True)


if __name__ == "__main__":
    main()
