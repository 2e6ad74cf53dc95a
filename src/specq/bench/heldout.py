"""The quality stage: each target precision against the same model at fp32 on held-out text.

Why not GSM8K alone: a 135M model solves no GSM8K problem at any precision, so exact match is 0
everywhere and cannot tell precisions apart. Perplexity and top-1 agreement with the
full-precision model move with every bit removed, and a few held-out chunks measure them in
seconds. GSM8K exact match stays in the report for targets large enough to score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from ..core.types import Model
from ..loading.refs import model_ref
from ..training import divergence
from . import store

CHUNK_LEN = 128  # tokens per held-out chunk


def reference_ref(target_ref: str) -> str:
    """The full-precision model a target precision is compared with."""
    return f"{model_ref(target_ref).name}@fp32"


def shakespeare_chunks(model: Model, n: int) -> list[list[int]]:
    """`n` chunks of the held-out Shakespeare plays (never seen by calibration or distillation)."""
    return divergence.held_out_chunks(model, n, CHUNK_LEN, n_chat=0)


def key(target_ref: str, chunks: int) -> str:
    text = json.dumps([target_ref, reference_ref(target_ref), chunks, CHUNK_LEN])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def run(target_refs: list[str], chunks: int, results: str, get: Callable[[str], tuple[Model, dict]],
        held_out: Callable[[Model, int], list[list[int]]] = shakespeare_chunks,
        resamples: int = 2000, seed: int = 0) -> None:
    """Append one quality record per target ref the store does not hold yet: perplexity of target
    and reference, and the target's divergence from the reference (top-1 agreement, KL, ...),
    each a mean with a bootstrap CI over chunks. `get` loads a ref: (model, info)."""
    done = {r["key"] for r in store.read(results) if r.get("type") == "quality"}
    for ref in target_refs:
        if key(ref, chunks) in done:
            continue
        target, target_info = get(ref)
        reference, reference_info = get(reference_ref(ref))
        result = divergence.compare(reference, target, held_out(reference, chunks),
                                    resamples=resamples, seed=seed)
        store.append(results, {"type": "quality", "key": key(ref, chunks), "target": target_info,
                               "reference": reference_info, "chunk_len": CHUNK_LEN,
                               "result": result})

