"""Hostile input as a new user gives it (issue 28), one test per class of what went wrong: broken
model folders, bad input that was accepted, an over-long calibration window, a refused results
file that was cut, a registry changed behind the user's back, a time budget that did not bound
the command, and the smaller ones. Each refusal is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest

from specq.cli import build_parser, main
from specq.loading.drafts import registry
from specq.loading.formats.save import save_native

from conftest import perturbed, tiny_model

MODEL_ARGS = ["--max-new-tokens", "3", "--no-warmup"]


def _config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def _cut(path, keep):
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(keep(data))


BROKEN = {  # name -> how a good folder is broken
    "only config.json": lambda d: [p.unlink() for p in d.iterdir() if p.name != "config.json"],
    "no tokenizer": lambda d: [(d / n).unlink()
                               for n in ("tokenizer.json", "tokenizer_config.json")],
    "no weights": lambda d: (d / "model.safetensors").unlink(),
    "config null": lambda d: (d / "config.json").write_text("null"),
    "config a list": lambda d: (d / "config.json").write_text("[1, 2]"),
    "truncated weights": lambda d: _cut(d, lambda b: b[: len(b) // 2]),
    "empty weights": lambda d: _cut(d, lambda b: b""),
    "random weights": lambda d: _cut(d, lambda b: os.urandom(len(b))),
    "hidden size": lambda d: _config(d, hidden_size=64),
    "vocabulary": lambda d: _config(d, vocab_size=40),
    "heads do not divide": lambda d: _config(d, num_attention_heads=5, head_dim=None),
    "zero layers": lambda d: _config(d, num_hidden_layers=0),
    "a BERT config": lambda d: _config(d, model_type="bert", architectures=["BertForMaskedLM"]),
    "tokenizer.json not a tokenizer": lambda d: (d / "tokenizer.json").write_text("{}"),
    "generation_config.json null": lambda d: (d / "generation_config.json").write_text("null"),
}
NEEDLES = {"only config.json": "no tokenizer", "no tokenizer": "no tokenizer",
           "no weights": "holds no weights", "config null": "holds null, not a JSON object",
           "config a list": "holds a list, not a JSON object", "truncated weights": "not a "
                                                                                    "readable "
                                                                                    "safetensors "
                                                                                    "file",
           "empty weights": "not a readable safetensors", "random weights": "not a readable "
                                                                            "safetensors file",
           "hidden size": "do not match its config.json", "vocabulary": "the config says 40x32",
           "heads do not divide": "not a multiple of the number of attention",
           "zero layers": "num_hidden_layers must be a positive integer",
           "a BERT config": "does not hold the weights of its config's architecture",
           "tokenizer.json not a tokenizer": "is not a readable tokenizer",
           "generation_config.json null": "generation_config.json' holds null"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    target = tiny_model(scale=3.0)
    save_native(target, root / "good")
    save_native(perturbed(target, 0.3), root / "draft")
    for name, breaks in BROKEN.items():
        shutil.copytree(root / "good", root / name)
        breaks(root / name)
    (root / "prompts.txt").write_text("t1 t2\nt3 t4\n")
    rng = random.Random(0)
    (root / "text.txt").write_text("\n\n".join(" ".join(f"t{rng.randrange(32)}" for _ in range(60))
                                               for _ in range(10)))
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _refused(args, capsys, needle: str) -> str:
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("specq: error:") and "Traceback" not in err, err
    assert needle in err, err
    return err


# -------------------------------------------------------- 1. broken local model folders


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_folder_is_one_line_before_any_model_loads(broken, root, cache, capsys):
    _refused(["generate", "t1 t2", "--target", root / broken, *MODEL_ARGS], capsys, NEEDLES[broken])
    assert not cache.exists()  # nothing converted, quantized or cached on the way


COMMANDS = {  # each place a model folder is given; B is the broken folder, G a good one
    "--target": ["generate", "t1", "--target", "B", *MODEL_ARGS],
    "--draft": ["generate", "t1", "--target", "G", "--draft", "B", *MODEL_ARGS],
    "quantize": ["quantize", "B", "int8", "--out", "{tmp}/q"],
    "distill --from": ["distill", "--target", "G", "--from", "B", "--out", "{tmp}/d", "--prompts",
                       "--texts", "{root}/prompts.txt"],
    "calibrate": ["calibrate", "B", "--target", "G", "--out", "{tmp}/c"],
    "compare": ["compare", "G", "B"],
    "serve --target": ["serve", "--target", "B", "--port", "0"],
    "export-gguf": ["export-gguf", "B", "--out", "{tmp}/e.gguf"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("broken", ["truncated weights", "vocabulary", "config null"])
def test_every_command_refuses_a_broken_folder_the_same_way(command, broken, root, tmp_path,
                                                            cache, capsys):
    names = {"B": str(root / broken), "G": str(root / "good")}
    args = [names.get(a, a.format(root=root, tmp=tmp_path)) for a in COMMANDS[command]]
    _refused(args, capsys, NEEDLES[broken])
    assert not cache.exists() and not any(tmp_path.glob("[qdc]"))


def test_a_good_folder_of_another_architecture_still_loads(tmp_path, capsys):
    """The transformers path (a Llama with biases, which the native module does not run) with a
    clean checkpoint: no error, no load report."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from conftest import tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attention_bias=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "biased")
    tiny_tokenizer(32).save_pretrained(tmp_path / "biased")
    capsys.readouterr()
    assert (main(["generate", "t1 t2", "--target", str(tmp_path / "biased"), "--json", *MODEL_ARGS])
            == 0)
    # the note that says why, and maybe that kernels were compiled
    lines = capsys.readouterr().err.splitlines()
    assert any(line.endswith("runs on transformers, without specq's kernels: attention biases "
                             "beyond q/k/v "
                             "(attention_bias)") for line in lines), lines
    assert all("runs on transformers" in line or "compiling specq's CPU kernels" in line
               for line in lines), lines


