"""The `specq` command: a thin layer that parses, calls the Python API, and prints.

Bad input exits with code 2 and one line on stderr; SPECQ_DEBUG=1 shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from . import checks
from .bench.cli import add_bench_parser, add_report_parser
from .checks import MAX_SEED, MAX_THREADS, arg_float, arg_int, arg_path, read_text
from .core.gamma import AUTO, MAX_GAMMA, GammaMemory
from .drafters import lookahead, ngram
from .drafters.base import DEFAULT_GAMMA, SAMPLING_GAMMA
from .drafters.sequence import DEFAULT_DRAFT_CONFIDENCE
from .drafters.suffix import DEFAULT_TOKENS as DEFAULT_SUFFIX_TOKENS
from .drafters.suffix import check_tokens
from .drafters.tree import DEFAULT_TREE, TreeShape
from .drafts_cli import add_drafts_parser
from .errors import SpecqError
from .kernels import build as kernel_build
from .loading.refs import DraftRef, LookaheadRef, check_ref, draft_ref, model_ref
from .qad_cli import add_qad_parser

# `distill --lora`: an adapter of a higher rank is no longer small beside its base
LORA_MAX_RANK = 256

# The names of `specq.backends.BACKENDS` (importing it here would load torch for
# every `specq --help`)
BACKEND_HELP = ("what the models run on: kernels (specq's CPU kernels, the default), eager "
                "(torch's ops, the reference) or compiled (torch.compile of fixed-shape steps, a "
                "minute per new shape)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints the whole usage)
        raise SpecqError(f"{self.prog}: {message}")


_positive_int = arg_int(1)
_nonnegative_int = arg_int(0)
_seed = arg_int(0, MAX_SEED)
_threads = arg_int(1, MAX_THREADS)
_float = arg_float()


def _gamma(text: str) -> int | str:
    if text == AUTO:
        return text
    if text.isdigit() and 1 <= int(text) <= MAX_GAMMA:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a whole number in [1, {MAX_GAMMA}] or '{AUTO}', "
                                     f"got '{text}'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specq",
                     description="Lossless speculative decoding with quantized models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text, speculatively when a draft is available")
    g.add_argument("prompt", help="the prompt text, or @FILE to read it from a file")
    g.add_argument("--target", default="smollm2-135m", help="model ref (default: smollm2-135m)")
    g.add_argument("--draft", default=None,
                   help="draft model ref (default: the target's own default: its registered draft, "
                        "else the smallest known model with its tokenizer, behind an n-gram "
                        "lookup; the note after the output says which); self@SPEC: the "
                        "target's own weights at SPEC (e.g. self@int8-head8); self@skip[=LAYERS]: "
                        "some of the target's own layers, on its weights (those skipped chosen by "
                        "a short calibration, cached, or listed: skip=3-9+14); REF:window=W: a "
                        "model draft that reads only the prompt's last W tokens; refs joined by "
                        "commas, cheapest first: a hierarchy, each level verifying the ones below; "
                        f"{ngram.NAME}[:n=N|n=MIN-MAX][:k=K][:c=C]: n-gram lookup in the prompt "
                        "and the text so far, no model (match the last N tokens, then fewer down "
                        "to MIN, propose up to K, up to C where the match agrees over more than N "
                        f"tokens; default n={ngram.DEFAULT_N_MIN}-{ngram.DEFAULT_N_MAX}, "
                        f"k={ngram.DEFAULT_K}, c={ngram.DEFAULT_COPY}); {ngram.NAME}+REF: the "
                        "model REF drafts where "
                        f"nothing matches; {lookahead.NAME}[:w=W][:n=N][:g=G]: lookahead "
                        "decoding, no model (a window of W guesses from the target's own verify "
                        "passes and G n-grams of N tokens; default "
                        f"w={lookahead.DEFAULT_W}, n={lookahead.DEFAULT_N}, "
                        f"g={lookahead.DEFAULT_G})")
    g.add_argument("--gamma", type=_gamma, default=None,
                   help=f"draft tokens per step, or '{DEFAULT_GAMMA}' (the default when greedy; "
                        f"sampling: {SAMPLING_GAMMA}, so that a seed repeats its output; --tree: "
                        "the tree's depth): each step's length (0 = plain, up to 4) chosen from "
                        "measured acceptance and timings")
    g.add_argument("--tree", type=arg_int(1, MAX_GAMMA), default=None, metavar="N",
                   help="propose dynamic token trees of up to N nodes (EAGLE-2) instead of chains")
    g.add_argument("--tree-depth", type=arg_int(1, MAX_GAMMA), default=DEFAULT_TREE.depth,
                   help=f"with --tree: levels per tree (default {DEFAULT_TREE.depth}; --gamma auto "
                        "chooses each step's depth up to it)")
    g.add_argument("--tree-topk", type=arg_int(1, MAX_GAMMA), default=DEFAULT_TREE.topk,
                   help=f"with --tree: children per expanded node and nodes expanded per level "
                        f"(default {DEFAULT_TREE.topk})")
    g.add_argument("--max-new-tokens", type=_positive_int, default=128)
    g.add_argument("--draft-confidence", type=_float, default=DEFAULT_DRAFT_CONFIDENCE,
                   help="end a draft early below this draft probability (default "
                        f"{DEFAULT_DRAFT_CONFIDENCE}, as transformers; 0 = always gamma tokens)")
    g.add_argument("--temperature", type=_float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=_nonnegative_int, default=0)
    g.add_argument("--top-p", type=_float, default=1.0)
    g.add_argument("--seed", type=_seed, default=0)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    g.add_argument("--no-speculative", action="store_true",
                   help="plain decoding with the target only")
    g.add_argument("--ignore-eos", action="store_true", help="run to --max-new-tokens (benchmarks)")
    g.add_argument("--no-warmup", action="store_true", help="time the first call too")
    g.add_argument("--threads", type=_threads, default=None, help="torch CPU threads")
    g.add_argument("--backend", default="kernels", help=BACKEND_HELP)
    g.add_argument("--explain", action="store_true",
                   help="print what each model runs on (backend, kernel build, the kernel of its "
                        "linear layers)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    q = sub.add_parser("quantize",
                       help="quantize a model once and save it (safetensors + quant config)")
    q.add_argument("model", help="model ref (float weights)")
    q.add_argument("spec", help="e.g. int8, int4-g128-gptq, int3-g64-awq, int2-g32-rtn")
    q.add_argument("--out", type=arg_path, required=True,
                   help="output directory, or .gguf file with --format gguf (written atomically)")
    q.add_argument("--force", action="store_true",
                   help="replace --out if it exists (only a folder specq wrote, or a file)")
    q.add_argument("--format", choices=["specq", "gguf"], default="specq",
                   help="specq: a folder specq loads; gguf: one GGUF file llama.cpp runs (Q4_0 / "
                        "Q4_1 / Q8_0 blocks holding specq's weights exactly; its scales rounded "
                        "so that fp16 holds them)")
    q.add_argument("--calib-samples", type=_positive_int, default=32,
                   help="GPTQ/AWQ calibration windows")
    q.add_argument("--calib-len", type=_positive_int, default=None,
                   help="tokens per calibration window, at most the model's context (default 512, "
                        "or the context if shorter)")
    q.add_argument("--threads", type=_threads, default=None,
                   help="torch CPU threads; GPTQ/AWQ codes differ by thread count, so the folder's "
                        "quant_config.json records it")
    q.set_defaults(func=cmd_quantize)

    e = sub.add_parser("export-gguf",
                       help="write a model specq made (quantized, QAD, a distilled or calibrated "
                            "draft) as a GGUF file llama.cpp runs")
    e.add_argument("model", help="model ref: a folder from quantize / qad / distill / calibrate, "
                                 "or MODEL@SPEC")
    e.add_argument("--out", type=arg_path, required=True,
                   help="the .gguf file (written atomically)")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")
    e.set_defaults(func=cmd_export_gguf)

    c = sub.add_parser("compare",
                       help="divergence of model B from model A, and predicted acceptance")
    c.add_argument("a", help="model ref A (e.g. the target: smollm2-135m)")
    c.add_argument("b", help="model ref B (e.g. smollm2-135m@int4-g128-gptq, or a draft)")
    c.add_argument("--chunks", type=_positive_int, default=16, help="held-out text chunks")
    c.add_argument("--chunk-len", type=_positive_int, default=256, help="tokens per chunk")
    c.add_argument("--chat-prompts", type=_nonnegative_int, default=8,
                   help="held-out chat prompts answered greedily by A, scored by both")
    c.add_argument("--temperature", type=_float, default=1.0)
    c.add_argument("--threads", type=_threads, default=None)
    c.add_argument("--backend", default="kernels",
                   help=BACKEND_HELP + "; both models (what specq's kernels change: compare "
                                       "kernels with eager)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)

    k = sub.add_parser("calibrate", help="fine-tune a draft on a (quantized) target's own outputs")
    k.add_argument("draft",
                   help="the draft to calibrate (a local model directory or built-in name)")
    k.add_argument("--target", required=True,
                   help="target ref with its precision, e.g. smollm2-135m@int4-g64-gptq")
    k.add_argument("--prompts", type=_positive_int, default=48,
                   help="training prompts the target answers")
    k.add_argument("--held-out", type=_positive_int, default=8,
                   help="held-out prompts for before/after acceptance")
    k.add_argument("--steps", type=_positive_int, default=300, help="fine-tuning steps")
    k.add_argument("--max-new-tokens", type=_positive_int, default=128)
    k.add_argument("--loss", default="mix:0.5", help="kl, tv or mix:W ((1-W)*KL + W*TV)")
    k.add_argument("--lr", type=_float, default=5e-4)
    k.add_argument("--gamma", type=arg_int(1, MAX_GAMMA), default=4)
    k.add_argument("--out", type=arg_path, default=None,
                   help="output directory (default: $SPECQ_CACHE/drafts/...)")
    k.add_argument("--force", action="store_true",
                   help="replace --out if it exists (only a folder specq wrote)")
    k.add_argument("--resume", action="store_true",
                   help="continue the unfinished run for --out from its checkpoint")
    k.add_argument("--register", action="store_true",
                   help="add the result to your draft registry for the target's precision, so that "
                        "generate, bench and serve use it there (default: only saved; see `specq "
                        "drafts`)")
    k.add_argument("--threads", type=_threads, default=None)
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_calibrate)

    d = sub.add_parser("distill",
                       help="train a draft for a target (text + the target's own answers)")
    d.add_argument("--target", default="smollm2-135m",
                   help="target ref, any precision (default: smollm2-135m)")
    d.add_argument("--out", type=arg_path, required=True, help="output directory of the draft")
    d.add_argument("--register", action="store_true",
                   help="add the draft to your draft registry for the target's precision, so that "
                        "generate, bench and serve use it there (default: only saved; see `specq "
                        "drafts`)")
    d.add_argument("--force", action="store_true",
                   help="replace --out if it exists (only a folder specq wrote)")
    start = d.add_mutually_exclusive_group()
    start.add_argument("--from", dest="base", default=None,
                       help="continue from this draft (a local directory)")
    start.add_argument("--arch", default="small",
                       help="shape of a new draft: small (6x256), tiny, LxWIDTH, or "
                            "feature[:LAYERS] (a feature draft: reads the target's hidden states, "
                            "EAGLE style)")
    d.add_argument("--head-vocab", type=_positive_int, default=None,
                   help="feature drafts: tokens the output head covers, the most frequent in the "
                        "training data (default 16384 for a new draft; with --from, narrows the "
                        "base's head to that many)")
    d.add_argument("--lora", type=arg_int(1, LORA_MAX_RANK), default=None, metavar="RANK",
                   help="train a LoRA adapter of this rank on --from (any model ref, e.g. a "
                        "built-in GGUF draft: its float weights) and save the adapter alone, in "
                        "peft's format; it loads as a draft, merged into its base (on a GGUF file: "
                        "into its 4-bit body, gguf-int4)")
    d.add_argument("--work", type=arg_path, default=None,
                   help="cache and checkpoints (default: OUT.work beside OUT)")
    d.add_argument("--resume", action="store_true", help="continue the unfinished run in --work")
    d.add_argument("--texts", nargs="*", default=["shakespeare"],
                   help="text sources: shakespeare, or .txt / .jsonl files ('text' field); none: "
                        "--texts")
    d.add_argument("--prompts", nargs="*", default=["chat"],
                   help="prompt sources the target answers: chat, synthetic:N (or synthetic:A-B, a "
                        "later slice of the same list), or files (one per line / .jsonl 'prompt' "
                        "field); none: --prompts")
    d.add_argument("--temperatures", nargs="+", type=arg_float(0, 100), default=[0.0],
                   help="one target answer per prompt per temperature (0 = greedy)")
    d.add_argument("--new-tokens", type=_positive_int, default=128,
                   help="length of the target's answers")
    d.add_argument("--text-windows", type=_positive_int, default=160,
                   help="training windows of text")
    d.add_argument("--seq-len", type=arg_int(16), default=256, help="tokens per text window")
    d.add_argument("--steps", type=_nonnegative_int, default=2000,
                   help="training steps (0: no training, e.g. only narrow a base's head, then "
                        "measure and export)")
    d.add_argument("--minutes", type=_float, default=None,
                   help="time budget of the whole command: teacher data takes at most half of it "
                        "(training uses the shards made by then), training the rest less the final "
                        "measurements")
    d.add_argument("--loss", default="mix:0.5", help="kl, tv or mix:W ((1-W)*KL + W*TV)")
    d.add_argument("--lr", type=_float, default=2e-3)
    d.add_argument("--batch", type=_positive_int, default=8)
    d.add_argument("--eval-every", type=_positive_int, default=100,
                   help="steps between held-out evaluations")
    d.add_argument("--checkpoint-every", type=_positive_int, default=50)
    d.add_argument("--gen-batch", type=_positive_int, default=48,
                   help="prompts answered at once (one shard)")
    d.add_argument("--accept-prompts", type=_nonnegative_int, default=10,
                   help="held-out chat prompts for the final speculative runs (0: skip)")
    d.add_argument("--gamma", type=arg_int(1, MAX_GAMMA), default=4)
    d.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="dtype of the saved draft")
    d.add_argument("--compute", choices=["fp32", "bf16"], default="fp32",
                   help="training's matrix products: fp32, or bf16 under autocast (faster on CPUs "
                        "with AVX-512 BF16, slower on others)")
    d.add_argument("--seed", type=_seed, default=0)
    d.add_argument("--threads", type=_threads, default=None)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_distill)

    s = sub.add_parser("serve", help="an OpenAI-compatible server: a target at several precisions, "
                                     "each with its draft")
    s.add_argument("--target", default="smollm2-135m",
                   help="model ref without @spec (default: smollm2-135m)")
    s.add_argument("--precisions", type=_precisions, default=None,
                   help="comma-separated precisions to serve, e.g. fp32,int4-g64-rtn-head8 "
                        "(default: the target's own, as generate runs it: a GGUF file's gguf, "
                        "else fp32); requests name one as model 'TARGET@PRECISION', the bare "
                        "TARGET is the first")
    s.add_argument("--draft", default=None,
                   help="one draft for every precision (default: the registry's for each); "
                        f"{ngram.NAME}[:n=N][:k=K], {ngram.NAME}+REF or "
                        f"{lookahead.NAME}[:w=W][:n=N][:g=G] as for generate")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1, this machine only)")
    s.add_argument("--port", type=arg_int(0, 65535), default=8000,
                   help="port (default 8000; 0: any free port)")
    s.add_argument("--api-key", default=os.environ.get("SPECQ_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes; several keys "
                        "separated by commas, each with its own suffix cache (default: "
                        "$SPECQ_API_KEY, else none)")
    s.add_argument("--queue", type=arg_int(1, 100_000), default=16,
                   help="requests waiting per served model beyond the running ones; more get 429 "
                        "(default 16)")
    s.add_argument("--max-batch", type=arg_int(1, 256), default=16,
                   help="requests per served model decoded together, one target pass per step for "
                        "all (default 16; 1: one at a time)")
    s.add_argument("--spec-max-batch", type=arg_int(0, 256), default=None,
                   help="speculate only in steps of at most this many requests; a larger step "
                        "decodes plainly, lossless either way (default 2, from the measurements in "
                        "docs/performance.md; 256: always speculate, 0: never)")
    s.add_argument("--timeout", type=arg_float(0.001), default=600.0,
                   help="seconds from a request's arrival to its last token; later ones are "
                        "cancelled (default 600)")
    s.add_argument("--suffix-cache", type=arg_int(0), default=DEFAULT_SUFFIX_TOKENS,
                   metavar="TOKENS",
                   help="tokens of earlier requests (prompts and outputs) kept per served model "
                        "and API key, where n-gram drafts also look (default "
                        f"{DEFAULT_SUFFIX_TOKENS}; 0: none)")
    s.add_argument("--threads", type=_threads, default=None, help="torch CPU threads")
    s.set_defaults(func=cmd_serve)

    add_bench_parser(sub)
    add_report_parser(sub)
    add_drafts_parser(sub)
    add_qad_parser(sub)
    return parser



def leaf_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every leaf command under `parser` by its words ("generate", "drafts add"): what the
    reference lists (docs/reference.md)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(node: argparse.ArgumentParser, words: list[str]) -> None:
        subs = [a for a in node._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and words:
            found[" ".join(words)] = node
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, [*words, name])

    walk(parser, [])
    return found

def _precisions(text: str) -> tuple[str, ...]:
    specs = tuple(p.strip() for p in text.split(","))
    if not all(specs):
        raise argparse.ArgumentTypeError(f"an empty precision in '{text}' (give e.g. "
                                         "fp32,int4-g64-rtn-head8)")
    return specs


def cmd_serve(args) -> int:
    import torch

    from .serve.server import ServeConfig, bind, build_app, run

    if args.threads:
        torch.set_num_threads(args.threads)
    if model_ref(checks.text("--target", args.target)).has_spec:
        raise SpecqError("give the target without @spec; list precisions with --precisions")
    # names and headers first (`ServeConfig`), then the port, then the models (`build_app`): each
    # a one-line error before the server listens
    keys = () if args.api_key is None else tuple(args.api_key.split(","))
    if any(not key or any(c.isspace() for c in key) for key in keys):
        raise SpecqError("--api-key must be one or more non-empty keys without spaces, separated "
                         "by commas")
    check_tokens("--suffix-cache", args.suffix_cache)
    given = {} if args.spec_max_batch is None else {"spec_max_batch": args.spec_max_batch}
    config = ServeConfig(target=args.target, precisions=args.precisions, draft=args.draft,
                         api_keys=keys, queue=args.queue, timeout_s=args.timeout,
                         max_batch=args.max_batch, suffix_tokens=args.suffix_cache, **given)
    sock = bind(args.host, args.port)  # before the models load
    try:
        app = build_app(config)
    except BaseException:
        sock.close()
        raise
    run(app, sock)
    return 0


def _read_prompt(text: str) -> str:
    if text == "@":
        raise SpecqError("a bare '@' names no prompt file: give @FILE, or the prompt text itself")
    if text.startswith("@"):
        return read_text(text[1:], "prompt file")
    return checks.text("the prompt", text)


def _check_models(target: str, drafts=(), others=()) -> None:
    """What the refs alone show, before any model loads (names and paths, then file headers):
    each ref's form and what is at its path (`check_ref`), the target a ref that can be one, and
    each of `drafts` reading the target's tokenizer (`vocab.check_names`); `others` are refs
    given but not paired with the target."""
    from .loading.vocab import check_names, check_target_ref

    for ref in [target, *drafts, *others]:
        check_ref(ref)
    check_target_ref(target)
    for ref in drafts:
        check_names(ref, target)


def cmd_generate(args) -> int:
    import torch

    from . import api, backends
    from .loading.drafts.default import load_default
    from .loading.kinds import load
    from .report import print_backends, print_generation

    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = _read_prompt(args.prompt)
    if not prompt.strip():
        raise SpecqError("the prompt is empty")
    given = draft_ref(args.draft) if args.draft else None  # checked before any model loads
    used = None if args.no_speculative else given
    decoding = dict(gamma=_decode_gamma(args, used), temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, stop=args.stop,
                    draft_confidence=args.draft_confidence)
    api.check_options(max_new_tokens=args.max_new_tokens, **decoding)  # before the models load
    backends.check_name(args.backend)
    models = given.for_target(args.target).models if given else []
    _check_models(args.target, models if used else [], models if not used else [])
    # the warm-up run's gamma auto estimates carry over to the run that counts
    options = decoding | dict(chat=args.chat, ignore_eos=args.ignore_eos, tree=_tree(args, used),
                              gamma_memory=GammaMemory())
    target = load(args.target, args.backend)
    note, draft = None, None
    load_draft = lambda ref: load(ref, args.backend, target=target)  # noqa: E731
    if used is not None:
        draft = used.for_target(args.target).build(load_draft)
    elif not args.no_speculative:
        draft, note = load_default(args.target, load_draft)
    models = [target, *ngram.draft_models(draft)]
    explained = {m.ref: backends.describe(m.runner) for m in models}
    if not args.no_warmup:  # first calls pay for allocation and lazy init: keep them out of timings
        api.generate(target, prompt, draft, max_new_tokens=min(8, args.max_new_tokens), **options)
    out = api.generate(target, prompt, draft, max_new_tokens=args.max_new_tokens, **options)
    compile_s = (sum(getattr(m.runner, "compile_s", 0.0) for m in models)
                 if args.backend == "compiled" else None)
    if args.json:
        print(json.dumps(out.to_dict() | {"compile_s": compile_s, "draft_note": note,
                                          "backends": explained}))
    else:
        if args.explain:
            print_backends(explained)
        print_generation(out)
        if note:
            print(f"note: {note}")
        if compile_s is not None:
            print(f"torch.compile: {compile_s:.1f} s compiling step shapes (excluded from the "
                  "timings above"
                  f"{'' if not args.no_warmup else ' only where the warm-up paid it'})")
    return 0


def _tree(args, draft: DraftRef | None) -> TreeShape | None:
    """--tree's shape; the lowest level of the `draft` used grows the trees."""
    if args.tree and draft is not None and not draft.grows_trees:
        raise SpecqError(lookahead.NO_TREES if isinstance(draft.lookup, LookaheadRef)
                         else ngram.NO_TREES)
    return TreeShape(args.tree, args.tree_depth, args.tree_topk) if args.tree else None


