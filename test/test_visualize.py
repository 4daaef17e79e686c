"""`python -m sglang_evs.visualize`: the picture's kept cells are exactly the keep-mask's."""

import json

import pytest
import torch
from PIL import Image

from sglang_evs import visualize
from sglang_evs.testing import media
from sglang_evs.testing.evs_oracle import keep_mask as evs_oracle_mask


@pytest.mark.parametrize(("method", "rate"), [("evs", 0.75), ("vidcom2", 0.5)])
def test_picture_shows_exactly_the_kept_cells(tiny_model_dir, tmp_path, method, rate):
    clip = media.write_clip(tmp_path / "clip.mp4", "moving", num_frames=16, fps=4, seed=3)
    out = visualize.main([str(clip), "--model-path", str(tiny_model_dir), "--rate", str(rate),
                          "--method", method, "-o", str(tmp_path / "kept.png")])  # fmt: skip
    kept = visualize.kept_tokens(tiny_model_dir, clip, rate, method)
    t, gh, gw = kept.grid
    h, w = gh // kept.merge, gw // kept.merge
    total = t * h * w
    expected = max(h * w, int(total * (1 - rate))) if method == "evs" else max(t, int(total * (1 - rate)))
    assert int(kept.mask.sum()) == expected < total
    picture = Image.open(out).convert("RGB")
    shown = torch.tensor(
        [picture.getpixel(visualize.cell_origin(kept, g, r, c, min(4, t))) == visualize.KEPT_FRAME
         for g in range(t) for r in range(h) for c in range(w)]
    )  # fmt: skip
    assert torch.equal(shown, kept.mask)


def test_evs_mask_is_the_oracles_on_the_towers_rows(tiny_model_dir, tmp_path, monkeypatch):
    """The visualizer's EVS mask is the spec's rule on the rows it scored (recorded here)."""
    clip = media.write_clip(tmp_path / "clip.mp4", "noise", num_frames=16, fps=4, seed=4)
    scored = {}
    original = visualize.METHODS["evs"].retention_mask

    def recording(rows, grid, merge, rate):
        scored.update(rows=rows, grid=grid, merge=merge)
        return original(rows, grid, merge, rate)

    monkeypatch.setitem(visualize.METHODS, "evs", visualize.METHODS["evs"].__class__(
        **{**visualize.METHODS["evs"].__dict__, "retention_mask": recording}))  # fmt: skip
    kept = visualize.kept_tokens(tiny_model_dir, clip, 0.5, "evs")
    config = json.loads((tiny_model_dir / "config.json").read_text())
    levels = len(config["vision_config"]["deepstack_visual_indexes"])
    assert levels > 0 and scored["rows"].shape[1] == (1 + levels) * config["text_config"]["hidden_size"]
    assert torch.equal(kept.mask, evs_oracle_mask(scored["rows"], scored["grid"], scored["merge"], 0.5))


@pytest.mark.parametrize(("kind", "kept_groups"), [("static", 1), ("noise", None)])
def test_a_stream_picture_shows_what_the_stream_keeps(tiny_model_dir, tmp_path, kind, kept_groups):
    """Two segments of one camera as one stream at a threshold: a static camera keeps its first group for the whole
    stream, a camera seeing something new every frame keeps nearly everything; the picture frames exactly that."""
    frames = media.clip_frames(kind, num_frames=32, seed=9)
    segments = [media.write_mp4(tmp_path / f"{kind}-{i}.mp4", frames[16 * i : 16 * (i + 1)]) for i in (0, 1)]
    out = visualize.main([*map(str, segments), "--stream", "--threshold", "0.05", "--model-path", str(tiny_model_dir),
                          "-o", str(tmp_path / "stream.png")])  # fmt: skip
    kept = visualize.kept_over_stream(tiny_model_dir, segments, threshold=0.05)
    t, gh, gw = kept.grid
    h, w = gh // kept.merge, gw // kept.merge
    per_group = kept.mask.view(t, h * w).sum(dim=1).tolist()
    if kept_groups is not None:
        assert per_group == [h * w] + [0] * (t - 1)
    else:
        assert sum(per_group) > 0.9 * t * h * w and min(per_group) > 0
    picture = Image.open(out).convert("RGB")
    shown = torch.tensor([picture.getpixel(visualize.cell_origin(kept, g, r, c, min(4, t))) == visualize.KEPT_FRAME
                          for g in range(t) for r in range(h) for c in range(w)])  # fmt: skip
    assert torch.equal(shown, kept.mask)


@pytest.mark.parametrize("method", ["divprune", "dart"])
def test_an_images_picture_shows_exactly_the_cells_the_papers_rule_keeps(tiny_model_dir, tmp_path, monkeypatch,
                                                                         method):  # fmt: skip
    """An image: one tile; its kept cells are the plain reference's choice on the rows the tower gave."""
    from sglang_evs.methods.images import ImagePruningMethod
    from sglang_evs.testing.dart_oracle import dart_kept
    from sglang_evs.testing.divprune_oracle import divprune_kept

    image = media.write_image(tmp_path / "image.png", 256, 320, seed=6)
    out = visualize.main([str(image), "--model-path", str(tiny_model_dir), "--rate", "0.5", "--method", method,
                          "-o", str(tmp_path / "kept.png")])  # fmt: skip
    scored, original = {}, visualize.IMAGE_METHODS[method].keep_mask

    def recording(rows, keep):
        scored.update(rows=rows, keep=keep)
        return original(rows, keep)

    monkeypatch.setitem(visualize.IMAGE_METHODS, method, ImagePruningMethod(method, recording))
    kept = visualize.kept_image_tokens(tiny_model_dir, image, 0.5, method)
    _, gh, gw = kept.grid
    h, w = gh // kept.merge, gw // kept.merge
    assert (h * w, scored["keep"], int(kept.mask.sum())) == (80, 40, 40)
    oracle = {"divprune": divprune_kept, "dart": dart_kept}[method](scored["rows"].tolist(), 40)
    assert kept.mask.nonzero().flatten().tolist() == sorted(oracle)
    picture = Image.open(out).convert("RGB")
    shown = [picture.getpixel(visualize.cell_origin(kept, 0, r, c, 1)) == visualize.KEPT_FRAME
             for r in range(h) for c in range(w)]  # fmt: skip
    assert torch.tensor(shown).equal(kept.mask)


def test_a_video_method_for_an_image_is_refused_by_name(tiny_model_dir, tmp_path):
    image = media.write_image(tmp_path / "image.png", seed=1)
    with pytest.raises(SystemExit):
        visualize.main([str(image), "--model-path", str(tiny_model_dir), "--method", "evs"])
