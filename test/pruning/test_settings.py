"""Which pruning applies to a request: the server's default or the request's own, a chat request's carried
over from `chat_template_kwargs` (what a server refuses pruning with is `test_refusals.py`)."""

from types import SimpleNamespace

import pytest

from sglang_evs.methods import EVS, VIDCOM2
from sglang_evs.methods.images import DART, DIVPRUNE
from sglang_evs.plugin import carry_chat_pruning_setting
from sglang_evs.pruning.settings import (
    NO_IMAGE_PRUNING,
    NO_PRUNING,
    ImagePruning,
    Pruning,
    chat_processor_kwargs,
    request_image_pruning,
    request_pruning,
    server_image_pruning,
    server_pruning,
)


def config(**settings) -> SimpleNamespace:
    return SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], **settings)


def request(**kwargs) -> SimpleNamespace:
    return generate_request(kwargs or None)


def generate_request(mm_processor_kwargs, sampling_params=None) -> SimpleNamespace:
    """The fields of SGLang's GenerateReqInput the language server's dispatch hook and the chat hook read and write."""
    return SimpleNamespace(mm_processor_kwargs=mm_processor_kwargs, sampling_params=sampling_params,
                           session_params=None)  # fmt: skip


def test_the_server_default_is_evs_at_the_rate_given():
    assert server_pruning(config()) == NO_PRUNING and NO_PRUNING.method is EVS and not NO_PRUNING.prunes
    assert server_pruning(config(video_pruning_rate=0.5)) == Pruning(EVS, 0.5)
    assert server_pruning(config(video_pruning_method="vidcom2", video_pruning_rate=0.75)) == Pruning(VIDCOM2, 0.75)
    assert server_pruning(config(video_pruning_method="vidcom2")) == Pruning(VIDCOM2, 0.0)


def test_what_a_request_leaves_out_comes_from_the_server():
    server = server_pruning(config(video_pruning_method="vidcom2", video_pruning_rate=0.5))
    assert request_pruning(request(), server) == server
    assert request_pruning(request(video_pruning_rate=0.75), server) == Pruning(VIDCOM2, 0.75)
    assert request_pruning(request(video_pruning_method="evs"), server) == Pruning(EVS, 0.5)
    both = request(video_pruning_method="evs", video_pruning_rate=0.25, fps=2)
    assert request_pruning(both, server) == Pruning(EVS, 0.25)
    with pytest.raises(ValueError, match="video_pruning_rate must be"):
        request_pruning(request(video_pruning_rate=1.5), server)
    with pytest.raises(ValueError, match="video_pruning_method must be one of 'evs', 'vidcom2'"):
        request_pruning(request(video_pruning_method="VidCom2"), server)


@pytest.mark.parametrize("where", ["server", "request"])
def test_the_retired_retention_ratio_is_refused_naming_its_replacement(where):
    message = "video_retention_ratio is no longer read: write video_pruning_method='vidcom2' and video_pruning_rate"
    with pytest.raises(ValueError, match=message):
        if where == "server":
            server_pruning(config(video_retention_ratio=0.25))
        else:
            request_pruning(request(video_retention_ratio=0.25), NO_PRUNING)


def test_a_chat_request_may_carry_its_setting_in_chat_template_kwargs():
    """sglang-router forwards `chat_template_kwargs` and drops `mm_processor_kwargs`."""
    assert chat_processor_kwargs({"video_pruning_rate": 0.75}, None) == {"video_pruning_rate": 0.75}
    vidcom2 = {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.5}
    assert chat_processor_kwargs({**vidcom2, "enable_thinking": False}, {"fps": 2}) == {"fps": 2, **vidcom2}
    assert chat_processor_kwargs({"enable_thinking": False}, {"fps": 2}) == {"fps": 2}
    assert chat_processor_kwargs(None, None) is None


def test_mm_processor_kwargs_win_over_chat_template_kwargs():
    """`chat_template_kwargs` may hold a server-wide default (SGLang merges its default template kwargs in)."""
    own = {"video_pruning_rate": 0.25}
    assert chat_processor_kwargs({"video_pruning_rate": 0.75}, own) == own
    # a setting the request's own kwargs leave out still comes over
    assert chat_processor_kwargs({"video_pruning_method": "vidcom2"}, own) == {"video_pruning_method": "vidcom2", **own}


