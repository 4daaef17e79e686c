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
  buffers, so padded rows and every request's context length are read at replay, not frozen at capture;
  so are speculative verify (`runtime/speculative_attention.py`) and the CPU route's MoE
  (`sglang_evs_cpu::moe_forward`: upstream's loops over the experts' token counts read back to Python);
- the EAGLE / NEXTN draft worker captures the draft-decode and draft-extend graphs a CUDA server with a
  graph-capable attention backend captures.
"""

import functools
import os
import time
from collections.abc import Callable
from types import ModuleType

GRAPH_MODE_ENV = "SGLANG_EVS_CPU_GRAPHS"


def wanted() -> bool:
    return os.environ.get(GRAPH_MODE_ENV) == "1"


def breakable_prefill_by_default(module: ModuleType) -> None:
    """After `sglang.srt.model_executor.cuda_graph_config` imports."""
    from sglang_evs.runtime.cpu_graph import stand_in_for_cuda_graphs

    stand_in_for_cuda_graphs()
    module.default_prefill_backend = lambda: module.Backend.BREAKABLE


def cuda_graph_modes_on_cpu(module: ModuleType) -> None:
    """After `sglang.srt.model_executor.forward_batch_info` imports: a CPU forward replays a decode graph
    for the modes a CUDA forward does (target verify too), not for decode alone."""
    module.ForwardMode.is_cpu_graph = module.ForwardMode.is_cuda_graph


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


_upstream: dict[str, Callable] = {}  # upstream's functions graph mode wraps: decode, extend, moe


@functools.cache
def define_paged_attention_ops() -> None:
    """`sglang_evs_cpu::paged_decode_attention` and `::paged_extend_attention`: upstream's torch-native
    attention (`TorchNativeAttnBackend._run_sdpa_forward_decode` / `_extend`), each as one op. query,
    output [tokens, H, D]; k_cache, v_cache [slots, KH, D]; req_to_token [reqs, context];
    req_pool_indices, seq_lens, extend_prefix_lens, extend_seq_lens [bs]. A sliding window of -1 is none."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    def window(size: int) -> int | None:
        return None if size < 0 else size

    @torch.library.custom_op("sglang_evs_cpu::paged_decode_attention", mutates_args=("output",))
    def paged_decode_attention(
        query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        scaling: float, enable_gqa: bool, sliding_window_size: int,
    ) -> None:  # fmt: skip
        _upstream["decode"](
            object.__new__(TorchNativeAttnBackend), query, output, k_cache, v_cache, req_to_token,
            req_pool_indices, seq_lens, scaling=scaling, enable_gqa=enable_gqa, causal=False,
            sliding_window_size=window(sliding_window_size),
        )  # fmt: skip

    @torch.library.custom_op("sglang_evs_cpu::paged_extend_attention", mutates_args=("output",))
    def paged_extend_attention(
        query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
        scaling: float, enable_gqa: bool, causal: bool, sliding_window_size: int,
    ) -> None:  # fmt: skip
        _upstream["extend"](
            object.__new__(TorchNativeAttnBackend), query, output, k_cache, v_cache, req_to_token,
            req_pool_indices, seq_lens, extend_prefix_lens, extend_seq_lens, scaling=scaling,
            enable_gqa=enable_gqa, causal=causal, sliding_window_size=window(sliding_window_size),
        )  # fmt: skip


def graph_capable_attention(module: ModuleType) -> None:
    """After `sglang.srt.layers.attention.torch_native_backend` imports: its attention runs as one op
    per call (self-attention; cross-attention stays upstream's), and it has the graph hooks."""
    import torch

    backend_class = module.TorchNativeAttnBackend
    decode = _upstream["decode"] = backend_class._run_sdpa_forward_decode
    extend = _upstream["extend"] = backend_class._run_sdpa_forward_extend
    define_paged_attention_ops()
    ops = torch.ops.sglang_evs_cpu

    def run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                                is_cross_attn=False, sliding_window_size=None):  # fmt: skip
        if encoder_lens is not None or is_cross_attn or causal or scaling is None:
            return decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                          encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size)  # fmt: skip
        ops.paged_decode_attention(
            query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, float(scaling),
            bool(enable_gqa), -1 if sliding_window_size is None else int(sliding_window_size),
        )  # fmt: skip
        return output

    def run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
                                causal=False, is_cross_attn=False, sliding_window_size=None):  # fmt: skip
        if encoder_lens is not None or is_cross_attn or scaling is None:
            return extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                          extend_prefix_lens, extend_seq_lens, encoder_lens, scaling, enable_gqa, causal,
                          is_cross_attn, sliding_window_size)  # fmt: skip
        if extend_prefix_lens is None:  # a draft-extend graph's batch: each request's prefix precedes its n tokens
            # SGLang pads its rows with seq_lens at the backend's fill (1) and extend_seq_lens at the draft width:
            # a padding row reads as many of the padding request's slots as it has tokens, as a GPU kernel would
            seq_lens = torch.maximum(seq_lens, extend_seq_lens)
            extend_prefix_lens = seq_lens - extend_seq_lens
        ops.paged_extend_attention(
            query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
            extend_seq_lens, float(scaling), bool(enable_gqa), bool(causal),
            -1 if sliding_window_size is None else int(sliding_window_size),
        )  # fmt: skip
        return output

    backend_class._run_sdpa_forward_decode = run_sdpa_forward_decode
    backend_class._run_sdpa_forward_extend = run_sdpa_forward_extend
    backend_class.init_cuda_graph_state = lambda self, max_bs, max_num_tokens: None
    backend_class.get_cuda_graph_seq_len_fill_value = lambda self: 1


