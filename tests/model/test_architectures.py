"""Conformance with transformers, per architecture of the Llama family (`model/architectures.py`).

A tiny random model of each architecture is built by transformers (its modeling code is the
reference) and loaded by specq from a saved Hugging Face directory and from a GGUF file written the
way llama.cpp's converter writes that architecture. Natively, on the eager and on the fast path, it
must give transformers' logits (prefill, cached steps, verify passes; fp32, within 1e-4), its
greedy tokens, and speculative output equal to plain decoding (chains and token trees, with
rejections); on the fast path every architecture's layers run on `decoder.Stack`, with verify rows
bit-identical to one-token steps.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import specq
from specq import generate
from specq.drafters.tree import TreeShape
from specq.errors import SpecqError
from specq.loading.formats import gguf_io
from specq.model.architectures import ARCHITECTURES, unsupported
from specq.model.llama import Llama, LlamaConfig

from conftest import (GGUF_TOKENS, PROMPTS, add_bpe_tokenizer, counting_stack, llama_cpp_permute,
                      perturbed, verify_vs_steps, without_stack)


pytestmark = pytest.mark.usefixtures("one_thread")


VOCAB = 64
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
          "pad_token_id": None}
# name -> (model_type, config overrides): each architecture with the switches it sets, windows
# shorter than the test sequences.
CASES = {
    "llama": ("llama", {}),
    "llama3-rope": ("llama", {"head_dim": 16, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 16.0, "original_max_position_embeddings": 128}}),
    "smollm2": ("llama", {"tie_word_embeddings": True,
                          "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}),
    "mistral": ("mistral", {"sliding_window": 4}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gemma3": ("gemma3_text", {"num_hidden_layers": 6, "head_dim": 8, "sliding_window": 4,
                               "query_pre_attn_scalar": 12, "tie_word_embeddings": True,
                               "rope_parameters": {
                                   "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                      "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 1e4}}}),
    "phi3": ("phi3", {"sliding_window": 5}),
}
# What a GGUF file of the case cannot hold, as llama.cpp's converter writes it: Mistral files are
# llama files without the window, and llama.cpp scales a Gemma 3 query by head_dim **
# -0.5 (the 27B aside).
GGUF_LOSES = {"mistral": {"sliding_window": None}, "gemma3": {"query_pre_attn_scalar": 8}}


def hf_model(name: str, **overrides):
    """The case's transformers model with random weights (biases too; norm weights around their
    neutral value: 1, or 0 for Gemma's 1 + w), in fp32."""
    model_type, extra = CASES[name]
    config = AutoConfig.for_model(model_type, **(COMMON | extra | overrides))
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).float().eval()
    neutral = 1.0 - ARCHITECTURES[model_type].norm_offset
    with torch.no_grad():
        for key, p in hf.named_parameters():
            p.copy_(neutral + 0.2 * torch.randn_like(p)
                    if key.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    return hf


def save_hf(hf, directory):
    """A Hugging Face directory of `hf` and a word-level tokenizer of its vocabulary, whose last
    token is <|endoftext|> (which Qwen2's tokenizer class would otherwise add)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf.save_pretrained(directory)
    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<|endoftext|>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer, tok.decoder = (pre_tokenizers.WhitespaceSplit(),
                                      decoders.WordPiece(prefix="##"))
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    return directory


SEQUENCE = torch.randint(0, VOCAB, (90,), generator=torch.Generator().manual_seed(3))


def check_logits(model, hf) -> None:
    """Uncached; and a prefill, one-token steps, a verify pass (row by row) and a pass longer than
    those (fused attention over a cache): each row within 1e-4 of transformers'."""
    net = model.runner
    assert isinstance(model.net, Llama)  # native, not the transformers fallback
    with torch.inference_mode():
        ref = hf(SEQUENCE[None]).logits[0].float()
        cache = net.new_cache(128)
        parts = [net(SEQUENCE[:6], cache)] + [net(SEQUENCE[i:i + 1], cache) for i in range(6, 14)]
        parts += [net(SEQUENCE[14:22], cache), net(SEQUENCE[22:], cache)]
        assert (net(SEQUENCE) - ref).abs().max() <= 1e-4
        assert (torch.cat(parts) - ref).abs().max() <= 1e-4


def check_decoding(model, hf, draft) -> None:
    """Greedy tokens as transformers' generate; speculative == plain."""
    assert (generate(model, SEQUENCE[:5].tolist(), None, max_new_tokens=20).token_ids
            == hf_greedy(hf, model, 20))
    check_speculative(model, draft)


def check_speculative(model, draft) -> None:
    """Speculative decoding (chains and token trees, and the default draft: a model with no file
    gets the n-gram lookup) gives plain decoding's tokens; rejections seen."""
    rejected = 0
    for prompt in PROMPTS:
        base = generate(model, prompt, None, max_new_tokens=24).token_ids
        for kind in ({"gamma": 3}, {"tree": TreeShape(6, 3, 2)}):
            spec = generate(model, prompt, draft, max_new_tokens=24, **kind)
            assert spec.token_ids == base, kind
            rejected += spec.stats.drafted - spec.stats.accepted
        by_default = generate(model, prompt, max_new_tokens=24)
        assert by_default.token_ids == base and by_default.draft.startswith("ngram")
    assert rejected > 0  # the reject path ran


def hf_greedy(hf, model, n: int) -> list[int]:
    """transformers' greedy continuation of SEQUENCE[:5], stopping at the tokenizer's EOS as specq
    does (a Qwen2 tokenizer always has one)."""
    out = hf.generate(SEQUENCE[None, :5], attention_mask=torch.ones(1, 5, dtype=torch.long),
                      max_new_tokens=n, do_sample=False, pad_token_id=0,
                      eos_token_id=sorted(model.eos_ids) or None)
    return out[0, 5:].tolist()


def check_fast_rows(model) -> None:
    """On the kernels backend every layer runs in `decoder.Stack`'s one C call per cached pass, and
    a verify pass's rows equal one-token steps bit for bit."""
    assert model.runner.stack is not None
    assert verify_vs_steps(model.runner, SEQUENCE[:9], SEQUENCE[9:17]) == 0


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("name", CASES)
def test_hf_directory(tmp_path, name, fast):
    hf = hf_model(name)
    directory = save_hf(hf, tmp_path / name)
    model = specq.load(str(directory), backend="kernels" if fast else "eager")
    check_logits(model, hf)
    check_decoding(model, hf, perturbed(specq.load(str(directory), backend="eager"), 0.3))
    if fast:
        check_fast_rows(model)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_folder_loads_without_a_second_copy_of_its_weights(tmp_path, monkeypatch, tied):
    """A float32 folder's tensors become the model's weights as read, not copied into a model
    allocated beside them: an unfused weight is the very tensor read, a tied head is the
    embedding. And none maps the file: a model must outlive a change to its files."""
    from specq.loading.formats import hf as hf_folders

    read: set[int] = set()
    read_safetensors = hf_folders.read_safetensors

    def recording(path):
        tensors = read_safetensors(path)
        read.update(t.data_ptr() for t in tensors.values())
        return tensors

    monkeypatch.setattr(hf_folders, "read_safetensors", recording)
    directory = save_hf(hf_model("llama", tie_word_embeddings=tied), tmp_path / "m")
    net, _, _ = hf_folders.load_dir(directory, torch.float32, local_only=True)
    block = net.layers[0]
    for weight in (net.tok_embeddings.weight, block.attention.wo.weight,
                   block.feed_forward.w2.weight, block.ffn_norm.weight):
        assert weight.data_ptr() in read
    assert (net.output.weight is net.tok_embeddings.weight) == tied
    assert not any(p.is_meta for p in net.parameters())
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(directory) not in maps.read_text()


@pytest.mark.parametrize("name", ["qwen2", "gemma3"])
def test_quantized_fast_path(tmp_path, monkeypatch, name):
    """Integer weights (int8dot on the fast path) beside the switches stay exact: verify rows equal
    one-token steps, speculative == plain; the quantized model reloads from
    its cache as the same."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    directory = save_hf(hf_model(name), tmp_path / name)
    model = specq.load(f"{directory}@int8")
    with torch.inference_mode():
        assert torch.equal(model.runner(SEQUENCE), specq.load(f"{directory}@int8").runner(SEQUENCE))
    check_fast_rows(model)
    check_speculative(model, perturbed(specq.load(str(directory), backend="eager"), 0.3))


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_stacked_sequences_get_what_each_gets_alone(tmp_path, name):
    """The server's batching (`Runner.forward_many`) on sliding-window layers: a step, chain and
    tree verify passes, a prefill and a long pass of several sequences, in as few passes as keep
    each bit-identical to its own pass on the fast path (the stack's rows
    apart from the modules')."""
    from specq.core.acceptance import verify_layout
    from specq.model.llama import Rows

    net = specq.load(str(save_hf(hf_model(name), tmp_path / name))).runner
    assert net.stack is not None
    rng = torch.Generator().manual_seed(0)

    def prefilled(n: int):
        cache = net.new_cache(200)
        with torch.no_grad():
            net(torch.randint(0, VOCAB, (n,), generator=rng), cache)
        return cache

    tree = prefilled(9)
    seqs = [Rows(torch.randint(0, VOCAB, (n,), generator=rng), cache, **layout)
            for n, cache, layout in (
        (1, prefilled(5), {}), (3, prefilled(12), {}),
        (8, tree, verify_layout(torch.tensor([-1, -1, 0, 0, 1, 2, -1]), tree.length)),
        (6, net.new_cache(200), {}), (70, prefilled(3), {}))]
    with torch.no_grad():
        alone = []
        for s in seqs:
            cache = copy.deepcopy(s.cache)
            alone.append(net(s.ids, cache, positions=s.positions, mask=s.mask))
        together = net.forward_many(seqs)
    assert net.stack_limit() > 1  # the rows really shared passes
    for (logits, _), want in zip(together, alone):
        assert torch.equal(logits, want)


@pytest.mark.parametrize("spec", ["", "@int8"], ids=["fp32", "int8"])
@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3"])
def test_layers_run_on_the_layer_stack(tmp_path, monkeypatch, name, spec, kernel_variant):
    """Qwen2's q/k/v biases, Qwen3's q/k norms and Gemma 3's layers (sliding windows with their own
    rope, post-norms, GeGLU, a query scale) run inside `decoder.Stack`'s one C call per pass: a
    step, a chain verify, a tree pass and stacked sequences give the torch modules' logits and
    caches (within float tolerance; integer weights: relative RMS error, int8dot quantizing
    activations the two round apart), and speculative decoding on the stack gives plain decoding's
    tokens (rejections seen)."""
    from specq.core.acceptance import verify_layout
    from specq.model.llama import Rows

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    directory = save_hf(hf_model(name), tmp_path / name)
    model = specq.load(f"{directory}{spec}")
    assert model.runner.stack is not None and model.runner.stack.variant == kernel_variant
    modules = without_stack(model.runner)
    net, calls = counting_stack(model.runner)
    model.runner = net
    parents = torch.tensor([-1, -1, 0, 2, 1])
    results = []
    with torch.no_grad():
        for m in (net, modules):
            caches = [m.new_cache(96) for _ in range(3)]
            out = [m(SEQUENCE[:9], caches[0]), m(SEQUENCE[9:10], caches[0]),
                   m(SEQUENCE[10:15], caches[0])]
            out.append(m(SEQUENCE[15:21], caches[0], **verify_layout(parents, caches[0].length)))
            m(SEQUENCE[30:37], caches[1])
            m(SEQUENCE[40:44], caches[2])
            stacked = m.forward_many([Rows(SEQUENCE[50:51], caches[1]),
                                      Rows(SEQUENCE[51:55], caches[2]),
                                      Rows(SEQUENCE[55:61], caches[0],
                                           **verify_layout(parents, caches[0].length))])
            out += [logits for logits, _ in stacked]
            results.append(out + [t[:, :, :, :c.length] for c in caches for t in (c.k, c.v)])
    assert len(calls) == 4  # step, chain, tree, the stacked pass (prefills take the modules)
    for x, y in zip(*results):
        if spec:
            assert (x - y).pow(2).mean().sqrt() <= 1e-2 * y.pow(2).mean().sqrt()
        else:
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    calls.clear()
    check_speculative(model, perturbed(specq.load(str(directory), backend="eager"), 0.3))
    assert calls  # the verify passes ran on the stack


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_tree_rows_see_the_window_of_their_own_path(tmp_path, name, fast):
    """Each node of a verified token tree, past the window, gets the logits of one-token steps along
    its own path (bit for bit on the fast path)."""
    from specq.core.acceptance import verify_layout

    net = specq.load(str(save_hf(hf_model(name), tmp_path / name)),
                     backend="kernels" if fast else "eager").runner
    assert (net.stack is not None) == fast
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, 4, -1])
    prefix, tokens = SEQUENCE[:9], SEQUENCE[30:39]  # the root, then one token per node
    with torch.no_grad():
        cache = net.new_cache(64)
        net(prefix[:-1], cache)
        tree = net(torch.cat([prefix[-1:], tokens[:len(parents)]]), cache,
                   **verify_layout(parents, cache.length))
        for node in range(len(parents)):
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(int(parents[path[-1]]))
            cache.crop(len(prefix) - 1)
            steps = [net(token.view(1), cache)
                     for token in torch.cat([prefix[-1:], tokens[path[::-1]]])]
            want = steps[-1][0]
            assert (torch.equal(tree[node + 1], want)
                    if fast else torch.allclose(tree[node + 1], want, atol=1e-5))


