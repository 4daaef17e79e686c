"""`PrunedVideos`: keep-masks under tensor parallelism (every rank of a batch uses rank 0's, `agreed_masks`), and a
forgotten keep-mask computed again by encoding the video again."""

import os
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_evs import sglang_compat
from sglang_evs.methods import EVS
from sglang_evs.multimodal.contract import BatchLayout
from sglang_evs.pruning import holds
from sglang_evs.pruning.fields import METHOD, RATE, REGION_IDS, REGION_POSITIONS, region_keep
from sglang_evs.pruning.videos import PrunedVideos, agreed_masks


class GlooGroup:
    """The part of SGLang's GroupCoordinator that `agreed_masks` uses, over a plain gloo group."""

    device = torch.device("cpu")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(tensor, src=src)
        return tensor


def tied_rows(rank: int) -> torch.Tensor:
    """Rows of a 3-group, 2x2-cell clip (cell 1 changes a -> b -> a) whose two scores after group 0
    tie exactly on rank 0 (cosine is symmetric); on rank 1 one cell differs by 1e-6, as a different
    reduction order can make it, so at q = .55 (one of the two kept) the ranks keep different rows."""
    a, b = torch.tensor([1.0, 0.0, 0.5, 0.0]), torch.tensor([0.3, 1.0, 0.0, 0.2])
    rows = a.repeat(12, 1)
    rows[5] = b
    if rank == 1:
        rows[9, 2] += 1e-6
    return rows


def _rank_main(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        own = EVS.retention_mask(tied_rows(rank), (3, 4, 4), 2, 0.55)
        second = torch.tensor([True, rank == 1, False])
        agreed = agreed_masks([own, second], GlooGroup())
        out[rank] = ([own.tolist(), second.tolist()], [mask.tolist() for mask in agreed])
    finally:
        dist.destroy_process_group()


def test_ranks_whose_own_masks_differ_all_use_rank_0s():
    from sglang_evs.testing.server import free_port

    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank_main, args=(free_port(), out), nprocs=2, start_method="spawn")
        results = dict(out)
    own0, agreed0 = results[0]
    own1, agreed1 = results[1]
    assert own0[0] != own1[0] and sum(own0[0]) == sum(own1[0])  # the tie split the ranks' own EVS masks
    assert own0[1] != own1[1]
    assert agreed0 == agreed1 == own0


def test_one_rank_computes_nothing_more():
    masks = [torch.tensor([True, False]), torch.tensor([False, True, True])]
    assert agreed_masks(masks, None) is masks
    assert agreed_masks([], object()) == []


def test_outside_a_server_there_is_no_rank_group():
    assert sglang_compat.same_batch_group() is None


@pytest.mark.parametrize("masks", [[torch.tensor([True, False, True])], [torch.zeros(0, dtype=torch.bool)]])
def test_masks_come_back_as_bool_of_the_same_lengths(masks):
    class Echo:
        def broadcast(self, tensor, src=0):
            assert tensor.dtype == torch.uint8 and src == 0
            return tensor

    agreed = agreed_masks(masks, Echo())
    assert [m.dtype for m in agreed] == [torch.bool] * len(masks)
    assert [m.tolist() for m in agreed] == [m.tolist() for m in masks]


class VideoItem:
    """The part of SGLang's MultimodalDataItem that `PrunedVideos` reads, for one pruned video."""

    def __init__(self, region_ids: torch.Tensor, grid: list[int], rate: float, start: int, key: int = 1234) -> None:
        self.video_grid_thw = torch.tensor([grid])
        self.hash = key  # the video's key, which folds in how it is pruned (keys.py)
        self.offsets = [(start, start + len(region_ids) - 1)]
        positions = torch.arange(len(region_ids)).expand(3, -1) * torch.tensor([[1], [2], [3]])
        self.model_specific_data = {METHOD: "evs", RATE: rate, REGION_IDS: region_ids, REGION_POSITIONS: positions}

    def is_video(self) -> bool:
        return True


