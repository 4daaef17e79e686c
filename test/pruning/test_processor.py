"""`pruning/processor.py` over the families of `served.py`: each family's pruning processor is its upstream
processor with the pruning mixin first, each model is served by its family's, and what a family says of its
videos holds for its tiny checkpoint."""

import numpy as np
import pytest

from sglang_evs import sglang_compat
from sglang_evs.pruning.processor import PruningProcessor, pruning_processor, refuse_too_short_videos
from sglang_evs.served import GLM4V, QWEN_VL
from sglang_evs.testing.requests import GLM4V_VIDEO, VIDEO, chat_prompt, glm4v_chat_prompt

UPSTREAM_PROCESSORS = {QWEN_VL: "UpstreamQwenVLProcessor", GLM4V: "UpstreamGlm4vProcessor"}


@pytest.mark.parametrize("family", [QWEN_VL, GLM4V], ids=lambda family: family.name)
def test_a_familys_pruning_processor_is_its_upstream_one_with_the_mixin_first(family):
    cls = pruning_processor(family)
    upstream = sglang_compat.resolve(UPSTREAM_PROCESSORS[family])
    assert cls.__mro__[1:3] == (PruningProcessor, upstream)
    assert cls.family is family and pruning_processor(family) is cls  # one class per family
    assert cls.models == []  # registered by the plugin per architecture, not through upstream's list


def test_every_pruned_model_is_served_by_its_familys_processor():
    from sglang_evs.models.registry import pruned_families
    from sglang_evs.served import SERVED

    families = {cls.__name__: family for cls, family in pruned_families().items()}
    assert families["Glm4vForConditionalGeneration"] is families["Glm4vMoeForConditionalGeneration"] is GLM4V
    qwen = ("Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen2VLForConditionalGeneration")
    assert all(families[name] is QWEN_VL for name in qwen)
    assert set(families) == set(SERVED)  # every model the plugin serves, it prunes


class _Video:
    """What SGLang's video loader hands the processor: a sequence of frames with a frame rate."""

    def __init__(self, frames: int) -> None:
        self.frames, self.avg_fps = frames, 4.0

    def __len__(self) -> int:
        return self.frames


def test_the_fewest_frames_are_the_familys():
    refuse_too_short_videos([_Video(1)], GLM4V)  # GLM's sampler makes one group of a lone frame
    refuse_too_short_videos([_Video(2)], QWEN_VL)
    with pytest.raises(ValueError, match="video 1 has 1 frame.*Qwen-VL models need at least 2"):
        refuse_too_short_videos([_Video(2), _Video(1)], QWEN_VL)


@pytest.mark.parametrize(
    ("family", "fixture", "prompt"),
    [(QWEN_VL, "tiny_model_dir", chat_prompt(VIDEO)), (GLM4V, "tiny_glm4v_dir", glm4v_chat_prompt(GLM4V_VIDEO))],
    ids=["Qwen-VL", "GLM-4.1V"],
)
def test_a_video_row_is_the_familys_pad_token(family, fixture, prompt, request):
    """The family's pad token is what the HF processor writes once per video row, T * h * w times (GLM:
    its image token; its own video token is gone after expansion)."""
    from transformers import AutoConfig, AutoProcessor
    from transformers.video_utils import VideoMetadata

    path = request.getfixturevalue(fixture)
    config, processor = AutoConfig.from_pretrained(path), AutoProcessor.from_pretrained(path)
    clip = np.random.default_rng(0).integers(0, 256, (8, 112, 112, 3), dtype=np.uint8)
    metadata = VideoMetadata(total_num_frames=8, fps=2.0, duration=4.0, frames_indices=list(range(8)))
    inputs = processor(text=[prompt], videos=[clip], video_metadata=[metadata], do_sample_frames=False,
                       return_tensors="pt")  # fmt: skip
    t, h, w = inputs["video_grid_thw"][0].tolist()
    merge = config.vision_config.spatial_merge_size
    assert int((inputs["input_ids"] == family.pad_token_id(config)).sum()) == t * h * w // merge**2
