"""Tokenizer side: SGLang's Qwen-VL processor, then pruned video regions, for every model the plugin answers.

Registered for the upstream architecture names of `models.registry.MODELS` in place of SGLang's
`QwenVLImageProcessor` (one class serves Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE
upstream); with no pruning it returns exactly what SGLang's does. The rate is the server's
`video_pruning_rate` (hf_config, set through `--json-model-override-args`), overridable per
request with `mm_processor_kwargs={"video_pruning_rate": q}`.
"""

import logging

from sglang_evs import sglang_compat as sglang
from sglang_evs.evs import PRUNING_RATE_SETTING, validate_pruning_rate
from sglang_evs.models.registry import upstream_classes
from sglang_evs.pruning.layout import prune_video_layout
from sglang_evs.pruning.usage import record_usage

logger = logging.getLogger(__name__)


def server_pruning_rate(hf_config) -> float:
    """The server-wide rate; raises ValueError naming `video_pruning_rate` if invalid."""
    return validate_pruning_rate(getattr(hf_config, PRUNING_RATE_SETTING, 0.0))


def request_pruning_rate(request_obj, default: float) -> float:
    kwargs = getattr(request_obj, "mm_processor_kwargs", None) or {}
    if PRUNING_RATE_SETTING not in kwargs:
        return default
    return validate_pruning_rate(kwargs[PRUNING_RATE_SETTING])


def refuse_unsupported(rate: float, speculative: bool) -> None:
    if rate > 0 and speculative:
        raise ValueError(
            f"{PRUNING_RATE_SETTING}={rate}: EVS is not supported with speculative decoding yet; "
            f"set {PRUNING_RATE_SETTING} to 0 or disable speculative decoding"
        )


class PruningProcessor(sglang.UpstreamQwenVLProcessor):
    models = upstream_classes()

    def __init__(self, hf_config, server_args, _processor, *args, **kwargs) -> None:
        super().__init__(hf_config, server_args, _processor, *args, **kwargs)
        self.pruning_rate = server_pruning_rate(hf_config)
        self.speculative = getattr(server_args, "speculative_algorithm", None) is not None
        refuse_unsupported(self.pruning_rate, self.speculative)
        logging.getLogger("sglang_evs").info(
            "sglang-evs: %s processor with EVS, %s=%s",
            hf_config.architectures[0] if getattr(hf_config, "architectures", None) else "VLM",
            PRUNING_RATE_SETTING,
            self.pruning_rate,
        )

    async def process_mm_data_async(self, image_data, input_text, request_obj, *args, **kwargs):
        rate = request_pruning_rate(request_obj, self.pruning_rate)
        refuse_unsupported(rate, self.speculative)
        output = await super().process_mm_data_async(image_data, input_text, request_obj, *args, **kwargs)
        if rate == 0.0 or output is None or not any(item.is_video() for item in output.mm_items):
            return output
        videos = prune_video_layout(output, rate, self.hf_config.vision_config.spatial_merge_size, self.VIDEO_TOKEN_ID)
        record_usage(getattr(request_obj, "rid", None), rate, videos)
        for video in videos:
            logger.debug("EVS q=%s: video tokens %d -> %d", rate, video.before, video.after)
        return output
