"""The multimodal embedding routine, in place of SGLang's `general_mm_embed_routine`.

It knows no model: it fetches each modality's features through the model's
getters (SGLang's embedding cache and chunked-prefill slicing included), hands
them to the model's optional `post_process` hook, scatters what comes back into
the token embeddings at the placeholder positions, and runs the language model
with `input_embeds` as its only tensor input. The model contract is in
`contract.py`.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.multimodal.contract import BatchLayout, FetchedEmbedding, contract_post_process


def general_mm_embed_routine(
    input_ids: torch.Tensor,
    forward_batch: Any,
    language_model: nn.Module,
    multimodal_model: nn.Module | None = None,
    data_embedding_funcs: dict[Any, Callable] | None = None,
    placeholder_tokens: dict | None = None,
    feature_dtypes: dict[Any, torch.dtype] | None = None,
    **kwargs: Any,
) -> Any:
    """Embed text and media, then run the language model. Same call shape as SGLang's routine."""
    input_embeds = embed_inputs(
        input_ids, forward_batch, language_model, multimodal_model, data_embedding_funcs, feature_dtypes
    )
    with torch.profiler.record_function("sglang.vlm.language_model_prefill"):
        return language_model(input_ids=None, forward_batch=forward_batch, input_embeds=input_embeds, **kwargs)


def embed_inputs(
    input_ids: torch.Tensor,
    forward_batch: Any,
    language_model: nn.Module,
    multimodal_model: nn.Module | None = None,
    data_embedding_funcs: dict[Any, Callable] | None = None,
    feature_dtypes: dict[Any, torch.dtype] | None = None,
) -> torch.Tensor | None:
    """Input embeddings [num_tokens, hidden] of one forward, or None on a later pipeline rank."""
    pp_group = getattr(language_model, "pp_group", None)
    if pp_group is not None and not pp_group.is_first_rank:
        return None
    embed_tokens = language_model.get_input_embeddings()
    mode = forward_batch.forward_mode
    carries_media = not mode.is_decode() and not mode.is_target_verify() and forward_batch.contains_mm_inputs()

    fetched: list[FetchedEmbedding] = []
    if carries_media:
        if feature_dtypes:
            _cast_features(forward_batch, feature_dtypes)
        with torch.profiler.record_function("sglang.vlm.mm_embedding"):
            fetched, input_ids = fetch_features(input_ids, forward_batch, multimodal_model, data_embedding_funcs)

    # Placeholder tokens carry hash-derived ids (the radix-cache key); their
    # rows are overwritten below. Clamped in place, as SGLang does.
    input_ids.clamp_(min=0, max=embed_tokens.num_embeddings - 1)
    input_embeds = embed_tokens(input_ids)

    if trace.enabled():
        trace.record(
            "embed_routine",
            model=type(multimodal_model).__name__,
            media_rows=[int(f.mask.sum()) for f in fetched],
            extend_lens=list(forward_batch.extend_seq_lens_cpu or []) if mode.is_extend() else [],
            media_requests=_requests_with_media_in_window(forward_batch) if carries_media else 0,
        )
    post_process = contract_post_process(multimodal_model)
    if post_process is not None:
        fetched = post_process(fetched, batch_layout(forward_batch, input_ids))
    for item in fetched:
        sglang.scatter_mm_embedding(dest=input_embeds, mask=item.mask, src=item.embedding)

    if carries_media:
        _release_features(forward_batch, input_embeds)
    if forward_batch.input_embeds is not None:  # a CUDA graph's static buffer
        forward_batch.input_embeds.copy_(input_embeds)
        input_embeds = forward_batch.input_embeds
    return input_embeds


