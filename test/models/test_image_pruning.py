"""Images pruned on the tiny Qwen3-VL (float32): counts and reports, the HF oracle in chunks and after a radix hit,
images beside videos, and bad settings.

One server in graph mode, 64-token prefill chunks (an 80-token image is cut by a chunk boundary) and no embedding
cache (every chunk over an image encodes it again and must keep the rows its first encode kept); its default
image rate is 0.5, requests set their own in `mm_processor_kwargs`. The HF oracle also runs on an eager twin with
SGLang's embedding cache on.
"""

import json
from pathlib import Path

import pytest
import requests

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.chunked import chunk_graph_args
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.dart_oracle import dart_kept
from sglang_evs.testing.divprune_oracle import divprune_kept
from sglang_evs.testing.hf_reference import assert_matches_hf, hf_greedy_on_prompt, hf_image_prompt
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    counter_increase,
    flush_cache,
    generate,
    media_kwargs,
    pruning_metrics,
)
from sglang_evs.testing.server import running_server

SERVER_RATE = 0.5
CHUNK = 64
ORACLES = {"divprune": divprune_kept, "dart": dart_kept}
IMAGE_TOKENS = 80  # the wide image, 320 x 256: (320 / 32) * (256 / 32) merged tokens
TALL_TOKENS = 77  # the tall one, 192 x 320, resized by the processor to 224 x 352: 7 * 11


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("images")
    return {
        "wide": media.write_image(out / "wide.png", 256, 320, seed=3),
        "tall": media.write_image(out / "tall.png", 320, 192, seed=4),
        "clip": media.write_clip(out / "clip.mp4", "moving", num_frames=8, fps=4, seed=5),
    }


@pytest.fixture(scope="module")
def image_trace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("image_server") / "trace.jsonl"


def image_server_args() -> list[str]:
    args = ["--dtype", "float32", "--enable-metrics", "--chunked-prefill-size", str(CHUNK)]
    return [*args, "--json-model-override-args", json.dumps({"image_pruning_rate": SERVER_RATE})]


@pytest.fixture(scope="module")
def image_server(tiny_model_dir, image_trace):
    env = {"SGLANG_EVS_TRACE": str(image_trace), "SGLANG_VLM_CACHE_SIZE_MB": "0"}
    log = image_trace.parent / "server.log"
    args = [*image_server_args(), *chunk_graph_args(CHUNK)]  # prefill graphs up to the chunk: fewer to capture
    with running_server(tiny_model_dir, log, args, env, graph_mode=True) as server:
        yield server


@pytest.fixture(scope="module")
def cached_image_server(tiny_model_dir, tmp_path_factory):
    """The same server, eager, with SGLang's embedding cache (its default size): a later chunk over an image reads
    the kept rows its first chunk cached."""
    trace_path = tmp_path_factory.mktemp("cached_image_server") / "trace.jsonl"
    with running_server(tiny_model_dir, trace_path.parent / "server.log", image_server_args(),
                        {"SGLANG_EVS_TRACE": str(trace_path)}) as server:  # fmt: skip
        yield server, trace_path


def image_request(server, paths: list[Path], settings: dict | None = None, **extra):
    prompt = chat_prompt(*[IMAGE] * len(paths))
    kwargs = {"mm_processor_kwargs": settings} if settings else {}
    return generate(server.base_url, prompt, **media_kwargs(images=paths), **kwargs, **extra)[0]


