"""Are the FP8 files the GPU rounded the same as the host's rounding of the same states?

    python bench/fp8_gpu_check.py BF16_FOLDER FP8_FOLDER [--samples 64]

For each sample in both folders (same file name): the bf16 file's hidden states rounded on this host by
``output.quantize_fp8`` (what the CPU path writes) against the FP8 file's values and scales, as written by the GPU.
Prints how many samples are bit-identical, and the largest difference of the dequantized values otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import load_file

from eaglewatch.pipeline.output import FP8_SCALES_KEY, dequantize_fp8, quantize_fp8


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bf16"), parser.add_argument("fp8"), parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()
    names = sorted(p.name for p in Path(args.fp8).glob("hs_*.safetensors") if (Path(args.bf16) / p.name).exists())
    names = names[:: max(1, len(names) // args.samples)]
    same = 0
    worst = 0.0
    for name in names:
        states = load_file(str(Path(args.bf16) / name))["hidden_states"]
        written = load_file(str(Path(args.fp8) / name))
        fp8, scales = quantize_fp8(states)
        gpu_fp8, gpu_scales = written["hidden_states"], written[FP8_SCALES_KEY]
        if (fp8.shape == gpu_fp8.shape and torch.equal(fp8.view(torch.uint8), gpu_fp8.view(torch.uint8))
                and torch.equal(scales, gpu_scales)):
            same += 1
        else:
            diff = (dequantize_fp8(fp8, scales) - dequantize_fp8(gpu_fp8, gpu_scales)).abs().max().item()
            worst = max(worst, diff / max(1e-12, states.float().abs().max().item()))
    print(f"{same} of {len(names)} samples bit-identical to the host's rounding of the bf16 states; "
          f"largest difference otherwise {worst:.3g} of the sample's largest |value|")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
