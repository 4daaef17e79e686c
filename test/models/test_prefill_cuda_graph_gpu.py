"""GPU only: SGLang's breakable prefill CUDA graph wraps our Qwen3-VL language model, logits equal eager.

Upstream Qwen3-VL is not on SGLang's list of multimodal archs allowed a
breakable prefill graph (forcing it would drop deepstack, an argument graph
replay ignores); the plugin adds ours, whose language model takes only
`input_embeds`. Run on a CUDA machine:
    pytest -m gpu test/models/test_prefill_cuda_graph_gpu.py
"""

import pytest
import torch

from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, generate, media_kwargs
from sglang_evs.testing.server import running_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (prefill CUDA graphs)"),
]

GPU_ARGS = ["--device", "cuda", "--attention-backend", "flashinfer", "--dtype", "float32"]


def test_breakable_prefill_graph_matches_eager(tiny_model_dir, media_dir, tmp_path):
    cases = [
        (chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[media_dir / "image2.png"], videos=[media_dir / "moving.mp4"])),
        (chat_prompt(text="Count the objects."), {}),
    ]
    results = {}
    for backend in ("breakable", "disabled"):
        args = [*GPU_ARGS, "--cuda-graph-backend-prefill", backend]
        with running_server(tiny_model_dir, tmp_path / f"{backend}.log", args, cpu=False) as server:
            results[backend] = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
            log = server.log()
        if backend == "breakable":
            assert "breakable" in log.lower()
    for graph, eager in zip(results["breakable"], results["disabled"], strict=True):
        assert graph.output_ids == eager.output_ids
        assert max(abs(a - b) for a, b in zip(graph.logprobs, eager.logprobs, strict=True)) < 1e-4
