"""The two stand-in kernels that SGLang calls on CPU, against plain-loop references."""

import torch

from sglang_evs.runtime.sgl_kernel_cpu import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu


def test_assign_req_to_token_pool_matches_loop():
    req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    req_pool_indices = torch.tensor([2, 0, 3])
    start = torch.tensor([0, 5, 30])
    end = torch.tensor([4, 12, 32])
    out_cache_loc = torch.arange(100, 100 + int((end - start).sum()))
    expected = req_to_token.clone()
    offset = 0
    for req, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist(), strict=True):
        expected[req, s:e] = out_cache_loc[offset : offset + e - s].int()
        offset += e - s
    assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out_cache_loc, 32)
    assert torch.equal(req_to_token, expected)


def test_copy_all_layer_kv_cache_copies_rows_in_every_buffer():
    buffers = [torch.randn(16, 2, 8), torch.randn(16, 2, 8).half()]
    expected = [b.clone() for b in buffers]
    src, tgt = torch.tensor([1, 5, 7]), torch.tensor([10, 11, 2])
    for b in expected:
        b[tgt] = b[src].clone()
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for got, want in zip(buffers, expected, strict=True):
        assert torch.equal(got, want)
