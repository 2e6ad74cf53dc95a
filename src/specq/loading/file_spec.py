"""`@gguf` and its options: a GGUF file at its own precision, made cheaper to run as a draft.

    gguf[-int4][-head{N}k][-keep{N}]

* `int4`: the file's 5- to 8-bit weight tensors (Q5_0, Q8_0, Q6_K, ...) requantized by specq's RTN
  to 4-bit codes in groups of 32, each group's scale and offset an int8 multiple of a float per row
  (`rtn.quantize_two_level`: 4.6 bits a weight, where Q4_1's float pair per group costs 6), from
  their exact dequantized values, the head (output layer) included; 4-bit tensors and the token
  embedding stay the file's. Why: the kernels run 5- and 6-bit codes at 6.25 bits and 8-bit ones as
  bytes, so a 4-bit body reads fewer. Each row is requantized on its own, so a narrowed head's rows
  are those of the whole 4-bit head.
  Requantizing takes tens of seconds, so the result is saved once under `$SPECQ_CACHE/gguf-int4/`
  (keyed by the file and the kernel variant whose layout it holds); a later load puts it in place
  of those tensors, which it then neither reads nor repacks.
* `head{N}k`: the output layer keeps only the N * 1024 tokens a ranked list puts first, plus the
  file's special tokens, its rows exactly the file's (`weights.narrow_head`): drafts only, since a
  dropped token is never proposed (acceptance may drop, correctness cannot). The list is the one
  in `assets/heads/` made for the file's vocabulary (the sha256 of its token strings).
* `keep{N}`: only N of the file's L decoder layers run, the first and the last always among them,
  the L - N dropped spread evenly over the ones between (`kept_layers`): drafts only, a smaller
  draft made from the same file with no training (layer-skipping self-speculation, as Draft &
  Verify and SWIFT do with the target's own layers). Its cost falls with the layers; how much
  agreement it keeps is for the bench to say.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import caches
from ..errors import SpecqError
from ..kernels import build, int8dot
from ..paths import cache_dir, file_key
from ..weights.gguf_formats import FORMATS, kernel_weight
from ..weights.narrow_head import NarrowHead
from ..weights.quant.checkpoint import read_safetensors
from ..weights.quant.modules import FileBlocks
from ..weights.quant.rtn import quantize_two_level
from .drafts.adapter import Adapter, delta, merge_float, native_weights
from .formats.gguf_io import GGUFFile

FILE_PRECISION = "gguf"
FORM = ("gguf[-int4][-head{N}k][-keep{N}] (e.g. gguf, gguf-int4, gguf-head32k, gguf-int4-head32k, "
        "gguf-int4-keep18)")
# src/specq/assets/heads: <name>.npy + <name>.json
HEADS = Path(__file__).parents[1] / "assets" / "heads"
INT4_GROUP = 32
INT4_FORM = 3  # in the cache's key: raise it when `to_int4` changes what it makes
# GGUF token types a narrowed head always keeps: unknown, control, user-defined, byte
# (not normal, unused)
SPECIAL_TOKEN_TYPES = (2, 3, 4, 6)


@dataclass(frozen=True)
class FileSpec:
    int4: bool = False  # 5- to 8-bit tensors requantized to 4 bits
    head_tokens: int | None = None  # ranked tokens the head keeps; None: the whole vocabulary
    keep_layers: int | None = None  # decoder layers that run; None: all of them

    def __str__(self) -> str:
        options = ["int4" if self.int4 else "",
                   f"head{self.head_tokens // 1024}k" if self.head_tokens else "",
                   f"keep{self.keep_layers}" if self.keep_layers else ""]
        return "-".join([FILE_PRECISION] + [option for option in options if option])


def names_file(spec_text: str) -> bool:
    """Whether a precision names a GGUF file's own blocks (`gguf`, or `gguf-` with options)."""
    return spec_text == FILE_PRECISION or spec_text.startswith(FILE_PRECISION + "-")


def parse(spec_text: str) -> FileSpec:
    """`gguf[-int4][-head{N}k][-keep{N}]` (options in any order) -> FileSpec;
    anything else one line.
    Whether the file has N layers is for `apply` to check."""
    head, *options = spec_text.strip().lower().split("-")
    if head != FILE_PRECISION:
        raise SpecqError(f"'{spec_text}' is not a GGUF file precision: {FORM}")
    int4, tokens, layers = False, None, None
    for option in options:
        m, k = re.fullmatch(r"head(\d+)k", option), re.fullmatch(r"keep(\d+)", option)
        if option == "int4" and not int4:
            int4 = True
        elif m and tokens is None and 1 <= int(m.group(1)) <= 1024:
            tokens = int(m.group(1)) * 1024
        elif k and layers is None and int(k.group(1)) >= 2:
            layers = int(k.group(1))
        else:
            raise SpecqError(f"bad GGUF file precision '{spec_text}' (at '{option}'): {FORM}")
    return FileSpec(int4, tokens, layers)


