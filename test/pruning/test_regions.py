"""The tokenizer-side rewrite: pruned length, final positions outside the video, rate-aware hashes."""

import copy

import pytest
import torch

from sglang_evs.methods import EVS, VIDCOM2
from sglang_evs.pruning import keys, regions
from sglang_evs.pruning.settings import Pruning

VIDEO, VS, VE, IMG = 9, 7, 8, 6


class Item:
    """The parts of SGLang's MultimodalDataItem the rewrite touches."""

    def __init__(self, modality, offsets, grid=None, content=0):
        self.modality, self.offsets, self.model_specific_data = modality, offsets, {}
        self.video_grid_thw = grid
        self.hash = self.pad_value = self.feature = None
        self.content = content

    def is_video(self):
        return self.modality == "video"

    def is_image(self):
        return self.modality == "image"

    def set(self, key, value):
        self.model_specific_data[key] = value

    def set_pad_value(self):
        self.hash = 1000 + self.content

    def set_hash(self, value):
        self.hash = value


class Output:
    def __init__(self, ids, items, positions, delta):
        self.input_ids, self.mm_items, self.mrope_positions, self.mrope_position_delta = ids, items, positions, delta

    @staticmethod
    def build_padded_input_ids(ids, items):
        return ["padded", len(ids)]


def scheduler_key(item) -> int:
    """The key SGLang's scheduler gives the item as it hashes it (the tokenizer left the fold to it, `keys.py`)."""
    assert item.hash is None
    keys.fold_deferred_key(type(item).set_pad_value, item)
    return item.hash


def video_output():
    """text(2) | image(4) | text(1) | video of 3 groups, m=1, grid (3,1,2): [ts VS p p VE] x3 | text(2)."""
    ids, offsets = [1, 2, IMG, IMG, IMG, IMG, 3], []
    for ts in (11, 12, 13):
        ids += [ts, VS]
        offsets.append((len(ids), len(ids) + 1))
        ids += [VIDEO, VIDEO, VE]
    ids += [4, 5]
    positions = torch.arange(3 * len(ids)).reshape(3, len(ids)) * 10
    items = [Item("image", [(2, 5)]), Item("video", offsets, torch.tensor([[3, 1, 2]]))]
    return Output(ids, items, positions, torch.tensor([[-7]]))


def test_video_shrinks_by_the_pruned_count_and_everything_else_keeps_its_place():
    out = video_output()
    ids_before, positions_before = list(out.input_ids), out.mrope_positions.clone()
    (stats,) = regions.prune_video_regions(out, Pruning(EVS, 0.5), spatial_merge_size=1, video_token_id=VIDEO)
    kept = max(2, int(3 * 2 * (1 - 0.5)))  # the EVS count, written out
    assert (stats.before, stats.after) == (6, kept)
    assert len(out.input_ids) == len(ids_before) - (6 - kept)
    image, video = out.mm_items
    assert image.offsets == [(2, 5)]
    start, end = video.offsets[0]
    assert out.input_ids[:start] == ids_before[:9] and out.input_ids[end + 1 :] == ids_before[-3:]
    assert torch.equal(out.mrope_positions[:, end + 1 :], positions_before[:, -3:])  # final already
    assert end - start + 1 == len(ids_before) - 3 - 9 - (6 - kept)
    assert int(out.mrope_position_delta) == -7 + (6 - kept)
    assert torch.equal(video.model_specific_data[regions.REGION_IDS], torch.tensor(ids_before[9:-3]))
    assert out.padded_input_ids == ["padded", len(out.input_ids)]


def test_method_and_rate_are_part_of_the_cache_key():
    evs_half, evs_quarter, vidcom2_half = Pruning(EVS, 0.5), Pruning(EVS, 0.25), Pruning(VIDCOM2, 0.5)
    outputs = [video_output() for _ in range(4)]
    for out, pruning in zip(outputs, [evs_half, evs_quarter, evs_half, vidcom2_half], strict=True):
        regions.prune_video_regions(out, pruning, 1, VIDEO)
    a, b, c, d = (scheduler_key(out.mm_items[1]) for out in outputs)
    assert a == c and len({a, b, d}) == 3


