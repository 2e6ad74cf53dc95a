"""Teacher data computed on the target's own kernels, for quantized targets.

Why: `distill.float_teacher` rebuilds the target as a float transformers model for batched
`generate`; for a quantized target (a GGUF file at its own precision, specq's int4/int3/int2) that
is a float32 copy of every weight (several times the packed bytes) on transformers' slow CPU path,
with float activations where the target runs int8 ones: not quite the answers the user's target
gives. Here the target answers
with specq's own batched decoding (`core.decode.step`: the sequences' rows stacked through the
file's blocks) and one uncached pass over each whole sequence gives its top-k distributions and
its final hidden states together (a feature draft's teacher data), so nothing is computed twice.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm import tqdm

from ..core.decode import Sequence, step
from ..core.prompt import answer_ids
from ..core.sampling import SamplingConfig
from ..core.types import Model
from ..model.llama import Llama
from ..weights.quant.modules import FileBlocks, QuantLinear
from .distill import TOP_K, TeacherSet, _topk


def wanted(net: torch.nn.Module) -> bool:
    """Whether `net` runs quantized weights (a file's blocks or specq's own codes): no float
    teacher for it."""
    return isinstance(net, Llama) and any(isinstance(m, (FileBlocks, QuantLinear))
                                          for m in net.modules())


@torch.inference_mode()
def _record(net: Llama, ids: Tensor, start: int, end: int, k: int) -> TeacherSet:
    """One sequence's record: top-k after positions start .. end - 1 and the hidden states of every
    position."""
    logits, hidden = net(ids, return_hidden=True)
    top_ids, top_logp = _topk(logits[start:end], k)
    return TeacherSet([ids], [start], [top_ids], [top_logp], [hidden.to(torch.float16)])


def on_text(net: Llama, windows: list[Tensor], k: int = TOP_K) -> TeacherSet:
    """The target's top-k distributions and hidden states at every position of token windows."""
    data = TeacherSet([], [], [], [])
    for ids in tqdm(windows, desc="teacher on text (native)", unit="window"):
        data += _record(net, ids, 0, len(ids), k)  # as distill.teacher_on_text: every position
    return data


@torch.inference_mode()
def continuations(target: Model, prompts: list[str], *, max_new_tokens: int = 128,
                  temperature: float = 0.0, k: int = TOP_K, batch: int = 16,
                  seed: int = 0) -> TeacherSet:
    """The target's own answers to chat prompts (greedy, or sampled at `temperature`), `batch` at a
    time, each with its distributions after the prompt's last token and its hidden states."""
    sampling = SamplingConfig(temperature=temperature)
    data = TeacherSet([], [], [], [])
    for i in tqdm(range(0, len(prompts), batch), desc=f"native continuations T={temperature}",
                  unit="batch"):
        sequences = [Sequence(target, answer_ids(target.tokenizer, p), sampling=sampling,
                              max_new_tokens=max_new_tokens,
                              generator=torch.Generator().manual_seed(seed + i + j))
                     for j, p in enumerate(prompts[i:i + batch])]
        for s in sequences:
            s.prefill()
        while active := [s for s in sequences if not s.done]:
            step(active)
        for s in sequences:
            ids, _, _ = s.result()
            # as distill.teacher_continuations: one per new token
            whole = torch.tensor(s.prompt_ids + ids)
            data += _record(target.runner, whole, len(s.prompt_ids) - 1, len(whole) - 1, k)
    return data
