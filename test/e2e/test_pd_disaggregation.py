"""Prefill/decode disaggregation on the CPU route: a PD pair behind sglang-router serves what one server serves,
pruned videos included, and a mixed fleet fails a pruned request by name.

Prefill and decode servers (Mooncake over TCP, `testing.server.pd_launches`) behind the router in PD mode
(`testing.router.running_pd_router`), against one plain plugin server with the same flags, started with
them (its own, not the session's: a prompt it had seen would be a radix hit). Tiny Qwen3-VL, float32. The
router sends each request to both servers of a pair; the decode server tokenizes and processes the media
itself (with the plugin: the pruning processor, so its prompt, length and M-RoPE delta are the prefill's,
`pruning/prefill_decode.py` checks it), receives the prompt's KV and the first token with its logprobs from
the prefill server, and decodes the rest at positions from its own delta, never running the vision tower.

The fleet, started at once: a prefill server with EVS q = .5 as its default and 29-token prefill chunks,
its decode server (same setting), a second pair with VidCom2 q = .5 as the default, a decode server without
the plugin (`SGLANG_PLUGINS=none`), and one plain plugin server (EVS q = .5, 29-token chunks) for reference;
upstream's own pair (a prefill server without the plugin, the same flags, in front of that decode server)
and one upstream server; a prefill server at `--tp-size 2`; an encoder server (`--encoder-only`) and a
`--language-only` prefill server over it. The last two prefill servers send to the EVS decode server (one
decode server serves several prefill servers, each pair behind a router of its own). The plugin's first
prefill and decode servers are traced with positions (`SGLANG_EVS_TRACE_POSITIONS`).

- The server's default applies to `/generate` (sglang-router 0.3.2 drops its `mm_processor_kwargs`): a
  text, an image and a pruned video give one server's tokens, prompt and cached token counts and logprobs,
  bit for bit in the servers' float32 (the router in PD mode writes the reply's JSON anew, which moves
  some logprobs by one double ulp, 2.2e-16, never a float32 value); VidCom2 as the default too.
- A repeat of each is a radix hit on both (every prompt token but the last), equal to 1e-4, not bitwise:
  under the overlap scheduler one server's first decode step still reads the last prompt token's KV as
  this request's prefill wrote it, and from its second step on the radix cache's copy of it (the insert
  that dedups it runs after that step was launched); the prefill server sends the radix cache's copy (the
  same insert runs before its send), so the decode server reads that copy at every step. With
  `--disable-overlap-schedule` both read the copy, and the repeats are bit-identical too (checked by hand).
- A request's own setting rides in a chat request's `chat_template_kwargs` (the field the router forwards):
  EVS and VidCom2 at q = .75 and q = 0, each equal to one server's answer to the same chat request.
- 8 concurrent mixed chat requests (text, image, a video at the default and at q = .75) give one server's
  answers and prompt lengths.
- Every forward of a pruned video is at the rule's positions: the prefill server's 29-token chunks (the
  unpruned positions with the pruned rows deleted), and every decode step on the decode server (its index
  plus the unpruned delta plus the pruned count); the same check fails a decode that kept the unpruned delta.
- A mixed fleet fails a pruned request by name, through the router, and serves on: a decode server without
  the plugin (found by the prefill server: the decode's KV allocation is the unpruned prompt's), and one
  with another setting whose prompt has the same length and delta (found by the decode server's check of
  the prefill's layout: VidCom2 and EVS keep as many tokens at one rate).

- At q = 0 (text and an image, and a video at a chat request's q = 0) the plugin's pair is upstream's pair
  with the same flags, every double of the reply, and one upstream server in float32; a radix repeat of
  each is again upstream's pair, and as far from one upstream server as upstream's pair is (the overlap
  scheduler's gap above, 4.8e-7 to 9.5e-7 measured).
- A prefill server at `--tp-size 2` in front of a decode server at tp 1 (Mooncake sends each rank's KV
  heads into the decode server's full rows) serves text, an image and a pruned video as one server: the
  same tokens and prompt, logprobs 6e-7 to 1.6e-6 apart (the prefill's all-reduce sums in another order).
- Encoder, prefill and decode (SGLang's EPD layout): the encoder prunes and sends the kept rows, the
  `--language-only` prefill server lays them out, the decode server lays the same prompt out from the media
  itself; text, an image and the video at the default and at a chat request's own settings are one server's
  answers bit for bit in float32.

First, a Qwen3.5 pair and a GLM-4.1V pair each serve one pruned video as one server of theirs; their servers
stop before the Qwen3-VL fleet starts (fewer servers at once on the 2-core machine).
"""

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.testing import media, pinned_masks, workload
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.held import assert_nothing_held
from sglang_evs.testing.hf_reference import expected_positions, rule_positions
from sglang_evs.testing.requests import (
    GLM4V_VIDEO,
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    flush_cache,
    generate,
    glm4v_chat_prompt,
    media_kwargs,
    per_request_rate,
    pruning_setting,
)
from sglang_evs.testing.router import PdPair, running_pd_router, running_pd_routers
from sglang_evs.testing.server import (
    Launch,
    RunningServer,
    free_port,
    local_url,
    mooncake_missing,
    pd_decode_launch,
    pd_launches,
    running_servers,
)

