"""The peer comparison (benchmarks/bench_llamacpp.py) apart from its timing: the weights it knows,
the checks it makes before it loads anything, llama.cpp's speculative example's log, and the
tables of its results file."""

from __future__ import annotations

import importlib.util
import re
import statistics
import sys
from pathlib import Path

# --weights names -> specq's model ref of the same file (the coder pair at its own precision)
SPECQ_REFS = {"q4_1": "smollm2-135m@gguf", "f32": "smollm2-135m",
              "qwen1.5b": "qwen2.5-coder-1.5b", "qwen0.5b": "qwen2.5-coder-0.5b"}
INSTALL = ("pip install llama-cpp-python==0.3.36 (build command: docs/performance.md, "
           "'Building llama.cpp for these runs')")
# llama.cpp's speculative modes (`llama-speculative-simple` flags): draft-simple needs a draft file
LLAMA_CPP_SPECULATIVE = {
    "llama.cpp draft n-max 2": ["--spec-type", "draft-simple", "--spec-draft-n-max", "2"],
    "llama.cpp draft n-max 4": ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
    "llama.cpp draft n-max 8": ["--spec-type", "draft-simple", "--spec-draft-n-max", "8",
                                "--spec-draft-p-min", "0.6"],
    "llama.cpp ngram-simple": ["--spec-type", "ngram-simple"],
    "llama.cpp ngram-mod": ["--spec-type", "ngram-mod"],
    # the n-gram modes at specq's lookup's sizes (llama.cpp's defaults match 12 and 24 tokens,
    # which short answers rarely repeat): 3 tokens matched, up to 8 drafted
    "llama.cpp ngram-simple 3/8": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                   "--spec-ngram-simple-size-m", "8"],
    "llama.cpp ngram-mod 3/8": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "3",
                                "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "8"],
}
# OpenVINO GenAI's modes: measurement -> (pipeline, GenerationConfig fields beyond greedy decoding)
OPENVINO_MODES = {
    "openvino plain": ("plain", {}),
    "openvino draft 3": ("draft", {"num_assistant_tokens": 3}),
    "openvino draft 5": ("draft", {"num_assistant_tokens": 5}),
    "openvino prompt lookup": ("lookup", {"max_ngram_size": 3, "num_assistant_tokens": 5}),
}
# the speculation goals on the coder pair (docs/fastpath.md at 4a89039)
GOALS = {"best": 2.0, "peer": 1.6, "default": 1.5}
DEFAULT_MODE = "generate gamma auto"  # the registered draft, gamma auto (the default to 8dc8929)
SETUP_COLUMNS = [("llama.cpp", "generate plain"), ("specq", "generate plain"),
                 ("specq", "generate gamma 2"), ("specq", "generate gamma auto")]


# ------------------------------------------------------------------------------- set-up

def check_weights(weights: str) -> None:
    """Each `--weights` entry is a named one or an existing GGUF file; else one line and exit 2."""
    for w in weights.split(","):
        if w not in SPECQ_REFS and not (w.endswith(".gguf") and Path(w).is_file()):
            print(f"--weights: '{w}' is neither one of {', '.join(SPECQ_REFS)} nor a GGUF file",
                  file=sys.stderr)
            sys.exit(2)


def binding():
    """llama.cpp's Python binding, or one line and exit: not installed, or installed without the
    library it loads (a source build leaves it in the build folder)."""
    if importlib.util.find_spec("llama_cpp") is None:
        sys.exit(f"llama.cpp's Python binding is not installed: {INSTALL}")
    try:
        import llama_cpp
    except OSError as e:  # FileNotFoundError too
        sys.exit(f"llama.cpp's Python binding cannot load its library ({e}): set "
                 f"LLAMA_CPP_LIB_PATH to the folder holding libllama.so, or reinstall: {INSTALL}")
    return llama_cpp


def speculative_log(log: str) -> tuple[int, float, float, dict[str, int]] | None:
    """(new tokens, prefill s, decode s, draft counts) as `llama-speculative-simple` reports them
    in its log; None where the log lacks them (the run failed)."""
    enc = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if not enc or not dec:
        return None
    counts = {k: int(m.group(1)) for k in ("n_drafted", "n_accept")
              if (m := re.search(rf"{k}\s+=\s+(\d+)", log))}
    return int(dec.group(1)), float(enc.group(2)), float(dec.group(2)), counts


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two greedy outputs part, or None when they agree."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------------------- tables

def summary(rows: list[dict]) -> str:
    """Medians over rounds of each (weights, measurement), and the median of the per-round ratios
    specq / llama.cpp (ms for forwards: below 1 means specq is faster; tokens/s for generation:
    above 1 means specq is faster, every specq mode against llama.cpp's plain greedy decoding)."""
    openvino = any(r["tool"] == "openvino" for r in rows)
    peer = "llama.cpp (OpenVINO in its rows)" if openvino else "llama.cpp"
    lines = [f"| weights | measurement | {peer} | specq | specq / llama.cpp (paired, median) |",
             "|---|---|---|---|---|"]
    for weights, measurement in dict.fromkeys((r["weights"], r["measurement"]) for r in rows):
        lines += _summary_lines(rows, weights, measurement)
    rates = [r["read_gbps"] for r in rows if "read_gbps" in r]
    if rates:  # runs before the probe have none
        lines.append(f"| all | memory read rate before each row | - | - | "
                     f"{statistics.median(rates):.1f} GB/s [{min(rates):.1f}, {max(rates):.1f}] "
                     "(median [min, max]) |")
    return "\n".join(lines)