def vocabulary_digest(tokenizer) -> str:
    """sha256 of a tokenizer's token strings in id order: which ranked list fits a file."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()


def ranked_tokens(tokenizer) -> np.ndarray:
    """The ranked token ids (most useful first) of the list made for this tokenizer's vocabulary."""
    digest = vocabulary_digest(tokenizer)
    for meta in sorted(HEADS.glob("*.json")):
        if json.loads(meta.read_text()).get("vocabulary_sha256") == digest:
            return np.load(meta.with_suffix(".npy"))
    raise SpecqError(f"no ranked token list for this file's vocabulary in {HEADS} (`-head{{N}}k` "
                     "needs one; benchmarks/coder_head_tokens.py at commit 4a89039 built the "
                     "Qwen2.5-Coder list)")


def kept_tokens(g: GGUFFile, tokenizer, count: int) -> torch.Tensor:
    """The `count` first ranked tokens and the file's special tokens (and EOS), sorted."""
    ranked = ranked_tokens(tokenizer)
    if count > ranked.size:
        raise SpecqError(f"a head of {count // 1024}k tokens: the ranked list holds only "
                         f"{ranked.size} tokens")
    types = ((g.header.fields.get("tokenizer.ggml.token_type") if g.header is not None else None)
             or [])
    special = [i for i, t in enumerate(types) if t in SPECIAL_TOKEN_TYPES]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = np.unique(np.concatenate([ranked[:count], np.array(special + eos, dtype=ranked.dtype)]))
    return torch.from_numpy(ids[ids < g.config.vocab_size].astype(np.int64))


def narrowed_head(g: GGUFFile, keep: torch.Tensor, whole: FileBlocks | None = None) -> NarrowHead:
    """The file's head (its output tensor, or the tied token embedding) over the rows of `keep`,
    each row the file's bytes as they are (the same blocks on the int8-activation kernel), or with
    `whole` (the network's 4-bit head after `int4`) that head's rows as they are: requantizing is
    row by row, so they are what requantizing the kept rows would make, without doing it again."""
    name = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    fmt, rows = FORMATS.get(g.qtype(name)), keep.numpy()
    if whole is not None:
        head = FileBlocks(int8dot.take_rows(whole._blocks, keep), whole.kind)
    elif fmt is not None and fmt.kernel is not None:
        head = FileBlocks(
            kernel_weight([(g.qtype(name), np.ascontiguousarray(np.asarray(g.raw(name))[rows]))]),
            fmt.name)
    else:
        head = nn.Linear(g.config.hidden_size, rows.size, bias=False)
        head.weight = nn.Parameter(g.float_tensor(name)[keep], requires_grad=False)
    return NarrowHead(head, keep, g.config.vocab_size)


def to_int4(blocks: FileBlocks, delta: torch.Tensor | None = None) -> FileBlocks:
    """A file's blocks as 4-bit RTN codes (groups of 32, two-level scale and offset) of their exact
    dequantized weights, plus `delta` [out, in] where an adapter changes them (`adapter.py`)."""
    weight = int8dot.dequantize(blocks._blocks)
    q = quantize_two_level(weight if delta is None else weight + delta, 4, INT4_GROUP)
    return FileBlocks(int8dot.pack_int4_two_level(*q, int8dot.ROW_SHIFT, blocks._blocks.variant),
                      f"{blocks.kind}{' + adapter' if delta is not None else ''} as int4")


def int4_cache(g: GGUFFile, variant: str, adapter: str | None = None) -> Path:
    """Where the 4-bit body of `g`, laid out for kernel `variant` (with the adapter of sha256
    `adapter` merged), is kept."""
    merged = f"-lora{adapter[:16]}" if adapter else ""
    return cache_dir() / "gguf-int4" / (f"{file_key(g.path)}"
                                        f"{merged}-{variant}-form{INT4_FORM}.safetensors")


