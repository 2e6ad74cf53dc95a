"""Distillation on tiny random models: it learns, and a resumed run equals an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from specq import data
from specq.model.llama import LlamaConfig
from specq.training import distill

VOCAB = 96
TEACHER = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=12)
DRAFT = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)


@pytest.fixture(scope="module")
def sets() -> tuple[distill.TeacherSet, distill.TeacherSet]:
    torch.manual_seed(0)
    teacher = distill.init_draft(TEACHER, seed=1)
    with torch.no_grad():  # a peaked teacher, so there is something to learn
        teacher.lm_head.weight.mul_(40)
    teacher.eval()
    windows = list(torch.randint(0, VOCAB, (40, 24)))
    train, held = data.split(windows, every=5)
    return (distill.teacher_on_text(teacher, train, k=16),
            distill.teacher_on_text(teacher, held, k=16))


def test_distillation_lowers_kl_and_raises_beta(sets):
    train, held = sets
    draft = distill.init_draft(DRAFT, seed=2)
    before = distill.evaluate(draft, held)
    result = distill.distill(draft, train, held, steps=60, loss="mix:0.5", lr=1e-2, batch=8,
                             eval_every=0, progress=False)
    after = result["held_out"]
    assert after["kl"] < 0.7 * before["kl"]
    assert after["beta"] > before["beta"] + 0.05


def test_losses_are_exact_on_full_support():
    p = torch.softmax(torch.randn(3, 10), -1)
    q_logits = torch.randn(3, 10)
    top_logp, top_ids = p.log().topk(10, dim=-1)
    logq = torch.log_softmax(q_logits, -1)
    d = distill.divergences(logq.gather(-1, top_ids), logq.argmax(-1), top_ids, top_logp)
    q = torch.softmax(q_logits, -1)
    assert torch.allclose(d["kl"], (p * (p.log() - q.log())).sum(-1), atol=1e-5)
    assert torch.allclose(d["tv"], 0.5 * (p - q).abs().sum(-1), atol=1e-5)
    assert torch.allclose(d["beta"], 1 - d["tv"], atol=1e-5)


def test_resume_continues_exactly(sets, tmp_path, monkeypatch):
    train, held = sets
    kwargs = dict(steps=20, loss="tv", lr=5e-3, batch=6, eval_every=5, checkpoint_every=10,
                  progress=False)

    straight = distill.init_draft(DRAFT, seed=3)
    distill.distill(straight, train, held, checkpoint_dir=tmp_path / "a", **kwargs)

    real_save = distill.atomic_save

    def crash_after_step_10(obj, path):
        real_save(obj, path)
        if obj["state"]["step"] == 10:
            raise KeyboardInterrupt

    monkeypatch.setattr(distill, "atomic_save", crash_after_step_10)
    interrupted = distill.init_draft(DRAFT, seed=3)
    with pytest.raises(KeyboardInterrupt):
        distill.distill(interrupted, train, held, checkpoint_dir=tmp_path / "b", **kwargs)
    monkeypatch.setattr(distill, "atomic_save", real_save)

    # different init: everything must come from the checkpoint
    resumed = distill.init_draft(DRAFT, seed=4)
    result = distill.distill(resumed, train, held, checkpoint_dir=tmp_path / "b", **kwargs)
    assert result["steps"] == 20
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    saved_a = torch.load(tmp_path / "a" / "last.pt", weights_only=False)
    saved_b = torch.load(tmp_path / "b" / "last.pt", weights_only=False)
    assert saved_a["state"]["epoch"] == saved_b["state"]["epoch"]
    assert saved_a["state"]["pos"] == saved_b["state"]["pos"]
    assert [h["held_out_beta"] for h in saved_a["state"]["history"]] == \
        [h["held_out_beta"] for h in saved_b["state"]["history"]]


def test_pca_embedding_keeps_the_main_directions():
    e = torch.randn(200, 3) @ torch.randn(3, 16) + 0.01 * torch.randn(200, 16)
    projected = distill.pca_embedding(e, 4)
    assert projected.shape == (200, 4)
    gram = lambda x: (x - x.mean(0)) @ (x - x.mean(0)).T  # noqa: E731
    assert torch.corrcoef(torch.stack([gram(e).flatten(), gram(projected).flatten()]))[0, 1] > 0.99


def test_split_is_deterministic_and_disjoint():
    train, held = data.split(list(range(20)), every=4)
    assert held == [0, 4, 8, 12, 16] and len(train) == 15
    assert set(data.chat_prompts("train")).isdisjoint(data.chat_prompts("held_out"))
    assert len(data.chat_prompts("all")) >= 150
