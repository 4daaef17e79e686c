"""Graph mode for CPU-route servers: SGLang's own CUDA-graph runners capture and replay on CPU.

On CUDA, SGLang 0.5.23 replays every decode step from its decode CUDA graphs (`DecodeCudaGraphRunner`,
full backend) and prefills under breakable prefill graphs (`default_prefill_backend()` is BREAKABLE
on CUDA; its resolution then turns them off for a multimodal model off its allowlist, for pipeline
parallelism, and so on). On the CPU route it runs eagerly. With `SGLANG_EVS_CPU_GRAPHS=1` (set by the
test launcher's `graph_mode` option, never by an install) these fixes make a CPU server resolve and
capture as a CUDA server does:

- `torch.cuda.CUDAGraph`, and the CPU device module's `graph`, `is_current_stream_capturing` and
  `graph_pool_handle`, are the stand-ins of `runtime/cpu_graph.py` (a replay re-runs the recorded
  kernels on the tensors captured, runs none of the Python around them);
- server-argument resolution: prefill's default backend is BREAKABLE (as `is_cuda()` would give), and
  the `torch_native` attention backend no longer turns decode and prefill graphs off (it is graph-capable
  here, below), so every other rule of SGLang's resolution applies as on a GPU;
- `capture_decode_graph` on CPU builds the runner a CUDA server builds
  (`ModelRunner._decode_cuda_graph_runner_cls()`, not the torch.compile `CPUGraphRunner`), and a CPU
  forward replays it for the modes a CUDA forward does (`ForwardMode.is_cuda_graph`);
- the `torch_native` backend gets the graph hooks SGLang asks of a backend (`init_cuda_graph_state`,
  a padding fill of 1 for `seq_lens`), and its decode attention becomes one op over the batch's static
  tensors (`sglang_evs_cpu::paged_decode_attention`), as flashinfer's graph path is one kernel over
  padded buffers: a replay runs it on the live `req_pool_indices` and `seq_lens` in the captured
  buffers, so padded rows and every request's context length are read at replay, not frozen at capture.
"""

import functools
import os
import time
from types import ModuleType

GRAPH_MODE_ENV = "SGLANG_EVS_CPU_GRAPHS"


def wanted() -> bool:
    return os.environ.get(GRAPH_MODE_ENV) == "1"


def breakable_prefill_by_default(module: ModuleType) -> None:
    """After `sglang.srt.model_executor.cuda_graph_config` imports."""
    from sglang_evs.runtime.cpu_graph import stand_in_for_cuda_graphs

    stand_in_for_cuda_graphs()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    module.default_prefill_backend = lambda: module.Backend.BREAKABLE
    ForwardMode.is_cpu_graph = ForwardMode.is_cuda_graph


def graph_capable_torch_native(module: ModuleType) -> None:
    """After `sglang.srt.arg_groups.attention_hook` imports: resolve as if the attention backend
    were graph-capable (it is, in graph mode), dropping what it declared about CUDA graphs."""
    resolve = module.handle_attention_backend_compatibility

    @functools.wraps(resolve)
    def handle_attention_backend_compatibility(server_args) -> None:
        before = len(getattr(server_args, "_resolved_overrides", None) or ())
        resolve(server_args)
        stash = server_args._resolved_overrides
        stash[before:] = [
            (source, fields) for source, fields in stash[before:]
            if not (source == "_handle_attention_backend_compatibility" and "cuda_graph_config" in fields)
        ]  # fmt: skip

    module.handle_attention_backend_compatibility = handle_attention_backend_compatibility


def decode_graphs_on_cpu(module: ModuleType) -> None:
    """After `sglang.srt.model_executor.model_runner_components.cuda_graph_setup` imports: on CPU,
    `capture_decode_graph` builds the decode (or verify) runner a CUDA server builds."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    upstream = module.capture_decode_graph

    def capture_decode_graph(*, model_runner):
        if (
            model_runner.device != "cpu"
            or not model_runner.is_generation
            or check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
        ):
            return upstream(model_runner=model_runner)
        if model_runner.is_draft_worker:
            phase = "draft_decode"
        elif model_runner.spec_algorithm.is_speculative():
            phase = "target_verify"
        else:
            phase = "decode"
        tic = time.perf_counter()
        runner = model_runner._decode_cuda_graph_runner_cls()(model_runner)
        return module.GraphCapture(
            runner=runner, memory_phase=phase, memory_usage_gb=0, capture_time=time.perf_counter() - tic
        )

    module.capture_decode_graph = capture_decode_graph


def decode_graphs_from_model_runner(module: ModuleType) -> None:
    """After `sglang.srt.model_executor.model_runner` imports (it binds `capture_decode_graph` by name)."""
    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup

    module.capture_decode_graph = cuda_graph_setup.capture_decode_graph


@functools.cache
def define_paged_decode_attention() -> None:
    """Define `sglang_evs_cpu::paged_decode_attention`: upstream's torch-native decode attention
    (`TorchNativeAttnBackend._run_sdpa_forward_decode`), as one op. query, output [bs, H, D];
    k_cache, v_cache [slots, KH, D]; req_to_token [reqs, context]; req_pool_indices, seq_lens [bs].
    A sliding window of -1 is none."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    @torch.library.custom_op("sglang_evs_cpu::paged_decode_attention", mutates_args=("output",))
    def paged_decode_attention(
        query: torch.Tensor,
        output: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        scaling: float,
        enable_gqa: bool,
        sliding_window_size: int,
    ) -> None:
        _upstream_decode[0](
            object.__new__(TorchNativeAttnBackend), query, output, k_cache, v_cache, req_to_token,
            req_pool_indices, seq_lens, scaling=scaling, enable_gqa=enable_gqa, causal=False,
            sliding_window_size=None if sliding_window_size < 0 else sliding_window_size,
        )  # fmt: skip


_upstream_decode = [None]  # upstream's `_run_sdpa_forward_decode`, kept when its module imports


def graph_capable_attention(module: ModuleType) -> None:
    """After `sglang.srt.layers.attention.torch_native_backend` imports."""
    import torch

    backend_class = module.TorchNativeAttnBackend
    upstream = _upstream_decode[0] = backend_class._run_sdpa_forward_decode
    define_paged_decode_attention()

    def run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                                is_cross_attn=False, sliding_window_size=None):  # fmt: skip
        if encoder_lens is not None or is_cross_attn or causal or scaling is None:
            return upstream(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                            encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size)  # fmt: skip
        torch.ops.sglang_evs_cpu.paged_decode_attention(
            query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, float(scaling),
            bool(enable_gqa), -1 if sliding_window_size is None else int(sliding_window_size),
        )  # fmt: skip
        return output

    backend_class._run_sdpa_forward_decode = run_sdpa_forward_decode
    backend_class.init_cuda_graph_state = lambda self, max_bs, max_num_tokens: None
    backend_class.get_cuda_graph_seq_len_fill_value = lambda self: 1


# module name -> work to do on the module right after it was imported (graph mode only)
AFTER_IMPORT = {
    "sglang.srt.model_executor.cuda_graph_config": breakable_prefill_by_default,
    "sglang.srt.arg_groups.attention_hook": graph_capable_torch_native,
    "sglang.srt.model_executor.model_runner_components.cuda_graph_setup": decode_graphs_on_cpu,
    "sglang.srt.model_executor.model_runner": decode_graphs_from_model_runner,
    "sglang.srt.layers.attention.torch_native_backend": graph_capable_attention,
}
