"""Tokenizer side: a family's upstream SGLang processor, then pruned video regions.

`pruning_processor(family)` is the class the plugin registers for the upstream architectures of
`served.SERVED` in place of their upstream processor (`served.VideoFamily.processor`: SGLang's
`QwenVLImageProcessor` for every Qwen VLM, `Glm4vImageProcessor` for GLM-4.1V / GLM-4.5V): the upstream
class with `PruningProcessor` before it. With no pruning it returns exactly what the upstream one does.
The method, rate, token budget and floor are the server's (`settings.server_pruning`), overridable per
request (`settings.request_pruning`).
"""

import functools
import logging
import time

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.pruning.encoder_records import RECORDS, lay_out_pruned
from sglang_evs.pruning.refusals import (
    conflicting_setup,
    content_unreached_setup,
    encoder_role,
    rate_only_setup,
    refuse_prompt_logprobs_over_pruned_videos,
    refuse_request_features_with_threshold,
    refuse_unsupported,
    refuse_unsupported_images,
)
from sglang_evs.pruning.regions import (
    mark_threshold_videos,
    prune_image_regions,
    prune_video_regions,
    split_bundled_videos,
)
from sglang_evs.pruning.settings import (
    request_image_pruning,
    request_pruning,
    server_image_pruning,
    server_pruning,
)
from sglang_evs.pruning.stream_sessions import SESSION_STREAMS, session_turn
from sglang_evs.pruning.streams import (
    STREAM_TURN,
    STREAMED_MODEL_TYPES,
    StreamTurn,
    attach_contexts,
    continuing_timestamps,
    refuse_unstreamable,
    stream_end,
)
from sglang_evs.pruning.usage import record_image_usage, record_threshold_usage, record_usage
from sglang_evs.served import VideoFamily

logger = logging.getLogger(__name__)


def refuse_too_short_videos(videos: list, family: VideoFamily) -> None:
    """A clear error for a video the family's frame sampler cannot take."""
    for index, video in enumerate(videos or ()):
        frames = len(video) if hasattr(video, "__len__") and hasattr(video, "avg_fps") else None
        if frames is not None and frames < family.fewest_frames:
            raise ValueError(
                f"video {index} has {frames} frame(s); {family.name} models need at least {family.fewest_frames} "
                "(one temporal group): send it as an image instead"
            )


@functools.cache
def pruning_processor(family: VideoFamily) -> type:
    """The family's upstream processor with `PruningProcessor` first (one class per family)."""
    upstream = sglang.resolve(family.processor)
    namespace = {"family": family, "__module__": __name__}  # named where it is built, not after a metaclass
    return type(f"Pruning{upstream.__name__}", (PruningProcessor, upstream), namespace)


