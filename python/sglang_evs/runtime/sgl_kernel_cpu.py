"""Stand-in for the `sgl_kernel` package on CPU (imported under that name).

The two functions below serve Qwen3-VL on CPU; the speculative-decoding ones
(EAGLE / NEXTN chains) come from `speculative_kernels.py`. Any other name raises
ImportError (through AttributeError), which SGLang's quantization utilities rely
on to fall back to native code.
"""

import ctypes

import numpy as np
import torch

from sglang_evs.runtime.speculative_kernels import (  # noqa: F401  (imported by name from sgl_kernel)
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req, start:end] = the request's slice of out_cache_loc, per request."""
    lengths = (end_offset - start_offset).tolist()
    chunks = out_cache_loc.split(lengths)
    for req, start, end, locs in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), chunks, strict=True
    ):
        req_to_token[req, start:end] = locs.to(req_to_token.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer (base pointer, row stride in bytes): row[tgt] = row[src]."""
    if src_loc.numel() == 0:
        return
    src = src_loc.cpu().numpy()
    tgt = tgt_loc.cpu().numpy()
    rows = int(max(src.max(), tgt.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buf = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        table = np.ctypeslib.as_array(buf).reshape(rows, stride)
        table[tgt] = table[src]


def rotate_input_ids_cpu(*args, **kwargs):
    """Imported by multi-layer EAGLE (sglang/kernels/ops/speculative/multi_layer_eagle.py) on CPU."""
    raise NotImplementedError("multi-layer EAGLE is not available on sglang-evs' CPU route")
