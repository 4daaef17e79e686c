"""Pruning counts reach the meta info of every output, even when consumers read part-way through a batch."""

import asyncio
from types import SimpleNamespace

from sglang_evs.methods import EVS, VIDCOM2
from sglang_evs.pruning import usage
from sglang_evs.pruning.fields import TokenCounts
from sglang_evs.pruning.settings import Pruning


def test_usage_fields_name_the_two_settings_as_applied():
    assert usage.usage_fields(Pruning(VIDCOM2, 0.75), 400, 100) == {
        "video_pruning_method": "vidcom2",
        "video_pruning_rate": 0.75,
        "video_tokens_before_pruning": 400,
        "video_tokens_after_pruning": 100,
    }


def test_usage_fields_name_a_budget_and_a_floor_where_there_is_one():
    fields = usage.usage_fields(Pruning(EVS, 0.0, token_budget=64, min_tokens_per_group=4), 400, 64)
    assert fields == {
        "video_pruning_method": "evs",
        "video_pruning_rate": 0.0,
        "video_token_budget": 64,
        "video_pruning_min_tokens_per_group": 4,
        "video_tokens_before_pruning": 400,
        "video_tokens_after_pruning": 64,
    }


def test_every_output_carries_the_counts_even_when_consumers_read_mid_batch():
    """Like SGLang's handler: append an output per request, wake its consumer and yield after each."""
    rids = ["a", "b", "c"]
    usage.record_usage(["a", "c"], Pruning(EVS, 0.5), [TokenCounts(400, 200)])
    states = {rid: SimpleNamespace(out_list=[], finished=rid != "c", event=asyncio.Event()) for rid in rids}
    manager = SimpleNamespace(rid_to_state=dict(states))
    seen: dict[str, dict] = {}

    async def consumer(rid):
        await states[rid].event.wait()
        seen[rid] = dict(states[rid].out_list[-1]["meta_info"])  # read at once, as a streaming client would
        states[rid].out_list = []

    async def upstream(manager_, recv_obj):
        for rid in recv_obj.rids:
            manager_.rid_to_state[rid].out_list.append({"text": "x", "meta_info": {"id": rid}})
            manager_.rid_to_state[rid].event.set()
            await asyncio.sleep(0)

    async def main():
        readers = [asyncio.create_task(consumer(rid)) for rid in rids]
        await asyncio.sleep(0)
        await usage.add_usage_to_meta_info(upstream, manager, SimpleNamespace(rids=rids))
        await asyncio.gather(*readers)

    asyncio.run(main())
    assert seen["a"]["video_tokens_after_pruning"] == seen["c"]["video_tokens_after_pruning"] == 200
    assert seen["b"] == {"id": "b"}  # not pruned: untouched
    assert "a" not in usage._by_request and "c" in usage._by_request  # kept until the request finishes


def test_a_thresholds_kept_count_is_read_off_the_served_prompt_once():
    """The scheduler decides a threshold's count: the first output's prompt length (the unpruned prompt's less
    the pads deleted) gives it, every later output carries the same, and the counters count it once."""
    usage.record_threshold_usage("t", Pruning(EVS, 0.0, min_tokens_per_group=4, threshold=0.3), [400, 200], 700)
    first = {"prompt_tokens": 460}
    usage._settle_threshold_count(usage._by_request["t"], first)
    fields = usage._by_request["t"]
    assert fields == {"video_pruning_method": "evs", "video_pruning_threshold": 0.3,
                      "video_pruning_min_tokens_per_group": 4, "video_tokens_before_pruning": 600,
                      "video_tokens_after_pruning": 360}  # fmt: skip
    usage._settle_threshold_count(fields, {"prompt_tokens": 999})  # settled: a later output changes nothing
    assert fields["video_tokens_after_pruning"] == 360
    usage._by_request.pop("t")