def fetch_features(
    input_ids: torch.Tensor,
    forward_batch: Any,
    model: nn.Module | None,
    data_embedding_funcs: dict[Any, Callable] | None,
) -> tuple[list[FetchedEmbedding], torch.Tensor]:
    """Features of every modality present in this forward, through SGLang's cache and chunk slicing."""
    if sglang.get_server_args() is not None and sglang.get_disagg().enable_adaptive_dispatch_to_encoder:
        raise NotImplementedError("sglang-evs: --enable-adaptive-dispatch-to-encoder is not supported")
    requests = [
        (mm, prefix, extend)
        for mm, prefix, extend in zip(
            forward_batch.mm_inputs,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
            strict=True,
        )
        if mm is not None
    ]
    prefix_lens = [prefix for _, prefix, _ in requests]
    extend_lens = [extend for _, _, extend in requests]
    fetched = []
    for modality in sglang.Modality.all():
        per_request = [
            [item for item in mm.mm_items if item is not None and item.is_modality(modality)] for mm, _, _ in requests
        ]
        items = [item for request_items in per_request for item in request_items]
        if not items:
            continue
        getter = (data_embedding_funcs or {}).get(modality) or getattr(
            model, f"get_{modality.name.lower()}_feature", None
        )
        if getter is None:
            raise ValueError(f"{type(model).__name__} has no feature getter for {modality.name}")
        items_size = [0]
        for request_items in per_request:
            items_size.append(items_size[-1] + len(request_items))
        placeholders = torch.as_tensor(
            sorted(v for item in items for v in item.padding_values()), device=input_ids.device
        )
        embedding, mask, input_ids = sglang.get_embedding_and_mask(
            data_embedding_func=getter,
            embedding_items=items,
            placeholder_tensor=placeholders,
            input_ids=input_ids,
            items_size=items_size,
            prefix_length=prefix_lens,
            extend_length=extend_lens,
            items_offset_list=[
                [span for item in request_items for span in item.offsets] for request_items in per_request
            ],
        )
        if embedding is not None and mask is not None:
            fetched.append(FetchedEmbedding(modality, embedding, mask))
    return fetched, input_ids


def batch_layout(forward_batch: Any, input_ids: torch.Tensor) -> BatchLayout:
    if forward_batch.forward_mode.is_decode() or forward_batch.extend_prefix_lens_cpu is None:
        seq_lens = forward_batch.seq_lens_cpu.tolist() if forward_batch.seq_lens_cpu is not None else []
        return BatchLayout(forward_batch, input_ids, [(None, n - 1, 1) for n in seq_lens])
    mm_inputs = forward_batch.mm_inputs or [None] * len(forward_batch.extend_seq_lens_cpu)
    requests = list(
        zip(mm_inputs, forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu, strict=True)
    )
    return BatchLayout(forward_batch, input_ids, requests)


def _requests_with_media_in_window(forward_batch: Any) -> int:
    """How many requests of an extend forward have placeholder tokens among the tokens it covers (trace)."""
    count = 0
    for mm, prefix, extend in zip(
        forward_batch.mm_inputs, forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu, strict=True
    ):
        spans = [span for item in (mm.mm_items if mm is not None else ()) for span in item.offsets]
        count += any(start < prefix + extend and end >= prefix for start, end in spans)
    return count


def _cast_features(forward_batch: Any, feature_dtypes: dict[Any, torch.dtype]) -> None:
    for mm in forward_batch.mm_inputs:
        for item in mm.mm_items if mm is not None else ():
            dtype = feature_dtypes.get(item.modality)
            feature = item.feature
            if dtype is not None and isinstance(feature, torch.Tensor) and feature.is_cuda and feature.dtype != dtype:
                feature.record_stream(torch.cuda.current_stream(feature.device))  # read after replacement
                item.feature = feature.to(dtype=dtype)


def _release_features(forward_batch: Any, input_embeds: torch.Tensor) -> None:
    """SGLang's bookkeeping after embedding: offload CUDA features, mark the batch embedded."""
    if input_embeds.is_cuda:
        language_only = sglang.get_disagg().language_only
        stream = torch.cuda.current_stream(input_embeds.device)
        offloaded = False
        for mm in forward_batch.mm_inputs:
            for item in mm.mm_items if mm is not None else ():
                # Kept (on the host) for later prefill chunks if the embedding cache evicts them.
                if isinstance(item.feature, torch.Tensor) and item.feature.is_cuda:
                    item.feature.record_stream(stream)
                    item.feature = item.feature.to("cpu", non_blocking=True)
                    offloaded = True
                precomputed = item.precomputed_embeddings
                if (
                    language_only
                    and isinstance(precomputed, torch.Tensor)
                    and precomputed.is_cuda
                    and not item.keep_device_embedding
                ):
                    precomputed.record_stream(stream)
                    item.precomputed_embeddings = precomputed.to("cpu", non_blocking=True)
                    offloaded = True
        if offloaded:
            schedule = sglang.mm_schedule
            if schedule.host_offload_event is None:
                schedule.host_offload_event = torch.cuda.Event()
            schedule.host_offload_event.record(stream)
    forward_batch.mm_inputs = None
    eagle = forward_batch.spec_algorithm is not None and forward_batch.spec_algorithm.is_eagle()
    forward_batch.mm_input_embeds = input_embeds.clone() if eagle else input_embeds
