"""Distil a small draft model from a target, for speculative decoding.

The target's next-token distributions are computed once and stored as top-k log-probs (plus
the implied tail mass): on a CPU a 135M-parameter teacher forward costs about twice a
16M-parameter student's forward+backward, so recomputing it every epoch would triple training
time. Continuations the target writes itself come with their distributions for free
(`output_logits` of `generate`).

Losses on the (top-k + tail) coarse-grained distributions p (target) and q (draft):
forward KL(p || q), and total variation 0.5 * sum |p - q| = 1 - sum min(p, q), which is
exactly one minus the expected acceptance rate of a drafted token.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from .. import atomic
from ..core.prompt import answer_ids
from ..model.llama import Llama, LlamaConfig, hf_to_native_state_dict, native_to_hf_state_dict

TOP_K = 64


@dataclass
class TeacherSet:
    """Token sequences with the target's top-k next-token log-probs.

    Record i: `ids[i]` (int64 [n]); `top_ids[i]`/`top_logp[i]` ([m, k], int32/float16) are the
    target's distributions after positions start[i] .. start[i] + m - 1 of `ids[i]`.
    """

    ids: list[Tensor]
    start: list[int]
    top_ids: list[Tensor]
    top_logp: list[Tensor]
    # the target's hidden states [n, H], for feature drafts
    features: list[Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def __add__(self, other: "TeacherSet") -> "TeacherSet":
        if len(self) and len(other) and bool(self.features) != bool(other.features):
            raise ValueError("cannot join teacher sets with and without target features")
        return TeacherSet(self.ids + other.ids, self.start + other.start,
                          self.top_ids + other.top_ids, self.top_logp + other.top_logp,
                          self.features + other.features)

    @torch.inference_mode()
    def with_features(self, target: Llama) -> "TeacherSet":
        """The same records with the target's final hidden states at every position."""
        feats = [target.hidden_states(ids).to(torch.float16)
                 for ids in tqdm(self.ids, desc="target features")]
        return TeacherSet(self.ids, self.start, self.top_ids, self.top_logp, feats)

    def positions(self) -> int:
        return sum(t.shape[0] for t in self.top_ids)

    def save(self, path: Path | str) -> None:
        atomic_save(self.__dict__, path)

    @classmethod
    def load(cls, path: Path | str) -> "TeacherSet":
        return cls(**torch.load(path, weights_only=True))


def atomic_save(obj, path: Path | str) -> None:
    """torch.save, never half-written (see `specq.atomic`)."""
    atomic.write_file(path, lambda f: torch.save(obj, f))


def _topk(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    values, idx = torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    return idx.to(torch.int32), values.to(torch.float16)


# ------------------------------------------------------------------------------ teacher data


def chunk_tokens(tokenizer, texts: list[str], seq_len: int) -> list[Tensor]:
    """Tokenize the texts and cut each into consecutive windows of `seq_len` tokens."""
    out = []
    for text in texts:
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        out.extend(ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len))
    return out


@torch.no_grad()
def teacher_on_text(target_hf, sequences: list[Tensor], k: int = TOP_K,
                    batch: int = 8) -> TeacherSet:
    """The target's top-k distributions at every position of equal-length token windows."""
    data = TeacherSet([], [], [], [])
    for i in tqdm(range(0, len(sequences), batch), desc="teacher on text", unit="batch"):
        ids = torch.stack(sequences[i:i + batch])
        top_ids, top_logp = _topk(target_hf(ids).logits, k)
        for j in range(ids.shape[0]):
            data += TeacherSet([ids[j]], [0], [top_ids[j]], [top_logp[j]])
    return data


