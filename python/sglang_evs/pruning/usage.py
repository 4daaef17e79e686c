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
from sglang_evs.pruning.settings import Pruning

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
    if rid is None:
        return
    for one_rid in rid if isinstance(rid, list) else [rid]:
        _hand_over(one_rid, usage_fields(pruning, before, after))


def _hand_over(rid: str, fields: dict) -> None:
    """A request's fields, for its outputs (`add_usage_to_meta_info`); the oldest go past `_MAX_PENDING`."""
    _by_request[rid] = fields
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
    global _counters
    if _counters is None:
        from prometheus_client import Counter

        _counters = (
            Counter("sglang_evs_video_tokens_before_pruning", "Video tokens before pruning", ["method"]),
            Counter("sglang_evs_video_tokens_after_pruning", "Video tokens after pruning", ["method"]),
            Counter("sglang_evs_pruned_videos", "Videos pruned", ["method"]),
        )
    _counters[0].labels(method=method).inc(before)
    _counters[1].labels(method=method).inc(after)
    _counters[2].labels(method=method).inc(videos)