# -------------------------------------------------------- 2. bad input that was accepted


def test_bad_input_that_ran_with_exit_0_is_refused(root, tmp_path, cache, capsys):
    _refused(["generate", "t1", "--target", f"{root / 'good'}@", *MODEL_ARGS], capsys,
             "no precision after it")
    _refused(["generate", "t1", "--target", root / "good", "--draft", "self@", *MODEL_ARGS], capsys,
             "'self@' ends in '@'")
    assert not cache.exists()
    # a BERT config over Llama weights: transformers would initialize BERT's weights at random
    err = _refused(["generate", "t1", "--target", root / "a BERT config", *MODEL_ARGS], capsys,
                   "weights missing")
    assert "newly initialized" not in err
    # a feature draft's head larger than the vocabulary (32 tokens)
    _refused(["distill", "--target", root / "good", "--arch", "feature", "--head-vocab", 1000,
              "--out", tmp_path / "f", "--prompts", "--texts", root / "prompts.txt"], capsys,
             "more than the 32 tokens")
    # --resume with nothing to resume
    _refused(["distill", "--target", root / "good", "--out", tmp_path / "d", "--resume",
              "--prompts", "--texts", root / "prompts.txt"], capsys, "nothing to resume")
    _refused(["calibrate", root / "draft", "--target", root / "good", "--out", tmp_path / "c",
              "--resume"], capsys,
             "no unfinished calibration")
    # more prompts than the set holds, refused as `compare --chunks` refuses more
    # chunks than there are
    (tmp_path / "c.toml").write_text(f'targets = ["{root / "good"}"]\nprompts = 1000000000\n'
                                     f'results = "{tmp_path / "r.jsonl"}"\n')
    _refused(["bench", tmp_path / "c.toml"], capsys, "fewer than the 1000000000 asked for")
    assert not (tmp_path / "r.jsonl").exists()


