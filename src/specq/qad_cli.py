"""`specq qad MODEL SPEC`: quantization-aware distillation of a quantized model towards its float
self (`training/qad.py`), registered on the main parser by `specq.cli` (`add_qad_parser(sub)`).

The result is a normal quantized model at `SPEC-qad` (same format as SPEC), by default in the
quantization cache, so that `MODEL@SPEC-qad` loads it by name; `--out` writes it elsewhere.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from .checks import MAX_SEED, MAX_THREADS, arg_float, arg_int, arg_path
from .errors import SpecqError

_positive = arg_int(1)
# the defaults: the runs that chose them are in docs/quantization.md at 4a89039 (QAD)
LR, CODE_LR = 0.002, 0.0


def add_qad_parser(sub) -> None:
    p = sub.add_parser("qad", help="recover a quantized model's quality by distilling its float "
                                   "self into it (same format; loads as MODEL@SPEC-qad)")
    p.add_argument("model", help="float model ref, without @spec (e.g. smollm2-135m)")
    p.add_argument("spec", help="the quantization to recover, e.g. int4-g64-rtn, int3-g64-gptq, "
                                "int2-g64-awq")
    p.add_argument("--out", type=arg_path, default=None,
                   help="output directory (default: the quantization cache, where MODEL@SPEC-qad "
                        "finds it)")
    p.add_argument("--force", action="store_true",
                   help="replace the output if it exists (only a folder specq wrote)")
    p.add_argument("--work", type=arg_path, default=None,
                   help="teacher data and checkpoints (default: OUT.work beside --out, else "
                        "$SPECQ_CACHE/qad/MODEL; teacher data is shared by every spec of a model)")
    p.add_argument("--resume", action="store_true",
                   help="continue the unfinished run of this spec in --work")
    p.add_argument("--texts", nargs="*", default=["shakespeare"],
                   help="text sources: shakespeare, or .txt / .jsonl files ('text' field); none: "
                        "--texts")
    p.add_argument("--prompts", nargs="*", default=["chat"],
                   help="prompt sources the float model answers: chat, synthetic:N, or files; "
                        "none: --prompts")
    p.add_argument("--temperatures", nargs="+", type=arg_float(0, 100), default=[0.0],
                   help="one answer per prompt per temperature (0 = greedy)")
    p.add_argument("--new-tokens", type=_positive, default=128,
                   help="length of the float model's answers")
    p.add_argument("--text-windows", type=_positive, default=160, help="training windows of text")
    p.add_argument("--seq-len", type=arg_int(16), default=256, help="tokens per text window")
    p.add_argument("--steps", type=arg_int(0), default=2000,
                   help="training steps (the time budget may stop sooner)")
    p.add_argument("--minutes", type=arg_float(), default=None,
                   help="time budget of the whole command: teacher data takes at most half, "
                        "training the rest")
    p.add_argument("--lr", type=arg_float(), default=LR,
                   help="peak learning rate of the group scales (their log: relative change per "
                        "update; 0: they stay); the norms train at 1/20 of it")
    p.add_argument("--code-lr", type=arg_float(), default=CODE_LR,
                   help="peak learning rate of the codes, in grid steps per update (0: they stay)")
    p.add_argument("--batch", type=_positive, default=4)
    p.add_argument("--eval-every", type=_positive, default=100,
                   help="steps between held-out evaluations")
    p.add_argument("--checkpoint-every", type=_positive, default=10)
    p.add_argument("--gen-batch", type=_positive, default=48,
                   help="prompts answered at once (one shard)")
    p.add_argument("--seed", type=arg_int(0, MAX_SEED), default=0)
    p.add_argument("--threads", type=arg_int(1, MAX_THREADS), default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_qad)


def cmd_qad(args) -> int:
    import torch

    from . import checks
    from .loading import precision
    from .loading.kinds import load
    from .loading.refs import check_ref, model_ref
    from .paths import cache_dir
    from .training import qad
    from .training.train import DistillSettings, check_run, check_sources
    from .weights.quant.spec import without_qad

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = qad.qad_spec(args.spec)
    plain = without_qad(spec)
    if model_ref(checks.text("the model", args.model)).has_spec:
        raise SpecqError("give the float model without an @spec; the spec is the second argument")
    if args.minutes is not None and args.minutes <= 0:
        raise SpecqError(f"--minutes must be positive, got {args.minutes}")
    for flag, lr in (("--lr", args.lr), ("--code-lr", args.code_lr)):
        if not 0 <= lr < 1:
            raise SpecqError(f"{flag} must be in [0, 1), got {lr}")
    if args.lr == 0 and args.code_lr == 0:
        raise SpecqError("--lr and --code-lr are both 0: nothing would train")
    if not args.texts and not args.prompts:
        raise SpecqError("no training data: give --texts and/or --prompts")
    default_work = cache_dir() / "qad" / args.model.replace("/", "_")
    if args.out is not None:
        out = Path(args.out)
        work = Path(args.work) if args.work else out.parent / f"{out.name}.work"
        check_run(out, work, args.force, args.resume, qad.checkpoint_name(spec))
    check_sources(args.texts, args.prompts)
    check_ref(args.model)
    settings = DistillSettings(
        texts=tuple(args.texts), prompts=tuple(args.prompts), temperatures=tuple(args.temperatures),
        new_tokens=args.new_tokens, text_windows=args.text_windows, seq_len=args.seq_len,
        steps=args.steps, minutes=args.minutes, loss="kl", lr=args.lr, batch=args.batch,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        gen_batch=args.gen_batch, seed=args.seed,
        extra={"command": "specq " + shlex.join(args.argv)})
    started = time.monotonic()  # --minutes bounds the command from here, model loading included
    target = load(args.model, backend=None)  # the teacher
    name = model_ref(args.model).name
    if args.out is None:  # the cache entry `MODEL@SPEC-qad` loads from
        out = precision.cached_quantized_dir(cache_dir(), name, Path(target.source), spec)
        work = Path(args.work) if args.work else default_work
        check_run(out, work, args.force, args.resume, qad.checkpoint_name(spec))
    quantized = load(f"{name}@{plain}", backend=None)  # quantized once and cached, as any @spec
    report = qad.run(target, quantized, spec, out, work, settings, code_lr=args.code_lr,
                     resume=args.resume, force=args.force, since=started)
    if args.json:
        print(json.dumps(report))
        return 0
    b, a = report["held_out_before"], report["held_out_after"]
    print(f"held-out vs {report['teacher']}: KL {b['kl']:.4f} -> {a['kl']:.4f}, top-1 "
          f"{b['top1']:.3f} -> {a['top1']:.3f} ({report['steps']} steps, "
          f"{report['train_s'] / 60:.1f} min of training)")
    print(f"saved {name}@{spec} to {out}" + ("" if args.out else f" (loads as {name}@{spec})"))
    return 0
