"""Tiny models on tiny vocabularies, so the exactness tests run in seconds on a CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from specq.llama import Llama, LlamaConfig
from specq.models import Model


def tiny_tokenizer(vocab_size: int, prefix: str = "t"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"{prefix}{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_config(vocab: int = 32, layers: int = 2, hidden: int = 32) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                       num_heads=4, num_kv_heads=2, head_dim=hidden // 4, rope_theta=10000.0,
                       tie_word_embeddings=False, max_position_embeddings=512)


def tiny_model(vocab: int = 32, layers: int = 2, hidden: int = 32, seed: int = 0, scale: float = 1.0,
               eos: tuple[int, ...] = (), ref: str = "tiny") -> Model:
    """A random Llama; `scale` sharpens its logits so greedy paths are not all ties."""
    torch.manual_seed(seed)
    net = Llama(tiny_config(vocab, layers, hidden))
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        net.output.weight.mul_(scale)
    return Model(ref=ref, net=net.eval(), tokenizer=tiny_tokenizer(vocab), eos_ids=frozenset(eos), source="random")


def perturbed(model: Model, noise: float, seed: int = 1, ref: str = "draft") -> Model:
    """A draft that mostly agrees with `model`: its weights plus Gaussian noise."""
    torch.manual_seed(seed)
    net = copy.deepcopy(model.net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * noise * p.std())
    return Model(ref=ref, net=net, tokenizer=model.tokenizer, eos_ids=model.eos_ids, source="random")


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
    from specq.kernels import build, int8dot

    def forget():
        build.variant.cache_clear()
        int8dot._library.cache_clear()  # it holds the process's variant

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
