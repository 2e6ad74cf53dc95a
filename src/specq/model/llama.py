"""A lean Llama decoder (gpt-fast style) with a preallocated KV cache.

Why not the Hugging Face module: a 135M model has 30 thin layers, and on a CPU the Python and
dispatch overhead outside the matmuls is a large share of a decode step. This module fuses q/k/v and
gate/up into one matmul each, writes keys and values into a preallocated cache, and rolls back
by moving an integer. It is the decoder of the whole Llama family: how Qwen2 / 3, Mistral, Gemma 3
and Phi-3 differ from Llama is a handful of `LlamaConfig` switches (`architectures.py` reads them,
and maps each architecture's checkpoint onto this layout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import decoder
from ..kernels.rows import ROW_BY_ROW_MAX
from . import architectures, rope

# Several sequences' rows share one pass (`Runner.forward_many`, the server's batching) up to this
# many rows in all: the linear layers run once over the stacked rows, attention per sequence. Each
# sequence's result is bit-identical to its own pass only where every linear kernel computes a row
# the same whatever rows are beside it; `Runner.stack_limit` probes that per model, up to this cap.
MAX_STACKED_ROWS = 256


def call(module: nn.Module, x: Tensor) -> Tensor:
    """A linear layer on its own torch op (the eager execution's `linear`)."""
    return module(x)


@dataclass(frozen=True)
class Execution:
    """How a pass runs the modules, which it never changes (`backends` builds one per loaded model):
    `linear(module, x)` runs each linear layer (its kernel in the runner's table, or its torch op),
    and `stack`, where set, runs every decoder layer of a cached float32 inference pass in one C
    call (`kernels.decoder.Stack`), the final norm on its kernel too; `layers`, where set, the
    decoder layers a pass runs, in order (a draft made of the target's own layers), cache layer j
    holding layer layers[j]. Why passed in, not set on the model: the same weights run eagerly
    (training, the reference), on kernels and in part, side by side."""

    linear: Callable[[nn.Module, Tensor], Tensor] = call
    stack: decoder.Stack | None = None
    layers: tuple[int, ...] | None = None


EAGER = Execution()


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192
    # How the Llama family's architectures differ (`architectures.py` reads them from config.json or
    # GGUF metadata); the defaults are Llama's.
    # transformers' model_type of the checkpoint (saving writes that layout back)
    architecture: str = "llama"
    # of full-attention layers: {"rope_type": "linear" | "llama3", ...}
    rope_scaling: dict | None = None
    # rope base of the sliding layers, where it is their own (Gemma 3)
    rope_local_theta: float | None = None
    # on a sliding layer, the row at position i sees keys (i - window, i]
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    qkv_bias: bool = False  # biases of the q, k and v projections (Qwen2)
    # RMSNorm over each head's queries and keys before the rotation (Qwen3, Gemma 3)
    qk_norm: bool = False
    # RMSNorm of the attention and feed-forward outputs before each residual add (Gemma 3)
    post_norms: bool = False
    # the gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
    hidden_act: str = "silu"
    scale_embeddings: bool = False  # token embeddings times sqrt(hidden_size) (Gemma)
    # attention scores scaled by its ** -0.5 (None: head_dim's)
    query_pre_attn_scalar: float | None = None

    def __post_init__(self):
        self.sliding_layers = tuple(self.sliding_layers)  # a list when read back from JSON

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None where it attends to every earlier position."""
        return self.sliding_window if layer in self.sliding_layers else None

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` rotates by the sliding layers' own rope base."""
        return self.rope_local_theta is not None and layer in self.sliding_layers

    @classmethod
    def from_hf(cls, hf) -> "LlamaConfig":
        """From a transformers config that `architectures.unsupported` accepts."""
        return cls(**architectures.fields_from_hf(hf))

    def to_hf(self):
        """The equivalent transformers config (so saved models load in transformers too)."""
        return architectures.hf_config(self)

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Keys and values of every layer in one preallocated buffer; `length` is the valid prefix.

    Rolling back after a rejected draft is `crop(n)`: later writes overwrite the stale tail.
    """

    def __init__(self, config: LlamaConfig, capacity: int, dtype: torch.dtype,
                 layers: int | None = None):
        """`layers`: how many decoder layers write into it (default: the config's)."""
        shape = (layers or config.num_layers, 1, config.num_kv_heads, capacity, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.capacity = capacity
        self.length = 0
        # Row i of the causal mask: key j is visible to the query at position i iff j <= i.
        self.causal = torch.ones(capacity, capacity, dtype=torch.bool).tril_()

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def keep(self, start: int, rows: Tensor) -> None:
        """Keep the rows start + rows (in that order) right after the first `start` and drop the
        rest: the accepted path of a token tree becomes contiguous. A prefix is a plain crop."""
        n = rows.shape[0]
        if (start + n > self.length
            or (n and (int(rows.min()) < 0 or start + int(rows.max()) >= self.length))):
            raise ValueError(f"cannot keep rows {rows.tolist()} after {start} of a cache of length "
                             f"{self.length}")
        if not torch.equal(rows, torch.arange(n)):
            slots = start + rows
            self.k[:, :, :, start:start + n] = self.k[:, :, :, slots]
            self.v[:, :, :, start:start + n] = self.v[:, :, :, slots]
        self.length = start + n


class Visibility(NamedTuple):
    """Which keys each of a cached pass's n query rows attends to. A chain (plain steps and chain
    verification) is causal; a token tree sees the cached prefix plus the row's own ancestors."""

    mask: Tensor | None  # [n, end] bool, for fused attention; None: a single row sees every key
    # per row, its key slots in order, for row-by-row attention; None: causal
    rows: list[Tensor] | None


def visibility(cache: KVCache, n: int, mask: Tensor | None) -> Visibility:
    """The `Visibility` of n rows written at the end of `cache`. `mask` [n, m] (m >= n) says which
    of the last m keys (the new rows and the m - n before them) each row sees; all earlier keys
    are seen. None: causal, the cheap case (contiguous key ranges, no gathers)."""
    start, end = cache.length, cache.length + n
    if n == 1 and mask is None:
        return Visibility(None, None)
    if mask is None:
        return Visibility(cache.causal[start:end, :end], None)
    seen_by_all = end - mask.shape[1]
    full = torch.cat([mask.new_ones(n, seen_by_all), mask], dim=1)
    prefix = torch.arange(seen_by_all)
    return Visibility(full, [torch.cat([prefix, seen_by_all + mask[i].nonzero()[:, 0]])
                             for i in range(n)])


class Rows(NamedTuple):
    """One sequence's part of a cached forward pass: new tokens written at the end of its cache."""

    ids: Tensor  # [n]
    cache: KVCache
    positions: Tensor | None = None  # [n]; None: consecutive after the cache (a chain)
    mask: Tensor | None = None  # [n, m], as in `visibility`; None: causal
    last_only: bool = False  # logits of the last row only (a prefill)


class Segment(NamedTuple):
    """Where one sequence's rows sit in a (stacked) cached pass, and the keys each of them sees."""

    cache: KVCache
    rows: slice
    seen: Visibility


class StaticView(NamedTuple):
    """The cache as plain tensors for the compiled step: attention runs over the whole buffer
    and the causal mask hides slots past each query, so every shape is fixed."""

    k: Tensor
    v: Tensor
    positions: Tensor
    mask: Tensor


class Prior(NamedTuple):
    """Keys and values of earlier passes kept as autograd tensors, not in a cache: the feature
    draft's training-time test (its `unrolled`) backpropagates through them. Each layer
    appends its new rows' keys and values to its lists, and the rows attend to all of them through
    `mask`, which says the whole visibility (a sliding window is not added to it)."""

    keys: list[list[Tensor]]  # per layer, [b, kv_heads, rows, head_dim] per earlier pass
    values: list[list[Tensor]]
    mask: Tensor  # [n, all rows of the lists, the new ones included] bool


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        # The biases sit beside the linear layer, not in it: the bias-free layer then takes the fast
        # path's kernels (row-invariant), and the bias is added afterwards, as `decoder.Stack` does.
        self.wqkv = nn.Linear(c.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.qkv_bias = (nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size))
                         if c.qkv_bias else None)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.wo = nn.Linear(self.q_size, c.hidden_size, bias=False)
        self.window = c.window(layer)
        scalar = c.query_pre_attn_scalar
        # None: head_dim ** -0.5
        self.scale = None if scalar is None or scalar == c.head_dim else scalar ** -0.5

    def projected(self, x: Tensor, linear=call) -> Tensor:
        """The q/k/v projection of x [b, n, hidden]: [b, n, (heads + 2 kv_heads) head_dim], biased
        and with q/k normalized per head where the architecture does so, not yet rotated."""
        qkv = linear(self.wqkv, x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        if self.q_norm is None:
            return qkv
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.unflatten(-1, (self.n_heads, self.head_dim))).flatten(-2)
        k = self.k_norm(k.unflatten(-1, (self.n_kv, self.head_dim))).flatten(-2)
        return torch.cat([q, k, v], dim=-1)

    def rotated(self, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values [b, heads, n, head_dim] from the `projected` output [b, n, ...],
        rotated to their positions. Queries and keys are rotated in one go (fewer
        dispatches per step)."""
        b, n = qkv.shape[:2]
        heads = self.n_heads + self.n_kv
        qkv = qkv.view(b, n, heads + self.n_kv, self.head_dim).transpose(1, 2)
        qk, v = qkv.split([heads, self.n_kv], dim=1)
        qk = qk * cos + rotate_half(qk) * sin
        q, k = qk.split([self.n_heads, self.n_kv], dim=1)
        return q, k, v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                kv: list[Segment] | StaticView | Prior | None, layer: int, linear=call) -> Tensor:
        """`kv`: the `Segment` of each sequence whose rows x stacks (decoding), the static view of
        the compiled step, earlier passes' keys and values (`Prior`), or None (training: x [b, n]
        sequences from position 0, no cache). `linear` runs the linear layers (`Execution`)."""
        b, n = x.shape[:2]
        qkv = self.projected(x, linear)
        if isinstance(kv, list):
            parts = [attend(*self.rotated(qkv[:, s.rows], cos[s.rows], sin[s.rows]), s, layer,
                            self.window, self.scale)
                     for s in kv]
            out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
            return linear(self.wo, out.transpose(1, 2).reshape(1, n, self.q_size))
        q, k, v = self.rotated(qkv, cos, sin)
        if kv is None:
            mask = None if self.window is None else (
                torch.ones(n, n, dtype=torch.bool).tril_() & band(torch.arange(n), n, self.window))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                 scale=self.scale, enable_gqa=True)
        elif isinstance(kv, Prior):
            kv.keys[layer].append(k)
            kv.values[layer].append(v)
            keys, values = torch.cat(kv.keys[layer], dim=2), torch.cat(kv.values[layer], dim=2)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=kv.mask,
                                                 scale=self.scale, enable_gqa=True)
        else:  # compiled: fixed shapes, positions as a tensor
            kv.k[layer].index_copy_(2, kv.positions, k)
            kv.v[layer].index_copy_(2, kv.positions, v)
            mask = (kv.mask if self.window is None
                    else kv.mask & band(kv.positions, kv.mask.shape[1], self.window))
            out = F.scaled_dot_product_attention(q, kv.k[layer], kv.v[layer], attn_mask=mask,
                                                 scale=self.scale, enable_gqa=True)
        return linear(self.wo, out.transpose(1, 2).reshape(b, n, self.q_size))


def by_rows(start: int, n: int) -> bool:
    """Whether n rows written at `start` of a cache attend row by row (`kernels/rows.py` says why):
    all but prefills (an empty cache) and passes too long for it."""
    return start > 0 and n <= ROW_BY_ROW_MAX


def band(positions: Tensor, keys: int, window: int) -> Tensor:
    """[n, keys] bool: key slot j is within the sliding window of the row at positions[r], j > p -
    window (slots are positions on the paths this applies to: chains, and fused
    passes from position 0)."""
    return torch.arange(keys) > positions[:, None] - window


def windowed(seen: Visibility, start: int, n: int, end: int, window: int) -> Visibility:
    """`seen` cut to a sliding window: each row keeps the last `window` keys of its own path (a
    token tree's row sees one key per position up to its own, in order, so those are the
    keys of the window)."""
    if seen.rows is not None:
        rows = [r[-window:] for r in seen.rows]
        mask = torch.zeros(n, end, dtype=torch.bool)
        for i, r in enumerate(rows):
            mask[i, r] = True
        return Visibility(mask, rows)
    mask = None if seen.mask is None else seen.mask & band(torch.arange(start, start + n),
                                                           end, window)
    return Visibility(mask, None)


def attend(q: Tensor, k: Tensor, v: Tensor, segment: Segment, layer: int, window: int | None = None,
           scale: float | None = None) -> Tensor:
    """One sequence's rows of a cached pass: their keys and values go into its cache, and each row
    attends exactly as it would in a pass of its own, whatever other sequences share the pass; on a
    sliding layer (`window`) to the keys of its window only; `scale`: of the scores (None:
    head_dim ** -0.5)."""
    cache, seen = segment.cache, segment.seen
    n = q.shape[2]
    start, end = cache.length, cache.length + n
    cache.k[layer, :, :, start:end] = k
    cache.v[layer, :, :, start:end] = v
    keys, values = cache.k[layer], cache.v[layer]
    if window is not None:
        seen = windowed(seen, start, n, end, window)
    if n == 1 and seen.rows is None:  # a step: its keys are the last `window` (or all) before it
        first = 0 if window is None else max(0, end - window)
        return F.scaled_dot_product_attention(q, keys[:, :, first:end], values[:, :, first:end],
                                              scale=scale, enable_gqa=True)
    if not by_rows(start, n):  # a prefill
        return F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end],
                                              attn_mask=seen.mask, scale=scale, enable_gqa=True)
    if seen.rows is None:  # a chain verify pass: each row exactly as a one-token step computes it
        firsts = [0 if window is None else max(0, start + i + 1 - window) for i in range(n)]
        return torch.cat([F.scaled_dot_product_attention(
            q[:, :, i:i + 1], keys[:, :, firsts[i]:start + i + 1],
            values[:, :, firsts[i]:start + i + 1], scale=scale, enable_gqa=True) for i in range(n)],
                         dim=2)
    # a tree node sees the prefix and its ancestors: the keys of the step at its position
    return torch.cat([F.scaled_dot_product_attention(
        q[:, :, i:i + 1], keys.index_select(2, rows), values.index_select(2, rows),
        scale=scale, enable_gqa=True) for i, rows in enumerate(seen.rows)], dim=2)


# The gate's activation by transformers' name: SwiGLU's SiLU, GeGLU's tanh-approximated GELU.
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.intermediate = c.intermediate_size
        self.act = c.hidden_act
        self.w13 = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.w2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor, linear=call) -> Tensor:
        gate, up = linear(self.w13, x).split(self.intermediate, dim=-1)
        return linear(self.w2, ACTIVATIONS[self.act](gate) * up)


class Block(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int = 0):
        super().__init__()
        self.attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = Attention(c, layer)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.feed_forward = FeedForward(c)
        # Gemma 3 normalizes each sublayer's output too, before it joins the residual stream.
        self.post_attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps) if c.post_norms else None
        self.post_ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps) if c.post_norms else None
        # rotates by the sliding layers' own rope (`Llama.decoder_pass`)
        self.local_rope = c.local_rope(layer)

    def forward(self, x, cos, sin, kv, layer, linear=call):
        h = self.attention(self.attention_norm(x), cos, sin, kv, layer, linear)
        x = x + (h if self.post_attention_norm is None else self.post_attention_norm(h))
        h = self.feed_forward(self.ffn_norm(x), linear)
        return x + (h if self.post_ffn_norm is None else self.post_ffn_norm(h))


class Llama(nn.Module):
    """The decoder's modules and the torch math of its passes. It holds no execution state: how a
    pass runs its linear layers (specq's kernels, or the modules' torch ops) is the `Execution`
    passed in by whoever runs it (`backends.Runner`), so the modules stay the reference, trainable
    and savable as loaded."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self._rope_len = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def new_cache(self, capacity: int, layers: int | None = None) -> KVCache:
        """A cache of `capacity` positions for `layers` decoder layers (default: all of them)."""
        self._ensure_rope(capacity)
        return KVCache(self.config, capacity, self.dtype, layers)

    # the sliding layers' own rope tables, where they have them (Gemma 3)
    local_cos = local_sin = None

    def _ensure_rope(self, length: int) -> None:
        if length <= self._rope_len and self.rope_cos.dtype == self.dtype:
            return
        length = max(length, self._rope_len)
        c = self.config
        self.rope_cos, self.rope_sin = self._rope_tables(length, c.rope_theta, c.rope_scaling)
        if c.rope_local_theta is not None:
            self.local_cos, self.local_sin = self._rope_tables(length, c.rope_local_theta, None)
        self._rope_len = length

    def _rope_tables(self, length: int, theta: float,
                     scaling: dict | None) -> tuple[Tensor, Tensor]:
        """cos, sin [length, head_dim] of positions 0..length-1."""
        inv_freq = rope.inv_freq(theta, self.config.head_dim, scaling)
        angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _local(self, index) -> tuple[Tensor, Tensor] | None:
        """The sliding layers' own cos, sin at `index` (a slice or positions), or None."""
        return None if self.local_cos is None else (self.local_cos[index], self.local_sin[index])

    def forward(self, ids: Tensor, cache: KVCache | None = None, last_only: bool = False,
                return_hidden: bool = False, positions: Tensor | None = None,
                mask: Tensor | None = None, head: nn.Module | None = None,
                ex: Execution = EAGER) -> Tensor | tuple[Tensor, Tensor]:
        """Run `ids` (1-D) at the end of `cache`; return float logits [n, vocab] ([1, vocab] if
        `last_only`). Without a cache the sequence is processed from position 0 (training).
        `return_hidden` also returns the final hidden states [n, hidden] of every row (the output
        head's input), which a feature draft reads; the logits are computed exactly as without it.
        A token tree passes each row's `positions` [n] and a `mask` [n, m]: which of the last m keys
        (m >= n: the new rows and some cached ones) each row sees, every earlier key being seen
        (`visibility`). The default is a chain: consecutive positions, causal. `head`: another
        output layer for a cached pass's rows (a narrowed head's kept rows, `weights.narrow_head`);
        the logits are then its outputs. `ex`: how the pass runs (`Execution`;
        default torch's ops)."""
        if cache is None:
            n = ids.shape[-1]
            self._ensure_rope(n)
            rope = slice(0, n) if positions is None else positions
            x = self._layers(ids, self.rope_cos[rope], self.rope_sin[rope], None,
                             self._local(rope), ex)
            logits = self._head(x, last_only, ex)
            return (logits, self.final_norm(x, ex)[0]) if return_hidden else logits
        logits, hidden = self.stacked([Rows(ids, cache, positions, mask, last_only)], return_hidden,
                                      head, ex)[0]
        return (logits, hidden) if return_hidden else logits

    def stacked(self, seqs: list[Rows], return_hidden: bool, head: nn.Module | None = None,
                ex: Execution = EAGER) -> list[tuple[Tensor, Tensor | None]]:
        """One pass over the rows of `seqs` stacked in order, each at the end of its own cache:
        (logits, hidden states or None) per sequence. The linear layers read each weight once for
        all rows, each row attends to its own sequence only. The logits come from `head` (default
        the model's output layer). Which sequences may share a pass exactly is the runner's call
        (`Runner.forward_many`)."""
        segments, cos, sin, local, heads, at = [], [], [], [], [], 0
        self._ensure_rope(max(s.cache.length + s.ids.shape[0] for s in seqs))
        for s in seqs:
            n, start = s.ids.shape[0], s.cache.length
            if start + n > s.cache.capacity:
                raise ValueError(f"KV cache full: {start + n} positions needed, capacity "
                                 f"{s.cache.capacity}")
            rope = slice(start, start + n) if s.positions is None else s.positions
            cos.append(self.rope_cos[rope])
            sin.append(self.rope_sin[rope])
            local.append(self._local(rope))
            segments.append(Segment(s.cache, slice(at, at + n), visibility(s.cache, n, s.mask)))
            heads.append(slice(at + n - 1 if s.last_only else at, at + n))
            at += n
        local = None if self.local_cos is None else tuple(_cat(list(t)) for t in zip(*local))
        x = self._layers(_cat([s.ids for s in seqs]), _cat(cos), _cat(sin), segments, local, ex)
        hidden = self.final_norm(x, ex)[0]
        logits = ex.linear(head or self.output, _cat([hidden[rows] for rows in heads])).float()
        out, at = [], 0
        for s, segment, rows in zip(seqs, segments, heads):
            s.cache.length += s.ids.shape[0]
            n = rows.stop - rows.start
            out.append((logits[at:at + n], hidden[segment.rows] if return_hidden else None))
            at += n
        return out

    def hidden_states(self, ids: Tensor, ex: Execution = EAGER) -> Tensor:
        """Final hidden states [n, hidden] of a whole sequence (no cache, no output head)."""
        self._ensure_rope(ids.shape[0])
        rope = slice(0, ids.shape[0])
        x = self._layers(ids, self.rope_cos[rope], self.rope_sin[rope], None, self._local(rope), ex)
        return self.final_norm(x, ex)[0]

    def layer_states(self, ids: Tensor, ex: Execution = EAGER,
                     x: Tensor | None = None) -> list[Tensor]:
        """A whole sequence (no cache) through the decoder layers the execution runs: the hidden
        states [n, hidden] entering each of those layers and leaving the last (`final_norm` and
        the output layer of that give `forward`'s logits). How much a layer changes its input says
        how much skipping it may cost (`loading.skip_calibration`). `x`: the states entering the
        first of them, where known (default: the embeddings of ids)."""
        n = ids.shape[0]
        self._ensure_rope(n)
        cos, sin, local = self.rope_cos[:n], self.rope_sin[:n], self._local(slice(0, n))
        x = self._embed(ids) if x is None else x.unsqueeze(0)
        states = [x[0]]
        for i in ex.layers or range(len(self.layers)):
            layer = self.layers[i]
            x = layer(x, *(local if layer.local_rope else (cos, sin)), None, 0, ex.linear)
            states.append(x[0])
        return states

    def _layers(self, ids, cos, sin, kv, local=None, ex: Execution = EAGER) -> Tensor:
        return self.decoder_pass(self._embed(ids), cos, sin, kv, local, ex)

    def _embed(self, ids: Tensor) -> Tensor:
        """Token embeddings [1, n, hidden] of ids [n] (or [B, n, hidden] of ids [B, n])."""
        x = self.tok_embeddings(ids)
        # as transformers' Gemma: times sqrt(hidden) rounded to the dtype
        if self.config.scale_embeddings:
            x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        return x.unsqueeze(0) if x.dim() == 2 else x

    def decoder_pass(self, x: Tensor, cos: Tensor, sin: Tensor, kv,
                     local: tuple[Tensor, Tensor] | None = None, ex: Execution = EAGER) -> Tensor:
        """x [B, n, hidden] through every decoder layer (no final norm): in one C call where the
        execution's stack takes the pass (a cached float32 inference pass whose every sequence
        attends row by row, `by_rows`), else module by module. The stack computes the modules'
        math, rounded its own way but the same for a row whatever rows are beside it, so steps and
        verify passes, which both take it, agree bit for bit. `kv` as `Attention.forward` takes it;
        cos, sin [n, head_dim] of the rows' positions, `local` the same for layers with a rope of
        their own."""
        if (ex.stack is not None and isinstance(kv, list) and decoder.takes(x)
                and all(by_rows(s.cache.length, s.rows.stop - s.rows.start) for s in kv)):
            return ex.stack(x.contiguous(), cos, sin, kv, local)
        for j, i in enumerate(ex.layers or range(len(self.layers))):  # j: its layer in the cache
            layer = self.layers[i]
            x = layer(x, *(local if layer.local_rope else (cos, sin)), kv, j, ex.linear)
        return x

    def final_norm(self, x: Tensor, ex: Execution = EAGER) -> Tensor:
        """The norm after the last layer: on the layer stack's kernel wherever the execution has a
        stack (float32 inference), so that every pass of a run, with or without a cache, normalizes
        alike; else the module's torch op."""
        if ex.stack is not None and decoder.takes(x) and self.norm.weight.dtype == torch.float32:
            return decoder.rms_norm(x, self.norm.weight, self.norm.eps)
        return self.norm(x)

    def _head(self, x: Tensor, last_only: bool, ex: Execution = EAGER) -> Tensor:
        if last_only:
            x = x[:, -1:]
        return ex.linear(self.output, self.final_norm(x, ex))[0].float()

    def static_step(self, ids: Tensor, view: StaticView) -> Tensor:
        """A cached chain step of fixed shapes on torch's ops, for torch.compile
        (`backends.compiled`):
        attention over the whole cache buffer, the view's mask hiding slots past each query."""
        cos, sin = self.rope_cos[view.positions], self.rope_sin[view.positions]
        return self._head(self._layers(ids, cos, sin, view, self._local(view.positions)), False)


def _cat(tensors: list[Tensor]) -> Tensor:
    """torch.cat, without a copy for one tensor (the common one-sequence pass)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def hf_to_native_state_dict(sd: dict[str, Tensor], config: LlamaConfig) -> dict[str, Tensor]:
    """Map a Hugging Face state dict of `config.architecture` onto this module's fused layout."""
    return architectures.native_state_dict(sd, config)


def native_to_hf_state_dict(model: Llama) -> dict[str, Tensor]:
    """The inverse of `hf_to_native_state_dict`, for saving in the Hugging Face layout."""
    return architectures.hf_state_dict(model.state_dict(), model.config)


# Row counts where a GEMM may change its blocking (powers of two and one past them, and the int4
# kernel's blocks of 4): where `invariant_rows` looks for a row computed differently.
PROBE_ROWS = (2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256)


@torch.inference_mode()
def invariant_rows(net: nn.Module, limit: int, dtype: torch.dtype, linear=call,
                   kernel=lambda m: m) -> int:
    """The most rows, up to `limit`, that every linear layer of `net` takes at once while computing
    each row bit for bit as it computes that row alone (`dtype` inputs); 1 if none. Why it matters:
    the server stacks rows of several sequences into one pass, and each sequence must get exactly
    what its own pass gives. Each distinct (kernel, shape) is probed on random rows at PROBE_ROWS (a
    kernel picks its code path by the row count, not by the values), comparing the first and the
    last row of each count, the rows a blocked kernel's edge cases land on, with the row alone.
    `linear` runs a layer as the execution being probed does (`Execution.linear`), `kernel(module)`
    says what runs it (layers of one kernel type and shape are probed once)."""
    layers = {}
    for module in net.modules():
        # a linear layer, or wraps one
        if hasattr(module, "in_features") and hasattr(module, "out_features"):
            layers.setdefault((type(kernel(module)), module.in_features, module.out_features),
                              module)
    generator = torch.Generator().manual_seed(0)
    best = limit
    for layer in layers.values():
        x = torch.randn(limit, layer.in_features, generator=generator).to(dtype)
        for rows in (r for r in PROBE_ROWS + (limit,) if r <= best):
            together = linear(layer, x[:rows])
            if not all(torch.equal(together[i], linear(layer, x[i:i + 1])[0])
                       for i in (0, rows - 1)):
                best = max([1] + [r for r in PROBE_ROWS if r < rows])
                break
    return best