class PruningProcessor:
    """Mixin placed before a family's upstream processor (`pruning_processor`)."""

    family: VideoFamily
    # Not upstream's list: the plugin registers the class for the architectures served.py records
    # (`plugin.register_processors`), so the pruning side need not know the models.
    models: list = []

    def __init__(self, hf_config, server_args, _processor, *args, **kwargs) -> None:
        super().__init__(hf_config, server_args, _processor, *args, **kwargs)
        self.pruning = server_pruning(hf_config)
        self.image_pruning = server_image_pruning(hf_config)
        self.conflict = conflicting_setup(server_args, hf_config)
        self.rate_only = rate_only_setup(server_args)
        self.content_unreached = content_unreached_setup(server_args)
        self.encoder_role = encoder_role(server_args)
        self.tokenizer_workers = int(getattr(server_args, "tokenizer_worker_num", 1) or 1)
        refuse_unsupported(self.pruning, self.conflict, self.rate_only, self.content_unreached)
        refuse_unsupported_images(self.image_pruning, self.conflict, self.encoder_role)
        logging.getLogger("sglang_evs").info(
            "sglang-evs: %s processor with video pruning, default video_pruning_method=%s %s; image_pruning_method=%s "
            "image_pruning_rate=%s",
            hf_config.architectures[0] if getattr(hf_config, "architectures", None) else "VLM",
            self.pruning.method.name,
            self.pruning.named(),
            self.image_pruning.method.name,
            self.image_pruning.rate,
        )

    def get_mm_data(self, prompt, embeddings, **kwargs):
        """A `--language-only` server's layout of a request whose rows came from encoder servers: where
        they pruned a video (its record says so), the prompt is laid out unpruned over stand-in rows and
        the pruned pads deleted (`encoder_records.lay_out_pruned`)."""
        records = kwargs.pop(RECORDS, None)
        if not records or all(record["kept"] is None for record in records):
            return super().get_mm_data(prompt, embeddings, **kwargs)
        video = sglang.Modality.VIDEO
        rows = embeddings[video]
        stand_in = rows.new_zeros(1, rows.shape[1]).expand(sum(record["tokens"] for record in records), -1)
        output = super().get_mm_data(prompt, {**embeddings, video: stand_in}, **kwargs)
        return lay_out_pruned(output, records, rows, self.family.pad_token_id(self.hf_config))

    def _session_prompt_tokens(self, turn, input_ids: list[int]) -> int | None:
        """The unpruned prompt's length as the scheduler will see it: a session turn's after its history (its BOS
        stripped there, as SGLang strips it), or None where that history is not known here."""
        if turn is None:
            return len(input_ids)
        history = SESSION_STREAMS.history_tokens(turn)
        if history is None:
            return None
        bos = getattr(getattr(self._processor, "tokenizer", None), "bos_token_id", None)
        stripped = int(bool(history) and bos is not None and bool(input_ids) and input_ids[0] == bos)
        return history + len(input_ids) - stripped

    async def load_mm_data(self, *args, **kwargs):
        loaded = await super().load_mm_data(*args, **kwargs)
        refuse_too_short_videos(loaded.videos, self.family)
        return loaded

    async def process_and_combine_mm_data_async(self, base_output, mm_tokens, **kwargs):
        """Upstream's, with a stream's segments timed as one video's (`streams.continuing_timestamps`)."""
        turn = STREAM_TURN.get()
        if turn is not None and kwargs.get("video_metadata") is not None:
            kwargs["video_metadata"] = continuing_timestamps(kwargs["video_metadata"], turn)
        return await super().process_and_combine_mm_data_async(base_output, mm_tokens, **kwargs)

    async def process_mm_data_async(self, image_data, input_text, request_obj, *args, **kwargs):
        start = time.perf_counter()
        pruning = request_pruning(request_obj, self.pruning)
        refuse_unsupported(pruning, self.conflict, self.rate_only, self.content_unreached)
        image_pruning = request_image_pruning(request_obj, self.image_pruning)
        refuse_unsupported_images(image_pruning, self.conflict, self.encoder_role)
        on_device = bool(getattr(self, "keep_mm_features_on_device", False))
        if pruning.stream:
            refuse_unstreamable(self.hf_config.model_type, request_obj, on_device, self.tokenizer_workers)
        in_session = session_turn(request_obj)
        streamable = self.hf_config.model_type in STREAMED_MODEL_TYPES and not on_device
        session = in_session if streamable else None  # a session whose later turns may continue its stream
        turn = None
        if pruning.stream or session is not None:
            continued = SESSION_STREAMS.continued_end(session) if pruning.stream and session is not None else None
            turn = StreamTurn(continues=pruning.stream, start=continued)
        current = STREAM_TURN.set(turn)
        try:
            output = await super().process_mm_data_async(image_data, input_text, request_obj, *args, **kwargs)
        finally:
            STREAM_TURN.reset(current)
        merge = self.hf_config.vision_config.spatial_merge_size
        has_video = output is not None and any(item.is_video() for item in output.mm_items)
        segments = [item for item in output.mm_items if item.is_video()] if has_video else []
        if segments and pruning.stream and pruning.prunes:
            output.mm_items = split_bundled_videos(output.mm_items)  # a segment per item (Qwen2-VL's come bundled)
            segments = [item for item in output.mm_items if item.is_video()]
            attach_contexts(segments, turn.start)
        if has_video and pruning.follows_content:
            refuse_request_features_with_threshold(request_obj)
            tokens = mark_threshold_videos(output, pruning, merge)
            unpruned_prompt = self._session_prompt_tokens(in_session, output.input_ids)
            if unpruned_prompt is not None:
                record_threshold_usage(getattr(request_obj, "rid", None), pruning, tokens, unpruned_prompt)
        elif has_video and pruning.prunes:
            videos = prune_video_regions(output, pruning, merge, self.family.pad_token_id(self.hf_config))
            refuse_prompt_logprobs_over_pruned_videos(request_obj, output)
            record_usage(getattr(request_obj, "rid", None), pruning, videos)
            for video in videos:
                name = pruning.method.name
                logger.debug("%s q=%s: video tokens %d -> %d", name, pruning.rate, video.before, video.after)
        if image_pruning.prunes and output is not None and any(item.is_image() for item in output.mm_items):
            pad = self.family.image_pad_token_id(self.hf_config)
            images = prune_image_regions(output, image_pruning, merge, pad)
            record_image_usage(getattr(request_obj, "rid", None), image_pruning, images)
        if session is not None and segments:  # a later turn may continue its last video: recorded once it is accepted
            end = stream_end(split_bundled_videos(segments[-1:])[-1], turn.frames, turn.fps)  # the last video's end
            SESSION_STREAMS.record_turn(getattr(request_obj, "rid", None), session, end)
        if trace.enabled() and output is not None:
            items = [item.hash for item in output.mm_items]
            trace.record("processed", items=items, ms=(time.perf_counter() - start) * 1e3)
        return output