@torch.no_grad()
def teacher_continuations(target_hf, tokenizer, prompts: list[str], *, max_new_tokens: int = 192,
                          temperature: float = 0.0, k: int = TOP_K, batch: int = 16,
                          seed: int = 0, progress: bool = True) -> TeacherSet:
    """Let the target answer chat prompts (greedy, or sampled at `temperature`), keeping its
    raw next-token distribution at every generated position: the draft learns on the target's
    own outputs, which is what it will be asked to predict."""
    torch.manual_seed(seed)
    # masked
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    eos_ids = target_hf.generation_config.eos_token_id
    eos = set(eos_ids if isinstance(eos_ids, list) else [eos_ids]) | {tokenizer.eos_token_id}
    data = TeacherSet([], [], [], [])
    for i in tqdm(range(0, len(prompts), batch), desc=f"continuations T={temperature}",
                  unit="batch", disable=not progress):
        encoded = [answer_ids(tokenizer, p) for p in prompts[i:i + batch]]
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # left padding
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                    if temperature > 0
                    else {"do_sample": False})
        out = target_hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, output_logits=True, return_dict_in_generate=True,
                                 **sampling)
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # [b, steps, vocab], raw (before temperature)
        for j, prompt_ids in enumerate(encoded):
            toks = new[j].tolist()
            n = next((t + 1 for t, tok in enumerate(toks) if tok in eos), len(toks))
            top_ids, top_logp = _topk(logits[j, :n], k)
            data += TeacherSet([torch.tensor(prompt_ids + toks[:n])], [len(prompt_ids) - 1],
                               [top_ids], [top_logp])
    return data


def float_teacher(net: torch.nn.Module):
    """The target as a float transformers model, for batched teacher passes (`generate` with
    padding). Quantized layers are dequantized: the same weight values, so the distributions
    differ from the packed kernels' only by activation rounding (bf16 there, fp32 here)."""
    from transformers import AutoModelForCausalLM

    from ..weights.quant.modules import QuantLinear

    if not isinstance(net, Llama):
        return net.hf  # hf_backend.HFCausalLM
    sd = {name: tensor.float() for name, tensor in net.state_dict().items()}
    for name, module in net.named_modules():
        if isinstance(module, QuantLinear):
            sd = {k: v for k, v in sd.items() if not k.startswith(name + ".")}
            sd[name + ".weight"] = module.quantized().dequantize().float()
    float_net = Llama(net.config)
    # the dict's own tensors, not copies: three float copies of a 1.5B target outgrow many machines
    float_net.load_state_dict(sd, assign=True)
    del sd
    # of the target's architecture
    teacher = AutoModelForCausalLM.from_config(net.config.to_hf()).float().eval()
    missing, unexpected = teacher.load_state_dict(native_to_hf_state_dict(float_net), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"teacher conversion lost weights: {missing + unexpected}")
    return teacher


# ------------------------------------------------------------------------------ the draft


def init_draft(config: LlamaConfig, target_embedding: Tensor | None = None,
               from_dir: str | Path | None = None, seed: int = 0):
    """A new draft (a transformers LlamaForCausalLM, for batched training), randomly
    initialised, or from an existing draft directory. With `target_embedding`, the embedding
    (tied to the output head) starts as the PCA projection of the target's: tokens the target
    treats alike start alike, which the draft would otherwise spend many steps learning."""
    from transformers import LlamaForCausalLM

    if from_dir is not None:
        return LlamaForCausalLM.from_pretrained(from_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config.to_hf()).float()
    if target_embedding is not None:
        model.get_input_embeddings().weight.data.copy_(pca_embedding(target_embedding,
                                                                     config.hidden_size))
    return model


def pca_embedding(embedding: Tensor, width: int) -> Tensor:
    """Project [vocab, d] onto its top `width` principal directions, rescaled to the same
    per-coordinate spread the rows had."""
    e = embedding.float()
    centered = e - e.mean(0)
    _, _, v = torch.linalg.svd(centered, full_matrices=False)
    projected = centered @ v[:width].T
    return projected * (e.std() / projected.std())


def to_native(draft_hf, dtype: torch.dtype = torch.float32) -> Llama:
    """The trained draft as specq's native module (for speculative decoding and saving)."""
    config = LlamaConfig.from_hf(draft_hf.config)
    net = Llama(config)
    net.load_state_dict(hf_to_native_state_dict(draft_hf.state_dict(), config))
    return net.to(dtype).eval()


# ------------------------------------------------------------------------------ losses


