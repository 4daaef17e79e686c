"""`--pp-size 2` with the plugin: q = 0 bit-identical to upstream SGLang at `--pp-size 2`, pruning equal to
`--pp-size 1`.

Only the first pipeline stage embeds the prompt and runs `post_process`, where pruned videos and images get
their exact M-RoPE positions; the later stage reads the positions the first one sends with its hidden states.
A six-layer Qwen3-VL (both deepstack levels on the first stage, as upstream requires), 64-token chunks
that cut every video, float32. Three servers: upstream at pp = 2, the plugin at pp = 2 and at pp = 1.

Against upstream at pp = 2, requests sent alone are compared exactly (tokens, every logprob and top-5
logprob, prompt length). The three requests of one batch request are scheduled into pipeline micro-batches
as they arrive, so which of them share a forward (and the last bits of their matmuls) differs from run to
run: there tokens and prompt lengths are compared exactly and logprobs within 1e-4 (`assert_close`). Against pp = 1
(another split of the same layers: a radix hit's decode steps measured 1e-7 apart) every case is compared
that way.
"""

import pytest

from sglang_evs import trace
from sglang_evs.testing.compare import assert_close
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    chat_prompt,
    media_kwargs,
    per_request_rate,
    serve,
)
from sglang_evs.testing.server import Launch, run_to_exit, running_servers

pytestmark = pytest.mark.slow

ARGS = ["--dtype", "float32", "--chunked-prefill-size", "64"]
# Decode graphs for the batch sizes this module sends (1 to 3, none padded): a pipeline stage captures each size
# in about 3.5 s on CPU, and SGLang's default list has 24 of them.
PP_GRAPHS = ["--cuda-graph-bs-decode", "1", "2", "3"]
PRUNINGS = {
    "evs q=0.75": per_request_rate(0.75),
    "vidcom2 q=0.75": per_request_rate(0.75, "vidcom2"),
    "images divprune q=0.75": {"mm_processor_kwargs": {"image_pruning_rate": 0.75, "video_pruning_rate": 0.75}},
}


def cases(media) -> dict[str, tuple[str, dict]]:
    image, image2 = media / "image.png", media / "image2.png"
    return {
        "text": (chat_prompt(text="Count to five."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[image])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[media / "moving.mp4"])),
        "image+video": (chat_prompt(IMAGE, VIDEO), media_kwargs(images=[image2], videos=[media / "noise.mp4"])),
    }


def batch(media) -> dict:
    """One batch request of an image, a text and a video prompt."""
    alone = cases(media)
    return {
        "text": [alone[name][0] for name in ("image", "text", "video")],
        "image_data": [[str(media / "image.png")], [], []],
        "video_data": [[], [], [str(media / "static.mp4")]],
    }


@pytest.fixture(scope="module")
def served(tiny_qwen3_vl_six_layers_dir, media_dir, tmp_path_factory):
    """{(server, setting): results} for upstream pp = 2 (q = 0), the plugin at pp = 2 (q = 0 and both
    prunings) and the plugin at pp = 1 (both prunings); "trace": the plugin pp = 2 server's. The pp = 2
    servers run in graph mode (`sglang_evs.testing.server`), as a GPU serves by default: SGLang keeps
    prefill graphs off for pipeline parallelism and replays decode graphs on each stage."""
    folder = tmp_path_factory.mktemp("pipeline")
    plans = {
        "upstream pp2": (["--pp-size", "2", *PP_GRAPHS], {"SGLANG_PLUGINS": "none"}, {"q=0": {}}),
        "plugin pp2": (["--pp-size", "2", *PP_GRAPHS], {}, {"q=0": {}, **PRUNINGS}),
        "plugin pp1": ([], {}, PRUNINGS),
    }
    launches = [
        Launch(tiny_qwen3_vl_six_layers_dir, folder / f"{server_name.replace(' ', '-')}.log", [*ARGS, *extra],
               {**env, **({trace.ENV: str(folder / "trace.jsonl")} if server_name == "plugin pp2" else {})},
               graph_mode=server_name.endswith("pp2"))
        for server_name, (extra, env, _) in plans.items()
    ]  # fmt: skip
    out = {"trace": folder / "trace.jsonl"}
    with running_servers(*launches) as servers:
        for server, (server_name, (_, _, settings)) in zip(servers, plans.items(), strict=True):
            for setting, rate in settings.items():
                out[server_name, setting] = serve(server.base_url, cases(media_dir), batch(media_dir), rate)
    return out


def test_pp2_at_q0_is_bit_identical_to_upstream_pp2(served):
    ours, upstream = served["plugin pp2", "q=0"], served["upstream pp2", "q=0"]
    assert ours.keys() == upstream.keys()
    for name in upstream.keys() - {"batch"}:
        assert ours[name] == upstream[name], name
    for mine, theirs in zip(ours["batch"], upstream["batch"], strict=True):
        assert_close(mine, theirs)


def test_both_stages_replay_decode_graphs(served):
    decodes = [r for r in trace.read(served["trace"], "graph_replay") if r["phase"] == "decode"]
    assert len({r["pid"] for r in decodes}) == 2  # a replay on each stage
    assert not [r for r in trace.read(served["trace"], "graph_replay") if r["phase"] == "prefill"]


@pytest.mark.parametrize("setting", list(PRUNINGS))
def test_pruned_pp2_equals_pp1(served, setting):
    pp1, pp2 = served["plugin pp1", setting], served["plugin pp2", setting]
    unpruned = served["plugin pp2", "q=0"]
    assert pp2.keys() == pp1.keys()
    for name in pp1.keys() - {"batch"}:
        assert_close(pp2[name], pp1[name])
    for two, one in zip(pp2["batch"], pp1["batch"], strict=True):
        assert_close(two, one)
    assert pp2["video"].prompt_tokens < unpruned["video"].prompt_tokens  # pruning ran
    images_pruned = "image_pruning_rate" in PRUNINGS[setting]["mm_processor_kwargs"]
    assert (pp2["image"].prompt_tokens < unpruned["image"].prompt_tokens) == images_pruned  # the video rate alone not


def test_deepstack_on_a_later_stage_is_refused_at_startup(tiny_qwen3_5_deepstack_dirs):
    """A Qwen3.5 with deepstack after layers 0-2 of its 4: at pp = 2 the second stage would start at layer
    2 (upstream Qwen3.5 would silently add nothing there; upstream Qwen3-VL asserts on its own)."""
    with_levels, _ = tiny_qwen3_5_deepstack_dirs
    result = run_to_exit(with_levels, ["--pp-size", "2"])
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "this pipeline stage starts at decoder layer 2" in output and "deepstack" in output, output[-3000:]


def test_a_threshold_default_is_refused_at_startup(tiny_model_dir):
    """Only the first stage has the vision tower, where the scheduler would decide a threshold's layout
    (`pruning/admission.py`): a server default names the setting and the layout, before anything is served."""
    overrides = '{"video_pruning_threshold": 0.3}'
    result = run_to_exit(tiny_model_dir, ["--pp-size", "2", "--json-model-override-args", overrides])
    output = result.stdout + result.stderr
    assert result.returncode != 0
    message = "video_pruning_threshold is not served with pipeline parallelism (--pp-size 2) yet"
    assert message in output, output[-3000:]
