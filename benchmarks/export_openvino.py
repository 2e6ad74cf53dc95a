"""The Qwen2.5-Coder pair as OpenVINO models, for benchmarks/bench_llamacpp.py's OpenVINO rows.

OpenVINO GenAI cannot read a GGUF file's K-quants, so each file is dequantized to a Hugging Face
folder with transformers (the file's weights exactly, in float32), then exported with optimum-intel
as OpenVINO's users would: the 1.5B target re-quantized to int4 in groups of 64 (every layer,
`--ratio 1.0`), the 0.5B draft to int8. Written once into OUT/qwen1.5b-int4-g64 and
OUT/qwen0.5b-int8 (a few minutes each on 2 cores; the float folders are removed afterwards).

Run in a separate environment (OpenVINO's packages are not specq's dependencies):

    python -m venv /tmp/ov && /tmp/ov/bin/pip install torch==2.13.0 "optimum-intel[openvino]" openvino-genai \
        nncf accelerate gguf && /tmp/ov/bin/pip install torch==2.13.0 && /tmp/ov/bin/pip uninstall -y torchvision
    /tmp/ov/bin/pip install --no-deps -e .          # specq itself, for the files' paths and the bench
    /tmp/ov/bin/python benchmarks/export_openvino.py --out ~/.cache/specq/openvino
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from specq.loading import packaged

EXPORTS = {  # name -> (the packaged GGUF file, optimum-cli weight options)
    "qwen1.5b-int4-g64": (packaged.QWEN_CODER_1_5B, ["--weight-format", "int4", "--group-size", "64", "--ratio", "1.0"]),
    "qwen0.5b-int8": (packaged.QWEN_CODER_0_5B, ["--weight-format", "int8"]),
}


def float_folder(gguf: Path, out: Path) -> None:
    """The GGUF file dequantized by transformers into a Hugging Face folder (model and tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cli = Path(sys.executable).with_name("optimum-cli")
    for name, (package, options) in EXPORTS.items():
        target = args.out / name
        if (target / "openvino_model.xml").is_file():
            print(f"{target}: there already")
            continue
        hf = args.out / f"{name}.float"
        print(f"{name}: dequantizing {packaged.path(package)}", flush=True)
        float_folder(packaged.path(package), hf)
        subprocess.run([str(cli), "export", "openvino", "--model", str(hf), "--task", "text-generation-with-past",
                        *options, str(target)], check=True)
        shutil.rmtree(hf)
        print(f"{name}: written to {target}", flush=True)


if __name__ == "__main__":
    main()
