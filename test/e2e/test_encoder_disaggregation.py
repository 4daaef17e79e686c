"""Encoder disaggregation with the plugin: an `--encoder-only` server encodes for a `--language-only` one.

At q = 0 the pair serves as one plugin server does: the same greedy tokens and logprobs for a video and
an image, with the encoder server doing the encoding. Video pruning cannot run there (the language
server gets the encoder's embeddings unpruned and lays the prompt out from the grid alone), so a
server-wide setting stops either role at startup, and a request that asks for pruning gets HTTP 400
before anything is sent to an encoder, while the pair serves on.
"""

import pytest
import requests

from sglang_evs.testing import media
from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt, generate, media_kwargs
from sglang_evs.testing.server import run_to_exit, running_server

pytestmark = pytest.mark.slow

SERVER_ARGS = ["--dtype", "float32"]
REFUSED = "is not supported with encoder disaggregation ({role})"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("epd_media")
    return {
        "video": media.write_clip(out / "clip.mp4", "moving", num_frames=16, fps=4, seed=5),
        "image": media.write_image(out / "image.png", seed=6),
    }


def answers(base_url: str, files: dict, **extra) -> dict:
    return {
        "video": generate(base_url, chat_prompt(VIDEO), **media_kwargs(videos=[files["video"]]), **extra)[0],
        "image": generate(base_url, chat_prompt(IMAGE), **media_kwargs(images=[files["image"]]), **extra)[0],
    }


@pytest.fixture(scope="module")
def single(tiny_server, files) -> dict:
    return answers(tiny_server.base_url, files)


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("epd_pair")
    with running_server(tiny_model_dir, folder / "encoder.log", [*SERVER_ARGS, "--encoder-only"]) as encoder:
        language_args = [*SERVER_ARGS, "--language-only", "--encoder-urls", encoder.base_url]
        with running_server(tiny_model_dir, folder / "language.log", language_args) as language:
            yield encoder, language


def test_at_q0_the_pair_serves_as_one_server(pair, single, files):
    encoder, language = pair
    served = answers(language.base_url, files)
    for name, one in single.items():
        assert served[name].output_ids == one.output_ids, name
        assert served[name].prompt_tokens == one.prompt_tokens, name
        assert served[name].logprobs == pytest.approx(one.logprobs, abs=1e-5), name
    encoded = encoder.log()
    assert "/encode completed" in encoded and "modality=VIDEO" in encoded and "modality=IMAGE" in encoded


def test_a_request_asking_for_pruning_gets_400_and_the_pair_serves_on(pair, single, files, tmp_path):
    encoder, language = pair
    fresh = media.write_image(tmp_path / "fresh.png", seed=77)  # new pixels: the encoder must encode them
    generate(language.base_url, chat_prompt(IMAGE), **media_kwargs(images=[fresh]), max_new_tokens=1)
    encodes_before = encoder.log().count("/encode completed")
    assert encodes_before > 0  # the log counts encodes: an unchanged count below means nothing was sent
    with pytest.raises(RuntimeError, match=r"answered 400.*video_pruning_rate=0\.5.*" + r"\(--language-only\)"):
        answers(language.base_url, files, mm_processor_kwargs={"video_pruning_rate": 0.5})
    chat = {
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{files['video']}"}}, {"type": "text", "text": "hi"},
        ]}],
        "max_tokens": 4,
        # the field sglang-router forwards
        "chat_template_kwargs": {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75},
    }  # fmt: skip
    refused = requests.post(f"{language.base_url}/v1/chat/completions", json=chat, timeout=120)
    assert refused.status_code == 400
    assert "video_pruning_rate=0.75: video pruning (vidcom2)" in refused.text
    assert REFUSED.format(role="--language-only") in refused.text
    assert encoder.log().count("/encode completed") == encodes_before  # nothing was sent to the encoder
    assert answers(language.base_url, files)["video"].output_ids == single["video"].output_ids


@pytest.mark.parametrize(
    "role_args",
    [["--encoder-only"], ["--language-only", "--encoder-urls", "http://127.0.0.1:9"]],
    ids=["encoder-only", "language-only"],
)
def test_a_server_wide_setting_stops_either_role_at_startup(tiny_model_dir, role_args):
    done = run_to_exit(tiny_model_dir, [*role_args, "--json-model-override-args", '{"video_pruning_rate": 0.5}'])
    assert done.returncode != 0
    assert "video_pruning_rate=0.5" in done.stdout + done.stderr
    assert REFUSED.format(role=role_args[0]) in done.stdout + done.stderr
