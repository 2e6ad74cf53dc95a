"""specq's GGUF header reader returns what the `gguf` library's reader returns (every scalar and
number array, every tensor's name, type, shape and bytes), skips string arrays, and refuses a
truncated or foreign file in one line."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, quants

from specq.errors import SpecqError
from specq.loading.formats.gguf_io import _field
from specq.loading.formats.gguf_reader import SKIPPED, Header


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "mixed.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(3)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_bool("test.flag", True)
    w.add_array("test.numbers", [3, 1, 4, 1, 5])
    w.add_array("test.floats", [0.5, 0.25])
    w.add_token_list([f"token{i}" for i in range(300)] + ["é", ""])  # a string array: skipped
    w.add_string("tokenizer.chat_template", "{{ messages }}")
    rng = np.random.default_rng(0)
    w.add_tensor("f32.weight", rng.standard_normal((4, 64)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((3, 32)).astype(np.float16))
    for name, t in (("q4_0.weight", GGMLQuantizationType.Q4_0),
                    ("q8_0.weight", GGMLQuantizationType.Q8_0)):
        w.add_tensor(name, quants.quantize(rng.standard_normal((5, 64)).astype(np.float32), t),
                     raw_dtype=t)
    w.add_tensor("norm.weight", rng.standard_normal(96).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fields_and_tensors_match_the_gguf_library(gguf_file):
    ours, theirs = Header(gguf_file), GGUFReader(gguf_file)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape)
        assert (a.data.dtype == np.asarray(b.data).dtype
                and np.array_equal(a.data, np.asarray(b.data))), a.name
    for key in ("general.architecture", "qwen2.block_count", "qwen2.rope.freq_base", "test.flag",
                "tokenizer.chat_template"):
        assert ours.fields[key] == pytest.approx(_field(theirs, key)), key
    assert (ours.fields["test.numbers"] == [3, 1, 4, 1, 5]
            and ours.fields["test.floats"] == [0.5, 0.25])
    assert ours.fields["tokenizer.ggml.tokens"] is SKIPPED


def test_a_truncated_file_is_one_line(gguf_file, tmp_path):
    data = gguf_file.read_bytes()
    for cut in (3, 20, 200, len(data) - 10):
        broken = tmp_path / f"cut{cut}.gguf"
        broken.write_bytes(data[:cut])
        with pytest.raises(SpecqError, match="truncated|not a GGUF"):
            Header(broken)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(SpecqError, match="no GGUF magic"):
        Header(foreign)


def test_a_key_or_tensor_twice_five_dimensions_or_nested_arrays_are_one_line(tmp_path):
    """llama.cpp refuses these layouts; so does the reader, naming the key or tensor."""
    path = tmp_path / "ok.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.a", 1)
    w.add_uint32("test.b", 2)
    w.add_array("test.c", [1, 2])
    w.add_tensor("x.weight", np.zeros((2, 32), np.float32))
    w.add_tensor("y.weight", np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    Header(path)
    five = bytearray(data)
    five[data.index(b"x.weight") + 8] = 5  # its dimension count
    nested = bytearray(data)
    nested[data.index(b"test.c") + 6 + 4] = 9  # its items' type: arrays
    for name, broken, says in (("key", data.replace(b"test.b", b"test.a"), "key test.a twice"),
                               ("tensor", data.replace(b"y.weight", b"x.weight"),
                                "tensor x.weight is in the tensor table twice"),
                               ("dims", bytes(five), "tensor x.weight has 5 dimensions"),
                               ("nested", bytes(nested), "test.c is an array of values of type 9")):
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(broken)
        with pytest.raises(SpecqError, match=says) as e:
            Header(bad)
        assert "\n" not in str(e.value) and bad.name in str(e.value)