MOONCAKE_MISSING = mooncake_missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))]

RATE = 0.5  # the servers' default rate (EVS on one pair and the reference, VidCom2 on the other pair)
CHUNK = 29  # prefill chunk size: cuts the video's groups and the text around them


def server_args(method: str) -> list[str]:
    setting = json.dumps(pruning_setting(RATE, method))
    return ["--dtype", "float32", "--json-model-override-args", setting, "--chunked-prefill-size", str(CHUNK)]


CASES = ("text", "image", "video")
TOLERANCE = 1e-4  # the repeats (module docstring); the per-request and concurrent ones measured far below
MAX_NEW_TOKENS = 6


def traced(path: Path) -> dict[str, str]:
    return {trace.ENV: str(path), trace.POSITIONS_ENV: "1"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pd_media")
    return {
        "image": media.write_image(out / "image.png", seed=48),
        "video": media.write_clip(out / "moving.mp4", "moving", num_frames=16, fps=4, seed=48),
        "unseen": media.write_clip(out / "unseen.mp4", "moving", num_frames=16, fps=4, seed=49),
        "tp2": media.write_clip(out / "tp2.mp4", "moving", num_frames=16, fps=4, seed=50),  # the TP = 2 pair's alone
        "mixed": workload.write_media(out / "mixed", clips=2, images=2),
    }


def cases(files: dict) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Which server decodes this?"), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[files["image"]])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[files["video"]])),
    }


# --- other families: Qwen3.5 (its linear-attention state crosses too) and GLM-4.1V (GLM's own processor) ---
# First in the module: their six servers stop before the Qwen3-VL fleet's six start.

HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}  # as every float32 Qwen3.5 server here (test_hybrid_families)
GLM_SIDE = 112  # 4 x 4 tokens per temporal group