@pytest.mark.parametrize("method", ["divprune", "dart"])
@pytest.mark.parametrize("q", [0.25, 0.5, 0.75])
def test_prompt_tokens_drop_by_the_pruned_count_and_are_reported(image_server, images, method, q):
    unpruned = image_request(image_server, [images["wide"]], {"image_pruning_rate": 0.0})
    before = pruning_metrics(image_server.base_url)
    served = image_request(image_server, [images["wide"]], {"image_pruning_rate": q, "image_pruning_method": method})
    kept = max(1, int(IMAGE_TOKENS * (1 - q)))
    assert unpruned.meta["image_tokens"] == IMAGE_TOKENS and "image_tokens_before_pruning" not in unpruned.meta
    assert unpruned.prompt_tokens - served.prompt_tokens == IMAGE_TOKENS - kept
    assert served.meta["image_tokens"] == kept  # what SGLang's usage (OpenAI's prompt_tokens_details) reads
    assert {key: served.meta[key] for key in served.meta if key.startswith("image_")} == {
        "image_tokens": kept, "image_pruning_method": method, "image_pruning_rate": q,
        "image_tokens_before_pruning": IMAGE_TOKENS, "image_tokens_after_pruning": kept,
    }  # fmt: skip
    grew = counter_increase(before, pruning_metrics(image_server.base_url), method)
    assert (grew["image_tokens_before_pruning"], grew["image_tokens_after_pruning"]) == (IMAGE_TOKENS, kept)
    assert grew["pruned_images"] == 1 and grew.get("pruned_videos", 0) == 0


def test_the_server_default_prunes_and_the_openai_usage_counts_the_kept_tokens(image_server, images):
    body = {
        "model": "default",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": str(images["tall"])}},
                    {"type": "text", "text": "Describe."},
                ],
            }
        ],  # fmt: skip
        "max_tokens": 2,
    }
    reply = requests.post(f"{image_server.base_url}/v1/chat/completions", json=body, timeout=120).json()
    assert reply["usage"]["prompt_tokens_details"]["image_tokens"] == int(TALL_TOKENS * (1 - SERVER_RATE))
    unpruned = image_request(image_server, [images["tall"]], {"image_pruning_rate": 0.0})
    assert unpruned.meta["image_tokens"] == TALL_TOKENS


def test_every_forward_of_a_pruned_image_replays_a_graph(image_server, image_trace, tmp_path):
    """The server's default prunes images, so the plugin turns its breakable prefill graphs on (upstream keeps
    Qwen3-VL's prefill eager): each 64-token chunk of two pruned images replays a prefill graph reading the model's
    position buffer, each decode step a decode graph (graph mode, `sglang_evs.graph_trace`)."""
    before = {event: len(trace.read(image_trace, event)) for event in ("graph_replay", "extend_forward")}
    paths = [media.write_image(tmp_path / "a.png", 256, 320, 40), media.write_image(tmp_path / "b.png", 320, 192, 41)]
    reply = image_request(image_server, paths, {"image_pruning_rate": 0.25})
    replays = trace.read(image_trace, "graph_replay")[before["graph_replay"] :]
    extends = trace.read(image_trace, "extend_forward")[before["extend_forward"] :]
    prefill = [r for r in replays if r["phase"] == "prefill"]
    assert len(prefill) == len(extends) >= 2 and all(r["media"] for r in prefill)
    assert {r["positions_from"] for r in prefill} == {"graph_inputs"}
    assert len([r for r in replays if r["phase"] == "decode"]) == len(reply.output_ids) - 1


def served_image_masks(trace_path: Path, count: int) -> list[list[int]]:
    return [event["kept"] for event in trace.read(trace_path, "image_keep_mask")[-count:]]


@pytest.mark.parametrize(
    "method, cache", [("divprune", False), ("dart", False), ("divprune", True)], ids=["divprune", "dart", "cached"]
)
def test_served_in_chunks_and_after_a_radix_hit_equals_hf_with_the_papers_mask(
    request, image_server, image_trace, tmp_path, tiny_model_dir, method, cache
):
    """Two images (80 and 77 tokens) cut by 64-token chunks: the masks the server decided are the plain
    references' on transformers' own tower rows, and the served tokens and logprobs are transformers' given those
    rows at their unpruned positions; the same request again (a radix hit) is served the same. The images are
    unseen (a decided mask is remembered and not traced again)."""
    if cache:
        image_server, image_trace = request.getfixturevalue("cached_image_server")
    seed = 20 + len(method) + 10 * cache
    paths = [media.write_image(tmp_path / "wide.png", 256, 320, seed),
             media.write_image(tmp_path / "tall.png", 320, 192, seed + 1)]  # fmt: skip
    q = 0.5  # a prompt of about 100 tokens: the first chunk ends inside the second image
    settings = {"image_pruning_rate": q, "image_pruning_method": method}
    served = image_request(image_server, paths, settings)
    first, second = served_image_masks(image_trace, 2)  # SGLang makes each image an item of its own
    prompt = hf_image_prompt(tiny_model_dir, paths, ORACLES[method], q, chat_prompt(IMAGE, IMAGE))
    oracle = prompt.keep[prompt.is_pad]
    assert [first, second] == [oracle[:IMAGE_TOKENS].nonzero().flatten().tolist(),
                               oracle[IMAGE_TOKENS:].nonzero().flatten().tolist()]  # fmt: skip
    assert_matches_hf(served, hf_greedy_on_prompt(prompt))
    repeat = image_request(image_server, paths, settings)
    assert served.prompt_tokens > CHUNK and repeat.cached_tokens > CHUNK
    assert_same_greedy(repeat, served, "radix hit vs first")


