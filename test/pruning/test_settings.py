"""Which pruning applies to a request, and what is refused: pruning with speculative decoding
(Qwen3.5's MTP among them) or with encoder disaggregation, whether the server or the request asks for it."""

import json
import re
from types import SimpleNamespace

import pytest

from sglang_evs.methods import EVS, VIDCOM2
from sglang_evs.plugin import carry_chat_pruning_setting
from sglang_evs.pruning.disaggregated import ASKED, carry_pruning_to_encoders
from sglang_evs.pruning.settings import (
    NO_PRUNING,
    Pruning,
    chat_processor_kwargs,
    conflicting_setup,
    refuse_unsupported,
    request_pruning,
    server_pruning,
)


def config(**settings) -> SimpleNamespace:
    return SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], **settings)


def request(**kwargs) -> SimpleNamespace:
    return generate_request(kwargs or None)


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
        ({"disaggregation_mode": "null"}, None),
        ({"disaggregation_mode": "prefill"}, "prefill/decode disaggregation (--disaggregation-mode prefill)"),
        ({"disaggregation_mode": "decode"}, "prefill/decode disaggregation (--disaggregation-mode decode)"),
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


def language_server(default: dict | None = None, transport: str = "auto") -> SimpleNamespace:
    return SimpleNamespace(
        server_args=SimpleNamespace(language_only=True, encoder_transfer_backend=transport),
        model_config=SimpleNamespace(hf_config=config(**(default or {}))),
    )


def generate_request(mm_processor_kwargs, sampling_params=None) -> SimpleNamespace:
    """The fields of SGLang's GenerateReqInput the language server's dispatch hook reads and writes."""
    return SimpleNamespace(mm_processor_kwargs=mm_processor_kwargs, sampling_params=sampling_params)


def test_a_language_server_resolves_each_requests_pruning_before_dispatching_it_to_an_encoder():
    tokenizer_manager = language_server({"video_pruning_rate": 0.5})
    asks = generate_request({"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75})
    carry_pruning_to_encoders(tokenizer_manager, asks)
    assert asks.mm_processor_kwargs == {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75}
    assert asks.sampling_params["custom_params"][ASKED] == asks.mm_processor_kwargs  # for the language scheduler
    default = generate_request(None)  # the language server's default, named
    carry_pruning_to_encoders(tokenizer_manager, default)
    assert default.mm_processor_kwargs == {"video_pruning_method": "evs", "video_pruning_rate": 0.5}
    batch = generate_request([None, {"video_pruning_rate": 0.5}])
    carry_pruning_to_encoders(tokenizer_manager, batch)
    assert [kw["video_pruning_rate"] for kw in batch.mm_processor_kwargs] == [0.5, 0.5]
    mixed = generate_request([None, {"video_pruning_rate": 0.25}])
    with pytest.raises(ValueError, match="one video_pruning_method and video_pruning_rate for all its prompts"):
        carry_pruning_to_encoders(tokenizer_manager, mixed)  # its media go to the encoders as one request
    with pytest.raises(ValueError, match="video_pruning_rate"):  # SGLang's HTTP 400, before anything is sent
        carry_pruning_to_encoders(tokenizer_manager, generate_request({"video_pruning_rate": 1.5}))


def test_a_transport_that_cannot_carry_the_records_refuses_a_pruning_request():
    tokenizer_manager = language_server(transport="mooncake")
    with pytest.raises(ValueError, match=r"video_pruning_rate=0.75.*--encoder-transfer-backend mooncake"):
        carry_pruning_to_encoders(tokenizer_manager, generate_request({"video_pruning_rate": 0.75}))
    carry_pruning_to_encoders(tokenizer_manager, generate_request(None))  # q = 0 serves


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


def test_the_chat_hook_hands_the_setting_to_the_generate_request():
    serving = _chat_serving("Qwen3VLForConditionalGeneration")
    chat = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 0.75})
    generate = generate_request(None)
    result = (generate, chat)
    assert carry_chat_pruning_setting(result, serving, chat, None) is result
    assert request_pruning(generate, server_pruning(config())).rate == 0.75
    with pytest.raises(ValueError, match="video_pruning_rate must be a number in"):
        bad = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 1.5})
        fresh = generate_request(None)
        request_pruning(carry_chat_pruning_setting((fresh, bad), serving, bad)[0], server_pruning(config()))


def test_the_chat_hook_leaves_another_models_request_as_sent():
    """A model the plugin does not prune gets its chat request converted exactly as SGLang converts it."""
    chat = SimpleNamespace(chat_template_kwargs={"video_pruning_rate": 0.75})
    generate = generate_request({"fps": 2})
    carry_chat_pruning_setting((generate, chat), _chat_serving("Gemma3ForConditionalGeneration"), chat, None)
    assert generate.mm_processor_kwargs == {"fps": 2}
