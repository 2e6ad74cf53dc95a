"""A hostile GGUF header: every metadata key of a tiny real-layout file and every tensor's
dimensions, type, offset and name, changed to zero, a negative, a huge value, a value of another
type, or removed. `specq generate` on the changed file exits 2 with one line naming the key or
tensor and the file, or, for the few changes that leave a valid file (`HARMLESS`), runs. The keys
and tensors are read from the file itself, so a key the loader starts to read cannot slip through
unchecked, and a change the loader starts to refuse shows up as a `HARMLESS` entry to drop."""

from __future__ import annotations

import functools
import math
import struct

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from specq import cli

from conftest import GGUF_TOKENS, add_bpe_tokenizer, tiny_model, write_tiny_gguf

# (key, change) pairs that leave a file specq runs: optional keys at their defaults or not used
HARMLESS = {
    ("general.alignment", "removed"),  # 32, as the file is laid out
    ("llama.context_length", "removed"),  # 2048
    ("llama.vocab_size", "removed"),  # the embedding's rows
    ("llama.rope.freq_base", "removed"),  # 10000, the file's value
    ("llama.attention.layer_norm_rms_epsilon", "removed"),  # 1e-5, the file's value
    ("tokenizer.ggml.pre", "empty"),  # the default pre-tokenizer
    ("tokenizer.ggml.pre", "removed"),
    ("tokenizer.ggml.token_type", "removed"),  # no special tokens
    ("tokenizer.ggml.merges", "short"),  # the file's one merge: any number is valid
    ("tokenizer.ggml.eos_token_id", "zero"),  # token 0 is as valid an EOS as any
    ("tokenizer.ggml.eos_token_id", "removed"),  # no EOS: runs to the budget
    ("tokenizer.ggml.add_bos_token", "removed"),
    ("general.name", "wrong type"),  # read by nothing
    ("general.name", "array"),
    ("general.name", "empty"),
    ("general.name", "removed"),
}


def changes(value, kind: V, item: V | None) -> dict[str, tuple | None]:
    """Each change of a value of this type: name -> (value, type, item type), None to remove it."""
    out: dict[str, tuple | None] = {"removed": None}
    if kind in (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64):
        out |= {"zero": (0, V.UINT32, None), "negative": (-1, V.INT32, None),
                "huge": (2 ** 40, V.UINT64, None), "wrong type": ("8", V.STRING, None),
                "float": (float(value), V.FLOAT32, None), "array": ([value], V.ARRAY, V.UINT32)}
    elif kind == V.FLOAT32:
        out |= {"zero": (0.0, V.FLOAT32, None), "negative": (-1.0, V.FLOAT32, None),
                "huge": (math.inf, V.FLOAT32, None), "nan": (math.nan, V.FLOAT32, None),
                "wrong type": ("1", V.STRING, None), "array": ([value], V.ARRAY, V.FLOAT32)}
    elif kind == V.BOOL:
        out |= {"wrong type": (1, V.UINT32, None), "string": ("true", V.STRING, None)}
    elif kind == V.STRING:
        out |= {"empty": ("", V.STRING, None), "wrong type": (7, V.UINT32, None),
                "array": ([value], V.ARRAY, V.STRING)}
    elif item == V.STRING:  # (gguf writes no empty array)
        out |= {"short": (value[:1], V.ARRAY, V.STRING), "wrong type": ("a", V.STRING, None),
                "numbers": ([1, 2], V.ARRAY, V.INT32)}
    elif kind == V.ARRAY:
        out |= {"short": (value[:1], V.ARRAY, item), "wrong type": (1, V.UINT32, None),
                "strings": (["a"], V.ARRAY, V.STRING)}
    else:
        raise AssertionError(f"no changes written for a value of type {kind.name}")
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama GGUF file with a tokenizer, Q8_0 matrices and F32 norms, general.alignment
    written out; its parsed fields and tensors."""
    def extra(w) -> None:
        add_bpe_tokenizer(w)
        w.add_name("tiny")
        w.add_add_bos_token(False)
        w.add_uint32("general.alignment", 32)

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, tiny_model(vocab=len(GGUF_TOKENS), hidden=64, scale=3.0), "Q8_0", extra)
    return path, gguf.GGUFReader(path)


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """`specq generate` on a file, in this process: (exit code, stderr)."""
    from specq.kernels import build

    build.available()  # the kernels from the usual cache, before the empty one below
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    # the parser built once: building it is most of a refused run's time
    monkeypatch.setattr(cli, "build_parser", functools.cache(cli.build_parser))

    def generate(path) -> tuple[int, str]:
        code = cli.main(["generate", "--target", str(path), "hi", "--max-new-tokens", "2",
                         "--no-speculative", "--no-warmup", "--threads", "1", "--json"])
        return code, capsys.readouterr().err
    return generate


def rewrite(reader, path, key: str, change: tuple | None) -> None:
    """The file of `reader` again at `path`, with `key` changed (None: removed)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.kv_data[0].clear()  # general.architecture is a key like the others here
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        if field.name == key:
            if change is not None:
                w.add_key_value(key, change[0], change[1], sub_type=change[2])
            continue
        kind = field.types[0]
        w.add_key_value(field.name, field.contents(), kind,
                        sub_type=field.types[-1] if kind == V.ARRAY else None)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def patched(src, path, at: int, fmt: str, value: int) -> None:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))


