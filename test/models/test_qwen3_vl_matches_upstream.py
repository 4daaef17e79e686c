"""With the plugin on and no pruning, Qwen3-VL serves bit-identically to upstream SGLang 0.5.23.

Each configuration runs the same requests on two float32 servers: plugin on,
and plugin off (`SGLANG_PLUGINS=none`: SGLang loads no plugin, so its own
Qwen3-VL and embedding routine serve). Greedy tokens, the logprob of every
generated token and the top-5 logprobs at every step must be equal exactly.
Inside the plugin server, an event trace shows where deepstack went. SGLang's MMMU eval
(`sglang_evs.bench.mmmu` on the generated fixture) must score the same, answer by answer.
"""

import json
import subprocess
import sys

import pytest

from sglang_evs import trace
from sglang_evs.bench import mmmu_fixture
from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, flush_cache, generate, logprob_gap, media_kwargs
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.workload import side_by_side

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

CHUNKED = ["--chunked-prefill-size", "48"]  # cuts the 64-token image and the 200-token video


def scenarios(media) -> dict[str, tuple[str, dict]]:
    image, image2 = media / "image.png", media / "image2.png"
    return {
        "text": (chat_prompt(text="Count the objects in the scene."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[image])),
        "two_images": (chat_prompt(IMAGE, IMAGE), media_kwargs(images=[image, image2])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[media / "moving.mp4"])),
        "image_video": (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image2], videos=[media / "noise.mp4"])),
    }


# Image pruning at q = 0, asked for by name (the plugin's servers only): served as upstream serves the request.
IMAGES_AT_Q0 = {"mm_processor_kwargs": {"image_pruning_rate": 0.0, "image_pruning_method": "dart"}}


def run_all(base_url: str, media, names: list[str], plugin: str) -> dict:
    cases = scenarios(media)
    results = {"fresh_text": generate(base_url, *[cases["text"][0]])[0]}
    for name in names:
        prompt, kwargs = cases[name]
        results[name] = generate(base_url, prompt, **kwargs)[0]
    flush_cache(base_url)
    prompt, kwargs = cases["two_images"]
    results["images_at_q0"] = generate(base_url, prompt, **kwargs, **(IMAGES_AT_Q0 if plugin == "on" else {}))[0]
    prompt, kwargs = cases["image_video"]
    results["radix_repeat"] = generate(base_url, prompt, **kwargs)[0]
    batch = [cases[n][0] for n in ("image", "text", "video", "image_video")]
    results["batch"] = generate(
        base_url,
        batch,
        image_data=[[str(media / "image.png")], [], [], [str(media / "image2.png")]],
        video_data=[[], [], [str(media / "moving.mp4")], [str(media / "noise.mp4")]],
    )
    flush_cache(base_url)
    results["text_after_media"] = generate(base_url, cases["text"][0])[0]
    return results