def _chat_serving(architecture: str) -> SimpleNamespace:
    """What the hook reads of SGLang's OpenAI chat handler: its model's architecture."""
    hf_config = SimpleNamespace(architectures=[architecture])
    return SimpleNamespace(tokenizer_manager=SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config)))


def test_the_chat_hook_hands_the_setting_and_the_session_to_the_generate_request():
    """The setting from `chat_template_kwargs`; `session_params`, which SGLang's conversion drops, made the
    request's: the chat request is then a session's turn, as on `/generate`."""
    serving = _chat_serving("Qwen3VLForConditionalGeneration")
    chat = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 0.75}, session_params={"id": "s"})
    generate = generate_request(None)
    result = (generate, chat)
    assert carry_chat_pruning_setting(result, serving, chat, None) is result
    assert request_pruning(generate, server_pruning(config())).rate == 0.75
    assert generate.session_params == {"id": "s"}
    with pytest.raises(ValueError, match="video_pruning_rate must be a number in"):
        bad = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 1.5}, session_params=None)
        fresh = generate_request(None)
        request_pruning(carry_chat_pruning_setting((fresh, bad), serving, bad)[0], server_pruning(config()))


def test_the_chat_hook_leaves_another_models_request_as_sent():
    """A model the plugin does not prune gets its chat request converted exactly as SGLang converts it."""
    chat = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 0.75}, session_params={"id": "s"})
    generate = generate_request({"fps": 2})
    carry_chat_pruning_setting((generate, chat), _chat_serving("Gemma3ForConditionalGeneration"), chat, None)
    assert generate.mm_processor_kwargs == {"fps": 2} and generate.session_params is None


# --- the limits on the count beside the rate (issue 50): a token budget, a per-group floor; the threshold


def test_a_budget_and_a_floor_are_read_like_the_rate_and_fall_back_to_the_servers():
    server = server_pruning(config(video_pruning_rate=0.5, video_token_budget=300))
    assert server == Pruning(EVS, 0.5, token_budget=300) and server.limits_count
    asked = request_pruning(request(video_pruning_min_tokens_per_group=20), server)
    assert asked == Pruning(EVS, 0.5, token_budget=300, min_tokens_per_group=20)
    assert request_pruning(request(video_token_budget=0), server) == Pruning(EVS, 0.5)  # 0: no budget
    # a budget alone prunes (q = 0 keeps everything, the budget then caps it); a floor alone never does
    assert Pruning(EVS, 0.0, token_budget=100).prunes and not Pruning(EVS, 0.0, min_tokens_per_group=5).prunes
    assert Pruning(VIDCOM2, 0.5, 150, 60).kept_count(100, 4) == 240  # the floor raises the budget's 150


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"video_token_budget": -1}, r"video_token_budget must be a whole number >= 0 \(0: off\), got -1"),
        ({"video_token_budget": 10.5}, "video_token_budget must be a whole number >= 0"),
        ({"video_token_budget": "100"}, "video_token_budget must be a whole number >= 0"),
        ({"video_pruning_min_tokens_per_group": True}, "video_pruning_min_tokens_per_group must be a whole number"),
        ({"video_pruning_threshold": 2.5}, r"video_pruning_threshold must be a number in \[0, 2\], got 2.5"),
        ({"video_pruning_threshold": "low"}, r"video_pruning_threshold must be a number in \[0, 2\]"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        request_pruning(request(**settings), NO_PRUNING)
    with pytest.raises(ValueError, match=message):
        server_pruning(config(**settings))


@pytest.mark.parametrize("threshold", [0, 0.3, 2])
def test_a_threshold_decides_in_place_of_the_rate_by_server_and_request(threshold):
    t = float(threshold)
    server = server_pruning(config(video_pruning_threshold=threshold, video_token_budget=300))
    assert server == Pruning(EVS, 0.0, token_budget=300, threshold=t) and server.follows_content and server.prunes
    assert "video_pruning_threshold=" in server.named() and "video_pruning_rate" not in server.named()
    # a request's rate sets the server's threshold aside, a request's threshold the server's rate
    assert request_pruning(request(video_pruning_rate=0.5), server) == Pruning(EVS, 0.5, token_budget=300)
    rate_server = server_pruning(config(video_pruning_rate=0.5))
    asked = request_pruning(request(video_pruning_threshold=threshold), rate_server)
    assert asked == Pruning(EVS, 0.0, threshold=t)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"video_pruning_threshold": 0.3, "video_pruning_rate": 0.5},
         "video_pruning_rate=0.5 and video_pruning_threshold=0.3: name one"),
        ({"video_pruning_threshold": 0.3, "video_pruning_method": "vidcom2"},
         r"video_pruning_threshold=0.3 is EVS's dissimilarity and takes video_pruning_method='evs', not 'vidcom2'"),
    ],
)  # fmt: skip
def test_a_threshold_beside_a_rate_or_with_vidcom2_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        request_pruning(request(**settings), NO_PRUNING)
    with pytest.raises(ValueError, match=message):
        server_pruning(config(**settings))


