"""What a server refuses pruning with: speculative decoding (Qwen3.5's MTP among them), encoder and
prefill/decode disaggregation, whether the server or the request asks for it; and the one request feature
refused over a pruned video, input logprobs."""

import json
import re
from types import SimpleNamespace

import pytest

from sglang_evs.pruning.fields import METHOD, RATE, TOKEN_BUDGET
from sglang_evs.pruning.refusals import (
    UNPROVEN_FLAGS,
    conflicting_setup,
    content_unreached_setup,
    encoder_role,
    rate_only_setup,
    refuse_prompt_logprobs_over_pruned_videos,
    refuse_request_features_with_threshold,
    refuse_unsupported,
    refuse_unsupported_images,
)
from sglang_evs.pruning.settings import (
    NO_IMAGE_PRUNING,
    NO_PRUNING,
    request_image_pruning,
    request_pruning,
    server_pruning,
)


def config(**settings) -> SimpleNamespace:
    return SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], **settings)


def request(**kwargs) -> SimpleNamespace:
    return SimpleNamespace(mm_processor_kwargs=kwargs or None, sampling_params=None)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"video_pruning_rate": 0.5}, r"video_pruning_rate=0.5: video pruning \(evs\)"),
        (
            {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75},
            r"video_pruning_rate=0.75: video pruning \(vidcom2\)",
        ),
    ],
)
def test_server_pruning_with_a_conflicting_setup_is_refused_naming_the_setting(settings, named):
    pruning = server_pruning(config(**settings))
    with pytest.raises(ValueError, match=f"{named}.*{re.escape(SEPARATE_DRAFT)}"):
        refuse_unsupported(pruning, SEPARATE_DRAFT)
    refuse_unsupported(pruning, None)  # without the conflict it serves


def test_a_request_that_asks_for_pruning_is_refused_under_a_conflicting_setup():
    server = server_pruning(config())
    assert server == NO_PRUNING
    refuse_unsupported(server, SEPARATE_DRAFT)  # q = 0: nothing pruned, the draft serves as upstream
    asked = request_pruning(request(video_pruning_rate=0.75), server)
    assert asked.rate == 0.75
    with pytest.raises(ValueError, match="video_pruning_rate=0.75"):
        refuse_unsupported(asked, SEPARATE_DRAFT)
    refuse_unsupported(request_pruning(request(video_pruning_rate=0.0), server), SEPARATE_DRAFT)


SEPARATE_DRAFT = "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm EAGLE3)"
WITH_MTP = SimpleNamespace(
    architectures=["Qwen3_5ForConditionalGeneration"], text_config=SimpleNamespace(mtp_num_hidden_layers=1)
)
WITHOUT_MTP = SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], text_config=SimpleNamespace())
# Qwen4-Exp's MTP layer drafts through SGLang's class, given the target's positions by the plugin
QWEN4_EXP_WITH_MTP = SimpleNamespace(
    architectures=["Qwen4ExpForConditionalGeneration"], text_config=SimpleNamespace(mtp_num_hidden_layers=1)
)


@pytest.mark.parametrize(
    "server_args, hf_config, conflict",
    [
        ({"speculative_algorithm": "EAGLE", "model_path": "m"}, WITH_MTP, None),  # NEXTN, as SGLang resolves it
        ({"speculative_algorithm": "NEXTN", "speculative_draft_model_path": "m", "model_path": "m"}, WITH_MTP, None),
        ({"speculative_algorithm": "EAGLE3", "model_path": "m"}, WITH_MTP, SEPARATE_DRAFT),
        (
            {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "draft", "model_path": "m"},
            WITH_MTP,
            "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm EAGLE)",
        ),
        (
            {"speculative_algorithm": "NEXTN", "model_path": "m"},
            WITHOUT_MTP,
            "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm NEXTN)",
        ),
        ({"speculative_algorithm": "NEXTN", "model_path": "m"}, QWEN4_EXP_WITH_MTP, None),
        (
            {"speculative_algorithm": "NEXTN", "model_path": "m"},
            SimpleNamespace(architectures=["Qwen3_5ForCausalLM"], text_config=SimpleNamespace(mtp_num_hidden_layers=1)),
            "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm NEXTN)",
        ),  # a target whose MTP draft the plugin does not serve
        (
            {"speculative_algorithm": "EAGLE", "pp_size": 2},
            WITH_MTP,
            "speculative decoding under pipeline parallelism (--pp-size 2)",
        ),
        ({"speculative_algorithm": "EAGLE", "model_path": "m", "speculative_eagle_topk": 1}, WITH_MTP, None),
        (
            {"speculative_algorithm": "EAGLE", "model_path": "m", "speculative_eagle_topk": 4},
            WITH_MTP,
            "speculative draft trees (--speculative-eagle-topk 4; chains, topk 1, are proven)",
        ),
    ],
)
def test_speculation_prunes_only_with_the_models_own_mtp_head(server_args, hf_config, conflict):
    assert conflicting_setup(SimpleNamespace(**server_args), hf_config) == conflict