def _decode_gamma(args, draft: DraftRef | None) -> int | str:
    """--gamma, or its default; with --tree a tree's depth is --tree-depth, with an n-gram draft
    alone its length is its k, with a lookahead draft its shape's, and only 'auto' may be given
    with any of them."""
    if args.tree and args.gamma not in (None, AUTO):
        raise SpecqError(f"with --tree the depth is --tree-depth, not --gamma (only --gamma {AUTO} "
                         "goes with --tree)")
    if draft is not None and draft.lookup_alone and args.gamma not in (None, AUTO):
        if isinstance(draft.lookup, LookaheadRef):
            raise SpecqError(f"a lookahead draft's depth is its window's or its n-grams' "
                             f"({lookahead.NAME}:w=W:n=N), not --gamma (only --gamma {AUTO} "
                             "goes with it)")
        raise SpecqError(f"an n-gram draft's length is its k ({ngram.NAME}:k=N), not --gamma (only "
                         f"--gamma {AUTO} goes with it)")
    return args.gamma  # None: the default (drafters.base.default_gamma)


def cmd_quantize(args) -> int:
    import torch

    from .loading import precision
    from .loading.kinds import load
    from .weights.quant import weight_bytes

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = precision.parse(args.spec)
    if spec.is_float:
        raise SpecqError(f"'{args.spec}' is a float precision: nothing to quantize")
    if model_ref(args.model).spec != "fp32":
        raise SpecqError("give the float model to quantize, without an @spec")
    gguf = args.format == "gguf"
    if gguf:
        from .loading.formats import gguf_write
        from .weights.quant.rtn import fp16_offsets

        gguf_write.check_spec(spec)
        _gguf_out(args.out)
    checks.output(args.out, args.force, "--out", folder=not gguf)
    check_ref(args.model)
    model = load(args.model, backend=None)  # quantized below, then saved
    if gguf:
        gguf_write.check_model(model)  # what the file cannot hold, before quantizing
        with fp16_offsets():
            precision.quantize_net(model.net, model.tokenizer, spec, args.calib_samples,
                                   args.calib_len)
        counts = gguf_write.write(model, args.out)
        print(f"saved {args.model}@{spec} to {args.out}: {_counts(counts)}")
        return 0
    made = precision.quantize_net(model.net, model.tokenizer, spec, args.calib_samples,
                                  args.calib_len)
    precision.save_quantized_dir(model.net, spec, model.tokenizer, model.eos_ids, args.out, made)
    size = weight_bytes(model.net)
    print(f"saved {args.model}@{spec} to {args.out}: weights {size.stored / 2**20:.1f} MiB stored, "
          f"{size.executed / 2**20:.1f} MiB executed")
    return 0