def _batch(data: TeacherSet, rows: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Right-padded ids, the flat (row * width + position) index of every teacher position, and
    the matching teacher top-k ids and log-probs."""
    width = max(data.ids[r].shape[0] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    flat = []
    for b, r in enumerate(rows):
        ids[b, :data.ids[r].shape[0]] = data.ids[r]
        m = data.top_ids[r].shape[0]
        flat.append(b * width + data.start[r] + torch.arange(m))
    top_ids = torch.cat([data.top_ids[r] for r in rows]).long()
    # float16 on disk: cat in float (autocast refuses half)
    top_logp = torch.cat([data.top_logp[r].float() for r in rows])
    return ids, torch.cat(flat), top_ids, top_logp


def sequence_forward(draft_hf, data: TeacherSet,
                     rows: list[int]) -> tuple[dict[str, Tensor], Tensor]:
    """A classic draft's per-position divergences on `rows` of `data` (and no extra loss)."""
    ids, flat, top_ids, top_logp = _batch(data, rows)
    hidden = draft_hf.model(input_ids=ids).last_hidden_state
    # only the teacher positions: the head dominates
    hidden = hidden.reshape(-1, hidden.shape[-1])[flat]
    logq = torch.log_softmax(draft_hf.lm_head(hidden).float(), dim=-1)
    return (divergences(logq.gather(-1, top_ids), logq.argmax(-1), top_ids, top_logp),
            logq.new_zeros(()))


# uniform input-feature noise in training, as a fraction of the features' std (EAGLE)
FEATURE_NOISE = 0.1
# smooth-L1 regression of the predicted next feature, next to the KL/TV loss
FEATURE_LOSS_WEIGHT = 1.0
# Training unrolls this many draft steps (training-time test): decoding feeds every step after the
# first with the draft's own feature, so later steps are trained on exactly that input. Step k's
# mean loss is weighted FEATURE_STEP_DECAY ** k (EAGLE-3), so the first step learns as without it.
FEATURE_UNROLL = 3
FEATURE_STEP_DECAY = 0.8


def feature_forward(draft, data: TeacherSet, rows: list[int]) -> tuple[dict[str, Tensor], Tensor]:
    """A feature draft's per-position divergences: at step k (from 0), row r reads x_{r+k+1}
    (and f_r, or its own step k-1 feature) and is scored on the target's distribution after
    position r + k + 1; the extra loss regresses f_{r+k+1}. Training unrolls FEATURE_UNROLL
    steps (the divergences carry each position's loss weight); evaluation scores the first step."""
    width = max(data.ids[r].shape[0] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    feats = torch.zeros(len(rows), width, draft.config.hidden_size)
    for b, r in enumerate(rows):
        n = data.ids[r].shape[0]
        ids[b, :n], feats[b, :n] = data.ids[r], data.features[r].float()
    inputs = feats[:, :-1]
    if draft.training and FEATURE_NOISE:
        inputs = (inputs
                  + (torch.rand_like(inputs) - 0.5) * (2 * FEATURE_NOISE * float(inputs.std())))
    steps = FEATURE_UNROLL if draft.training else 1
    parts, regression = [], inputs.new_zeros(())
    for k, hidden in enumerate(draft.unrolled(ids, inputs, steps)):
        flat, tops, logps = [], [], []
        for b, r in enumerate(rows):
            skip = max(0, k + 1 - data.start[r])  # teacher positions with a row k + 1 before them
            m = data.top_ids[r].shape[0]
            flat.append(b * (width - 1) + data.start[r] + torch.arange(skip, m) - k - 1)
            tops.append(data.top_ids[r][skip:])
            logps.append(data.top_logp[r][skip:])
        flat, top_ids, top_logp = (torch.cat(flat), torch.cat(tops).long(),
                                   torch.cat([p.float() for p in logps]))
        predicted = hidden.reshape(-1, hidden.shape[-1])[flat]
        logq = torch.log_softmax(draft.body.output(predicted).float(), dim=-1)
        where = draft.subset_index(top_ids)  # -1 for tokens outside the head's vocabulary
        logq_top = logq.gather(-1, where.clamp_min(0)).masked_fill(where < 0, float("-inf"))
        d = divergences(logq_top, draft.vocab_ids[logq.argmax(-1)], top_ids, top_logp)
        decay = FEATURE_STEP_DECAY ** k
        parts.append(d | {"weight": torch.full_like(d["kl"], decay / len(flat))})
        # f_{r+k+1}
        true_next = torch.nn.functional.pad(feats[:, k + 1:], (0, 0, 0, k)).reshape(-1,
                                                                                    feats.shape[-1])
        regression = regression + decay * torch.nn.functional.smooth_l1_loss(predicted,
                                                                             true_next[flat])
    return ({key: torch.cat([d[key] for d in parts]) for key in parts[0]},
            FEATURE_LOSS_WEIGHT * regression)


def divergences(logq_top: Tensor, draft_top1: Tensor, top_ids: Tensor,
                top_logp: Tensor) -> dict[str, Tensor]:
    """Per-position KL(p||q), TV(p, q) on the top-k + tail partition; beta as sum over the
    top-k of min(p, q) (a lower bound of the true acceptance); top-1 agreement. `logq_top` is
    the draft's log-prob of each of the target's top-k tokens, `draft_top1` the draft's argmax."""
    p = top_logp.exp()
    q = logq_top.exp()
    p_tail = (1 - p.sum(-1)).clamp_min(0)
    q_tail = (1 - q.sum(-1)).clamp_min(1e-8)
    kl = ((p * (top_logp - logq_top.clamp_min(-14.0))).sum(-1) + torch.xlogy(p_tail, p_tail)
          - p_tail * q_tail.log())
    tv = 0.5 * ((p - q).abs().sum(-1) + (p_tail - q_tail).abs())
    beta = torch.minimum(p, q).sum(-1)
    top1 = (draft_top1 == top_ids[:, 0]).float()
    return {"kl": kl, "tv": tv, "beta": beta, "top1": top1}


def tv_weight(loss: str) -> float:
    """'kl' -> 0, 'tv' -> 1, 'mix:W' -> W (the loss is (1 - W) * KL + W * TV)."""
    if loss == "kl":
        return 0.0
    if loss == "tv":
        return 1.0
    if loss.startswith("mix:"):
        w = float(loss[4:])
        if 0 <= w <= 1:
            return w
    raise ValueError(f"loss must be 'kl', 'tv' or 'mix:W' with 0 <= W <= 1, got {loss!r}")


COMPUTE = ("fp32", "bf16")  # what a training step's matrix products run in (`distill`)


def autocast(forward, compute: str):
    """`forward` run under CPU autocast to bfloat16 ("bf16"), or as it is ("fp32")."""
    if compute not in COMPUTE:
        raise ValueError(f"compute must be one of {COMPUTE}, got {compute!r}")
    if compute == "fp32":
        return forward
    # RMSNorm's float32 weight on bf16 activations takes torch's unfused path, which
    # warns: expected here
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")

    def bf16_forward(student, data, rows):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            d, extra = forward(student, data, rows)
        return {k: v.float() for k, v in d.items()}, extra.float()

    return bf16_forward


@torch.no_grad()
def evaluate(student, data: TeacherSet, batch: int = 8,
             forward=sequence_forward) -> dict[str, float]:
    """Position-weighted mean KL, TV, beta and top-1 agreement on `data`."""
    was_training = student.training
    student.eval()
    sums, n = {}, 0
    for i in range(0, len(data), batch):
        d, _ = forward(student, data, list(range(i, min(i + batch, len(data)))))
        d.pop("weight", None)
        for key, v in d.items():
            sums[key] = sums.get(key, 0.0) + v.sum().item()
        n += len(d["kl"])
    student.train(was_training)
    return {key: v / n for key, v in sums.items()}


# ------------------------------------------------------------------------------ training


def _lr_at(progress: float, lr: float, warmup: float = 0.03) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if progress < warmup:
        return lr * progress / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003
                                                                     + epoch)).tolist()


