"""The hostile-input probe: many bad inputs to every `specq` subcommand and to the Python API,
each of which must be refused cleanly (one line on stderr, exit code 2) or succeed, never crash,
hang or damage a file it was given.

    OMP_NUM_THREADS=1 python benchmarks/probe_inputs.py [--only SUBSTRING] [--verbose]

Results: no results file; prints each flagged case (why, and the last stderr line) and a count,
and exits 1 if any was flagged. Its scratch folder (a temporary directory, named in the count
line) keeps every case's output.

Each case runs in a forked child (so a segfault or a hang is caught, not inherited) inside its
own scratch directory, on tiny random models saved to disk (tests/conftest.py's, so run it from
the repository). A case is flagged when it exits with an unexpected code, prints a traceback or
more than one stderr line on an error, dies from a signal, hangs, or changes a file or folder it
was given to protect.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

import specq  # noqa: E402
from specq.cli import main
from specq.errors import SpecqError

HUGE = str(10 ** 30)
TIMEOUT_S = 120
BAD_DATA = ("nonutf8.txt", "nonutf8.jsonl", "bad.jsonl", "missing.jsonl", "empty.jsonl",
            "blank.jsonl", "array.jsonl", "number.jsonl", "empty.txt", "spaces.txt", "folder")


@dataclass
class Case:
    name: str
    argv: list[str] | None = None  # a CLI case ...
    call: Callable[[], object] | None = None  # ... or an API case (SpecqError = the clean refusal)
    expect: tuple[int, ...] = (2,)
    # paths (relative to the scratch dir) that must not change
    protect: list[str] = field(default_factory=list)
    setup: Callable[[Path], None] | None = None  # prepares the scratch dir (before `protect`)


def tree_digest(path: Path) -> str:
    """A digest of a file or folder (names and contents), or 'absent'."""
    if not path.exists():
        return "absent"
    h = hashlib.sha256()
    for p in sorted([path, *path.rglob("*")] if path.is_dir() else [path]):
        h.update(str(p.relative_to(path.parent)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def run_case(case: Case, scratch: Path) -> tuple[int | str, str, str]:
    """(exit code or 'signal N' / 'timeout', stdout, stderr) of one case in a forked child."""
    out, err = scratch / ".stdout", scratch / ".stderr"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(scratch)
            fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            if case.argv is not None:
                code = main(case.argv)
            else:
                try:
                    case.call()
                    code = 0
                except SpecqError as e:
                    print(f"specq: error: {e}", file=sys.stderr)
                    code = 2
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    started = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - started > TIMEOUT_S:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", "", ""
        time.sleep(0.02)
    result = os.WEXITSTATUS(status) if os.WIFEXITED(status) else f"signal {os.WTERMSIG(status)}"
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    return result, read(out), read(err)


def verdict(case: Case, code, err: str, before: dict, scratch: Path) -> str | None:
    """Why a case failed, or None."""
    if code not in case.expect:
        return f"exit {code} (expected {'/'.join(map(str, case.expect))})"
    if "Traceback" in err:
        return "traceback"
    if code == 2 and err.count("\n") != 1:
        return f"{err.count(chr(10))} stderr lines"
    changed = [p for p, d in before.items() if tree_digest(scratch / p) != d]
    if changed:
        return f"changed {', '.join(changed)}"
    return None


# ----------------------------------------------------------------------------- fixtures


def make_models(root: Path) -> None:
    """Tiny models on disk: target, draft, foreign vocabulary, small embedding, feature draft."""
    from specq.loading.formats.save import save_native
    from specq.model import feature_draft
    from specq.model.feature_draft import new_feature_draft

    from conftest import perturbed, tiny_model, tiny_tokenizer

    target = tiny_model(scale=3.0)
    save_native(target, root / "target")
    save_native(perturbed(target, 0.05), root / "draft")
    foreign = tiny_model(seed=4)
    foreign.tokenizer = tiny_tokenizer(32, prefix="u")
    save_native(foreign, root / "foreign")
    small = tiny_model(vocab=16, seed=5)
    small.tokenizer = tiny_tokenizer(32)
    save_native(small, root / "small")
    feat = new_feature_draft(target.net, torch.arange(16), 1)
    feature_draft.save(feat, root / "feature", target.tokenizer, target.eos_ids)
    (root / "badconfig").mkdir()
    (root / "badconfig" / "config.json").write_text("{not json")
    (root / "empty").mkdir()


def make_data(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "good.txt": "t1 t2 t3\n\nt4 t5 t6\n",
        "prompts.txt": "t1 t2\n\nt3 t4\n",  # two prompts: a bench file set splits on blank lines
        "good.jsonl": '{"text": "t1 t2", "prompt": "t3 t4"}\n{"text": "t5 t6", "prompt": "t7"}\n',
        "bad.jsonl": '{"text": "t1", "prompt": "t1"}\n{oops\n{"text": "t2", "prompt": "t2"}\n',
        "missing.jsonl": '{"other": "t1"}\n',
        "empty.jsonl": "",
        "blank.jsonl": "\n\n",
        "array.jsonl": "[1, 2]\n",
        "number.jsonl": '{"text": 5, "prompt": 5}\n',
        "empty.txt": "",
        "spaces.txt": "   \n\n  \n",
        "bad.toml": "targets = [",
        "cut.toml": 'targets = ["x"]\nseed = ',
    }
    for name, text in files.items():
        (root / name).write_text(text)
    for name in ("nonutf8.txt", "nonutf8.jsonl", "nonutf8.toml"):
        (root / name).write_bytes(b"t1 \xff\xfe t2 \x80\n")
    (root / "folder").mkdir(exist_ok=True)


def make_results(root: Path, models: Path, data: Path) -> None:
    """A real results file from a tiny sweep, and damaged copies of it."""
    results = root / "results.jsonl"
    code = main(["bench", "--targets", str(models / "target"), "--drafts", str(models / "draft"),
                 "--prompt-sets", "file", "--prompt-file", str(data / "prompts.txt"),
                 "--no-prompt-file-chat", "--prompts", "2", "--max-new-tokens", "4",
                 "--threads", "1", "--resamples", "20", "--results", str(results)])
    assert code == 0, "the tiny sweep failed"
    lines = results.read_text().splitlines()
    records = [json.loads(x) for x in lines]
    cells = [r for r in records if r["type"] == "cell"]
    no_fields = (json.dumps({"type": "cell", "key": f"k{i}"}) for i in range(3))
    (root / "nofields.jsonl").write_text("\n".join(no_fields))
    stripped = [{k: v for k, v in r.items() if k != "runs"} for r in cells]
    (root / "partial.jsonl").write_text("\n".join(json.dumps(r) for r in stripped) + "\n")
    (root / "nokey.jsonl").write_text(json.dumps({"type": "cell"}) + "\n")
    (root / "runonly.jsonl").write_text(lines[0] + "\n")
    (root / "scalars.jsonl").write_text("1\n\"x\"\nnull\n")
    (root / "middle.jsonl").write_text(lines[0] + "\n{torn\n" + "\n".join(lines[1:]) + "\n")
    (root / "nonutf8.jsonl").write_bytes(b"\xff\xfe\n" + results.read_bytes())


# ----------------------------------------------------------------------------- cases


def cases(m: Path, d: Path, r: Path) -> list[Case]:
    """m: models, d: data, r: results (absolute paths)."""
    T, D = str(m / "target"), str(m / "draft")
    tiny = ["--target", T]
    out: list[Case] = []

    def cli(name, *argv, expect=(2,), protect=(), setup=None):
        out.append(Case(name, argv=[str(a) for a in argv], expect=expect, protect=list(protect),
                        setup=setup))

    def api(name, fn, expect=(2,)):
        out.append(Case(name, call=fn, expect=expect))

    def existing_file(p: Path) -> None:
        (p / "old").write_text("precious")

    def existing_dir(p: Path) -> None:
        (p / "old").mkdir()
        (p / "old" / "notes.txt").write_text("precious")

    def out_cases(name: str, *args) -> None:
        """An --out that must not be replaced or cannot be written: an existing file, a folder specq
        did not write (also with --force), a file as its parent, a parent that cannot be written."""
        cli(f"{name} out existing file", *args, "--out", "old", setup=existing_file,
            protect=["old"])
        cli(f"{name} out existing folder", *args, "--out", "old", setup=existing_dir,
            protect=["old"])
        cli(f"{name} out existing folder --force (foreign)", *args, "--out", "old", "--force",
            setup=existing_dir, protect=["old"])
        cli(f"{name} out parent is a file", *args, "--out", "old/sub", setup=existing_file,
            protect=["old"])
        cli(f"{name} out unwritable parent", *args, "--out", "/proc/specq-probe/x")

    # ---- generate
    g = ["generate", "t1 t2", *tiny, "--draft", D, "--max-new-tokens", "4", "--no-warmup"]
    bad = {"--seed": [2 ** 64, 2 ** 63, -1, HUGE, "1.5"], "--threads": [99999, 0, -1, HUGE],
           "--gamma": [HUGE, 65, 0, "nan"], "--max-new-tokens": [HUGE, 0, 10 ** 6],
           "--top-k": [HUGE, -1], "--top-p": ["nan", -0.1, 0, 1.5, "inf"],
           "--temperature": ["inf", "-inf", "1e309", -1], "--draft-confidence": [1, -0.1, "nan"]}
    for flag, values in bad.items():
        for v in values:
            cli(f"generate {flag} {v}", *g, flag, v)
    cli("generate ok", *g, expect=(0,))
    cli("generate --seed 2^63-1", *g, "--seed", 2 ** 63 - 1, expect=(0,))
    cli("generate --threads 2", *g, "--threads", 2, expect=(0,))
    cli("generate prompt non-UTF-8 file", "generate", f"@{d / 'nonutf8.txt'}", *tiny,
        "--no-speculative")
    cli("generate prompt surrogate argv", "generate", "t1 \udcff", *tiny, "--no-speculative",
        "--max-new-tokens", 2)
    cli("generate prompt file is a folder", "generate", f"@{d / 'folder'}", *tiny)
    cli("generate prompt file empty", "generate", f"@{d / 'empty.txt'}", *tiny)
    cli("generate prompt file spaces", "generate", f"@{d / 'spaces.txt'}", *tiny)
    cli("generate prompt missing file", "generate", "@/no/such", *tiny)
    cli("generate prompt empty", "generate", "", *tiny)
    cli("generate draft small embedding", *g[:4], "--draft", m / "small", "--max-new-tokens", 8)
    cli("generate draft foreign vocab", *g[:4], "--draft", m / "foreign")
    cli("generate target feature draft", "generate", "t1", "--target", m / "feature",
        "--no-speculative")
    cli("generate target feature draft + draft", "generate", "t1", "--target", m / "feature",
        "--draft", D)
    cli("generate target bad config", "generate", "t1", "--target", m / "badconfig")
    cli("generate target empty dir", "generate", "t1", "--target", m / "empty")
    cli("generate target text file", "generate", "t1", "--target", d / "good.txt")
    cli("generate target @int9", "generate", "t1", "--target", f"{T}@int9")
    cli("generate target @int4-g0", "generate", "t1", "--target", f"{T}@int4-g0")
    cli(f"generate target @int4-g{HUGE}", "generate", "t1", "--target", f"{T}@int4-g{HUGE}")
    cli("generate target empty ref", "generate", "t1", "--target", "")
    cli("generate target '@'", "generate", "t1", "--target", "@")
    cli("generate draft @bogus", *g, "--draft", f"{D}@bogus")
    cli("generate --chat without template", *g, "--chat")
    cli("generate --backend compiled bad threads", *g, "--threads", 99999, "--backend", "compiled")
    cli("generate --stop empty", *g, "--stop", "", expect=(0, 2))

    # ---- quantize
    q = ["quantize", T, "int8", "--threads", "1"]
    out_cases("quantize", *q)
    cli("quantize out /proc", *q, "--out", "/proc/specq-probe")
    cli("quantize ok", *q, "--out", "new", expect=(0,))
    for spec in ("fp32", "int9", "int4-g0", f"int4-g{HUGE}", "int4-g64-foo", "", "int1"):
        cli(f"quantize spec '{spec}'", "quantize", T, spec, "--out", "x")
    cli("quantize model with @spec", "quantize", f"{T}@int8", "int4", "--out", "x")
    cli("quantize missing model", "quantize", "/no/such", "int8", "--out", "x")
    cli("quantize feature draft", "quantize", m / "feature", "int8", "--out", "x")
    for flag in ("--calib-samples", "--calib-len", "--threads"):
        cli(f"quantize {flag} huge", "quantize", T, "int4-gptq", "--out", "x", flag, HUGE)
    cli("quantize --threads 99999", "quantize", T, "int8", "--out", "x", "--threads", 99999)

    # ---- compare
    c = ["compare", T, D, "--threads", "1", "--chat-prompts", "0"]
    cli("compare ok", *c, "--chunks", 2, "--chunk-len", 16, expect=(0,))
    cli("compare chunk-len over context", *c, "--chunks", 2, "--chunk-len", 4096)
    cli("compare chunk-len huge", *c, "--chunk-len", HUGE)
    cli("compare chunks huge", *c, "--chunks", 10 ** 9, "--chunk-len", 16)
    cli("compare chunks x len over text", *c, "--chunks", 10 ** 6, "--chunk-len", 500)
    cli("compare chat-prompts huge", "compare", T, D, "--threads", 1, "--chat-prompts", 10 ** 9)
    cli("compare temperature 0", *c, "--temperature", 0)
    cli("compare temperature nan", *c, "--temperature", "nan")
    cli("compare temperature huge", *c, "--temperature", "1e300")
    cli("compare threads 99999", *c, "--threads", 99999)
    cli("compare A feature draft", "compare", m / "feature", T)
    cli("compare B small embedding", "compare", T, m / "small", "--chunks", 2, "--chunk-len", 16,
        "--chat-prompts", 0)
    cli("compare B foreign", "compare", T, m / "foreign", "--chunks", 2, "--chunk-len", 16)

    # ---- calibrate
    k = ["calibrate", D, *tiny, "--prompts", 2, "--held-out", 1, "--steps", 2,
         "--max-new-tokens", 4, "--threads", 1]
    out_cases("calibrate", *k)
    cli("calibrate manifest not above --out", *k, "--out", "sub/cal", expect=(0,),
        protect=["sub/manifest.json"], setup=lambda p: (p / "sub").mkdir())

    def checkpoint(p: Path) -> None:
        (p / ".cal.ckpt").mkdir()
        (p / ".cal.ckpt" / "last.pt").write_bytes(b"x")

    cli("calibrate resume without --resume", *k, "--out", "cal", setup=checkpoint,
        protect=[".cal.ckpt"])
    for flag, v in (("--steps", HUGE), ("--prompts", HUGE), ("--held-out", HUGE),
                    ("--gamma", HUGE), ("--gamma", 65), ("--max-new-tokens", HUGE),
                    ("--max-new-tokens", 10 ** 6), ("--lr", "nan"), ("--lr", 0),
                    ("--loss", "bogus"), ("--loss", "mix:2"), ("--loss", "mix:nan"),
                    ("--threads", 99999)):
        cli(f"calibrate {flag} {v}", *k, flag, v, "--out", "x")
    cli("calibrate draft missing", "calibrate", "/no/such", *tiny)
    cli("calibrate target feature", "calibrate", D, "--target", m / "feature", "--out", "x")
    cli("calibrate draft foreign", "calibrate", m / "foreign", *tiny, "--out", "x")
    cli("calibrate draft small", "calibrate", m / "small", *tiny, "--out", "x", "--prompts", 1,
        "--held-out", 1, "--steps", 1, "--max-new-tokens", 4)

    # ---- distill
    s = ["distill", *tiny, "--arch", "1x32", "--steps", 2, "--new-tokens", 4, "--text-windows", 2,
         "--seq-len", 16, "--accept-prompts", 0, "--eval-every", 1, "--threads", 1]
    dp = ["--prompts", str(d / "prompts.txt"), "--texts"]
    cli("distill ok", *s, *dp, "--out", "new", expect=(0,))
    out_cases("distill", *s, *dp)
    cli("distill work is a file", *s, *dp, "--out", "x", "--work", "old", setup=existing_file,
        protect=["old"])
    for name in BAD_DATA:
        cli(f"distill --texts {name}", *s, "--prompts", "--texts", d / name, "--out", "x")
        cli(f"distill --prompts {name}", *s, "--texts", "--prompts", d / name, "--out", "x")
    for src in ("synthetic:" + HUGE, "synthetic:0", "synthetic:5-2", "synthetic:x", "nosuch"):
        cli(f"distill --prompts {src}", *s, "--texts", "--prompts", src, "--out", "x")
    for flag, v in (("--seed", 2 ** 64), ("--seed", -1), ("--threads", 99999),
                    ("--seq-len", HUGE), ("--seq-len", 10 ** 6), ("--batch", HUGE),
                    ("--gen-batch", HUGE), ("--head-vocab", HUGE), ("--new-tokens", HUGE),
                    ("--new-tokens", 10 ** 6), ("--gamma", HUGE), ("--steps", HUGE),
                    ("--minutes", "inf"), ("--minutes", "nan"), ("--minutes", 0), ("--lr", "inf"),
                    ("--text-windows", HUGE), ("--eval-every", HUGE), ("--checkpoint-every", HUGE),
                    ("--accept-prompts", HUGE), ("--arch", "0x32"), ("--arch", "2x33"),
                    ("--arch", f"{HUGE}x32"), ("--arch", "feature:0"),
                    ("--arch", f"feature:{HUGE}"), ("--loss", "xx")):
        cli(f"distill {flag} {v}", *s, *dp, "--out", "x", flag, v)
    cli("distill --temperatures nan", *s, *dp, "--out", "x", "--temperatures", "nan")
    cli("distill --temperatures -1", *s, *dp, "--out", "x", "--temperatures", "-1")
    cli("distill --temperatures huge", *s, *dp, "--out", "x", "--temperatures", "1e300")
    cli("distill --from foreign", *s, *dp, "--out", "x", "--from", m / "foreign")
    cli("distill --from small", *s, *dp, "--out", "x", "--from", m / "small")
    cli("distill target feature", "distill", "--target", m / "feature", "--out", "x", "--texts",
        "--prompts", d / "prompts.txt")
    cli("distill no data", *s, "--texts", "--prompts", "--out", "x")

    # ---- bench
    b = ["bench", "--targets", T, "--drafts", D, "--prompt-sets", "file",
         "--prompt-file", d / "prompts.txt", "--no-prompt-file-chat", "--prompts", 1,
         "--max-new-tokens", 2, "--threads", 1, "--resamples", 10]
    cli("bench ok", *b, "--results", "res.jsonl", expect=(0,))
    for flag, v in (("--threads", 99999), ("--threads", HUGE), ("--seed", 2 ** 64),
                    ("--seed", HUGE), ("--prompts", HUGE), ("--repeats", HUGE),
                    ("--resamples", HUGE), ("--gamma", HUGE), ("--gamma", 65),
                    ("--max-new-tokens", HUGE), ("--max-new-tokens", 10 ** 6),
                    ("--confidence", "nan"), ("--temperature", "nan"), ("--temperature", "inf"),
                    ("--draft-confidence", "nan"), ("--target-quant", "int9"), ("--results", "")):
        cli(f"bench {flag} {v}", *b, flag, v)
    cli("bench results is a folder", *b, "--results", d / "folder")
    cli("bench results parent is a file", *b, "--results", "old/r.jsonl", setup=existing_file,
        protect=["old"])
    cli("bench results unwritable", *b, "--results", "/proc/specq-probe/r.jsonl")
    cli("bench results non-UTF-8", *b, "--results", r / "nonutf8.jsonl",
        protect=[str(r / "nonutf8.jsonl")])
    cli("bench results torn middle", *b, "--results", r / "middle.jsonl",
        protect=[str(r / "middle.jsonl")])
    for name in BAD_DATA:
        cli(f"bench prompt file {name}", *b, "--prompt-file", d / name)
    cli("bench target feature draft", *b, "--targets", m / "feature")
    cli("bench draft small", *b, "--drafts", m / "small", "--results", "r.jsonl")
    cli("bench draft foreign", *b, "--drafts", m / "foreign", "--results", "r.jsonl")
    for name in ("nonutf8.toml", "bad.toml", "cut.toml", "folder", "missing.toml"):
        cli(f"bench config {name}", "bench", d / name)

    def toml(text: str):
        base = {"prompt_file": f'"{d / "prompts.txt"}"', "prompt_sets": '["file"]',
                "targets": f'["{T}"]', "drafts": f'["{D}"]', "prompt_file_chat": "false",
                "prompts": "1", "max_new_tokens": "2", "resamples": "10", "results": '"r.jsonl"'}
        key = text.split("=")[0].strip()
        lines = [text] + [f"{k} = {v}" for k, v in base.items() if k != key]

        def write(p: Path) -> None:
            (p / "c.toml").write_text("\n".join(lines) + "\n")
        return write

    for text in ("threads = 99999", "threads = [0]", f"seed = {2 ** 63}", "seed = -1",
                 "seed = 1.5", "prompts = 0", f"prompts = {2 ** 62}", "gamma = 1e3",
                 "gamma = [true]", "gamma = 'x'", "max_new_tokens = 1.5", "temperature = nan",
                 "temperature = inf", "confidence = nan", "resamples = true", "repeats = 'two'",
                 "results = 5", "prompt_field = ''", "prompt_file_chat = 1",
                 "draft_confidence = [nan]", "peer = 'yes'", "target_quant = [1]",
                 "draft_quant = 'int9'", "threads = [1.5]", "max_new_tokens = [0]",
                 "prompt_sets = []", "drafts = []", "bogus = 1", "max_new_tokens = 1000000"):
        cli(f"bench toml {text}", "bench", "c.toml", setup=toml(text.replace("'", '"')))

    # ---- report
    cli("report ok", "report", r / "results.jsonl", "--out", "rep", expect=(0,))
    cli("report out existing", "report", r / "results.jsonl", "--out", "old",
        protect=["old.md", "old.html"],
        setup=lambda p: ((p / "old.md").write_text("mine"), (p / "old.html").write_text("mine")))
    cli("report out is a folder", "report", r / "results.jsonl", "--out", "old", setup=lambda p: (
        (p / "old.md").mkdir()), protect=["old.md"])
    cli("report out unwritable", "report", r / "results.jsonl", "--out", "/proc/specq-probe/rep")
    cli("report out parent file", "report", r / "results.jsonl", "--out", "old/rep",
        setup=existing_file, protect=["old"])
    for name in ("nofields.jsonl", "partial.jsonl", "nokey.jsonl", "runonly.jsonl", "scalars.jsonl",
                 "middle.jsonl", "nonutf8.jsonl"):
        cli(f"report {name}", "report", r / name, "--out", "rep")
    cli("report results folder", "report", d / "folder")
    cli("report results missing", "report", "/no/such.jsonl")
    cli("report results empty", "report", d / "empty.jsonl", "--out", "rep")
    for flag, v in (("--resamples", 0), ("--resamples", -1), ("--resamples", HUGE),
                    ("--resamples", "x"), ("--confidence", "nan"), ("--confidence", 1),
                    ("--confidence", "x")):
        cli(f"report {flag} {v}", "report", r / "results.jsonl", "--out", "rep", flag, v)

    # ---- parser
    cli("no args", )
    cli("unknown subcommand", "frobnicate")
    cli("generate no prompt", "generate")

    # ---- Python API
    def gen(prompt="t1 t2", draft=True, **kw):
        t = specq.load(T)
        return specq.generate(t, prompt, specq.load(D) if draft else None,
                              max_new_tokens=kw.pop("n", 4), **kw)

    api("api ok", lambda: gen(), expect=(0,))
    for name, kw in {
        "prompt int": dict(prompt=123), "prompt None": dict(prompt=None),
        "prompt list of str": dict(prompt=["a"]), "prompt ids negative": dict(prompt=[-1, 2]),
        "prompt ids out of vocab": dict(prompt=[1, 10 ** 6]),
        "prompt ids floats": dict(prompt=[1.5]),
        "prompt empty list": dict(prompt=[]), "prompt bytes": dict(prompt=b"t1"),
        "prompt surrogate": dict(prompt="t1 \udcff"),
        "gamma str": dict(gamma="x"), "gamma None": dict(gamma=None), "gamma 1.5": dict(gamma=1.5),
        "gamma huge": dict(gamma=10 ** 20), "gamma -1": dict(gamma=-1),
        "gamma True": dict(gamma=True), "n str": dict(n="5"), "n None": dict(n=None),
        "n 1.5": dict(n=1.5), "n nan": dict(n=float("nan")),
        "n -1": dict(n=-1), "n huge": dict(n=10 ** 20), "temperature None": dict(temperature=None),
        "temperature str": dict(temperature="hot"),
        "temperature nan": dict(temperature=float("nan")),
        "temperature inf": dict(temperature=float("inf")), "top_k -1": dict(top_k=-1),
        "top_k 1.5": dict(top_k=1.5), "top_k None": dict(top_k=None),
        "top_k huge": dict(top_k=10 ** 20), "top_p nan": dict(top_p=float("nan")),
        "top_p str": dict(top_p="x"), "seed -1": dict(seed=-1), "seed 2^64": dict(seed=2 ** 64),
        "seed str": dict(seed="a"), "seed None": dict(seed=None), "seed 1.5": dict(seed=1.5),
        "stop str": dict(stop="t3"), "stop [1]": dict(stop=[1]), "stop [None]": dict(stop=[None]),
        "draft_confidence nan": dict(draft_confidence=float("nan")),
        "draft_confidence str": dict(draft_confidence="x"), "chat on tiny": dict(chat=True),
    }.items():
        expect = (0, 2) if name in ("stop str",) else (0,) if name == "gamma None" else (2,)
        api(f"api generate {name}", lambda kw=kw: gen(**kw), expect=expect)
    api("api generate target str", lambda: specq.generate("smollm2-135m", "hi"))
    api("api generate target None", lambda: specq.generate(None, "hi"))
    api("api generate draft int", lambda: specq.generate(specq.load(T), "t1", 5))
    api("api generate draft str", lambda: specq.generate(specq.load(T), "t1", D))
    api("api generate feature target", lambda: specq.generate(specq.load(str(m / "feature")), "t1"))
    api("api generate small draft", lambda: gen(draft=False) and specq.generate(
        specq.load(T), "t1 t2", specq.load(str(m / "small")), max_new_tokens=8))
    for name, ref in {"int": 123, "None": None, "list": [], "empty": "", "bytes": b"x",
                      "int9": f"{T}@int9", "spaces": "   ", "nul": "a\x00b", "surrogate": "\udcff",
                      "dict": {}}.items():
        api(f"api load {name}", lambda ref=ref: specq.load(ref))
    api("api ModelPool int", lambda: specq.ModelPool(5).generate("hi"))
    api("api ModelPool precision int", lambda: specq.ModelPool(T).generate("t1", precision=4))
    api("api ModelPool bad precision", lambda: specq.ModelPool(T).generate("t1", precision="int9"))
    api("api check_compatible None", lambda: specq.check_compatible(None, specq.load(T)))
    return out


def run_all(only: str | None, verbose: bool) -> int:
    root = Path(tempfile.mkdtemp(prefix="specq-probe-"))
    # calibrate registers drafts in the cache: keep the real one clean
    os.environ["SPECQ_CACHE"] = str(root / "cache")
    os.environ["HF_HUB_OFFLINE"] = "1"
    models, data, results = root / "models", root / "data", root / "results"
    models.mkdir()
    results.mkdir()
    make_models(models)
    make_data(data)
    make_results(results, models, data)
    todo = [c for c in cases(models, data, results) if not only or only in c.name]
    failed = 0
    for i, case in enumerate(todo):
        scratch = root / "runs" / f"{i:03d}"
        scratch.mkdir(parents=True)
        if case.setup:
            case.setup(scratch)
        before = {p: tree_digest(scratch / p) for p in case.protect}
        code, stdout, err = run_case(case, scratch)
        why = verdict(case, code, err, before, scratch)
        if why:
            failed += 1
            first = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"FAIL {case.name}: {why} | {first[:200]}")
        elif verbose:
            print(f"ok   {case.name}: {err.strip()[:160]}")
        sys.stdout.flush()
    print(f"{failed} of {len(todo)} cases flagged ({root})")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--verbose", action="store_true", help="also print the passing cases")
    args = parser.parse_args()
    sys.exit(run_all(args.only, args.verbose))
