"""`specq bench` with engine "openai": servers measured over the OpenAI API, into the same store,
tables and report as specq's own engine.

The servers are `specq serve` over tiny saved models: in a thread of this process (uvicorn on a
free port), and once as a real `specq serve` command the bench starts and stops itself. vLLM and
llama-server runs are behind their own markers (`test_bench_engines.py`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import replace

import pytest
from rich.console import Console

import specq
from specq.bench import aggregate, runner, store, tables
from specq.bench.config import load_config, validate
from specq.bench.openai_engine import Counters, Stream, _count, parse_metrics
from specq.bench.report import write_report
from specq.bench.servers import Server, get, running
from specq.cli import main
from specq.core.prompt import encode_prompt
from specq.errors import SpecqError
from specq.loading.formats.save import save_native
from specq.serve.server import ServeConfig, build_app

from conftest import perturbed, serve_in_thread, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["t1 t2 t3 t4", "t5 t6 t7", "t2 t9 t4 t1 t3", "t8 t8 t3"]
TOKENS = 12
GAMMA = 2


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-openai")
    target = tiny_model(scale=3.0)
    save_native(target, root / "target")
    save_native(perturbed(target, 0.1), root / "draft")  # accepts some, rejects some
    save_native(perturbed(target, 2.0, seed=5, ref="other"), root / "other")  # another model
    (root / "prompts.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    return root


def live(config: ServeConfig):
    """A server in a thread: (url, stop)."""
    port, stop = serve_in_thread(build_app(config))
    return f"http://127.0.0.1:{port}", stop


@pytest.fixture(scope="module")
def url(dirs):
    """The tiny target with the perturbed draft; one request at a time, no suffix cache."""
    address, stop = live(ServeConfig(target=str(dirs / "target"), draft=str(dirs / "draft"),
                                     max_batch=1, suffix_tokens=0, timeout_s=60))
    yield address
    stop()


@pytest.fixture(scope="module")
def other_url(dirs):
    """Another model: its greedy outputs differ from the target's."""
    address, stop = live(ServeConfig(target=str(dirs / "other"), max_batch=1, suffix_tokens=0))
    yield address
    stop()


def servers(dirs, url: str, speculative_url: str | None = None) -> list[dict]:
    model = str(dirs / "target")
    return [{"name": "plain", "url": url, "model": model, "baseline": True,
             "body": {"speculative": False}},
            {"name": "draft g2", "url": speculative_url or url, "body": {"gamma": GAMMA},
             **({} if speculative_url else {"model": model})}]


def sweep(dirs, tmp_path, entries: list[dict], **extra) -> dict:
    return {"engine": "openai", "servers": entries, "prompt_sets": ["file"],
            "prompt_file": str(dirs / "prompts.jsonl"), "prompt_file_chat": False,
            "prompts": len(PROMPTS), "max_new_tokens": [TOKENS], "temperature": [0.0],
            "results": str(tmp_path / "r.jsonl"), "resamples": 50} | extra


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), stderr=False)


def bench(raw: dict) -> list[dict]:
    return runner.run(validate(raw), console=quiet(), progress=False)


