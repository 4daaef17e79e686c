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


def pop_usage(rid: str) -> dict | None:
    return _by_request.pop(rid, None)


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
