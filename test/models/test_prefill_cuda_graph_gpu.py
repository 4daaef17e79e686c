"""GPU only: the tiny Qwen3-VL served as a GPU serves it, in bfloat16 on the GPU route (SGLang's Triton
attention backend, `sglang_evs.runtime.gpu_route.SERVER_ARGS`), with SGLang's graph defaults: decode CUDA graphs, and
breakable prefill graphs, which the plugin turns on for Qwen3-VL where the server's default prunes; the `graphs`
server names them by flag (`--cuda-graph-backend-prefill breakable`, `prefill_graph_gpu.PREFILL_GRAPHS_BY_FLAG`),
since its q = 0 requests are upstream's, without pruning fields, and so is its default.

Run on the CUDA machine without the CPU environment (`bash scripts/gpu_graph_check.sh` does):
    SGLANG_EVS_GPU_ROUTE=1 pytest -m gpu test/models/test_prefill_cuda_graph_gpu.py

Three servers, started together and shared by every test: the plugin with prefill graphs (`graphs`, traced),
upstream SGLang with the same flags (`upstream`, `SGLANG_PLUGINS=none`: it keeps Qwen3-VL's prefill eager),
both with SGLang's vision-tower CUDA graphs (`SGLANG_VIT_ENABLE_CUDA_GRAPH=1`), and the plugin with every graph
off (`eager`, traced). All three cut prompts into 64-token chunks, so media are
prefilled across chunks, and each (method, rate) has its own prompt text before the media, so its media are
prefilled rather than found in the radix cache.

- q = 0 (image, video, image + video): `graphs` against `upstream` (Q0_TOLERANCE);
- pruned (EVS and VidCom2 at q = .75; video, image + video; a three-request batch at q = .5) and q = 0:
  `graphs` against `eager` (PRUNED_TOLERANCE);
- the trace of `graphs`: every forward that carried media rows replayed a prefill graph before the next
  forward, with deepstack in the one buffer allocated before capture; decode steps replayed, none eager;
  a pruned video cut by a chunk boundary;
- a radix repeat: the same pruned request again on `graphs` reuses its cached prefix and answers as before;
- the keep-masks `graphs` decided on rows from the ViT graphs are `eager`'s, bit for bit; the tower's median time
  on each is printed;
- the ViT graphs replayed, not only their switch set: every video encode on `graphs` ran the tower through a
  replay of SGLang's `ViTCudaGraphRunner` (the trace's `vit_graph_replay` events, `graph_trace.py`), at least one
  a graph an earlier encode replayed, and `eager` (its tower without the switch) replayed none.

bfloat16 (FlashInfer's and FA3's prefill refuse float32): two roundings of one greedy request may break a
near-tie either way, so tokens are compared as `testing.compare.assert_same_generation(near_ties=True)` does: equal,
or parting at a step where each side's token is within the tolerance of the other's choice, after which
nothing is compared. A missing deepstack add or wrong positions move logprobs by units (4 and 10 on CPU,
docs/benchmarks.md), not by a tie's width. Each test prints the largest gap it measured.

The servers, requests and checks also run on CPU servers in graph mode (`launches(on_gpu=False)`, the slow
`test_prefill_cuda_graph_gpu_setup.py::test_gpu_checks_pass_on_cpu_servers_in_graph_mode`; measured there in
bfloat16: 0 against upstream, 4.8e-3 against eager, 25 of 25 media forwards and 63 decode steps replayed).
"""

from collections.abc import Iterator

import pytest
import torch

from sglang_evs import trace
from sglang_evs.testing.prefill_graph_gpu import (
    check_chunked_prefill_cut_a_pruned_video,
    check_every_media_prefill_and_decode_replayed,
    check_keep_masks_match_eager,
    check_pruned_and_unpruned_match_eager,
    check_q0_matches_upstream,
    check_radix_repeat_answers_as_before,
    cut_by_a_chunk,
    decode_steps,
    eager_trace,
    events_since,
    gap_until_parting,
    media_forwards_without_replay,
    serving_all,
)
from sglang_evs.testing.requests import Generation

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the checks are of CUDA graphs")


def gpu_only(test):
    """A test of the GPU run (`-m gpu`), skipped where there is no CUDA device."""
    return pytest.mark.gpu(needs_gpu(test))


@pytest.fixture(scope="module")
def served(tiny_model_dir, media_dir, tmp_path_factory) -> Iterator[dict]:
    with serving_all(tiny_model_dir, media_dir, tmp_path_factory.mktemp("gpu_graphs")) as replies:
        yield replies


@gpu_only
def test_q0_matches_upstream_with_the_same_flags(served):
    check_q0_matches_upstream(served)


@gpu_only
def test_pruned_and_unpruned_match_eager(served):
    check_pruned_and_unpruned_match_eager(served)


@gpu_only
def test_keep_masks_under_vit_graphs_match_eager(served):
    check_keep_masks_match_eager(served)