@pytest.mark.parametrize(
    "draft_config, prunes",
    [
        ({"architectures": ["LlamaForCausalLMEagle3"], "rope_scaling": {"mrope_section": [4, 2, 2]}}, True),
        ({"architectures": ["LlamaForCausalLMEagle3"], "rope_scaling": {"rope_type": "llama3"}}, False),  # 1-D
        ({"architectures": ["LlamaForCausalLMEagle"], "rope_scaling": {"mrope_section": [4, 2, 2]}}, False),
    ],
)
def test_an_eagle3_draft_prunes_only_where_it_reads_mrope_positions(draft_config, prunes, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(draft_config))
    server_args = SimpleNamespace(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(tmp_path),
                                  model_path="target")  # fmt: skip
    assert (conflicting_setup(server_args, WITHOUT_MTP) is None) == prunes


@pytest.mark.parametrize(
    "server_args, conflict",
    [
        ({}, None),
        ({"speculative_algorithm": None, "encoder_only": False, "language_only": False}, None),
        ({"encoder_only": True}, None),  # prunes on the encoder (pruning/disaggregated.py)
        ({"language_only": True, "encoder_transfer_backend": "auto"}, None),
        (
            {"language_only": True, "encoder_transfer_backend": "mooncake"},
            "encoder disaggregation (--language-only) over --encoder-transfer-backend mooncake",
        ),
        ({"encoder_only": True, "enable_mm_global_cache": False}, None),
        (
            {"encoder_only": True, "enable_mm_global_cache": True},
            "encoder disaggregation (--encoder-only) with --enable-mm-global-cache (a video it finds cached skips "
            "the encoder, and the pruning)",
        ),
        ({"enable_mm_global_cache": True}, None),  # read by encoder servers only
        ({"attn_cp_size": 1, "enable_prefill_cp": False}, None),
        ({"attn_cp_size": 2}, "context parallelism (--attn-cp-size 2)"),
        (
            {"attn_cp_size": 2, "enable_prefill_cp": True},
            "context parallelism (--attn-cp-size 2 --enable-prefill-cp)",
        ),
        ({"disaggregation_mode": "null"}, None),
        ({"disaggregation_mode": "prefill"}, None),  # Mooncake, SGLang's default backend
        ({"disaggregation_mode": "decode", "disaggregation_transfer_backend": "mooncake"}, None),
        (
            {"disaggregation_mode": "prefill", "disaggregation_transfer_backend": "nixl"},
            "prefill/decode disaggregation (--disaggregation-mode prefill) over --disaggregation-transfer-backend nixl",
        ),
        (
            {"disaggregation_mode": "decode", "disaggregation_transfer_backend": "mori"},
            "prefill/decode disaggregation (--disaggregation-mode decode) over --disaggregation-transfer-backend mori",
        ),
    ],
)
def test_conflicting_setup_names_what_pruning_cannot_run_with(server_args, conflict):
    assert conflicting_setup(SimpleNamespace(**server_args)) == conflict


def test_encoder_disaggregation_of_a_family_whose_encoder_path_is_not_exact_refuses_pruning():
    qwen2_5_vl = SimpleNamespace(architectures=["Qwen2_5_VLForConditionalGeneration"])
    conflict = conflicting_setup(SimpleNamespace(language_only=True), qwen2_5_vl)
    assert conflict.startswith("encoder disaggregation (--language-only) of Qwen2_5_VLForConditionalGeneration")
    assert conflicting_setup(SimpleNamespace(), qwen2_5_vl) is None  # one server prunes it
    qwen3_vl = SimpleNamespace(architectures=["Qwen3VLForConditionalGeneration"])
    assert conflicting_setup(SimpleNamespace(language_only=True), qwen3_vl) is None
    omni = SimpleNamespace(architectures=["Qwen3OmniMoeForConditionalGeneration"])  # a path never run with pruning
    conflict = conflicting_setup(SimpleNamespace(encoder_only=True), omni)
    assert conflict.startswith("encoder disaggregation (--encoder-only) of Qwen3OmniMoeForConditionalGeneration")
    assert conflicting_setup(SimpleNamespace(), omni) is None


@pytest.mark.parametrize("attribute, flag", sorted(UNPROVEN_FLAGS.items()))
def test_a_flag_not_run_with_pruning_is_named(attribute, flag):
    assert conflicting_setup(SimpleNamespace(**{attribute: True})) == f"{flag} (not run with pruning)"
    assert conflicting_setup(SimpleNamespace(**{attribute: False})) is None
    with pytest.raises(ValueError, match=re.escape(f"not supported with {flag} (not run with pruning)")):
        refuse_unsupported(
            server_pruning(config(video_pruning_rate=0.5)), conflicting_setup(SimpleNamespace(**{attribute: True}))
        )


