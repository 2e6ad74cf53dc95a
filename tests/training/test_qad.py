"""`specq qad` on tiny targets: bad input, the KL it wins back, the format it keeps, resume,
loading by name, and speculation on a QAD target staying lossless."""

import json
import random

import pytest
import torch

import specq
from specq.cli import main
from specq.core.sampling import SamplingConfig
from specq.loading import precision
from specq.training import qad
from specq.weights.quant import load_quantized, parse_spec, quantize_model, weight_bytes
from specq.weights.quant.rtn import max_code

from conftest import (
    _exact_sequence_distribution,
    assert_speculative_is_plain,
    chi_square_p,
    perturbed,
    training_files,
)

FAST = ["--new-tokens", "8", "--text-windows", "32", "--seq-len", "32", "--eval-every", "1000",
        "--gen-batch", "4", "--batch", "4", "--lr", "0.005"]


def _files(tmp_path, monkeypatch, vocab: int, hidden: int, seed: int = 0):
    return training_files(tmp_path, monkeypatch, vocab, hidden, words=600, prompts=4, seed=seed)


@pytest.fixture()
def files(tmp_path, monkeypatch):
    return _files(tmp_path, monkeypatch, vocab=64, hidden=64)


def _args(files, spec: str, *extra: str) -> list[str]:
    return ["qad", str(files / "target"), spec, "--texts", str(files / "text.txt"), "--prompts",
            str(files / "prompts.txt"), *FAST, *extra]