def _gguf_out(out) -> None:
    if not str(out).endswith(".gguf"):
        raise SpecqError(f"--out '{out}' is a GGUF file: name it *.gguf")


def _counts(counts) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.most_common()) + " tensors"


def cmd_export_gguf(args) -> int:
    from .loading.formats import gguf_write
    from .loading.kinds import load

    _gguf_out(args.out)
    checks.output(args.out, args.force, "--out", folder=False)
    check_ref(args.model)
    model = load(args.model, backend=None)  # its modules as made: the quantized layers' codes
    counts = gguf_write.write(model, args.out)
    print(f"saved {args.model} to {args.out}: {_counts(counts)}")
    return 0


def cmd_compare(args) -> int:
    import torch

    from . import backends
    from .loading.kinds import load
    from .loading.vocab import check_compatible
    from .report import print_comparison
    from .training.divergence import compare, held_out_chunks

    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0 < args.temperature <= 100:
        raise SpecqError(f"--temperature must be in (0, 100], got {args.temperature}")
    backends.check_name(args.backend)
    _check_models(args.a, [args.b])
    a, b = load(args.a, args.backend), load(args.b, args.backend)
    check_compatible(b, a)  # and A can be a target (not a feature draft)
    chunks = held_out_chunks(a, args.chunks, args.chunk_len, args.chat_prompts)
    result = compare(a, b, chunks, temperature=args.temperature)
    result.update(a=args.a, b=args.b, backend=args.backend)
    if args.json:
        print(json.dumps(result))
    else:
        print_comparison(result)
    return 0