def test_the_flags_not_run_with_pruning_are_sglangs_own():
    """Each is a flag of the installed SGLang's ServerArgs, stored under that attribute."""
    import argparse

    from sglang_evs import sglang_compat

    parser = argparse.ArgumentParser()
    sglang_compat.resolve("ServerArgs").add_cli_args(parser)
    flags = {option: action.dest for action in parser._actions for option in action.option_strings}
    assert {flag: flags.get(flag) for flag in UNPROVEN_FLAGS.values()} == {v: k for k, v in UNPROVEN_FLAGS.items()}


class _Item:
    """The parts of SGLang's MultimodalDataItem the logprob refusal reads."""

    def __init__(self, modality: str, offsets: list, pruned: bool = False) -> None:
        self.modality, self.offsets = modality, offsets
        self.model_specific_data = {METHOD: "evs", RATE: 0.5} if pruned else {}

    def is_video(self) -> bool:
        return self.modality == "video"


def laid_out(*items: _Item) -> SimpleNamespace:
    """A processor output of 30 tokens with `items`, regions laid out."""
    return SimpleNamespace(input_ids=list(range(30)), mm_items=list(items))


def logprobs_from(start: int, asked: bool = True, **more) -> SimpleNamespace:
    return SimpleNamespace(return_logprob=asked, logprob_start_len=start, **more)


def test_input_logprobs_are_refused_from_any_token_before_a_pruned_videos_end():
    """A pruned video over tokens 5..12 (its region, framing text included), an image before it; the error names
    the setting, the rate and the first start served (the token after the video, in the pruned prompt)."""
    output = laid_out(_Item("image", [(1, 2)]), _Item("video", [(5, 12)], pruned=True))
    for start in (0, 5, 12):
        with pytest.raises(ValueError) as refused:
            refuse_prompt_logprobs_over_pruned_videos(logprobs_from(start), output)
        message = str(refused.value)
        assert message.startswith(f"logprob_start_len={start}: ") and "video_pruning_rate=0.5 (evs)" in message
        assert "ask from logprob_start_len=13 on" in message and "of 30 tokens" in message
    for start in (13, 29, -1):  # after the video; -1: SGLang's default, no input logprobs
        refuse_prompt_logprobs_over_pruned_videos(logprobs_from(start), output)
    refuse_prompt_logprobs_over_pruned_videos(logprobs_from(0, asked=False), output)

    # a session turn's start indexes the whole session's prompt: the scheduler checks it (test_sessions.py)
    refuse_prompt_logprobs_over_pruned_videos(logprobs_from(0, session_params={"id": "s"}), output)


def test_input_logprobs_over_an_unpruned_video_are_upstreams():
    output = laid_out(_Item("video", [(5, 8), (11, 14)]), _Item("image", [(20, 25)]))
    refuse_prompt_logprobs_over_pruned_videos(logprobs_from(0), output)


@pytest.mark.parametrize(
    ("server_args", "setup"),
    [
        ({"disaggregation_mode": "prefill"}, "prefill/decode disaggregation (--disaggregation-mode prefill)"),
        ({"disaggregation_mode": "decode"}, "prefill/decode disaggregation (--disaggregation-mode decode)"),
        ({"language_only": True}, "encoder disaggregation (--language-only)"),
        ({"encoder_only": True}, "encoder disaggregation (--encoder-only)"),
        ({"disaggregation_mode": "null"}, None),
        ({}, None),
    ],
)
def test_a_budget_or_floor_is_refused_by_name_where_servers_hand_over_the_rate_only(server_args, setup):
    """Under disaggregation the servers hand each other a video's method and rate alone (the PD layout handshake,
    the encoder's entries and records): a budget or floor would not reach the other server."""
    assert rate_only_setup(SimpleNamespace(**server_args)) == setup
    budget = request_pruning(request(video_pruning_rate=0.5, video_token_budget=100), NO_PRUNING)
    floor = request_pruning(request(video_pruning_min_tokens_per_group=4), NO_PRUNING)
    for pruning, named in ((budget, "video_pruning_rate=0.5, video_token_budget=100"),
                           (floor, "video_pruning_rate=0.0, video_pruning_min_tokens_per_group=4")):  # fmt: skip
        if setup is None:
            refuse_unsupported(pruning, None, setup)
            continue
        message = f"{named}: video_token_budget and video_pruning_min_tokens_per_group are not served with {setup}"
        with pytest.raises(ValueError, match=re.escape(message)):
            refuse_unsupported(pruning, None, setup)
    refuse_unsupported(request_pruning(request(video_pruning_rate=0.5), NO_PRUNING), None, setup)  # the rate serves


