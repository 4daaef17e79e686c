"""Attention for SGLang 0.5.23's EAGLE / NEXTN worker on the CPU route (`torch_native`).

Upstream's torch-native backend has no speculative paths: target verify reaches
`forward_extend` without prefix lengths, and `DraftBackendFactory` knows no
`torch_native` draft backend. Chain drafts (`--speculative-eagle-topk 1`) need:

- target verify: each request's n verify tokens attend to its committed prefix
  (`req_to_token[:seq_len]`) and causally to one another (their KV at `out_cache_loc`);
- draft decode, step i of the chain: the draft token attends to the request's KV
  through `seq_len + i + 1` (the draft's slots follow the prefix in `req_to_token`,
  where `assign_draft_cache_locs` took them from);
- draft extend: the plain torch-native extend.
"""

import functools
from types import ModuleType

import torch
from torch.nn.functional import scaled_dot_product_attention

TREES_UNSUPPORTED = "speculative decoding on the CPU route runs chain drafts only: use --speculative-eagle-topk 1"


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scaling: float, enable_gqa: bool
) -> torch.Tensor:
    """q [n, H, D]; keys, values [kv, KH, D]; mask [n, kv] bool (True: attend). Returns [n, H, Dv]."""
    out = scaled_dot_product_attention(
        q.movedim(0, 1).unsqueeze(0),
        keys.movedim(0, 1).unsqueeze(0).to(q.dtype),
        values.movedim(0, 1).unsqueeze(0).to(q.dtype),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=enable_gqa,
    )
    return out.squeeze(0).movedim(0, 1)


@functools.cache
def define_verify_attention() -> None:
    """`sglang_evs_cpu::verify_attention`: the verify attention of a batch as one op, so that SGLang's
    verify graph (on the CPU stand-ins of graph mode, `runtime/graph_mode.py`) replays it on the live
    `req_pool_indices` and `seq_lens`. queries, out [B * n, H, D]; key_cache, value_cache [slots, KH, D];
    req_to_token [reqs, context]; req_pool_indices, seq_lens [B]; cache_loc [B * n]."""

    @torch.library.custom_op("sglang_evs_cpu::verify_attention", mutates_args=("out",))
    def verify_attention(
        queries: torch.Tensor, out: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
        req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        cache_loc: torch.Tensor, n: int, scaling: float, enable_gqa: bool,
    ) -> None:  # fmt: skip
        chain = torch.ones((n, n), dtype=torch.bool).tril()
        rows = zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
        for i, (req, prefix) in enumerate(rows):
            block = slice(i * n, (i + 1) * n)
            locations = torch.cat([req_to_token[req, :prefix].long(), cache_loc[block].long()])
            mask = torch.cat([torch.ones((n, prefix), dtype=torch.bool), chain], dim=1)
            out[block] = _attend(queries[block], key_cache[locations], value_cache[locations], mask, scaling,
                                 enable_gqa)  # fmt: skip


def target_verify(backend, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
    """TARGET_VERIFY through a torch-native backend. q [B * n, H * D]. Returns [B * n, H * Dv]."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    spec = forward_batch.spec_info
    if getattr(spec, "topk", 1) != 1:
        raise NotImplementedError(TREES_UNSUPPORTED)
    cache_loc = forward_batch.out_cache_loc
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(cache_loc, backend.swa_out_cache_loc), k, v)
    queries = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    out = queries.new_empty((queries.shape[0], layer.tp_q_head_num, layer.v_head_dim))
    define_verify_attention()
    torch.ops.sglang_evs_cpu.verify_attention(
        queries, out, backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id), backend.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices, forward_batch.seq_lens, cache_loc, spec.draft_token_num,
        float(layer.scaling), layer.tp_q_head_num != layer.tp_k_head_num,
    )  # fmt: skip
    return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def add_target_verify(module: ModuleType) -> None:
    """After `sglang.srt.layers.attention.torch_native_backend` imports: verify goes to `target_verify`."""
    backend_class = module.TorchNativeAttnBackend
    plain_extend = backend_class.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.forward_mode.is_target_verify():
            return target_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
        return plain_extend(self, q, k, v, layer, forward_batch, save_kv_cache)

    backend_class.forward_extend = forward_extend


@functools.cache
def draft_step_backend_class() -> type:
    """The torch-native backend of one step of the draft's decode chain (defined at first use:
    importing SGLang's backend module runs this module's fixes on it)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class DraftStepBackend(TorchNativeAttnBackend):
        """Step `step` of the chain: the draft token attends through seq_len + step + 1."""

        def __init__(self, model_runner, step: int) -> None:
            super().__init__(model_runner)
            self.step = step

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
            committed = forward_batch.seq_lens
            forward_batch.seq_lens = committed + self.step + 1
            try:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
            finally:
                forward_batch.seq_lens = committed

    return DraftStepBackend


class DraftChainBackends:
    """The per-step backends of the draft's decode chain (the container SGLang's worker expects)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int) -> None:
        if topk != 1:
            raise NotImplementedError(TREES_UNSUPPORTED)
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        step_backend = draft_step_backend_class()
        self.attn_backends = [step_backend(model_runner, step) for step in range(speculative_num_steps - 1)]

    def init_forward_metadata(self, forward_batch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)

    # SGLang's draft-decode graph runner (graph mode, `runtime/graph_mode.py`) asks for these.
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        self.init_forward_metadata(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        pass


def add_torch_native_draft_backends(module: ModuleType) -> None:
    """After `sglang.srt.speculative.draft_utils` imports: `DraftBackendFactory` knows `torch_native`."""
    factory = module.DraftBackendFactory
    create_backend = factory._create_backend

    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        if "torch_native" not in backend_map:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            runner = self.draft_model_runner
            if stamps_children:  # the decode chain
                make = lambda: ("torch_native", DraftChainBackends(runner, self.topk, self.speculative_num_steps))  # noqa: E731
            else:  # draft extend
                make = lambda: ("torch_native", TorchNativeAttnBackend(runner))  # noqa: E731
            backend_map = {**backend_map, "torch_native": make}
        return create_backend(self, backend_name, backend_map, error_template, stamps_children)

    factory._create_backend = _create_backend
