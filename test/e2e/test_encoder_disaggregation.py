"""Encoder disaggregation with the plugin: `--encoder-only` servers prune the videos they encode.

Two encoder servers encode for one `--language-only` server (29-token chunks, a server default of EVS
.5; every request here but one names its own setting). The pair is compared with one plugin server
(the session's, one chunk): the same greedy tokens and prompt tokens, logprobs within TOLERANCE, at
q = 0, .5, .75 and under VidCom2, for a video, an image and a video, and two videos; a radix repeat;
8 concurrent requests at mixed rates. The encoders trace what they send: at q = .75 a video's rows are
a quarter of q = 0's. Then one encoder is killed while a burst is in flight: every request gets an
answer or an error, none hangs, and the language server serves on.
"""

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sglang_evs import trace
from sglang_evs.methods import EVS
from sglang_evs.testing import media
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    generate,
    media_kwargs,
    metric_samples,
    per_request_rate,
    pruning_setting,
)
from sglang_evs.testing.server import Launch, free_port, local_url, run_to_exit, running_servers
from sglang_evs.testing.workload import send_alone, send_together, side_by_side

pytestmark = pytest.mark.slow

SERVER_ARGS = ["--dtype", "float32"]
CHUNK = 29
LANGUAGE_DEFAULT = 0.5  # the language server's own default (EVS)
# The pair (29-token chunks) vs one server (one chunk): the same weights, other chunk boundaries.
TOLERANCE = 1e-4
SETTINGS = {
    "q=0": per_request_rate(0.0),
    "evs q=0.5": per_request_rate(0.5),
    "evs q=0.75": per_request_rate(0.75),
    "vidcom2 q=0.75": per_request_rate(0.75, "vidcom2"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("epd_media")
    return {
        "moving": media.write_clip(out / "moving.mp4", "moving", num_frames=16, fps=4, seed=5),
        "noise": media.write_clip(out / "noise.mp4", "noise", num_frames=16, fps=4, seed=6),
        "image": media.write_image(out / "image.png", seed=6),
        "burst": [
            media.write_clip(out / f"burst{i}.mp4", "moving", num_frames=48, fps=4, seed=60 + i) for i in range(12)
        ],
        "unseen": media.write_clip(out / "unseen.mp4", "noise", num_frames=16, fps=4, seed=61),
        "mixed_clips": [
            media.write_clip(out / f"mixed{i}.mp4", ("moving", "noise")[i % 2], num_frames=16, fps=4, seed=80 + i)
            for i in range(7)
        ],
        "mixed_images": [media.write_image(out / f"mixed{i}.png", seed=90 + i) for i in range(3)],
    }


def cases(files: dict) -> dict[str, tuple[str, dict]]:
    return {
        "image": (chat_prompt(IMAGE), media_kwargs(images=[files["image"]])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[files["moving"]])),
        "image_video": (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[files["image"]], videos=[files["noise"]])),
        "two_videos": (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[files["moving"], files["noise"]])),
    }


def mixed(files: dict) -> list[tuple[str, dict, float]]:
    """8 requests at mixed rates, each with media of its own (no two share a prefix the radix cache could
    serve, so they prefill together)."""
    clips, images = files["mixed_clips"], files["mixed_images"]
    return [
        (chat_prompt(VIDEO), media_kwargs(videos=[clips[0]]), 0.0),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[images[0]], videos=[clips[1]]), 0.5),
        (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips[2], clips[3]]), 0.75),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips[4]]), 0.25),
        (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[images[1]], videos=[clips[5]]), 0.75),
        (chat_prompt(IMAGE), media_kwargs(images=[images[2]]), 0.0),
        (chat_prompt(VIDEO), media_kwargs(videos=[clips[6]]), 0.5),
        (chat_prompt(text="Count the objects."), {}, 0.75),
    ]


def ask(base_url: str, case: tuple[str, dict], setting: dict) -> Generation:
    prompt, kw = case
    return generate(base_url, prompt, **kw, **setting)[0]


def burst_one(base_url: str, clip: Path) -> tuple[str, str, float]:
    start = time.time()
    try:
        reply = ask(base_url, (chat_prompt(VIDEO), media_kwargs(videos=[clip])), per_request_rate(0.75))
        return "answered", str(reply.prompt_tokens), time.time() - start
    except Exception as error:  # noqa: BLE001 - each request's outcome is the result
        return "error", str(error), time.time() - start


