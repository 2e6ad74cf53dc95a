"""A feature draft (EAGLE style): a small head that reads the target's own hidden states.

Why: a standalone draft must learn language from scratch, and a small one agrees with its target on
few tokens (docs/drafts.md at 4a89039). The target's final hidden state at position r (the input of
its output head) already encodes what it expects next, so predicting the *next* hidden state from it
is a far easier job for one decoder layer (Li et al. 2024, EAGLE).

Row r of the draft reads [embedding of token x_{r+1}, target feature f_r] and predicts f_{r+1};
the output head turns that into the distribution of x_{r+2}. For a second draft token the
draft's own predicted feature stands in for the target's.

The head covers a vocabulary subset (the tokens the target writes most; FR-Spec, Zhao et al.
2025): on a 49k vocabulary the full head would cost more than the layer. Tokens outside it are
never drafted, which costs acceptance, never correctness. The token embedding is the target's
(shared at load time, not stored).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import atomic
from ..errors import SpecqError
from ..kernels import int8dot
from ..weights.quant.modules import FileBlocks
from .llama import EAGER, Execution, KVCache, Llama, LlamaConfig, Prior, Segment, visibility

KIND = "specq-feature-draft"
CONFIG_FILE = "feature_draft.json"
WEIGHTS_FILE = "feature_draft.safetensors"


class FeatureDraft(nn.Module):
    def __init__(self, config: LlamaConfig, vocab_ids: Tensor, target_vocab_size: int):
        super().__init__()
        if config.vocab_size != vocab_ids.numel():
            raise ValueError("config.vocab_size must equal the number of head tokens")
        self.config = config
        self.target_vocab_size = target_vocab_size
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.body = Llama(config)  # its (tied) embedding table is the subset head
        self.register_buffer("vocab_ids", vocab_ids.long())
        index = torch.full((target_vocab_size,), -1, dtype=torch.long)
        index[vocab_ids.long()] = torch.arange(vocab_ids.numel())
        self.register_buffer("_subset_index", index, persistent=False)
        self._embedding: tuple[nn.Module, ...] = ()  # the target's token embedding, see attach

    def attach(self, target: Llama) -> "FeatureDraft":
        """Share the target's token embedding (and check the shapes fit that target). The target's
        module is called, not copied: a GGUF file's embedding stays in the file's format."""
        embedding = target.tok_embeddings
        shape = (embedding.num_embeddings, embedding.embedding_dim)
        if shape != (self.target_vocab_size, self.config.hidden_size):
            raise SpecqError("this feature draft was made for a target with vocabulary "
                             f"{self.target_vocab_size} and hidden size {self.config.hidden_size}, "
                             f"not {shape}")
        self._embedding = (embedding,)  # a tuple: not a submodule (never saved, never trained)
        return self

    def embed(self, ids: Tensor) -> Tensor:
        """The target's embedding of `ids` [...] -> [..., hidden] in the draft's
        dtype (no gradient)."""
        with torch.no_grad():
            return self._embedding[0](ids).to(self.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.body.dtype  # the norms' (linear layers may be quantized)

    def new_cache(self, capacity: int) -> KVCache:
        self.body._ensure_rope(capacity)
        return KVCache(self.config, capacity, self.dtype)

    def forward(self, ids: Tensor, features: Tensor, cache: KVCache | None = None,
                positions: Tensor | None = None, mask: Tensor | None = None,
                ex: Execution = EAGER) -> tuple[Tensor, Tensor]:
        """Rows (ids[i], features[i]) -> (head logits over the subset [.., n, V_sub] (float),
        predicted next features [.., n, hidden]). 1-D ids with a cache (decoding), or [B, n]
        without one (training, from position 0). `positions` and `mask`: a token tree's rows, as
        in `Llama.forward`. `ex`: how the pass runs (`Execution`; default torch's ops)."""
        x = ex.linear(self.fc, torch.cat([self.embed(ids), features.to(self.dtype)], dim=-1))
        batched = x.dim() == 3
        x = x if batched else x.unsqueeze(0)
        n = x.shape[1]
        start = cache.length if cache is not None else 0
        body = self.body
        body._ensure_rope(start + n)
        rope = slice(start, start + n) if positions is None else positions
        cos, sin = body.rope_cos[rope], body.rope_sin[rope]
        kv = None if cache is None else [Segment(cache, slice(0, n), visibility(cache, n, mask))]
        x = body.decoder_pass(x, cos, sin, kv, ex=ex)
        if cache is not None:
            cache.length = start + n
        hidden = body.norm(x)
        logits = ex.linear(body.output, hidden).float()
        return (logits, hidden) if batched else (logits[0], hidden[0])

    def unrolled(self, ids: Tensor, features: Tensor, steps: int) -> list[Tensor]:
        """Training-time test (EAGLE-3, HASS): the draft's predicted features after each of
        `steps` draft steps from every row at once, as decoding would compute them.

        ids [B, W] are whole token sequences, features [B, W-1, H] the target's f_0 .. f_{W-2}.
        Step k (from 0) at row j reads token x_{j+k+1} and, for k > 0, its own step k-1 output of
        row j, at position j + k. It attends to the true rows 0..j of step 0 and to row j of
        steps 1..k, exactly the cache a proposal sees when the target's features end at f_j.
        Returns one [B, W-1, H] tensor per step (rows past a sequence's end are garbage)."""
        rows = features.shape[1]
        body = self.body
        body._ensure_rope(rows + steps)
        causal = torch.ones(rows, rows, dtype=torch.bool).tril_()
        diagonal = torch.eye(rows, dtype=torch.bool)
        keys: list[list[Tensor]] = [[] for _ in body.layers]
        values: list[list[Tensor]] = [[] for _ in body.layers]
        out = []
        for k in range(steps):
            tokens = F.pad(ids[:, k + 1:], (0, k))[:, :rows]
            x = self.fc(torch.cat([self.embed(tokens), features.to(self.dtype)], dim=-1))
            rope = slice(k, k + rows)
            prior = Prior(keys, values, torch.cat([causal] + [diagonal] * k, dim=1))
            x = body.decoder_pass(x, body.rope_cos[rope], body.rope_sin[rope], prior,
                                  body._local(rope))
            features = body.norm(x)
            out.append(features)
        return out

    def subset_index(self, token_ids: Tensor) -> Tensor:
        """Each token's row in the head, or -1 if the head does not cover it."""
        return self._subset_index[token_ids]

    def full_vocab(self, logits: Tensor) -> Tensor:
        """Subset logits -> logits over the target's vocabulary (-inf outside the subset)."""
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        out[..., self.vocab_ids] = logits
        return out


def new_feature_draft(target: Llama, vocab_ids: Tensor, layers: int = 1,
                      seed: int = 0) -> FeatureDraft:
    """A fresh feature draft for `target`: random decoder layers, fc starting as [noise | I] (the
    feature passes through), final norm and head rows (the subset's) taken from the target."""
    torch.manual_seed(seed)
    c = target.config
    config = LlamaConfig(vocab_size=vocab_ids.numel(), hidden_size=c.hidden_size,
                         intermediate_size=c.intermediate_size, num_layers=layers,
                         num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                         rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                         tie_word_embeddings=True,
                         max_position_embeddings=c.max_position_embeddings)
    draft = FeatureDraft(config, vocab_ids, c.vocab_size)
    with torch.no_grad():
        h = c.hidden_size
        draft.fc.weight.copy_(torch.cat([0.1 * torch.randn(h, h) / h ** 0.5, torch.eye(h)], dim=1))
        for p in draft.body.layers.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02)
        draft.body.norm.weight.copy_(target.norm.weight.float())
        draft.body.tok_embeddings.weight.copy_(head_rows(target, vocab_ids))
    return draft.attach(target)


