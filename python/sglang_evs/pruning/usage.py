"""What pruning saved, per request (client-visible meta info) and per server (Prometheus counters
labelled by method).

The processor runs in the tokenizer-manager process, which also builds each
response's meta info, so a request's counts are handed over in this process. A threshold's kept
count is decided in the scheduler (`admission.py`): it is read off the first output's prompt length,
the unpruned prompt's less the pads the scheduler deleted.
"""

from collections import OrderedDict

from sglang_evs.methods import (
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    TOKEN_BUDGET_SETTING,
)
from sglang_evs.methods.images import IMAGE_PRUNING_METHOD_SETTING, IMAGE_PRUNING_RATE_SETTING
from sglang_evs.pruning.settings import ImagePruning, Pruning

_by_request: OrderedDict[str, dict] = OrderedDict()
_MAX_PENDING = 4096
_counters = None


def usage_fields(pruning: Pruning, before: int, after: int) -> dict:
    """The meta-info fields of one request: the settings as applied (a budget and a floor where there is
    one), and the token counts."""
    limits = {TOKEN_BUDGET_SETTING: pruning.token_budget, MIN_TOKENS_PER_GROUP_SETTING: pruning.min_tokens_per_group}
    threshold, rate = {PRUNING_THRESHOLD_SETTING: pruning.threshold}, {PRUNING_RATE_SETTING: pruning.rate}
    decider = threshold if pruning.follows_content else rate
    return {
        PRUNING_METHOD_SETTING: pruning.method.name,
        **decider,
        **{setting: value for setting, value in limits.items() if value},
        "video_tokens_before_pruning": before,
        "video_tokens_after_pruning": after,
    }


def record_usage(rid, pruning: Pruning, videos) -> None:
    before, after = sum(v.before for v in videos), sum(v.after for v in videos)
    _count(pruning.method.name, before, after, len(videos))
    for one_rid in _each(rid):
        _hand_over(one_rid, usage_fields(pruning, before, after))


def record_image_usage(rid, pruning: ImagePruning, images) -> None:
    """A request's pruned images (TokenCounts each): `image_pruning_method`, `image_pruning_rate`,
    `image_tokens_before_pruning` and `..._after_pruning` beside its video fields, and the image counters."""
    before, after = sum(i.before for i in images), sum(i.after for i in images)
    _count_images(pruning.method.name, before, after, len(images))
    fields = {
        IMAGE_PRUNING_METHOD_SETTING: pruning.method.name,
        IMAGE_PRUNING_RATE_SETTING: pruning.rate,
        "image_tokens_before_pruning": before,
        "image_tokens_after_pruning": after,
    }
    for one_rid in _each(rid):
        _hand_over(one_rid, fields)


def _each(rid) -> list:
    """A request's rids: none, its one, or each of a batch's (whose prompts share one processor call)."""
    return [] if rid is None else rid if isinstance(rid, list) else [rid]


def _hand_over(rid: str, fields: dict) -> None:
    """A request's fields, for its outputs (`add_usage_to_meta_info`), beside those handed over before (its
    videos', its images'); the oldest go past `_MAX_PENDING`."""
    _by_request[rid] = {**_by_request.pop(rid, {}), **fields}
    while len(_by_request) > _MAX_PENDING:
        _by_request.popitem(last=False)


# A threshold request's pending count, kept beside its fields until its first output settles it: not meta info.
UNPRUNED_PROMPT, VIDEOS = "_unpruned_prompt_tokens", "_videos"


def record_threshold_usage(rid, pruning: Pruning, tokens: list[int], unpruned_prompt_tokens: int) -> None:
    """A threshold request's videos of `tokens` each, in a prompt of `unpruned_prompt_tokens` before the
    scheduler lays it out: counted once its first output tells the served prompt's length."""
    if rid is None or isinstance(rid, list):  # a batch of prompts shares one processor call: not counted apart
        return
    pending = {UNPRUNED_PROMPT: unpruned_prompt_tokens, VIDEOS: len(tokens)}
    _hand_over(rid, {**usage_fields(pruning, sum(tokens), None), **pending})


def _settle_threshold_count(fields: dict, meta_info: dict) -> None:
    """`fields` of a threshold request, given its first output's `meta_info`: the kept count, counted."""
    if UNPRUNED_PROMPT not in fields or "prompt_tokens" not in meta_info:
        return
    deleted = fields.pop(UNPRUNED_PROMPT) - int(meta_info["prompt_tokens"])
    fields["video_tokens_after_pruning"] = fields["video_tokens_before_pruning"] - deleted
    _count(fields[PRUNING_METHOD_SETTING], fields["video_tokens_before_pruning"],
           fields["video_tokens_after_pruning"], fields.pop(VIDEOS))  # fmt: skip


class _OutputsWithUsage(list):
    """A request state's `out_list` that adds the request's pruning counts to every output appended."""

    def __init__(self, outputs: list, fields: dict) -> None:
        super().__init__(outputs)
        self.fields = fields

    def append(self, output) -> None:
        if isinstance(output, dict) and isinstance(output.get("meta_info"), dict):
            _settle_threshold_count(self.fields, output["meta_info"])
            output["meta_info"].update({key: value for key, value in self.fields.items() if not key.startswith("_")})
        super().append(output)


async def add_usage_to_meta_info(upstream, manager, recv_obj, *args, **kwargs):
    """AROUND hook on TokenizerManager._handle_batch_output: every output a pruned request gets
    carries its counts in its meta info (usage reaches OpenAI clients from there).

    The counts go in as upstream appends each output, not after the call: upstream wakes consumers
    (and yields to them) part-way through a large batch of outputs.
    """
    states = {rid: manager.rid_to_state.get(rid) for rid in recv_obj.rids if rid in _by_request}
    for rid, state in states.items():
        if state is not None:
            state.out_list = _OutputsWithUsage(state.out_list, _by_request[rid])
    result = await upstream(manager, recv_obj, *args, **kwargs)
    for rid, state in states.items():
        if state is None or state.finished:
            _by_request.pop(rid, None)
    return result


def _count(method: str, before: int, after: int, videos: int) -> None:
    _inc(_prometheus_counters()[:3], method, before, after, videos)


def _count_images(method: str, before: int, after: int, images: int) -> None:
    _inc(_prometheus_counters()[3:], method, before, after, images)


def _inc(counters: tuple, method: str, before: int, after: int, media: int) -> None:
    for counter, amount in zip(counters, (before, after, media), strict=True):
        counter.labels(method=method).inc(amount)


def _prometheus_counters() -> tuple:
    """Video tokens before and after, videos pruned; image tokens before and after, images pruned (by method)."""
    global _counters
    if _counters is None:
        from prometheus_client import Counter

        _counters = tuple(
            Counter(f"sglang_evs_{name}", text, ["method"])
            for name, text in (
                ("video_tokens_before_pruning", "Video tokens before pruning"),
                ("video_tokens_after_pruning", "Video tokens after pruning"),
                ("pruned_videos", "Videos pruned"),
                ("image_tokens_before_pruning", "Image tokens before pruning"),
                ("image_tokens_after_pruning", "Image tokens after pruning"),
                ("pruned_images", "Images pruned"),
            )
        )
    return _counters
