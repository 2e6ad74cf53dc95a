"""A GGUF target at its own precision as a teacher: its answers and distributions on specq's kernels
(no float copy), its quantized head and file-format embedding shared with a feature draft, and a
feature draft distilled for it that decodes losslessly."""

from __future__ import annotations

import random

import pytest
import torch

import specq
from specq import backends
from specq.kernels import int8dot
from specq.loading.formats import gguf_io
from specq.core.types import Model
from specq.model.feature_draft import FeatureDraft, head_rows, new_feature_draft
from specq.training import distill, native_teacher
from specq.training.train import DistillSettings, run
from specq.weights.embedding import FileEmbedding

from conftest import _self_draft, tiny_model, tiny_tokenizer, write_tiny_gguf

VOCAB, HIDDEN = 64, 64
pytestmark = pytest.mark.skipif(not int8dot.available(),
                                reason="the file's blocks run on int8dot (AVX2)")


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory) -> Model:
    """A tiny Q8_0 GGUF target (its own output head, embedding kept in the file's
    format) on the kernels."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, tiny_model(vocab=VOCAB, hidden=HIDDEN, scale=3.0), "Q8_0")
    net, _ = gguf_io.load_at_file_precision(gguf_io.read(path))
    return Model(ref=str(path), net=net.eval(), tokenizer=tiny_tokenizer(VOCAB),
                 eos_ids=frozenset(), source=str(path), precision="gguf",
                 runner=backends.runner(net))


def test_the_native_teacher_is_chosen_for_quantized_targets_only(gguf_target):
    assert native_teacher.wanted(gguf_target.net)
    float_target = tiny_model(vocab=VOCAB, hidden=HIDDEN)
    assert not native_teacher.wanted(float_target.net)
    assert native_teacher.wanted(_self_draft(float_target, "int2-g32").net)


def test_a_specq_quantized_target_answers_on_its_kernels():
    """An int2 target (specq's own codes, not a file) answers as it decodes alone: the user's
    target, not a float copy of its weights."""
    quantized = _self_draft(tiny_model(vocab=VOCAB, hidden=HIDDEN, scale=3.0), "int2-g32")
    target = Model(ref="tiny@int2-g32", net=quantized.net, tokenizer=quantized.tokenizer,
                   eos_ids=frozenset(), source="random", precision="int2-g32",
                   runner=backends.runner(quantized.net))
    prompts = ["t1 t2 t3", "t9 t8"]
    data = native_teacher.continuations(target, prompts, max_new_tokens=5, k=4, batch=2)
    for prompt, ids, top in zip(prompts, data.ids, data.top_ids):
        alone = specq.generate(target, prompt, None, max_new_tokens=5)
        assert ids.tolist() == alone.prompt_ids + alone.token_ids
        assert top[:, 0].tolist() == alone.token_ids


def test_text_records_are_the_targets_own_pass(gguf_target):
    net = gguf_target.runner
    windows = [torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(s))
               for s in range(2)]
    data = native_teacher.on_text(net, windows, k=8)
    assert data.start == [0, 0] and [t.shape for t in data.top_ids] == [(12, 8)] * 2
    with torch.inference_mode():
        logits, hidden = net(windows[1], return_hidden=True)
    expected = torch.log_softmax(logits, -1).topk(8).values  # stored as float16
    torch.testing.assert_close(data.top_logp[1].float(), expected, atol=1e-3, rtol=1e-3)
    assert torch.equal(data.top_ids[1][:, 0].long(), logits.argmax(-1))
    # stored as float16
    torch.testing.assert_close(data.features[1].float(), hidden, atol=2e-2, rtol=1e-2)


def test_answers_are_the_targets_greedy_decoding(gguf_target):
    """Batched plain decoding gives each prompt the tokens `generate` gives it alone, with one
    distribution per new token whose argmax is that token."""
    prompts = ["t1 t2 t3", "t9", "t4 t4 t5 t6 t7"]
    data = native_teacher.continuations(gguf_target, prompts, max_new_tokens=6, k=4, batch=2)
    for prompt, ids, start, top in zip(prompts, data.ids, data.start, data.top_ids):
        alone = specq.generate(gguf_target, prompt, None, max_new_tokens=6)
        assert (ids.tolist() == alone.prompt_ids + alone.token_ids
                and start == len(alone.prompt_ids) - 1)
        assert top[:, 0].tolist() == alone.token_ids
    assert [f.shape[0] for f in data.features] == [len(ids) for ids in data.ids]


def test_a_feature_draft_shares_the_files_embedding_and_head_rows(gguf_target):
    net = gguf_target.net
    reference = gguf_io.read(gguf_target.source).float_state_dict()  # gguf's own dequantization
    keep = torch.tensor([0, 3, 17, 63])
    torch.testing.assert_close(head_rows(net, keep), reference["output.weight"][keep], rtol=1e-6,
                               atol=1e-7)
    draft = new_feature_draft(net, keep)
    assert (isinstance(net.tok_embeddings, FileEmbedding)
            and draft._embedding[0] is net.tok_embeddings)
    assert not any("embedding" in name and "tok_embeddings" not in name
                   for name in draft.state_dict())
    ids = torch.tensor([[5, 6], [7, 8]])
    torch.testing.assert_close(draft.embed(ids), reference["tok_embeddings.weight"][ids])


def test_bf16_compute_is_a_choice_of_two():
    forward = distill.feature_forward
    assert distill.autocast(forward, "fp32") is forward
    with pytest.raises(ValueError, match="compute must be one of"):
        distill.autocast(forward, "fp16")


def test_distil_a_feature_draft_for_a_gguf_target(gguf_target, tmp_path):
    """`run` on the GGUF target: native teacher data (features cached with the shards), bf16
    compute, a saved feature draft that decodes exactly as the target does, accepting and
    rejecting proposals."""
    rng = random.Random(0)
    (tmp_path / "text.txt").write_text(
        "\n\n".join(" ".join(f"t{rng.randrange(VOCAB)}" for _ in range(60))
                                                 for _ in range(10)))
    (tmp_path / "prompts.txt").write_text(
        "\n".join(" ".join(f"t{rng.randrange(VOCAB)}" for _ in range(5))
                  for _ in range(6)))
    settings = DistillSettings(texts=(str(tmp_path / "text.txt"),),
                               prompts=(str(tmp_path / "prompts.txt"),), new_tokens=8,
                               text_windows=8, seq_len=16, steps=40, lr=3e-3, batch=4,
                               eval_every=20, checkpoint_every=20, gen_batch=3, accept_prompts=0,
                               compute="bf16", head_vocab=48)
    report = run(gguf_target, tmp_path / "feat", tmp_path / "work", settings, arch="feature")
    assert (report["kind"] == "feature" and report["steps"] == 40
            and report["settings"]["compute"] == "bf16")
    assert len(list((tmp_path / "work" / "teacher").glob("*/shard_*.features.pt"))) >= 3
    draft = specq.load(str(tmp_path / "feat"))
    assert isinstance(draft.net, FeatureDraft)
    accepted = rejected = 0
    for prompt in ([1, 2, 3], [9, 4], [30, 31, 5, 6]):
        plain = specq.generate(gguf_target, prompt, None, max_new_tokens=24)
        fast = specq.generate(gguf_target, prompt, draft, gamma=3, max_new_tokens=24)
        assert fast.token_ids == plain.token_ids
        accepted += fast.stats.accepted
        rejected += fast.stats.drafted - fast.stats.accepted
        one = specq.generate(gguf_target, prompt, draft, gamma=1, max_new_tokens=24,
                             draft_confidence=0.0)
        # decoding reads the target's states as training does: a teacher-forced replay
        # takes the same steps
        assert replay(gguf_target, draft, prompt, one.token_ids) == (one.stats.accepted,
                                                                     one.stats.steps)
    assert accepted > 0 and rejected > 0


@torch.inference_mode()
def replay(target, draft, prompt_ids: list[int], new_ids: list[int]) -> tuple[int, int]:
    """(accepted, steps) of a gamma-1 run replayed teacher-forced: the target's uncached pass over
    the whole output gives the hidden states training reads, the draft predicts every position
    from them, and the same steps are walked (one token proposed after each step, two emitted
    when it is accepted)."""
    ids = torch.tensor(prompt_ids + new_ids)
    features = target.net.hidden_states(ids)
    logits, _ = draft.net(ids[1:].unsqueeze(0), features[:-1].unsqueeze(0))
    predicted = draft.net.vocab_ids[logits[0].argmax(-1)]  # row r: (x_{r+1}, f_r) -> x_{r+2}
    at, steps, accepted = len(prompt_ids) + 1, 0, 0  # the first new token comes from the prefill
    while at < len(ids):
        hit = bool(predicted[at - 2] == ids[at])
        steps, accepted, at = steps + 1, accepted + hit, at + (2 if hit else 1)
    return accepted, steps
