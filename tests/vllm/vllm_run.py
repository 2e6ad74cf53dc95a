"""Greedy generation in vLLM, run by the vLLM environment's python (`make setup-vllm`), never
imported by specq or its tests: specq's environment has no vllm.

    .venv-vllm/bin/python tests/vllm/vllm_run.py REQUEST.json

REQUEST: {"target": DIR, "prompts": [[ids], ...], "max_tokens": N,
          "speculative": null | vLLM's speculative_config}
Prints one JSON line: {"outputs": [[ids], ...], "drafts", "draft_tokens", "accepted",
"accepted_per_pos"} (the spec-decode counters of vLLM's metrics; 0 without speculation).
One engine per process: vLLM's metrics live in one process-wide Prometheus registry.
"""

import json
import sys


def counters(metrics) -> dict:
    """vLLM's spec-decode counters (`LLM.get_metrics`), the names its Prometheus endpoint serves."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    names = {"vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in metrics:
        if metric.name in names:
            out[names[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in metric.values]
    return out


def main(path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(open(path).read())
    llm = LLM(model=request["target"], dtype="float32", enforce_eager=True, max_model_len=1024,
              speculative_config=request["speculative"], disable_log_stats=False, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    results = llm.generate(prompts, params, use_tqdm=False)
    outputs = [list(r.outputs[0].token_ids) for r in results]
    print(json.dumps({"outputs": outputs, **counters(llm.get_metrics())}), flush=True)


if __name__ == "__main__":  # vLLM's engine starts its worker by spawn: it re-imports this file
    main(sys.argv[1])
