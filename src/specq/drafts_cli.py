"""`specq drafts`: the draft registries listed, explained and changed by hand, registered on the
main parser by `specq.cli` (`add_drafts_parser(sub)`):

    specq drafts list [--target NAME]          every entry, shipped and yours
    specq drafts show NAME                     one draft's entries and what they record
    specq drafts which TARGET[@PRECISION]      the draft generate, bench and
                                               serve would pick, and why
    specq drafts add DRAFT[@SPEC] --target TARGET[@PRECISION] [--file-type Q2_K]
    specq drafts remove NAME [--target TARGET[@PRECISION]]

Only your registry (`$SPECQ_CACHE/drafts`) changes; the shipped one is part of the package. A
removed entry's draft folder is left where it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .checks import arg_path
from .errors import SpecqError
from .loading import file_spec, precision
from .loading.builtins import ASSETS, SHIPPED_DRAFTS
from .loading.drafts import folders, registry
from .loading.drafts.select import FILE_TYPES, draft_dirs, select_draft
from .loading.formats import validate
from .loading.refs import model_ref
from .loading.vocab import check_names, check_target_ref

SCOPES = ("shipped", "yours")  # the order of `draft_dirs()`


@dataclass(frozen=True)
class Row:
    scope: str
    directory: Path
    entry: registry.Entry

    @property
    def path(self) -> Path:
        return registry.draft_path(self.directory, self.entry)

    def matches(self, name: str) -> bool:
        """NAME as `specq drafts list` prints it, the folder's name, or any path to the folder."""
        return (name in (self.entry.draft, self.path.name)
                or Path(name).expanduser().resolve() == self.path.resolve())

    def to_dict(self) -> dict:
        folder = folders.of(self.path)
        kind = "built-in" if self.entry.builtin else folder.kind if folder else "missing"
        return {"registry": self.scope, "target": self.entry.target,
                "precision": self.entry.precision, "file_type": self.entry.file_type or None,
                "draft": self.entry.draft,
                "runs_at": self.entry.draft_spec or None, "folder": str(self.path), "kind": kind,
                "info": self.entry.info}


def rows() -> list[Row]:
    return [Row(scope, Path(d), e) for scope, d in zip(SCOPES, draft_dirs())
            for e in registry.read(d)]


