"""Tests of specq.weights.quant: formats, methods, packed execution and
checkpoints on tiny models."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from specq.model.llama import Llama, LlamaConfig
from specq.weights.quant import (
    DequantizedLinear,
    Int4Linear,
    Int8Linear,
    QuantSpec,
    calibration_samples,
    load_quantized,
    pack_bits,
    parse_spec,
    quantize_model,
    quantize_rtn,
    quantized_layers,
    read_spec,
    save_quantized,
    unpack_bits,
    weight_bytes,
)
from specq.weights.quant.awq import search_clip, search_scale
from specq.weights.quant.gptq import gptq_quantize
from specq.weights.quant.rtn import fit_grid, quantize_two_level
from specq.weights.quant.stats import InputStats, output_error

TINY = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny() -> Llama:
    """A tiny Llama whose norms give some channels large activations, as trained models have."""
    torch.manual_seed(0)
    model = Llama(TINY).eval()
    with torch.no_grad():
        for block in model.layers:
            block.attention_norm.weight.mul_(torch.randn(64).exp())
            block.ffn_norm.weight.mul_(torch.randn(64).exp())
    return model


@pytest.fixture(scope="module")
def samples() -> list[torch.Tensor]:
    corpus = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n))
              for n in (700, 900, 500)]
    return calibration_samples(corpus, n_samples=8, seq_len=128)


def logits(model, samples) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(s) for s in samples])


# --- packing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1001])
def test_pack_round_trip(bits, count):
    codes = torch.randint(0, 1 << bits, (count,))
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == (count * bits + 7) // 8
    assert torch.equal(unpack_bits(packed, bits, count).long(), codes)


def test_pack_format_is_little_endian_bit_stream():  # the on-disk format
    assert pack_bits(torch.tensor([1, 2, 3]), 2).tolist() == [1 | 2 << 2 | 3 << 4]
    assert pack_bits(torch.tensor([7, 1, 5]), 3).tolist() == [(7 | 1 << 3 | 5 << 6) & 0xFF, 5 >> 2]


def test_pack_signed_and_range():
    codes = torch.tensor([-3, -1, 0, 1, 3])
    assert torch.equal(unpack_bits(pack_bits(codes & 7, 3), 3, 5, signed=True).long(), codes)
    with pytest.raises(ValueError):
        pack_bits(torch.tensor([8]), 3)


# --- specs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["fp32", "bf16", "fp16", "int8", "int4-g128-gptq", "int3-g64-awq",
                                  "int2-g32-rtn", "int4", "int8-gptq", "int4-g64-awq-sym-head",
                                  "int8-asym", "int4-g32-rtn-head"])
def test_spec_canonical_round_trip(text):
    spec = parse_spec(text)
    assert str(spec) == text and parse_spec(str(spec)) == spec


def test_spec_fields_and_defaults():
    assert (parse_spec("int8") == QuantSpec(bits=8, group_size=None, method="rtn", symmetric=True)
            == QuantSpec(bits=8))
    assert QuantSpec(bits=4).symmetric is False
    assert str(QuantSpec(bits=4, group_size=64, method="gptq")) == "int4-g64-gptq"
    assert parse_spec("INT4-head-awq-g128") == QuantSpec(bits=4, group_size=128, method="awq",
                                                         symmetric=False, quantize_head=True)
    assert str(parse_spec("int4-g128")) == "int4-g128-rtn"
    assert parse_spec("bf16").dtype == torch.bfloat16 and parse_spec("bf16").is_float


@pytest.mark.parametrize("text", ["int9", "int1", "int4-g0", "int4-gptq-awq", "int4-g32-g64", "fp8",
                                  "int4-foo", "int4-sym-asym", ""])
def test_bad_spec_lists_valid_forms(text):
    with pytest.raises(ValueError) as err:
        parse_spec(text)
    message = str(err.value)
    assert "\n" not in message and "int4-g128-gptq" in message and "fp32 | bf16 | fp16" in message


# --- RTN -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_error_within_half_step(bits, symmetric):
    torch.manual_seed(bits)
    w = torch.randn(32, 128) * torch.rand(32, 1)
    w[0, :32] = 0  # an all-zero group
    qw = quantize_rtn(w, bits, 32, symmetric)
    scale = qw.scales.float().repeat_interleave(32, dim=1)
    err = (qw.dequantize() - w).abs()
    assert (err <= scale / 2 * (1 + 1e-3) + 1e-7).all()
    assert (qw.dequantize()[w == 0] == 0).all()
    lo, hi = (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    assert qw.codes.min() >= lo and qw.codes.max() <= hi
    assert (qw.zeros is None) == symmetric


def test_two_level_rtn_error_is_half_a_step_plus_its_roundings():
    """Each group's error is within half its step, plus what rounding d and m to int8 multiples of
    the row's floats moves them by; all-zero groups and rows stay exactly
    zero (no division by 0)."""
    torch.manual_seed(0)
    w = torch.randn(16, 224) * torch.rand(16, 1) + torch.randn(16, 1) * 0.1
    w[0, :32], w[1] = 0, 0
    q = quantize_two_level(w, 4, 32)
    assert q.codes.dtype == torch.uint8 and q.codes.max() <= 15 and q.sub_d.min() >= 0
    d, m = q.d * q.sub_d.float(), q.m * q.sub_m.float()
    back = (q.codes.float().view(16, 7, 32) * d[..., None] + m[..., None]).view(16, 224)
    bound = d / 2 + q.m / 2 + 15 * q.d / 2 + 1e-6
    assert ((back - w).abs().view(16, 7, 32) <= bound[..., None]).all()
    assert (back[0, :32] == 0).all() and (back[1] == 0).all() and not back.isnan().any()


def test_rtn_scales_are_bf16_exact():
    scale, _ = fit_grid(torch.randn(8, 64), 4, False)
    assert torch.equal(scale, scale.to(torch.bfloat16).float())


# --- GPTQ and AWQ beat RTN -------------------------------------------------------------------

def _layer_problem(seed: int = 0):
    """A weight and calibration inputs with correlated, unevenly scaled channels."""
    g = torch.Generator().manual_seed(seed)
    n_in = 128
    mix = torch.randn(n_in, n_in, generator=g) / n_in ** 0.5 + torch.eye(n_in)
    x = (torch.randn(1024, n_in, generator=g) @ mix) * torch.randn(n_in, generator=g).exp()
    return torch.randn(64, n_in, generator=g) * 0.05, x


def _output_error(w, x, w_q, x_q=None) -> float:
    return ((x @ w.T - (x if x_q is None else x_q) @ w_q.T).norm() / (x @ w.T).norm()).item()


@pytest.mark.parametrize("bits,group", [(4, 32), (3, 32), (3, 64)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_and_awq_beat_rtn_on_layer_output(bits, group, symmetric):
    w, x = _layer_problem()
    rtn = _output_error(w, x, quantize_rtn(w, bits, group, symmetric).dequantize())
    stats = InputStats(w.shape[1])
    stats.add(x[:500])
    stats.add(x[500:])
    for act_order in (False, True):
        gptq = gptq_quantize(w, stats.hessian, bits, group, symmetric, act_order=act_order)
        assert _output_error(w, x, gptq.dequantize()) < rtn
    s = search_scale(w, stats.hessian, stats.abs_mean, bits, group, symmetric)
    awq = _output_error(w, x, quantize_rtn(w * s, bits, group, symmetric).dequantize(), x / s)
    clipped = search_clip(w * s, stats.hessian / torch.outer(s, s), bits, group, symmetric)
    awq_clip = _output_error(w, x, quantize_rtn(clipped, bits, group, symmetric).dequantize(),
                             x / s)
    assert awq < rtn and awq_clip < rtn


def test_input_stats_give_exact_output_error():
    x, delta = torch.randn(100, 16), torch.randn(8, 16)
    stats = InputStats(16)
    stats.add(x[:30])
    stats.add(x[30:].unsqueeze(0))
    torch.testing.assert_close(stats.hessian, 2 * x.T @ x / 100, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.abs_mean, x.abs().mean(0))
    torch.testing.assert_close(output_error(delta, stats.hessian) * 100 / 2,
                               (x @ delta.T).pow(2).sum(), rtol=1e-4, atol=0)


@pytest.mark.parametrize("spec", ["int4-g32", "int3-g32"])
def test_calibrated_models_beat_rtn(tiny, samples, spec):
    """End to end on the calibration data: KL to the float model's next-token distribution."""
    reference = logits(tiny, samples).log_softmax(-1)

    def kl(method: str) -> float:
        model = quantize_model(copy.deepcopy(tiny), f"{spec}-{method}", samples, packed=False,
                               progress=False)
        out = logits(model, samples).log_softmax(-1)
        return F.kl_div(out, reference, log_target=True, reduction="batchmean").item()

    rtn = kl("rtn")
    assert kl("gptq") < rtn
    assert kl("awq") < rtn


