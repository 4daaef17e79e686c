"""Cost of the keep-mask (EVS, VidCom2) next to the vision encoder that produced its rows, for the same clip.

Builds a Qwen3-VL vision tower with a real checkpoint's shape (random weights: the cost does not
depend on their values), encodes one clip of T temporal groups, and times each method's
``retention_mask`` (``sglang_evs.methods.METHODS``) on exactly the rows the tower returned: the main
merger output concatenated with the deepstack levels, as the serving model scores them. Prints the
medians and mask / encoder; the goal is below 1 %.

    PYTHONPATH=python python benchmark/bench_retention_mask.py [--tower 2b|8b] [--groups 4] [--method evs|vidcom2|all]

``--pruning-rate`` is q (``video_pruning_rate``) for both methods.

Both costs are linear in T (the tower attends within each frame), so a short clip gives the ratio of
a long one at a fraction of the CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

from sglang_evs.methods import METHODS

# vision_config of Qwen/Qwen3-VL-2B-Instruct and Qwen/Qwen3-VL-8B-Instruct
TOWERS = {
    "2b": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
               deepstack_visual_indexes=[5, 11, 17]),
    "8b": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
               deepstack_visual_indexes=[8, 16, 24]),
}  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
COMMON = dict(patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
              num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh")  # fmt: skip


def median_seconds(fn: Callable[[], object], reps: int, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time of ``fn``; on a CUDA device each run ends when its kernels have finished."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def build_tower(name: str) -> Qwen3VLVisionModel:
    config = Qwen3VLVisionConfig(**TOWERS[name], **COMMON)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3VLVisionModel(config).eval()


def encode(tower: Qwen3VLVisionModel, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """[patches, 3*2*16*16] -> [patches / 4, (1 + levels) * out_hidden]: main rows then deepstack."""
    out = tower(pixels, grid_thw=grid_thw)
    return torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tower", choices=TOWERS, default="2b")
    p.add_argument("--groups", type=int, default=4, help="temporal groups T (2 frames each)")
    p.add_argument("--height", type=int, default=16, help="merged rows h per group (frame height / 32)")
    p.add_argument("--width", type=int, default=28, help="merged cols w per group (frame width / 32)")
    p.add_argument("--pruning-rate", type=float, default=0.75, help="q (VidCom2: 1 - retention ratio)")
    p.add_argument("--method", choices=[*METHODS, "all"], default="all", help="keep-mask(s) to time")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions of each")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cpu", help="where the tower and the masks run (cpu, cuda)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the tower's dtype (a GPU serves bfloat16)")
    p.add_argument("--output", type=Path, help="also write the raw results here (JSON)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    t, h, w = args.groups, args.height, args.width
    grid_thw = torch.tensor([[t, 2 * h, 2 * w]])
    methods = list(METHODS.values()) if args.method == "all" else [METHODS[args.method]]
    keeps = ", ".join(f"{m.name} keeps {m.retained_token_count(h * w, t, args.pruning_rate)}" for m in methods)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()}, {args.threads} threads"
    print(f"torch {torch.__version__}, {where}, {os.cpu_count()} CPUs")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(f"clip: T={t} groups of {2 * h * 16}x{2 * w * 16} px = {t * h * w} merged tokens, "
          f"q={args.pruning_rate}: {keeps}; tower {args.tower} ({TOWERS[args.tower]['depth']} layers)")  # fmt: skip

    dtype = DTYPES[args.dtype]
    tower = build_tower(args.tower).to(device, dtype)
    pixels = torch.randn(int(grid_thw.prod()), 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    pixels, grid_thw = pixels.to(device, dtype), grid_thw.to(device)
    fmt = ", ".join
    grid = tuple(grid_thw[0].tolist())
    with torch.inference_mode():
        encoder_s, encoder_runs = median_seconds(lambda: encode(tower, pixels, grid_thw), args.reps)
        print(f"vision encoder {args.dtype}: median {encoder_s * 1e3:.1f} ms "
              f"(runs {fmt(f'{x * 1e3:.1f}' for x in encoder_runs)})")  # fmt: skip
        rows = encode(tower, pixels, grid_thw)
        result = {"tower": args.tower, "grid_thw": list(grid), "pruning_rate": args.pruning_rate,
                  "device": where, "dtype": args.dtype, "threads": args.threads,
                  "encoder_ms": [x * 1e3 for x in encoder_runs], "masks": {}}  # fmt: skip
        for method in methods:
            mask_s, mask_runs = median_seconds(
                lambda method=method: method.retention_mask(rows, grid, 2, args.pruning_rate), args.reps
            )
            print(f"{method.name} retention_mask on its {tuple(rows.shape)} rows: median {mask_s * 1e3:.2f} ms "
                  f"(runs {fmt(f'{x * 1e3:.2f}' for x in mask_runs)}); "
                  f"mask / encoder = {mask_s / encoder_s:.4%}")  # fmt: skip
            result["masks"][method.name] = {"ms": [x * 1e3 for x in mask_runs], "over_encoder": mask_s / encoder_s}
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