_moe_calls: dict[tuple[int, int], int] = {}  # (id(layer), id(config)) -> handle
_moe_layers: list[tuple] = []  # handle -> (layer, config)


def graph_capable_moe(module: ModuleType) -> None:
    """After `sglang.srt.layers.moe.fused_moe_native` imports: its `moe_forward_native` (the CPU route's MoE
    without AMX) sorts tokens by expert and loops over the experts' counts read back to Python, so a
    captured graph would replay the routing of its capture batch. It becomes one op over the batch's
    tensors (`sglang_evs_cpu::moe_forward`), as a GPU's fused MoE kernel is one kernel over them: a
    replay routes the live tokens. The layer and its runner config are named by a handle."""
    import torch

    upstream = _upstream["moe"] = module.moe_forward_native

    @torch.library.custom_op("sglang_evs_cpu::moe_forward", mutates_args=())
    def moe_forward(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
        """x [tokens, hidden]; topk_weights, topk_ids [tokens, k]. Returns [tokens, hidden]."""
        layer, config = _moe_layers[handle]
        return upstream(layer, x, (topk_weights, topk_ids, None), config)

    def moe_forward_native(layer, x, topk_output, moe_runner_config):
        key = (id(layer), id(moe_runner_config))
        if key not in _moe_calls:
            _moe_calls[key] = len(_moe_layers)
            _moe_layers.append((layer, moe_runner_config))
        topk_weights, topk_ids, _ = topk_output
        return torch.ops.sglang_evs_cpu.moe_forward(x, topk_weights, topk_ids, _moe_calls[key])

    module.moe_forward_native = moe_forward_native


def draft_graphs_on_cpu(module: ModuleType) -> None:
    """After `sglang.srt.speculative.eagle_worker_v2` imports: the draft worker captures the draft-decode
    and draft-extend graphs a CUDA server with a graph-capable attention backend captures (upstream
    captures none on CPU, and the draft-extend one only for the CUDA backends it lists)."""
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    def capture_cuda_graphs(self) -> None:
        self.cuda_graph_runner = None
        self.cuda_graph_runner_for_draft_extend = None
        if check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED):
            return
        if self.speculative_num_steps > 1:
            self.cuda_graph_runner = module.EAGLEDraftCudaGraphRunner(self)
        if self.draft_extend_attn_backend and not envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.get():
            self.cuda_graph_runner_for_draft_extend = module.EAGLEDraftExtendCudaGraphRunner(self)

    module.EagleDraftWorker._capture_cuda_graphs = capture_cuda_graphs


# module name -> work to do on the module right after it was imported (graph mode only)
AFTER_IMPORT = {
    "sglang.srt.model_executor.cuda_graph_config": breakable_prefill_by_default,
    "sglang.srt.model_executor.forward_batch_info": cuda_graph_modes_on_cpu,
    "sglang.srt.arg_groups.attention_hook": graph_capable_torch_native,
    "sglang.srt.model_executor.model_runner_components.cuda_graph_setup": decode_graphs_on_cpu,
    "sglang.srt.model_executor.model_runner": decode_graphs_from_model_runner,
    "sglang.srt.layers.attention.torch_native_backend": graph_capable_attention,
    "sglang.srt.speculative.eagle_worker_v2": draft_graphs_on_cpu,
    "sglang.srt.layers.moe.fused_moe_native": graph_capable_moe,
}