def encodes_without_vit_replay(events: list[dict]) -> tuple[int, int]:
    """(video encodes, those of them with no ViT graph replay in their process since its previous encode): the
    tower's replays are written as they end, each encode's `video_encoded` after its tower call."""
    encodes, unreplayed, replayed = 0, 0, {}
    for event in events:
        if event["event"] == "vit_graph_replay":
            replayed[event["pid"]] = True
        elif event["event"] == "video_encoded":
            encodes += 1
            unreplayed += not replayed.pop(event["pid"], False)
    return encodes, unreplayed


@gpu_only
def test_vit_graphs_replayed_for_every_video_encode(served):
    events = events_since(served["trace"], served["started"])
    encodes, unreplayed = encodes_without_vit_replay(events)
    replays = [e for e in events if e["event"] == "vit_graph_replay"]
    again = sum(e["again"] for e in replays)
    print(f"ViT graph replays: {len(replays)} ({again} of a graph replayed before), "
          f"{max((e['graphs'] for e in replays), default=0)} graphs captured; video encodes: {encodes}, "
          f"without a ViT graph replay: {unreplayed}")  # fmt: skip
    assert encodes > 0 and unreplayed == 0, f"{unreplayed} of {encodes} video encodes replayed no ViT graph"
    assert again > 0, "no ViT graph was replayed for a later encode than its first"
    assert not trace.read(eager_trace(served["trace"]), "vit_graph_replay")  # no switch, no ViT graphs


@gpu_only
def test_every_media_prefill_and_decode_replayed(served):
    check_every_media_prefill_and_decode_replayed(served)


@gpu_only
def test_chunked_prefill_cut_a_pruned_video(served):
    check_chunked_prefill_cut_a_pruned_video(served)


@gpu_only
def test_radix_repeat_answers_as_before(served):
    check_radix_repeat_answers_as_before(served)


def test_replay_check_ties_each_media_forward_to_a_replay():
    """CPU: the trace checks above, on written events (two scheduler processes interleaved)."""

    def events(*written):
        return [{"event": e, "pid": pid, "media_rows": rows, "phase": "prefill"} for e, pid, rows in written]

    replayed = events(("deepstack", 1, 8), ("deepstack", 2, 8), ("graph_replay", 2, 0),
                      ("graph_replay", 1, 0), ("deepstack", 1, 0), ("deepstack", 1, 4),
                      ("graph_replay", 1, 0))  # fmt: skip
    assert media_forwards_without_replay(replayed) == (3, 0)
    eager_one = events(("deepstack", 1, 8), ("deepstack", 1, 8), ("graph_replay", 1, 0))
    assert media_forwards_without_replay(eager_one) == (2, 1)
    eager_last = events(("deepstack", 1, 8), ("graph_replay", 1, 0), ("deepstack", 1, 8))
    assert media_forwards_without_replay(eager_last) == (2, 1)


def test_vit_replay_check_ties_each_video_encode_to_a_replay():
    """CPU: the ViT check above, on written events (two scheduler processes interleaved)."""

    def events(*written):
        return [{"event": e, "pid": pid} for e, pid in written]

    replayed = events(("vit_graph_replay", 1), ("vit_graph_replay", 2), ("video_encoded", 2), ("video_encoded", 1),
                      ("vit_graph_replay", 1), ("vit_graph_replay", 1), ("video_encoded", 1))  # fmt: skip
    assert encodes_without_vit_replay(replayed) == (3, 0)
    eager_second = events(("vit_graph_replay", 1), ("video_encoded", 1), ("video_encoded", 1))
    assert encodes_without_vit_replay(eager_second) == (2, 1)
    other_process = events(("vit_graph_replay", 2), ("video_encoded", 1))
    assert encodes_without_vit_replay(other_process) == (1, 1)


def test_decode_and_chunk_checks_on_written_events():
    decodes = [{"event": "graph_replay", "phase": "decode"}, {"event": "graph_replay", "phase": "prefill"},
               {"event": "language_model_inputs", "mode": "EXTEND"}]  # fmt: skip
    assert decode_steps(decodes) == (1, 0)
    assert decode_steps([*decodes, {"event": "language_model_inputs", "mode": "DECODE"}]) == (1, 1)
    split = [{"item": 7, "region": [70, 100]}, {"item": 7, "region": [100, 120]}, {"item": 8, "region": [5, 30]}]
    assert cut_by_a_chunk(split, 7) and not cut_by_a_chunk(split, 8)


def test_gap_until_parting_stops_at_the_first_different_token():
    def reply(ids, logprobs):
        return Generation(ids, logprobs, [], 10, 0, {})

    assert gap_until_parting(reply([1, 2, 3], [-1.0, -2.0, -3.0]), reply([1, 2, 3], [-1.1, -2.0, -3.5])) == (
        pytest.approx(0.5), None,
    )  # fmt: skip
    assert gap_until_parting(reply([1, 2, 3], [-1.0, -2.0, -3.0]), reply([1, 4, 3], [-1.2, -9.0, -3.0])) == (
        pytest.approx(0.2), 1,
    )  # fmt: skip
