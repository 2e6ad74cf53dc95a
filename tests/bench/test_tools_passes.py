"""The table of a step's and verify passes' cost (benchmarks/bench_passes.py, through
specq.bench.tools.passes): medians over rounds, N-row / 1-row ratios paired by round, the read
rates of the packed weights, the layers' C call and a plain sum."""

from specq.bench.tools.passes import SUM, SUM_BYTES, table


def _rows() -> list[dict]:
    """Two rounds of a model at 1 and 4 rows: round 1 is twice as slow as round 0 throughout."""
    base = {"run": "r", "weight_bytes": 100e6, "layer_weight_bytes": 80e6}
    ms = {("pass", 128): (10.0, 30.0), ("layers", 128): (8.0, 16.0), ("linears", 0): (5.0, 6.0)}
    rows = []
    for r, slow in enumerate((1, 2)):
        for (what, context), (one, four) in ms.items():
            rows += [{**base, "measurement": what, "rows": n, "context": context, "round": r,
                      "ms": t * slow} for n, t in ((1, one), (4, four))]
        rows.append({"run": "r", "measurement": SUM, "rows": 1, "context": 0, "round": r,
                     "ms": SUM_BYTES / 1e6 / (20.0 / slow)})
    return rows


def test_ratios_are_paired_by_round_and_read_rates_use_the_fewest_rows():
    lines = table(_rows()).splitlines()
    assert lines[0] == "| measurement | 1 row | 4 rows | 4 rows / 1 row (paired, median) |"
    assert lines[2] == "| whole pass, 128 tokens of context | 15.0 ms | 45.0 ms | 3.00 |"
    assert lines[3] == ("| decoder layers' C call within the pass, 128 tokens of context | 12.0 ms "
                        "| 24.0 ms | 2.00 |")
    assert lines[4] == "| linear layers alone (100 MB of packed weights) | 7.5 ms | 9.0 ms | 1.20 |"
    assert lines[5] == "| read rate: the linear layers at 1 row | 15.0 GB/s | | |"
    assert lines[6] == "| read rate: the decoder layers' C call at 1 row (80 MB) | 7.5 GB/s | | |"
    assert lines[7] == "| read rate: torch's float32 sum of 1 GiB | 15.0 GB/s | | |"


def test_a_model_without_packed_weights_has_no_linear_lines():
    rows = [r for r in _rows() if r["measurement"] in ("pass", SUM)]
    text = table(rows)
    assert "linear layers" not in text and "C call" not in text
    assert text.splitlines()[-1].startswith("| read rate: torch's float32 sum")