@pytest.mark.parametrize("args,needle", [
    (["{target}", "fp32"], "float precision"),
    (["{target}", "int4-g32-zzz"], "bad quant spec"),
    (["{target}@int4-g32-rtn", "int4-g32-rtn"], "without an @spec"),
    (["{target}", "int4-g32-rtn", "--minutes", "0"], "--minutes"),
    (["{target}", "int4-g32-rtn", "--lr", "2"], "--lr"),
    (["{target}", "int4-g32-rtn", "--code-lr", "-1"], "--code-lr"),
    (["{target}", "int4-g32-rtn", "--lr", "0", "--code-lr", "0"], "nothing would train"),
    (["{target}", "int4-g32-rtn", "--texts", "--prompts"], "no training data"),
    (["{target}", "int4-g32-rtn", "--prompts", "{tmp}/missing.txt"], "missing.txt"),
    (["{target}", "int4-g32-rtn", "--out", "{tmp}/q", "--resume"], "nothing to resume"),
    (["{tmp}/nowhere", "int4-g32-rtn"], "nowhere"),
])
def test_bad_input_is_one_line_before_any_model_loads(files, capsys, args, needle):
    code = main(["qad"] + [a.format(target=files / "target", tmp=files) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (files / "cache").exists()  # nothing converted, quantized or cached


def test_a_qad_spec_that_is_not_built_is_one_line_naming_the_command(files, capsys):
    assert main(["generate", "t1", "--target", f"{files / 'target'}@int4-g32-rtn-qad",
                 "--no-speculative"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specq qad" in err and "quantizing" not in err


def test_qad_lowers_the_kl_keeps_the_format_and_loads_by_name(files, capsys):
    assert main(_args(files, "int4-g32-rtn", "--steps", "40", "--text-windows", "128",
                      "--code-lr", "0.005", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    before, after = report["held_out_before"], report["held_out_after"]
    assert report["steps"] == 40 and after["kl"] < 0.9 * before["kl"]  # held-out text and answers
    assert (report["settings"]["command"].startswith("specq qad")
            and report["teacher"].endswith("@fp32"))
    ref = f"{files / 'target'}"
    tuned, plain = specq.load(f"{ref}@int4-g32-rtn-qad"), specq.load(f"{ref}@int4-g32-rtn")
    assert tuned.precision == "int4-g32-rtn-qad" and plain.precision == "int4-g32-rtn"
    # the same format: module types, layer metadata, bytes in memory and on disk
    assert [type(m) for m in tuned.net.modules()] == [type(m) for m in plain.net.modules()]
    out, plain_dir = (precision.cached_quantized_dir(files / "cache", ref, files / "target",
                                                     parse_spec(s))
                      for s in ("int4-g32-rtn-qad", "int4-g32-rtn"))
    config = json.loads((out / "quant_config.json").read_text())
    plain_config = json.loads((plain_dir / "quant_config.json").read_text())
    assert config["spec"] == "int4-g32-rtn-qad" and config["layers"] == plain_config["layers"]
    assert (config["provenance"]["steps"] == 40
            and config["provenance"]["from"].endswith("@int4-g32-rtn"))
    assert ((out / "model.safetensors").stat().st_size
            == (plain_dir / "model.safetensors").stat().st_size)
    assert weight_bytes(tuned.net) == weight_bytes(plain.net)
    # plain RTN is untouched by the QAD run (no collision in the cache), and training
    # changed codes and scales
    fresh = quantize_model(specq.load(ref, backend=None).net, "int4-g32-rtn", progress=False)
    layers = {n: m for n, m in plain.net.named_modules() if hasattr(m, "quantized")}
    codes = scales = 0
    for name, m in layers.items():
        assert torch.equal(m.quantized().codes, fresh.get_submodule(name).quantized().codes)
        codes += int((tuned.net.get_submodule(name).quantized().codes != m.quantized().codes).sum())
        scales += int((tuned.net.get_submodule(name).quantized().scales
                       != m.quantized().scales).sum())
    assert codes > 0 and scales > 0
    # the same KL, measured again on the loaded model's packed kernels, is lower than plain RTN's
    teacher = specq.load(ref, backend=None)
    kl = dict.fromkeys((tuned.precision, plain.precision), 0.0)
    with torch.no_grad():
        for seed in range(16):  # new windows of the training texts' kind (uniform random tokens)
            ids = torch.tensor([random.Random(100 + seed).randrange(64) for _ in range(32)])
            p = torch.log_softmax(teacher.net(ids, None), -1)
            for m in (tuned, plain):
                kl[m.precision] += torch.nn.functional.kl_div(torch.log_softmax(m.net(ids, None),
                                                                                -1), p,
                                                              log_target=True,
                                                              reduction="batchmean").item()
    assert kl["int4-g32-rtn-qad"] < 0.95 * kl["int4-g32-rtn"]
    # speculation on the QAD target is plain decoding, with accepts and rejects
    assert_speculative_is_plain(tuned, perturbed(teacher, 0.05))
    assert main(_args(files, "int4-g32-rtn", "--steps", "2")) == 2  # exists: --force to rebuild
    assert "--force" in capsys.readouterr().err


def test_by_default_the_scales_train_and_the_codes_stay(files, capsys):
    assert (main(_args(files, "int4-g32-rtn", "--steps", "100", "--text-windows", "128", "--json"))
            == 0)
    report = json.loads(capsys.readouterr().out)
    assert report["held_out_after"]["kl"] < 0.9 * report["held_out_before"]["kl"]
    assert report["settings"]["code_lr"] == 0 and report["trained"].startswith("group scales")
    tuned, plain = (specq.load(f"{files / 'target'}@{s}")
                    for s in ("int4-g32-rtn-qad", "int4-g32-rtn"))
    scales = 0
    for name, m in plain.net.named_modules():
        if hasattr(m, "quantized"):
            assert torch.equal(tuned.net.get_submodule(name).quantized().codes, m.quantized().codes)
            scales += int((tuned.net.get_submodule(name).quantized().scales
                           != m.quantized().scales).sum())
    assert scales > 0


@pytest.mark.parametrize("spec",
                         ["int4-g32-rtn", "int3-g32-rtn-head8", "int2-g32-rtn-sym", "int4-g64-awq"])
def test_the_fake_quantized_student_is_the_exported_model(files, spec):
    """Latents moved far (some out of the code range) and scales by up to 20%: the exported
    model's simulated logits equal the student's, every code is in range, and the packed kernels
    agree to bf16 rounding."""
    target = specq.load(str(files / "target"), backend=None)
    quantized = specq.load(f"{files / 'target'}@{spec}", backend=None)
    net = qad.student(quantized.net, target.net if "awq" not in spec else None)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, qad.FakeQuantLinear):
                m.latent.add_(torch.randn(m.latent.shape, generator=gen) * 3)
                m.log_gain.add_((torch.rand(m.log_gain.shape, generator=gen) - 0.5) * 0.4)
        for p in net.parameters():
            if p.dim() == 1:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    out = files / "exported"
    precision.save_quantized_dir(qad.export(net), qad.qad_spec(spec), target.tokenizer,
                                 target.eos_ids, out)
    simulated = load_quantized(specq.load(str(files / "target"), backend=None).net, out,
                               packed=False)
    packed = specq.load(str(out), backend="eager")
    ids = torch.tensor([3, 9, 27, 1, 40, 12, 5, 63])
    with torch.no_grad():
        student = net(ids, None)
        torch.testing.assert_close(simulated(ids, None), student, rtol=1e-5, atol=1e-5)
        assert (packed.net(ids, None) - student).abs().max() < 0.05 * student.abs().max()
    for m in net.modules():
        if isinstance(m, qad.FakeQuantLinear):
            codes = m.quantized().codes
            lo = 0 if m.zeros is not None else -max_code(m.bits, True)
            assert codes.min() >= lo and codes.max() <= max_code(m.bits, m.zeros is None)
            assert codes.min() == lo  # the clamp was reached: moved latents were brought into range


def test_resume_continues_an_interrupted_run(files, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    args = _args(files, "int4-g32-rtn", "--checkpoint-every", "2", "--json")
    monkeypatch.setattr(qad, "export", interrupted)  # training ran 4 steps, then the run stops
    assert main(args + ["--steps", "4"]) == 130
    [ckpt] = (files / "cache").rglob("last.pt")
    # the frozen codes are not in it: rebuilt on resume
    saved = torch.load(ckpt, weights_only=False)["model"]
    assert (any(k.endswith(".log_gain") for k in saved)
            and not any(k.endswith(".latent") for k in saved))
    monkeypatch.undo()
    monkeypatch.setenv("SPECQ_CACHE", str(files / "cache"))
    capsys.readouterr()
    assert main(args + ["--steps", "6"]) == 2  # an unfinished run is continued only when asked
    assert "--resume" in capsys.readouterr().err
    assert main(args + ["--steps", "6", "--resume"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["steps"] == 6 and "shard" not in captured.err  # teacher data from the first run
    assert [h["step"] for h in report["history"]] == [4, 6]  # the first run's end, then this one's


def test_speculative_sampling_on_a_qad_target_follows_it(tmp_path, monkeypatch, capsys):
    files = _files(tmp_path, monkeypatch, vocab=5, hidden=32, seed=11)
    assert main(_args(files, "int4-g32-rtn", "--steps", "10")) == 0
    target = specq.load(f"{files / 'target'}@int4-g32-rtn-qad")
    draft = perturbed(specq.load(str(files / "target"), backend=None), 0.3)
    prompt, runs = [1, 2], 2000
    exact = _exact_sequence_distribution(target, prompt, 3, SamplingConfig(temperature=1.0))
    counts, accepted, rejected = dict.fromkeys(exact, 0), 0, 0
    for seed in range(runs):
        out = specq.generate(target, prompt, draft, gamma=2, max_new_tokens=3, temperature=1.0,
                             seed=seed, draft_confidence=0.0)
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert accepted > 0 and rejected > 0
    assert chi_square_p(counts, exact, runs) > 0.001


@pytest.mark.parametrize("codes,scales", [(False, True), (True, False), (True, True)])
def test_gradients_reach_what_trains_and_nothing_else(files, codes, scales):
    target = specq.load(str(files / "target"), backend=None)
    quantized = specq.load(f"{files / 'target'}@int4-g32-rtn", backend=None)
    net = qad.student(quantized.net, target.net, codes=codes, scales=scales)
    ids = torch.tensor([3, 9, 27, 1, 40, 12, 5, 63])
    torch.log_softmax(net(ids, None), -1)[:-1].gather(-1, ids[1:, None]).sum().backward()
    layers = [m for m in net.modules() if isinstance(m, qad.FakeQuantLinear)]
    for m in layers:
        assert (m.latent.grad is not None and bool(m.latent.grad.abs().sum() > 0)) == codes
        assert (m.log_gain.grad is not None and bool(m.log_gain.grad.abs().sum() > 0)) == scales
    trained = {id(p) for g in qad.param_groups(net) for p in g["params"]}
    assert trained == {id(p) for p in net.parameters() if p.requires_grad}
    assert all(g["weight_decay"] == 0 for g in qad.param_groups(net))