def head_rows(target: Llama, ids: Tensor) -> Tensor:
    """The target's output-head rows of tokens `ids`, float32 [len(ids), hidden]: a float head's
    own, a file's quantized head dequantized as its kernel computes it, else (tied, or quantized
    by specq) the token embedding's."""
    head = target.output
    if type(head) is nn.Linear:
        return head.weight.detach()[ids].float()
    if isinstance(head, FileBlocks):
        return int8dot.dequantize(head.int8dot_weight(), ids)
    return target.tok_embeddings(ids).float()


def save(draft: FeatureDraft, directory: Path | str, tokenizer, eos_ids,
         info: dict | None = None) -> None:
    """`write` atomically: `directory` is complete or untouched."""
    atomic.write_dir(Path(directory), lambda tmp: write(draft, tmp, tokenizer, eos_ids, info))


def write(draft: FeatureDraft, directory: Path, tokenizer, eos_ids,
          info: dict | None = None) -> None:
    """Write the draft (bf16 weights, no token embedding: that is the target's), its target's
    tokenizer and EOS ids into `directory`."""
    from safetensors.torch import save_file

    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
             for k, v in draft.state_dict().items()}
    # = output.weight
    state = {k: v.contiguous() for k, v in state.items() if k != "body.tok_embeddings.weight"}
    save_file(state, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    meta = {"kind": KIND, "config": asdict(draft.config),
            "target_vocab_size": draft.target_vocab_size, **(info or {})}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=1))
    tokenizer.save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(eos_ids)}))


