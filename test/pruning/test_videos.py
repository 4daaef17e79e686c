"""Keep-masks under tensor parallelism: every rank of a batch uses rank 0's (`agreed_masks`)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_evs import sglang_compat
from sglang_evs.evs.methods import EVS
from sglang_evs.pruning.videos import agreed_masks


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
