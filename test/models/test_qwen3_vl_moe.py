"""Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`) served with pruning, from its tiny checkpoint.

The README names it as supported; this serves it: EVS and VidCom2 prompt lengths follow the methods'
counts, images are untouched, and 33-token chunks (which cut every group of the video) with a radix
repeat, on a server in graph mode (its MoE layers replay too), give the tokens and logprobs of one
unchunked eager prefill.
"""

from pathlib import Path

import pytest

from sglang_evs.methods import METHODS
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_chunks_equal, served_in_chunks
from sglang_evs.testing.media import GROUPS, TOKENS_PER_GROUP
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    flush_cache,
    generate,
    media_kwargs,
    per_request_rate,
)
from sglang_evs.testing.server import PRUNING_DEFAULT_ARGS, running_server

pytestmark = pytest.mark.slow

ARGS = ["--dtype", "float32"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("moe_media") / "moving.mp4"
    return media.write_clip(out, "moving", num_frames=16, fps=4, seed=3)  # 4 groups of 100 tokens


def video(base_url: str, clip: Path, rate: float, method: str = "evs"):
    return generate(base_url, chat_prompt(VIDEO), **media_kwargs(videos=[clip]), **per_request_rate(rate, method))[0]


@pytest.fixture(scope="module")
def served(tiny_qwen3_vl_moe_dir, clip, media_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("moe") / "server.log"
    with running_server(tiny_qwen3_vl_moe_dir, log, ARGS) as server:
        out = {(method, q): video(server.base_url, clip, q, method) for method in METHODS for q in (0.0, 0.5, 0.75)}
        prompt, kwargs = chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])
        for q in (0.0, 0.75):  # each from an empty cache: the same prefill, bit for bit
            flush_cache(server.base_url)
            out["image", q] = generate(server.base_url, prompt, **kwargs, **per_request_rate(q))[0]
        flush_cache(server.base_url)
        out["one chunk"] = video(server.base_url, clip, 0.75)  # the prompt fits SGLang's default chunk
    return out


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("q", [0.5, 0.75])
def test_prompt_tokens_drop_by_the_methods_pruned_count(served, method, q):
    kept = METHODS[method].retained_token_count(TOKENS_PER_GROUP, GROUPS, q)
    assert kept < GROUPS * TOKENS_PER_GROUP
    unpruned, pruned = served[method, 0.0], served[method, q]
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - kept)
    assert pruned.meta["video_tokens_after_pruning"] == kept


def test_images_are_never_pruned(served):
    assert served["image", 0.75] == served["image", 0.0]


def test_chunked_prefill_and_radix_hits_equal_one_prefill(served, tiny_qwen3_vl_moe_dir, clip, tmp_path):
    cases = [(chat_prompt(VIDEO), {**media_kwargs(videos=[clip]), **per_request_rate(0.75)})]
    args = [*ARGS, *PRUNING_DEFAULT_ARGS]  # the graph-mode server's prefill graphs on (its case names its rate)
    results = served_in_chunks(tiny_qwen3_vl_moe_dir, cases, (33,), args, tmp_path, graph_chunk=33)
    assert_chunks_equal(results, [served["one chunk"]], "Qwen3-VL-MoE")