@pytest.fixture(scope="module")
def families(tiny_qwen3_5_dir, tiny_glm4v_dir, tmp_path_factory) -> dict[str, tuple[Generation, Generation]]:
    """One pruned video (the pairs' default, EVS q = .5) through a Qwen3.5 pair and a GLM-4.1V pair and from
    one server of each, from empty caches: family -> (pair's reply, one server's)."""
    folder = tmp_path_factory.mktemp("pd_families")
    qwen_clip = media.write_clip(folder / "moving.mp4", "moving", num_frames=16, fps=4, seed=48)
    glm_clip = media.write_clip(folder / "glm.mp4", "moving", num_frames=24, fps=4, seed=5, height=GLM_SIDE,
                                width=GLM_SIDE)  # fmt: skip
    requests_of = {
        "Qwen3.5": (chat_prompt(VIDEO), media_kwargs(videos=[qwen_clip])),
        "GLM-4.1V": (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[glm_clip])),
    }
    launches = []
    for name, model, env in (("qwen3_5", tiny_qwen3_5_dir, HYBRID_ENV), ("glm4v", tiny_glm4v_dir, None)):
        (folder / name).mkdir()
        pd = pd_launches(model, folder / name, server_args("evs"), env)
        launches.append((pd, Launch(model, folder / name / "one.log", server_args("evs"), env)))
    (qwen, qwen_one), (glm, glm_one) = launches
    out = {}
    with running_servers(qwen.prefill, qwen.decode, qwen_one, glm.prefill, glm.decode, glm_one) as servers:
        for (family, (prompt, kwargs)), (pd, (prefill, decode, one)) in zip(
            requests_of.items(), ((qwen, servers[:3]), (glm, servers[3:])), strict=True
        ):
            with running_pd_router(prefill, decode, pd.bootstrap_port, folder / f"router-{family}.log") as router:
                empty_caches(prefill, one)
                out[family] = tuple(generate(url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
                                    for url in (router.base_url, one.base_url))  # fmt: skip
    return out


@pytest.mark.parametrize("family", ["Qwen3.5", "GLM-4.1V"])
def test_a_pruned_video_through_a_pair_of_another_family_serves_what_one_server_serves(families, family):
    got, want = families[family]
    assert_same_generation(got, want, TOLERANCE, family)
    assert got.cached_tokens == want.cached_tokens == 0
    assert got.meta["video_tokens_after_pruning"] * 2 == got.meta["video_tokens_before_pruning"]


class Fleet(NamedTuple):
    one: RunningServer  # the reference: one plugin server, EVS q = .5 by default
    prefill: RunningServer  # EVS q = .5
    vidcom2_prefill: RunningServer  # VidCom2 q = .5
    evs: RunningServer  # router: prefill + its decode server (EVS q = .5)
    vidcom2: RunningServer  # router: vidcom2_prefill + a decode server with VidCom2 q = .5
    without_plugin: RunningServer  # router: prefill + a decode server without the plugin
    other_setting: RunningServer  # router: prefill (EVS) + the VidCom2 decode server
    prefill_trace: Path
    decode_trace: Path
    upstream_one: RunningServer  # one server without the plugin, the same flags
    upstream_prefill: RunningServer  # a prefill server without the plugin, the same flags
    upstream: RunningServer  # router: upstream_prefill + the decode server without the plugin (upstream's pair)
    tp2_prefill: RunningServer  # EVS q = .5, --tp-size 2
    tp2: RunningServer  # router: tp2_prefill + the EVS decode server (tp 1)
    language_prefill: RunningServer  # EVS q = .5, --language-only over the encoder server
    epd: RunningServer  # router: language_prefill + the EVS decode server
    encoder_trace: Path


UPSTREAM = {"SGLANG_PLUGINS": "none"}  # SGLang loads no plugin in this server
# The reference server prunes a video these name by the mask the TP = 2 prefill server decided for it (its trace)
PINNED, TP2_TRACE = "pinned-masks.json", "tp2-prefill.jsonl"


def epd_launches(model, folder: Path, args: list[str], encoder_trace: Path) -> tuple[Launch, Launch, int]:
    """An encoder server (`--encoder-only`, no pruning default of its own: it prunes as each request asks)
    and a `--language-only` prefill server over it, started together: the language server reads its
    encoders' URLs per request, so the encoder's port is chosen here; its encoder health probes are off so
    that an encoder still loading is not evicted from its list. And the prefill's bootstrap port."""
    encoder_port = free_port()
    encoder = Launch(model, folder / "encoder.log", ["--dtype", "float32", "--encoder-only"],
                     {trace.ENV: str(encoder_trace)}, port=encoder_port)  # fmt: skip
    language_args = [*args, "--language-only", "--encoder-urls", local_url(encoder_port),
                     "--encoder-bootstrap-port", str(free_port())]  # fmt: skip
    (folder / "epd").mkdir()
    pd = pd_launches(model, folder / "epd", language_args, {"SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL": "0"})
    return encoder, pd.prefill, pd.bootstrap_port


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    """The module's Qwen3-VL servers, started together: the EVS pair (traced) and the reference, a VidCom2
    pair, a decode server without the plugin, upstream's own pair (that decode server behind a prefill
    server without the plugin) and one upstream server, a `--tp-size 2` prefill server and an encoder with a
    `--language-only` prefill server (both for the EVS decode server, which serves several prefill servers
    as SGLang's decode servers do)."""
    folder = tmp_path_factory.mktemp("pd")
    prefill_trace, decode_trace, encoder_trace = (folder / f"{name}.jsonl" for name in ("prefill", "decode", "encoder"))
    evs, vidcom2 = server_args("evs"), server_args("vidcom2")
    pd = pd_launches(tiny_model_dir, folder, evs, traced(prefill_trace))
    decode = pd_decode_launch(tiny_model_dir, folder / "decode.log", evs, traced(decode_trace))
    (folder / "vidcom2").mkdir()
    pd_vidcom2 = pd_launches(tiny_model_dir, folder / "vidcom2", vidcom2)
    without_plugin = pd_decode_launch(tiny_model_dir, folder / "no-plugin.log", evs, UPSTREAM)
    one = Launch(tiny_model_dir, folder / "one.log", evs, pinned_masks.server_env(folder / PINNED))
    upstream_one = Launch(tiny_model_dir, folder / "upstream-one.log", evs, UPSTREAM)
    (folder / "upstream").mkdir()
    upstream = pd_launches(tiny_model_dir, folder / "upstream", evs, UPSTREAM)
    (folder / "tp2").mkdir()
    tp2 = pd_launches(tiny_model_dir, folder / "tp2", [*evs, "--tp-size", "2"], traced(folder / TP2_TRACE))
    encoder, language, language_bootstrap = epd_launches(tiny_model_dir, folder, evs, encoder_trace)
    launches = (one, pd.prefill, decode, pd_vidcom2.prefill, pd_vidcom2.decode, without_plugin, upstream_one,
                upstream.prefill, tp2.prefill, encoder, language)  # fmt: skip
    with running_servers(*launches) as servers:
        single, prefill, evs_decode, vidcom2_prefill, vidcom2_decode, plain, upstream_single = servers[:7]
        upstream_prefill, tp2_prefill, _, language_prefill = servers[7:]
        pairs = (
            PdPair(prefill, pd.bootstrap_port, evs_decode, folder / "router.log"),
            PdPair(vidcom2_prefill, pd_vidcom2.bootstrap_port, vidcom2_decode, folder / "router2.log"),
            PdPair(prefill, pd.bootstrap_port, plain, folder / "router-no-plugin.log"),
            PdPair(prefill, pd.bootstrap_port, vidcom2_decode, folder / "router-mixed.log"),
            PdPair(upstream_prefill, upstream.bootstrap_port, plain, folder / "router-upstream.log"),
            PdPair(tp2_prefill, tp2.bootstrap_port, evs_decode, folder / "router-tp2.log"),
            PdPair(language_prefill, language_bootstrap, evs_decode, folder / "router-epd.log"),
        )
        with running_pd_routers(*pairs) as routers:
            evs_pair, vidcom2_pair, without, mixed, upstream_pair, tp2_pair, epd = routers
            yield Fleet(
                single, prefill, vidcom2_prefill, evs_pair, vidcom2_pair, without, mixed, prefill_trace, decode_trace,
                upstream_single, upstream_prefill, upstream_pair, tp2_prefill, tp2_pair, language_prefill, epd,
                encoder_trace,
            )  # fmt: skip


def empty_caches(*servers: RunningServer) -> None:
    for server in servers:
        flush_cache(server.base_url)


@pytest.fixture(scope="module")
def served(fleet, files) -> dict:
    """Each case through the EVS pair and from one server, then each once more (radix hits): name -> replies;
    and the video through the VidCom2 pair. Both start from an empty radix cache: SGLang's warm-up is a chat
    request with an image on a plain server (its template's first tokens stay cached) and four token ids on a
    prefill server."""
    out: dict = {"pair": {}, "single": {}, "pair_again": {}, "single_again": {}}
    empty_caches(fleet.prefill, fleet.one)
    for again in ("", "_again"):
        for name, (prompt, kwargs) in cases(files).items():
            out[f"pair{again}"][name] = generate(fleet.evs.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
            out[f"single{again}"][name] = generate(fleet.one.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
    empty_caches(fleet.vidcom2_prefill, fleet.one)
    prompt, kwargs = cases(files)["video"]
    out["vidcom2_pair"] = generate(fleet.vidcom2.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
    vidcom2 = per_request_rate(RATE, "vidcom2")
    out["vidcom2_single"] = generate(fleet.one.base_url, prompt, MAX_NEW_TOKENS, **kwargs, **vidcom2)[0]
    return out


def in_float32(reply: Generation) -> tuple:
    """A reply as the server computed it: its logprobs are float32 values (they reach the client as doubles)."""
    return (
        reply.output_ids,
        reply.prompt_tokens,
        reply.cached_tokens,
        [np.float32(value) for value in reply.logprobs],
        [[(np.float32(value), token) for value, token in step] for step in reply.top_logprobs],
    )


@pytest.mark.parametrize("name", CASES)
def test_the_pair_behind_the_router_serves_what_one_server_serves_bit_for_bit(served, name):
    got, want = served["pair"][name], served["single"][name]
    assert in_float32(got) == in_float32(want), name
    assert len(got.output_ids) == MAX_NEW_TOKENS and got.prompt_tokens > (60 if name != "text" else 10)


def test_the_servers_default_prunes_the_video_on_both_servers_of_a_pair(served):
    for video, method in ((served["pair"]["video"], "evs"), (served["vidcom2_pair"], "vidcom2")):
        assert (video.meta["video_pruning_method"], video.meta["video_pruning_rate"]) == (method, RATE)
        assert video.meta["video_tokens_after_pruning"] * 2 == video.meta["video_tokens_before_pruning"] == 400
    assert in_float32(served["vidcom2_pair"]) == in_float32(served["vidcom2_single"])


@pytest.mark.parametrize("name", CASES)
def test_a_repeat_is_a_radix_hit_on_the_prefill_server_and_serves_what_one_server_serves(served, name):
    got, want = served["pair_again"][name], served["single_again"][name]
    assert got.cached_tokens == want.cached_tokens == got.prompt_tokens - 1, name
    assert_same_generation(got, want, TOLERANCE, name)


# --- a request's own setting, in a chat request -------------------------------------------------------


def chat_body(medium: Path, setting: dict, kind: str = "video_url") -> dict:
    """A greedy chat request on one video (or image: `kind` "image_url") with top-5 logprobs, `setting` in its
    `chat_template_kwargs` (the field the router forwards)."""
    return {
        "model": "default",
        "messages": [{"role": "user", "content": [
            {"type": kind, kind: {"url": f"file://{medium}"}}, {"type": "text", "text": "Describe this."},
        ]}],
        "max_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 5,
        **({"chat_template_kwargs": setting} if setting else {}),
    }  # fmt: skip


def chat(base_url: str, medium: Path, setting: dict, kind: str = "video_url") -> Generation:
    """`chat_body`'s reply as a `Generation` whose "ids" are the tokens as the reply spells them (text and bytes:
    chat replies carry no ids)."""
    response = requests.post(f"{base_url}/v1/chat/completions", json=chat_body(medium, setting, kind), timeout=300)
    response.raise_for_status()
    reply = response.json()
    steps = reply["choices"][0]["logprobs"]["content"]
    usage = reply["usage"]
    return Generation(
        output_ids=[(step["token"], tuple(step["bytes"] or ())) for step in steps],
        logprobs=[step["logprob"] for step in steps],
        top_logprobs=[[(top["logprob"], top["token"]) for top in step["top_logprobs"]] for step in steps],
        prompt_tokens=usage["prompt_tokens"],
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        meta=usage,
    )


PER_REQUEST = {  # name -> the chat request's setting (over the pair's default, EVS q = .5)
    "evs q=.75": pruning_setting(0.75, "evs"),
    "vidcom2 q=.75": pruning_setting(0.75, "vidcom2"),
    "q=0": pruning_setting(0.0),
}


@pytest.fixture(scope="module")
def per_request(fleet, files, served) -> dict[str, tuple[Generation, Generation]]:
    """Each per-request setting through the EVS pair and from one server, each from an empty cache."""
    out = {}
    for name, setting in PER_REQUEST.items():
        empty_caches(fleet.prefill, fleet.one)
        out[name] = (
            chat(fleet.evs.base_url, files["video"], setting),
            chat(fleet.one.base_url, files["video"], setting),
        )
    return out


@pytest.mark.parametrize("name", PER_REQUEST)
def test_a_requests_own_setting_through_the_pair_serves_what_one_server_serves(per_request, name):
    got, want = per_request[name]
    assert_same_generation(got, want, TOLERANCE, name)
    assert len(got.output_ids) == MAX_NEW_TOKENS
    unpruned = per_request["q=0"][0].prompt_tokens
    assert got.prompt_tokens == unpruned - (300 if "q=.75" in name else 0)  # 400 video tokens, 100 kept


IMAGE_SETTINGS = {  # name -> the chat request's image setting (the pair prunes no image by default)
    "dart q=.75": {"image_pruning_rate": 0.75, "image_pruning_method": "dart"},
    "divprune q=.5": {"image_pruning_rate": 0.5},
    "q=0": {"image_pruning_rate": 0.0},
}
KEPT_OF_64 = {"dart q=.75": 16, "divprune q=.5": 32, "q=0": 64}  # the 64-token image


@pytest.fixture(scope="module")
def per_request_images(fleet, files, served) -> dict[str, tuple[Generation, Generation]]:
    """The image at each setting through the EVS pair and from one server, each from an empty cache."""
    out = {}
    for name, setting in IMAGE_SETTINGS.items():
        empty_caches(fleet.prefill, fleet.one)
        out[name] = tuple(
            chat(server.base_url, files["image"], setting, "image_url") for server in (fleet.evs, fleet.one)
        )
    return out


@pytest.mark.parametrize("name", IMAGE_SETTINGS)
def test_a_requests_own_image_setting_through_the_pair_serves_what_one_server_serves(per_request_images, name):
    """Both servers of the pair prune the image as the request asks (the decode server checks the prefill's image
    setting beside the videos'), and the pair serves what one server serves."""
    got, want = per_request_images[name]
    assert_same_generation(got, want, TOLERANCE, name)
    assert got.prompt_tokens == per_request_images["q=0"][0].prompt_tokens - (64 - KEPT_OF_64[name])
    assert got.meta["prompt_tokens_details"]["image_tokens"] == KEPT_OF_64[name]


def test_8_concurrent_mixed_requests_through_the_pair_match_one_server(fleet, files, served):
    batch = workload.mixed_requests(files["mixed"], 8, video_rates=(None, 0.75))
    empty_caches(fleet.prefill, fleet.one)
    routed = workload.send_concurrently(fleet.evs.base_url, batch, sender=workload.send_chat)
    alone = workload.send_concurrently(fleet.one.base_url, batch, sender=workload.send_chat)
    assert not [r.name for r, out in zip(batch, routed, strict=True) if isinstance(out, Exception)], routed
    for request, through, one in zip(batch, routed, alone, strict=True):
        assert through == one, request.name  # the answer and the prompt length
    by_kind = {request.kind: reply.prompt_tokens for request, reply in zip(batch, routed, strict=True)}
    assert by_kind["video q=0.75"] < by_kind["video"]  # each video request's own rate, or the server's


# --- positions: the prefill's chunks and every decode step, against the rule ---------------------------


class TracedRequest(NamedTuple):
    reply: Generation
    prefill: list[dict]  # the prefill server's rope_positions events of the request (its chunks)
    decode: list[dict]  # the decode server's (its decode steps)
    kept: list[int]  # the keep-mask (kept pad indices), traced where the video was encoded: the prefill server


@pytest.fixture(scope="module")
def traced_request(fleet, files, served) -> TracedRequest:
    """An unseen clip at the pair's default (EVS q = .5) through the router, alone on both servers."""
    prompt, kwargs = chat_prompt(VIDEO), media_kwargs(videos=[files["unseen"]])
    before = {path: len(trace.read(path, "rope_positions")) for path in (fleet.prefill_trace, fleet.decode_trace)}
    reply = generate(fleet.evs.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
    events = {path: trace.read(path, "rope_positions")[count:] for path, count in before.items()}
    kept = trace.read(fleet.prefill_trace, "keep_mask")[-1]["kept"]
    return TracedRequest(reply, events[fleet.prefill_trace], events[fleet.decode_trace], kept)


def assert_at_the_rules_positions(events: list[dict], rule: torch.Tensor, offset: int) -> None:
    for event in events:
        want = expected_positions(event, rule, offset)
        assert torch.equal(torch.tensor(event["positions"]), want), f"{event['mode']} at seq_len {event['seq_lens']}"


@pytest.fixture(scope="module")
def rule(tiny_model_dir, files, traced_request) -> tuple[torch.Tensor, int]:
    return rule_positions(str(tiny_model_dir), str(files["unseen"]), tuple(traced_request.kept))


def test_every_prefill_chunk_and_decode_step_of_a_pruned_video_is_at_the_rules_positions(traced_request, rule):
    positions, offset = rule
    reply, prefill, decode, _ = traced_request
    assert reply.prompt_tokens == positions.shape[1] and reply.cached_tokens < 20  # the template's text only
    assert offset == int(positions.max()) + 1 - positions.shape[1]  # decode continues after the unpruned prompt
    assert {event["mode"] for event in prefill} == {"EXTEND"} and {event["mode"] for event in decode} == {"DECODE"}
    assert max(event["rows"] for event in prefill) <= CHUNK < reply.prompt_tokens
    assert sum(event["rows"] for event in prefill) == reply.prompt_tokens - reply.cached_tokens
    assert len(decode) >= MAX_NEW_TOKENS - 1  # the first token is the prefill's
    assert_at_the_rules_positions(prefill, positions, offset)
    assert_at_the_rules_positions(decode, positions, offset)


def test_the_check_fails_a_decode_server_that_kept_the_unpruned_delta(traced_request, rule):
    """The broken copy: the decode steps at the positions a decode server would compute from the unpruned
    delta (what upstream's processor gives it, and a decode side that lost the pruned count): each one
    `pruned` lower. (The handshake refuses such a server first: `test/pruning/test_prefill_decode.py`.)"""
    positions, offset = rule
    pruned = (
        traced_request.reply.meta["video_tokens_before_pruning"]
        - traced_request.reply.meta["video_tokens_after_pruning"]
    )
    broken = [{**event, "positions": (torch.tensor(event["positions"]) - pruned).tolist()} for event in
              traced_request.decode]  # fmt: skip
    with pytest.raises(AssertionError, match="DECODE at seq_len"):
        assert_at_the_rules_positions(broken, positions, offset)


# --- a mixed fleet ---------------------------------------------------------------------------------------


def refused(base_url: str, prompt: str, kwargs: dict) -> tuple[int, str]:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}, **kwargs}
    response = requests.post(f"{base_url}/generate", json=body, timeout=300)
    assert response.status_code != 200, response.text[:500]
    return response.status_code, response.json()["error"]["message"]


def test_a_decode_server_without_the_plugin_fails_a_pruned_request_by_name_and_serves_on(fleet, files, served):
    prompt, kwargs = cases(files)["video"]
    status, message = refused(fleet.without_plugin.base_url, prompt, kwargs)
    # the decode server's error (the one the router returns), with the prefill server's reason
    assert status == 500 and message.startswith("Decode transfer failed for request"), message
    assert (
        "sglang-evs: request " in message
        and " has 256 tokens, M-RoPE delta " in message
        and ", videos pruned by evs at 0.5 on this prefill server, 256 KV pages to send, but decode server " in message
        and " allocated 456: it laid the prompt out differently (another pruning setting, or no "
        "sglang-evs, which does not prune); both servers must run sglang-evs with the same video pruning "
        "setting (video_pruning_method, video_pruning_rate) and image pruning setting (image_pruning_method, "
        "image_pruning_rate)"
        in message
    ), message
    for name in ("text", "image"):  # what neither prunes, through the same pair
        prompt, kwargs = cases(files)[name]
        assert len(generate(fleet.without_plugin.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0].output_ids) == 6
    prompt, kwargs = cases(files)["video"]  # and the pruned video through the prefill server's own pair
    assert (
        generate(fleet.evs.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0].output_ids
        == served["pair"]["video"].output_ids
    )
    # last (a second failure opens the router's circuit to the prefill server): a pruned image, which the decode
    # server without the plugin lays out whole
    body = chat_body(files["image"], IMAGE_SETTINGS["dart q=.75"], "image_url")
    response = requests.post(f"{fleet.without_plugin.base_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 500 and "images pruned by dart at 0.75 on this prefill server" in response.text


def test_a_decode_server_with_another_setting_fails_a_pruned_request_by_name_and_serves_on(fleet, files):
    """EVS and VidCom2 at q = .5 keep as many tokens: the same prompt length, delta and KV allocation, so
    only the decode server's check of the prefill's layout tells them apart."""
    prompt, kwargs = cases(files)["video"]
    status, message = refused(fleet.other_setting.base_url, prompt, kwargs)
    assert status == 400, message  # the plugin's own abort: not retried by the router
    assert message.startswith("sglang-evs: request ") and message.endswith(
        " was laid out differently by the two servers: the prefill server's prompt has 256 tokens, M-RoPE "
        "delta -160, videos pruned by evs at 0.5, this decode server's 256 tokens, M-RoPE delta -160, videos "
        "pruned by vidcom2 at 0.5; both servers must run sglang-evs with the same video pruning setting "
        "(video_pruning_method, video_pruning_rate) and image pruning setting (image_pruning_method, "
        "image_pruning_rate)"
    ), message
    prompt, kwargs = cases(files)["text"]
    assert len(generate(fleet.other_setting.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0].output_ids) == 6


# --- q = 0 against upstream: upstream's own pair and one upstream server ------------------------------------

WHO = ("pair", "upstream_pair", "upstream_one")


@pytest.fixture(scope="module")
def at_q0(fleet, files, served) -> dict[tuple[str, bool], dict[str, Generation]]:
    """Text and an image (`/generate`) and a video at q = 0 (a chat request's own setting: the router drops
    `/generate`'s, and the plugin pair's default prunes) through the plugin's pair, upstream's pair and from
    one upstream server, from empty caches, then each once more (a radix hit on every prefill server):
    (case, repeat) -> who -> reply."""
    empty_caches(fleet.prefill, fleet.upstream_prefill, fleet.upstream_one)
    urls = dict(zip(WHO, (fleet.evs.base_url, fleet.upstream.base_url, fleet.upstream_one.base_url), strict=True))

    def ask(url: str, name: str) -> Generation:
        if name == "video":
            return chat(url, files["video"], pruning_setting(0.0))
        prompt, kwargs = cases(files)[name]
        return generate(url, prompt, MAX_NEW_TOKENS, **kwargs)[0]

    return {(name, again): {who: ask(url, name) for who, url in urls.items()}
            for again in (False, True) for name in CASES}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_at_q0_the_pair_is_bit_identical_to_upstreams_pair_and_to_one_upstream_server(at_q0, name):
    replies = at_q0[name, False]
    assert replies["pair"] == replies["upstream_pair"], name  # every double, both through the router's JSON
    assert in_float32(replies["pair"]) == in_float32(replies["upstream_one"]), name
    assert len(replies["pair"].output_ids) == MAX_NEW_TOKENS


@pytest.mark.parametrize("name", CASES)
def test_at_q0_a_radix_repeat_through_the_pair_is_upstreams_pairs(at_q0, name):
    """Bit-identical to upstream's pair; against one upstream server the overlap scheduler's gap of a radix
    repeat (module docstring), which upstream's pair shows alike."""
    replies = at_q0[name, True]
    assert replies["pair"] == replies["upstream_pair"], name
    assert_same_generation(replies["pair"], replies["upstream_one"], TOLERANCE, name)
    if name != "video":  # chat replies report no cached tokens without --enable-cache-report
        assert {reply.cached_tokens for reply in replies.values()} == {replies["pair"].prompt_tokens - 1}


# --- a prefill server at --tp-size 2, its decode server at tp 1 ------------------------------------------------

TP2_TOLERANCE = 1e-4  # the prefill's all-reduce sums two ranks' partial products in another order


@pytest.fixture(scope="module")
def tp2_served(fleet, files, served) -> dict[str, tuple[Generation, Generation]]:
    """Each case at the servers' default (EVS q = .5) through the TP = 2 prefill server and the EVS decode
    server, and from one server, each from empty caches: case -> (pair's reply, one server's); "decisions": the
    keep-mask events the TP = 2 prefill server traced for its video. The video is a clip of its own, and the one
    server prunes it by the mask the pair decided: its nearly static background scores within rounding of 0,
    and a TP = 2 tower rounds such near-ties apart from one rank's (on an AMD EPYC without AVX-512, row 175
    kept where one server keeps row 385), a difference of layouts, not of exactness."""
    folder = Path(fleet.prefill_trace).parent
    tp2_cases = {**cases(files), "video": (chat_prompt(VIDEO), media_kwargs(videos=[files["tp2"]]))}
    out: dict = {}
    for name, (prompt, kwargs) in tp2_cases.items():
        empty_caches(fleet.tp2_prefill, fleet.one)
        decided = len(trace.read(folder / TP2_TRACE, "keep_mask"))
        pair = generate(fleet.tp2.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
        if name == "video":
            out["decisions"] = trace.read(folder / TP2_TRACE, "keep_mask")[decided:]
            (folder / PINNED).write_text(json.dumps({str(e["item"]): e["kept"] for e in out["decisions"]}))
        out[name] = pair, generate(fleet.one.base_url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
    return out


@pytest.mark.parametrize("name", CASES)
def test_a_tp2_prefill_server_with_a_tp1_decode_server_serves_what_one_server_serves(tp2_served, name):
    got, want = tp2_served[name]
    assert_same_generation(got, want, TP2_TOLERANCE, name)
    assert got.cached_tokens == want.cached_tokens
    if name == "video":
        assert got.meta["video_tokens_after_pruning"] * 2 == got.meta["video_tokens_before_pruning"] == 400


def test_the_tp2_prefill_server_decides_each_videos_mask_once_at_both_ranks(tp2_served):
    """One decision per rank for the video prefilled in 29-token chunks (rank 0's at both), not one per chunk:
    a mask decided per chunk could differ between chunks of one request and from the mask the reference was given."""
    decisions = tp2_served["decisions"]
    assert len(decisions) == 2 and len({e["item"] for e in decisions}) == 1, decisions
    assert decisions[0]["kept"] == decisions[1]["kept"] and len(decisions[0]["kept"]) == 200


# --- encoder, prefill and decode: the encoder prunes, the PD pair serves the kept rows ------------------------


@pytest.fixture(scope="module")
def epd_served(fleet, files, served) -> dict:
    """Each case at the servers' default (EVS q = .5) and the video at a chat request's own settings, through
    the encoder, the `--language-only` prefill server and the EVS decode server, and from one server, each
    from empty caches: case -> (the router's reply, one server's); "sent": what the encoder sent for the
    cases (it encodes for nothing else; its trace starts with its first request)."""
    out: dict = {}
    for name, (prompt, kwargs) in cases(files).items():
        empty_caches(fleet.language_prefill, fleet.one)
        out[name] = tuple(generate(url, prompt, MAX_NEW_TOKENS, **kwargs)[0]
                          for url in (fleet.epd.base_url, fleet.one.base_url))  # fmt: skip
    out["sent"] = trace.read(fleet.encoder_trace, "encoder_sent")
    for name, setting in PER_REQUEST.items():
        empty_caches(fleet.language_prefill, fleet.one)
        out[name] = tuple(chat(url, files["video"], setting) for url in (fleet.epd.base_url, fleet.one.base_url))
    return out


@pytest.mark.parametrize("name", [*CASES, *PER_REQUEST])
def test_encoder_prefill_and_decode_servers_serve_what_one_server_serves_bit_for_bit(epd_served, name):
    """The same tokens, prompt tokens and logprobs in float32 (the router's JSON moves doubles by an ulp):
    the encoder's rows are the one server's tower's, and the language server lays them out at its positions."""
    got, want = epd_served[name]
    assert in_float32(got) == in_float32(want), name
    assert len(got.output_ids) == MAX_NEW_TOKENS


def test_the_encoder_sends_only_the_kept_rows_of_a_pruned_video(epd_served):
    """The image and the video went to the encoder (a text request does not): the video's 400 rows pruned
    to 200 at the default there, never sent whole."""
    rows = {event["modality"]: event["rows"] for event in epd_served["sent"]}
    assert rows["VIDEO"] == epd_served["video"][0].meta["video_tokens_after_pruning"] == 200
    assert rows["IMAGE"] > 0


def test_no_server_of_the_pair_holds_a_videos_rows_once_its_requests_are_answered(fleet, served, tp2_served):
    """The prefill servers let go of every video they held for their later chunks (`pruning/holds.py`), and the
    decode server, which runs no tower, never held one."""
    folder = Path(fleet.prefill_trace).parent
    for path in (fleet.prefill_trace, folder / TP2_TRACE):
        assert_nothing_held(path)
    assert not trace.read(fleet.decode_trace, "video_held")
