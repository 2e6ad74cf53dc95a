"""What the maintained scripts in benchmarks/ share with the tests and the docs' tables: the checks
each script makes before it measures, and the tables of each one's results file. Here, not in
the scripts, so that a test or benchmarks/doc_tables.py imports a module, never a script.

    llamacpp.py    bench_llamacpp.py: the weights it knows, its set-up checks, llama.cpp's log
    versions.py    bench_versions.py: the configurations two commits run, the paired table
    passes.py      bench_passes.py: a step's and verify passes' cost, the read rate
    serve_load.py  bench_serve.py: `specq serve` as a subprocess, the batching sweep's tables
    serve_storm.py bench_serve.py --storm and tests/serve: the server under hostile load, its table
    load_time.py   bench_load.py: load time and resident memory
    shapes.py      shape_files.py: GGUF files of real 3-8B models' shapes, random blocks
    projection.py  project_speed.py: measured cells projected onto a bigger target's passes
    roof.py        bench_kernels.py roof: the machine's int8 multiply-add rate, the passes beside it
"""

import platform


def add_machine_option(ap) -> None:
    """`--machine`: the kind of machine, kept in each results row (the docs' tables filter on
    it)."""
    ap.add_argument("--machine", default=platform.processor() or platform.machine(),
                    help="the kind of machine, kept in each row's `machine` (docs/results' rows: "
                         "epyc-zen4-avx512, xeon-avx512, epyc-avx2; default: the platform's name)")
