"""Tables of specq beside llama.cpp (and OpenVINO GenAI) on the same weights, from the rows
`benchmarks/bench_llamacpp.py` and the step profiles write: the docs' tables of them are generated
here (`doc_tables.py`), so no figure is typed by hand.

A row is one tool's measurement in one round: `forward N [at C]` (ms of one pass of N rows after
C tokens of context, 128 when unsaid), `generate ...` (tokens/s end to end), llama.cpp's and
OpenVINO's own modes. Rounds alternate the tools, so every ratio here is the median of the rounds'
ratios (paired), and every figure the median over rounds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

PLAIN = {"llama.cpp": "generate plain", "specq": "generate plain", "openvino": "openvino plain"}
DEFAULT = "generate gamma auto"  # the registered draft with gamma auto (bench_llamacpp.py)


def _rates(rows: list[dict], tool: str, weights: str, measurement: str,
           key: str = "tokens_per_s") -> dict:
    """round -> the value (tokens/s, or `key`) of one tool's measurement on one weights."""
    return {r["round"]: r[key] for r in rows
            if (r["tool"], r["weights"], r["measurement"]) == (tool, weights, measurement)}


def _ratio(mine: dict, theirs: dict) -> float | None:
    """The median of the rounds' ratios mine / theirs; None where no round has both."""
    ratios = [mine[k] / theirs[k] for k in mine if k in theirs]
    return statistics.median(ratios) if ratios else None


def _paired(mine: dict, theirs: dict) -> str:
    ratio = _ratio(mine, theirs)
    return "-" if ratio is None else f"{ratio:.2f}"


def _median(values: dict, unit: str = "") -> str:
    return f"{statistics.median(values.values()):.1f}{unit}" if values else "-"


def _prefill(rows: list[dict], tool: str, weights: str) -> dict:
    """round -> prompt tokens per second of prefill in plain generation."""
    return {r["round"]: sum(p["prompt_tokens"] for p in r["per_prompt"])
            / sum(p["prefill_s"] for p in r["per_prompt"])
            for r in rows
            if (r["tool"], r["weights"], r["measurement"]) == (tool, weights, "generate plain")}


def _speculative(tool: str, measurement: str) -> bool:
    """A peer's own speculative mode (not its plain decoding)."""
    return tool != "specq" and measurement != PLAIN[tool] and not measurement.startswith("forward")


def weights_name(weights: str) -> str:
    """A file path's name without `.gguf`; a named model as it is."""
    return Path(weights).stem if weights.endswith(".gguf") else weights


def _runs(files: list[list[dict]]) -> dict[tuple, list[dict]]:
    """The rows of each run, (file, machine, kernels, prompt set, weights), in the files' order:
    runs of two files never pool, their rounds being different rounds."""
    out: dict[tuple, list[dict]] = {}
    for i, rows in enumerate(files):
        for r in rows:
            key = (i, r["machine"], r.get("kernels", "-"), r.get("prompt_set", "-"), r["weights"])
            out.setdefault(key, []).append(r)
    return out


def _mode(measurement: str) -> str:
    """'generate gamma 2' -> 'gamma 2'; 'openvino draft 3' -> 'OpenVINO draft 3'."""
    return measurement.removeprefix("generate ").replace("openvino ", "OpenVINO ")


PEERS_HEADER = ("| machine | kernels | date | prompts | weights | llama.cpp plain | specq plain | "
                "specq registered draft, auto | specq fastest | peers' fastest speculative | "
                "prefill, specq / llama.cpp | one-row step, specq / llama.cpp | "
                "8-row pass in steps, specq / llama.cpp |")


