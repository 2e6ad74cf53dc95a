"""A runner per loaded model: what executes its passes, made once at load and never changed.

The torch modules (`model.llama.Llama`, a feature draft, a transformers model) are the reference:
nothing here writes to them. A runner owns what running them fast needs (each linear layer's
kernel, in its own layout; the C layer stack; compiled steps) and passes it into the modules'
math as an `Execution`. So the same weights run on kernels and eagerly side by side, training
takes the modules as loaded, and a different way to run them (fewer layers, another kernel
family) is another runner, not a flag on the model.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import Tensor, nn

from ..model.llama import (
    EAGER,
    MAX_STACKED_ROWS,
    Execution,
    KVCache,
    Llama,
    Rows,
    StaticView,
    by_rows,
    invariant_rows,
)
from ..paths import cache_dir
from ..weights.narrow_head import NarrowHead
from .fastpath import Kernel


class Runner:
    """Runs a native network's passes (a `Llama`, or a module built on one, as a feature draft):
    `__call__` as the module's forward, on this runner's execution; for a `Llama` also
    `forward_many` for several sequences. `kernels` maps a linear module to the kernel that runs
    it (the others run their torch op); `stack`, where set, runs whole cached passes of the
    network's decoder in one C call. What is not about running (config, vocabulary, ...) is read
    from the module."""

    def __init__(self, net: nn.Module, backend: str, kernels: dict[nn.Module, Kernel] | None = None,
                 stack=None, layers: tuple[int, ...] | None = None):
        """`layers`: run only these decoder layers, in order (`Execution.layers`; None: all)."""
        self.net = net
        self.backend = backend
        self.kernels = kernels or {}
        self.execution = (Execution(self.linear, stack, layers) if self.kernels or stack or layers
                          else EAGER)
        self._stack_limit: int | None = None

    @property
    def stack(self):
        return self.execution.stack

    @property
    def config(self):
        return self.net.config

    @property
    def dtype(self) -> torch.dtype:
        return self.net.dtype

    def linear(self, module: nn.Module, x: Tensor) -> Tensor:
        """`module`'s output for x on its kernel, else on its own torch op (a narrowed head's kept
        rows on theirs)."""
        kernel = self.kernels.get(module)
        if kernel is not None:
            return kernel(x)
        if isinstance(module, NarrowHead):
            return module(x, self.linear)
        return module(x)

    def __getattr__(self, name: str):  # the module's own attributes: vocab_ids, full_vocab, ...
        if name.startswith("_") or name in ("net", "execution", "kernels", "backend"):
            raise AttributeError(name)
        return getattr(self.net, name)

    def new_cache(self, capacity: int) -> KVCache:
        layers = self.execution.layers
        if layers is None:
            return self.net.new_cache(capacity)
        return self.net.new_cache(capacity, len(layers))

    def __call__(self, *args, **kwargs):
        """The module's forward (`Llama.forward`, a feature draft's) on this runner's kernels."""
        return self.net(*args, **kwargs, ex=self.execution)

    def hidden_states(self, ids: Tensor) -> Tensor:
        return self.net.hidden_states(ids, self.execution)

    def forward_many(self, seqs: list[Rows],
                     return_hidden: bool = False) -> list[tuple[Tensor, Tensor | None]]:
        """Several sequences' rows, each at the end of its own cache, in as few passes as exactness
        allows: (logits, hidden states or None) per sequence, as `__call__` returns them. Sequences
        are stacked in order while their rows fit `stack_limit()` and the layer stack takes all of
        them or none (`on_stack`): the linear layers then read each weight once for all of them,
        each row attends to its own sequence only, and each sequence runs the kernels its own pass
        runs, so every result is bit-identical to the sequence's own pass."""
        if len(seqs) == 1:  # nothing to stack (and no probe: `specq generate` never pays for it)
            return self.net.stacked(seqs, return_hidden, ex=self.execution)
        out, group, rows, limit = [], [], 0, self.stack_limit()
        for s in seqs:
            if (group and (rows + s.ids.shape[0] > limit
                           or self.on_stack(s) != self.on_stack(group[0]))):
                out += self.net.stacked(group, return_hidden, ex=self.execution)
                group, rows = [], 0
            group.append(s)
            rows += s.ids.shape[0]
        return out + self.net.stacked(group, return_hidden, ex=self.execution) if group else out

    def on_stack(self, s: Rows) -> bool:
        """Whether the layer stack runs these rows in a float32 inference pass
        (`Llama.decoder_pass`)."""
        return self.stack is not None and by_rows(s.cache.length, s.ids.shape[0])

    def stack_limit(self) -> int:
        """How many rows of different sequences one pass may stack: the most rows (up to
        MAX_STACKED_ROWS) at which every linear layer computes each row exactly as alone, probed
        once on random inputs (`invariant_rows`) on this runner's kernels; 1 where a kernel rounds
        a row by its neighbours (MKL's sgemm, the eager path)."""
        if self._stack_limit is None:
            self._stack_limit = invariant_rows(self.net, MAX_STACKED_ROWS, self.dtype, self.linear,
                                               lambda m: self.kernels.get(m, m))
        return self._stack_limit


