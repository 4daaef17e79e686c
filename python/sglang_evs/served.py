"""What the plugin serves: one record per architecture, the one place its facts are written.

A record says what the architecture is upstream (its class, by its name in `sglang_compat`), which class of
this project answers it (`models/`), its videos' family (the upstream processor and video layout the pruning
mechanism reads), its speculative draft, and where the plugin leaves something off, why. The registry
(`models/registry.py`), the refusals (`pruning/refusals.py`) and the plugin read these records; nothing here
imports the rest of the package. A new family is its adapter (`models/`), its record here and its tiny builder
(`testing/`).

What every family shares, and so is not described: an item's grid is `video_grid_thw` (T groups of H x W
patches), its spans run from its first pad to its last (framing text between groups included), the vision
tower returns `T * H * W / merge**2` rows in (t, h, w) order, and the unpruned M-RoPE positions are the
upstream processor's own (Qwen's `get_rope_index`, GLM's `get_rope_index_glm4v`, each equal to the HF
model's `get_rope_index`), which pruning deletes rows from. Deepstack is the model adapter's to declare.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoFamily:
    """What the pruning mechanism (`pruning/regions.py`, `pruning/videos.py`) reads of a family's videos:

    - `processor`: the upstream SGLang processor the pruning one extends (`pruning/processor.py`);
    - `pad_token_field`: the config field naming the token each video row occupies once the processor has
      expanded the prompt (Qwen: `video_token_id`; GLM writes a video's rows as image tokens, `image_token_id`);
    - `fewest_frames`: the fewest frames a video may have (what the family's frame sampler can make one temporal
      group of; both families' towers encode groups of two frames, which the grid's T counts);
    - `image_pad_token_field`: the config field naming the token each image row occupies (`image_token_id` in
      every family served)."""

    name: str
    processor: str  # the upstream processor class, by its name in sglang_compat
    pad_token_field: str
    fewest_frames: int
    image_pad_token_field: str = "image_token_id"

    def pad_token_id(self, config) -> int:
        """The token id of a video row in an expanded prompt (`config`: the checkpoint's whole config)."""
        return int(getattr(config, self.pad_token_field))

    def image_pad_token_id(self, config) -> int:
        """The token id of an image row in an expanded prompt."""
        return int(getattr(config, self.image_pad_token_field))


# Qwen2-VL, Qwen2.5-VL, Qwen3-VL (+MoE), Qwen3.5 / 3.6, Qwen4-Exp, Qwen3-Omni's thinker: SGLang's one Qwen-VL
# processor.
QWEN_VL = VideoFamily("Qwen-VL", "UpstreamQwenVLProcessor", "video_token_id", fewest_frames=2)
# GLM-4.1V / GLM-4.5V: each group is an image-token run followed by its second; GLM's sampler pads an odd
# frame count by repeating the last frame, so one frame is a video.
GLM4V = VideoFamily("GLM-4.1V", "UpstreamGlm4vProcessor", "image_token_id", fewest_frames=1)


@dataclass(frozen=True)
class Draft:
    """A speculative draft the plugin answers SGLang's model lookup for (SGLang names its architecture itself)."""

    architecture: str
    ours: str  # "module:Class" under sglang_evs.models
    upstream: str  # the upstream class's name in sglang_compat


@dataclass(frozen=True)
class ServedModel:
    """An architecture this project serves: its forward calls this project's embedding routine, and the plugin
    prunes its videos (every other architecture is SGLang's own class calling SGLang's own routine,
    test/models/test_registry.py)."""

    architecture: str  # as config.json and SGLang's model registry name it; our class of that name answers it
    module: str  # the adapter module, under sglang_evs.models, that defines that class
    upstream: str  # the upstream class's name in sglang_compat
    family: VideoFamily
    # The NEXTN draft (SGLang builds it from the checkpoint's MTP layer) the plugin serves with this target's
    # positions; None: a NEXTN draft of it would not read them, and pruning with one is refused.
    mtp_draft: Draft | None = None
    # Why upstream's eager prefill stays (the plugin leaves it so); None: the architecture joins SGLang's
    # breakable prefill-graph allowlist (`plugin.py`).
    eager_prefill: str | None = None
    # Why pruning under encoder disaggregation is refused for it (`pruning/refusals.py`); None: it runs.
    unproven_encoder_path: str | None = None


QWEN3_5_MTP = Draft("Qwen3_5ForCausalLMMTP", "qwen3_5:Qwen3_5MTP", "UpstreamQwen3_5MTP")
QWEN4_EXP_MTP = Draft("Qwen4ExpForCausalLMMTP", "qwen4_exp:Qwen4ExpMTP", "UpstreamQwen4ExpMTP")
# SGLang 0.5.23's EAGLE3 draft: it reads M-RoPE positions where its config has them, so pruning needs nothing of it;
# the plugin answers it only where positions are traced, to record what it was handed (`models/eagle3.py`).
EAGLE3_DRAFT = Draft("LlamaForCausalLMEagle3", "eagle3:Eagle3Draft", "UpstreamLlamaEagle3")

# Measured on SGLang 0.5.23 without the plugin: the pair answers other greedy tokens than one server does,
# prompt tokens equal, at q = 0 (video and image prompts); pruning there could not be exact.
_INEXACT_ENCODER_PATH = "SGLang's encoder path serves it other tokens than one server even at q = 0"

SERVED: dict[str, ServedModel] = {
    model.architecture: model
    for model in (
        ServedModel("Qwen3VLForConditionalGeneration", "qwen3_vl", "UpstreamQwen3VL", QWEN_VL),
        ServedModel("Qwen3VLMoeForConditionalGeneration", "qwen3_vl", "UpstreamQwen3VLMoe", QWEN_VL),
        ServedModel(
            "Qwen3_5ForConditionalGeneration",
            "qwen3_5",
            "UpstreamQwen3_5",
            QWEN_VL,
            mtp_draft=QWEN3_5_MTP,
        ),
        ServedModel(
            "Qwen3_5MoeForConditionalGeneration",
            "qwen3_5",
            "UpstreamQwen3_5Moe",
            QWEN_VL,
            mtp_draft=QWEN3_5_MTP,
        ),
        ServedModel(
            "Qwen2_5_VLForConditionalGeneration",
            "qwen2_vl",
            "UpstreamQwen2_5_VL",
            QWEN_VL,
            unproven_encoder_path=_INEXACT_ENCODER_PATH,
        ),
        ServedModel(
            "Qwen2VLForConditionalGeneration",
            "qwen2_vl",
            "UpstreamQwen2VL",
            QWEN_VL,
            unproven_encoder_path=_INEXACT_ENCODER_PATH,
        ),
        # Qwen3-Omni: served through a wrapper whose thinker (a Qwen3-VL-MoE with an audio tower) prunes; audio never
        ServedModel(
            "Qwen3OmniMoeForConditionalGeneration",
            "qwen3_omni",
            "UpstreamQwen3Omni",
            QWEN_VL,
            unproven_encoder_path="never run with pruning: its thinker's config carries no encoder role",
        ),
        ServedModel(
            "Qwen4ExpForConditionalGeneration",
            "qwen4_exp",
            "UpstreamQwen4Exp",
            QWEN_VL,
            mtp_draft=QWEN4_EXP_MTP,
        ),
        # GLM-4.1V / GLM-4.5V: their own processor and video layout
        ServedModel("Glm4vForConditionalGeneration", "glm4v", "UpstreamGlm4v", GLM4V),
        ServedModel("Glm4vMoeForConditionalGeneration", "glm4v", "UpstreamGlm4vMoe", GLM4V),
    )
}

# The MTP drafts of the served targets, by their own architecture name (derived: each is written on its target).
MTP_DRAFTS: dict[str, Draft] = {
    model.mtp_draft.architecture: model.mtp_draft for model in SERVED.values() if model.mtp_draft is not None
}


def mtp_draft_of(architecture: str | None) -> Draft | None:
    """The NEXTN draft the plugin serves with `architecture`'s positions; None where there is none."""
    model = SERVED.get(architecture)
    return None if model is None else model.mtp_draft


def serves(config) -> bool:
    """Whether the plugin serves the model `config` describes: its first architecture is one of `SERVED`.
    `config`: a model's HF config (SGLang's `model_config.hf_config`), or a config.json read as a dict. The one
    test a hook makes where it could be reached for another model: for any other it leaves SGLang's call as it was."""
    architectures = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return bool(architectures) and architectures[0] in SERVED
