import torch
from transformers import LlamaForCausalLM

from specq.model.hf_backend import HFCausalLM
from specq.model.llama import Llama, LlamaConfig, hf_to_native_state_dict, native_to_hf_state_dict

from conftest import tiny_config


def _hf_pair(seed=0):
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(tiny_config(vocab=40).to_hf()).eval()
    cfg = LlamaConfig.from_hf(hf.config)
    net = Llama(cfg)
    net.load_state_dict(hf_to_native_state_dict(hf.state_dict(), cfg))
    return hf, net.eval()


def test_native_matches_transformers():
    hf, net = _hf_pair()
    ids = torch.randint(0, 40, (23,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        full = net(ids)
        cache = net.new_cache(64)
        pieces = torch.cat([net(ids[:10], cache), net(ids[10:11], cache), net(ids[11:], cache)])
    torch.testing.assert_close(full, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pieces, ref, atol=1e-4, rtol=1e-4)


def test_state_dict_round_trip():
    hf, net = _hf_pair()
    back = native_to_hf_state_dict(net)
    for k, v in hf.state_dict().items():
        if k == "lm_head.weight" and k not in back:
            continue
        torch.testing.assert_close(back[k], v)


def _rollback_matches_fresh(net, cache_factory):
    """Feed a sequence plus rejected junk, crop back, continue: logits equal a fresh pass."""
    torch.manual_seed(3)
    seq = torch.randint(0, 40, (12,))
    junk = torch.randint(0, 40, (5,))
    nxt = torch.randint(0, 40, (3,))
    with torch.no_grad():
        cache = cache_factory()
        net(seq, cache)
        net(junk, cache)
        cache.crop(len(seq) + 2)  # keep two of the five "draft" tokens
        rolled = net(nxt, cache)
        fresh = net(torch.cat([seq, junk[:2], nxt]), None)[-3:]
    torch.testing.assert_close(rolled, fresh, atol=1e-4, rtol=1e-4)


def test_rollback_native_cache():
    _, net = _hf_pair()
    _rollback_matches_fresh(net, lambda: net.new_cache(64))


def test_rollback_hf_cache():
    hf, _ = _hf_pair()
    wrapped = HFCausalLM(hf)
    _rollback_matches_fresh(wrapped, lambda: wrapped.new_cache(64))


def test_verify_pass_is_bit_identical_to_steps_on_packed_int4():
    """Row-by-row attention makes a quantized model's verify pass compute every hidden state
    exactly as one-token steps do (packed int4 kernels are row-invariant; fused attention is
    not), so greedy speculative output cannot drift from plain decoding."""
    from specq.weights.quant import quantize_model

    from conftest import tiny_model

    net = tiny_model(vocab=64, hidden=256, layers=2, scale=3.0).net  # head_dim 64, as in SmolLM2
    quantize_model(net, "int4-g32-rtn", progress=False)
    hidden = []
    net.norm.register_forward_hook(lambda m, i, o: hidden.append(o[0].clone()))
    ids = torch.randint(0, 64, (130,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = net.new_cache(160)
        net(ids[:120], cache)
        hidden.clear()
        for i in range(120, 126):
            net(ids[i:i + 1], cache)
        steps = torch.cat(hidden)
        hidden.clear()
        cache.crop(120)
        net(ids[120:126], cache)
    assert torch.equal(hidden[0], steps)


def test_atomic_writes_publish_normal_permissions(tmp_path):
    import os
    import stat

    from specq import atomic

    atomic.write_text(tmp_path / "a.txt", "x")
    atomic.write_dir(tmp_path / "d", lambda d: (d / "f").write_text("y"))
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o644 & ~mask
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o755 & ~mask
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "f").st_mode) == 0o644 & ~mask


def test_layer_states_are_the_pass_the_execution_runs():
    """`layer_states`: the residual stream before each layer the execution runs and after the last,
    whose final norm and head give a whole-sequence pass's logits bit for bit; from the states
    entering a layer the rest of the pass continues as it would (also on a Gemma-style model:
    scaled embeddings, sliding layers with a rope of their own)."""
    from specq import backends
    from conftest import tiny_model

    for switches in ({}, dict(scale_embeddings=True, sliding_window=4, sliding_layers=(1, 2),
                              rope_local_theta=100.0)):
        net = tiny_model(layers=4, scale=3.0, **switches).net
        ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
        for layers in (None, (0, 2, 3)):
            run = backends.runner(net, "eager", layers)
            with torch.inference_mode():
                states = net.layer_states(ids, run.execution)
                logits = net.output(net.final_norm(states[-1]))
                assert torch.equal(logits, run(ids, None))
                rest = net.layer_states(ids, backends.runner(net, "eager", (2, 3)).execution,
                                        states[-3])
            assert len(states) == len(layers or range(4)) + 1 and states[0].shape == (10, 32)
            assert all(torch.equal(a, b) for a, b in zip(rest, states[-3:]))
            assert not torch.equal(states[1], states[0])
