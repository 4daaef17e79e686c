"""GPU only: SGLang's prefill CUDA graphs wrap our Qwen3-VL language model; outputs equal eager.

Run on a CUDA machine (the CPU route must not be set there), or `bash scripts/gpu_graph_check.sh`:
    pytest -m gpu test/models/test_prefill_cuda_graph_gpu.py

Each prefill backend (breakable, full) serves the same requests as eager (`disabled`):
image, video, image+video, at q = 0 and q = .75 (each rate's prompts new to the radix cache, so every
one prefills its media), with chunked prefill cutting the media, then the three as one concurrent
batch (several requests, media and text, in one prefill). The plugin's trace records every prefill
graph replay from SGLang's graph runner itself, in order with the `post_process` of each forward: every
forward that carried media rows must be followed by a replay before the next forward. A model built
without deepstack levels answers differently, so deepstack is visible in what is compared.
"""

import json

import pytest
import torch

from sglang_evs import trace
from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, generate, logprob_gap, media_kwargs
from sglang_evs.testing.server import running_server

BACKENDS = ("breakable", "full")
NO_DEEPSTACK = '{"vision_config": {"deepstack_visual_indexes": []}}'


def gpu_server_args(prefill_backend: str, chunk: int = 64) -> list[str]:
    """The GPU server's arguments: float32, chunks that cut the media, prefill graph buckets that
    cover every chunk (so chunked prefills replay rather than fall back to eager)."""
    return [
        "--device", "cuda", "--attention-backend", "flashinfer", "--dtype", "float32",
        "--chunked-prefill-size", str(chunk), "--cuda-graph-backend-prefill", prefill_backend,
        "--cuda-graph-bs-prefill", "16", "32", "64", "128", "256",
        "--max-total-tokens", "16384", "--mem-fraction-static", "0.5",
    ]  # fmt: skip


def rate_prompt(rate: float, *media: str) -> str:
    """The tiny model's chat prompt, with text naming the rate before the media: new to the radix cache
    for each rate, so each rate's media are prefilled (and replayed) rather than found in the cache."""
    return chat_prompt(*media).replace("user\n", f"user\nAt rate {rate}: ", 1)


def cases(media) -> list[tuple[str, dict]]:
    out = []
    for rate in (0.0, 0.75):
        evs = {"mm_processor_kwargs": {"video_pruning_rate": rate}}
        out += [
            (rate_prompt(rate, IMAGE), {**media_kwargs(images=[media / "image.png"]), **evs}),
            (rate_prompt(rate, VIDEO), {**media_kwargs(videos=[media / "moving.mp4"]), **evs}),
            (rate_prompt(rate, IMAGE, VIDEO),
             {**media_kwargs(images=[media / "image2.png"], videos=[media / "noise.mp4"]), **evs}),
        ]  # fmt: skip
    return out


def concurrent_batch(media) -> tuple[list[str], dict]:
    prompts = [rate_prompt(0.5, IMAGE), rate_prompt(0.5), rate_prompt(0.5, VIDEO)]
    return prompts, {
        "image_data": [[str(media / "image2.png")], [], []],
        "video_data": [[], [], [str(media / "static.mp4")]],
        "mm_processor_kwargs": {"video_pruning_rate": 0.5},
    }


def serve(model_dir, media, log_path, args, trace_path=None):
    env = {"SGLANG_EVS_TRACE": str(trace_path)} if trace_path else None
    with running_server(model_dir, log_path, args, env=env, cpu=False) as server:
        alone = [generate(server.base_url, prompt, **kwargs)[0] for prompt, kwargs in cases(media)]
        prompts, kwargs = concurrent_batch(media)
        return alone + generate(server.base_url, prompts, **kwargs)


