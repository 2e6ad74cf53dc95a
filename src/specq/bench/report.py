"""`specq report RESULTS`: a Markdown summary and a self-contained HTML page (tables, plus plots
as embedded base64 PNGs) from a results store alone; the models are never needed."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from .. import atomic, checks
from ..core.gamma import AUTO
from ..errors import SpecqError
from . import aggregate, store, tables
from .tables import Table

DEFAULTS = {"resamples": 2000, "confidence": 0.95, "seed": 0}


def write_report(results: str | Path, out: str | Path | None = None, *,
                 resamples: int | None = None, confidence: float | None = None,
                 force: bool = False) -> tuple[Path, Path]:
    """Write PREFIX.md and PREFIX.html (PREFIX defaults to RESULTS without its suffix); existing
    ones are replaced only with `force`."""
    results = Path(results)
    if not results.is_file():
        raise SpecqError(f"results file not found: {results}")
    prefix = Path(out) if out else results.with_suffix("")
    md, page = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".html")
    for path in (md, page):
        checks.output(path, force, "report", folder=False)
    records = store.read(results, complete=True)
    if not store.cells(records):
        raise SpecqError(f"{results} holds no finished cells")
    runs = aggregate.run_records(records)
    settings = {**DEFAULTS,
                **{k: v for k, v in (runs[-1]["config"] if runs else {}).items() if k in DEFAULTS}}
    settings.update({k: v for k, v in (("resamples", resamples), ("confidence", confidence))
                     if v is not None})
    if not 0.5 <= settings["confidence"] < 1 or settings["resamples"] < 1:
        raise SpecqError("--confidence must be in [0.5, 1) and --resamples >= 1")
    rows = aggregate.summarize(records, **settings)
    by_set = aggregate.summarize(records, **settings, by_set=True)
    sections = [tables.summary(rows, settings["confidence"]),
                _titled(tables.summary(by_set, settings["confidence"]),
                        "per prompt set"),
                tables.per_position(rows), tables.quality(rows), tables.profile(rows),
                _models(records)]
    quality = aggregate.heldout_rows(records)
    if quality:
        sections.insert(3, tables.heldout(quality))
    failures = aggregate.failures(rows)
    atomic.write_text(md, _markdown(results, runs, sections, failures))
    atomic.write_text(page, _html(results, runs, sections, failures, plots(rows)))
    return md, page


def _titled(table: Table, title: str) -> Table:
    table.title = title
    return table


def _models(records: list[dict]) -> Table:
    table = Table("models", ["ref", "precision", "source", "sha256 (state dict, first 16)"])
    seen = set()
    for cell in store.cells(records).values():
        draft = cell.get("draft") or {}
        for info in (cell.get("target"), *draft.get("levels", [draft])):  # a hierarchy: each level
            if info and (info["ref"], info["sha256"]) not in seen:
                seen.add((info["ref"], info["sha256"]))
                table.add([info["ref"], info["precision"], info["source"], info["sha256"]])
    return table


def _run_lines(runs: list[dict]) -> list[str]:
    out = []
    for r in runs:
        env = r["environment"]
        # runs before they were recorded: none
        cpu = f"{env['cpu']}, kernels {env['kernels']}, " if env.get("cpu") else ""
        out.append(f"run {r['run_id']} started {r['started']}: {env['platform']} ({cpu}"
                   f"{env['machine']}, {env['cpu_count']} CPUs), python {env['python']}, torch "
                   f"{env['torch']}, transformers {env['transformers']}, specq {env['specq']}, "
                   f"threads {r['config']['threads']}")
    return out


# ---------------------------------------------------------------------------------- Markdown


def _md_table(table: Table) -> str:
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = [f"### {table.title}", "", "| " + " | ".join(table.headers) + " |",
             "|" + "---|" * len(table.headers)]
    for cells, failed in zip(table.rows, table.failed):
        cells = [f"**{esc(c)}**" if failed and c else esc(c) for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    if table.caption:
        lines += ["", table.caption]
    return "\n".join(lines)


def _markdown(results: Path, runs: list[dict], sections: list[Table], failures: list[str]) -> str:
    parts = [f"# specq bench: {results.name}", ""]
    if failures:
        parts += ["## CORRECTNESS FAILURES", "",
                  "Speculative greedy outputs that differ from the target's own:", ""]
        parts += [f"- **{f}**" for f in failures] + [""]
    parts += [_md_table(t) + "\n" for t in sections if t.rows]
    parts += ["## Runs", ""] + [f"- {line}" for line in _run_lines(runs)] + [""]
    if runs:
        parts += ["Config of the latest run:", "", "```json",
                  json.dumps(runs[-1]["config"], indent=1), "```", ""]
    parts += ["Plots: see the HTML report next to this file.", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- HTML

CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0;
font-size:13px}th,td{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f3f3f3}
tr.fail td{color:#b00;font-weight:bold;background:#fee}.fail{color:#b00;font-weight:bold}\
caption{caption-side:bottom;
text-align:left;font-size:12px;color:#555;padding-top:4px}img{max-width:100%;display:block;\
margin:1em 0}"""


