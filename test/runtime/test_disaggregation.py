"""The CPU route's stand-ins for prefill/decode disaggregation (`runtime/disaggregation.py`), as SGLang's modules
see them once imported. Served: `test/e2e/test_pd_disaggregation.py`."""

import torch

from sglang_evs.runtime.disaggregation import allocate_unpinned


def test_host_kv_pools_over_a_cpu_device_pool_allocate_unpinned_leaving_1_gib_and_a_gpus_still_register(cpu_route):
    out = cpu_route(
        """
        import torch
        from sglang.srt.mem_cache.pool_host import common, mha, mla
        from sglang_evs.runtime.disaggregation import allocate_unpinned

        funcs = common.ALLOC_MEMORY_FUNCS
        assert funcs["cpu"] is allocate_unpinned
        assert mha.ALLOC_MEMORY_FUNCS is funcs and mla.ALLOC_MEMORY_FUNCS is funcs  # one dict serves every pool
        assert funcs["cuda"] is common.alloc_with_host_register
        from sglang.srt.mem_cache.pool_host import base
        assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 1024**3  # a GPU host's is 10 GiB
        buffer = funcs["cpu"]((2, 5, 3), torch.float32, "cpu", True, common.HostTensorAllocator())
        print(tuple(buffer.shape), buffer.dtype)
        """
    )
    assert out.split() == ["(2,", "5,", "3)", "torch.float32"]


def test_an_allocator_less_call_gets_a_plain_tensor():
    buffer = allocate_unpinned((4, 2), torch.int32, "cpu", pin_memory=True, allocator=None)
    assert buffer.shape == (4, 2) and buffer.dtype == torch.int32


def test_the_prefill_senders_events_and_pinned_index_copies_run_on_cpu(cpu_route):
    out = cpu_route(
        """
        import torch
        from sglang.srt.disaggregation import prefill

        event = prefill.torch.cuda.Event()  # the early send's
        event.record(prefill.torch.cuda.current_stream())
        event.synchronize()
        indices = prefill.torch.empty((4,), dtype=torch.int64, device="cpu", pin_memory=True)
        indices.copy_(torch.arange(4), non_blocking=True)
        assert prefill.torch.Tensor is torch.Tensor and prefill.torch.cuda.is_available is torch.cuda.is_available
        assert torch.cuda.Event is not torch.cpu.Event and torch.cuda.current_stream is not torch.cpu.current_stream
        print(indices.tolist())
        """
    )
    assert out.strip() == "[0, 1, 2, 3]"
