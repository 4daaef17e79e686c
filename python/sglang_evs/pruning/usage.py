"""What EVS saved, per request (client-visible meta info) and per server (Prometheus counters).

The processor runs in the tokenizer-manager process, which also builds each
response's meta info, so a request's counts are handed over in this process.
"""

from collections import OrderedDict

_by_request: OrderedDict[str, dict] = OrderedDict()
_MAX_PENDING = 4096
_counters = None


def record_usage(rid, pruning_rate: float, videos) -> None:
    before, after = sum(v.before for v in videos), sum(v.after for v in videos)
    _count(before, after, len(videos))
    if rid is None:
        return
    for one_rid in rid if isinstance(rid, list) else [rid]:
        _by_request[one_rid] = {
            "video_pruning_rate": pruning_rate,
            "video_tokens_before_pruning": before,
            "video_tokens_after_pruning": after,
        }
        while len(_by_request) > _MAX_PENDING:
            _by_request.popitem(last=False)


async def add_usage_to_meta_info(upstream, manager, recv_obj, *args, **kwargs):
    """AROUND hook on TokenizerManager._handle_batch_output: put each pruned request's counts into
    the meta info of the output it just produced (usage reaches OpenAI clients from there)."""
    states = {rid: manager.rid_to_state.get(rid) for rid in recv_obj.rids if rid in _by_request}
    result = await upstream(manager, recv_obj, *args, **kwargs)
    for rid, state in states.items():
        if state is not None and state.out_list:
            state.out_list[-1]["meta_info"].update(_by_request[rid])
        if state is None or state.finished:
            _by_request.pop(rid, None)
    return result


def _count(before: int, after: int, videos: int) -> None:
    global _counters
    if _counters is None:
        from prometheus_client import Counter

        _counters = (
            Counter("sglang_evs_video_tokens_before_pruning", "Video tokens before EVS pruning"),
            Counter("sglang_evs_video_tokens_after_pruning", "Video tokens after EVS pruning"),
            Counter("sglang_evs_pruned_videos", "Videos pruned by EVS"),
        )
    _counters[0].inc(before)
    _counters[1].inc(after)
    _counters[2].inc(videos)