def _training_options(args) -> None:
    """Checks and thread count shared by the commands that train a draft (calibrate, distill)."""
    import torch

    from .training.distill import tv_weight

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        tv_weight(args.loss)
    except ValueError as e:
        raise SpecqError(str(e)) from None
    if not 0 < args.lr < 1:
        raise SpecqError(f"--lr must be in (0, 1), got {args.lr}")


def cmd_calibrate(args) -> int:
    from .loading.kinds import load
    from .training.calibrate import (CalibrationSettings, calibrate, check_output, default_out,
                                     ref_precision)

    _check_models(args.target, [args.draft])
    _training_options(args)
    settings = CalibrationSettings(prompts=args.prompts, held_out=args.held_out,
                                   max_new_tokens=args.max_new_tokens, steps=args.steps,
                                   loss=args.loss, lr=args.lr, gamma=args.gamma)
    out = args.out or default_out(args.draft, ref_precision(args.target))
    check_output(out, args.force, args.resume)  # before the models load
    # the draft is trained
    target, draft = load(args.target, backend=None), load(args.draft, backend=None)
    report = calibrate(target, draft, settings, out=out, force=args.force, resume=args.resume,
                       register=args.register)
    if args.json:
        print(json.dumps(report))
    else:
        for when in ("before", "after"):
            a, t = report[when]["acceptance_rate"], report[when]["tau"]
            print(f"{when:6s} acceptance {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}]  tau {t[0]:.2f} "
                  f"[{t[1]:.2f}, {t[2]:.2f}]  (gamma {args.gamma}, greedy, {args.held_out} "
                  "held-out prompts, 95% CI)")
        print(f"saved {report['draft']}; {_registration(report['registered'], report['target'])}")
    return 0