def test_vidcom2_region_has_the_vidcom2_count():
    """3 groups of 2 at q = .75: VidCom2 keeps max(T, int(6 * .25)) = 3, EVS max(tpf, 1) = 2."""
    counts = {}
    for method in (EVS, VIDCOM2):
        out = video_output()
        (stats,) = regions.prune_video_regions(out, Pruning(method, 0.75), 1, VIDEO)
        start, end = out.mm_items[1].offsets[0]
        pads = sum(1 for token in out.input_ids[start : end + 1] if token == VIDEO)
        counts[method.name] = (stats.after, pads, out.mm_items[1].model_specific_data[regions.METHOD])
    assert counts == {"evs": (2, 2, "evs"), "vidcom2": (3, 3, "vidcom2")}


def test_region_keep_follows_the_mask_over_pads():
    region = torch.tensor([VIDEO, VIDEO, VE, 12, VS, VIDEO, VIDEO])
    keep = regions.region_keep(region, VIDEO, torch.tensor([True, True, False, True]))
    assert keep.tolist() == [True, True, True, True, True, False, True]


def test_bundled_videos_are_split_into_one_item_each():
    """Qwen2-VL/Qwen2.5-VL: SGLang leaves a request's videos in one item with one span per video."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    grids = torch.tensor([[2, 4, 4], [4, 2, 6]])  # 32 and 48 patches
    bundle = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(3, 10), (15, 26)])
    bundle.feature = torch.arange(80.0)[:, None].expand(80, 5).clone()
    bundle.model_specific_data = {"video_grid_thw": grids, "second_per_grid_ts": torch.tensor([1.0, 0.5])}
    image = MultimodalDataItem(modality=Modality.IMAGE, offsets=[(30, 33)])
    first, second, kept_image = regions.split_bundled_videos([bundle, image])
    assert kept_image is image
    assert first.offsets == [(3, 10)] and second.offsets == [(15, 26)]
    assert torch.equal(first.feature[:, 0], torch.arange(32.0))
    assert torch.equal(second.feature[:, 0], torch.arange(32.0, 80))
    assert torch.equal(first.video_grid_thw, grids[:1]) and torch.equal(second.video_grid_thw, grids[1:])
    assert second.second_per_grid_ts.tolist() == [0.5]
    first.set("evs_pruning_rate", 0.5)
    assert "evs_pruning_rate" not in second.model_specific_data


def test_a_budget_and_a_floor_set_the_regions_length_and_are_part_of_the_cache_key():
    """The grid (3 groups of 2) at q = .5 keeps 3; a budget of 2 keeps 2; a floor of 2 per group keeps 6."""
    settings = [
        Pruning(EVS, 0.5),
        Pruning(EVS, 0.5, token_budget=2),
        Pruning(EVS, 0.5, min_tokens_per_group=2),
        Pruning(EVS, 0.5, token_budget=2, min_tokens_per_group=1),
        Pruning(EVS, 0.5, token_budget=2),
    ]
    outputs = [video_output() for _ in settings]
    laid_out = zip(outputs, settings, strict=True)
    kept = [regions.prune_video_regions(out, pruning, 1, VIDEO)[0].after for out, pruning in laid_out]
    assert kept == [3, 2, 6, 3, 2]
    lengths = [len(out.input_ids) for out in outputs]
    assert [lengths[0] - n for n in lengths] == [0, 1, -3, 0, 1]
    video = outputs[3].mm_items[1].model_specific_data
    assert (video[regions.TOKEN_BUDGET], video[regions.MIN_TOKENS_PER_GROUP]) == (2, 1)
    assert regions.TOKEN_BUDGET not in outputs[0].mm_items[1].model_specific_data  # rate alone: as before
    hashes = [scheduler_key(out.mm_items[1]) for out in outputs]
    assert hashes[1] == hashes[4] and len(set(hashes)) == 4


def test_images_shrink_to_their_kept_count_keyed_by_method_and_rate_and_the_video_is_left_alone():
    """text(2) | two images of 4 and 6 tokens in one bundled item (m=1) | text(1) | a video | text(2), at q = .5:
    the item stays one (a device handle is never split), its spans cut to each image's first 2 and 3 pads, its
    images' unpruned pad positions on it; the video's tokens and the text keep their place and positions, the decode
    offset grows by the 5 deleted."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    from sglang_evs.methods.images import DART, DIVPRUNE
    from sglang_evs.pruning.settings import ImagePruning

    ids = [1, 2, *[IMG] * 4, *[IMG] * 6, 3, VS, VIDEO, VIDEO, VE, 4, 5]
    positions = torch.arange(3 * len(ids)).reshape(3, len(ids)) * 10
    bundle = MultimodalDataItem(modality=Modality.IMAGE, offsets=[(2, 5), (6, 11)])
    bundle.feature = torch.arange(40.0)[:, None].expand(40, 3).clone()  # 4 + 6 tokens of 2 x 2 patches
    bundle.model_specific_data = {"image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 3]])}
    keys_by_setting = []
    for method, rate in ((DIVPRUNE, 0.5), (DIVPRUNE, 0.5), (DART, 0.5), (DIVPRUNE, 0.25)):
        video = Item("video", [(14, 15)], torch.tensor([[1, 1, 2]]))
        out = Output(list(ids), [copy.deepcopy(bundle), video], positions.clone(), torch.tensor([[-7]]))
        stats = regions.prune_image_regions(out, ImagePruning(method, rate), spatial_merge_size=1, image_token_id=IMG)
        keys_by_setting.append(scheduler_key(out.mm_items[0]))
        if rate == 0.25:
            continue
        assert [(s.before, s.after) for s in stats] == [(4, 2), (6, 3)]
        images, kept_video = out.mm_items
        assert kept_video is video and video.offsets == [(9, 10)]
        assert images.offsets == [(2, 3), (4, 6)]
        assert out.input_ids == [1, 2, IMG, IMG, IMG, IMG, IMG, 3, VS, VIDEO, VIDEO, VE, 4, 5]
        kept_columns = [0, 1, 2, 3, 6, 7, 8, *range(12, len(ids))]
        assert torch.equal(out.mrope_positions, positions[:, kept_columns])
        assert int(out.mrope_position_delta) == -7 + 5
        assert torch.equal(images.model_specific_data[regions.REGION_POSITIONS], positions[:, 2:12])
        assert (images.model_specific_data[regions.METHOD], images.model_specific_data[regions.RATE]) == (
            method.name, rate)  # fmt: skip
    same, again, dart, other_rate = keys_by_setting
    assert same == again and len({same, dart, other_rate}) == 3


def test_an_image_that_is_not_one_run_of_its_pads_is_refused():
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    from sglang_evs.methods.images import DIVPRUNE
    from sglang_evs.pruning.settings import ImagePruning

    item = MultimodalDataItem(modality=Modality.IMAGE, offsets=[(1, 3)])
    item.model_specific_data = {"image_grid_thw": torch.tensor([[1, 2, 2]])}  # 4 tokens, 3 pads
    out = Output([1, IMG, IMG, IMG, 2], [item], torch.zeros(3, 5, dtype=torch.long), torch.tensor([[0]]))
    with pytest.raises(ValueError, match=r"an image of grid \[1, 2, 2\] is not one run of 4 pads"):
        regions.prune_image_regions(out, ImagePruning(DIVPRUNE, 0.5), 1, IMG)