@pytest.mark.parametrize("key", ["video_token_budgett", "video_pruning_treshold", "video_pruning_min_tokens"])
def test_a_misspelt_key_of_the_namespace_is_refused_naming_the_settings(key):
    names = ("video_pruning_method, video_pruning_rate, video_token_budget, video_pruning_min_tokens_per_group, "
             "video_pruning_threshold")  # fmt: skip
    with pytest.raises(ValueError, match=rf"unknown video pruning setting '{key}': the settings are {names}"):
        request_pruning(request(**{key: 1}, video_pruning_rate=0.5), NO_PRUNING)
    # keys outside the namespace, and the model-config ids inside it, are others' to read
    assert request_pruning(request(fps=2, video_token_id=5, video_fps=1), NO_PRUNING) == NO_PRUNING


def test_chat_template_kwargs_carry_the_limits_and_a_misspelt_key_to_be_refused():
    carried = chat_processor_kwargs({"video_token_budget": 64, "video_pruning_tokens": 1, "enable_thinking": 0}, None)
    assert carried == {"video_token_budget": 64, "video_pruning_tokens": 1}
    with pytest.raises(ValueError, match="unknown video pruning setting 'video_pruning_tokens'"):
        request_pruning(generate_request(carried), NO_PRUNING)


def test_images_are_off_by_default_and_read_like_videos_from_the_server_and_the_request():
    assert server_image_pruning(config()) == NO_IMAGE_PRUNING == ImagePruning(DIVPRUNE, 0.0)
    assert not NO_IMAGE_PRUNING.prunes
    server = server_image_pruning(config(image_pruning_rate=0.5))
    assert server == ImagePruning(DIVPRUNE, 0.5) and server.prunes
    assert request_image_pruning(request(image_pruning_method="dart"), server) == ImagePruning(DART, 0.5)
    assert request_image_pruning(request(image_pruning_rate=0.0), server) == NO_IMAGE_PRUNING
    # the video settings ignore the image ones, and the other way round
    assert request_pruning(request(image_pruning_rate=0.5), NO_PRUNING) == NO_PRUNING
    assert request_image_pruning(request(video_pruning_rate=0.5), NO_IMAGE_PRUNING) == NO_IMAGE_PRUNING


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"image_pruning_rate": 1.0}, r"image_pruning_rate must be a number in \[0, 1\), got 1.0"),
        ({"image_pruning_rate": True}, r"image_pruning_rate must be a number in \[0, 1\)"),
        ({"image_pruning_method": "EVS"}, "image_pruning_method must be one of 'divprune', 'dart', got 'EVS'"),
    ],
)
def test_a_bad_image_setting_is_refused_naming_it(settings, message):
    with pytest.raises(ValueError, match=message):
        request_image_pruning(request(**settings), NO_IMAGE_PRUNING)
    with pytest.raises(ValueError, match=message):
        server_image_pruning(config(**settings))


def test_a_misspelt_image_key_is_refused_naming_every_setting():
    with pytest.raises(ValueError, match="unknown image pruning setting 'image_pruning_ratio': the settings are .*"
                                         "image_pruning_method, image_pruning_rate"):  # fmt: skip
        request_pruning(request(image_pruning_ratio=0.5), NO_PRUNING)
    carried = chat_processor_kwargs({"image_pruning_rate": 0.5, "enable_thinking": 0}, None)
    assert carried == {"image_pruning_rate": 0.5}
