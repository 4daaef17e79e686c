"""The CPU route's hierarchical-cache copies (`runtime/hierarchical_cache.py`) against plain indexing: a write-back
of random token rows from device layers to the host pool in each layout, and their load back, layer by layer."""

import pytest
import torch

from sglang_evs.runtime import hierarchical_cache as ops

LAYERS, HEADS, HEAD_DIM, DEVICE_TOKENS, HOST_TOKENS = 3, 2, 4, 40, 64


def device_layers(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        [torch.randn(DEVICE_TOKENS, HEADS, HEAD_DIM, generator=generator) for _ in range(LAYERS)] for _ in range(2)
    )  # fmt: skip


def pointers(layers: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([layer.data_ptr() for layer in layers], dtype=torch.uint64)


ITEM_SIZE = HEADS * HEAD_DIM * 4  # float32 bytes of one layer's K (or V) for one token
DEVICE_ROWS = torch.tensor([5, 0, 17, 39, 22, 23])
HOST_ROWS = torch.tensor([63, 1, 30, 8, 9, 2])


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_write_back_and_its_load_move_exactly_the_indexed_rows(layout):
    device_k, device_v = device_layers(0)
    if layout == "page_first":
        host = torch.zeros(2, HOST_TOKENS, LAYERS, HEADS, HEAD_DIM)
        ops.transfer_kv_all_layer_lf_pf(
            src_k_layers=pointers(device_k), dst_k=host[0], src_v_layers=pointers(device_v), dst_v=host[1],
            src_indices=DEVICE_ROWS, dst_indices=HOST_ROWS, item_size=ITEM_SIZE,
            dst_layout_dim=ITEM_SIZE * LAYERS, num_layers=LAYERS,
        )  # fmt: skip
        host_layer = [[host[part][:, layer] for layer in range(LAYERS)] for part in range(2)]
    else:
        host = torch.zeros(2, LAYERS, HOST_TOKENS, HEADS, HEAD_DIM)
        host_layer = [[host[part][layer] for layer in range(LAYERS)] for part in range(2)]
        ops.transfer_kv_all_layer(
            src_k_layers=pointers(device_k), dst_k_layers=pointers(host_layer[0]), src_v_layers=pointers(device_v),
            dst_v_layers=pointers(host_layer[1]), src_indices=DEVICE_ROWS, dst_indices=HOST_ROWS,
            item_size=ITEM_SIZE, num_layers=LAYERS,
        )  # fmt: skip
    untouched = torch.ones(HOST_TOKENS, dtype=torch.bool)
    untouched[HOST_ROWS] = False
    for part, device in enumerate((device_k, device_v)):
        for layer in range(LAYERS):
            assert torch.equal(host_layer[part][layer][HOST_ROWS], device[layer][DEVICE_ROWS])
            assert not host_layer[part][layer][untouched].any()

    loaded_k, loaded_v = ([torch.zeros(DEVICE_TOKENS, HEADS, HEAD_DIM) for _ in range(LAYERS)] for _ in range(2))
    targets = torch.tensor([1, 2, 3, 4, 5, 6])
    for layer in range(LAYERS):
        if layout == "page_first":
            ops.transfer_kv_per_layer_pf_lf(
                src_k=host[0], dst_k=loaded_k[layer], src_v=host[1], dst_v=loaded_v[layer], src_indices=HOST_ROWS,
                dst_indices=targets, layer_id=layer, item_size=ITEM_SIZE, src_layout_dim=ITEM_SIZE * LAYERS,
            )  # fmt: skip
        else:
            ops.transfer_kv_per_layer(
                src_k=host[0][layer], dst_k=loaded_k[layer], src_v=host[1][layer], dst_v=loaded_v[layer],
                src_indices=HOST_ROWS, dst_indices=targets, item_size=ITEM_SIZE,
            )  # fmt: skip
    for loaded, device in ((loaded_k, device_k), (loaded_v, device_v)):
        for layer in range(LAYERS):
            assert torch.equal(loaded[layer][targets], device[layer][DEVICE_ROWS])
            assert not loaded[layer][0].any() and not loaded[layer][7:].any()


def test_direct_copies_pair_layers_in_order():
    device_k, device_v = device_layers(1)
    host = [torch.zeros(HOST_TOKENS, HEADS, HEAD_DIM) for _ in range(2 * LAYERS)]
    ops.transfer_kv_direct(src_layers=device_k + device_v, dst_layers=host, src_indices=DEVICE_ROWS,
                           dst_indices=HOST_ROWS, page_size=1)  # fmt: skip
    for src, dst in zip(device_k + device_v, host, strict=True):
        assert torch.equal(dst[HOST_ROWS], src[DEVICE_ROWS])


def test_the_ops_are_bound_under_names_the_host_pool_imports_from_sgl_kernel():
    """Each op replaces a name `pool_host/mha.py` imports from `sgl_kernel.kvcacheio` on CUDA (read from its source:
    importing it here would import SGLang)."""
    import importlib.util
    from pathlib import Path
    from types import ModuleType

    sglang = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    source = (sglang / "srt" / "mem_cache" / "pool_host" / "mha.py").read_text()
    imported = source.split("from sgl_kernel.kvcacheio import (", 1)[1].split(")", 1)[0]
    assert set(ops.OPS) <= {name.strip() for name in imported.split(",") if name.strip()}
    module = ModuleType("mha")
    ops.install(module)
    assert all(getattr(module, name) is op for name, op in ops.OPS.items())
