"""specq bench: measure speculative decoding over a sweep, resumably, and report it.

    config.py     TOML + flags -> validated sweep -> cells
    prompts.py    prompt sets (chat, GSM8K, corpus passages, a user file; coding.py: code, edit)
    runner.py     stages (baseline, speculative, HF peer), warm-up, timing, the store
    engines.py    what the runner times: the Engine protocol, specq's engine in this process
    openai_engine.py  a server over the OpenAI API (engine "openai"): streaming, its metrics
    servers.py    the [[servers]] of engine "openai": entries, start, wait, stop
    store.py      the JSONL results store (atomic appends, torn-line tolerant, resumable)
    quality.py    GSM8K exact match, token-for-token lossless-ness
    heldout.py    quality stage: each target precision vs fp32 on held-out text
    aggregate.py  per-prompt values, bootstrap CIs, speedups, prediction, flags
    tables.py     rows -> tables of strings (terminal.py prints them, report.py writes them)
    report.py     Markdown + self-contained HTML with plots
    cli.py        `specq bench` and `specq report`
    doc_tables.py the docs' tables, regenerated from docs/results (peer_tables.py, result_tables.py)
    tools/        what benchmarks/' scripts share with tests and the docs' tables
"""
