"""specq's built-in pair served by vLLM (`make test-vllm`; the vLLM environment is `make
setup-vllm`'s): vLLM's greedy output with specq's shipped sequence draft as its `draft_model`, and
with its own n-gram lookup, equals its plain output (and specq's), and with the draft its
spec-decode counters agree with specq's own on the same prompts at the same draft length.

Why the counters agree exactly: greedy acceptance is a function of the target's greedy tokens and
the draft's argmax at each position. Both engines load the same fp32 weights and take the same
argmaxes (a near-tie in either model's fp32 logits is the one way they could part), both draft a
chain of GAMMA tokens after each verify pass from the first token on, so both make the same number
of drafts and accept the same tokens at each draft position.
Only the end of a request differs: vLLM drafts GAMMA tokens on its last step too (and counts
what that step accepts past the budget), specq never drafts past its budget; the test counts
specq's steps vLLM's way (`counted_as_vllm`) and reports both engines' own numbers.

vLLM runs in a subprocess of its own environment's python (`vllm_run.py`): specq's has no vllm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specq
from specq.core.prompt import encode_prompt
from specq.loading.builtins import BUILTINS, local_path

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).parents[2]
# absolute, not resolved: the environment's python is a link to the system's
VLLM_PYTHON = Path(os.path.abspath(os.environ.get("SPECQ_VLLM_PYTHON",
                                                  ROOT / ".venv-vllm" / "bin" / "python")))
RUNNER = Path(__file__).with_name("vllm_run.py")
GAMMA = 3
NEW_TOKENS = 32
PROMPTS = ["Explain in three sentences why the sky is blue.",
           "Write a haiku about the sea.",
           "Repeat this list three times: red, green, blue, yellow, purple, orange."]
DRAFT = "smollm2-135m-draft"
# vLLM's n-gram lookup at specq's `ngram:n=2-3:k=3`: the longest of the last 3 down to 2 tokens
# matched, at its latest occurrence, then up to GAMMA tokens proposed
NGRAM = {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}


def _vllm_missing() -> str | None:
    if not VLLM_PYTHON.exists():
        return f"no vLLM environment at {VLLM_PYTHON}: run make setup-vllm"
    probe = subprocess.run([str(VLLM_PYTHON), "-c", "import importlib.util as u, sys; "
                            "sys.exit(u.find_spec('vllm') is None)"])
    return None if probe.returncode == 0 else f"{VLLM_PYTHON} has no vllm: run make setup-vllm"


MISSING = _vllm_missing()
if MISSING:
    pytestmark = [pytest.mark.vllm, pytest.mark.skip(reason=MISSING)]


def run_vllm(tmp: Path, target: Path, prompts: list[list[int]], speculative: dict | None) -> dict:
    """vLLM's greedy outputs and spec-decode counters (`vllm_run.py`), one engine per process."""
    request = tmp / f"request-{speculative and speculative['method']}.json"
    request.write_text(json.dumps({"target": str(target), "prompts": prompts,
                                   "max_tokens": NEW_TOKENS, "speculative": speculative}))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB
    iomp = VLLM_PYTHON.parents[1] / "lib" / "libiomp5.so"  # vLLM's CPU speculation wants it
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    done = subprocess.run([str(VLLM_PYTHON), str(RUNNER), str(request)], env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"vLLM failed:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The prompts as token ids (specq's chat encoding), and vLLM's plain, draft-model and n-gram
    runs of them."""
    target = specq.load("smollm2-135m")
    prompts = [encode_prompt(target, p, chat=True) for p in PROMPTS]
    tmp = tmp_path_factory.mktemp("vllm")
    folder = BUILTINS["smollm2-135m"]()  # the built-in target's fp32 HF folder
    draft = {"method": "draft_model", "model": str(local_path(DRAFT)),
             "num_speculative_tokens": GAMMA}
    return target, prompts, {name: run_vllm(tmp, folder, prompts, spec)
                             for name, spec in (("plain", None), ("draft", draft),
                                                ("ngram", NGRAM))}


def specq_counts(target, prompts: list[list[int]], draft) -> tuple[list[list[int]], dict]:
    """specq's greedy outputs and its own acceptance counters, summed over the prompts, at vLLM's
    settings: a fixed chain of GAMMA, no early stop on draft confidence, no stop on EOS."""
    outputs = []
    total = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": [0] * GAMMA}
    for ids in prompts:
        out = specq.generate(target, ids, draft=draft, gamma=GAMMA, max_new_tokens=NEW_TOKENS,
                             ignore_eos=True, draft_confidence=0.0)
        stats = out.stats
        outputs.append(out.token_ids)
        total["drafts"] += stats.steps - stats.routes.get("plain", {}).get("steps", 0)
        total["draft_tokens"] += stats.drafted
        total["accepted"] += stats.accepted
        total["accepted_per_pos"] = [a + b for a, b in zip(total["accepted_per_pos"],
                                                            stats.accepted_at)]
    return outputs, total


def counted_as_vllm(target, prompts: list[list[int]], draft) -> dict:
    """specq's steps with a model draft, counted as vLLM counts its own: vLLM drafts GAMMA tokens
    on every step that starts before the token budget is reached, the last one too, and counts
    what that step accepts past the budget; specq never drafts past its budget. So specq runs
    GAMMA + 1 tokens further (every step that starts inside the budget then drafts all GAMMA)
    and only the steps that start inside it count (`on_tokens` sees each step's tokens)."""
    total = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": [0] * GAMMA}
    for ids in prompts:
        emitted: list[int] = []  # tokens per call: the prefill's one, then each step's

        def step(new: list[int]) -> bool:
            emitted.append(len(new))
            return True

        specq.generate(target, ids, draft=draft, gamma=GAMMA, max_new_tokens=NEW_TOKENS + GAMMA + 1,
                       ignore_eos=True, draft_confidence=0.0, on_tokens=step)
        done = emitted[0]
        for n in emitted[1:]:
            if done >= NEW_TOKENS:
                break
            total["drafts"] += 1
            total["draft_tokens"] += GAMMA
            total["accepted"] += n - 1
            for i in range(n - 1):
                total["accepted_per_pos"][i] += 1
            done += n
    return total


def report(name: str, vllm: dict, ours: dict) -> None:
    print(f"\n{name}: vLLM accepted {vllm['accepted']}/{vllm['draft_tokens']} drafted in "
          f"{vllm['drafts']} drafts, per position {vllm['accepted_per_pos']}; specq "
          f"{ours['accepted']}/{ours['draft_tokens']} in {ours['drafts']}, per position "
          f"{ours['accepted_per_pos']}", file=sys.stderr)


def test_vllm_plain_is_specq_plain(runs):
    target, prompts, vllm = runs
    for ids, theirs in zip(prompts, vllm["plain"]["outputs"]):
        ours = specq.generate(target, ids, draft=None, max_new_tokens=NEW_TOKENS,
                              ignore_eos=True).token_ids
        assert theirs == ours, f"prompt {ids}: vLLM's fp32 greedy tokens are not specq's"


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculative_is_plain(runs, method):
    """Lossless in vLLM: its greedy output with the draft is its plain output; drafts were
    accepted and rejected."""
    _, _, vllm = runs
    assert vllm[method]["outputs"] == vllm["plain"]["outputs"]
    assert 0 < vllm[method]["accepted"] < vllm[method]["draft_tokens"]


def test_draft_model_acceptance_is_specq(runs):
    """specq's shipped sequence draft accepts the same tokens at each position in vLLM as in
    specq, counted vLLM's way (the module's docstring says why exactly)."""
    target, prompts, vllm = runs
    draft = specq.load(DRAFT)
    outputs, ours = specq_counts(target, prompts, draft)
    theirs = vllm["draft"]
    report("draft_model", theirs, ours)
    assert outputs == theirs["outputs"]
    assert counted_as_vllm(target, prompts, draft) == {k: theirs[k] for k in ours}


def test_ngram_acceptance(runs):
    """vLLM's n-gram lookup against specq's at the same n and k, reported: the two lookups differ
    where a match runs into the end of the text (specq goes on over its own proposal, keeping a
    repeating run's period; vLLM proposes only what follows the match), so their counters may."""
    target, prompts, vllm = runs
    outputs, ours = specq_counts(target, prompts, f"ngram:n=2-3:k={GAMMA}")
    report("ngram", vllm["ngram"], ours)
    assert outputs == vllm["ngram"]["outputs"]
    assert ours["accepted"] > 0 and vllm["ngram"]["accepted"] > 0