def _summary_lines(rows: list[dict], weights: str, measurement: str) -> list[str]:
    """The summary's line(s) of one (weights, measurement)."""
    if measurement in OPENVINO_MODES:  # against llama.cpp's plain decoding and its own
        theirs = _rates(rows, "openvino", weights, measurement)
        plain = _rates(rows, "llama.cpp", weights, "generate plain")
        own = _rates(rows, "openvino", weights, "openvino plain")
        return [f"| {weights} | {measurement} | {_median(theirs, ' tok/s')} | - | "
                f"{_paired(theirs, plain)} (OpenVINO vs llama.cpp plain; "
                f"{_paired(theirs, own)} vs its plain) |"]
    if measurement in LLAMA_CPP_SPECULATIVE:  # llama.cpp's own modes, against its plain decoding
        theirs = _rates(rows, "llama.cpp", weights, measurement)
        plain = _rates(rows, "llama.cpp", weights, "generate plain")
        ratios = [theirs[k] / plain[k] for k in theirs if k in plain]
        return [f"| {weights} | {measurement} | {_median(theirs, ' tok/s')} | - | "
                f"{statistics.median(ratios):.2f} (llama.cpp vs its plain) |"]
    forward = measurement.startswith("forward")
    value = "ms" if forward else "tokens_per_s"
    ref_measurement = measurement if forward else "generate plain"
    mine = _values(rows, "specq", weights, measurement, value)
    theirs = _values(rows, "llama.cpp", weights, ref_measurement, value)
    ratios = [mine[k] / theirs[k] for k in mine if k in theirs]
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
    if measurement != ref_measurement:
        ratio += " (vs llama.cpp plain)"
    unit = " ms" if forward else " tok/s"
    peer = _median(theirs, unit) if measurement == ref_measurement else "-"
    lines = [f"| {weights} | {measurement} | {peer} | {_median(mine, unit)} | {ratio} |"]
    if measurement == "generate plain":
        lines.append(prefill_line(rows, weights))
    return lines


# llama.cpp's n-gram modes and specq's plain decoding and lookup: the columns of `ngram_summary`
NGRAM_COLUMNS = (("llama.cpp", "llama.cpp ngram-simple"), ("llama.cpp", "llama.cpp ngram-mod"),
                 ("llama.cpp", "llama.cpp ngram-simple 3/8"),
                 ("llama.cpp", "llama.cpp ngram-mod 3/8"),
                 ("specq", "generate plain"), ("specq", "generate ngram"))


