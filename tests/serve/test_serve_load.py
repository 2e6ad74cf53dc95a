"""`specq serve` under hostile load, run as a user runs it (a subprocess) with its default draft:
32 concurrent streamed greedy chats against a small queue, every fourth client asking for a long
answer and hanging up mid-stream, then a SIGKILL under load and a restart on the same port
(`specq.bench.tools.serve_storm`). On the built-in 135M target here; on the Qwen2.5-Coder pair
behind the `real` marker."""

from __future__ import annotations

import pytest

from specq.bench.tools.serve_storm import Storm, run
from specq.data import chat_prompts

PROMPTS = chat_prompts("held_out")[:4]
# what a round may add to the server's resident memory after its warm-up: the caches of the
# requests decoded together, and the allocator's own slack (a round's peak moves by tens of MiB
# from round to round without a trend)
BATCH_MIB = 512


def check_storm(rows: list[dict], storm: Storm) -> None:
    summary, server = rows[-1], rows[-2]
    requests = storm.clients * storm.rounds
    hung_up = storm.clients // storm.hang_up_every * storm.rounds
    # the bounded queue turned clients away, and each asked again until it was taken
    assert summary["responses_429"] > 0
    assert summary["server_429"] == summary["responses_429"]
    assert (summary["completed"], summary["disconnected"], summary["rejected"],
            summary["error"]) == (requests - hung_up, hung_up, 0, 0), summary
    # each hang-up cancelled its long generation, and the server answered after them
    assert summary["server_aborted"] == hung_up
    assert [r["outcome"] for r in rows if r["kind"] == "after"] == ["completed"]
    # every completed answer (the storm's, the one after it, each after the restart) is
    # `specq generate`'s, token for token
    restarted = [r for r in rows if r["kind"] == "restarted"]
    assert len(restarted) == len(PROMPTS)
    assert summary["completed_all"] == requests - hung_up + 1 + len(PROMPTS)
    assert summary["equal"] == summary["completed_all"], [
        (r["kind"], r["prompt"], r["text"]) for r in rows if r.get("equal") is False]
    # the SIGKILL ended every open stream with an error at once: no client hung
    killed = [r for r in rows if r["kind"] == "killed"]
    assert len(killed) == storm.killed_clients
    assert all(r["outcome"] == "error" and r["ended_after_kill_s"] < 10 for r in killed), killed
    # memory stayed bounded: each round's peak (the peak reset before it) near the warm size
    assert server["peak_since_warm"] and len(summary["round_peaks_mib"]) == storm.rounds
    assert max(summary["round_peaks_mib"]) < summary["rss_warm_mib"] + BATCH_MIB, summary


@pytest.mark.usefixtures("one_thread")
def test_the_server_under_load_with_the_builtin_target():
    """--max-batch 8 and --queue 4: at most 12 of the 32 clients are in the server at a time."""
    storm = Storm(clients=32, max_tokens=16)
    rows = run(["--port", "0", "--threads", "1", "--max-batch", "8", "--queue", "4"],
               "smollm2-135m", PROMPTS, "smollm2-135m@fp32", storm)
    check_storm(rows, storm)


@pytest.mark.real
def test_the_server_under_load_with_the_real_pair():
    """The Qwen2.5-Coder 1.5B file at its own precision with its default draft (the 0.5B behind
    an n-gram lookup), batching 16 with 8 waiting."""
    storm = Storm(clients=32, max_tokens=32)
    target = "qwen2.5-coder-1.5b"
    rows = run(["--target", target, "--precisions", "gguf", "--port", "0", "--threads", "2",
                "--queue", "8"], target, PROMPTS, f"{target}@gguf", storm)
    check_storm(rows, storm)


def test_the_storm_summary_counts_each_outcome_and_its_table_renders(tmp_path):
    """A results file's rows -> its summary and its docs table (doc_tables' `serve-storm`)."""
    import json

    from specq.bench.doc_tables import render
    from specq.bench.tools.serve_storm import check_answers, summary

    def request(outcome, prompt, text, rejected=0):
        return {"kind": "request", "prompt": prompt, "outcome": outcome, "text": text,
                "completion_tokens": 2, "rejected_429": rejected, "latency_s": 1.0,
                "ttft_s": 0.5, "wait_s": 2.0}

    rows = [request("completed", 0, "ab", 3), request("completed", 1, "xx"),
            request("disconnected", 0, "a"), request("rejected", 1, "", 101),
            {"kind": "killed", "outcome": "error"}, request("completed", 1, "cd") | {
                "kind": "restarted"}]
    check_answers(rows, [{"text": "ab", "tokens": 2}, {"text": "cd", "tokens": 2}])
    rows.append({"kind": "server", "rss_warm_bytes": 2**30, "rss_after_bytes": 2**30,
                 "peak_rss_bytes": [2**30 + 2**20, 2**30], "restart_s": 3.0, "finished_abort": 1,
                 "rejected_queue_full": 104, "storm": {"clients": 4, "rounds": 1}})
    s = summary(rows)
    assert (s["completed"], s["disconnected"], s["rejected"], s["error"]) == (2, 1, 1, 0)
    assert (s["responses_429"], s["server_429"], s["server_aborted"]) == (104, 104, 1)
    assert (s["completed_all"], s["equal"], s["restarted_equal"]) == (3, 2, 1)  # "xx" differs
    assert s["peak_rss_mib"] - s["rss_warm_mib"] == 1 and s["killed_clients_ended"] == 1
    path = tmp_path / "serve-load.jsonl"
    rows = [{"kind": "run", "target": "t@fp32"}, *rows, s]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = render(f"{path.name} serve-storm", tmp_path).splitlines()[2]
    assert line.startswith("| t@fp32 | 4 x 1 | 2 | 1 (1) | 104 | 2 of 3 |"), line
    assert "| 1024 / 1025, 1024 MiB | 3.0 s |" in line, line