@pytest.fixture(scope="module")
def served(tiny_model_dir, tiny_server, files, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("epd")
    traces = [folder / "encoder1.jsonl", folder / "encoder2.jsonl"]
    language_trace = folder / "language.jsonl"
    ports = [free_port() for _ in traces]  # the language server is told its encoders' addresses: all start at once
    encoders = [Launch(tiny_model_dir, folder / f"encoder{i + 1}.log", [*SERVER_ARGS, "--encoder-only"],
                       {trace.ENV: str(traces[i])}, port=port) for i, port in enumerate(ports)]  # fmt: skip
    language_args = [*SERVER_ARGS, "--language-only", "--encoder-urls", *map(local_url, ports),
                     "--chunked-prefill-size", str(CHUNK),
                     "--json-model-override-args", json.dumps(pruning_setting(LANGUAGE_DEFAULT))]  # fmt: skip
    language_launch = Launch(tiny_model_dir, folder / "language.log", language_args, {trace.ENV: str(language_trace)},
                             graph_mode=True)  # fmt: skip
    out: dict = {"pair": {}, "single": {}, "traces": traces}
    all_cases = cases(files)
    with running_servers(*encoders, language_launch) as (encoder1, encoder2, language):
        compared = [(name, setting) for name in all_cases for setting in SETTINGS
                    if name != "image" or setting == "q=0"]  # fmt: skip

        def on_pair() -> None:
            for name, setting in compared:
                out["pair"][name, setting] = ask(language.base_url, all_cases[name], SETTINGS[setting])
                if (name, setting) == ("video", "evs q=0.75"):
                    out["radix_repeat"] = ask(language.base_url, all_cases[name], SETTINGS[setting])
            out["default"] = ask(language.base_url, all_cases["video"], {})  # the language server's default

        def on_single() -> None:
            for name, setting in compared:
                out["single"][name, setting] = ask(tiny_server.base_url, all_cases[name], SETTINGS[setting])
            out["mixed_alone"] = send_alone(tiny_server.base_url, mixed(files))

        side_by_side(on_pair, on_single)  # the pair and the single server, each its own stream of requests
        out["mixed_together"], out["mixed_prefill"] = send_together(language.base_url, mixed(files), language_trace)

        sent_before = [len(trace.read(path, "encoder_sent")) for path in traces]
        unseen = (chat_prompt(VIDEO), media_kwargs(videos=[files["unseen"]]))
        out["unseen"] = {q: ask(language.base_url, unseen, per_request_rate(q)) for q in (0.0, 0.75)}
        sent = [event for path, before in zip(traces, sent_before, strict=True)
                for event in trace.read(path, "encoder_sent")[before:]]  # fmt: skip
        out["unseen_sent"] = sorted(sent, key=lambda event: event["rows"], reverse=True)
        out["bad"] = requests.post(
            f"{language.base_url}/generate",
            json={"text": chat_prompt(VIDEO), "video_data": [str(files["moving"])], **per_request_rate(1.5),
                  "sampling_params": {"max_new_tokens": 2}},
            timeout=120,
        )  # fmt: skip
        out["after_bad"] = ask(language.base_url, all_cases["video"], SETTINGS["evs q=0.75"])

        with ThreadPoolExecutor(len(files["burst"])) as pool:
            encoded_before = len(trace.read(traces[1], "encoder_pruned"))
            burst = [pool.submit(burst_one, language.base_url, clip) for clip in files["burst"]]
            deadline = time.monotonic() + 30  # killed once it has encoded one: the rest are in flight
            while len(trace.read(traces[1], "encoder_pruned")) == encoded_before and time.monotonic() < deadline:
                time.sleep(0.02)
            os.killpg(os.getpgid(encoder2.process.pid), signal.SIGKILL)
            out["burst"] = [future.result(timeout=300) for future in burst]
        out["language_alive"] = language.alive()
        out["replays"] = trace.read(language_trace, "graph_replay")
        out["text_after"] = generate(language.base_url, chat_prompt(text="Count to five."))[0]
    return out


def assert_same(got: Generation, want: Generation, context: str) -> None:
    assert_same_generation(got, want, TOLERANCE, context)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_pair_serves_as_one_server(served, setting):
    compared = [key for key in served["pair"] if key[1] == setting]
    assert len(compared) == (4 if setting == "q=0" else 3)
    for key in compared:
        assert_same(served["pair"][key], served["single"][key], str(key))
        if setting != "q=0" and key[0] != "image":
            assert served["pair"][key].prompt_tokens < served["pair"][key[0], "q=0"].prompt_tokens, key


def test_the_language_server_replays_graphs_as_a_gpu_serves_by_default(served):
    """The language server runs in graph mode (`sglang_evs.testing.server`): the encoders' embeddings of a
    pruned video go into prefill graph replays, its decode steps replay decode graphs."""
    prefills = [r for r in served["replays"] if r["phase"] == "prefill" and r["media"]]
    assert prefills and {r["positions_from"] for r in prefills} == {"graph_inputs"}
    assert any(r["phase"] == "decode" for r in served["replays"])


def test_the_language_servers_default_reaches_the_encoder(served):
    assert served["default"].prompt_tokens == served["pair"]["video", "evs q=0.5"].prompt_tokens
    assert served["default"].output_ids == served["pair"]["video", "evs q=0.5"].output_ids


def test_a_radix_repeat_of_a_pruned_video_gives_the_same_tokens(served):
    assert served["radix_repeat"].cached_tokens > 0
    assert_same(served["radix_repeat"], served["pair"]["video", "evs q=0.75"], "radix repeat")


def test_eight_concurrent_mixed_requests_equal_each_served_alone(served):
    batched, cached, prompt = served["mixed_prefill"]
    assert batched > 0, "no prefill forward held two requests' media"
    assert cached < prompt // 4
    for i, (got, want) in enumerate(zip(served["mixed_together"], served["mixed_alone"], strict=True)):
        assert_same(got, want, f"mixed request {i}")


def test_at_q075_an_encoder_sends_a_quarter_of_a_videos_rows(served):
    """One video, 4 groups of 100 tokens: EVS at .75 keeps 100 rows (its first group), so the rows sent are
    exactly a quarter; the message is a little more, since the kept indices travel with the rows."""
    full, pruned = served["unseen_sent"]
    assert served["unseen"][0.0].prompt_tokens - served["unseen"][0.75].prompt_tokens == full["rows"] - pruned["rows"]
    assert pruned["rows"] == EVS.retained_token_count(100, 4, 0.75) == full["rows"] // 4
    assert pruned["embedding_bytes"] * 4 == full["embedding_bytes"]
    ratio = (pruned["embedding_bytes"] + pruned["metadata_bytes"]) / (full["embedding_bytes"] + full["metadata_bytes"])
    assert 0.25 < ratio < 0.26


def test_both_encoder_servers_encoded(served):
    for path in served["traces"]:
        assert trace.read(path, "encoder_sent"), path


def test_a_bad_rate_gets_400_and_the_pair_serves_on(served):
    assert served["bad"].status_code == 400 and "video_pruning_rate" in served["bad"].text
    assert_same(served["after_bad"], served["pair"]["video", "evs q=0.75"], "after the bad request")


def test_an_encoder_killed_mid_burst_loses_no_request_and_the_language_server_serves_on(served):
    outcomes = [outcome for outcome, _, _ in served["burst"]]
    assert set(outcomes) <= {"answered", "error"} and "answered" in outcomes and "error" in outcomes
    for outcome, detail, seconds in served["burst"]:
        assert seconds < 120, "a request hung"
        if outcome == "error":
            assert "502" in detail or "Server disconnected" in detail, detail
    assert served["language_alive"] and len(served["text_after"].output_ids) > 0


def test_a_server_wide_setting_on_an_encoder_stops_it_at_startup(tiny_model_dir):
    done = run_to_exit(tiny_model_dir, ["--encoder-only", "--json-model-override-args", '{"video_pruning_rate": 0.5}'])
    assert done.returncode != 0
    assert "video_pruning_rate=0.5" in done.stdout + done.stderr
    assert "set the pruning default on the --language-only server" in done.stdout + done.stderr


@pytest.fixture(scope="module")
def without_plugin(tiny_model_dir, tiny_server, files, tmp_path_factory) -> dict:
    """A language server with the plugin (EVS .5 by default) whose one encoder server runs without it."""
    folder = tmp_path_factory.mktemp("epd_mixed_fleet")
    upstream = {"SGLANG_PLUGINS": "none"}  # SGLang loads no plugin in this server
    port = free_port()
    encoder = Launch(tiny_model_dir, folder / "encoder.log", [*SERVER_ARGS, "--encoder-only"], upstream, port=port)
    language_args = [*SERVER_ARGS, "--language-only", "--encoder-urls", local_url(port),
                     "--json-model-override-args", json.dumps(pruning_setting(LANGUAGE_DEFAULT))]  # fmt: skip
    video = cases(files)["video"]
    out: dict = {}
    with running_servers(encoder, Launch(tiny_model_dir, folder / "language.log", language_args)) as (
        upstream_encoder,
        language,
    ):
        out["encoder"] = upstream_encoder.base_url
        for name, setting in (("default", {}), ("q=0.75", SETTINGS["evs q=0.75"])):
            out[name] = requests.post(
                f"{language.base_url}/generate",
                json={"text": video[0], **video[1], **setting, "sampling_params": {"max_new_tokens": 2}},
                timeout=120,
            )
        out["q=0"] = ask(language.base_url, video, SETTINGS["q=0"])
        out["single q=0"] = ask(tiny_server.base_url, video, SETTINGS["q=0"])
        out["text_after"] = generate(language.base_url, chat_prompt(text="Count to five."))[0]
    return out


def test_an_encoder_without_the_plugin_fails_a_pruning_request_by_name_and_the_server_serves_on(without_plugin):
    """Such an encoder sends every row and no record: a request that asked for pruning (by the language
    server's default or its own setting) fails naming the encoder and its setting, never served unpruned."""
    for name, rate in (("default", LANGUAGE_DEFAULT), ("q=0.75", 0.75)):
        reply = without_plugin[name]
        assert reply.status_code == 500, (name, reply.text)
        assert f"video_pruning_rate={rate}" in reply.text and without_plugin["encoder"] in reply.text, reply.text
        assert "without the sglang-evs plugin" in reply.text
    assert_same(without_plugin["q=0"], without_plugin["single q=0"], "q = 0 from an encoder without the plugin")
    assert len(without_plugin["text_after"].output_ids) > 0


# Other families and encoder layouts behind the pair, each against one plugin server of the same checkpoint:
# (checkpoint fixture, the encoder's own arguments, the one server's own arguments, environment). The Qwen3-VL
# encoder runs two TP ranks and SGLang's encoder cache (`--enable-prefix-mm-cache`), which must not hand a
# video's rows pruned at one rate to a request at another. Its reference runs its tower at TP = 2 too: the
# nearly static clip scores many cells within rounding of 0, and a TP = 2 tower breaks such near-ties apart from
# one rank's (every run on an AMD EPYC without AVX-512), so both sides decide the mask in the same layout
# (docs/architecture.md, "Near-ties across layouts").
PAIR_LAYOUTS = {
    "qwen3_vl-encoder_tp2-prefix_mm_cache": (
        "tiny_model_dir",
        ["--tp-size", "2", "--enable-prefix-mm-cache", "--enable-metrics"],
        ["--tp-size", "2"],
        {},
    ),
    "qwen3_5": ("tiny_qwen3_5_dir", [], [], {"SGLANG_MAMBA_CONV_DTYPE": "float32"}),
    "qwen3_vl_moe": ("tiny_qwen3_vl_moe_dir", [], [], {}),
}
# The same video at three settings in a row (the encoder cache holds it after the first), then media mixes.
LAYOUT_REQUESTS = [
    ("video", "evs q=0.75"), ("video", "q=0"), ("video", "evs q=0.5"), ("video", "evs q=0.75"),
    ("image_video", "vidcom2 q=0.75"), ("two_videos", "evs q=0.5"),
]  # fmt: skip


@pytest.fixture(scope="module", params=list(PAIR_LAYOUTS))
def pair_layout(request, files, tmp_path_factory) -> dict:
    checkpoint, encoder_args, single_args, env = PAIR_LAYOUTS[request.param]
    model_dir = request.getfixturevalue(checkpoint)
    folder = tmp_path_factory.mktemp(f"epd_{request.param}")
    port = free_port()
    encoder = Launch(model_dir, folder / "encoder.log", [*SERVER_ARGS, "--encoder-only", *encoder_args], env, port=port)
    single = Launch(model_dir, folder / "single.log", [*SERVER_ARGS, *single_args], env)
    language = Launch(model_dir, folder / "language.log", [*SERVER_ARGS, "--language-only", "--encoder-urls",
                                                           local_url(port)], env)  # fmt: skip
    all_cases, out = cases(files), {}
    with running_servers(encoder, single, language) as (encoder_server, single_server, language):

        def serve(url: str) -> list[Generation]:
            return [ask(url, all_cases[case], SETTINGS[setting]) for case, setting in LAYOUT_REQUESTS]

        # the pair and the single server, each its own stream of requests
        out["pair"], out["single"] = side_by_side(lambda: serve(language.base_url),
                                                  lambda: serve(single_server.base_url))  # fmt: skip
        if "--enable-metrics" in encoder_args:
            metrics = requests.get(f"{encoder_server.base_url}/metrics", timeout=30).text
            out["video_cache_hit_tokens"] = sum(
                sample.value for sample in metric_samples(metrics)
                if sample.name == "sglang:encoder_cache_hit_tokens_total" and sample.labels.get("modality") == "video"
            )  # fmt: skip
    return out


def test_other_families_and_encoder_layouts_serve_as_one_server(pair_layout):
    for (case, setting), got, want in zip(LAYOUT_REQUESTS, pair_layout["pair"], pair_layout["single"], strict=True):
        assert_same(got, want, f"{case} {setting}")
    by_request = dict(zip(LAYOUT_REQUESTS, pair_layout["pair"], strict=True))
    video_tokens = [by_request["video", setting].prompt_tokens for setting in ("q=0", "evs q=0.5", "evs q=0.75")]
    assert video_tokens == sorted(video_tokens, reverse=True) and len(set(video_tokens)) == 3
    if "video_cache_hit_tokens" in pair_layout:  # the repeats of the video came from the encoder's cache
        assert pair_layout["video_cache_hit_tokens"] >= 3 * 400, pair_layout["video_cache_hit_tokens"]
