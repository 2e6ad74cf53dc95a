"""Bad input of every kind: exit code 2, one line on stderr, no traceback, nothing lost.

Most cases fail before any model loads (the default target is never needed); the rest use tiny
models saved to disk.
"""

import json

import pytest
import torch

import specq
from specq.checks import MARKER
from specq.cli import main
from specq.errors import SpecqError
from specq.loading.formats.save import save_native
from specq.model import feature_draft
from specq.model.feature_draft import new_feature_draft

from conftest import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny models and input files: good ones, and each kind of bad one."""
    root = tmp_path_factory.mktemp("bad")
    target = tiny_model(scale=3.0)
    save_native(target, root / "target")
    small = tiny_model(vocab=16, seed=5)  # fewer embedding rows than the target's 32 tokens
    small.tokenizer = tiny_tokenizer(32)
    save_native(small, root / "small")
    feature_draft.save(new_feature_draft(target.net, torch.arange(16), 1), root / "feature",
                       target.tokenizer, target.eos_ids)
    texts = {"prompts.txt": "t1 t2\nt3 t4\n",
             "bad.jsonl": '{"text": "t1", "prompt": "t1"}\n{oops\n', "missing.jsonl": '{"x": 1}\n',
             "number.jsonl": '{"text": 5}\n', "array.jsonl": "[1]\n", "empty.jsonl": "\n",
             "empty.txt": ""}
    for name, text in texts.items():
        (root / name).write_text(text)
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "folder").mkdir()
    return root


def _run(args, capsys) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def _refused(args, capsys, needle: str) -> None:
    code, err = _run(args, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("specq: error:")
    assert needle in err, err


def _tree(path):
    """Names and contents under a path, to show it was left alone."""
    if path.is_file():
        return path.read_bytes()
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None
            for p in sorted(path.rglob("*"))}


# ------------------------------------------------------------------ before any model loads

PRELOAD = [
    (["generate", "hi", "--seed", 2 ** 64], "--seed"),
    (["generate", "hi", "--seed", 2 ** 63], "--seed"),
    (["generate", "hi", "--threads", 99999], "--threads"),
    (["generate", "hi", "--gamma", 65], "--gamma"),
    (["generate", "hi", "--top-k", 10 ** 30], "--top-k"),
    (["generate", "hi", "--stop", ""], "stop"),
    (["generate", "hi \udcff"], "UTF-8"),
    (["generate", "@{root}/latin1.txt"], "line 1: not valid UTF-8"),
    (["generate", "@{root}/folder"], "cannot read prompt file"),
    (["generate", "hi", "--target", "x@int4-g99999999"], "group size"),
    (["quantize", "{root}/target", "int8", "--out", "{root}/prompts.txt/sub"],
     "is a file, not a folder"),
    (["quantize", "{root}/target", "int8", "--out", "/proc/specq-test"], "not writable"),
    (["quantize", "{root}/target", "int8", "--threads", 99999, "--out", "x"], "--threads"),
    (["compare", "a", "b", "--threads", 10 ** 30], "--threads"),
    (["calibrate", "d", "--target", "t", "--gamma", 65], "--gamma"),
    (["distill", "--out", "{tmp}/d", "--seed", 2 ** 64], "--seed"),
    (["distill", "--out", "{tmp}/d", "--temperatures", "1e300"], "--temperatures"),
    (["distill", "--out", "{tmp}/d", "--prompts", "{root}/bad.jsonl", "--texts"],
     "bad.jsonl line 2: not valid JSON"),
    (["distill", "--out", "{tmp}/d", "--prompts", "{root}/missing.jsonl", "--texts"],
     "line 1: no 'prompt' field"),
    (["distill", "--out", "{tmp}/d", "--prompts", "{root}/latin1.txt", "--texts"],
     "line 1: not valid UTF-8"),
    (["distill", "--out", "{tmp}/d", "--prompts", "--texts", "{root}/number.jsonl"],
     "'text' must be a string"),
    (["distill", "--out", "{tmp}/d", "--prompts", "--texts", "{root}/array.jsonl"],
     "expected a JSON object"),
    (["distill", "--out", "{tmp}/d", "--prompts", "--texts", "{root}/empty.jsonl"],
     "holds no text"),
    (["distill", "--out", "{tmp}/d", "--prompts", "synthetic:" + "9" * 30, "--texts"], "synthetic"),
    (["distill", "--out", "{tmp}/d", "--work", "{root}/prompts.txt"], "is a file"),
    (["bench", "--threads", 99999], "'threads'"),
    (["bench", "--seed", 2 ** 64], "'seed'"),
    (["bench", "--gamma", 65], "'gamma'"),
    (["bench", "--results", "{root}/folder"], "is a folder"),
    (["bench", "--results", "/proc/specq-test.jsonl"], "not writable"),
    (["bench", "--prompt-sets", "file", "--prompt-file", "{root}/bad.jsonl"], "bad.jsonl line 2"),
    (["bench", "--prompt-sets", "file", "--prompt-file", "{root}/latin1.txt"], "not valid UTF-8"),
    (["bench", "--prompt-sets", "file", "--prompt-file", "{root}/empty.txt"], "holds no text"),
    (["report", "{root}/folder"], "not found"),
    (["report", "{root}/prompts.txt", "--resamples", 10 ** 30], "--resamples"),
]


@pytest.mark.parametrize("args,needle", PRELOAD,
                         ids=lambda v: str(v)[:60] if isinstance(v, list) else None)
def test_refused_before_any_model_loads(args, needle, files, tmp_path, monkeypatch, capsys):
    # the built-in target would need converting here
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    args = [str(a).format(root=files, tmp=tmp_path) for a in args]
    _refused(args, capsys, needle)
    assert not (tmp_path / "cache").exists()  # nothing loaded, nothing converted


def test_bench_config_numbers_are_bounded(tmp_path, capsys):
    for text, key in (("threads = 99999", "threads"), (f"seed = {2 ** 63}", "seed"),
                      ("prompts = 3000000000", "prompts"), ("temperature = 1e300", "temperature")):
        (tmp_path / "c.toml").write_text(text + "\n")
        _refused(["bench", tmp_path / "c.toml"], capsys, f"'{key}'")


# ------------------------------------------------------------------ outputs: nothing lost


def _existing(tmp_path, kind: str):
    path = tmp_path / "old"
    if kind == "file":
        path.write_text("precious")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("precious")
        if kind == "specq folder":
            (path / MARKER).write_text("")
    return path


OUTPUT_COMMANDS = {
    "quantize": ["quantize", "{root}/target", "int8", "--threads", 1, "--out"],
    "distill": ["distill", "--target", "{root}/target", "--arch", "1x32", "--steps", 1, "--prompts",
                "--texts", "{root}/prompts.txt", "--accept-prompts", 0, "--out"],
    "calibrate": ["calibrate", "{root}/target", "--target", "{root}/target", "--steps", 1, "--out"],
}


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
@pytest.mark.parametrize("kind,force,needle", [("file", False, "exists and is a file"),
                                               ("folder", False, "add --force"),
                                               ("specq folder", False, "add --force"),
                                               ("folder", True, "specq did not write")])
def test_existing_output_is_never_lost(command, kind, force, needle, files, tmp_path, capsys):
    old = _existing(tmp_path, kind)
    before = _tree(old)
    args = ([str(a).format(root=files) for a in OUTPUT_COMMANDS[command]] + [str(old)]
            + ["--force"] * force)
    _refused(args, capsys, needle)
    assert _tree(old) == before


def test_force_replaces_a_folder_specq_wrote(files, tmp_path, capsys):
    out = tmp_path / "q"
    assert (main(["quantize", str(files / "target"), "int8", "--threads", "1", "--out", str(out)])
            == 0)
    assert (out / MARKER).is_file()
    capsys.readouterr()
    _refused(["quantize", str(files / "target"), "int4-g32", "--threads", "1", "--out", str(out)],
             capsys, "--force")
    assert main(["quantize", str(files / "target"), "int4-g32", "--threads", "1", "--out", str(out),
                 "--force"]) == 0
    assert json.loads((out / "quant_config.json").read_text())["spec"] == "int4-g32-rtn"


def test_calibrate_asks_for_resume(files, tmp_path, capsys):
    checkpoint = tmp_path / ".cal.ckpt" / "last.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"state")
    _refused(["calibrate", files / "target", "--target", files / "target", "--out",
              tmp_path / "cal"], capsys,
             "--resume")
    assert checkpoint.read_bytes() == b"state"


def test_report_outputs_and_bad_rows(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"type": "cell", "key": "k"}) + "\n")
    (tmp_path / "r.md").write_text("mine")
    _refused(["report", results], capsys, "add --force")
    assert (tmp_path / "r.md").read_text() == "mine"
    _refused(["report", results, "--out", tmp_path / "x"], capsys,
             "line 1 (cell record): field 'cell'")
    results.write_text("1\n")
    _refused(["report", results, "--out", tmp_path / "x"], capsys, "line 1 is not a JSON object")
    (tmp_path / "y.md").mkdir()
    _refused(["report", results, "--out", tmp_path / "y", "--force"], capsys, "is a folder")


# ------------------------------------------------------------------ checks that need the models


def test_model_checks(files, capsys):
    t = files / "target"
    _refused(["generate", "t1 t2", "--target", t, "--draft", files / "small"], capsys,
             "16 embedding rows")
    _refused(["generate", "t1", "--target", files / "feature", "--no-speculative"], capsys,
             "is a feature draft")
    _refused(["compare", files / "feature", t], capsys, "is a feature draft")
    _refused(["compare", t, t, "--chat-prompts", 0, "--chunk-len", 4096], capsys,
             "exceed the context")
    _refused(["compare", t, t, "--chat-prompts", 0, "--chunks", 10 ** 6, "--chunk-len", 500],
             capsys, "fewer than the 1000000 asked for")


@pytest.fixture(scope="module")
def models(files):
    return specq.load(str(files / "target")), specq.load(str(files / "small"))


API_BAD = [
    dict(prompt=123), dict(prompt=None), dict(prompt=["a"]), dict(prompt=[-1]), dict(prompt=[32]),
    dict(prompt=[1.5]), dict(prompt=b"t1"), dict(prompt="t1 \udcff"), dict(gamma=1.5),
    dict(gamma=65), dict(max_new_tokens="5"), dict(max_new_tokens=None), dict(max_new_tokens=1.5),
    dict(max_new_tokens=float("nan")), dict(temperature=None), dict(temperature="hot"),
    dict(temperature=float("inf")), dict(top_k=1.5), dict(top_k=None), dict(top_p="x"),
    dict(seed=-1), dict(seed=2 ** 64), dict(seed="a"), dict(seed=1.5), dict(stop=[1]),
    dict(stop=[None]), dict(draft_confidence="x"), dict(draft_confidence=float("nan")),
]


@pytest.mark.parametrize("options", API_BAD, ids=lambda o: repr(o)[:40])
def test_api_wrong_values_and_types(options, models):
    target, _ = models
    options = {"prompt": "t1 t2", "max_new_tokens": 4} | options
    with pytest.raises(SpecqError):
        specq.generate(target, options.pop("prompt"), target, **options)


@pytest.mark.parametrize("ref", [123, None, [], b"x", {}])
def test_api_load_needs_a_string(ref):
    with pytest.raises(SpecqError, match="a string"):
        specq.load(ref)


def test_api_models_must_be_models(models):
    target, small = models
    for bad_target, bad_draft in (("smollm2-135m", None), (None, None), (target, 5), (target, "x"),
                                  (target, small)):
        with pytest.raises(SpecqError):
            specq.generate(bad_target, "t1", bad_draft, max_new_tokens=2)
    # one stop string is fine
    assert specq.generate(target, "t1", target, max_new_tokens=2, stop="t9").token_ids


def test_calibrate_registers_in_the_user_registry(files, tmp_path, monkeypatch):
    from specq.loading.drafts import registry

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "elsewhere" / "cal"
    assert main(["calibrate", str(files / "target"), "--target", str(files / "target"), "--out",
                 str(out), "--register", "--prompts", "2", "--held-out", "1", "--steps", "2",
                 "--max-new-tokens", "4", "--threads", "1"]) == 0
    assert not (out.parent / "manifest.json").exists()
    path, _, exact = registry.select(tmp_path / "none", tmp_path / "cache" / "drafts",
                                     str(files / "target"), "fp32")
    assert exact and path == out.resolve()
