"""Tests of sglang_evs.evs.positions against a brute-force reference."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sglang_evs.evs import (
    PositionPlan,
    RequestLayout,
    build_position_plan,
    canonical_keep_mask,
    canonical_kept_per_group,
    parse_request_layout,
    pruned_mrope_positions,
    pruned_placeholder_length,
    pruned_video_slots,
    retention_mask,
    video_token_ids,
)

IMG, VID, VS, VE = 151655, 151656, 151652, 151653


# ------------------------------------------------------------ test layouts
@dataclass
class Video:
    grid: tuple[int, int, int]  # before merging
    timestamps: list[list[int]]
    outer: bool  # chat-template markers around the expansion
    mask: torch.Tensor | None = None


@dataclass
class Image:
    grid: tuple[int, int, int]
    markers: bool = True


@dataclass
class Request:
    items: list[list[int] | Image | Video]
    merge: int
    ids: list[int] = field(default_factory=list)
    # per token: None for text, else (block key, t index, row, col, t, h, w,
    # video index or -1, row of the video's encoder output)
    roles: list[tuple[Any, ...] | None] = field(default_factory=list)

    @property
    def videos(self) -> list[Video]:
        return [x for x in self.items if isinstance(x, Video)]

    @property
    def images(self) -> list[Image]:
        return [x for x in self.items if isinstance(x, Image)]


def build_tokens(req: Request) -> None:
    """Unpruned token sequence, token by token, plain Python."""
    m, ids, roles = req.merge, req.ids, req.roles
    n_video = 0

    def text(tokens: list[int]) -> None:
        ids.extend(tokens)
        roles.extend([None] * len(tokens))

    def grid(key: object, t: int, h: int, w: int, video: int, row0: int, tok: int) -> None:
        for i in range(t):
            for r in range(h):
                for c in range(w):
                    ids.append(tok)
                    roles.append((key, i, r, c, t, h, w, video, row0 + (i * h + r) * w + c))

    for k, item in enumerate(req.items):
        if isinstance(item, list):
            text(item)
        elif isinstance(item, Image):
            t, h, w = item.grid[0], item.grid[1] // m, item.grid[2] // m
            text([VS] if item.markers else [])
            grid(("img", k), t, h, w, -1, 0, IMG)
            text([VE] if item.markers else [])
        else:
            t, h, w = item.grid[0], item.grid[1] // m, item.grid[2] // m
            text([VS] if item.outer else [])
            for g in range(t):
                text([*item.timestamps[g], VS])
                grid(("vid", k, g), 1, h, w, n_video, g * h * w, VID)
                text([VE])
            text([VE] if item.outer else [])
            n_video += 1


def brute_force(req: Request) -> tuple[torch.Tensor, int, list[int]]:
    """Spec section 3 positions, pruned rows deleted; (positions, delta, kept)."""
    positions: list[tuple[int, int, int]] = []
    nxt, block, base = 0, None, 0
    for role in req.roles:
        if role is None:
            positions.append((nxt, nxt, nxt))
            nxt += 1
            block = None
            continue
        key, i, r, c, t, h, w = role[:7]
        if key != block:  # first pad of a block
            block, base = key, nxt
            nxt = base + max(t, h, w)
        positions.append((base + i, base + r, base + c))
    delta = max((max(p) for p in positions), default=-1) + 1 - len(positions)
    masks = [v.mask for v in req.videos]
    kept = []
    for j, role in enumerate(req.roles):
        if role is None or role[7] < 0:
            kept.append(j)
            continue
        mask = masks[role[7]]
        if mask is None or bool(mask[role[8]]):
            kept.append(j)
    pos = torch.tensor([positions[j] for j in kept], dtype=torch.long).reshape(-1, 3).T
    return pos, delta + len(positions) - len(kept), kept


def random_request(seed: int, sglang_compatible: bool = False) -> Request:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    m = rng.choice([1, 2])
    q = rng.choice([0.0, 0.25, 0.75, 0.9])
    items: list[list[int] | Image | Video] = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["text", "image", "video", "video"])
        if kind == "text":
            items.append([rng.randrange(1000) for _ in range(rng.randint(0, 4))])
        elif kind == "image":
            t = 1 if sglang_compatible else rng.choice([1, 1, 2])
            markers = sglang_compatible or rng.random() < 0.7
            items.append(Image((t, m * rng.randint(1, 3), m * rng.randint(1, 3)), markers))
        else:
            t, h, w = rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 3)
            ts = [[rng.randrange(1000) for _ in range(rng.randint(1, 3))] for _ in range(t)]
            video = Video((t, h * m, w * m), ts, rng.random() < 0.5)
            style = rng.choice(["evs", "evs", "static", "random", "none"])
            if q == 0 or style == "none":
                video.mask = None if style == "none" else torch.ones(t * h * w, dtype=torch.bool)
            elif style == "random":  # any mask, even one that drops group 0
                video.mask = torch.rand(t * h * w, generator=gen) < 0.4
            else:
                x = torch.randn(t, h * w, 5, generator=gen)
                if style == "static":  # many groups with zero kept tokens
                    x[1:] = x[:1] + 1e-3 * torch.randn(t - 1, h * w, 5, generator=gen)
                    x[-1] = torch.randn(h * w, 5, generator=gen)
                video.mask = retention_mask(
                    x.reshape(-1, 5).to(rng.choice([torch.float32, torch.bfloat16])),
                    video.grid,
                    m,
                    q,
                )
            items.append(video)
    req = Request(items, m)
    build_tokens(req)
    return req


def plan_for(req: Request) -> tuple[RequestLayout, PositionPlan]:
    layout = parse_request_layout(
        req.ids,
        [x.grid for x in req.images] or None,
        [x.grid for x in req.videos] or None,
        req.merge,
        IMG,
        VID,
    )
    return layout, build_position_plan(layout, [v.mask for v in req.videos])


def check_windows(plan: PositionPlan, want: torch.Tensor, rng: random.Random) -> None:
    n = want.shape[1]
    if n <= 30:  # every window
        windows = [(s, e) for s in range(n + 1) for e in range(s, n + 1)]
    else:
        windows = [tuple(sorted(rng.sample(range(n + 1), 2))) for _ in range(100)]
        windows += [(0, n), (n, n), (0, 1), (n - 1, n)]
    for s, e in windows:
        assert torch.equal(plan.positions(s, e), want[:, s:e]), (s, e)


# ------------------------------------------------------------------- tests
@given(st.integers(0, 2**32 - 1))
@settings(max_examples=120, deadline=None)
def test_positions_match_brute_force(seed: int) -> None:
    req = random_request(seed)
    want, delta, kept = brute_force(req)
    layout, plan = plan_for(req)
    assert plan.seq_len == len(kept) == want.shape[1]
    assert plan.mrope_position_delta == delta
    assert torch.equal(plan.positions(), want)
    assert plan.kept_indices().tolist() == kept
    check_windows(plan, want, random.Random(seed))
    assert torch.equal(plan.to("cpu").positions(), want)
    got, got_delta = pruned_mrope_positions(
        req.ids,
        [x.grid for x in req.images],
        [x.grid for x in req.videos],
        req.merge,
        IMG,
        VID,
        {i: v.mask for i, v in enumerate(req.videos)},
    )
    assert torch.equal(got, want) and got_delta == delta

    # each video's pruned expansion is the layout module's pruned_video_slots
    pruned_ids = torch.tensor(req.ids, dtype=torch.long)[plan.kept_indices()]
    for v, video in enumerate(req.videos):
        blocks = torch.nonzero(layout.block_video == v).squeeze(1)
        ts_len = len(video.timestamps[0])
        start = int(plan.block_start[blocks[0]]) - ts_len - 1
        mask = (
            video.mask
            if video.mask is not None
            else torch.ones(video.grid[0] * video.grid[1] * video.grid[2] // req.merge**2, dtype=torch.bool)
        )
        ids, _ = pruned_video_slots(video.timestamps, mask, VS, VE, VID)
        assert torch.equal(pruned_ids[start : start + ids.numel()], ids)
        assert plan.block_len[blocks].tolist() == [int(x) for x in mask.view(video.grid[0], -1).sum(1)]


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.25, 0.75, 0.9]))
@settings(max_examples=40, deadline=None)
def test_recipe_canonical_prompt_then_true_mask(seed: int, q: float) -> None:
    """Prompt built before encoding (canonical split) vs after (true mask)."""
    req = random_request(seed)
    layout, _ = plan_for(req)
    grids = [v.grid for v in req.videos]
    canon = build_position_plan(layout, [canonical_keep_mask(g, req.merge, q) for g in grids])
    masks = []
    for g in grids:
        t, rows = g[0], g[0] * g[1] * g[2] // req.merge**2
        x = torch.randn(rows, 3, generator=torch.Generator().manual_seed(seed % 1000 + t))
        masks.append(retention_mask(x, g, req.merge, q))
    plan = build_position_plan(layout, masks)
    ids = torch.tensor(req.ids, dtype=torch.long)
    prompt = ids[canon.kept_indices()]
    truth = ids[plan.kept_indices()]
    assert canon.seq_len == plan.seq_len == prompt.numel() == truth.numel()
    assert canon.mrope_position_delta == plan.mrope_position_delta
    # the two differ only inside the videos' regions; each region is
    # video_token_ids(canonical split) before and pruned_video_slots after
    outside = torch.ones(plan.seq_len, dtype=torch.bool)
    for v, video in enumerate(req.videos):
        blocks = torch.nonzero(layout.block_video == v).squeeze(1)
        start = int(plan.block_start[blocks[0]]) - len(video.timestamps[0]) - 1
        t, tpf = video.grid[0], video.grid[1] * video.grid[2] // req.merge**2
        region = video_token_ids(video.timestamps, canonical_kept_per_group(tpf, t, q), VS, VE, VID)
        end = start + region.numel()
        assert torch.equal(prompt[start:end], region)
        slots, _ = pruned_video_slots(video.timestamps, masks[v], VS, VE, VID)
        assert torch.equal(truth[start:end], slots)
        assert end - start == pruned_placeholder_length([len(x) for x in video.timestamps], tpf, q)
        outside[start:end] = False
    assert torch.equal(prompt[outside], truth[outside])
    assert torch.equal(canon.positions()[:, outside], plan.positions()[:, outside])


def test_handmade_video_with_empty_groups() -> None:
    # m = 1, video grid (3, 2, 2): groups 1 and 2 keep 0 and 2 tokens
    ts = [[1, 2], [3, 4], [5, 6]]
    mask = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0], dtype=torch.bool)
    req = Request([[7, 8], Video((3, 2, 2), ts, True, mask), [9]], 1)
    build_tokens(req)
    want, delta, _ = brute_force(req)
    _, plan = plan_for(req)
    got = plan.positions()
    assert torch.equal(got, want)
    # 7 8 <vs> | 1 2 <vs> 4 pads (b=6) <ve> | 3 4 <vs> <ve> | 5 6 <vs> 2 pads <ve> | <ve> 9
    want_t = [0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 8, 9, 10, 11, 14, 15, 16, 17, 18, 18, 20, 21, 22]
    assert got[0].tolist() == want_t
    assert got[:, 14].tolist() == [14, 14, 14]  # vision_end of the empty group
    assert got[:, 18:20].tolist() == [[18, 18], [18, 19], [19, 18]]  # cells (0,1),(1,0)
    # unpruned: 29 tokens, max position 22 -> delta -6; 6 pruned -> 0
    assert plan.mrope_position_delta == delta == -6 + 6


@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("q", [0.0, 0.25, 0.75, 0.9])
def test_adjacent_media_video_first(merge: int, q: float) -> None:
    gen = torch.Generator().manual_seed(7)

    def video(t: int, h: int, w: int, outer: bool) -> Video:
        x = torch.randn(t, h * w, 4, generator=gen)
        x[1:-1] = x[:1]  # static middle: groups with zero kept tokens
        grid = (t, h * merge, w * merge)
        mask = retention_mask(x.reshape(-1, 4), grid, merge, q)
        return Video(grid, [[11 + g] for g in range(t)], outer, mask)

    items: list[list[int] | Image | Video] = [
        video(4, 2, 3, False),  # first token of the prompt is a timestamp
        video(3, 3, 1, True),  # right after the previous video
        Image((1, merge, 2 * merge), markers=False),  # right after, no markers
        Image((1, 3 * merge, merge)),
        video(2, 1, 1, False),
        [5, 6],
    ]
    req = Request(items, merge)
    build_tokens(req)
    want, delta, kept = brute_force(req)
    _, plan = plan_for(req)
    assert torch.equal(plan.positions(), want)
    assert plan.mrope_position_delta == delta
    assert plan.kept_indices().tolist() == kept
    check_windows(plan, want, random.Random(0))


def test_no_media_and_empty() -> None:
    _, plan = plan_for(Request([[5, 6, 7]], 2, [5, 6, 7], [None] * 3))
    assert plan.positions().tolist() == [[0, 1, 2]] * 3
    assert plan.mrope_position_delta == 0
    _, plan = plan_for(Request([], 2))
    assert plan.positions().shape == (3, 0) and plan.mrope_position_delta == 0


def test_layout_errors() -> None:
    with pytest.raises(ValueError, match="pad tokens"):
        parse_request_layout([VS, IMG, VE], [(1, 2, 2)], None, 1, IMG, VID)
    with pytest.raises(ValueError, match="contiguous"):
        parse_request_layout([IMG, IMG, 5, IMG, IMG], [(1, 2, 2)], None, 1, IMG, VID)
    layout = parse_request_layout([VID, VID], None, [(2, 1, 1)], 1, IMG, VID)
    with pytest.raises(ValueError, match="keep-mask"):
        build_position_plan(layout, [torch.ones(3, dtype=torch.bool)])
    with pytest.raises(ValueError, match="window"):
        build_position_plan(layout).positions(1, 3)


def test_window_of_long_video_is_cheap() -> None:
    # T = 384 groups of 16 x 28 (172k pad tokens): a window never builds the rest
    t, h, w = 384, 16, 28
    ids = [1, 2]
    for _ in range(t):
        ids += [3, VS] + [VID] * (h * w) + [VE]
    mask = retention_mask(torch.randn(t * h * w, 4), (t, 2 * h, 2 * w), 2, 0.75)
    layout = parse_request_layout(ids, None, [(t, 2 * h, 2 * w)], 2, IMG, VID)
    plan = build_position_plan(layout, [mask])
    window = plan.positions(30_000, 30_016)
    assert window.shape == (3, 16)
    assert torch.equal(window, plan.positions()[:, 30_000:30_016])


# ------------------------------------------------------- upstream SGLang
def _sglang_get_rope_index() -> Callable[..., Any]:
    """SGLang 0.5.23's own get_rope_index.

    If sglang is already imported, use it.  Otherwise load the module file
    ``sglang/srt/layers/rotary_embedding/mrope_rope_index.py`` by path: it
    only imports torch, while ``import sglang`` runs the package ``__init__``
    (transformers, torchvision, ... ~10 s on this machine).  Same source file.
    """
    name = "sglang.srt.layers.rotary_embedding.mrope_rope_index"
    if name in sys.modules:
        return sys.modules[name].get_rope_index
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    path = f"{spec.submodule_search_locations[0]}/srt/layers/rotary_embedding/mrope_rope_index.py"
    mod_spec = importlib.util.spec_from_file_location("_sglang_mrope_rope_index", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module.get_rope_index


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_unpruned_equals_sglang_get_rope_index(seed: int) -> None:
    get_rope_index = _sglang_get_rope_index()
    req = random_request(seed, sglang_compatible=True)
    assume(req.ids)  # SGLang's function cannot take an empty prompt
    for video in req.videos:
        video.mask = None  # q = 0
    images = torch.tensor([x.grid for x in req.images]).reshape(-1, 3)
    videos = torch.tensor([x.grid for x in req.videos]).reshape(-1, 3)
    want, want_delta = get_rope_index(
        spatial_merge_size=req.merge,
        image_token_id=IMG,
        video_token_id=VID,
        vision_start_token_id=VS,
        model_type="qwen3_vl",
        input_ids=torch.tensor([req.ids], dtype=torch.long).reshape(1, -1),
        image_grid_thw=images if len(images) else None,
        video_grid_thw=videos if len(videos) else None,
    )
    got, delta = pruned_mrope_positions(
        req.ids,
        images,
        videos,
        req.merge,
        IMG,
        VID,
        [torch.ones(int(v.prod()) // req.merge**2, dtype=torch.bool) for v in videos],
    )
    assert torch.equal(got, want[:, 0])
    assert delta == int(want_delta.reshape(-1)[0])
    assert torch.equal(brute_force(req)[0], got)