def add_drafts_parser(sub) -> None:
    d = sub.add_parser("drafts",
                       help="list, explain, add and remove the drafts the registry picks from",
                       description="The drafts generate, bench and serve pick when none is named "
                                   "(docs/reference.md, 'The draft registry'). Only your registry "
                                   "($SPECQ_CACHE/drafts) changes.")
    actions = d.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="every registry entry, shipped and yours")
    ls.add_argument("--target", default=None, help="only this target's entries (a name, without @)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    show = actions.add_parser("show", help="one draft's entries and what they record")
    show.add_argument("name", help="the draft as `specq drafts list` prints it, or its folder")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    which = actions.add_parser("which", help="the draft generate, bench and serve pick for a "
                                             "target, and why")
    which.add_argument("target", help="TARGET@PRECISION, e.g. smollm2-135m@int4-g64-rtn-head8")
    which.add_argument("--quantizable", action="store_true",
                       help="as for a draft that is to be quantized (bench's draft_quant): no "
                            "feature drafts")
    which.set_defaults(func=cmd_which)
    add = actions.add_parser("add",
                             help="register a draft folder for a target precision in your registry")
    add.add_argument("draft", type=arg_path,
                     help="a draft folder or shipped draft, optionally @SPEC: the precision "
                          "it runs at (e.g. ./my-feature-draft@int8-head8)")
    add.add_argument("--target", required=True, help="TARGET@PRECISION it is for (no @: fp32)")
    add.add_argument("--file-type", default="",
                     help="with TARGET@gguf: only the target's GGUF files of this llama.cpp type "
                          "(e.g. Q2_K, Q3_K_M: a draft calibrated on one such file, for every "
                          "file of that model and type); default: any file")
    add.set_defaults(func=cmd_add)
    rm = actions.add_parser("remove",
                            help="remove a draft's entries from your registry (the folder stays)")
    rm.add_argument("name", help="the draft as `specq drafts list` prints it, or its folder")
    rm.add_argument("--target", default=None,
                    help="only its entry for TARGET (or TARGET@PRECISION)")
    rm.set_defaults(func=cmd_remove)


def cmd_list(args) -> int:
    found = [r for r in rows() if args.target is None or r.entry.target == args.target]
    if args.json:
        print(json.dumps([r.to_dict() for r in found]))
        return 0
    for scope, directory in zip(SCOPES, draft_dirs()):
        print(f"{scope}: {Path(directory) / registry.MANIFEST}")
    table = [("registry", "target", "precision", "draft", "runs at", "kind")]
    table += [(r.scope, r.entry.target,
               r.entry.precision + (f" ({r.entry.file_type})" if r.entry.file_type else ""),
               r.entry.draft,
               r.entry.draft_spec or "as stored", r.to_dict()["kind"]) for r in found]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if len(table) == 1:
        print("(no entries" + (f" for {args.target})" if args.target else ")"))
    return 0


def _named(name: str) -> list[Row]:
    found = [r for r in rows() if r.matches(name)]
    if not found:
        raise SpecqError(f"no draft '{name}' in the registries (see `specq drafts list`)")
    return found


def cmd_show(args) -> int:
    found = [r.to_dict() for r in _named(args.name)]
    if args.json:
        print(json.dumps(found))
        return 0
    for r in found:
        files = f" ({r['file_type']} files)" if r["file_type"] else ""
        print(f"{r['draft']} ({r['kind']} draft, {r['registry']} registry): for "
              f"{r['target']}@{r['precision']}{files}, runs at "
              f"{r['runs_at'] or 'its stored precision'}")
        print(f"  folder: {r['folder']}")
        for key, value in r["info"].items():
            print(f"  {key}: {value}")
    return 0


def cmd_which(args) -> int:
    ref, note = select_draft(args.target, args.quantizable)
    print(ref or "none (plain decoding)")
    print(f"why: {note}")
    return 0


def _draft_folder(name: str) -> Path:
    if name in SHIPPED_DRAFTS:
        return ASSETS / "drafts" / name
    path = Path(name).expanduser()
    if not path.is_dir():
        raise SpecqError(f"draft '{name}' is not a folder (nor a shipped draft: "
                         f"{', '.join(SHIPPED_DRAFTS)})")
    validate.check_dir(path)
    return path


def cmd_add(args) -> int:
    draft, target = model_ref(args.draft), model_ref(args.target)
    # no spec given: the draft as stored
    draft_spec = precision.canonical(draft.spec) if draft.has_spec else ""
    spec = precision.canonical(target.spec)
    file_type = args.file_type.upper()
    if file_type and not file_spec.names_file(spec):
        raise SpecqError(f"--file-type is for a GGUF file's precision (TARGET@gguf), not "
                         f"{target.name}@{spec}")
    if file_type and file_type not in FILE_TYPES.values():
        raise SpecqError(f"--file-type {args.file_type}: not a llama.cpp file type (e.g. "
                         f"{', '.join(list(FILE_TYPES.values())[:8])}, ...)")
    folder = _draft_folder(draft.name)
    check_target_ref(target)
    check_names(str(folder), target)  # a draft of another tokenizer, told by the files alone
    entry = registry.register(target.name, spec, folder, {"added": "specq drafts add"},
                              draft_spec=draft_spec, file_type=file_type)
    files = f" ({file_type} files)" if file_type else ""
    print(f"registered {entry.draft} for {target.name}@{entry.precision}{files} in "
          f"{registry.user_dir() / registry.MANIFEST}")
    return 0


def cmd_remove(args) -> int:
    found = _named(args.name)
    if args.target is not None:
        target = model_ref(args.target)
        found = [r for r in found if r.entry.target == target.name
                 and (not target.has_spec or r.entry.precision == precision.canonical(target.spec))]
        if not found:
            raise SpecqError(f"draft '{args.name}' has no entry for {args.target} "
                             f"(see `specq drafts show {args.name}`)")
    yours = [r for r in found if r.scope == SCOPES[1]]
    if not yours:
        raise SpecqError(f"'{args.name}' is shipped with specq and cannot be removed; a draft you "
                         "register for the same precision comes before it (`specq drafts add`)")
    registry.remove(yours[0].directory, [r.entry for r in yours])
    for r in yours:
        print(f"removed {r.entry.draft} for {r.entry.target}@{r.entry.precision} (the folder "
              f"{r.path} stays)")
    return 0