def _html_table(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.headers)
    body = "".join(f"<tr{' class=fail' if failed else ''}>" + "".join(f"<td>{e(c)}</td>"
                                                                      for c in cells) + "</tr>"
                   for cells, failed in zip(table.rows, table.failed))
    caption = f"<caption>{e(table.caption)}</caption>" if table.caption else ""
    return f"<h3>{e(table.title)}</h3><table>{caption}<tr>{head}</tr>{body}</table>"


def _html(results: Path, runs: list[dict], sections: list[Table], failures: list[str],
          images: list[tuple[str, str]]) -> str:
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>specq bench: "
             f"{e(results.name)}</title><style>{CSS}</style></head><body><h1>specq bench: "
             f"{e(results.name)}</h1>"]
    if failures:
        parts.append("<h2 class=fail>CORRECTNESS FAILURES</h2><ul>"
                     + "".join(f"<li class=fail>{e(f)}</li>" for f in failures) + "</ul>")
    parts += [_html_table(sections[0])]
    parts += [f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,{data}'>"
              for title, data in images]
    parts += [_html_table(t) for t in sections[1:] if t.rows]
    parts.append("<h2>Runs</h2><ul>" + "".join(f"<li>{e(line)}</li>" for line in _run_lines(runs))
                 + "</ul>")
    if runs:
        parts.append("<p>Config of the latest "
                     f"run:</p><pre>{e(json.dumps(runs[-1]['config'], indent=1))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- plots


def plots(rows: list[dict]) -> list[tuple[str, str]]:
    """(title, base64 PNG) for each plot the results have data for."""
    import matplotlib

    matplotlib.use("Agg")
    spec = [r for r in rows if r["kind"] == "speculative"]
    fixed = [r for r in spec if r["gamma"] != AUTO]  # plotted against gamma or draft position
    out = []
    for title, draw in (("Per-position acceptance", _per_position), ("Speedup vs gamma", _vs_gamma),
                        ("Speedup vs output length", _vs_length),
                        ("Tau and speedup vs tree size", _vs_tree),
                        ("Acceptance and speedup per target / draft precision", _per_precision),
                        ("Quality per target precision", _quality)):
        data = draw(rows if draw is _quality else fixed
                    if draw in (_per_position, _vs_gamma, _vs_tree) else spec)
        if data:
            out.append((title, data))
    return out


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _tree(r: dict) -> str:
    """' | tree 16 k4' for a token tree's row (its depth is on the gamma axis), '' for a chain's."""
    return f" | tree {r['tree']} k{r['tree_topk']}" if r.get("tree") else ""


def _suffix(r: dict) -> str:
    """' | suffix cache' where the n-gram draft also read earlier prompts' text, else ''."""
    return " | suffix cache" if r.get("suffix_cache") else ""


def _pair(r: dict) -> str:
    stop = r.get("draft_confidence")
    return (f"{r['target']} | {r['draft']}" + (f" | stop < {stop:g}" if stop else "") + _tree(r)
            + _suffix(r))


def _err(values: list) -> tuple[list, list]:
    """Means and asymmetric error bars from [mean, low, high] triples (None -> nan)."""
    nan = float("nan")
    means = [v[0] if v else nan for v in values]
    return (means, [[v[0] - v[1] if v else nan for v in values],
                    [v[2] - v[0] if v else nan for v in values]])


def _longest(rows: list[dict]) -> list[dict]:
    """Rows at the longest output length and lowest temperature (the most stable numbers)."""
    if not rows:
        return []
    n, t = max(r["max_new_tokens"] for r in rows), min(r["temperature"] for r in rows)
    return [r for r in rows if r["max_new_tokens"] == n and r["temperature"] == t]


def _best(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["best_gamma"] or not r["gamma_swept"]]


def _per_position(spec: list[dict]) -> str | None:
    import matplotlib.pyplot as plt

    chosen: dict[str, dict] = {}
    for r in _longest(spec):  # the largest gamma of each pair shows the most positions
        if _pair(r) not in chosen or r["gamma"] > chosen[_pair(r)]["gamma"]:
            chosen[_pair(r)] = r
    if not chosen:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, name in ((axes[0], "U", "U_i = P(accepted length >= i)"),
                          (axes[1], "a", "a_i = P(i | 1..i-1)")):
        for label, r in chosen.items():
            means, err = _err(r[key])
            ax.errorbar(range(1, len(means) + 1), means, yerr=err, marker="o", capsize=3,
                        label=label)
        depth = " (a tree's: depth i)" if any(r.get("tree") for r in chosen.values()) else ""
        ax.set(title=name, xlabel="draft position i" + depth, ylim=(0, 1.05))
        _integer_x(ax)
    axes[0].set_ylabel("acceptance")
    axes[1].legend(fontsize=7)
    return _png(fig)


def _vs_gamma(spec: list[dict]) -> str | None:
    import matplotlib.pyplot as plt

    swept = [r for r in spec if r["gamma_swept"]
             and r["temperature"] == min(x["temperature"] for x in spec)]
    lengths = sorted({r["max_new_tokens"] for r in swept})
    if not lengths:
        return None
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
    for ax, n in zip(axes[0], lengths):
        lines: dict[str, list[dict]] = {}
        for r in swept:
            if r["max_new_tokens"] == n:
                lines.setdefault(_pair(r), []).append(r)
        for label, group in lines.items():
            group.sort(key=lambda r: r["gamma"])
            means, err = _err([r["speedup"] for r in group])
            line = ax.errorbar([r["gamma"] for r in group], means, yerr=err, marker="o", capsize=3,
                               label=label)
            ax.plot([r["gamma"] for r in group], [r["predicted_speedup"] for r in group], "--",
                    color=line[0].get_color(), alpha=0.6)
        ax.axhline(1, color="grey", lw=0.8)
        depth = " (a tree's: its depth)" if any(r.get("tree") for r in swept) else ""
        ax.set(title=f"{n} new tokens (dashed: predicted)", xlabel="gamma" + depth,
               ylabel="speedup over the target alone")
        _integer_x(ax)
    axes[0][-1].legend(fontsize=7)
    return _png(fig)


def _vs_tree(spec: list[dict]) -> str | None:
    """Tau and speedup against the nodes per proposal (a chain of gamma g: g nodes), one line per
    target precision, draft and depth: where a bigger tree stops paying for its verify rows."""
    import matplotlib.pyplot as plt

    rows = _longest(spec)
    if not any(r.get("tree") for r in rows):
        return None
    lines: dict[str, list[dict]] = {}
    for r in rows:
        # a chain of a depth trees have
        if r.get("tree") or any(o.get("tree") and o["gamma"] == r["gamma"]
                                and o["draft"] == r["draft"]
                                and o["target"] == r["target"] for o in rows):
            label = f"{r['target_precision']} | {r['draft']} | depth {r['gamma']}{_suffix(r)}"
            lines.setdefault(label, []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, group in lines.items():
        group.sort(key=lambda r: r.get("tree") or r["gamma"])
        size = [r.get("tree") or r["gamma"] for r in group]
        for ax, key in ((axes[0], "tau"), (axes[1], "speedup")):
            means, err = _err([r[key] for r in group])
            ax.errorbar(size, means, yerr=err, marker="o", capsize=3, label=label)
    axes[0].set(title="tau (bonus included)", xlabel="draft nodes per proposal (a chain: gamma)",
                ylabel="tau")
    axes[1].set(title="speedup", xlabel="draft nodes per proposal (a chain: gamma)",
                ylabel="speedup over the target alone")
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].legend(fontsize=7)
    return _png(fig)


def _vs_length(spec: list[dict]) -> str | None:
    import matplotlib.pyplot as plt

    rows = [r for r in _best(spec) if r["temperature"] == min(x["temperature"] for x in spec)]
    if len({r["max_new_tokens"] for r in rows}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    lines: dict[str, list[dict]] = {}
    for r in rows:
        lines.setdefault(_pair(r), []).append(r)
    for label, group in lines.items():
        group.sort(key=lambda r: r["max_new_tokens"])
        means, err = _err([r["speedup"] for r in group])
        ax.errorbar([r["max_new_tokens"] for r in group], means, yerr=err, marker="o", capsize=3,
                    label=label)
        for r, m in zip(group, means):
            if r["warmup_dominated"]:
                ax.annotate("warm-up", (r["max_new_tokens"], m), fontsize=7, color="red")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="new tokens", ylabel="speedup (best gamma)", title="gain vs output length")
    ax.legend(fontsize=7)
    return _png(fig)


def _bars(ax, groups: list[str], series: dict[str, dict[str, list | None]], ylabel: str) -> None:
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        means, err = _err([values.get(g) for g in groups])
        ax.bar([i + k * width for i in range(len(groups))], means, width, yerr=err, capsize=3,
               label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=20,
                  ha="right", fontsize=8)
    ax.set_ylabel(ylabel)


def _per_precision(spec: list[dict]) -> str | None:
    import matplotlib.pyplot as plt

    rows = _longest(_best(spec))
    if not rows:
        return None
    targets = sorted({r["target"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, label in ((axes[0], "acceptance_rate", "acceptance rate"),
                           (axes[1], "speedup", "speedup")):
        series: dict[str, dict] = {}
        for r in rows:
            series.setdefault(r["draft"] + _tree(r) + _suffix(r), {})[r["target"]] = r[key]
        _bars(ax, targets, series, label)
    axes[0].set_ylim(0, 1)
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].legend(title="draft", fontsize=7)
    return _png(fig)


def _quality(rows: list[dict]) -> str | None:
    import matplotlib.pyplot as plt

    base = [r for r in _longest([r for r in rows if r["kind"] == "baseline"]) if r["em"]]
    if not base:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, [r["target"] for r in base],
          {"target alone, GSM8K": {r["target"]: r["em"] for r in base}}, "GSM8K exact match")
    ax.set_ylim(0, 1)
    return _png(fig)
