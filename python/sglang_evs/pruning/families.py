"""What the pruning mechanism reads of a model family: one `VideoFamily` per upstream processor.

The mechanism (`regions.py` in the tokenizer process, `videos.py` in the model) is the same for every
family; a family only says where its videos differ:

  - `processor`: the upstream SGLang processor the pruning one extends (`processor.pruning_processor`);
  - `pad_token_field`: the config field naming the token each video row occupies once the processor has
    expanded the prompt (Qwen: `video_token_id`; GLM writes a video's rows as image tokens, `image_token_id`);
  - `fewest_frames`: the fewest frames a video may have (what the family's frame sampler can make one temporal
    group of; both families' towers encode groups of two frames, which the grid's T counts).

What every family shares, and so is not described: an item's grid is `video_grid_thw` (T groups of H x W
patches), its spans run from its first pad to its last (framing text between groups included), the vision
tower returns `T * H * W / merge**2` rows in (t, h, w) order, and the unpruned M-RoPE positions are the
upstream processor's own (Qwen's `get_rope_index`, GLM's `get_rope_index_glm4v`, each equal to the HF
model's `get_rope_index`), which pruning deletes rows from. Deepstack is the model adapter's to declare.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoFamily:
    name: str
    processor: str  # the upstream processor class, by its name in sglang_compat
    pad_token_field: str
    fewest_frames: int

    def pad_token_id(self, config) -> int:
        """The token id of a video row in an expanded prompt (`config`: the checkpoint's whole config)."""
        return int(getattr(config, self.pad_token_field))


# Qwen2-VL, Qwen2.5-VL, Qwen3-VL (+MoE), Qwen3.5 / 3.6: SGLang's one Qwen-VL processor.
QWEN_VL = VideoFamily("Qwen-VL", "UpstreamQwenVLProcessor", "video_token_id", fewest_frames=2)
# GLM-4.1V / GLM-4.5V: each group is an image-token run followed by its second; GLM's sampler pads an odd
# frame count by repeating the last frame, so one frame is a video.
GLM4V = VideoFamily("GLM-4.1V", "UpstreamGlm4vProcessor", "image_token_id", fewest_frames=1)