def test_a_served_pair_is_measured_paired_and_checked(dirs, url, tmp_path):
    records = bench(sweep(dirs, tmp_path, servers(dirs, url)))
    cells = {c["cell"]["kind"]: c for c in store.cells(records).values()}
    assert set(cells) == {"baseline", "speculative"}
    spec, base = cells["speculative"], cells["baseline"]
    assert spec["cell"]["draft"] == "draft g2" and spec["cell"]["engine"] == "openai"
    assert all("paired_stats" in r for r in spec["runs"])  # a plain request beside each
    assert len(spec["runs"]) == len(base["runs"]) == len(PROMPTS)
    assert {r["acceptance_source"] for r in spec["runs"]} == {"metrics"}

    # the counters' change around each request is what specq counted for that request
    for r in spec["runs"]:
        own = r["reported"]["specq"]
        assert (r["stats"]["drafted"], r["stats"]["accepted"], r["stats"]["steps"]) == (
            own["drafted"], own["accepted"], own["steps"])
        assert r["stats"]["new_tokens"] == TOKENS and r["paired_stats"]["drafted"] == 0
    # ... and what specq's own decoding counts on the same prompts, in this process
    target, draft = specq.load(str(dirs / "target")), specq.load(str(dirs / "draft"))
    for r, text in zip(spec["runs"], PROMPTS):
        out = specq.generate(target, encode_prompt(target, text), draft, gamma=GAMMA,
                             max_new_tokens=TOKENS, temperature=0.0, ignore_eos=True)
        assert (r["stats"]["drafted"], r["stats"]["accepted"]) == (out.stats.drafted,
                                                                   out.stats.accepted)
        assert r["text"] == target.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    drafted = sum(r["stats"]["drafted"] for r in spec["runs"])
    accepted = sum(r["stats"]["accepted"] for r in spec["runs"])
    assert 0 < accepted < drafted  # both paths taken

    rows = aggregate.summarize(records, resamples=50)
    row = next(r for r in rows if r["kind"] == "speculative")
    assert row["mismatches"] == [] and row["unchecked"] == 0 and row["compared"] == "text"
    assert row["acceptance_rate"][0] == pytest.approx(
        sum(r["stats"]["accepted"] / r["stats"]["drafted"] for r in spec["runs"]) / len(PROMPTS))
    assert len(row["U"]) == GAMMA and row["speedup_paired"] and row["ttft_ms"][0] > 0
    assert tables.exactness(row) == f"{len(PROMPTS)}/{len(PROMPTS)} identical (text)"
    summary = tables.summary(rows, 0.95)
    assert "TTFT ms" in summary.headers and summary.rows[1][1] == "draft g2"
    assert tables.brief(rows, 0.95).rows[1][1] == "draft g2"
    md, _ = write_report(tmp_path / "r.jsonl")
    assert "draft g2" in md.read_text()

    # resumed: nothing runs again
    again = bench(sweep(dirs, tmp_path, servers(dirs, url)))
    assert len([r for r in again if r["type"] == "run"]) == 1


def test_outputs_of_another_model_are_reported_as_differing(dirs, url, other_url, tmp_path):
    records = bench(sweep(dirs, tmp_path, servers(dirs, url, other_url)))
    rows = aggregate.summarize(records, resamples=50)
    row = next(r for r in rows if r["kind"] == "speculative")
    assert row["mismatches"] and all(m["unit"] == "character" for m in row["mismatches"])
    assert "differs from the baseline at character" in aggregate.failures(rows)[0]
    assert tables.exactness(row).startswith("FAIL")


def test_the_bench_starts_a_server_and_stops_it(dirs, tmp_path, capsys):
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    start = (f"{sys.executable} -m specq.cli serve --target {dirs / 'target'} --draft "
             f"{dirs / 'draft'} --port {port} --max-batch 1 --suffix-cache 0 --threads 1")
    entries = servers(dirs, address)
    entries[0]["start"] = start
    raw = sweep(dirs, tmp_path, entries, prompts=2, max_new_tokens=[6])
    config = tmp_path / "bench.toml"
    config.write_text(toml(raw))
    assert main(["bench", str(config)]) == 0
    assert get(f"{address}/health")[0] == 0  # stopped
    assert (tmp_path / "r.plain.log").is_file()
    assert len(store.cells(store.read(tmp_path / "r.jsonl"))) == 2
    assert "draft g2" in capsys.readouterr().out