def test_report_refuses_rows_without_numbers_instead_of_claiming_failures(tmp_path, capsys):
    """A results row whose numbers are null has no data: it is not a correctness failure."""
    from specq.core.stats import DecodeStats

    run = {"set": "chat", "prompt": 0, "repeat": 0, "token_ids": [1, 2], "text": "t1 t2",
           "stats": {**DecodeStats(gamma=2).__dict__, "decode_s": 0.5}}
    cell = {"type": "cell", "key": "k", "target": {"ref": "t", "precision": "fp32"}, "draft": None,
            "cell": {"kind": "baseline", "target": "t", "draft": None, "gamma": None,
                     "max_new_tokens": 2, "temperature": 0.0, "threads": 1, "set": "chat",
                     "repeats": 1}, "runs": [run]}
    head = {"type": "run", "run_id": "r", "started": "2026-12-01", "config": {}, "environment": {}}
    results = tmp_path / "r.jsonl"
    for broken in ({"token_ids": None}, {"token_ids": [None, None]}, {"stats": None},
                   {"stats": {**run["stats"], "decode_s": None}}):
        results.write_text(json.dumps(head) + "\n" + json.dumps({**cell, "runs": [run | broken]})
                           + "\n")
        _refused(["report", results, "--out", tmp_path / "x"], capsys, "a row without its data")
        assert not (tmp_path / "x.md").exists()


# -------------------------------------------------------- 3. calibration windows over the context


def test_quantize_refuses_windows_longer_than_the_context(root, tmp_path, capsys):
    _refused(["quantize", root / "good", "int4-g32-gptq", "--out", tmp_path / "q", "--calib-len",
              100000], capsys,
             "do not fit the model's context of 512 tokens")
    assert not (tmp_path / "q").exists()


# -------------------------------------------------------- 4. a refused results file is left alone


@pytest.mark.parametrize("garbage", [os.urandom(3000), b"\x00not json, and no newline" * 40,
                                     b'{"type": "run"}\n' + os.urandom(200)])
def test_bench_leaves_a_results_file_it_refuses_byte_identical(garbage, tmp_path, capsys):
    results = tmp_path / "garbage.jsonl"
    results.write_bytes(garbage)
    code = main(["bench", "--targets", "smollm2-135m", "--results", str(results), "--prompts", "1"])
    assert code == 2 and "results file" in capsys.readouterr().err
    assert results.read_bytes() == garbage


# -------------------------------------------------------- 5. the registry changes only when asked


def test_the_registry_changes_only_on_request_and_can_be_inspected(root, tmp_path, cache, capsys):
    target, draft = str(root / "good"), str(root / "draft")
    tiny = ["--prompts", "2", "--held-out", "1", "--steps", "2", "--max-new-tokens", "4",
            "--threads", "1"]
    assert main(["calibrate", draft, "--target", f"{target}@int8", "--out",
                 str(tmp_path / "scratch"), *tiny]) == 0
    assert "not registered" in capsys.readouterr().out
    # a scratch experiment changes nothing later runs pick
    assert registry.read(registry.user_dir()) == []
    assert main(["drafts", "which", f"{target}@int8"]) == 0
    assert capsys.readouterr().out.startswith("none (plain decoding)")
    assert main(["calibrate", draft, "--target", f"{target}@int8", "--out", str(tmp_path / "kept"),
                 "--register", *tiny]) == 0
    assert main(["drafts", "which", f"{target}@int8"]) == 0
    assert capsys.readouterr().out.splitlines()[-2] == str((tmp_path / "kept").resolve())
    # registered for int8, it never stands in for another precision
    assert main(["drafts", "which", f"{target}@int4-g32-rtn"]) == 0
    assert "used only at those precisions" in capsys.readouterr().out
    assert main(["drafts", "list", "--json"]) == 0
    mine = [r for r in json.loads(capsys.readouterr().out) if r["registry"] == "yours"]
    assert ([(r["target"], r["precision"], r["kind"]) for r in mine]
            == [(target, "int8", "sequence")])
    assert main(["drafts", "show", "kept"]) == 0 and "acceptance_after" in capsys.readouterr().out
    assert (main(["drafts", "add", str(tmp_path / "scratch"), "--target", f"{target}@int4-g32-rtn"])
            == 0)
    assert main(["drafts", "remove", "kept"]) == 0
    assert (tmp_path / "kept" / "config.json").is_file()  # the folder stays
    assert [(e.precision, e.draft) for e in registry.read(registry.user_dir())] == [
        ("int4-g32-rtn", str((tmp_path / "scratch").resolve()))]
    capsys.readouterr()
    _refused(["drafts", "remove", "smollm2-135m-draft"], capsys, "shipped with specq")
    _refused(["drafts", "remove", "nothing-like-it"], capsys, "no draft 'nothing-like-it'")
    _refused(["drafts", "add", root / "truncated weights", "--target", target], capsys,
             "not a readable safetensors")


