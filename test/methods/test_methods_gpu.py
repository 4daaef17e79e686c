"""GPU only: each pruning method keeps the same rows on a CUDA device as on the CPU, up to rounding.

On a GPU server the keep-mask is computed where the vision encoder left its rows, on the device; the
tests elsewhere in this folder run on the CPU. For real-sized videos (a Qwen3-VL-2B clip's
``[main | 3 deepstack]`` rows):

* float32 rows with no two cells alike: the device keeps what the CPU keeps, but for a swap or two at
  the kept/dropped boundary, where two scores are within rounding of each other;
* a static background (cells bit-identical to the group before, as in a screen recording): these tie
  at score 0 exactly on the CPU, which keeps the lower index; the GPU's cosine of two identical rows is
  1 only to within rounding, so it picks among them by rounding noise. Every changed cell and the
  first group are kept on both; the device differs from the CPU only among the unchanged cells;
* bfloat16 (the dtype a GPU server encodes in): exactly the stated count, on the rows' device.

    pytest -m gpu test/methods/test_methods_gpu.py
"""

import pytest
import torch

from sglang_evs.methods import METHODS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the CPU tests beside it cover CPU"),
]

CLIPS = [(16, 16, 28), (64, 8, 14), (2, 24, 42)]  # (T groups, h, w) after merging
RATES = [0.0, 0.3, 0.75, 0.9]
DIM = 4 * 2048  # Qwen3-VL-2B: main rows and three deepstack levels


def masks(method: str, rows: torch.Tensor, clip: tuple[int, int, int], q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU's mask and the device's (brought back), after checking each keeps the stated count."""
    t, h, w = clip
    grid = (t, 2 * h, 2 * w)
    on_cpu = METHODS[method].retention_mask(rows, grid, 2, q)
    on_cuda = METHODS[method].retention_mask(rows.cuda(), grid, 2, q)
    assert on_cuda.device.type == "cuda"
    count = METHODS[method].retained_token_count(h * w, t, q)
    assert int(on_cpu.sum()) == int(on_cuda.sum()) == count
    return on_cpu, on_cuda.cpu()


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: "x".join(map(str, c)))
def test_float32_mask_on_cuda_equals_cpu_up_to_boundary_rounding(method: str, clip: tuple[int, int, int]) -> None:
    t, h, w = clip
    rows = torch.randn(t * h * w, DIM, generator=torch.Generator().manual_seed(t))
    for q in RATES:
        on_cpu, on_cuda = masks(method, rows, clip, q)
        swapped = int((on_cpu != on_cuda).sum()) // 2
        assert swapped <= 2, f"{method} q={q}: {swapped} kept rows differ from the CPU's"


def test_evs_on_cuda_differs_from_cpu_only_among_unchanged_cells() -> None:
    clip = t, h, w = CLIPS[0]
    g = torch.Generator().manual_seed(3)
    moving = torch.rand(t, h * w, 1, generator=g) < 0.3
    rows = (torch.randn(1, h * w, DIM, generator=g) + moving * torch.randn(t, h * w, DIM, generator=g)).view(-1, DIM)
    grouped = rows.view(t, h * w, DIM)
    unchanged = torch.zeros(t, h * w, dtype=torch.bool)
    unchanged[1:] = (grouped[1:] == grouped[:-1]).all(dim=-1)
    unchanged = unchanged.view(-1)
    seen_difference = False
    for q in RATES:
        on_cpu, on_cuda = masks("evs", rows, clip, q)
        differ = on_cpu != on_cuda
        assert not (differ & ~unchanged).any(), f"q={q}: a changed cell or group 0 was kept on one device only"
        assert on_cuda[~unchanged].all() or q >= 0.75, f"q={q}: a changed cell was dropped"
        seen_difference |= bool(differ.any())
    # not a requirement, a record: if the device's ties ever become exact, the docs' note on them is stale
    print(f"CUDA and CPU chose different unchanged cells: {seen_difference}")


@pytest.mark.parametrize("method", list(METHODS))
def test_bfloat16_mask_on_cuda_keeps_the_stated_count(method: str) -> None:
    t, h, w = CLIPS[0]
    rows = torch.randn(t * h * w, DIM, generator=torch.Generator().manual_seed(7)).to("cuda", torch.bfloat16)
    for q in RATES:
        mask = METHODS[method].retention_mask(rows, (t, 2 * h, 2 * w), 2, q)
        assert mask.device == rows.device and mask.dtype == torch.bool
        assert int(mask.sum()) == METHODS[method].retained_token_count(h * w, t, q)
        if method == "evs":
            assert mask[: h * w].all(), "EVS keeps the first group whole"
