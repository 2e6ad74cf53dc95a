"""Drafts on disk: the registries of drafts per target precision (`registry.py`), which draft a
target gets when none is named (`select.py`), a draft folder's sort by its marker file
(`folders.py`), and a LoRA adapter folder as a model (`adapter.py`)."""