def cached_int4_body(g: GGUFFile, spec: FileSpec,
                     adapter: str | None = None) -> dict[str, FileBlocks]:
    """The 4-bit modules `int4_body` saved for `g` (by module name, `layers.0.attention.wqkv`), for
    the loader to put in place of the file's tensors without repacking those first; {} unless
    `spec` asks for a 4-bit body and the cache holds a readable one (for the adapter of sha256
    `adapter`, when one is merged) as it was written (`caches`: a damaged one is made again)."""
    from safetensors import safe_open

    variant = build.variant()
    path = int4_cache(g, variant, adapter)
    if not spec.int4 or not caches.usable(path):
        return {}
    try:
        with safe_open(path, "pt") as f:
            shapes = json.loads(f.metadata()["modules"])
        tensors = read_safetensors(path)
        return {name: FileBlocks(int8dot.Int8DotWeight(4, tensors[f"{name}.codes"],
                                                       tensors[f"{name}.d"], tensors[f"{name}.m"],
                                                       INT4_GROUP, out, n_in, variant,
                                                       tensors[f"{name}.sub"], int8dot.ROW_SHIFT),
                                 kind)
                for name, (out, n_in, kind) in shapes.items()}
    except Exception:
        # safetensors' own error type varies by version; a broken cache is simply remade
        return {}


def int4_body(net: nn.Module, g: GGUFFile, merged: Adapter | None = None,
              changed: dict[str, tuple[str, ...]] | None = None) -> None:
    """Replace the 5- to 8-bit `FileBlocks` of `net` by `to_int4`'s, in place, and save them for
    `cached_int4_body` (one file per GGUF file, adapter and kernel variant, written whole). With an
    adapter, every block it `changed` (`adapter.native_weights`) is requantized with its product
    added, whatever its bits."""
    from safetensors.torch import save

    changed = changed or {}
    chosen = {name: m for name, m in net.named_modules() if isinstance(m, FileBlocks)
              and (m.bits > 4 or name in changed)
              and (name.startswith("layers.") or name == "output")}
    if not chosen:
        return
    path = int4_cache(g, next(iter(chosen.values()))._blocks.variant,
                      merged.digest if merged else None)
    what = (f"{g.path.name} with the adapter {merged.path.name} merged"
            if merged else f"{g.path.name}'s 5- to 8-bit tensors")
    print(f"specq: requantizing {what} to 4 bits into {path.parent} (once, under a minute)",
          file=sys.stderr, flush=True)
    made = {name: to_int4(module, delta(merged, changed[name], net.config)
                          if name in changed else None)
            for name, module in chosen.items()}
    for name, module in made.items():
        net.set_submodule(name, module)
    tensors = {f"{name}.{part}": getattr(m._blocks, part).contiguous() for name, m in made.items()
               for part in ("codes", "d", "m", "sub")}
    shapes = {name: (m.out_features, m.in_features, m.kind) for name, m in made.items()}
    caches.write_file(path,
                      lambda f: f.write(save(tensors, metadata={"modules": json.dumps(shapes)})))


def kept_layers(total: int, keep: int) -> list[int]:
    """The `keep` of `total` layers that run: the first and the last, and of those between all but
    total - keep spread evenly over them."""
    inner = list(range(1, total - 1))
    step = len(inner) / (total - keep) if keep < total else 0
    dropped = {inner[int((i + 0.5) * step)] for i in range(total - keep)}
    return [i for i in range(total) if i not in dropped]


def keep_layers(net: nn.Module, keep: int, name: str) -> None:
    """Only the `kept_layers` of `net` stay, in order, each with its own window and rope."""
    total = len(net.layers)
    if not 2 <= keep < total:
        raise SpecqError(f"{name}: keep{keep} needs 2 to {total - 1} of its {total} layers")
    kept = kept_layers(total, keep)
    net.layers = nn.ModuleList(net.layers[i] for i in kept)
    sliding = tuple(new for new, old in enumerate(kept) if old in net.config.sliding_layers)
    net.config = replace(net.config, num_layers=keep, sliding_layers=sliding)


def apply(net: nn.Module, g: GGUFFile, spec: FileSpec, tokenizer, merged: Adapter | None = None,
          cached: bool = False) -> None:
    """Put the options of `spec` on a network `gguf_io.load_at_file_precision` built, in place
    (before a backend is chosen), with an adapter merged into its 4-bit body unless `cached` (the
    body came from the cache, merged; `refs.check_adapter_precision` says which specs can hold a
    merge). The 4-bit body is made (and cached) whole, then layers dropped."""
    changed = {} if merged is None else native_weights(merged, net)
    if changed:  # a file's float tensors take their products as they are
        merge_float(net, merged, {n: hf for n, hf in changed.items()
                                  if not isinstance(net.get_submodule(n), FileBlocks)})
    if spec.int4 and not cached:
        int4_body(net, g, merged, changed)
    if spec.head_tokens:
        whole = (net.output if spec.int4 and isinstance(net.output, FileBlocks)
                 and net.output.bits == 4 else None)
        net.output = narrowed_head(g, kept_tokens(g, tokenizer, spec.head_tokens), whole)
    if spec.keep_layers:
        keep_layers(net, spec.keep_layers, g.path.name)
