"""Loading: a ref as users write it -> a loaded model or draft.

    refs.py        the one parser of model and draft refs (`ModelRef`, `NgramRef`, `DraftRef`),
                   checked before any model loads
    kinds.py       `load` (`specq.load`): any ref, by its kind (ngram / self / feature / sequence),
                   each kind's drafter, scoring and save
    models.py      a model ref -> `Model` (HF folders, .gguf files, hub ids, at a precision)
    builtins.py    the built-in names
    precision.py   a precision spec; quantize once and cache
    file_spec.py   `@gguf` options for a cheaper draft (a 4-bit body, a narrowed head)
    vocab.py       which models may pair
    formats/       model files: HF folders, GGUF files, packaged parts, validation, saving
    drafts/        drafts on disk: registries, the default draft, folder sorts, adapters
"""