@pytest.mark.parametrize("spec", ["int4-g32-rtn", "int4-g32-gptq"])
def test_quantizing_frees_each_float_layer_as_it_is_replaced(tiny, samples, spec, monkeypatch):
    """Peak memory: when a layer's packed module is made, the float linears and the codes of the
    layers packed before it are gone (a 1.5B held its float copy, every layer's codes and the
    packed modules at once)."""
    import weakref

    from specq.weights.quant import apply

    model = copy.deepcopy(tiny)
    floats = [weakref.ref(m) for m in apply.quant_targets(model, parse_spec(spec)).values()]
    made, alive = [], []
    original = apply.make_quant_linear

    def recording(qw, *args):
        alive.append((sum(r() is not None for r in floats), sum(r() is not None for r in made)))
        made.append(weakref.ref(qw))
        return original(qw, *args)

    monkeypatch.setattr(apply, "make_quant_linear", recording)
    quantize_model(model, spec, samples, progress=False)
    n = len(floats)
    assert n > 2 and alive[:n] == [(n - k, 0) for k in range(n)]


def test_awq_folds_keep_float_function(tiny, samples):
    """At 8 bits the AWQ model (scales folded into norms, v rows and up rows) is as close to the
    float model as RTN's: a wrong fold (e.g. GQA heads mixed up) would be far off."""
    ref = logits(tiny, samples[:2])

    def error(spec: str) -> float:
        model = quantize_model(copy.deepcopy(tiny), spec, samples, packed=False, progress=False)
        return ((logits(model, samples[:2]) - ref).norm() / ref.norm()).item()

    assert error("int8-g32-awq-head") < 1.2 * error("int8-g32-rtn-head") < 0.05


