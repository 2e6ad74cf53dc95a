"""A LoRA adapter folder (peft's format) as a model (`loading/adapter.py`): its base with the
products merged, into float weights or into a GGUF file's requantized 4-bit body, read the way
peft writes it, every broken adapter one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import specq
from specq.errors import SpecqError
from specq.kernels import int8dot
from specq.loading.drafts import adapter
from specq.loading import file_spec, refs
from specq.loading.formats import gguf_load
from specq.loading.formats.save import save_native
from specq.weights.quant.modules import FileBlocks

from conftest import (GGUF_TOKENS, add_bpe_tokenizer, assert_speculative_is_plain, tiny_model,
                      write_tiny_gguf)

VOCAB, HIDDEN, RANK, ALPHA = len(GGUF_TOKENS), 64, 4, 8  # the GGUF file's tokenizer: 64 tokens
PREFIX = "base_model.model.model.layers"


def factors(seed: int = 0, size: float = 0.2,
            modules=("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"),
            layers: int = 2) -> dict[str, torch.Tensor]:
    """Random LoRA factors as peft saves them, on `modules` of each layer (k_proj left out: a fused
    weight's part without a product)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN // 2, HIDDEN),
              "self_attn.v_proj": (HIDDEN // 2, HIDDEN), "mlp.down_proj": (HIDDEN, 2 * HIDDEN),
              "mlp.gate_proj": (2 * HIDDEN, HIDDEN)}
    out = {}
    for i in range(layers):
        for m in modules:
            rows, cols = shapes[m]
            out[f"{PREFIX}.{i}.{m}.lora_A.weight"] = torch.randn(RANK, cols, generator=g) * size
            out[f"{PREFIX}.{i}.{m}.lora_B.weight"] = torch.randn(rows, RANK, generator=g) * size
    return out


def write_adapter(path, base: str, tensors=None, **config) -> str:
    path.mkdir(parents=True, exist_ok=True)
    settings = {"peft_type": "LORA", "base_model_name_or_path": base, "r": RANK,
                "lora_alpha": ALPHA, "target_modules": ["q_proj", "v_proj", "down_proj"]} | config
    (path / adapter.CONFIG).write_text(json.dumps(settings))
    save_file(factors() if tensors is None else tensors, str(path / adapter.WEIGHTS))
    return str(path)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A tiny Llama as a float folder and as a Q8_0 GGUF file, caches in
    tmp_path (not the kernels')."""
    model = tiny_model(vocab=VOCAB, hidden=HIDDEN, scale=3.0)
    save_native(model, tmp_path / "base")
    write_tiny_gguf(tmp_path / "base.gguf", model, "Q8_0", add_bpe_tokenizer)
    for module in (file_spec, gguf_load):
        monkeypatch.setattr(module, "cache_dir", lambda: tmp_path / "cache")
    return model, tmp_path


def native_deltas(path: str, net) -> dict[str, torch.Tensor]:
    """Every product the adapter at `path` adds to `net`, by native module name."""
    merged = adapter.read(path)
    return {name: adapter.delta(merged, hf, net.config)
            for name, hf in adapter.native_weights(merged, net).items()}


def one_delta(merged, hf_name: str, config) -> torch.Tensor:
    return adapter.delta(merged, (hf_name,), config)


def test_products_are_b_times_a_scaled_and_stacked_into_fused_weights(files):
    model, tmp = files
    path = write_adapter(tmp / "lora", str(tmp / "base"))
    merged, config = adapter.read(path), model.net.config
    t = factors()
    q = f"{PREFIX}.1.self_attn.q_proj"
    expected_q = t[f"{q}.lora_B.weight"] @ t[f"{q}.lora_A.weight"] * (ALPHA / RANK)
    assert torch.allclose(one_delta(merged, "model.layers.1.self_attn.q_proj.weight", config),
                          expected_q)
    native = native_deltas(path, model.net)
    assert set(native) == {f"layers.{i}.{m}" for i in range(2)
                           for m in ("attention.wqkv", "feed_forward.w2")}
    wqkv = native["layers.1.attention.wqkv"]  # [q; k; v]: k has no product, so its rows are zero
    assert torch.equal(wqkv[:HIDDEN],
                       one_delta(merged, "model.layers.1.self_attn.q_proj.weight", config))
    assert not wqkv[HIDDEN:HIDDEN + HIDDEN // 2].any()
    assert torch.equal(wqkv[HIDDEN + HIDDEN // 2:],
                       one_delta(merged, "model.layers.1.self_attn.v_proj.weight", config))


def test_rank_stabilized_scale(files):
    _, tmp = files
    merged = adapter.read(write_adapter(tmp / "lora", str(tmp / "base"), use_rslora=True))
    t = factors()
    q = f"{PREFIX}.0.self_attn.q_proj"
    assert torch.allclose(one_delta(merged, "model.layers.0.self_attn.q_proj.weight",
                                    files[0].net.config),
                          t[f"{q}.lora_B.weight"] @ t[f"{q}.lora_A.weight"] * (ALPHA / RANK ** 0.5))


def test_float_merge_adds_the_products_exactly(files):
    model, tmp = files
    path = write_adapter(tmp / "lora", str(tmp / "base"))
    loaded = specq.load(path)
    assert loaded.precision == "fp32" and loaded.source == path
    native = native_deltas(path, model.net)
    for name, module in loaded.net.named_modules():
        if hasattr(module, "weight") and name in native:
            assert torch.equal(module.weight, model.net.get_submodule(name).weight + native[name])
    untouched = "layers.0.feed_forward.w13"
    assert torch.equal(loaded.net.get_submodule(untouched).weight,
                       model.net.get_submodule(untouched).weight)


def test_what_peft_writes_merges_as_peft_merges_it(files):
    """An adapter trained and saved by `training/lora.py` (peft) loads to the weights peft's own
    `merge_and_unload` makes."""
    from specq.training import lora

    model, tmp = files
    base = specq.load(str(tmp / "base"), backend=None)
    student = lora.student(base, rank=RANK)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.2)
    lora.save(student, tmp / "lora", str(tmp / "base"), dtype=torch.float32)
    merged_by_peft = {k: v for k, v in student.merge_and_unload().state_dict().items()}
    loaded = specq.load(str(tmp / "lora"), backend=None)
    from specq.model.llama import native_to_hf_state_dict

    mine = native_to_hf_state_dict(loaded.net)
    for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                "model.layers.1.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        assert torch.allclose(mine[key], merged_by_peft[key], atol=1e-6)
        assert not torch.allclose(mine[key], native_to_hf_state_dict(base.net)[key], atol=1e-3)


def test_gguf_base_merges_into_its_requantized_4bit_body_once(files, monkeypatch):
    """On a GGUF file (default gguf-int4) every weight the adapter changes is requantized from the
    file's exact weight plus its product (within half a 4-bit step); the next load reads the cache
    (no requantizing) to the same network, which keeps no mapping of that file; another adapter is
    another cache entry."""
    model, tmp = files
    path = write_adapter(tmp / "lora", str(tmp / "base.gguf"))
    assert refs.split_ref(path) == (path, "gguf-int4")
    first = specq.load(path)
    assert first.precision == "gguf-int4"
    from specq.loading.formats import gguf_io

    reference = gguf_io.read(tmp / "base.gguf").float_state_dict()
    native = native_deltas(path, model.net)
    for name in ("layers.0.attention.wqkv", "layers.1.feed_forward.w2",
                 "layers.0.feed_forward.w13"):
        module = first.net.get_submodule(name)
        assert isinstance(module, FileBlocks) and module.bits == 4
        codes, d, m = int8dot.unpack(module._blocks)
        weight = (codes.float().view(module.out_features, -1, 32) * d[..., None]
                  + m[..., None]).flatten(1)
        expected = reference[f"{name}.weight"] + native.get(name, 0)
        assert ((weight - expected).abs() <= 0.51 * d.repeat_interleave(32, 1) + 1e-6).all()
    def requantized(*args):
        raise RuntimeError("requantized")

    monkeypatch.setattr(file_spec, "to_int4", requantized)
    again = specq.load(path)
    [cached] = (tmp / "cache" / "gguf-int4").glob("*.safetensors")
    assert str(cached) not in Path("/proc/self/maps").read_text()
    ids = torch.tensor([1, 5, 9, 2, 33, 3])
    with torch.inference_mode():
        assert torch.equal(first.net(ids), again.net(ids))
    other = write_adapter(tmp / "lora2", str(tmp / "base.gguf"), tensors=factors(seed=1))
    with pytest.raises(RuntimeError, match="requantized"):  # not the first adapter's cache
        specq.load(other)


def test_4bit_merge_follows_the_float_merge(files):
    """The merged file's logits differ from the float merge's by about what 4 bits cost the base
    alone, far less than the adapter moves them: the products land on the rows they belong to (a
    GGUF file's q/k row order included)."""
    model, tmp = files
    merged_float = specq.load(write_adapter(tmp / "lora-f", str(tmp / "base"),
                                            tensors=factors(size=1.0)))
    merged_file = specq.load(write_adapter(tmp / "lora-g", str(tmp / "base.gguf"),
                                           tensors=factors(size=1.0)))
    base_file = specq.load(f"{tmp / 'base.gguf'}@gguf-int4")
    ids = torch.tensor([3, 7, 11, 2, 40, 5, 6])
    with torch.inference_mode():
        a, b, base, base_4bit = (merged_float.net(ids), merged_file.net(ids), model.net(ids),
                                 base_file.net(ids))
    four_bits, moved = (base_4bit - base).abs().mean(), (a - base).abs().mean()
    assert (a - b).abs().mean() < 1.5 * four_bits < 0.5 * moved


def test_a_merged_draft_is_lossless(files):
    model, tmp = files
    draft = specq.load(write_adapter(tmp / "lora", str(tmp / "base.gguf"),
                                     tensors=factors(size=0.3)))
    target = specq.load(str(tmp / "base.gguf"))
    assert_speculative_is_plain(target, draft)


@pytest.mark.parametrize("config, tensors, message", [
    ({"peft_type": "IA3"}, None, "LORA adapters only"),
    ({"use_dora": True}, None, "DoRA"),
    ({"lora_bias": True}, None, "LoRA biases"),
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 2}}, None, "per-module ranks"),
    ({"base_model_name_or_path": None}, None, "names no base"),
    ({"lora_alpha": 0}, None, "lora_alpha must be a positive number"),
    ({}, {"model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4)}, "is not a LoRA factor"),
    ({}, {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.zeros(RANK, HIDDEN)}, "needs lora_A"),
    ({}, {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.zeros(RANK, HIDDEN),
          f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.zeros(HIDDEN, RANK + 1)}, "one rank"),
    ({}, {}, "holds no LoRA factors"),
])
def test_broken_adapters_are_one_line_before_the_base_loads(files, config, tensors, message):
    _, tmp = files
    path = write_adapter(tmp / "bad", str(tmp / "base"), tensors=tensors, **config)
    with pytest.raises(SpecqError, match=message) as e:
        refs.check_ref(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec, message", [("gguf", "whose own blocks cannot hold them"),
                                           ("int8", "load it at a float precision")])
def test_precisions_that_cannot_hold_a_merge_are_refused(files, spec, message):
    _, tmp = files
    path = write_adapter(tmp / "lora", str(tmp / "base.gguf"))
    with pytest.raises(SpecqError, match=message):
        refs.check_ref(f"{path}@{spec}")  # before any weight loads
    with pytest.raises(SpecqError, match=message):
        specq.load(f"{path}@{spec}")


def test_a_product_the_base_has_no_weight_for_is_refused(files):
    _, tmp = files
    # the base has 2 layers
    path = write_adapter(tmp / "lora", str(tmp / "base"), tensors=factors(layers=3))
    with pytest.raises(SpecqError, match="model.layers.2.* is not a weight of its base"):
        specq.load(path)


def test_unreadable_weights_are_one_line(files):
    _, tmp = files
    path = write_adapter(tmp / "lora", str(tmp / "base"))
    (tmp / "lora" / adapter.WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(SpecqError, match="cannot read adapter_model.safetensors"):
        refs.check_ref(path)


def test_a_product_of_another_shape_is_refused(files):
    """An adapter weight of the base's name but another shape (here: q_proj's B with rows of the
    wrong count) is one line, on a float base and on a file."""
    _, tmp = files
    wrong = factors()
    wrong[f"{PREFIX}.0.self_attn.q_proj.lora_B.weight"] = torch.zeros(HIDDEN + 1, RANK)
    for base in ("base", "base.gguf"):
        path = write_adapter(tmp / f"lora-{base}", str(tmp / base), tensors=wrong)
        with pytest.raises(SpecqError, match="layers.0.attention.wqkv is .*its base's weight") as e:
            specq.load(path)
        assert "\n" not in str(e.value)
