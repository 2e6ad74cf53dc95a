"""The default draft (`loading/drafts/default.py`): a registered draft, else a smaller known model
with the target's tokenizer, always behind an n-gram lookup; a model that fails to load leaves the
lookup alone; the same choice in `specq generate`, the API and the bench."""

from __future__ import annotations

import json

import pytest

import specq
from specq.cli import main
from specq.errors import SpecqError
from specq.loading import vocab
from specq.loading.drafts import default, known, registry
from specq.loading.formats.save import save_native

from conftest import GGUF_TOKENS, add_bpe_tokenizer, perturbed, tiny_model, write_tiny_gguf

VOCAB = len(GGUF_TOKENS)
SWAPPED = ["b", "a", *GGUF_TOKENS[2:]]  # another tokenizer: "a" and "b" trade ids


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _gguf(path, layers: int, hidden: int, tokens=None, seed: int = 0):
    """A tiny GGUF file with GGUF_TOKENS (or `tokens`) as its vocabulary."""
    model = tiny_model(vocab=len(tokens or GGUF_TOKENS), layers=layers, hidden=hidden, seed=seed,
                       scale=3.0)

    def tokenizer(w):
        if tokens is None:
            return add_bpe_tokenizer(w)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types([1] * (len(GGUF_TOKENS) - 3) + [3] * (len(tokens) - len(GGUF_TOKENS) + 3))
        w.add_token_merges(["a b"])
        w.add_eos_token_id(len(GGUF_TOKENS) - 1)

    write_tiny_gguf(path, model, extra=tokenizer)
    return path


def test_a_tokenizer_is_known_by_its_tokens_whatever_the_padding_or_the_format(cache):
    a = _gguf(cache / "a.gguf", 2, 32)
    padded = _gguf(cache / "b.gguf", 1, 32, GGUF_TOKENS + ["[PAD62]", "[PAD63]"])
    other = _gguf(cache / "c.gguf", 1, 32, SWAPPED)
    assert known.identity(a)[0] == known.identity(padded)[0] != known.identity(other)[0]
    assert known.identity(a)[1] == a.stat().st_size
    # a folder with the same tokens in its tokenizer.json reads the same tokenizer
    target = specq.load(f"{a}@fp32")
    folder = cache / "folder"
    save_native(target, folder)
    assert known.identity(folder)[0] == known.identity(a)[0]
    # a file changed in place is read again
    _gguf(a, 2, 32, SWAPPED)
    assert known.identity(a)[0] == known.identity(other)[0]


def test_the_default_is_a_smaller_model_with_the_targets_tokenizer_behind_a_lookup(cache):
    target = _gguf(cache / "target.gguf", 4, 64)
    assert default.choose(str(target)).ref == "ngram"  # nothing known yet
    big = _gguf(cache / "big.gguf", 4, 64, seed=1)
    small = _gguf(cache / "small.gguf", 1, 32, seed=2)
    foreign = _gguf(cache / "foreign.gguf", 1, 32, SWAPPED)
    for path in (big, small, foreign):
        specq.load(str(path))  # loading a file makes it known
    choice = default.choose(str(target))
    assert choice.ref == f"ngram+{small}"
    assert "no draft registered" in choice.note and "reads its tokenizer" in choice.note
    # a registered draft comes first
    save_native(specq.load(f"{big}@fp32"), cache / "registered")
    registry.register(str(target), "gguf", cache / "registered")
    assert default.choose(str(target)).ref == f"ngram+{cache / 'registered'}"


def test_a_model_without_a_row_for_each_target_token_is_not_its_default(cache):
    """One tokenizer padded to two lengths (Qwen2.5's 0.5B and 7B files): the draft with fewer
    embedding rows cannot read every token the target may emit, so it is not chosen, and one
    padded as far is."""
    pads = ["[PAD62]", "[PAD63]", "[PAD64]", "[PAD65]"]
    target = _gguf(cache / "target.gguf", 4, 64, GGUF_TOKENS + pads)
    short = _gguf(cache / "short.gguf", 1, 32, seed=2)
    specq.load(str(short))
    assert known.identity(short)[0] == known.identity(target)[0]  # one tokenizer
    assert known.sizes(short) == (VOCAB, VOCAB) and known.sizes(target) == (VOCAB + 4, VOCAB + 4)
    assert default.choose(str(target)).ref == "ngram"
    with pytest.raises(SpecqError, match="fewer than the 68 tokens"):  # named, before any load
        vocab.check_names(str(short), str(target))
    padded = _gguf(cache / "padded.gguf", 1, 32, GGUF_TOKENS + pads, seed=3)
    specq.load(str(padded))
    assert default.choose(str(target)).ref == f"ngram+{padded}"