# --- execution modules -----------------------------------------------------------------------

@pytest.mark.parametrize("spec,kind", [("int8", Int8Linear), ("int4-g32", Int4Linear),
                                       ("int4-g64-sym", Int4Linear), ("int4", Int4Linear),
                                       ("int3-g32", Int4Linear), ("int2-g64-sym", Int4Linear),
                                       ("int6-g32", DequantizedLinear),
                                       ("int8-g32", DequantizedLinear)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matches_simulated(tiny, spec, kind, dtype):
    base = copy.deepcopy(tiny).to(dtype)
    simulated = quantize_model(copy.deepcopy(base), spec, packed=False, progress=False)
    packed = quantize_model(copy.deepcopy(base), spec, packed=True, progress=False)
    layers = quantized_layers(packed)
    assert layers and all(isinstance(m, kind) for m in layers.values())
    assert all(isinstance(m, DequantizedLinear) and "simulated" in m.kernel
               for m in quantized_layers(simulated).values())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (48,), generator=g)
    with torch.no_grad():
        ys, yp = simulated(ids), packed(ids)
    assert yp.dtype == ys.dtype == torch.float32
    # Model level: bf16 activations (fp32 model) or bf16-rounded dequantized weights (bf16 model)
    # in the reference, compounded over the tiny model's deliberately uneven norms.
    assert ((ys - yp).norm() / ys.norm()).item() < (2e-2 if dtype == torch.float32 else 3e-2)
    # Layer level: every packed layer equals its dequantized weight applied to bf16 inputs, up to
    # the bf16 rounding of the output.
    for layer in layers.values():
        x = torch.randn(5, layer.in_features, generator=g)
        expected = x.to(torch.bfloat16).float() @ layer.quantized().dequantize().T
        assert (layer(x) - expected).abs().max() <= 1e-2 * expected.abs().max()


def test_kernel_descriptions_and_fallback():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 40, bias=True)  # out % 16 != 0: no int4 kernel
    model = torch.nn.Sequential(linear)
    quantize_model(model, "int4-g32", packed=True, progress=False)
    assert isinstance(model[0], DequantizedLinear) and "out_features % 16" in model[0].kernel
    x = torch.randn(3, 64)
    torch.testing.assert_close(model[0](x),
                               F.linear(x, model[0].quantized().dequantize(), linear.bias),
                               rtol=2e-2, atol=2e-2)