def ngram_summary(rows: list[dict]) -> str:
    """One line per (weights, prompt set): llama.cpp's plain tokens/s, then each n-gram mode of
    llama.cpp and specq's plain decoding and lookup as the median of their rounds' ratios to
    llama.cpp's plain decoding in the same round (the prompt sets' rows apart: each set is its own
    run, with rounds of its own)."""
    names = [f"{tool} {m.removeprefix('llama.cpp ').removeprefix('generate ')}"
             for tool, m in NGRAM_COLUMNS]
    lines = ["| weights | prompts | llama.cpp plain | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(NGRAM_COLUMNS)]
    first = {w: i for i, w in reversed(list(enumerate(r["weights"] for r in rows)))}
    keys = dict.fromkeys((r["weights"], r["prompt_set"]) for r in rows)
    for weights, prompt_set in sorted(keys, key=lambda k: first[k[0]]):  # a file's sets together
        mine = [r for r in rows if (r["weights"], r["prompt_set"]) == (weights, prompt_set)]
        plain = _rates(mine, "llama.cpp", weights, "generate plain")
        cells = [_paired(_rates(mine, tool, weights, m), plain) for tool, m in NGRAM_COLUMNS]
        lines.append(f"| {weights} | {prompt_set} | {_median(plain, ' tok/s')} | "
                     + " | ".join(f"{c}x" if c != "-" else c for c in cells) + " |")
    return "\n".join(lines)


def setups_summary(rows: list[dict]) -> str:
    """One row per labelled run (`--label`, in file order) of the same measurements: tokens/s of
    llama.cpp's plain decoding and specq's plain, gamma 2 and gamma auto decoding (medians over
    rounds), each with the median of its rounds' ratios to llama.cpp's plain decoding."""
    names = [f"{tool} {m.removeprefix('generate ')}" for tool, m in SETUP_COLUMNS]
    lines = ["| set-up | " + " | ".join(names) + " |", "|---|" + "---|" * len(SETUP_COLUMNS)]
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        [weights] = {r["weights"] for r in mine}
        plain = _rates(mine, "llama.cpp", weights, "generate plain")
        cells = [f"{_median(rates, ' tok/s')} ({_paired(rates, plain)}x)"
                 for rates in (_rates(mine, tool, weights, m) for tool, m in SETUP_COLUMNS)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals_summary(runs: list[tuple[str, list[dict]]], weights: str = "qwen1.5b") -> str:
    """The speculation goals, one line per (prompt kind, run): specq's fastest generation mode
    against llama.cpp's plain decoding, against the fastest speculative mode of llama.cpp or
    OpenVINO in the same run, and specq's default against llama.cpp's plain decoding. Each ratio is
    the median of the rounds' ratios, "fastest" the highest such ratio to llama.cpp's plain
    decoding (tokens/s: medians over rounds); each with its goal and whether the run met it."""
    lines = [f"| prompts | specq's fastest mode | vs llama.cpp plain (goal {GOALS['best']}) | "
             f"fastest peer speculative mode | specq's fastest vs it (goal {GOALS['peer']}) | "
             f"specq's default vs llama.cpp plain (goal {GOALS['default']}) |",
             "|---|---|---|---|---|---|"]

    def verdict(ratio: str, goal: float) -> str:
        return f"{ratio} ({'met' if ratio != '-' and float(ratio) >= goal else 'not met'})"

    peer_modes = (("llama.cpp", LLAMA_CPP_SPECULATIVE), ("openvino", OPENVINO_MODES))
    for kind, rows in runs:
        recorded = {r["prompt_set"] for r in rows if "prompt_set" in r}
        if recorded - {kind}:
            raise ValueError(f"goals: a run of {', '.join(sorted(recorded))} prompts named {kind}")
        plain = _rates(rows, "llama.cpp", weights, "generate plain")
        generations = [r["measurement"] for r in rows
                       if r["tool"] == "specq" and r["measurement"].startswith("generate")]
        mine = {m: _rates(rows, "specq", weights, m) for m in dict.fromkeys(generations)}
        peers = {m: rates for tool, modes in peer_modes for m in modes
                 if m != "openvino plain" and (rates := _rates(rows, tool, weights, m))}
        best = max(mine, key=lambda m: _ratio(mine[m], plain))
        peer = max(peers, key=lambda m: _ratio(peers[m], plain))
        lines.append(
            f"| {kind} | {best.removeprefix('generate ')}, {_median(mine[best], ' tok/s')} | "
            f"{verdict(_paired(mine[best], plain), GOALS['best'])} | "
            f"{peer}, {_median(peers[peer], ' tok/s')} | "
            f"{verdict(_paired(mine[best], peers[peer]), GOALS['peer'])} | "
            f"{verdict(_paired(mine[DEFAULT_MODE], plain), GOALS['default'])} |")
    return "\n".join(lines)


def prefill_line(rows: list[dict], weights: str) -> str:
    """The prompts' prefill in plain generation, prompt tokens per second of prefill time: medians
    over rounds, and of the rounds' specq / llama.cpp ratios (above 1: specq is faster)."""
    def rate(row: dict) -> float:
        prompts = row["per_prompt"]
        return sum(p["prompt_tokens"] for p in prompts) / sum(p["prefill_s"] for p in prompts)

    plain = [r for r in rows if (r["weights"], r["measurement"]) == (weights, "generate plain")]
    rates = {tool: {r["round"]: rate(r) for r in plain if r["tool"] == tool}
             for tool in ("llama.cpp", "specq")}
    ratios = [rates["specq"][k] / rates["llama.cpp"][k] for k in rates["specq"]
              if k in rates["llama.cpp"]]
    return (f"| {weights} | prefill (of generate plain) | "
            f"{_median(rates['llama.cpp'], ' tok/s')} | {_median(rates['specq'], ' tok/s')} | "
            f"{statistics.median(ratios):.2f} |")


def _values(rows: list[dict], tool: str, weights: str, measurement: str,
            value: str) -> dict[int, float]:
    """round -> one field of one measurement's rows."""
    return {r["round"]: r[value] for r in rows
            if (r["tool"], r["weights"], r["measurement"]) == (tool, weights, measurement)}


def _rates(rows: list[dict], tool: str, weights: str, measurement: str) -> dict[int, float]:
    """round -> tokens/s of one generation measurement."""
    return _values(rows, tool, weights, measurement, "tokens_per_s")


def _ratio(mine: dict, theirs: dict) -> float:
    """The median of the rounds' ratios mine / theirs (-inf where no round has both)."""
    ratios = [mine[k] / theirs[k] for k in mine if k in theirs]
    return statistics.median(ratios) if ratios else float("-inf")


def _paired(mine: dict, theirs: dict) -> str:
    """`_ratio` as the tables print it ("-" where no round has both)."""
    ratio = _ratio(mine, theirs)
    return f"{ratio:.2f}" if ratio > float("-inf") else "-"


def _median(values: dict, unit: str) -> str:
    return f"{statistics.median(values.values()):.1f}{unit}" if values else "-"