@pytest.mark.parametrize("damage", [lambda e: [], lambda e: {"stamp": e["stamp"]},
                                    lambda e: e | {"ref": 7}], ids=["list", "keys", "types"])
def test_a_damaged_known_models_entry_is_read_again(cache, damage):
    """An entry of the table that does not read as one (edited, or damaged) is not trusted: the
    model is read again (no longer remembered as loaded) and the table repaired, never an
    internal error."""
    target = _gguf(cache / "target.gguf", 4, 64)
    small = _gguf(cache / "small.gguf", 1, 32, seed=2)
    specq.load(str(small))
    table_file = cache / "cache" / known.KNOWN
    table = json.loads(table_file.read_text())
    table[str(small.resolve())] = damage(table[str(small.resolve())])
    table_file.write_text(json.dumps(table))
    assert known.identity(small)[1] == small.stat().st_size
    assert default.choose(str(target)).ref == "ngram"
    assert json.loads(table_file.read_text())[str(small.resolve())]["bytes"] == small.stat().st_size


def test_the_registry_draft_is_the_default_behind_a_lookup():
    choice = default.choose("smollm2-135m")
    assert choice.ref.startswith("ngram+smollm2-135m-")
    assert "registered for smollm2-135m" in choice.note


def test_a_default_that_does_not_load_leaves_the_lookup_alone(cache, monkeypatch):
    target = _gguf(cache / "target.gguf", 4, 64)
    small = _gguf(cache / "small.gguf", 1, 32, seed=2)
    specq.load(str(small))
    loads = []

    def load(ref):
        loads.append(ref)
        raise specq.SpecqError("another vocabulary")

    draft, note = default.load_default(str(target), load)
    assert loads == [str(small)]
    assert isinstance(draft, specq.NgramDraft) and draft.fallback is None
    assert "did not load (another vocabulary): n-gram lookup alone" in note


def test_generate_speculates_by_default_losslessly_and_says_what_it_chose(cache, capsys):
    target = _gguf(cache / "target.gguf", 4, 64)
    small = _gguf(cache / "small.gguf", 1, 32, seed=2)
    specq.load(str(small))
    model = specq.load(str(target))
    prompt = "a b c d a b c d a b c"
    plain = specq.generate(model, prompt, None, max_new_tokens=40)
    out = specq.generate(model, prompt, max_new_tokens=40)
    assert out.token_ids == plain.token_ids
    assert out.draft.startswith("ngram:") and out.draft.endswith(f"+{small}")
    assert "reads its tokenizer" in out.draft_note
    assert sum(r["drafted"] for route, r in out.stats.routes.items() if route != "plain") > 0
    # the CLI: the same choice, its note, and each route's steps
    assert main(["generate", "--target", str(target), prompt, "--max-new-tokens", "40",
                 "--json", "--no-warmup"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["token_ids"] == plain.token_ids
    assert shown["draft"] == out.draft and shown["draft_note"] == out.draft_note
    assert set(shown["stats"]["routes"]) <= {"lookup", "model", "plain"}
    assert main(["generate", "--target", str(target), prompt, "--max-new-tokens", "8",
                 "--no-speculative", "--json", "--no-warmup"]) == 0
    assert json.loads(capsys.readouterr().out)["draft"] is None


def test_the_api_default_for_a_model_with_no_file_is_the_lookup():
    target = tiny_model(scale=3.0, seed=4)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    plain = specq.generate(target, prompt, None, max_new_tokens=30)
    out = specq.generate(target, prompt, max_new_tokens=30)
    assert out.token_ids == plain.token_ids
    assert out.draft == specq.NgramDraft().ref and "n-gram lookup" in out.draft_note
    assert out.stats.routes["lookup"]["accepted"] > 0
    assert plain.draft is None and set(plain.stats.routes) == {"plain"}


def test_the_bench_default_entry_is_the_targets_default():
    from specq.bench.config import plan, validate
    from specq.bench.prompts import Prompt

    config = validate({"targets": ["smollm2-135m"], "gamma": ["auto"]})
    assert config.drafts == ["default"]
    cells, notes = plan(config, {"chat": [Prompt("chat", 0, "Hi", chat=True)]})
    drafts = {c.draft for c in cells if c.kind == "speculative"}
    assert drafts == {f"ngram:n=2-3:k=4:c=16+{default.choose('smollm2-135m').ref[len('ngram+'):]}"}
    assert any(n.startswith("default draft for smollm2-135m") for n in notes)


def test_a_perturbed_copy_the_size_of_its_target_is_no_default(cache):
    """A model as large as the target buys nothing on a CPU: not a candidate."""
    target = tiny_model(vocab=32, hidden=64, scale=3.0)
    save_native(target, cache / "target")
    save_native(perturbed(target, 0.1), cache / "twin")
    specq.load(str(cache / "twin"))
    assert default.choose(str(cache / "target")).ref == "ngram"
