"""See what pruning kept: the clip's sampled frames (or the image) with the pruned tokens' patches dimmed.

    python -m sglang_evs.visualize CLIP --model-path PATH [--rate 0.75] [--method evs|vidcom2] -o kept.png
    python -m sglang_evs.visualize IMAGE.png --model-path PATH [--rate 0.5] [--method divprune|dart] -o kept.png
    python -m sglang_evs.visualize SEG1 SEG2 ... --stream --model-path PATH [--rate 0.75 | --threshold 0.1] -o kept.png

The frames are sampled as SGLang's processor of the checkpoint's family samples them (Qwen-VL's, or GLM's
own sampler for GLM-4.1V / GLM-4.5V), encoded by the checkpoint's own
vision tower (HF transformers, the same weights the server loads), and scored by the same keep-mask
the server uses (`methods.METHODS`) on the same rows (`[main | deepstack...]` where the tower has
deepstack levels). One tile per temporal group (its first frame, at the size the tower saw it),
one cell per merged token: kept cells framed in green, pruned cells dimmed, and the group's kept
count above it. With `--stream`, the clips are one stream's segments, pruned as a `video_stream` request prunes
them (`methods.stream`: each segment after the first scored against the stream's group before it), their groups
drawn one after the other. An image (a `.png`, `.jpg`, `.jpeg`, `.webp` or `.bmp` file) is one tile, resized and
encoded as the checkpoint's image processor does, and pruned by the image method (`methods.images`).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs.methods import EVS, METHODS, continued_mask, continued_threshold_mask, threshold_limited_mask
from sglang_evs.methods.images import DEFAULT_IMAGE_METHOD, IMAGE_METHODS, image_kept_count

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
KEPT_FRAME = (0, 255, 0)  # the first pixel of every kept cell; pruned cells are dimmed below 64
DIM = 0.25
LABEL_HEIGHT = 14


@dataclass(frozen=True)
class KeptTokens:
    frames: torch.Tensor  # [T, 3, H, W] uint8, the first frame of each temporal group as the tower saw it
    mask: torch.Tensor  # [T * h * w] bool, group by group, row-major
    grid: tuple[int, int, int]  # (T, H / patch, W / patch), before merging
    cell: int  # pixels per merged token side: patch size x merge size
    merge: int


def tower_rows(features) -> torch.Tensor:
    """[tokens, width] the keep-mask scores, from transformers' tower output: its main rows, with its deepstack
    levels' as further columns where it has them (what the server scores)."""
    main = torch.cat(list(getattr(features, "pooler_output", features)))
    levels = [torch.cat(list(level)) for level in getattr(features, "deepstack_features", None) or []]
    return torch.cat([main, *levels], dim=1)


def kept_tokens(model_path: str | Path, clip: str | Path, rate: float, method: str = "evs") -> KeptTokens:
    """Encode ``clip`` with the checkpoint's vision tower and compute ``method``'s keep-mask at ``rate``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_path)
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    frames, extra = sampled_frames(model.config.model_type, processor.video_processor, clip)
    inputs = processor.video_processor(videos=[frames], return_tensors="pt", **extra)
    grid = inputs["video_grid_thw"]
    vision = model.config.vision_config
    with torch.no_grad():
        features = model.model.get_video_features(inputs["pixel_values_videos"], grid)
    rows = tower_rows(features)
    mask = METHODS[method].retention_mask(rows, grid[0], vision.spatial_merge_size, rate)
    t, gh, gw = (int(v) for v in grid[0])
    resized = torch.nn.functional.interpolate(
        frames[:: vision.temporal_patch_size][:t].float(), size=(gh * vision.patch_size, gw * vision.patch_size),
        mode="bilinear", align_corners=False,
    ).clamp(0, 255).to(torch.uint8)  # fmt: skip
    return KeptTokens(
        resized, mask, (t, gh, gw), vision.patch_size * vision.spatial_merge_size, vision.spatial_merge_size
    )


def kept_image_tokens(model_path: str | Path, image: str | Path, rate: float, method: str = "divprune") -> KeptTokens:
    """Encode ``image`` with the checkpoint's vision tower and compute the image ``method``'s keep-mask at ``rate``
    (one tile: the image as the tower saw it)."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_path)
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    picture = Image.open(image).convert("RGB")
    inputs = processor.image_processor(images=[picture], return_tensors="pt")
    grid, vision = inputs["image_grid_thw"], model.config.vision_config
    with torch.no_grad():
        features = model.model.get_image_features(inputs["pixel_values"], grid)
    rows = tower_rows(features)
    mask = IMAGE_METHODS[method].keep_mask(rows, image_kept_count(rows.shape[0], rate))
    _, gh, gw = (int(v) for v in grid[0])
    seen = picture.resize((gw * vision.patch_size, gh * vision.patch_size), Image.BILINEAR)
    frame = torch.as_tensor(bytearray(seen.tobytes()), dtype=torch.uint8).view(seen.height, seen.width, 3)
    cell = vision.patch_size * vision.spatial_merge_size
    return KeptTokens(frame.permute(2, 0, 1)[None], mask, (1, gh, gw), cell, vision.spatial_merge_size)


