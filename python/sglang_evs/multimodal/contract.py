"""What a multimodal model implements to be embedded by `embed_routine`.

Required (as in SGLang):
  - the language model's `get_input_embeddings() -> nn.Embedding`;
  - one feature getter per modality it accepts, `get_<modality>_feature(items) -> Tensor`
    (`get_image_feature`, `get_video_feature`, `get_audio_feature`), returning one row per
    placeholder token of `items`, in prompt order: `[num_tokens, width]`. A caller may pass
    `data_embedding_funcs={Modality.X: fn}` instead.

Optional:
  - `post_process(fetched: list[FetchedEmbedding], layout: BatchLayout) -> list[FetchedEmbedding]`,
    declared with the class attribute `implements_post_process_contract = True` (SGLang models have
    unrelated methods of that name: upstream Qwen2.5-VL's placeholder takes other arguments),
    called on every forward (prefill chunks and decode, with an empty list when the batch carries
    no media) after the features of this forward were fetched and before they are scattered into
    the input embeddings. It returns the embeddings to scatter, each `[rows, hidden_size]`; it may
    split extra channels off (`width > hidden_size`) and write tensors onto `layout.forward_batch`
    or into buffers it owns, in place. What it writes must not depend on Python-side state that a
    CUDA graph replay would skip: write into fixed-address tensors.
"""

from dataclasses import dataclass
from typing import Any

import torch

CONTRACT_FLAG = "implements_post_process_contract"


def contract_post_process(model: Any) -> Any:
    """The model's `post_process` if the model declares this contract, else None."""
    return getattr(model, "post_process", None) if getattr(model, CONTRACT_FLAG, False) else None


@dataclass(frozen=True)
class FetchedEmbedding:
    """Features of one modality for the placeholder tokens of this forward.

    embedding: [rows, width], in token order of this forward's placeholder tokens of that modality.
    mask:      [num_tokens, 1] bool, True at those tokens (rows == mask.sum()).
    """

    modality: Any  # sglang Modality
    embedding: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class BatchLayout:
    """The token layout of one forward.

    input_ids: [num_tokens]: placeholder tokens carry SGLang's hash-derived pad values.
    requests: per request of the batch, in order: (mm_inputs or None, prefix_len, extend_len);
      this forward covers tokens [prefix_len, prefix_len + extend_len) of each request.
      In decode, extend_len is 1 and mm_inputs is None.
    """

    forward_batch: Any  # sglang ForwardBatch
    input_ids: torch.Tensor
    requests: list[tuple[Any, int, int]]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