@pytest.mark.parametrize("name", CASES)
def test_config_round_trip(name):
    """The native config written back as a transformers config reads back the same."""
    hf = hf_model(name)
    native = LlamaConfig.from_hf(hf.config)
    assert LlamaConfig.from_hf(native.to_hf()) == native
    assert type(native.to_hf()) is type(hf.config)


# ------------------------------------------------------------- GGUF files, as llama.cpp writes them

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}{{ m['content'] }}<|im_end|>{% endfor %}"
                 "{% if add_generation_prompt %}assistant{% endif %}")


def write_gguf(path, hf, window_key: bool = False) -> None:
    """The model as llama.cpp's converter writes it (conversion/*.py): tensor names by the `gguf`
    library's map, q/k rows permuted for llama only, Gemma's norm weights stored as 1 + w, the head
    left out when tied, Llama 3.x's scaling as a rope_freqs tensor; metadata keys per architecture;
    a byte-level BPE tokenizer and a chat template."""
    import gguf

    c = hf.config
    arch = ARCHITECTURES[c.model_type]
    w = gguf.GGUFWriter(str(path), arch.gguf)
    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch.gguf],
                                     c.num_hidden_layers)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if getattr(c, "head_dim", None):  # written where config.json has it
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if "sliding_attention" in c.rope_parameters:
        w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
    if arch.gguf == "llama":
        w.add_vocab_size(c.vocab_size)
        w.add_rope_dimension_count(head_dim)
        # not the converter's: llama.cpp reads the key, the converter never writes it
        if window_key:
            w.add_sliding_window(c.sliding_window)
    if arch.gguf in ("gemma3", "phi3"):
        w.add_sliding_window(c.sliding_window or 0)
    add_bpe_tokenizer(w)
    w.add_chat_template(CHAT_TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for key, value in sd.items():
        if arch.permuted_qk and ".q_proj." in key:
            value = llama_cpp_permute(value, c.num_attention_heads)
        elif arch.permuted_qk and ".k_proj." in key:
            value = llama_cpp_permute(value, c.num_key_value_heads)
        if key.endswith("norm.weight"):
            value = value + arch.norm_offset
        w.add_tensor(names.get_name(key, try_suffixes=(".weight", ".bias")),
                     np.ascontiguousarray(value))
    if rope.get("rope_type") == "llama3":  # LlamaModel.generate_extra_tensors
        freqs = (1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                                               / head_dim)))
        low, high = (rope["original_max_position_embeddings"] / rope[k]
                     for k in ("low_freq_factor", "high_freq_factor"))
        factors = []
        for freq in freqs.tolist():
            wavelen = 2 * math.pi / freq
            smooth = (rope["original_max_position_embeddings"] / wavelen
                      - rope["low_freq_factor"]) / (
                rope["high_freq_factor"] - rope["low_freq_factor"])
            factors.append(1 if wavelen < high else rope["factor"] if wavelen > low
                           else 1 / ((1 - smooth) / rope["factor"] + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("name", CASES)
def test_gguf_file(tmp_path, monkeypatch, name, fast):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    hf = hf_model(name, **GGUF_LOSES.get(name, {}))
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, hf)
    # converted to float once
    model = specq.load(f"{path}@fp32", backend="kernels" if fast else "eager")
    assert model.net.config == gguf_io.read(path).config
    check_logits(model, hf)
    check_decoding(model, hf, perturbed(specq.load(f"{path}@fp32", backend="eager"), 0.3))
    if fast:
        check_fast_rows(model)
    else:
        # the file's own precision (its default; float tensors here), and the converted cache as
        # transformers reads it
        check_logits(specq.load(str(path), backend="eager"), hf)
        converted = next((tmp_path / "cache" / "gguf").iterdir())
        again = AutoModelForCausalLM.from_pretrained(converted).float().eval()
        # a llama file without a window: Llama
        assert again.config.model_type == model.net.config.architecture
        with torch.inference_mode():
            assert (again(SEQUENCE[None]).logits - hf(SEQUENCE[None]).logits).abs().max() <= 1e-4


def test_gguf_tokenizer_and_chat_template_come_from_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "qwen2.gguf"
    write_gguf(path, hf_model("qwen2"))
    model = specq.load(str(path))
    tok = model.tokenizer
    ids = tok("abcWX42")["input_ids"]
    # the file's merges, its vocabulary
    assert ids[0] == GGUF_TOKENS.index("ab") and tok.decode(ids) == "abcWX42"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True) == "userhi<|im_end|>assistant"
    assert model.eos_ids == {GGUF_TOKENS.index("<|im_end|>")}