def distill(draft_hf, train: TeacherSet, held_out: TeacherSet, *, steps: int,
            time_budget_s: float | None = None, loss: str = "kl", lr: float = 2e-3, batch: int = 8,
            checkpoint_dir: Path | str | None = None, checkpoint_every: int = 100,
            resume: bool = True, eval_every: int = 200, seed: int = 0, progress: bool = True,
            forward=sequence_forward, groups: list[dict] | None = None,
            compute: str = "fp32") -> dict:
    """Train `draft_hf` towards the target distributions in `train`; return the final held-out
    metrics and the history. `forward(student, data, rows) -> (divergences, extra loss)` says
    how a kind of draft is run on a batch (`sequence_forward`, `feature_forward`); the
    divergences may carry a per-position loss `weight` (else the loss is their mean).

    The learning-rate schedule follows max(step / steps, elapsed / time_budget_s), so a run cut
    short by its time budget still ends with a decayed rate; without a budget a run (and any
    resumed run) is exactly reproducible. Checkpoints (model, optimizer, step, data position,
    RNG state, history) go to `checkpoint_dir/last.pt` every `checkpoint_every` steps.
    `groups`: optimizer parameter groups (default: every parameter), each with an optional
    `lr_scale` on the schedule's rate (parameters of different units, e.g. `qad.py`'s codes).
    `compute` "bf16": forwards and backwards under CPU autocast to bfloat16 (weights and optimizer
    stay float32): faster where the CPU has AVX-512 BF16 instructions, slower where it has not.
    """
    forward = autocast(forward, compute)
    w = tv_weight(loss)
    optimizer = torch.optim.AdamW(groups or draft_hf.parameters(), lr=lr, betas=(0.9, 0.98),
                                  weight_decay=0.01)
    state = {"step": 0, "epoch": 0, "pos": 0, "elapsed": 0.0, "history": []}
    ckpt = Path(checkpoint_dir) / "last.pt" if checkpoint_dir is not None else None
    if checkpoint_dir is not None:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    if resume and ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        draft_hf.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]

    def save() -> None:
        if ckpt is not None:
            atomic_save({"model": draft_hf.state_dict(), "optimizer": optimizer.state_dict(),
                         "torch_rng": torch.get_rng_state(), "state": state,
                         "loss": loss, "lr": lr, "batch": batch, "seed": seed}, ckpt)

    def log(entry: dict) -> None:
        state["history"].append(entry)
        if checkpoint_dir is not None:
            with open(Path(checkpoint_dir) / "history.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")

    draft_hf.train()
    order = _order(len(train), seed, state["epoch"])
    bar = tqdm(total=steps, initial=state["step"], disable=not progress, unit="step",
               desc="distill")
    started = time.perf_counter() - state["elapsed"]
    shown: dict[str, str] = {}
    while state["step"] < steps:
        state["elapsed"] = time.perf_counter() - started
        done = state["step"] / steps
        if time_budget_s is not None:
            if state["elapsed"] >= time_budget_s:
                break
            done = max(done, state["elapsed"] / time_budget_s)
        rows = []
        while len(rows) < batch:
            if state["pos"] >= len(order):
                state["epoch"], state["pos"] = state["epoch"] + 1, 0
                order = _order(len(train), seed, state["epoch"])
            rows.append(order[state["pos"]])
            state["pos"] += 1
        d, extra = forward(draft_hf, train, rows)
        per_position = (1 - w) * d["kl"] + w * d["tv"]
        weight = d.pop("weight", None)  # a forward may weight positions (unrolled feature steps)
        value = (per_position.mean() if weight is None else (per_position * weight).sum()) + extra
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(draft_hf.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(done, lr) * group.get("lr_scale", 1.0)
        optimizer.step()
        state["step"] += 1
        bar.update(1)
        shown.update(loss=f"{value.item():.3f}", train_beta=f"{d['beta'].mean().item():.3f}")
        if eval_every and state["step"] % eval_every == 0:
            metrics = evaluate(draft_hf, held_out, forward=forward)
            log({"step": state["step"], "elapsed_s": round(time.perf_counter() - started, 1),
                 "loss": value.item(), **{f"held_out_{k}": v for k, v in metrics.items()}})
            shown.update(beta=f"{metrics['beta']:.3f}", top1=f"{metrics['top1']:.3f}")
        bar.set_postfix(shown, refresh=False)
        if state["step"] % checkpoint_every == 0:
            state["elapsed"] = time.perf_counter() - started
            save()
    bar.close()
    state["elapsed"] = time.perf_counter() - started
    final = evaluate(draft_hf, held_out, forward=forward)
    log({"step": state["step"], "elapsed_s": round(state["elapsed"], 1), "final": True,
         **{f"held_out_{k}": v for k, v in final.items()}})
    save()
    return {"held_out": final, "steps": state["step"], "elapsed_s": state["elapsed"],
            "history": state["history"]}