def test_weight_bytes(tiny):
    fp = weight_bytes(tiny)
    n_params = sum(p.numel() for p in tiny.parameters())  # the tied head counts once
    assert fp.stored == fp.executed == 4 * n_params
    int4 = weight_bytes(quantize_model(copy.deepcopy(tiny), "int4-g32", packed=True,
                                       progress=False))
    linears = 2 * (64 * 128 + 64 * 64 + 64 * 256 + 128 * 64)
    groups = linears // 32
    # codes + bf16 scale + uint8 zero
    assert int4.stored == fp.stored - 4 * linears + linears // 2 + 3 * groups
    assert int4.executed < fp.executed
    int3 = weight_bytes(quantize_model(copy.deepcopy(tiny), "int3-g32", packed=True,
                                       progress=False))
    assert int3.stored == fp.stored - 4 * linears + linears * 3 // 8 + 3 * groups
    assert int3.executed == int4.executed  # 3-bit codes run on the int4 kernel
    int6 = weight_bytes(quantize_model(copy.deepcopy(tiny), "int6-g32", packed=True,
                                       progress=False))
    assert int6.stored == fp.stored - 4 * linears + linears * 6 // 8 + 3 * groups
    assert int6.executed == fp.executed - 4 * linears + 2 * linears  # dequantized to bf16


def test_bad_group_size_names_layer(tiny):  # gcd(48, 64) = 16: too small to fall back to
    with pytest.raises(ValueError,
                       match=r"group size 48 does not divide in_features=64 of layer 'layers\.0\."):
        quantize_model(copy.deepcopy(tiny), "int4-g48", progress=False)


def test_group_fallback_to_gcd(tiny):
    """g128 on 64-wide layers (like SmolLM2's 576-wide ones) falls back to gcd
    = 64, with a warning."""
    with pytest.warns(UserWarning, match="using group 64"):
        model = quantize_model(copy.deepcopy(tiny), "int4-g128", progress=False)
    sizes = {name: (m.in_features, m.group_size) for name, m in quantized_layers(model).items()}
    assert (sizes["layers.0.attention.wqkv"] == (64, 64)
            and sizes["layers.0.feed_forward.w2"] == (128, 128))
    assert all(isinstance(m, Int4Linear) for m in quantized_layers(model).values())


def test_calibrated_methods_need_samples(tiny):
    with pytest.raises(ValueError, match="calibration"):
        quantize_model(copy.deepcopy(tiny), "int4-g32-gptq", progress=False)


