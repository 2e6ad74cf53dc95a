"""Tiny models on tiny vocabularies, so the exactness tests run in seconds on a CPU."""

from __future__ import annotations

import copy
import itertools
import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen2Config, Qwen2ForCausalLM

from specq import backends
from specq.backends.runner import Runner
from specq.core.sampling import SamplingConfig, probabilities
from specq.loading.kinds import FEATURE
from specq.core.types import Draft, Model
from specq.drafters.ngram import NgramIndex
from specq.loading.precision import parse, quantize_net
from specq.model.feature_draft import new_feature_draft
from specq.model.hf_backend import HFCausalLM
from specq.model.llama import Llama, LlamaConfig, native_to_hf_state_dict
from specq.weights.quant import quantize_model

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 8, 9, 10, 11]]
VOCAB = 32


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, which only adds a synchronization to every
    op (on a busy 2-core machine each small op then waits for a descheduled thread). A module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_tokenizer(vocab_size: int, prefix: str = "t"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"{prefix}{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_config(vocab: int = 32, layers: int = 2, hidden: int = 32, **switches) -> LlamaConfig:
    """`switches`: `LlamaConfig`'s architecture fields (qkv_bias=True for a Qwen2-like model)."""
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                       rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=512,
                       **switches)


def training_files(tmp_path, monkeypatch, vocab: int, hidden: int, words: int, prompts: int,
                   seed: int = 0):
    """A tiny saved target (`tmp_path/target`), a text file of 10 random documents of `words` words
    and `prompts` random prompts, and an empty $SPECQ_CACHE: what `specq distill` and `specq qad`
    read."""
    from specq.loading.formats.save import save_native

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    save_native(tiny_model(vocab=vocab, hidden=hidden, scale=3.0, seed=seed), tmp_path / "target")
    rng = random.Random(0)
    docs = [" ".join(f"t{rng.randrange(vocab)}" for _ in range(words)) for _ in range(10)]
    (tmp_path / "text.txt").write_text("\n\n".join(docs))
    (tmp_path / "prompts.txt").write_text(
        "\n".join(" ".join(f"t{rng.randrange(vocab)}" for _ in range(5))
                  for _ in range(prompts)))
    return tmp_path


def tiny_model(vocab: int = 32, layers: int = 2, hidden: int = 32, seed: int = 0,
               scale: float = 1.0, eos: tuple[int, ...] = (), ref: str = "tiny",
               **switches) -> Model:
    """A random Llama (of another architecture by `tiny_config`'s switches); `scale` sharpens its
    logits so greedy paths are not all ties."""
    torch.manual_seed(seed)
    net = Llama(tiny_config(vocab, layers, hidden, **switches))
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        net.output.weight.mul_(scale)
    return Model(ref=ref, net=net.eval(), tokenizer=tiny_tokenizer(vocab), eos_ids=frozenset(eos),
                 source="random")


def perturbed(model: Model, noise: float, seed: int = 1, ref: str = "draft") -> Model:
    """A draft that mostly agrees with `model`: its weights plus Gaussian noise."""
    torch.manual_seed(seed)
    net = copy.deepcopy(model.net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * noise * p.std())
    return Model(ref=ref, net=net, tokenizer=model.tokenizer, eos_ids=model.eos_ids,
                 source="random")


def _kernel_variants() -> list:
    """Every kernel variant, those this CPU cannot run skipped with what it lacks."""
    from specq.kernels import build

    return [pytest.param(name, marks=[] if name in build.runnable() else pytest.mark.skip(
        reason=f"this CPU lacks {', '.join(sorted(needs.keys() - build.cpu_flags()))}"))
        for name, needs in build.VARIANTS.items()]


@pytest.fixture
def force_kernels(monkeypatch):
    """A function that makes this test run specq's kernels of the variant it names, as
    SPECQ_KERNELS does in a new process; the process's own choice is back after the test."""
    from specq.kernels import build

    def forget():
        build.variant.cache_clear()

    def force(name: str) -> None:
        monkeypatch.setenv(build.ENV, name)
        forget()

    yield force
    forget()  # before monkeypatch restores the environment: the next use reads it anew


@pytest.fixture(params=_kernel_variants())
def kernel_variant(request, force_kernels) -> str:
    """The test runs once per kernel variant this CPU runs, on that variant."""
    force_kernels(request.param)
    return request.param


@pytest.fixture(scope="session")
def real_target():
    import specq

    return specq.load("smollm2-135m")