def refused(code: int, err: str, path, names) -> bool:
    """Exit 2 with one line naming the file and one of `names`, no traceback."""
    return (code == 2 and err.count("\n") == 1 and path.name in err and "Traceback" not in err
            and any(name in err for name in names))


def test_every_metadata_key_changed_is_refused_or_harmless(tiny, run, tmp_path):
    src, reader = tiny
    tensors = [t.name for t in reader.tensors]
    keys = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    assert len(keys) >= 18  # the architecture's, the tokenizer's, general.*
    wrong, seen = [], set()
    for i, field in enumerate(keys):
        kind, item = field.types[0], field.types[-1] if field.types[0] == V.ARRAY else None
        for j, (name, change) in enumerate(changes(field.contents(), kind, item).items()):
            path = tmp_path / f"k{i}-{j}.gguf"
            rewrite(reader, path, field.name, change)
            code, err = run(path)
            seen.add((field.name, name))
            if (field.name, name) in HARMLESS:
                if code != 0:
                    wrong.append(f"{field.name} {name}: exit {code}: {err.strip()}")
            elif not refused(code, err, path, [field.name, *tensors]):
                wrong.append(f"{field.name} {name}: exit {code}: {err.strip()[-300:]}")
    assert not wrong, "\n".join(wrong)
    assert HARMLESS <= seen  # every allowed change was tried: none left over


def tensor_infos(reader):
    """Each tensor's name and the byte offsets of its dims, type and data offset in the file."""
    for t in reader.tensors:
        field = t.field
        at = [field.offset]
        for part in field.parts:
            at.append(at[-1] + part.nbytes)
        # parts: name length, name, dimension count, dims, type, offset
        yield t, {"dims": at[3], "type": at[4], "offset": at[5]}


def test_every_tensor_changed_is_refused(tiny, run, tmp_path):
    src, reader = tiny
    wrong = []
    for i, (t, at) in enumerate(tensor_infos(reader)):
        ndims = len(t.shape)
        other = 1 if t.tensor_type == gguf.GGMLQuantizationType.F32 else 0  # F16 / F32
        same_size = 26 if t.tensor_type == gguf.GGMLQuantizationType.F32 else 12  # I32 / Q4_K
        cases = {"dim zero": (at["dims"], "<Q", 0),
                 "last dim 2**32": (at["dims"] + 8 * (ndims - 1), "<Q", 2 ** 32),
                 "dim 2**64 - 1": (at["dims"], "<Q", 2 ** 64 - 1),
                 "another type": (at["type"], "<I", other),
                 "unread type": (at["type"], "<I", same_size),
                 "unknown type": (at["type"], "<I", 99),
                 "offset + 32": (at["offset"], "<Q", t.data_offset - _data_start(reader) + 32),
                 "offset + 1": (at["offset"], "<Q", t.data_offset - _data_start(reader) + 1),
                 "offset huge": (at["offset"], "<Q", 2 ** 62),
                 "name": (at["dims"] - 4 - 1, "<B", ord("#"))}  # the name's last character
        renamed = t.name[:-1] + "#"
        for j, (name, (where, fmt, value)) in enumerate(cases.items()):
            path = tmp_path / f"t{i}-{j}.gguf"
            patched(src, path, where, fmt, value)
            code, err = run(path)
            if not refused(code, err, path, [t.name, renamed]):
                wrong.append(f"{t.name} {name}: exit {code}: {err.strip()[-300:]}")
    assert not wrong, "\n".join(wrong)


def _data_start(reader) -> int:
    return min(t.data_offset for t in reader.tensors)


@pytest.mark.parametrize("key, change, says", [
    ("llama.attention.head_count", (0, V.UINT32, None), "must be a positive integer"),
    ("llama.attention.head_count", (7, V.UINT32, None), "does not divide"),
    ("llama.attention.head_count", (6, V.UINT32, None), "(6) does not divide llama.embedding_len"),
    ("general.alignment", (0, V.UINT32, None), "positive power of two"),
    ("llama.context_length", (0, V.UINT32, None), "must be a positive integer"),
])
def test_the_reported_header_values_are_one_line(tiny, run, tmp_path, key, change, says):
    """The cases of the report that first found these: ZeroDivisionError, a 25-line state_dict
    mismatch, a run on a context of 0."""
    src, reader = tiny
    path = tmp_path / "bad.gguf"
    rewrite(reader, path, key, change)
    code, err = run(path)
    assert refused(code, err, path, [key]) and says in err, err


@pytest.mark.parametrize("tensor, change, says", [
    ("blk.0.attn_q.weight", ("dims", "<Q", 0), "each must be from 1"),
    ("blk.0.attn_q.weight", ("dims", "<Q", 2 ** 32), "each must be from 1"),
    # F32 data is larger than the Q8_0 bytes stored: it would overlap the next tensor's
    ("blk.0.attn_q.weight", ("type", "<I", 0), "starts at byte"),
])
def test_the_reported_tensors_are_one_line(tiny, run, tmp_path, tensor, change, says):
    src, reader = tiny
    t, at = next((t, at) for t, at in tensor_infos(reader) if t.name == tensor)
    path = tmp_path / "bad.gguf"
    patched(src, path, at[change[0]], change[1], change[2])
    code, err = run(path)
    assert refused(code, err, path, [tensor]) and says in err, err


def test_the_unchanged_file_runs(tiny, run):
    code, err = run(tiny[0])
    assert code == 0, err