class ModuleRunner(Runner):
    """A network specq's decoder does not run (transformers' modules, `hf_backend.HFCausalLM`): its
    own forward, on torch's ops, one sequence a pass."""

    def __call__(self, *args, **kwargs):
        return self.net(*args, **kwargs)

    def hidden_states(self, ids: Tensor) -> Tensor:
        raise ValueError("a transformers model has no hidden states to hand out")

    def forward_many(self, seqs: list[Rows],
                     return_hidden: bool = False) -> list[tuple[Tensor, Tensor | None]]:
        return self.net.forward_many(seqs, return_hidden)


# Longer inputs (prefill) than this run eagerly on the compiled runner.
MAX_COMPILED_TOKENS = 16


class CompiledRunner(Runner):
    """torch.compile of cached chain steps of up to MAX_COMPILED_TOKENS tokens, on the modules'
    torch ops (inductor cannot trace specq's C kernels or oneDNN's opaque packed weights, and packs
    frozen weights itself). Inputs are padded to 1, 2, 4, 8 or 16 tokens (padding lands past the
    cache length, where it is masked and later overwritten), so few graphs exist; each costs a
    compilation (about a minute on 2 cores) on first use, cached on disk under $SPECQ_CACHE.
    Caches grow to the largest capacity asked so far, a power of two, so graphs are reused. Other
    passes (prefills, trees, hidden states) run eagerly."""

    def __init__(self, net: Llama, inductor: str = "inductor"):
        super().__init__(net, "compiled")
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        self.step = torch.compile(net.static_step, dynamic=False, backend=inductor)
        self.capacity = 0
        self.sizes: set[int] = set()
        self.compile_s = 0.0  # time spent compiling new shapes so far (reported by the CLI)

    def new_cache(self, capacity: int) -> KVCache:
        self.capacity = max(1 << (capacity + MAX_COMPILED_TOKENS - 1).bit_length(), self.capacity)
        return self.net.new_cache(self.capacity)

    def __call__(self, ids: Tensor, cache: KVCache | None = None, last_only: bool = False,
                 return_hidden: bool = False, positions: Tensor | None = None,
                 mask: Tensor | None = None, head: nn.Module | None = None):
        if (cache is None or ids.shape[0] > MAX_COMPILED_TOKENS or return_hidden
            or positions is not None
                or mask is not None or head is not None):
            return self.net(ids, cache, last_only, return_hidden, positions, mask, head)
        logits = self._compiled(ids, cache)
        cache.length += ids.shape[0]
        return logits[-1:] if last_only else logits

    def forward_many(self, seqs: list[Rows],
                     return_hidden: bool = False) -> list[tuple[Tensor, Tensor | None]]:
        """One sequence a pass (compiled steps take one)."""
        out = []
        for s in seqs:
            logits = self(s.ids, s.cache, s.last_only, return_hidden, s.positions, s.mask)
            out.append(logits if return_hidden else (logits, None))
        return out

    def _compiled(self, ids: Tensor, cache: KVCache) -> Tensor:
        n = ids.shape[0]
        size = 1 << (n - 1).bit_length()
        if cache.length + size > cache.capacity:
            raise ValueError(f"KV cache full: {cache.length + size} positions needed, capacity "
                             f"{cache.capacity}")
        self.net._ensure_rope(cache.length + size)
        padded = torch.cat([ids, ids.new_zeros(size - n)]) if size > n else ids
        positions = torch.arange(cache.length, cache.length + size)
        if size not in self.sizes:
            print(f"specq: compiling the {size}-token step of a {self.config.num_layers}-layer "
                  "model (once per machine, cached on disk; up to a few minutes on 2 cores)",
                  file=sys.stderr, flush=True)
        started = time.perf_counter()
        logits = self.step(padded, StaticView(cache.k, cache.v, positions, cache.causal[positions]))
        if size not in self.sizes:
            self.sizes.add(size)
            self.compile_s += time.perf_counter() - started
        return logits[:n]