def peers(files: list[list[dict]]) -> str:
    """One line per run: llama.cpp's plain tokens/s; specq's plain decoding, its registered draft
    (gamma auto) and its fastest mode, and the fastest speculative mode of llama.cpp or OpenVINO,
    each against llama.cpp's plain decoding; prefill; the one-row step of both tools, and what an
    8-row pass costs in one-row steps of the same tool."""
    lines = [PEERS_HEADER, "|" + "---|" * 13]
    for (_, machine, kernels, prompts, weights), run in _runs(files).items():
        plain = _rates(run, "llama.cpp", weights, "generate plain")
        if not plain:
            continue
        modes = dict.fromkeys((r["tool"], r["measurement"]) for r in run if "tokens_per_s" in r)
        rates = {mode: _rates(run, mode[0], weights, mode[1]) for mode in modes}
        ratio = {mode: _ratio(rates[mode], plain) for mode in modes}
        fastest = max((m for m in modes if m[0] == "specq"), key=ratio.get)
        peer = max((m for m in modes if _speculative(*m)), key=ratio.get, default=None)

        def rate(mode: tuple) -> str:
            return f"{_median(rates[mode])} ({ratio[mode]:.2f}x)" if mode in modes else "-"

        def named(mode: tuple | None) -> str:
            return "-" if mode is None else f"{_mode(mode[1])}, {ratio[mode]:.2f}x"

        tools = ("specq", "llama.cpp")
        prefill = _paired(_prefill(run, "specq", weights), _prefill(run, "llama.cpp", weights))
        step = " / ".join(_median(_rates(run, t, weights, "forward 1", "ms")) for t in tools)
        wide = " / ".join(_steps(run, t, weights, 8) for t in tools)
        tokens = next((r["tokens"] for r in run if "tokens" in r), 128)
        prompts += "" if tokens == 128 else f", {tokens} tokens"  # 128 new tokens unless said
        lines.append(f"| {machine} | {kernels} | {run[0]['run'][:10]} | {prompts} | "
                     f"{weights_name(weights)} | {_median(plain, ' tok/s')} | "
                     f"{rate(('specq', 'generate plain'))} | {rate(('specq', DEFAULT))} | "
                     f"{named(fastest)} | {named(peer)} | {prefill}x | {step} ms | {wide} |")
    return "\n".join(lines)


def _steps(rows: list[dict], tool: str, weights: str, n: int) -> str:
    """An n-row pass in one-row steps of the same tool and round (median over rounds)."""
    return _paired(_rates(rows, tool, weights, f"forward {n}", "ms"),
                   _rates(rows, tool, weights, "forward 1", "ms"))


def passes(files: list[list[dict]]) -> str:
    """ms of one pass of N rows (medians over rounds), per run, context and tool."""
    forwards = [[r for r in rows if r["measurement"].startswith("forward")] for rows in files]
    sizes = sorted({int(r["measurement"].split()[1]) for rows in forwards for r in rows})
    lines = ["| machine | kernels | weights | context | tool | "
             + " | ".join(f"{n} row{'s' * (n > 1)}" for n in sizes) + " |",
             "|" + "---|" * (5 + len(sizes))]
    for (_, machine, kernels, _, weights), run in _runs(forwards).items():
        for context in sorted({_context(r["measurement"]) for r in run}):
            suffix = "" if context == 128 else f" at {context}"
            for tool in ("llama.cpp", "specq"):
                cells = [_median(_rates(run, tool, weights, f"forward {n}{suffix}", "ms"))
                         for n in sizes]
                lines.append(f"| {machine} | {kernels} | {weights_name(weights)} | {context} | "
                             f"{tool} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _context(measurement: str) -> int:
    """`forward N at C` -> C; `forward N` -> 128, the script's default context."""
    words = measurement.split()
    return int(words[3]) if len(words) == 4 else 128


STEP_HEADER = ("| machine | model | commit | one-row step | 8-row pass | 8-row pass in steps | "
               "same after 1024 tokens | linear layers alone, 8 rows in 1-row times | "
               "read rate: linear layers, 1 row | read rate: float32 sum |")


def step_profile(rows: list[dict]) -> str:
    """One line per machine and model (the rows of `profile_step.py` at 4a89039): a one-row step
    and an 8-row pass after 128 tokens of context (medians over rounds), the 8-row pass in steps
    there and after 1024
    tokens, the linear layers alone at 8 rows in their one-row time, and the read rates of the
    linear layers at one row and of torch's float32 sum of 1 GiB (paired ratios: medians of the
    rounds')."""
    lines = [STEP_HEADER, "|" + "---|" * 10]
    for machine, ref in dict.fromkeys((r["machine"], r["ref"]) for r in rows):
        mine = [r for r in rows if (r["machine"], r["ref"]) == (machine, ref)]

        def ms(what: str, n: int, context: int) -> dict:
            return {r["round"]: r["ms"] for r in mine
                    if (r["measurement"], r["rows"], r["context"]) == (what, n, context)}

        mb = mine[0]["weight_bytes"] / 1e6
        linear = statistics.median(mb / v for v in ms("linears", 1, 0).values())
        summed = statistics.median((1 << 30) / 1e6 / v
                                   for v in ms("float32 sum of 1 GiB", 1, 0).values())
        lines.append(f"| {machine} | {ref} | {mine[0]['commit']} | "
                     f"{_median(ms('pass', 1, 128), ' ms')} | "
                     f"{_median(ms('pass', 8, 128), ' ms')} | "
                     f"{_paired(ms('pass', 8, 128), ms('pass', 1, 128))} | "
                     f"{_paired(ms('pass', 8, 1024), ms('pass', 1, 1024))} | "
                     f"{_paired(ms('linears', 8, 0), ms('linears', 1, 0))} | "
                     f"{linear:.1f} GB/s | {summed:.1f} GB/s |")
    return "\n".join(lines)