def _registration(registered: bool, target: str) -> str:
    if registered:
        return f"registered for {target} in your draft registry (`specq drafts list`)"
    return (f"not registered: add --register, or `specq drafts add DRAFT --target {target}`, to "
            f"make it {target}'s draft")


def _lora_base(ref: str) -> str:
    """A LoRA adapter trains on its base's float weights: a ref without @ loads at fp32, one at a
    quantized precision is refused (before anything loads)."""
    from .loading import precision

    if not model_ref(ref).has_spec:
        return f"{ref}@fp32"
    if not precision.is_float(model_ref(ref).spec.strip().lower()):
        raise SpecqError("--lora trains on the float weights of its base: give --from without @, "
                         f"or @fp32 (not '{ref}')")
    return ref


def cmd_distill(args) -> int:
    import time
    from pathlib import Path

    import torch

    from .loading.kinds import load
    from .training import students
    from .training.train import DistillSettings, check_run, check_sources, run

    _check_models(args.target, [] if args.base is None else [args.base])
    _training_options(args)
    if args.minutes is not None and args.minutes <= 0:
        raise SpecqError(f"--minutes must be positive, got {args.minutes}")
    if not args.texts and not args.prompts:
        raise SpecqError("no training data: give --texts and/or --prompts")
    if args.lora is not None and args.base is None:
        raise SpecqError("--lora trains an adapter on a base model: give --from")
    if args.lora is not None and args.base is not None:
        _lora_base(args.base)
    if args.lora is not None and args.head_vocab is not None:
        raise SpecqError("--head-vocab is for feature drafts, not --lora (narrow an adapter's base "
                         "at load: @gguf-int4-head32k)")
    if args.base is None:  # validate before loading anything
        students.check_arch(args.arch)
        if (args.head_vocab is not None
            and not students.of(students.arch_kind(args.arch)).head_vocab):
            raise SpecqError("--head-vocab is for feature drafts (--arch feature, or --from a "
                             "feature draft)")
    out = Path(args.out)
    work = Path(args.work) if args.work else out.parent / f"{out.name}.work"
    check_run(out, work, args.force, args.resume)
    check_sources(args.texts, args.prompts)
    settings = DistillSettings(
        texts=tuple(args.texts), prompts=tuple(args.prompts), temperatures=tuple(args.temperatures),
        new_tokens=args.new_tokens, text_windows=args.text_windows, seq_len=args.seq_len,
        steps=args.steps, minutes=args.minutes, loss=args.loss, lr=args.lr, batch=args.batch,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        gen_batch=args.gen_batch, accept_prompts=args.accept_prompts, gamma=args.gamma,
        compute=args.compute, head_vocab=args.head_vocab, lora_rank=args.lora, seed=args.seed,
        extra={"command": "specq " + shlex.join(args.argv)})
    started = time.monotonic()  # --minutes bounds the command from here, model loading included
    target = load(args.target, backend=None)  # teacher passes read its weights
    base = (load(_lora_base(args.base) if args.lora else args.base, backend=None)
            if args.base else None)
    report = run(target, out, work, settings, base=base, arch=args.arch, resume=args.resume,
                 force=args.force, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                 register=args.register, since=started)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "history"}))
        return 0
    h = report["held_out"]
    print(f"held-out (teacher-forced): beta {h['beta']:.3f}  top-1 {h['top1']:.3f}  KL "
          f"{h['kl']:.3f}")
    if report["speculative"]:
        a, t = report["speculative"]["acceptance_rate"], report["speculative"]["tau"]
        print(f"speculative (greedy, gamma {args.gamma}, {args.accept_prompts} held-out chat "
              f"prompts): acceptance {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}]  tau {t[0]:.2f} "
              f"[{t[1]:.2f}, {t[2]:.2f}] (bonus token included)")
    c = report["step_ms"]
    print(f"step: draft {c['draft']:.1f} ms / target {c['target']:.1f} ms = {c['ratio']:.3f}")
    print(f"saved {out} ({report['parameters'] / 1e6:.1f}M parameters, {report['dtype']}); "
          f"{_registration(report['registered'], report['target'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.argv = sys.argv[1:] if argv is None else list(argv)
        kernel_build.forced()  # a bad SPECQ_KERNELS fails here, before any model loads
        return args.func(args)
    except SpecqError as e:
        print(f"specq: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specq: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("SPECQ_DEBUG"):
            raise
        print(f"specq: internal error: {type(e).__name__}: {e} (SPECQ_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