def test_a_forgotten_keep_mask_is_computed_again_by_encoding_the_video_again():
    """An embedding-cache hit long after encoding: the mask was evicted, so writing the positions of a
    later chunk sends the video through the encoder again, and the mask and positions are the same."""
    video_token = 9
    region_ids = torch.tensor([video_token] * 4 + [5] + [video_token] * 4)  # 2 groups of 2x2 pads, a framing token
    rows = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    encoded = []

    def encode(items):
        encoded.append(len(items))
        return rows

    videos = PrunedVideos.__new__(PrunedVideos)
    videos.pad_token_id, videos.spatial_merge_size = video_token, 1
    videos.embed_tokens, videos.encode = torch.nn.Embedding(16, 4), encode
    videos.masks, videos.rank_group, videos.encoded_now = OrderedDict(), None, []
    item = VideoItem(region_ids, [2, 2, 2], 0.5, start=3)

    videos.features([item])
    first_mask = videos.masks[item.hash].clone()
    kept = int(region_keep(region_ids, video_token, first_mask).sum())
    request = SimpleNamespace(mm_items=[item], mrope_positions=torch.full((3, 3 + kept), -1, dtype=torch.int64))
    layout = BatchLayout(SimpleNamespace(), torch.zeros(3 + kept, dtype=torch.int64), [(request, 0, 3 + kept)])
    remembered = torch.zeros(3, 3 + kept, dtype=torch.int64)
    videos.write_positions(layout, remembered)
    # the request's own positions (the speculative draft's source) now hold the region's exact ones
    assert torch.equal(request.mrope_positions[:, 3:], remembered[:, 3:])
    assert (request.mrope_positions[:, :3] == -1).all()  # outside the region: left as laid out

    videos.masks.clear()  # forgotten
    again = torch.zeros(3, 3 + kept, dtype=torch.int64)
    videos.write_positions(layout, again)
    assert encoded == [1, 1]  # encoded a second time
    assert torch.equal(videos.masks[item.hash], first_mask)
    assert torch.equal(again, remembered) and again[:, 3:].any()
    holds.release(item)


def test_the_models_mask_keeps_the_count_the_region_was_laid_out_with_under_a_budget_and_a_floor():
    """The tokenizer laid the region out with `Pruning.kept_count`; the model's mask, from the item's fields after
    the encoder, keeps exactly that many, at least the floor in each group (3 groups of 2x2 cells)."""
    from sglang_evs.pruning.fields import MIN_TOKENS_PER_GROUP, TOKEN_BUDGET
    from sglang_evs.pruning.settings import Pruning

    video_token = 9
    region_ids = torch.tensor([video_token] * 4 + [5] + [video_token] * 4 + [5] + [video_token] * 4)
    rows = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    videos = PrunedVideos.__new__(PrunedVideos)
    videos.pad_token_id, videos.spatial_merge_size = video_token, 1
    videos.embed_tokens, videos.encode = torch.nn.Embedding(16, 4), lambda items: rows
    videos.masks, videos.rank_group, videos.encoded_now = OrderedDict(), None, []
    for budget, floor in ((5, 0), (5, 2), (0, 3), (2, 1)):
        item = VideoItem(region_ids, [3, 2, 2], 0.25, start=0, key=hash((budget, floor)))
        item.model_specific_data.update({TOKEN_BUDGET: budget, MIN_TOKENS_PER_GROUP: floor})
        (region,) = videos.features([item])
        mask = videos.masks[item.hash]
        assert int(mask.sum()) == Pruning(EVS, 0.25, budget, floor).kept_count(4, 3)
        assert min(mask.view(3, 4).sum(dim=1).tolist()) >= floor
        assert region.shape[0] == int(mask.sum()) + 2  # the kept rows and the two framing tokens
        holds.release(item)


def test_a_video_is_encoded_once_per_request_and_pruned_by_one_mask_whatever_a_later_encode_gives():
    """Two chunks of one request fetch the video twice: one tower call (the rows are held, `holds.py`). Once let go,
    a later encode (a repeat, or past the holds' bound) whose rows would rank other cells first still prunes by the
    mask the video was first pruned by: a mask decided per encode would differ here."""
    video_token = 9
    region_ids = torch.tensor([video_token] * 4 + [5] + [video_token] * 4 + [5] + [video_token] * 4)
    first = torch.randn(12, 4, generator=torch.Generator().manual_seed(2))
    later = first.flip(0)  # other dissimilarities: EVS ranks other cells of groups 1 and 2 first
    encodes = []

    def encode(items):
        encodes.append(len(items))
        return first if len(encodes) == 1 else later

    videos = PrunedVideos.__new__(PrunedVideos)
    videos.pad_token_id, videos.spatial_merge_size = video_token, 1
    videos.embed_tokens, videos.encode = torch.nn.Embedding(16, 4), encode
    videos.masks, videos.rank_group, videos.encoded_now = OrderedDict(), None, []
    item = VideoItem(region_ids, [3, 2, 2], 0.5, start=3, key=4321)
    request = SimpleNamespace(mm_items=[item])
    layout = BatchLayout(SimpleNamespace(), torch.zeros(1), [(request, 3, 5)])  # a chunk ending inside the region

    (region,) = videos.features([item])
    videos.release_consumed(layout)
    (again,) = videos.features([item])
    assert encodes == [1] and again is region
    mask = videos.masks[item.hash].clone()
    videos.release_consumed(BatchLayout(SimpleNamespace(), torch.zeros(1), [(request, 8, 10)]))  # its last chunk
    assert holds.held_rows(item) is None

    (repeat,) = videos.features([item])
    assert encodes == [1, 1] and torch.equal(videos.masks[item.hash], mask)
    assert not torch.equal(videos._compute_keep_mask(item, later), mask)  # what deciding again would have kept
    assert torch.equal(repeat[region_ids[region_keep(region_ids, video_token, mask)] == video_token], later[mask])
    holds.release(item)