def run_mmmu(base_url: str, data_dir, out) -> dict:
    """The MMMU command line, one question at a time (a batch is not bit-reproducible on CPU)."""
    cmd = [sys.executable, "-m", "sglang_evs.bench.mmmu", "--data-dir", str(data_dir), "--base-url", base_url,
           "--max-tokens", "6", "--num-threads", "1", "--output", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def served(tiny_model_dir, media_dir, tmp_path_factory):
    """{(config, plugin): results}, plus the plugin servers' trace paths."""
    work = tmp_path_factory.mktemp("upstream_parity")
    mmmu_data = work / "mmmu"
    mmmu_fixture.write_fixture(mmmu_data)
    names = list(scenarios(media_dir))
    out: dict = {"trace": {}}
    configs = (("single_chunk", []), ("chunked", CHUNKED), ("graphs", CHUNKED))
    plans = [(config, extra, plugin) for config, extra in configs for plugin in ("on", "off")]
    # Every server is traced: a plugin loaded anywhere in an upstream server would write events.
    traces = [work / f"trace-{config}-{plugin}.jsonl" for config, _, plugin in plans]
    launches = [
        Launch(tiny_model_dir, work / f"server-{config}-{plugin}.log", ["--dtype", "float32", *extra],
               {"SGLANG_EVS_TRACE": str(trace_path), **({} if plugin == "on" else {"SGLANG_PLUGINS": "none"})},
               graph_mode=config == "graphs")
        for (config, extra, plugin), trace_path in zip(plans, traces, strict=True)
    ]  # fmt: skip
    with running_servers(*launches) as servers:

        def serve(with_plugin: str) -> None:
            for server, (config, _, plugin) in zip(servers, plans, strict=True):
                if plugin != with_plugin:
                    continue
                out[config, plugin] = run_all(server.base_url, media_dir, names, plugin)
                if config == "single_chunk":
                    out["mmmu", plugin] = run_mmmu(server.base_url, mmmu_data, work / f"mmmu-{plugin}.json")
                out["log", config, plugin] = server.log()

        side_by_side(lambda: serve("on"), lambda: serve("off"))  # the plugin's servers beside upstream's
    for (config, _, plugin), trace_path in zip(plans, traces, strict=True):
        if plugin == "on":
            out["trace"][config] = trace_path
        else:
            out["upstream trace written", config] = trace_path.exists()
    return out


CASES = ["text", "image", "two_images", "video", "image_video", "radix_repeat", "text_after_media", "images_at_q0"]


@pytest.mark.parametrize("config", ["single_chunk", "chunked"])
@pytest.mark.parametrize("case", CASES)
def test_bit_identical_to_upstream(served, config, case):
    ours, upstream = served[config, "on"][case], served[config, "off"][case]
    assert ours == upstream


@pytest.mark.parametrize("config", ["single_chunk", "chunked", "graphs"])
def test_mixed_batch_matches_upstream(served, config):
    """A batch is not bit-reproducible on CPU even in upstream alone: which requests share a
    prefill depends on when each one's media finishes preprocessing, and the CPU GEMM result
    of a row depends on the batch's row count (measured: the same batch twice on one upstream
    server differs by up to 2e-6 in logprobs). Tokens must match exactly, logprobs closely."""
    ours, upstream = served[config, "on"]["batch"], served[config, "off"]["batch"]
    assert len(ours) == len(upstream) == 4
    for mine, theirs in zip(ours, upstream, strict=True):
        assert mine.output_ids == theirs.output_ids
        assert mine.prompt_tokens == theirs.prompt_tokens
        assert logprob_gap(mine, theirs) < 1e-4


# Graph mode (`sglang_evs.testing.server`), as a GPU serves by default: both servers replay SGLang's decode
# graphs, and both keep Qwen3-VL's prefill eager: upstream leaves it off its prefill-graph allowlist, and the
# plugin turns prefill graphs on only where the server's default prunes (`plugin.prefill_graphs_serve_pruning`),
# so at q = 0 the two compute the same thing (a replayed prefill, padded to its bucket, would round rows
# differently: 1.4e-6 in logprobs was measured when the plugin turned them on whatever the rate).
@pytest.mark.parametrize("case", CASES)
def test_graph_mode_matches_upstream_in_graph_mode(served, case):
    assert served["graphs", "on"][case] == served["graphs", "off"][case]  # every logprob and top-5 logprob


def test_graph_mode_at_q0_replays_decodes_and_keeps_prefill_eager_as_upstream(served):
    """Both servers replayed decode graphs (the plugin's trace: reading SGLang's static M-RoPE positions) and
    captured no prefill graph; the plugin's prefill graphs replay where the default prunes
    (`test_evs_serving.py::test_every_forward_of_a_pruned_video_replays_a_graph`)."""
    replays = trace.read(served["trace"]["graphs"], "graph_replay")
    assert replays and {r["phase"] for r in replays} == {"decode"}
    assert {r["positions_from"] for r in replays} == {"mrope_positions"}
    for plugin in ("on", "off"):
        assert "Capture target prefill CUDA graph" not in served["log", "graphs", plugin]


def test_mmmu_at_q0_scores_as_upstream_answer_by_answer(served):
    ours, upstream = served["mmmu", "on"], served["mmmu", "off"]
    assert len(ours["replies"]) == sum(mmmu_fixture.FIXTURE.values())
    assert any(ours["replies"].values())  # the model answered something
    assert ours["replies"] == upstream["replies"]
    assert (ours["accuracy"], ours["per_subject"]) == (upstream["accuracy"], upstream["per_subject"])


def test_plugin_model_served_and_upstream_did_not(served):
    assert (
        "Qwen3VLForConditionalGeneration: 2 deepstack levels and M-RoPE positions in fixed buffers"
        in served["log", "single_chunk", "on"]
    )
    for config in ("single_chunk", "chunked", "graphs"):
        assert "plugin loaded" not in served["log", config, "off"]
        assert served["upstream trace written", config] is False  # no process of it ran the plugin


def test_radix_cache_served_the_repeat(served):
    results = served["single_chunk", "on"]
    assert results["radix_repeat"].cached_tokens > 0
    assert results["radix_repeat"].output_ids == results["image_video"].output_ids


def test_text_only_after_media_equals_fresh_server(served):
    for config in ("single_chunk", "chunked"):
        after, fresh = served[config, "on"]["text_after_media"], served[config, "on"]["fresh_text"]
        # (cached_tokens differs: the fresh request shared 2 tokens with the warm-up request)
        assert (after.output_ids, after.logprobs, after.top_logprobs) == (
            fresh.output_ids,
            fresh.logprobs,
            fresh.top_logprobs,
        )


@pytest.mark.parametrize("config", ["single_chunk", "chunked"])
def test_deepstack_buffer_keeps_its_construction_address(served, config):
    (allocated,) = trace.read(served["trace"][config], "graph_inputs_allocated")
    assert allocated["capacity"] >= 16384  # SGLang's default max_prefill_tokens covers every prefill here
    events = trace.read(served["trace"][config], "deepstack")
    assert len(events) > 8  # every prefill chunk of every request
    assert {e["data_ptr"] for e in events} == {allocated["deepstack_ptr"]}
    media = [e for e in events if e["media_rows"] > 0]
    assert media and all(e["nonzero_rows"] == e["media_rows"] for e in media)
    assert all(e["nonzero_rows"] == 0 for e in events if e["media_rows"] == 0)  # nothing stale survives


@pytest.mark.parametrize("config", ["single_chunk", "chunked"])
def test_language_model_reads_the_fixed_buffers_in_prefill_and_nothing_in_decode(served, config):
    (allocated,) = trace.read(served["trace"][config], "graph_inputs_allocated")
    calls = trace.read(served["trace"][config], "language_model_inputs")
    prefill = [c for c in calls if c["mode"] in ("EXTEND", "MIXED")]
    decode = [c for c in calls if c["mode"] == "DECODE"]
    assert prefill and decode and len(prefill) + len(decode) == len(calls)
    assert all(c["carried_by_batch"] for c in prefill)
    assert {c["deepstack_ptr"] for c in prefill} == {allocated["deepstack_ptr"]}
    assert {c["positions_ptr"] for c in prefill} == {allocated["positions_ptr"]}
    assert all(c["deepstack_ptr"] is None for c in decode)  # as upstream: no deepstack add in decode