def test_nothing_at_the_url_is_one_line_and_exit_2(dirs, tmp_path, capsys):
    address = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "bench.toml"
    config.write_text(toml(sweep(dirs, tmp_path, servers(dirs, address))))
    assert main(["bench", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing answers at" in err and address in err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_server_that_fails_to_start_is_one_line_and_leaves_nothing_running(tmp_path):
    address = f"http://127.0.0.1:{free_port()}"
    crash = Server("a", address, baseline=True,
                   start=f"{sys.executable} -c \"print('boom: no model'); raise SystemExit(3)\"")
    with pytest.raises(SpecqError, match=r"did not start: .* exited with code 3: boom: no model"):
        with running([crash], tmp_path / "r"):
            pass
    pid_file = tmp_path / "pid"
    hang = replace(crash, start=f"echo $$ > {pid_file}; exec sleep 60", start_timeout=1)
    with pytest.raises(SpecqError, match="did not answer .* within 1 s"):
        with running([hang], tmp_path / "r"):
            pass
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_start_command_for_a_url_in_use_is_refused(url, tmp_path):
    entry = Server("a", url, baseline=True, start="sleep 60")
    with pytest.raises(SpecqError, match="something already answers at"):
        with running([entry], tmp_path / "r"):
            pass


def test_server_entries_are_checked_before_anything_runs(tmp_path):
    ok = [{"name": "a", "url": "http://127.0.0.1:1", "baseline": True},
          {"name": "b", "url": "http://127.0.0.1:1"}]
    raw = {"engine": "openai", "results": str(tmp_path / "r.jsonl")}
    for servers_, drafts, message in [
            ([{**ok[0], "baseline": False}, ok[1]], None, "exactly one server needs 'baseline"),
            ([ok[0], {**ok[1], "name": "a"}], None, "two servers are named 'a'"),
            ([ok[0], {**ok[1], "colour": 1}], None, "unknown key 'colour'"),
            ([ok[0], {**ok[1], "url": "127.0.0.1:8000"}], None, "is not an http"),
            ([ok[0], {**ok[1], "body": {"max_tokens": 3}}], None, "may not set 'max_tokens'"),
            ([ok[0], {**ok[1], "gamma": 0}], None, "'gamma' must be an integer"),
            ([ok[0]], None, "at least one speculative server"),
            (ok, ["ngram"], "'drafts': is specq's own engine's")]:
        with pytest.raises(SpecqError, match=message):
            validate(raw | {"servers": servers_} | ({"drafts": drafts} if drafts else {}))
    with pytest.raises(SpecqError, match="'servers': needs engine = 'openai'"):
        validate({"servers": ok, "results": str(tmp_path / "r.jsonl")})
    with pytest.raises(SpecqError, match="'engine': must be one of specq, openai"):
        load_config(None, {"engine": "vllm"})
    config = validate(raw | {"servers": ok})
    assert config.quality_chunks == 0 and config.threads == []


VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 3.0
vllm:generation_tokens_total{engine="0",model_name="m"} 28.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
"""
LLAMACPP_METRICS = """# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 40
llamacpp:spec_decode_num_draft_tokens_total 12
llamacpp:spec_decode_num_accepted_tokens_total 5
llamacpp:spec_decode_num_drafts_total 4
"""


def test_metrics_of_each_engine_are_read_under_vllms_names():
    vllm = parse_metrics(VLLM_METRICS)
    assert (vllm.drafts, vllm.drafted, vllm.accepted, vllm.generated) == (10, 30, 17, 28)
    assert vllm.per_pos == {0: 8, 1: 6, 2: 3}
    llama = parse_metrics(LLAMACPP_METRICS)
    assert (llama.drafts, llama.drafted, llama.accepted, llama.generated) == (4, 12, 5, 40)
    assert parse_metrics("garbage\n# only a comment\n") == Counters()


def test_a_requests_counts_are_the_change_of_the_counters():
    before, after = parse_metrics(VLLM_METRICS), parse_metrics(VLLM_METRICS.replace(
        "30.0", "36.0").replace("17.0", "21.0").replace("} 10.0", "} 12.0").replace(
        'position="0"} 8.0', 'position="0"} 10.0').replace('position="1"} 6.0',
                                                           'position="1"} 8.0'))
    delta = after.minus(before)
    stream = Stream(0.0)
    stream.usage = {"completion_tokens": 7, "prompt_tokens": 3}
    stream.first, stream.last = 0.5, 1.1
    result = stream.result(delta, gamma=None)
    s = result.stats
    # 7 tokens = the first (prefill) + 4 accepted + one of its own from each of 2 steps
    assert (s.drafted, s.accepted, s.steps, s.emitted) == (6, 4, 2, 6)
    assert s.gamma == 3 and s.accepted_at == [2, 2, 0] and s.drafted_at == [2, 2, 2]
    assert s.reached_at == [2, 2, 2] and s.tau == 3.0
    assert s.prefill_s == 0.5 and s.decode_s == pytest.approx(0.6)
    assert result.extra["acceptance_source"] == "metrics"
    # no counters: a llama-server response's own timings, else nothing (no steps, no tau)
    stats = Stream(0.0).result(None, None).stats
    assert _count(stats, None, {"timings": {"draft_n": 9, "draft_n_accepted": 4}}, None) == \
        "response"
    assert (stats.drafted, stats.accepted) == (9, 4)
    stats = Stream(0.0).result(None, None).stats
    assert _count(stats, None, {}, None) is None and stats.tau is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml(raw: dict) -> str:
    """A bench config as TOML (the few value types these tests use)."""
    def value(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)
    lines = [f"{k} = {value(v)}" for k, v in raw.items() if k != "servers"]
    for entry in raw["servers"]:
        lines += ["", "[[servers]]"] + [f"{k} = {value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"
