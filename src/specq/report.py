"""Human-readable output for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_backends(explained: dict[str, dict], console: Console | None = None) -> None:
    """What each model runs on (`specq generate --explain`), from `backends.describe`."""
    console = console or Console()
    for ref, d in explained.items():
        cpu = f" for {d['cpu']}" if d.get("cpu") else ""
        console.print(f"{ref}: backend {d['backend']}, kernel build {d['kernel_build']}{cpu}, "
                      f"whole cached passes in one C call: {'yes' if d['layer_stack'] else 'no'}"
                      + (f", decoder layers run: {d['decoder_layers']}" if d.get("decoder_layers")
                         else ""), markup=False, highlight=False)
        for kernel, count in d["linear_layers"].items():
            console.print(f"  {count:4d} linear layer{'s' * (count != 1)}: {kernel}", markup=False,
                          highlight=False)


def print_generation(out, console: Console | None = None) -> None:
    console = console or Console()
    console.print(out.text, markup=False, highlight=False)
    s = out.stats
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("target", out.target),
        ("draft", out.draft or "none (plain decoding)"),
        ("prompt / new tokens", f"{s.prompt_tokens} / {s.new_tokens} ({out.finish_reason})"),
        ("prefill / decode", f"{s.prefill_s * 1000:.0f} ms / {s.decode_s * 1000:.0f} ms"),
        ("draft / verify / other",
         f"{s.draft_s * 1000:.0f} / {s.verify_s * 1000:.0f} / {s.other_s * 1000:.0f} ms"),
        ("tokens/s (end to end)", _fmt(s.tokens_per_s, ".1f")),
        ("target passes (steps)", str(s.steps)),
    ]
    if s.gamma:
        rows += [
            ("gamma (longest proposal)", str(s.gamma)),
            ("plain steps (nothing drafted)", str(s.steps - s.drafted_at[0])),
            ("drafted / accepted", f"{s.drafted} / {s.accepted}"),
            ("acceptance rate", _fmt(s.acceptance_rate)),
            ("tau (mean accepted length, bonus incl.)", _fmt(s.tau, ".2f")),
            ("per-position U_i (unconditional)",
             " ".join(_fmt(x, ".2f") for x in s.per_position_unconditional)),
            ("per-position a_i (conditional)",
             " ".join(_fmt(x, ".2f") for x in s.per_position_conditional)),
            ("draft cost share", _fmt(s.draft_share, ".2f")),
            ("steps per route (drafted / accepted)", routes(s.routes)),
        ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


def routes(counts: dict[str, dict[str, int]]) -> str:
    """Which drafter proposed how much: `lookup 12 (40 / 31), model 20 (...), plain 5`."""
    return ", ".join(f"{route} {c['steps']}" + (f" ({c['drafted']} / {c['accepted']})"
                                               if route != "plain" else "")
                     for route, c in sorted(counts.items(), key=lambda rc: rc[0] == "plain"))


def print_comparison(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"B = {result['b']} vs A = {result['a']}  ({result['tokens']} tokens, "
                        f"{result['chunks']} chunks, T={result['temperature']})")
    for col in ("metric", "mean", "95% CI"):
        table.add_column(col)
    names = {"kl_ab": "KL(A||B)", "kl_ba": "KL(B||A)", "js": "Jensen-Shannon",
             "tv": "total variation", "top1": "top-1 agreement (greedy acceptance)",
             "beta": "beta = sum min(p,q) = 1 - TV", "ppl_a": "perplexity A",
             "ppl_b": "perplexity B"}
    for key, label in names.items():
        r = result[key]
        table.add_row(label, f"{r['mean']:.4f}", f"[{r['low']:.4f}, {r['high']:.4f}]")
    console.print(table)