def _exact_sequence_distribution(target: Model, prompt: list[int], n: int,
                                 cfg: SamplingConfig) -> dict:
    """P(t1..tn) under the target's processed distribution, by enumeration."""
    v = target.vocab_size
    probs = {}
    for seq in itertools.product(range(v), repeat=n):
        with torch.no_grad():
            logits = target.runner(torch.tensor(prompt + list(seq)), None)[len(prompt) - 1:]
        p = probabilities(logits, cfg)
        probs[seq] = float(torch.prod(torch.stack([p[i, t] for i, t in enumerate(seq)])))
    return probs


def sampled_outputs(target: Model, draft, prompt: list[int], runs: int,
                    **options) -> tuple[dict, int]:
    """(how often each 3-token output came, drafts rejected) over `runs` seeded samplings at
    temperature 1 with gamma 2 and no early stop (`options` may add or override)."""
    from specq import generate

    counts, rejected = {}, 0
    for seed in range(runs):
        out = generate(target, prompt, draft,
                       **{"gamma": 2, "max_new_tokens": 3, "temperature": 1.0, "seed": seed,
                          "draft_confidence": 0.0, **options})
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        rejected += out.stats.drafted - out.stats.accepted
    return counts, rejected


def chi_square_p(counts: dict, exact: dict, runs: int) -> float:
    """p-value of sampled sequence counts against the exact distribution (cells expected below 5
    pooled); asserts first that no sequence the target cannot produce was sampled."""
    assert set(counts) <= set(exact)
    cells = [(counts.get(k, 0), exact[k] * runs) for k in exact]
    assert sum(c for c, e in cells if e == 0) == 0  # never a token the target cannot produce
    big = [(c, e) for c, e in cells if e >= 5]
    small = [(c, e) for c, e in cells if 0 < e < 5]
    observed = [c for c, _ in big] + ([sum(c for c, _ in small)] if small else [])
    expected = [e for _, e in big] + ([sum(e for _, e in small)] if small else [])
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [e * scale for e in expected]).pvalue


def _feature_model(target: Model, vocab_ids=None, seed: int = 0) -> Draft:
    ids = torch.arange(VOCAB) if vocab_ids is None else torch.tensor(vocab_ids)
    net = new_feature_draft(target.net, ids, seed=seed).eval()
    return Draft(FEATURE,
                 Model(ref="feature", net=net, tokenizer=target.tokenizer, eos_ids=target.eos_ids,
                       source="random"))


def at(model: Model, spec: str, fast: bool) -> Model:
    net = copy.deepcopy(model.net)
    quantize_model(net, spec, progress=False)
    return Model(ref=f"{model.ref}@{spec}", net=net, tokenizer=model.tokenizer,
                 eos_ids=model.eos_ids, source=model.source, precision=spec,
                 runner=backends.runner(net, "kernels" if fast else "eager"))


def without_stack(run: Runner) -> Runner:
    """A runner of the same network on the same kernels with each layer's modules run one by one
    (no C layer stack): what the stack is compared with."""
    return type(run)(run.net, run.backend, run.kernels)


def counting_stack(run: Runner) -> tuple[Runner, list]:
    """A runner like `run` whose layer stack records each call: (runner, calls), a call's entry
    the number of sequences it ran."""
    calls, stack = [], run.stack
    return type(run)(run.net, run.backend, run.kernels,
                     lambda x, cos, sin, segments, local=None: calls.append(len(segments)) or stack(
                         x, cos, sin, segments, local)), calls


def verify_vs_steps(net, prompt: torch.Tensor, rows: torch.Tensor) -> float:
    """Largest |logit| difference between one pass over `rows` and the same
    rows fed one at a time."""
    with torch.inference_mode():
        cache = net.new_cache(64)
        net(prompt, cache)
        together = net(rows, cache)
        cache.crop(len(prompt))
        apart = torch.cat([net(rows[i:i + 1], cache) for i in range(len(rows))])
    return (together - apart).abs().max().item()


def _self_draft(target: Model, spec: str = "int8") -> Model:
    net = copy.deepcopy(target.net)
    quantize_net(net, target.tokenizer, parse(spec), progress=False)
    return Model(ref=f"self@{spec}", net=net.eval(), tokenizer=target.tokenizer,
                 eos_ids=target.eos_ids, source="quantized copy", precision=spec)


def _config():
    from specq.core.sampling import SamplingConfig

    return SamplingConfig(temperature=1.0)


