"""Prefill/decode disaggregation on the CPU route: a PD pair behind sglang-router serves what one server serves.

A prefill server and a decode server (Mooncake over TCP, `testing.server.pd_launches`) behind the router in
PD mode (`testing.router.running_pd_router`), against one plain server with the same flags, started with
them (its own, not the session's: a prompt it had seen would be a radix hit, below). No pruning setting.
The router sends each request to both servers; the decode server tokenizes and processes the media itself
(its M-RoPE positions and delta are its own), receives the prompt's KV and the first token with its
logprobs from the prefill server, and decodes the rest.

A text, an image and a video request give one server's tokens, prompt and cached token counts and
logprobs, bit for bit in the servers' float32: the router in PD mode writes the reply's JSON anew, which
moves some logprobs by one double ulp (2.2e-16), never a float32 value.

A repeat of each is a radix hit on both (every prompt token but the last), and equal to 1e-4, not bitwise:
under the overlap scheduler one server's first decode step still reads the last prompt token's KV as this
request's prefill wrote it, and from its second step on the radix cache's copy of it (the insert that
dedups it runs after that step was launched); the prefill server sends the radix cache's copy (the same
insert runs before its send), so the decode server reads that copy at every step. With
`--disable-overlap-schedule` both read the copy, and the repeats are bit-identical too (checked by hand).
"""

import numpy as np
import pytest

from sglang_evs.testing import media
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.requests import IMAGE, VIDEO, Generation, chat_prompt, flush_cache, generate, media_kwargs
from sglang_evs.testing.router import running_pd_router
from sglang_evs.testing.server import Launch, pd_launches, running_servers

pytestmark = pytest.mark.slow

SERVER_ARGS = ["--dtype", "float32"]
CASES = ("text", "image", "video")
TOLERANCE = 1e-4  # the repeats (module docstring)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pd_media")
    return {
        "image": media.write_image(out / "image.png", seed=48),
        "video": media.write_clip(out / "moving.mp4", "moving", num_frames=8, fps=4, seed=48),
    }


def cases(files: dict) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Which server decodes this?"), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[files["image"]])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[files["video"]])),
    }


@pytest.fixture(scope="module")
def served(tiny_model_dir, files, tmp_path_factory) -> dict:
    """Each case through the pair and from one server, then each once more (radix hits): name -> replies.
    Both start from an empty radix cache: SGLang's warm-up is a chat request with an image on a plain server
    (its template's first tokens stay cached) and four token ids on a prefill server."""
    folder = tmp_path_factory.mktemp("pd")
    pd = pd_launches(tiny_model_dir, folder, SERVER_ARGS)
    one = Launch(tiny_model_dir, folder / "one.log", SERVER_ARGS)
    out: dict = {"pair": {}, "single": {}, "pair_again": {}, "single_again": {}}
    with (
        running_servers(pd.prefill, pd.decode, one) as (prefill, decode, single),
        running_pd_router(prefill, decode, pd.bootstrap_port, folder / "router.log") as router,
    ):
        flush_cache(prefill.base_url)
        flush_cache(single.base_url)
        for again in ("", "_again"):
            for name, (prompt, kwargs) in cases(files).items():
                out[f"pair{again}"][name] = generate(router.base_url, prompt, max_new_tokens=6, **kwargs)[0]
                out[f"single{again}"][name] = generate(single.base_url, prompt, max_new_tokens=6, **kwargs)[0]
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
    assert len(got.output_ids) == 6 and got.prompt_tokens > (60 if name != "text" else 10)


@pytest.mark.parametrize("name", CASES)
def test_a_repeat_is_a_radix_hit_on_the_prefill_server_and_serves_what_one_server_serves(served, name):
    got, want = served["pair_again"][name], served["single_again"][name]
    assert got.cached_tokens == want.cached_tokens == got.prompt_tokens - 1, name
    assert_same_generation(got, want, TOLERANCE, name)