def test_images_beside_a_video_in_one_request_and_one_batch_equal_each_alone(image_server, images):
    """Two pruned images and a pruned video in one request; that request beside an image-only one in a batch."""
    prompt = chat_prompt(IMAGE, VIDEO, IMAGE)
    kwargs = media_kwargs(images=[images["wide"], images["tall"]], videos=[images["clip"]])
    settings = {"mm_processor_kwargs": {"image_pruning_rate": 0.5, "video_pruning_rate": 0.5}}
    flush_cache(image_server.base_url)
    alone = generate(image_server.base_url, prompt, **kwargs, **settings)[0]
    assert alone.meta["image_tokens_after_pruning"] == IMAGE_TOKENS // 2 + TALL_TOKENS // 2
    assert alone.meta["video_tokens_after_pruning"] < alone.meta["video_tokens_before_pruning"]
    single = image_request(image_server, [images["tall"]])
    flush_cache(image_server.base_url)
    batch = generate(  # the image alone is pruned at 0.5, the server's rate, too
        image_server.base_url, [prompt, chat_prompt(IMAGE)],
        image_data=[[str(images["wide"]), str(images["tall"])], [str(images["tall"])]],
        video_data=[[str(images["clip"])], []], **settings,
    )  # fmt: skip
    for together, one in zip(batch, (alone, single), strict=True):
        assert together.prompt_tokens == one.prompt_tokens
        assert_same_greedy(together, one, "batched vs alone")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"image_pruning_rate": 1.0}, "image_pruning_rate must be a number in [0, 1)"),
        ({"image_pruning_rate": "half"}, "image_pruning_rate must be a number in [0, 1)"),
        ({"image_pruning_method": "fastv"}, "image_pruning_method must be one of 'divprune', 'dart'"),
        ({"image_pruning_rat": 0.5}, "unknown image pruning setting 'image_pruning_rat'"),
    ],
)
def test_a_bad_image_setting_gets_400_naming_it_and_serving_goes_on(image_server, images, settings, message):
    body = {"text": chat_prompt(IMAGE), "image_data": [str(images["wide"])], "mm_processor_kwargs": settings,
            "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
    response = requests.post(f"{image_server.base_url}/generate", json=body, timeout=120)
    assert response.status_code == 400 and message in response.text
    assert image_request(image_server, [images["wide"]]).meta["image_tokens"] == IMAGE_TOKENS // 2


def test_sglangs_mmmu_eval_at_the_servers_image_rate_reports_what_was_pruned(image_server, tmp_path):
    """SGLang's MMMU eval on the fixture, served at the server's default image rate (0.5): every image pruned, the
    kept counts read off the server's counters over the run."""
    from sglang_evs.bench import mmmu, mmmu_fixture

    questions = sum(mmmu_fixture.write_fixture(tmp_path / "mmmu").values())
    result = mmmu.run_mmmu(tmp_path / "mmmu", image_server.base_url, max_tokens=2, num_threads=1)
    assert len(result["replies"]) == questions
    grew = result["pruned"]["divprune"]
    assert grew["pruned_images"] >= questions  # every question has an image
    assert 0 < grew["image_tokens_after_pruning"] <= grew["image_tokens_before_pruning"] // 2 + grew["pruned_images"]