def frequent_tokens(sequences: list[Tensor], size: int, vocab_size: int, always=(),
                    within: Tensor | None = None) -> Tensor:
    """The `size` token ids that occur most often in `sequences` (plus `always`, e.g. EOS), sorted:
    the head's vocabulary; only ids in `within` (an existing head's) when given. Ties break towards
    lower ids, so the choice is deterministic."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        counts += torch.bincount(ids.long().clamp(0, vocab_size - 1), minlength=vocab_size)
    if within is not None:
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[within.long()] = True
        counts[~allowed] = -1
        always = [t for t in always if allowed[t]]
    order = torch.argsort(-counts, stable=True)[:size]
    return torch.unique(torch.cat([order, torch.tensor(sorted(always), dtype=torch.long)]))


def restrict_head(draft: FeatureDraft, keep: Tensor) -> FeatureDraft:
    """A copy of `draft` whose head covers only the tokens `keep` (a subset of its head's; the
    rows for them are kept as they are). Why: the head is most of a draft step's cost and reads
    its weights from memory every step, so a head over the tokens the target writes most drafts
    faster; a dropped token is never drafted (costs acceptance, never correctness)."""
    keep = torch.unique(keep.long())
    rows = draft.subset_index(keep)
    if (rows < 0).any():
        raise SpecqError(f"{int((rows < 0).sum())} of the tokens to keep are not in the draft's "
                         "head")
    config = LlamaConfig(**{**asdict(draft.config), "vocab_size": keep.numel()})
    out = FeatureDraft(config, keep, draft.target_vocab_size).to(draft.dtype)
    state = {k: v for k, v in draft.state_dict().items() if k not in ("vocab_ids",
                                                                      "body.output.weight")}
    state["body.tok_embeddings.weight"] = draft.body.tok_embeddings.weight.detach()[rows]
    out.load_state_dict(state | {"vocab_ids": keep,
                                 "body.output.weight": state["body.tok_embeddings.weight"]})
    out._embedding = draft._embedding
    return out


def is_feature_draft(directory: Path | str) -> bool:
    return (Path(directory) / CONFIG_FILE).is_file()


def load(directory: Path | str, dtype: torch.dtype = torch.float32) -> FeatureDraft:
    """Load a saved feature draft (attach it to its target before use)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    try:
        meta = json.loads((directory / CONFIG_FILE).read_text())
        if meta.get("kind") != KIND:
            raise ValueError(f"kind is {meta.get('kind')!r}")
        state = load_file(directory / WEIGHTS_FILE)
        draft = FeatureDraft(LlamaConfig(**meta["config"]), state["vocab_ids"],
                             meta["target_vocab_size"])
        state["body.tok_embeddings.weight"] = state["body.output.weight"]
        draft.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as e:
        raise SpecqError(f"'{directory}' is not a readable feature draft ({e})") from None
    return draft.to(dtype).eval()