def test_mistral_window_key_in_a_llama_file(tmp_path):
    """llama.cpp reads `llama.attention.sliding_window` though its converter never writes it: a
    llama file with the key is a Mistral with that window."""
    hf = hf_model("mistral")
    path = tmp_path / "mistral.gguf"
    write_gguf(path, hf, window_key=True)
    config = gguf_io.read(path).config
    assert ((config.architecture, config.sliding_window, config.sliding_layers)
            == ("mistral", 4, (0, 1)))


# ------------------------------------------------------------- what runs on transformers, and why

@pytest.mark.parametrize("model_type, overrides, reason", [
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                   "original_max_position_embeddings": 64}}, "rope scaling 'yarn'"),
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope scaling 'dynamic'"),
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("llama", {"mlp_bias": True}, "feed-forward biases"),
    ("llama", {"hidden_act": "relu"}, "activation 'relu'"),
    ("gemma3_text", {"final_logit_softcapping": 30.0}, "final logit softcapping"),
    ("phi3",
     {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial rotary"),
    ("gpt2", {}, "model_type 'gpt2'"),
])
def test_unsupported_configs_name_the_reason(model_type, overrides, reason):
    config = AutoConfig.for_model(model_type, **overrides)
    assert reason in unsupported(config)


def test_unsupported_model_runs_on_transformers_with_a_note(tmp_path, capsys):
    hf = hf_model("llama", mlp_bias=True)
    directory = save_hf(hf, tmp_path / "m")
    capsys.readouterr()
    model = specq.load(str(directory), backend="eager")
    assert not isinstance(model.net, Llama)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specq:")]
    assert (len(notes) == 1 and "runs on transformers" in notes[0]
            and "feed-forward biases" in notes[0])
    assert (generate(model, SEQUENCE[:5].tolist(), None, max_new_tokens=8).token_ids
            == hf_greedy(hf, model, 8))


def test_gguf_of_an_unimplemented_rope_scaling_is_one_line(tmp_path):
    import gguf

    path = tmp_path / "yarn.gguf"
    write_gguf(path, hf_model("qwen2"))
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "yarn2.gguf"), "qwen2")
    for f in reader.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            vtype = f.types[0]
            writer.add_key_value(f.name, f.contents(), vtype,
                                 sub_type=f.types[-1]
                                 if vtype == gguf.GGUFValueType.ARRAY else None)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist()))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecqError, match="rope scaling 'yarn'"):
        gguf_io.read(tmp_path / "yarn2.gguf")