# -------------------------------------------------------- 6. a time budget bounds the whole command


def test_the_budget_stops_teacher_data_between_shards(tmp_path):
    import time

    import torch

    from specq.training.distill import TeacherSet
    from specq.training.train import Budget, _sharded

    def make(items):  # a shard that takes longer than the budget left for teacher data
        time.sleep(0.3)
        ids = [torch.tensor([i, i + 1]) for i in items]
        return TeacherSet(ids, [0] * len(ids), [torch.zeros(1, 2, dtype=torch.int32)] * len(ids),
                          [torch.zeros(1, 2, dtype=torch.float16)] * len(ids))

    budget = Budget(time.monotonic() + 0.1)
    got = _sharded(tmp_path / "t", list(range(6)), 2, make, "test", budget=budget)
    assert len(got) == 2 and budget.skipped == 2  # the first shard started in time, the others not
    again = _sharded(tmp_path / "t", list(range(6)), 2, make, "test",
                     budget=Budget(time.monotonic() - 1))
    assert len(again) == 2  # cached shards are used whatever the budget


def test_distill_trains_on_the_data_the_budget_allowed(root, tmp_path, monkeypatch, capsys):
    from specq.training import train

    calls = []

    def one_shard(self):
        calls.append(1)
        if len(calls) > 1:
            self.skipped += 1
            return False
        return True

    monkeypatch.setattr(train.Budget, "allows", one_shard)
    assert main(["distill", "--target", str(root / "good"), "--out", str(tmp_path / "d"),
                 "--minutes", "5", "--arch", "1x32", "--steps", "2", "--prompts",
                 str(root / "prompts.txt"), "--texts", str(root / "text.txt"), "--gen-batch", "1",
                 "--new-tokens", "4", "--seq-len", "16", "--accept-prompts", "1", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["budget"]["teacher_shards_left_out"] == len(calls) - 1 > 0
    assert 0 < report["budget"]["train_budget_s"] < 5 * 60
    assert "the time budget stopped teacher data" in captured.err


# -------------------------------------------------------- 7. the smaller ones


def test_the_smaller_ones(root, tmp_path, capsys):
    for args in (["quantize", root / "good", "int8", "--out", ""],
                 ["calibrate", root / "draft", "--target", root / "good", "--out", ""],
                 ["distill", "--target", root / "good", "--out", ""],
                 ["distill", "--target", root / "good", "--out", tmp_path / "d", "--work", " "],
                 ["report", root / "prompts.txt", "--out", ""]):
        _refused(args, capsys, "expected a path, got an empty string")
    _refused(["generate", "@"], capsys, "a bare '@' names no prompt file")
    _refused(["serve", "--precisions", "fp32,", "--port", 0], capsys,
             "an empty precision in 'fp32,'")
    # as its help says
    _refused(["report", root / "prompts.txt", "--confidence", 1], capsys, "in [0.5, 1)")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "--help"])
    assert "[0.5, 1)" in " ".join(capsys.readouterr().out.split())
