"""Every bad input: one line on stderr, exit code 2, no traceback."""

import json
import subprocess
import sys

import pytest

from specq.cli import main
from specq.loading.formats.save import save_native

from conftest import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny_model(scale=3.0)
    save_native(target, root / "target")
    other = tiny_model(seed=4)
    other.tokenizer = tiny_tokenizer(32, prefix="u")
    save_native(other, root / "foreign")
    return root


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


BAD = [
    (["generate", "hi", "--target", "no-such-model"], "unknown model"),
    (["generate", "hi", "--gamma", "0"], "--gamma"),
    (["generate", "hi", "--gamma", "-3"], "--gamma"),
    (["generate", "hi", "--gamma", "many"], "--gamma"),
    (["generate", "hi", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--temperature", "nan"], "temperature"),
    (["generate", "hi", "--top-p", "1.5"], "top_p"),
    (["generate", "hi", "--top-k", "-2"], "--top-k"),
    (["generate", "   "], "empty"),
    (["generate", "@/no/such/file.txt"], "cannot read"),
    (["generate", "hi", "--target", "/no/such/model.gguf"], "not found"),
    (["frobnicate"], "invalid choice"),
    (["generate", "hi", "--tree", "8", "--gamma", "3"], "--tree-depth"),
    (["generate", "hi", "--tree", "0"], "--tree"),
    (["generate", "hi", "--tree", "65"], "--tree"),
    (["generate", "hi", "--tree", "8", "--tree-topk", "0"], "--tree-topk"),
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--precisions", "fp32,int9"], "bad quant spec 'int9'"),
    (["serve", "--precisions", "fp32,fp32"], "twice"),
    (["serve", "--precisions", ""], "an empty precision"),
    (["serve", "--target", "smollm2-135m@int8"], "--precisions"),
    (["serve", "--timeout", "0"], "--timeout"),
    (["serve", "--queue", "0"], "--queue"),
    (["serve", "--api-key", " "], "--api-key"),
    (["serve", "--api-key", "sk-a,,sk-b"], "--api-key"),
    (["serve", "--suffix-cache", "2"], "--suffix-cache"),
    (["serve", "--suffix-cache", "-1"], "--suffix-cache"),
    (["serve", "--host", "192.0.2.1"], "cannot listen"),  # an address of no interface here
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(args, needle, capsys):
    code, out, err = _run(args, capsys)
    assert code == 2
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_absurd_length_and_incompatible_vocab(tiny_dirs, capsys):
    t = str(tiny_dirs / "target")
    code, _, err = _run(["generate", "t1 t2", "--target", t, "--max-new-tokens", "100000"], capsys)
    assert code == 2 and "context" in err and err.count("\n") == 1
    code, _, err = _run(["generate", "t1 t2", "--target", t, "--draft", str(tiny_dirs / "foreign")],
                        capsys)
    assert code == 2 and "different vocabularies" in err and err.count("\n") == 1
    # a dir, not a model
    code, _, err = _run(["generate", "t1", "--target", str(tiny_dirs)], capsys)
    assert code == 2 and "config.json" in err


def test_generate_json_from_saved_dirs(tiny_dirs, capsys):
    import json

    t = str(tiny_dirs / "target")
    code, out, _ = _run(["generate", "t1 t2", "--target", t, "--draft", t, "--gamma", "3",
                         "--max-new-tokens", "12", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert len(result["token_ids"]) == 12
    assert result["stats"]["acceptance_rate"] == 1.0  # the draft is the target itself
    code, out2, _ = _run(["generate", "t1 t2", "--target", t, "--no-speculative",
                          "--max-new-tokens", "12", "--json"], capsys)
    assert json.loads(out2)["token_ids"] == result["token_ids"]
    code, out3, _ = _run(["generate", "t1 t2", "--target", t, "--draft", t, "--gamma", "auto",
                          "--max-new-tokens", "12", "--json"], capsys)
    assert (json.loads(out3)["token_ids"] == result["token_ids"]
            and json.loads(out3)["stats"]["gamma"] == 4)


def test_real_exit_code_subprocess():
    proc = subprocess.run([sys.executable, "-m", "specq.cli", "generate", "hi", "--gamma", "0"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_generate_with_a_tree_is_the_target_own_output(tiny_dirs, capsys):
    t = str(tiny_dirs / "target")
    outputs = []
    for extra in (["--no-speculative"],
                  ["--draft", t, "--tree", "8", "--tree-depth", "3", "--tree-topk", "2"],
                  ["--draft", t, "--tree", "8", "--gamma", "auto"]):
        code, out, _ = _run(["generate", "t1 t2", "--target", t, "--max-new-tokens", "12", "--json",
                             "--no-warmup", *extra], capsys)
        assert code == 0
        outputs.append(json.loads(out))
    assert outputs[1]["token_ids"] == outputs[0]["token_ids"] == outputs[2]["token_ids"]
    # more than one node per pass
    assert outputs[1]["stats"]["drafted"] > outputs[1]["stats"]["steps"]


def test_the_vocabulary_check_reads_each_tokenizer_once(monkeypatch):
    """A draft/target vocabulary check reads each tokenizer's map once (the server checks before
    every speculative request); a token added later, or a foreign tokenizer, still fails it."""
    from specq import check_compatible
    from specq.errors import SpecqError

    from conftest import tiny_model, tiny_tokenizer

    target, draft = tiny_model(vocab=32), tiny_model(vocab=32, seed=1)
    draft.tokenizer = tiny_tokenizer(32)
    reads = []
    for model in (target, draft):
        real = model.tokenizer.get_vocab
        monkeypatch.setattr(model.tokenizer, "get_vocab",
                            lambda real=real: reads.append(1) or real())
    for _ in range(3):
        check_compatible(draft, target)
    assert len(reads) == 2
    draft.tokenizer.add_tokens(["u1"])
    with pytest.raises(SpecqError, match="1 tokens only in the draft"):
        check_compatible(draft, target)
    draft.tokenizer = tiny_tokenizer(32, prefix="u")
    with pytest.raises(SpecqError, match="different vocabularies"):
        check_compatible(draft, target)
