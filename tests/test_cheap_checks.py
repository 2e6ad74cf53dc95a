"""Option checks in the order of their cost: what the names, the paths and the files' headers show
is refused in one line (exit 2) before any model loads, converts or quantizes, in every command.
Loading and quantizing are made to fail the test here, so a check that waits for them shows."""

from __future__ import annotations

import pytest

from specq.cli import main
from specq.errors import SpecqError
from specq.loading import models, precision
from specq.loading.formats.save import save_native
from specq.loading.vocab import check_names, check_target, check_target_ref

from conftest import GGUF_TOKENS, add_bpe_tokenizer, tiny_model, tiny_tokenizer, write_tiny_gguf


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cheap")
    save_native(tiny_model(scale=3.0), root / "target")
    foreign = tiny_model(seed=4)
    foreign.tokenizer = tiny_tokenizer(32, prefix="u")  # another tokenizer of the same size
    save_native(foreign, root / "foreign")
    vocab = len(GGUF_TOKENS)
    write_tiny_gguf(root / "file.gguf", tiny_model(vocab=vocab, layers=3, scale=3.0),
                    extra=add_bpe_tokenizer)

    def swapped(w):  # another tokenizer: "a" and "b" trade ids
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(["b", "a", *GGUF_TOKENS[2:]])
        w.add_token_types([1] * (vocab - 3) + [3, 3, 3])
        w.add_eos_token_id(vocab - 1)

    write_tiny_gguf(root / "other.gguf", tiny_model(vocab=vocab, seed=5), extra=swapped)
    return root


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path):
    """A model load (conversion included) or a quantization fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("an expensive step ran before the cheap checks")

    monkeypatch.setattr(models, "_load", refuse)
    monkeypatch.setattr(precision, "quantize_net", refuse)
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))  # registries and known models


T, F, G, O = "{root}/target", "{root}/foreign", "{root}/file.gguf", "{root}/other.gguf"
OUT = ["--out", "{tmp}/out"]
CASES = [
    (["generate", "hi", "--target", T, "--draft", "no-such-draft"], "unknown model"),
    (["generate", "hi", "--target", T, "--draft", F], "different vocabularies"),
    (["generate", "hi", "--target", G, "--draft", f"ngram+{O}"], "different vocabularies"),
    (["generate", "hi", "--target", f"{G}@gguf-keep2"], "a draft, not a target"),
    (["generate", "hi", "--target", f"{G}@gguf-int4-head1k"], "a draft, not a target"),
    (["quantize", "no-such-model", "int8", *OUT], "unknown model"),
    (["compare", T, F], "different vocabularies"),
    (["compare", T, "{root}/missing.gguf"], "GGUF file not found"),
    (["compare", f"{G}@gguf-keep2", G], "a draft, not a target"),
    (["calibrate", "no-such-draft", "--target", f"{T}@int4-g32-rtn", *OUT], "unknown model"),
    (["calibrate", F, "--target", f"{T}@int8", *OUT], "different vocabularies"),
    (["calibrate", T, "--target", f"{G}@gguf-keep2", *OUT], "a draft, not a target"),
    (["distill", "--target", T, "--from", F, *OUT], "different vocabularies"),
    (["distill", "--target", "no-such-target", *OUT], "unknown model"),
    (["qad", "no-such-model", "int4-g32-rtn", *OUT], "unknown model"),
    (["bench", "--targets", T, "--drafts", F, "--results", "{tmp}/r.jsonl"],
     "different vocabularies"),
    (["bench", "--targets", f"{G}@gguf-keep2", "--results", "{tmp}/r.jsonl"],
     "a draft, not a target"),
    (["bench", "--targets", G, "--target-quant", "gguf-keep2", "--results", "{tmp}/r.jsonl"],
     "a draft, not a target"),
    (["drafts", "add", F, "--target", T], "different vocabularies"),
    (["drafts", "add", T, "--target", f"{G}@gguf-keep2"], "a draft, not a target"),
    (["drafts", "add", T, "--target", f"{T}@int4-g32-rtn", "--file-type", "Q2_K"],
     "--file-type is for a GGUF file's precision"),
    (["drafts", "add", T, "--target", f"{G}@gguf", "--file-type", "Q9_Z"],
     "not a llama.cpp file type"),
    (["serve", "--target", G, "--draft", O, "--port", "0"], "different vocabularies"),
]


@pytest.mark.parametrize("args,needle", CASES)
def test_a_typo_is_one_line_before_any_model_loads(root, tmp_path, args, needle, capsys,
                                                   nothing_loads):
    code = main([a.format(root=root, tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.jsonl").exists()


def test_drafts_add_can_name_a_gguf_file_type(root, nothing_loads, capsys):
    """`--file-type` registers a draft for the target's GGUF files of that type only, and says so
    in `drafts add`, `drafts list` and `drafts show`."""
    from specq.loading.drafts import registry

    assert main(["drafts", "add", f"{root}/target", "--target", f"{root}/file.gguf@gguf",
                 "--file-type", "q3_k_m"]) == 0
    assert "(Q3_K_M files)" in capsys.readouterr().out
    entry, = registry.read(registry.user_dir())
    assert (entry.precision, entry.file_type) == ("gguf", "Q3_K_M")
    assert main(["drafts", "list"]) == 0 and "gguf (Q3_K_M)" in capsys.readouterr().out
    assert main(["drafts", "show", f"{root}/target"]) == 0
    assert "@gguf (Q3_K_M files)" in capsys.readouterr().out


def test_tokenizers_are_compared_only_where_the_files_tell(root):
    """Files with files and folders with folders; the same tokenizer passes, a hub id or a folder
    beside a file waits for the loaded models."""
    check_names(str(root / "file.gguf"), str(root / "file.gguf") + "@gguf-int4")
    check_names(str(root / "target"), str(root / "target"))
    check_names(str(root / "foreign"), str(root / "file.gguf"))  # told at load
    check_names("org/some-model", str(root / "target"))
    with pytest.raises(SpecqError, match="different vocabularies"):
        check_names(str(root / "other.gguf") + "@skip=1", str(root / "file.gguf"))


def test_keep_and_narrowed_heads_are_drafts_however_the_target_is_given(root):
    """@gguf-keep{N} and -head{N}k are refused as targets by name, and a model loaded so (the
    Python API) is refused as a target before it decodes, as a narrowed head always was."""
    import specq

    check_target_ref(f"{root}/file.gguf@gguf-int4")
    for spec in ("gguf-keep2", "gguf-int4-keep2", "gguf-head1k"):
        with pytest.raises(SpecqError, match="a draft, not a target"):
            check_target_ref(f"{root}/file.gguf@{spec}")
    kept = specq.load(f"{root}/file.gguf@gguf-keep2")
    assert kept.net.config.num_layers == 2  # it loads: it drafts
    with pytest.raises(SpecqError, match="a draft, not a target"):
        check_target(kept)
    with pytest.raises(SpecqError, match="a draft, not a target"):
        specq.generate(kept, "ab", draft=None, max_new_tokens=2)
    target = specq.load(f"{root}/file.gguf")
    out = specq.generate(target, "ab", draft=kept, max_new_tokens=4)
    assert out.token_ids == specq.generate(target, "ab", draft=None, max_new_tokens=4).token_ids
