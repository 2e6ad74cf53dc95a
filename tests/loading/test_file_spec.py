"""`@gguf` options (`loading/file_spec.py`): a narrowed head whose rows are the file's own blocks,
and a 4-bit body requantized from the file's exact weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specq.errors import SpecqError
from specq.kernels import int8dot
from specq.loading import file_spec, precision
from specq.loading.formats import gguf_io
from specq.loading.file_spec import FileSpec
from specq.model.llama import EAGER, Llama
from specq.weights.narrow_head import NarrowHead
from specq.weights.quant.modules import FileBlocks

from conftest import assert_speculative_is_plain, perturbed, tiny_model, write_tiny_gguf

VOCAB = 2048  # a head of 1k tokens keeps half of it


@pytest.mark.parametrize("text, canonical", [("gguf", "gguf"), ("gguf-head32k", "gguf-head32k"),
                                             ("GGUF-head16k-int4", "gguf-int4-head16k"),
                                             ("gguf-int4", "gguf-int4"),
                                             ("gguf-keep18-int4", "gguf-int4-keep18")])
def test_file_precisions_parse_to_one_spelling(text, canonical):
    assert file_spec.names_file(text.lower()) and precision.canonical(text.lower()) == canonical
    assert not precision.is_float(text.lower())


@pytest.mark.parametrize("text",
                         ["gguf-head", "gguf-head32", "gguf-head0k", "gguf-int4-int4", "gguf-q4",
                          "gguf-head8k-head16k", "gguf-", "gguf-keep1", "gguf-keep",
                          "gguf-keep4-keep3"])
def test_bad_file_precisions_are_one_line(text):
    with pytest.raises(SpecqError) as e:
        file_spec.parse(text)
    assert "\n" not in str(e.value) and "gguf[-int4][-head{N}k][-keep{N}]" in str(e.value)


@pytest.fixture
def tiny_file(tmp_path, monkeypatch):
    """(float model, parsed Q8_0 file, tokenizer) with a ranked list for its vocabulary: token ids
    in reverse order (so the kept half is the upper one) in a heads folder of its own."""
    model = tiny_model(vocab=VOCAB, hidden=32, scale=3.0)
    write_tiny_gguf(tmp_path / "tiny.gguf", model, "Q8_0")
    heads = tmp_path / "heads"
    heads.mkdir()
    np.save(heads / "tiny.npy", np.arange(VOCAB - 1, -1, -1, dtype=np.int32))
    (heads / "tiny.json").write_text(
        json.dumps({"vocabulary_sha256": file_spec.vocabulary_digest(model.tokenizer)}))
    monkeypatch.setattr(file_spec, "HEADS", heads)
    # the int4 body's, not the kernels'
    monkeypatch.setattr(file_spec, "cache_dir", lambda: tmp_path / "cache")
    return model, gguf_io.read(tmp_path / "tiny.gguf"), model.tokenizer


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("int4", [False, True], ids=["file", "int4"])
def test_narrowed_head_rows_are_the_whole_heads_rows(tiny_file, fast, int4):
    """The kept tokens' logits are bit for bit the whole head's (the same Q8_0 blocks, or with int4
    the same 4-bit rows, on the same kernel), the others -inf."""
    from specq import backends

    if fast and not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    _, parsed, tok = tiny_file
    full, _ = gguf_io.load_at_file_precision(parsed)
    narrow, _ = gguf_io.load_at_file_precision(parsed)
    file_spec.apply(full, parsed, FileSpec(int4=int4), tok)
    file_spec.apply(narrow, parsed, FileSpec(int4=int4, head_tokens=1024), tok)
    keep = narrow.output.keep
    assert isinstance(narrow.output, NarrowHead) and isinstance(narrow.output.rows, FileBlocks)
    assert narrow.output.rows.bits == full.output.bits == (4 if int4 else 8)
    assert narrow.output.rows.kind == ("Q8_0 as int4" if int4 else "Q8_0")
    assert torch.equal(keep, torch.arange(VOCAB // 2, VOCAB))
    backend = "kernels" if fast else "eager"
    ids = torch.tensor([1, 5, 900, 2, 1500, 3])
    with torch.inference_mode():
        a, b = backends.runner(full, backend)(ids), backends.runner(narrow, backend)(ids)
    assert torch.equal(b[:, keep], a[:, keep]) and torch.isneginf(b[:, :VOCAB // 2]).all()


def test_int4_body_and_head_are_close_to_the_files_weights(tiny_file):
    _, parsed, tok = tiny_file
    net, _ = gguf_io.load_at_file_precision(parsed)
    assert net.output.bits == 8  # the file's Q8_0 head
    file_spec.apply(net, parsed, FileSpec(int4=True), tok)
    reference = parsed.float_state_dict()
    for name in ("layers.0.attention.wqkv", "layers.1.feed_forward.w2", "output"):
        module = net.get_submodule(name)
        assert isinstance(module, FileBlocks) and module.bits == 4 and module.group_size == 32
        codes, d, m = int8dot.unpack(module._blocks)
        weight = (codes.float().view(module.out_features, -1, 32) * d[..., None]
                  + m[..., None]).flatten(1)
        expected = reference[f"{name}.weight"]
        step = d.repeat_interleave(32, 1)
        assert ((weight - expected).abs() <= 0.51 * step + 1e-6).all()  # RTN: within half a step


def test_int4_body_is_made_once_then_read_from_the_cache(tiny_file, monkeypatch):
    """The first load requantizes and saves the 4-bit body; the next one takes it from the cache in
    place of the file's tensors, which it neither requantizes nor repacks; a
    broken cache is remade."""
    _, parsed, tok = tiny_file
    spec = FileSpec(int4=True)
    requantize, repacked = file_spec.to_int4, []
    kernel_weight = gguf_io._kernel_weight
    monkeypatch.setattr(gguf_io, "_kernel_weight",
                        lambda g, parts: repacked.append(parts) or kernel_weight(g, parts))

    def load() -> torch.nn.Module:
        net, _ = gguf_io.load_at_file_precision(parsed, file_spec.cached_int4_body(parsed, spec))
        file_spec.apply(net, parsed, spec, tok)
        return net

    assert file_spec.cached_int4_body(parsed, spec) == {}
    made, first = load(), len(repacked)
    converted = [name for name, m in made.named_modules() if isinstance(m, FileBlocks)
                 and "as int4" in m.kind]
    # only a 4-bit body is read
    assert converted and file_spec.cached_int4_body(parsed, FileSpec()) == {}

    def no_requantizing(blocks):
        raise AssertionError("requantized although the cache holds the body")

    monkeypatch.setattr(file_spec, "to_int4", no_requantizing)
    read = load()
    # the cached modules' tensors were not repacked
    assert len(repacked) - first == first - len(converted)
    for name in converted:
        a, b = made.get_submodule(name), read.get_submodule(name)
        assert (b.kind == a.kind and (b.out_features, b.in_features,
                                      b.group_size) == (a.out_features, a.in_features, 32))
        for part in ("codes", "d", "m"):
            assert torch.equal(getattr(a._blocks, part), getattr(b._blocks, part))
    ids = torch.tensor([1, 5, 900, 2, 1500, 3])
    with torch.inference_mode():
        assert torch.equal(made(ids), read(ids))

    path = file_spec.int4_cache(parsed, made.get_submodule(converted[0])._blocks.variant)
    path.write_bytes(b"not a safetensors file")
    assert file_spec.cached_int4_body(parsed, spec) == {}
    monkeypatch.setattr(file_spec, "to_int4", requantize)
    load()
    assert file_spec.cached_int4_body(parsed, spec).keys() == set(converted)


def test_narrowed_int4_draft_of_a_file_speculates_losslessly(tiny_file, monkeypatch):
    """Greedy, the draft chooses among its head's kept rows alone (the whole-vocabulary row with
    -inf elsewhere only for a prompt's prefill), and the output is still the target's."""
    from specq import backends
    from specq.core.types import Model

    model, parsed, tok = tiny_file
    net, _ = gguf_io.load_at_file_precision(parsed)
    file_spec.apply(net, parsed, FileSpec(int4=True, head_tokens=1024), tok)
    draft = Model(ref="tiny.gguf@gguf-int4-head1k", net=net, tokenizer=tok, eos_ids=frozenset(),
                  source="tiny",
                  runner=backends.runner(net, "kernels" if int8dot.available() else "eager"))
    target = perturbed(model, 0.02, ref="target")  # agrees with the draft on most tokens
    calls = {"whole": 0, "kept": 0}
    whole, stacked = NarrowHead.forward, Llama.stacked
    monkeypatch.setattr(NarrowHead, "forward", lambda self, x, linear=None: calls.update(
        whole=calls["whole"] + 1) or whole(self, x, linear))
    monkeypatch.setattr(Llama, "stacked",
                        lambda self, seqs, hidden, head=None, ex=EAGER: calls.update(
        kept=calls["kept"] + (head is net.output.rows)) or stacked(self, seqs, hidden, head, ex))
    assert_speculative_is_plain(target, draft)
    assert calls["whole"] == 2 and calls["kept"] > 20  # the two prompts longer than one token


def test_a_vocabulary_without_a_ranked_list_is_one_line(tiny_file, monkeypatch, tmp_path):
    _, parsed, tok = tiny_file
    monkeypatch.setattr(file_spec, "HEADS", tmp_path / "none")
    net, _ = gguf_io.load_at_file_precision(parsed)
    with pytest.raises(SpecqError, match="no ranked token list"):
        file_spec.apply(net, parsed, FileSpec(head_tokens=1024), tok)
    with pytest.raises(SpecqError, match="holds only"):
        monkeypatch.setattr(file_spec, "HEADS", tiny_file[1].path.parent / "heads")
        file_spec.apply(net, parsed, FileSpec(head_tokens=4096), tok)


def test_kept_layers_keep_the_first_and_last_and_spread_the_dropped_ones():
    assert file_spec.kept_layers(24, 18) == [0, 1, 3, 4, 5, 7, 8, 9, 11, 12, 14, 15, 16, 18, 19,
                                             20, 22, 23]
    assert file_spec.kept_layers(5, 2) == [0, 4] and file_spec.kept_layers(5, 4) == [0, 1, 3, 4]


def test_a_draft_of_fewer_layers_runs_its_kept_layers_and_speculates_losslessly(tmp_path):
    """`keep{N}`: the kept layers' weights, in order, as many cache layers, and the target's own
    output with a draft that now agrees less (accepts and rejects asserted by the helper)."""
    from specq import backends
    from specq.core.types import Model

    model = tiny_model(vocab=VOCAB, layers=5, hidden=32, scale=3.0)
    write_tiny_gguf(tmp_path / "five.gguf", model, "Q8_0")
    parsed = gguf_io.read(tmp_path / "five.gguf")
    full, _ = gguf_io.load_at_file_precision(parsed)
    net, _ = gguf_io.load_at_file_precision(parsed)
    file_spec.apply(net, parsed, file_spec.parse("gguf-keep3"), model.tokenizer)
    assert len(net.layers) == net.config.num_layers == 3 and net.new_cache(8).k.shape[0] == 3
    for new, old in enumerate(file_spec.kept_layers(5, 3)):
        assert torch.equal(net.layers[new].ffn_norm.weight, full.layers[old].ffn_norm.weight)
    draft = Model(ref="five.gguf@gguf-keep3", net=net, tokenizer=model.tokenizer,
                  eos_ids=frozenset(), source="five",
                  runner=backends.runner(net, "kernels" if int8dot.available() else "eager"))
    assert_speculative_is_plain(model, draft)
    with pytest.raises(SpecqError, match="keep5 needs 2 to 4 of its 5 layers"):
        file_spec.apply(full, parsed, file_spec.parse("gguf-keep5"), model.tokenizer)


def test_a_changed_int4_body_is_made_again(tiny_file, capsys):
    """Bytes of the cached 4-bit body changed in place (the size and even the time kept) are not
    loaded: the body is requantized and saved again, with a line on stderr."""
    import os

    _, parsed, tok = tiny_file
    spec = FileSpec(int4=True)
    net, _ = gguf_io.load_at_file_precision(parsed)
    file_spec.apply(net, parsed, spec, tok)
    path = next((parsed.path.parent / "cache" / "gguf-int4").glob("*.safetensors"))
    assert file_spec.cached_int4_body(parsed, spec)
    st, data = path.stat(), bytearray(path.read_bytes())
    data[-256:] = bytes(255 - b for b in data[-256:])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    assert file_spec.cached_int4_body(parsed, spec) == {}
    assert f"{path} is damaged ({path.name}'s bytes differ" in capsys.readouterr().err
    net, _ = gguf_io.load_at_file_precision(parsed)
    file_spec.apply(net, parsed, spec, tok)
    assert file_spec.cached_int4_body(parsed, spec) and capsys.readouterr().err.count("\n") == 1
