"""Deleting pruned tokens from an SGLang processor output: the reference rule, written once.

Every side that shortens a prompt applies it: the tokenizer side before encoding, with the canonical layout
(`regions.prune_video_regions`), the scheduler admitting a threshold's request, with the masks it decided
(`admission.lay_out_by_threshold`), and a language server under encoder disaggregation, with the kept pads its
encoders recorded (`encoder_records.lay_out_pruned`). Every token that stays keeps its unpruned M-RoPE
position, and the decode offset grows by the number deleted (docs/architecture.md).
"""

import torch


def delete_tokens(output, keep: torch.Tensor) -> None:
    """Delete the tokens `keep` ([len(input_ids)] bool) leaves out of `output`, in place: each item's spans
    are mapped onto the kept tokens they cover (a span with none kept is dropped, and an item with no span
    left with it), then the ids, the M-RoPE position columns and the decode offset follow."""
    new_index = keep.cumsum(0) - 1  # old token index -> new token index (for kept tokens)
    items = []
    for item in output.mm_items:
        offsets = []
        for start, end in item.offsets:
            kept_at = start + keep[start : end + 1].nonzero().flatten()
            if kept_at.numel():
                offsets.append((int(new_index[kept_at[0]]), int(new_index[kept_at[-1]])))
        if offsets:
            item.offsets = offsets
            items.append(item)
    output.mm_items = items
    output.input_ids = torch.as_tensor(output.input_ids)[keep].tolist()
    output.mrope_positions = output.mrope_positions[:, keep]
    output.mrope_position_delta = output.mrope_position_delta + int((~keep).sum())
