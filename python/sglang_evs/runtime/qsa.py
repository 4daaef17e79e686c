"""Qwen4-Exp's sparse-attention indexer (QSA) on the CPU route: pure-torch stand-ins.

SGLang 0.5.23's `QSAIndexer` defines only `forward_cuda` and `forward_xpu` (its CPU forward falls
to a bare `NotImplementedError`), though the orchestration they call, `_forward_impl`, is portable;
and the prefill's gather of compressed keys (`qsa.kernel.gather_qsa_compressed_keys`, also imported
by name into `qsa.metadata`) is a Triton kernel with no CPU branch. Everything else on the path
(top-k, block expansion, sparse attention) already has a torch branch upstream.
"""

import torch


def gather_qsa_compressed_keys(
    compressed: torch.Tensor,
    token_slot_table: torch.Tensor,
    cu_blocks: torch.Tensor,
    total_blocks: int,
    max_blocks: int,
    compress_ratio: int,
) -> torch.Tensor:
    """Every sequence's complete compressed keys, packed in sequence order (upstream's kernel, in torch).

    compressed [compressed slots, kv_heads, dim] (any dtype: rows are copied as raw bytes, FP8 too);
    token_slot_table [S, >= ratio * blocks] (per-token KV slots); cu_blocks [S + 1] (block offsets);
    total_blocks, max_blocks host ints. Returns [total_blocks, kv_heads, dim] in compressed.dtype:
    row cu_blocks[i] + b = compressed[token_slot_table[i, b * ratio] // ratio] (a block's compressed
    slot is its first token's slot // ratio) for b < cu_blocks[i + 1] - cu_blocks[i]. As upstream,
    rows at or past total_blocks are never written, nor blocks past the kernel's grid
    (ceil(max_blocks / 64) * 64 per sequence); rows no sequence writes are left uninitialised.
    """
    heads, dim = compressed.shape[1:]
    output = compressed.new_empty((total_blocks, heads, dim))
    if total_blocks == 0:
        return output
    cu = cu_blocks.long().cpu()
    counts = (cu[1:] - cu[:-1]).clamp(0, -(-max_blocks // 64) * 64)
    sequence = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    block = torch.arange(sequence.numel()) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    rows = cu[sequence] + block
    keep = (rows >= 0) & (rows < total_blocks)
    sequence, block, rows = sequence[keep], block[keep], rows[keep]
    first = token_slot_table[sequence.to(token_slot_table.device), (block * compress_ratio).to(token_slot_table.device)]
    slots = torch.div(first.long(), compress_ratio, rounding_mode="floor")
    source = compressed.reshape(compressed.shape[0], -1).view(torch.uint8)
    output.view(total_blocks, -1).view(torch.uint8)[rows] = source[slots.to(source.device)]
    return output


def forward_cpu(self, hidden_states, positions, forward_batch, indexer_metadata, cp_global_rope_positions=None):
    """`QSAIndexer.forward_cpu` / `forward_native`: the portable `_forward_impl`, as its CUDA forward calls it."""
    return self._forward_impl(hidden_states, positions, forward_batch, indexer_metadata, cp_global_rope_positions)


def install_indexer(module) -> None:
    """`sglang.srt.layers.attention.qsa.qsa_indexer`: give `QSAIndexer` the CPU forwards it lacks.

    SGLang dispatches a CPU to `forward_cpu` only where it has Intel AMX, to `forward_native` elsewhere
    (also the torch.compile path): both are bound where the class does not define them itself.
    """
    for name in ("forward_cpu", "forward_native"):
        if name not in module.QSAIndexer.__dict__:
            setattr(module.QSAIndexer, name, forward_cpu)


def install_gather(module) -> None:
    """`sglang.srt.layers.attention.qsa.kernel` or `.metadata`: bind the gather stand-in by name."""
    module.gather_qsa_compressed_keys = gather_qsa_compressed_keys
