"""Nemotron-Nano-VL, the model SGLang 0.5.23 prunes with its own EVS, serves with the plugin installed exactly as
without it, at the rate its documentation sets (`--json-model-override-args '{"video_pruning_rate": 0.7}'`,
with `--trust-remote-code`): the setting is accepted, SGLang's EVS is enabled at that rate, and text, image
and video requests get the same prompt lengths, tokens and logprobs (16-token chunks cut the media; radix
repeats). A third server, at q = 0, shows that EVS pruned the video.

The tiny checkpoint has no weights file (transformers has no Nemotron-Nano-VL): SGLang's dummy loader draws
them, seeded, the same in every server; its outputs are near-uniform, so the prompt lengths and the exact
logprobs are what the comparison rests on. Its Mamba2 layers run on the CPU route's stand-ins
(`runtime/mamba2.py`); its RADIO tower only in bfloat16 (`docs/cpu-runtime.md`).
"""

from functools import partial

import pytest

from sglang_evs.testing.requests import flush_cache, generate, media_kwargs
from sglang_evs.testing.server import HYBRID_CPU_SERVER_ARGS, Launch, running_servers
from sglang_evs.testing.workload import side_by_side

pytestmark = pytest.mark.slow  # three servers: the full suite only (see pyproject.toml)

CHUNK = 16
SERVED = ["--load-format", "dummy", "--dtype", "bfloat16", "--trust-remote-code", *HYBRID_CPU_SERVER_ARGS,
          "--chunked-prefill-size", str(CHUNK)]  # fmt: skip
EVS_ENABLED = "[EVS] enabled for NemotronH_Nano_VL_V2 [EVSConfig(video_pruning_rate={rate}"
SERVERS = {  # name: (pruning rate, plugin)
    "on": (0.7, True),
    "off": (0.7, False),
    "unpruned": (0.0, True),
}


def prompt(*media: str, text: str = "Describe this.") -> str:
    """The tiny checkpoint's chat template, written out (`testing/tiny_nemotron_vl.py`)."""
    return f"<|im_start|>user\n{''.join(media)}{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def served(tiny_nemotron_vl_dir, media_dir, tmp_path_factory) -> dict:
    """{name: {"log": server log, case: Generation}} for the three servers, started together."""
    work = tmp_path_factory.mktemp("nemotron")
    launches = []
    for name, (rate, plugin) in SERVERS.items():
        args = [*SERVED, "--json-model-override-args", f'{{"video_pruning_rate": {rate}}}']
        env = {} if plugin else {"SGLANG_PLUGINS": "none"}
        launches.append(Launch(tiny_nemotron_vl_dir, work / f"{name}.log", args, env))
    out = {}
    image, video = media_kwargs(images=[media_dir / "image.png"]), media_kwargs(videos=[media_dir / "moving.mp4"])

    def serve(name: str, server) -> None:
        flush_cache(server.base_url)
        out[name] = {
            "text": generate(server.base_url, prompt(text="Count the objects."))[0],
            "image": generate(server.base_url, prompt("<image>"), **image)[0],
            "video": generate(server.base_url, prompt("<video>"), **video)[0],
            "radix_repeat": generate(server.base_url, prompt("<video>"), **video)[0],
        }
        out[name]["log"] = server.log()

    with running_servers(*launches) as servers:  # each server its own stream of requests
        side_by_side(*(partial(serve, name, server) for name, server in zip(SERVERS, servers, strict=True)))
    return out


@pytest.mark.parametrize("name", list(SERVERS))
def test_the_server_starts_with_sglangs_own_evs_at_its_rate(served, name):
    rate, plugin = SERVERS[name]
    log = served[name]["log"]
    assert EVS_ENABLED.format(rate=rate) in log if rate else "[EVS] enabled" not in log
    assert ("plugin loaded" in log) == plugin
    assert "UnsupportedServerArgsError" not in log


@pytest.mark.parametrize("case", ["text", "image", "video", "radix_repeat"])
def test_bit_identical_without_the_plugin(served, case):
    ours, upstream = served["on"][case], served["off"][case]
    assert ours.output_ids == upstream.output_ids
    assert ours.logprobs == upstream.logprobs and ours.top_logprobs == upstream.top_logprobs
    assert (ours.prompt_tokens, ours.cached_tokens) == (upstream.prompt_tokens, upstream.cached_tokens)


def test_sglangs_evs_pruned_the_video_and_the_requests_cross_chunks(served):
    pruned, unpruned = served["on"], served["unpruned"]
    assert pruned["video"].prompt_tokens < unpruned["video"].prompt_tokens
    assert pruned["image"].prompt_tokens == unpruned["image"].prompt_tokens  # images are never pruned
    assert pruned["video"].prompt_tokens > pruned["text"].prompt_tokens + CHUNK
    assert pruned["radix_repeat"].cached_tokens >= pruned["video"].prompt_tokens - CHUNK