# --- checkpoints -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["int8", "int4-g32-gptq-head", "int3-g64-awq", "bf16"])
def test_save_load_identical_logits(tiny, samples, spec, tmp_path):
    model = quantize_model(copy.deepcopy(tiny), spec, samples, packed=True, progress=False)
    before = logits(model, samples[:2])
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale.txt").write_text("replaced atomically")
    save_quantized(model, spec, target)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and not (target / "stale.txt").exists()
    assert read_spec(target) == parse_spec(spec)
    skeleton = Llama(TINY).eval()  # different random weights
    loaded = load_quantized(skeleton, target)
    assert torch.equal(logits(loaded, samples[:2]), before)
    assert weight_bytes(loaded) == weight_bytes(model)


@pytest.mark.parametrize("spec", ["int8", "int4-g32-rtn-head"])
def test_a_skeleton_on_the_meta_device_loads_the_same_model(tiny, samples, spec, tmp_path):
    """A meta skeleton (no float weights allocated) loads to the same logits as a real one, the
    embedding and a float head tied again as saved (stored once), and loading stays strict."""
    from safetensors.torch import load_file, save_file

    model = quantize_model(copy.deepcopy(tiny), spec, progress=False)
    save_quantized(model, spec, tmp_path / "ckpt")
    with torch.device("meta"):
        skeleton = Llama(TINY)
    loaded = load_quantized(skeleton.eval(), tmp_path / "ckpt")
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    assert torch.equal(logits(loaded, samples[:2]), logits(model, samples[:2]))
    if not parse_spec(spec).quantize_head:
        assert loaded.output.weight is loaded.tok_embeddings.weight
    weights = tmp_path / "ckpt" / "model.safetensors"
    state = load_file(weights)
    del state["norm.weight"]
    save_file(state, weights)
    with torch.device("meta"):
        skeleton = Llama(TINY)
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\]"):
        load_quantized(skeleton, tmp_path / "ckpt")


def test_load_restores_saved_dtype(tiny, samples, tmp_path):
    model = quantize_model(copy.deepcopy(tiny).to(torch.bfloat16), "int4-g32-awq", samples,
                           progress=False)
    save_quantized(model, "int4-g32-awq", tmp_path / "ckpt")
    loaded = load_quantized(Llama(TINY).eval(), tmp_path / "ckpt")  # an fp32 skeleton
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(logits(loaded, samples[:1]), logits(model, samples[:1]))


def test_load_packed_checkpoint_as_simulated(tiny, samples, tmp_path):
    simulated = quantize_model(copy.deepcopy(tiny), "int4-g32-rtn", packed=False, progress=False)
    packed = quantize_model(copy.deepcopy(tiny), "int4-g32-rtn", packed=True, progress=False)
    save_quantized(packed, "int4-g32-rtn", tmp_path / "ckpt")
    loaded = load_quantized(Llama(TINY).eval(), tmp_path / "ckpt", packed=False)
    assert torch.equal(logits(loaded, samples[:1]), logits(simulated, samples[:1]))


def test_save_rejects_wrong_spec(tiny, tmp_path):
    with pytest.raises(ValueError):
        save_quantized(tiny, "int4-g32", tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


# --- calibration data ------------------------------------------------------------------------

def test_calibration_samples():
    corpus = [torch.arange(1000), torch.arange(1000, 1500)]
    picked = calibration_samples(corpus, n_samples=4, seq_len=100, seed=1)
    assert len(picked) == 4 and all(s.shape == (100,) for s in picked)
    again = calibration_samples(corpus, n_samples=4, seq_len=100, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(picked, again))
    starts = sorted(int(s[0]) for s in picked)
    assert all(st % 100 == 0 for st in starts) and len(set(starts)) == 4
    with pytest.warns(UserWarning, match="fewer"):
        assert len(calibration_samples(corpus, n_samples=50, seq_len=100)) == 15
    with pytest.raises(ValueError):
        calibration_samples(corpus, seq_len=5000)
