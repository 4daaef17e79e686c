"""`--enable-hierarchical-cache` on the CPU route: the KV copies between the device pool and the host pool.

SGLang's MHA host pool (`mem_cache/pool_host/mha.py`) moves KV rows with `sgl_kernel.kvcacheio` ops, which it
imports only on CUDA, ROCm and XPU: on CPU its first write-back stops the scheduler with
`NameError: transfer_kv_all_layer_lf_pf`. The ops below are torch bodies with the call sites' keyword
signatures, bound into that module under the names it calls (`install`), for the layouts and IO backends a
CPU server resolves to: `page_first` (the default) and `layer_first` with the `kernel` backend,
`layer_first` with `direct`.

Every op copies whole token rows: `item_size` bytes of one layer's K (or V) for one token, the same in both
pools. Device layers reach the `all_layer` ops as pointer tables (`uint64` tensors of each layer's base
address, rows `item_size` bytes apart: SGLang checks the rows are packed before calling them); the host
pool's `page_first` buffers hold a token's rows of every layer side by side, `layout_dim` bytes per token
(`[tokens, layers, heads, head_dim]`). On CPU both pools are host memory, so a copy is an index copy of byte rows.
"""

import ctypes
from types import ModuleType

import numpy as np
import torch


def _byte_rows(tensor: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """`tensor`'s memory as `[-1, row_bytes]` bytes (a view: writes go to `tensor`)."""
    return tensor.view(torch.uint8).reshape(-1, row_bytes)


def _rows_at(address: int, rows: int, row_bytes: int) -> torch.Tensor:
    """The `rows x row_bytes` bytes at `address` (a layer buffer known by its pointer) as a uint8 tensor view."""
    buffer = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
    return torch.from_numpy(np.ctypeslib.as_array(buffer).reshape(rows, row_bytes))


def _layer_views(pointers: torch.Tensor, rows: int, item_size: int) -> list[torch.Tensor]:
    return [_rows_at(int(address), rows, item_size) for address in pointers.tolist()]


def _row_count(indices: torch.Tensor) -> int:
    return int(indices.max()) + 1 if indices.numel() else 0


def transfer_kv_per_layer(
    src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
    src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int, **_: object,
) -> None:  # fmt: skip
    """One layer, layer-first host to device: `dst[dst_indices] = src[src_indices]`, rows of `item_size` B."""
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        _byte_rows(dst, item_size)[dst_indices] = _byte_rows(src, item_size)[src_indices]


def transfer_kv_all_layer(
    src_k_layers: torch.Tensor, dst_k_layers: torch.Tensor, src_v_layers: torch.Tensor,
    dst_v_layers: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int,
    num_layers: int, **_: object,
) -> None:  # fmt: skip
    """Every layer, device to layer-first host, both sides given as pointer tables of `num_layers` layers."""
    if src_indices.numel() == 0:
        return
    src_rows, dst_rows = _row_count(src_indices), _row_count(dst_indices)
    for src_table, dst_table in ((src_k_layers, dst_k_layers), (src_v_layers, dst_v_layers)):
        sources = _layer_views(src_table[:num_layers], src_rows, item_size)
        targets = _layer_views(dst_table[:num_layers], dst_rows, item_size)
        for src, dst in zip(sources, targets, strict=True):
            dst[dst_indices] = src[src_indices]


def transfer_kv_per_layer_pf_lf(
    src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
    src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int, item_size: int, src_layout_dim: int,
    **_: object,
) -> None:  # fmt: skip
    """One layer, page-first host (`src_layout_dim` B per token, layer `layer_id`'s row at `layer_id *
    item_size`) to the device layer."""
    columns = slice(layer_id * item_size, (layer_id + 1) * item_size)
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        _byte_rows(dst, item_size)[dst_indices] = _byte_rows(src, src_layout_dim)[src_indices, columns]


def transfer_kv_all_layer_lf_pf(
    src_k_layers: torch.Tensor, dst_k: torch.Tensor, src_v_layers: torch.Tensor, dst_v: torch.Tensor,
    src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int, dst_layout_dim: int, num_layers: int,
    **_: object,
) -> None:  # fmt: skip
    """Every layer, device (pointer tables) to the page-first host buffers."""
    if src_indices.numel() == 0:
        return
    src_rows = _row_count(src_indices)
    for src_table, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
        host = _byte_rows(dst, dst_layout_dim)
        for layer, src in enumerate(_layer_views(src_table[:num_layers], src_rows, item_size)):
            host[dst_indices, layer * item_size : (layer + 1) * item_size] = src[src_indices]


def transfer_kv_direct(
    src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src_indices: torch.Tensor,
    dst_indices: torch.Tensor, page_size: int, **_: object,
) -> None:  # fmt: skip
    """Layer by layer (K layers, then V layers, paired in order): `dst[dst_indices] = src[src_indices]`."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices] = src[src_indices]


OPS = {
    op.__name__: op
    for op in (
        transfer_kv_per_layer,
        transfer_kv_all_layer,
        transfer_kv_per_layer_pf_lf,
        transfer_kv_all_layer_lf_pf,
        transfer_kv_direct,
    )
}


def install(module: ModuleType) -> None:
    """After `sglang.srt.mem_cache.pool_host.mha` imports: its transfer ops are the torch ones above."""
    for name, op in OPS.items():
        setattr(module, name, op)