def assert_speculative_is_plain(target: Model, draft: Model,
                                prompts: tuple = ([1, 2, 3], [5], [7, 7, 8, 9, 10, 11])) -> None:
    """Greedy speculative output equals plain output on each prompt, with drafts both accepted and
    rejected (so both paths ran)."""
    from specq import generate

    accepted = rejected = 0
    for prompt in prompts:
        base = generate(target, prompt, None, max_new_tokens=24)
        spec = generate(target, prompt, draft, gamma=4, max_new_tokens=24)
        assert spec.token_ids == base.token_ids and len(base.token_ids) == 24
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert accepted > 0 and rejected > 0


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """The q/k row order llama.cpp's converter writes (convert_hf_to_gguf's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1,
                                                                                2).reshape(w.shape)


# VOCAB byte-level BPE tokens (one merge), with the special tokens Qwen2's and Gemma's tokenizer
# classes add where a vocabulary lacks them.
GGUF_TOKENS = ([chr(c) for c in range(ord("a"), ord("z") + 1)]
               + [chr(c) for c in range(ord("A"), ord("X") + 1)]
               + list("0123456789") + ["ab", "<mask>", "<|endoftext|>", "<|im_end|>"])


def add_bpe_tokenizer(w) -> None:
    """GGUF_TOKENS as a GGUF file's byte-level BPE tokenizer (as llama.cpp's converter writes
    Qwen2's), the last token its EOS."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(GGUF_TOKENS)
    w.add_token_types([1] * (len(GGUF_TOKENS) - 3) + [3, 3, 3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(len(GGUF_TOKENS) - 1)


def write_tiny_gguf(path, model, qtype: str = "F32", extra=None) -> None:
    """A tiny native Llama written the way llama.cpp's converter writes a Hugging Face Llama;
    `extra(writer)` adds more metadata."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    c = model.net.config
    hf = {k: v.float().numpy() for k, v in native_to_hf_state_dict(model.net).items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_heads)
    w.add_head_count_kv(c.num_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_context_length(c.max_position_embeddings)
    w.add_vocab_size(c.vocab_size)
    if extra is not None:
        extra(w)

    def add(name: str, array: np.ndarray) -> None:
        if array.ndim == 2 and qtype != "F32":
            t = getattr(GGMLQuantizationType, qtype)
            w.add_tensor(name, quants.quantize(array, t), raw_dtype=t)
        else:
            w.add_tensor(name, np.ascontiguousarray(array))

    add("token_embd.weight", hf["model.embed_tokens.weight"])
    add("output_norm.weight", hf["model.norm.weight"])
    if "lm_head.weight" in hf:
        add("output.weight", hf["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_layers):
        for hf_name, gguf_name in names.items():
            array = hf[f"model.layers.{i}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                array = llama_cpp_permute(array, c.num_heads)
            elif gguf_name == "attn_k":
                array = llama_cpp_permute(array, c.num_kv_heads)
            add(f"blk.{i}.{gguf_name}.weight", array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_hf_qwen2(seed: int, hidden: int = 32, layers: int = 2) -> Model:
    """A tiny random Qwen2 of transformers', with a sharpened head: a model specq
    runs on the HF backend."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=32, hidden_size=hidden, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256)
    hf = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(30)
    return Model(ref=f"qwen2-{seed}", net=HFCausalLM(hf), tokenizer=tiny_tokenizer(32),
                 eos_ids=frozenset(), source="random")


def serve_in_thread(app):
    """A FastAPI app served by uvicorn in a thread on a free port: (port, stop)."""
    import threading
    import time

    import uvicorn

    from specq.serve.server import bind

    sock = bind("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):
        if uv.started:
            break
        time.sleep(0.05)
    assert uv.started

    def stop():
        uv.should_exit = True
        thread.join(10)
    return sock.getsockname()[1], stop


# prompts that repeat themselves, so n-gram lookups match (test_ngram.py, test_ngram_copy.py)
NGRAM_PROMPTS = [[3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4], [9, 1, 9, 2, 9, 1, 9, 2, 9],
                 [11, 12, 13, 14, 15, 16, 11, 12, 13, 14, 15, 16, 11, 12]]


def ngram_index(tokens: list[int], n_min: int = 2, n_max: int = 3) -> NgramIndex:
    """An n-gram index that has read `tokens`."""
    index = NgramIndex(n_min, n_max)
    index.extend(tokens)
    return index