@pytest.mark.parametrize(
    ("server_args", "setup"),
    [
        ({"disaggregation_mode": "prefill"}, None),  # each server lays the prompt out; they compare layouts
        ({"language_only": True}, "encoder disaggregation (--language-only)"),
        ({"encoder_only": True}, "encoder disaggregation (--encoder-only)"),
        ({"disaggregation_mode": "decode", "language_only": True}, "encoder disaggregation (--language-only)"),
        ({"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/elsewhere"},
         "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm EAGLE)"),
        ({"tp_size": 2, "pp_size": 2}, None),
    ],
)  # fmt: skip
def test_images_are_refused_by_name_where_their_layout_is_not_built_and_where_videos_are(server_args, setup):
    """Encoder servers hand the language server no image's layout yet; a setup videos cannot be pruned with refuses
    images too; a prefill/decode pair lays images out as videos, each server itself. A request that prunes nothing
    is served everywhere."""
    args = SimpleNamespace(**server_args)
    conflict = conflicting_setup(args, SimpleNamespace(architectures=["Qwen3VLForConditionalGeneration"]))
    pruning = request_image_pruning(request(image_pruning_rate=0.5, image_pruning_method="dart"), NO_IMAGE_PRUNING)
    refuse_unsupported_images(NO_IMAGE_PRUNING, conflict, encoder_role(args))
    if setup is None:
        refuse_unsupported_images(pruning, conflict, encoder_role(args))
        return
    message = f"image_pruning_rate=0.5: image pruning (dart) is not supported with {setup} yet; set image_pruning_rate"
    with pytest.raises(ValueError, match=re.escape(message)):
        refuse_unsupported_images(pruning, conflict, encoder_role(args))


def test_a_budget_alone_is_named_in_a_conflicts_refusal():
    asked = request_pruning(request(video_token_budget=100), NO_PRUNING)
    with pytest.raises(ValueError, match=r"^video_token_budget=100: video pruning \(evs\) is not supported with"):
        refuse_unsupported(asked, SEPARATE_DRAFT)


def test_input_logprobs_refused_over_a_video_pruned_by_a_budget_name_the_budget():
    video = _Item("video", [(5, 12)], pruned=True)
    video.model_specific_data.update({RATE: 0.0, TOKEN_BUDGET: 40})
    with pytest.raises(ValueError, match=r"video_pruning_rate=0.0, video_token_budget=40 \(evs\)") as refused:
        refuse_prompt_logprobs_over_pruned_videos(logprobs_from(0), laid_out(video))
    assert str(refused.value).endswith("or set video_pruning_rate and video_token_budget to 0")


@pytest.mark.parametrize(
    ("server_args", "setup"),
    [
        ({"pp_size": 2}, "pipeline parallelism (--pp-size 2)"),
        ({"speculative_algorithm": "NEXTN"}, "speculative decoding (--speculative-algorithm NEXTN)"),
        ({"enable_dp_attention": True}, "data-parallel attention (--enable-dp-attention)"),
        ({"disaggregation_mode": "decode"}, "prefill/decode disaggregation (--disaggregation-mode decode)"),
        ({"language_only": True}, "encoder disaggregation (--language-only)"),
        ({"tp_size": 2, "dp_size": 2, "pp_size": 1}, None),  # one server's scheduler decides, at every rank
        ({}, None),
    ],
)
def test_a_threshold_is_refused_by_name_where_no_scheduler_decides_its_layout(server_args, setup):
    assert content_unreached_setup(SimpleNamespace(**server_args)) == setup
    threshold = request_pruning(request(video_pruning_threshold=0.3, video_token_budget=100), NO_PRUNING)
    rate = request_pruning(request(video_pruning_rate=0.5), NO_PRUNING)
    refuse_unsupported(rate, None, None, setup)  # the rate serves everywhere the threshold is refused
    if setup is None:
        refuse_unsupported(threshold, None, None, setup)
        return
    message = f"video_pruning_threshold=0.3, video_token_budget=100: video_pruning_threshold is not served with {setup}"
    with pytest.raises(ValueError, match=re.escape(message)):
        refuse_unsupported(threshold, None, None, setup)


def test_a_threshold_request_is_refused_input_logprobs_and_served_in_a_session_turn():
    def asked(**fields):
        return SimpleNamespace(**{"return_logprob": False, "logprob_start_len": -1, "session_params": None, **fields})

    refuse_request_features_with_threshold(asked())
    refuse_request_features_with_threshold(asked(return_logprob=True))  # output logprobs only
    with pytest.raises(ValueError, match=r"input logprobs \(logprob_start_len=0\) with video_pruning_threshold"):
        refuse_request_features_with_threshold(asked(return_logprob=True, logprob_start_len=0))
    refuse_request_features_with_threshold(asked(session_params={"id": "s"}))
