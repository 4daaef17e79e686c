"""GPU only: SGLang's prefill CUDA graphs wrap our Qwen3-VL language model; outputs equal eager.

Run on a CUDA machine (the CPU route must not be set there):
    pytest -m gpu test/models/test_prefill_cuda_graph_gpu.py

Each prefill backend (breakable, full) serves the same requests as eager (`disabled`):
image, video, image+video, at q = 0 and q = .75, with chunked prefill cutting the media.
The plugin's trace records every prefill graph replay from SGLang's graph runner itself,
so the test knows the measured prefills replayed a graph. A model built without deepstack
levels answers differently, so deepstack is visible in what is compared.
"""

import pytest
import torch

from sglang_evs import trace
from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, generate, media_kwargs
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


def cases(media) -> list[tuple[str, dict]]:
    out = []
    for rate in (0.0, 0.75):
        evs = {"mm_processor_kwargs": {"video_pruning_rate": rate}}
        out += [
            (chat_prompt(IMAGE), {**media_kwargs(images=[media / "image.png"]), **evs}),
            (chat_prompt(VIDEO), {**media_kwargs(videos=[media / "moving.mp4"]), **evs}),
            (chat_prompt(IMAGE, VIDEO),
             {**media_kwargs(images=[media / "image2.png"], videos=[media / "noise.mp4"]), **evs}),
        ]  # fmt: skip
    return out


def serve(model_dir, media, log_path, args, trace_path=None):
    env = {"SGLANG_EVS_TRACE": str(trace_path)} if trace_path else None
    with running_server(model_dir, log_path, args, env=env, cpu=False) as server:
        return [generate(server.base_url, prompt, **kwargs)[0] for prompt, kwargs in cases(media)]


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

    replays = trace.read(trace_path, "prefill_graph_replay")
    media_prefills = [e for e in trace.read(trace_path, "deepstack") if e["media_rows"] > 0]
    assert len(replays) >= len(media_prefills) > 0, "measured prefills did not replay a graph"
    (allocated,) = trace.read(trace_path, "graph_inputs_allocated")
    assert {e["data_ptr"] for e in media_prefills} == {allocated["deepstack_ptr"]}

    for mine, reference in zip(graph, eager, strict=True):
        assert mine.output_ids == reference.output_ids
        assert max(abs(a - b) for a, b in zip(mine.logprobs, reference.logprobs, strict=True)) < 1e-3
    assert any(a.output_ids != b.output_ids for a, b in zip(eager, no_deepstack, strict=True))
