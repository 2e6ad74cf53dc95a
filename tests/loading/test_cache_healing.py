"""Cache entries damaged after specq wrote them (truncated, emptied, deleted, bytes changed) are
built again with one line on stderr, never an internal error on this run and every later one:
a GGUF file's cached tokenizer, its converted float folder, the built-in target's."""

from __future__ import annotations

import pytest

from specq.loading import builtins
from specq.loading.formats import gguf_io, gguf_load, hf

from conftest import tiny_model, tiny_tokenizer, write_tiny_gguf

DAMAGE = {"truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
          "emptied": lambda f: f.write_text("{}"),
          "deleted": lambda f: f.unlink()}


@pytest.fixture()
def gguf(tmp_path, monkeypatch):
    """A tiny GGUF file, an empty cache, and the tokenizers built from the file (a tiny one)."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    built = []
    monkeypatch.setattr(gguf_io, "tokenizer", lambda path: built.append(path) or tiny_tokenizer(32))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_model(vocab=32))
    return path, built


@pytest.mark.parametrize("stamped", [True, False], ids=["stamped", "older"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cached_tokenizer_is_built_again(gguf, capsys, damage, stamped):
    path, built = gguf
    ids = gguf_load.tokenizer(path)("t1 t5 t9")["input_ids"]
    folder = path.parents[0] / "cache" / "tokenizers" / gguf_load._key(path)
    if not stamped:  # as an older version wrote it
        (folder / ".specq-stamp.json").unlink()
    DAMAGE[damage](folder / "tokenizer.json")
    capsys.readouterr()
    assert gguf_load.tokenizer(path)("t1 t5 t9")["input_ids"] == ids and len(built) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the cache entry {folder} is damaged (tokenizer.json" in err
    assert gguf_load.tokenizer(path)("t1 t5 t9")["input_ids"] == ids and len(built) == 2
    assert capsys.readouterr().err == ""


CONVERTED = {"file": lambda path, cache: (gguf_load.float_dir(path),
                                          cache / "gguf" / gguf_load._key(path)),
             "built-in": lambda path, cache: (builtins._smollm2_dir(), cache / "smollm2-135m")}


@pytest.mark.parametrize("which", list(CONVERTED))
@pytest.mark.parametrize("damage", ["truncated", "deleted", "changed"])
def test_a_damaged_converted_folder_is_converted_again(gguf, monkeypatch, capsys, which, damage):
    """A GGUF file's float folder, and the built-in target's (converted from its pip package's
    file, here the tiny file): weights truncated, deleted, or changed in place."""
    import torch

    path, _ = gguf
    monkeypatch.setattr(builtins, "_smollm2_gguf", lambda: path)
    converted, convert = [], gguf_load.convert
    monkeypatch.setattr(gguf_load, "convert",
                        lambda src, dst: converted.append(dst) or convert(src, dst))
    folder, expected = CONVERTED[which](path, path.parent / "cache")
    assert folder == expected and converted == [folder]
    net, _, _ = hf.load_dir(folder, torch.float32, local_only=True)
    weights = folder / "model.safetensors"
    if damage == "changed":
        data = bytearray(weights.read_bytes())
        data[-64:] = bytes(64)
        weights.write_bytes(bytes(data))
    else:
        DAMAGE[damage](weights)
    capsys.readouterr()
    assert CONVERTED[which](path, path.parent / "cache")[0] == folder and len(converted) == 2
    assert f"{folder} is damaged (model.safetensors" in capsys.readouterr().err
    again, _, _ = hf.load_dir(folder, torch.float32, local_only=True)
    for name, value in net.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name
    CONVERTED[which](path, path.parent / "cache")
    assert len(converted) == 2 and capsys.readouterr().err == ""


def test_a_tokenizer_built_another_way_is_built_again(gguf, monkeypatch):
    """A tokenizer cached before `gguf_io.tokenizer` changed is not reused: the build is in the
    key of every cache that holds one."""
    path, built = gguf
    gguf_load.tokenizer(path)
    gguf_load.tokenizer(path)
    assert len(built) == 1
    monkeypatch.setattr(gguf_load, "TOKENIZER_BUILD", gguf_load.TOKENIZER_BUILD + 1)
    gguf_load.tokenizer(path)
    assert len(built) == 2
