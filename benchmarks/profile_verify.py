"""Where a verify pass's time goes: torch.profiler over 10 forwards of 1 and of 4 tokens at 128
tokens of context, for one target ref on the fast path (2 threads).

    python benchmarks/profile_verify.py [smollm2-135m@int4-g64-rtn-head8] > docs/results/profile-verify.txt
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import specq

torch.set_num_threads(2)
ref = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m@int4-g64-rtn-head8"
print(f"{ref}, fast path, {torch.get_num_threads()} threads, 10 forwards per table")
m = specq.load(ref)
net = m.net
ids = torch.randint(100, 40000, (140,), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    cache = net.new_cache(160); net(ids[:128], cache)
    for n in (1, 4):
        x = ids[128:128+n]
        for _ in range(3): net(x, cache); cache.crop(128)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(10): net(x, cache); cache.crop(128)
        print(f"=== n={n}")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
