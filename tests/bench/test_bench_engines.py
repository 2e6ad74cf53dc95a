"""`specq bench` against llama-server and vLLM, each started and stopped by the bench (engine
"openai"): greedy outputs equal to the same server's plain ones, acceptance read from the engine's
own metrics. Each behind its marker, skipped where the engine is not installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from specq.bench import aggregate, runner, store
from specq.bench.config import load_config, validate
from specq.loading.builtins import BUILTIN_GGUF

from test_bench_openai import free_port, quiet

ROOT = Path(__file__).parents[2]
PRESETS = ROOT / "benchmarks" / "presets"


def binary(variable: str, name: str) -> str | None:
    return os.environ.get(variable) or shutil.which(name)


def measure(config) -> tuple[list[dict], dict]:
    records = runner.run(config, console=quiet(), progress=False)
    rows = aggregate.summarize(records, resamples=50)
    return rows, {c["cell"]["draft"]: c for c in store.cells(records).values()}


@pytest.mark.llamacpp
@pytest.mark.skipif(binary("LLAMA_SERVER", "llama-server") is None,
                    reason="no llama-server ($LLAMA_SERVER or on PATH)")
def test_llama_server_plain_and_ngram(tmp_path):
    server, model = binary("LLAMA_SERVER", "llama-server"), BUILTIN_GGUF["smollm2-135m"]()
    ports = free_port(), free_port()
    start = f"{server} --host 127.0.0.1 --metrics -np 1 -t 2 -c 2048 -m {model} --port "
    entries = [{"name": "plain", "url": f"http://127.0.0.1:{ports[0]}", "baseline": True,
                "start": start + str(ports[0])},
               {"name": "ngram-simple", "url": f"http://127.0.0.1:{ports[1]}",
                "start": start + f"{ports[1]} --spec-type ngram-simple "
                                     "--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8"}]
    config = validate({"engine": "openai", "servers": entries, "prompt_sets": ["edit"],
                       "prompts": 2, "max_new_tokens": [48], "temperature": [0.0],
                       "results": str(tmp_path / "r.jsonl"), "resamples": 50})
    rows, cells = measure(config)
    row = next(r for r in rows if r["kind"] == "speculative")
    assert row["mismatches"] == [] and row["unchecked"] == 0
    runs = cells["ngram-simple"]["runs"]
    assert {r["acceptance_source"] for r in runs} == {"metrics"}
    assert sum(r["stats"]["drafted"] for r in runs) > 0  # an edit repeats its prompt
    for r in runs:  # the counters agree with the response's own counts
        timings = r.get("reported", {}).get("timings", {})
        if "draft_n" in timings:
            assert (r["stats"]["drafted"], r["stats"]["accepted"]) == (
                timings["draft_n"], timings["draft_n_accepted"])


@pytest.mark.vllm
@pytest.mark.skipif(not (ROOT / ".venv-vllm" / "bin" / "python").exists(),
                    reason="no vLLM environment: make setup-vllm")
def test_vllm_preset_draft_model_and_ngram(tmp_path):
    config = load_config(str(PRESETS / "vllm.toml"),
                         {"prompts": 2, "max_new_tokens": [32], "prompt_sets": ["chat"],
                          "results": str(tmp_path / "r.jsonl"), "resamples": 50})
    rows, cells = measure(config)
    for row in (r for r in rows if r["kind"] == "speculative"):
        assert row["mismatches"] == [] and row["unchecked"] == 0
        assert row["compared"] == "tokens"  # return_token_ids
        assert row["acceptance_rate"] is not None and len(row["U"]) == 3
    for cell in cells.values():
        assert {r["acceptance_source"] for r in cell["runs"]} == {"metrics"}