def media_forwards_without_replay(trace_path) -> tuple[int, int]:
    """(forwards that carried media rows, those of them not followed by a prefill graph replay before the
    scheduler's next forward), from the trace in the order it was written."""
    with open(trace_path) as lines:
        events = [json.loads(line) for line in lines]
    carried, unreplayed, pending = 0, 0, {}
    for event in events:
        pid = event["pid"]
        if event["event"] == "deepstack":
            unreplayed += pending.pop(pid, 0)
            if event["media_rows"] > 0:
                carried += 1
                pending[pid] = 1
        elif event["event"] == "graph_replay" and event["phase"] == "prefill":
            pending.pop(pid, None)
    return carried, unreplayed + sum(pending.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: prefill CUDA graphs capture on CUDA only")
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_graph_matches_eager_and_replayed(backend, tiny_model_dir, media_dir, tmp_path):
    trace_path = tmp_path / "trace.jsonl"
    graph = serve(tiny_model_dir, media_dir, tmp_path / "graph.log", gpu_server_args(backend), trace_path)
    eager = serve(tiny_model_dir, media_dir, tmp_path / "eager.log", gpu_server_args("disabled"))
    no_deepstack = serve(
        tiny_model_dir, media_dir, tmp_path / "flat.log",
        [*gpu_server_args("disabled"), "--json-model-override-args", NO_DEEPSTACK],
    )  # fmt: skip

    carried, unreplayed = media_forwards_without_replay(trace_path)
    assert carried > 0 and unreplayed == 0, f"{unreplayed} of {carried} forwards with media replayed no graph"
    (allocated,) = trace.read(trace_path, "graph_inputs_allocated")
    media_prefills = [e for e in trace.read(trace_path, "deepstack") if e["media_rows"] > 0]
    assert {e["data_ptr"] for e in media_prefills} == {allocated["deepstack_ptr"]}

    for mine, reference in zip(graph, eager, strict=True):
        assert mine.output_ids == reference.output_ids
        assert logprob_gap(mine, reference) < 1e-3
    assert any(a.output_ids != b.output_ids for a, b in zip(eager, no_deepstack, strict=True))


def gpu_default_args(*extra: str) -> list[str]:
    """A GPU server as a user starts one: SGLang's own graph defaults (decode graphs, and prefill graphs
    where the plugin turns them on), float32 for a tight comparison."""
    return ["--device", "cuda", "--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", "16384",
            "--mem-fraction-static", "0.3", *extra]  # fmt: skip


GPU_TOLERANCE = 1e-3  # float32 on a GPU: other kernels for a padded (replayed) batch than for an eager one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the check is of a GPU's defaults")
def test_gpu_defaults_q0_match_upstream_and_pruned_match_eager(tiny_model_dir, media_dir, tmp_path):
    """With the GPU's defaults, the plugin's server at q = 0 gives upstream's tokens (logprobs within
    GPU_TOLERANCE: upstream keeps Qwen3-VL's prefill eager), and its pruned replies those of the same
    server with every graph off; the trace shows media prefills and decodes replayed."""
    trace_path = tmp_path / "trace.jsonl"
    ours = serve(tiny_model_dir, media_dir, tmp_path / "defaults.log", gpu_default_args(), trace_path)
    env = {"SGLANG_PLUGINS": "none"}
    with running_server(tiny_model_dir, tmp_path / "upstream.log", gpu_default_args(), env=env, cpu=False) as server:
        upstream = [generate(server.base_url, prompt, **kwargs)[0] for prompt, kwargs in cases(media_dir)[:3]]
    eager = serve(tiny_model_dir, media_dir, tmp_path / "eager.log", gpu_default_args("--disable-cuda-graph"))
    for mine, theirs in zip(ours[:3], upstream, strict=True):  # the q = 0 cases
        assert mine.output_ids == theirs.output_ids and logprob_gap(mine, theirs) < GPU_TOLERANCE
    for mine, reference in zip(ours, eager, strict=True):
        assert mine.output_ids == reference.output_ids and logprob_gap(mine, reference) < GPU_TOLERANCE
    replays = trace.read(trace_path, "graph_replay")
    assert any(r["phase"] == "prefill" and r["media"] for r in replays)
    assert any(r["phase"] == "decode" for r in replays)


def test_replay_check_ties_each_media_forward_to_a_replay(tmp_path):
    """CPU: the trace check above, on written traces (two scheduler processes interleaved)."""

    def write(*events):
        path = tmp_path / "trace.jsonl"
        path.write_text("".join(json.dumps({"event": e, "pid": pid, "media_rows": rows, "phase": "prefill"}) + "\n"
                                for e, pid, rows in events))  # fmt: skip
        return path

    replayed = write(("deepstack", 1, 8), ("deepstack", 2, 8), ("graph_replay", 2, 0),
                     ("graph_replay", 1, 0), ("deepstack", 1, 0), ("deepstack", 1, 4),
                     ("graph_replay", 1, 0))  # fmt: skip
    assert media_forwards_without_replay(replayed) == (3, 0)
    eager_one = write(("deepstack", 1, 8), ("deepstack", 1, 8), ("graph_replay", 1, 0))
    assert media_forwards_without_replay(eager_one) == (2, 1)
    eager_last = write(("deepstack", 1, 8), ("graph_replay", 1, 0), ("deepstack", 1, 8))
    assert media_forwards_without_replay(eager_last) == (2, 1)