def kept_over_stream(
    model_path: str | Path, clips: list[str | Path], rate: float = 0.0, threshold: float | None = None
) -> KeptTokens:
    """The segments ``clips`` of one stream encoded by the checkpoint's vision tower (their frame times counted on
    from segment to segment), pruned by EVS at ``rate`` or by ``threshold`` as a `video_stream` request prunes
    them; one `KeptTokens` over all their groups."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_path)
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    vision, masks, tiles, frames_before = model.config.vision_config, [], [], 0
    merge, previous = vision.spatial_merge_size, None
    for clip in clips:
        frames, extra = sampled_frames(model.config.model_type, processor.video_processor, clip)
        for metadata in extra.get("video_metadata", ()):
            metadata["frames_indices"] = metadata["frames_indices"] + frames_before
            frames_before += int(metadata["total_num_frames"])
        inputs = processor.video_processor(videos=[frames], return_tensors="pt", **extra)
        grid = inputs["video_grid_thw"][0]
        with torch.no_grad():
            features = model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
        rows = tower_rows(features)
        t, gh, gw = (int(v) for v in grid)
        if previous is None:
            masks.append(threshold_limited_mask(rows, grid, merge, threshold) if threshold is not None
                         else EVS.retention_mask(rows, grid, merge, rate))  # fmt: skip
        else:  # scored against the stream's group before it: the previous segment's last
            with_context = torch.cat([previous[-(gh // merge) * (gw // merge) :], rows])
            masks.append(continued_threshold_mask(with_context, grid, merge, threshold) if threshold is not None
                         else continued_mask(with_context, grid, merge, rate))  # fmt: skip
        previous = rows
        tiles.append(torch.nn.functional.interpolate(
            frames[:: vision.temporal_patch_size][:t].float(), size=(gh * vision.patch_size, gw * vision.patch_size),
            mode="bilinear", align_corners=False,
        ).clamp(0, 255).to(torch.uint8))  # fmt: skip
    groups = sum(tile.shape[0] for tile in tiles)
    return KeptTokens(torch.cat(tiles), torch.cat(masks), (groups, gh, gw), vision.patch_size * merge, merge)


def sampled_frames(model_type: str, video_processor, clip: str | Path) -> tuple[torch.Tensor, dict]:
    """The frames SGLang's processor for the family samples from ``clip``, [N, 3, H, W] uint8, and what the HF
    video processor must be told of them (their timestamps, and not to sample again)."""
    video = sglang.load_video(str(clip), use_gpu=False)
    if model_type.startswith("glm4v"):
        config = sglang.glm_video_config(video_processor)
        frames, metadata = sglang.glm_sample_and_decode(video, config, video_processor)
        frames = torch.as_tensor(frames).permute(0, 3, 1, 2).contiguous()
        return frames, {"video_metadata": [metadata], "do_sample_frames": False}
    frames, metadata = asyncio.run(sglang.preprocess_video(video))
    # Qwen3-family processors take SGLang's sampling metadata (timestamps); Qwen2-family ones do not
    qwen3 = model_type.startswith("qwen3")
    return frames, ({"video_metadata": [metadata], "do_sample_frames": False} if qwen3 and metadata is not None else {})


def cell_origin(kept: KeptTokens, group: int, row: int, col: int, columns: int) -> tuple[int, int]:
    """(x, y) in the picture of the top-left pixel of merged token (row, col) of ``group``."""
    _, gh, gw = kept.grid
    tile_w, tile_h = gw // kept.merge * kept.cell, gh // kept.merge * kept.cell + LABEL_HEIGHT
    x0, y0 = (group % columns) * (tile_w + 4), (group // columns) * (tile_h + 4) + LABEL_HEIGHT
    return x0 + col * kept.cell, y0 + row * kept.cell


def draw(kept: KeptTokens, columns: int = 4):
    """The picture (PIL image): one tile per group, pruned cells dimmed, kept cells framed."""
    from PIL import Image, ImageDraw

    t, gh, gw = kept.grid
    h, w = gh // kept.merge, gw // kept.merge
    columns = min(columns, t)
    rows_of_tiles = -(-t // columns)
    tile_w, tile_h = w * kept.cell, h * kept.cell + LABEL_HEIGHT
    picture = Image.new("RGB", (columns * (tile_w + 4) - 4, rows_of_tiles * (tile_h + 4) - 4), "white")
    pen = ImageDraw.Draw(picture)
    cells = kept.mask.view(t, h, w)
    for group in range(t):
        frame = kept.frames[group].permute(1, 2, 0).float()
        dim = cells[group].repeat_interleave(kept.cell, 0).repeat_interleave(kept.cell, 1)
        frame = torch.where(dim[..., None], frame, frame * DIM).to(torch.uint8)
        x0, y0 = cell_origin(kept, group, 0, 0, columns)
        picture.paste(Image.fromarray(frame.numpy()), (x0, y0))
        pen.text((x0, y0 - LABEL_HEIGHT), f"group {group}: {int(cells[group].sum())}/{h * w} kept", fill="black")
        for row, col in cells[group].nonzero().tolist():
            x, y = cell_origin(kept, group, row, col, columns)
            pen.rectangle([x, y, x + kept.cell - 1, y + kept.cell - 1], outline=KEPT_FRAME)
    return picture


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("clips", type=Path, nargs="+",
                        help="a clip or an image, or with --stream one stream's segments in order")  # fmt: skip
    parser.add_argument("--model-path", required=True, help="a checkpoint the plugin prunes (tiny or real)")
    parser.add_argument("--rate", type=float, default=0.75, help="pruning rate q (VidCom2: 1 - retention ratio)")
    parser.add_argument("--method", choices=sorted({*METHODS, *IMAGE_METHODS}), default=None,
                        help=f"default evs for a clip, {DEFAULT_IMAGE_METHOD.name} for an image")  # fmt: skip
    parser.add_argument("--stream", action="store_true", help="the clips are one stream's segments (EVS)")
    parser.add_argument("--threshold", type=float, default=None, help="with --stream: a threshold in place of --rate")
    parser.add_argument("--columns", type=int, default=4, help="tiles per row of the picture")
    parser.add_argument("-o", "--output", type=Path, default=Path("kept.png"))
    args = parser.parse_args(argv)
    image = len(args.clips) == 1 and args.clips[0].suffix.lower() in IMAGE_SUFFIXES
    methods = IMAGE_METHODS if image else METHODS
    args.method = args.method or (DEFAULT_IMAGE_METHOD.name if image else EVS.name)
    if args.method not in methods:
        parser.error(
            f"--method {args.method} prunes {'videos' if image else 'images'}: choose one of {sorted(methods)}"
        )
    if image:
        kept, setting = kept_image_tokens(args.model_path, args.clips[0], args.rate, args.method), f"q={args.rate}"
    elif args.stream:
        kept = kept_over_stream(args.model_path, args.clips, args.rate, args.threshold)
        setting = f"a stream of {len(args.clips)} segments, " + (
            f"threshold {args.threshold}" if args.threshold is not None else f"q={args.rate}"
        )
    elif len(args.clips) == 1:
        kept, setting = kept_tokens(args.model_path, args.clips[0], args.rate, args.method), f"q={args.rate}"
    else:
        parser.error("several clips are one stream's segments: add --stream")
    draw(kept, args.columns).save(args.output)
    total = kept.mask.numel()
    kind = "image" if image else "video"
    print(f"{args.method} at {setting}: kept {int(kept.mask.sum())} of {total} {kind} tokens -> {args.output}")
    return args.output


def cli() -> None:
    """The console script `sglang-evs-visualize`."""
    main()


if __name__ == "__main__":
    main()
