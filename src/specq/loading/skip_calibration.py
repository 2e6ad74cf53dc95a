"""Which decoder layers a layer-skip draft keeps (`layer_skip.py`): chosen per model by a short
calibration on the model's own greedy output, with no training (as SWIFT and Draft & Verify choose
theirs; LayerSkip trains for it).

1. The model answers a few short prompts (chat and code, `specq.data`) greedily, `NEW_TOKENS`
   tokens each: the tokens a draft of its layers has to guess.
2. Starting from every layer, drop one layer at a time, never the first or the last. Of the
   `CANDIDATES` layers that change their input least in the current network (block influence, as
   ShortGPT: 1 - the cosine of the residual stream before and after the layer, over the rows),
   drop the one whose network then scores best. A network's score is its top-1 agreement with
   the model's own tokens, teacher-forced (a greedy draft's chance to have a token accepted),
   turned into a gain by a cost model: a draft step costs its kept layers' share of the weights a
   step reads plus the head's (`weight_bytes`), a verify pass one target step, so a chain of
   gamma tokens, each accepted with probability `a`, yields `(1 - a^(gamma+1)) / (1 - a)` tokens
   for `gamma * cost + 1` target steps, at the best gamma.
3. The search stops once `PATIENCE` drops in a row do no better than the best so far, and keeps
   the best (whether or not its gain reaches 1: the caller says so).

Each tried network continues the residual stream of the one it comes from at the dropped layer
(the layers before it compute what they computed), so a try costs a pass over the layers after it:
a short calibration, done once per model file and cached by the caller (`layer_skip.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import backends, data
from ..backends.runner import Runner
from ..core.prompt import answer_ids
from ..core.types import Model
from ..weights.quant import weight_bytes

NEW_TOKENS = 48  # greedy tokens per prompt
GAMMAS = range(1, 9)  # the draft lengths the cost model chooses among
CANDIDATES = 3  # layers of least block influence tried at each drop
PATIENCE = 3  # drops in a row no better than the best before the search stops


def prompts() -> list[str]:
    """The calibration prompts: two chat questions and a code request (training prompts)."""
    return data.chat_prompts("train")[:2] + data.code_prompts(1)


@dataclass(frozen=True)
class Calibration:
    kept: tuple[int, ...]  # the layers a draft runs, in order
    agreement: float  # top-1 agreement with the model's own greedy tokens
    gain: float  # the cost model's tokens per target step (1: no gain)
    tokens: int  # greedy tokens scored
    seconds: float


def calibrate(model: Model, texts: Sequence[str] | None = None) -> Calibration:
    """The layers of `model` (a native Llama, on its runner) a draft keeps; `texts`: the prompts
    (default `prompts()`)."""
    started = time.perf_counter()
    run = model.runner
    with torch.inference_mode():
        seqs = [teacher(run, answer_ids(model.tokenizer, text), NEW_TOKENS, model.eos_ids)
                for text in (texts or prompts())]
        share = cost_shares(model)
        network = Network(run, seqs)
        best, since = None, 0
        while len(network.kept) > 2 and since < PATIENCE:
            inner = sorted(network.kept[1:-1], key=network.influence.__getitem__)
            tried = [network.without(layer) for layer in inner[:CANDIDATES]]
            network = max(tried, key=lambda n: gain(n.agreement, share(n.kept)))
            found = Calibration(network.kept, network.agreement,
                                gain(network.agreement, share(network.kept)), network.tokens, 0)
            best, since = ((found, 0) if best is None or found.gain > best.gain
                           else (best, since + 1))
    return Calibration(best.kept, best.agreement, best.gain, best.tokens,
                       time.perf_counter() - started)


def teacher(run: Runner, prompt: list[int], n: int, eos: frozenset[int]) -> tuple[Tensor, int]:
    """(prompt + up to `n` greedy tokens [m], the prompt's length): the model's own answer."""
    cache = run.new_cache(len(prompt) + n)
    out = list(prompt)
    logits = run(torch.tensor(prompt), cache, last_only=True)
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        if out[-1] in eos:
            break
        logits = run(torch.tensor(out[-1:]), cache, last_only=True)
    return torch.tensor(out), len(prompt)


class Network:
    """Some of a model's layers, scored on the greedy sequences `seqs` ((ids, prompt length)):
    `agreement` with the model's tokens, each kept layer's `influence` (block influence) and the
    residual stream at each kept layer, from which a network without one more layer continues: the
    layers before the one dropped compute what they computed."""

    def __init__(self, run: Runner, seqs: list[tuple[Tensor, int]],
                 kept: tuple[int, ...] | None = None, states: list[list[Tensor]] | None = None):
        self.run, self.seqs = run, seqs
        self.kept = tuple(range(len(run.net.layers))) if kept is None else kept
        self.states = states or [self._states(ids, self.kept, None) for ids, _ in seqs]
        self.tokens = sum(len(ids) - start for ids, start in seqs)
        net, ex = run.net, run.execution
        agree = 0
        for (ids, start), states in zip(seqs, self.states):
            logits = run.linear(net.output, net.final_norm(states[-1][start - 1:], ex))
            agree += int((logits.argmax(-1) == ids[start:]).sum())
        self.agreement = agree / max(self.tokens, 1)
        rows = sum(len(ids) - 1 for ids, _ in seqs)
        self.influence = {layer: sum(float((1 - F.cosine_similarity(s[j], s[j + 1], dim=-1)).sum())
                                     for s in self.states) / rows
                          for j, layer in enumerate(self.kept)}

    def without(self, layer: int) -> Network:
        """This network less `layer` (neither its first nor its last)."""
        at = self.kept.index(layer)
        kept = self.kept[:at] + self.kept[at + 1:]
        states = [s[:at] + self._states(ids, kept[at:], s[at])
                  for (ids, _), s in zip(self.seqs, self.states)]
        return Network(self.run, self.seqs, kept, states)

    def _states(self, ids: Tensor, layers: tuple[int, ...], x: Tensor | None) -> list[Tensor]:
        ex = backends.subset(self.run, layers).execution
        return self.run.net.layer_states(ids[:-1], ex, x)


def cost_shares(model: Model):
    """kept layers -> a draft step's cost as a share of a target step's: the weights it reads
    (its layers' and the head's) over all of them."""
    net = model.net
    layers = [weight_bytes(layer).executed for layer in net.layers]
    head = weight_bytes(net.output).executed
    whole = head + sum(layers)
    return lambda kept: (head + sum(layers[i] for i in kept)) / whole


def gain(agreement: float, cost: float) -> float:
    """Tokens per target step's time of a chain draft accepting each token with probability
    `agreement` at cost `cost` a step (a verify pass: one target step), at its best length."""
    def tokens(gamma: int) -> float:
        a = min(agreement, 1 - 1e-9)
        return (1 - a ** (gamma + 1)) / (1 - a)

    return max(tokens(gamma) / (gamma * cost + 1) for gamma in GAMMAS)
