"""The hooks that carry pruning between encoder and language servers: the request's setting resolved and
carried to the encoders and to the language scheduler, and rows without records refused; each of them acts for
the architectures the plugin serves only."""

import asyncio
import json
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_evs import sglang_compat
from sglang_evs.methods import VIDCOM2
from sglang_evs.pruning import disaggregated
from sglang_evs.pruning.disaggregated import (
    ASKED,
    ENCODER_SETTINGS,
    carry_pruning_to_encoders,
    refuse_rows_without_records,
    remember_video_settings,
    reportable_failed_request,
    settings_to_video_entries,
    with_asked_pruning,
    with_pruning_records,
)
from sglang_evs.pruning.encoder_records import video_record
from sglang_evs.pruning.settings import Pruning


def test_the_asked_pruning_rides_in_custom_params_beside_the_users_own():
    pruning = Pruning(VIDCOM2, 0.75)
    asked = {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75}
    got = with_asked_pruning({"max_new_tokens": 3, "custom_params": {"mine": 1}}, pruning)
    assert got == {"max_new_tokens": 3, "custom_params": {"mine": 1, ASKED: asked}}
    assert with_asked_pruning(None, pruning) == {"custom_params": {ASKED: asked}}
    assert with_asked_pruning([{}, {"temperature": 0}], pruning) == [
        {"custom_params": {ASKED: asked}},
        {"temperature": 0, "custom_params": {ASKED: asked}},
    ]


def waiting_request(asked: dict | None, video_grids: list | None, records: list | None) -> SimpleNamespace:
    """What the language scheduler holds when a request's rows have all arrived (one part per encoder)."""
    grids = None if video_grids is None else torch.tensor(video_grids)
    received = SimpleNamespace(get_mm_extra_meta=lambda: {"video_grid_thw": grids}, evs_video_pruning=records)
    custom = None if asked is None else {ASKED: asked}
    recv_req = SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom), encoder_urls=["http://enc:1"])
    return SimpleNamespace(
        recv_req=recv_req, recv_embedding_data=received, mm_processor=SimpleNamespace(hf_config=config())
    )


def test_rows_without_records_fail_a_request_that_asked_for_pruning_naming_encoder_and_setting():
    asked = {"video_pruning_method": "evs", "video_pruning_rate": 0.5}
    record = video_record("evs", 0.5, [0, 1], 4)
    with pytest.raises(ValueError, match=r"video_pruning_rate=0.5.*2 of its 2 videos.*http://enc:1"):
        refuse_rows_without_records(waiting_request(asked, [[2, 2, 2], [2, 2, 2]], [None]))
    with pytest.raises(ValueError, match="1 of its 2 videos"):  # one encoder of two without the plugin
        refuse_rows_without_records(waiting_request(asked, [[2, 2, 2], [2, 2, 2]], [[record], None]))
    refuse_rows_without_records(waiting_request(asked, [[2, 2, 2], [2, 2, 2]], [[record], [record]]))
    refuse_rows_without_records(waiting_request(asked, None, [None]))  # images only: nothing to prune
    refuse_rows_without_records(waiting_request(None, [[2, 2, 2]], [None]))  # q = 0: upstream's rows are right


SERVED_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
# SGLang serves it under encoder disaggregation, a Qwen3.5-MoE subclass on the same processor; not ours
NOT_SERVED = "InternS2PreviewForConditionalGeneration"


def config(architecture: str = SERVED_ARCHITECTURE, **settings) -> SimpleNamespace:
    return SimpleNamespace(architectures=[architecture], **settings)


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


def encoder_with_global_cache(cached: bool) -> SimpleNamespace:
    """The fields of an `--encoder-only` server (with or without `--enable-mm-global-cache`) the hook reads."""
    return SimpleNamespace(
        server_args=SimpleNamespace(encoder_only=True, enable_mm_global_cache=cached),
        model_config=SimpleNamespace(hf_config=config()),
        preprocessor=SimpleNamespace(_flatten_nested_items=lambda items: items),
    )


def test_an_encoder_with_the_global_multimodal_cache_refuses_a_pruning_request_naming_the_flag():
    import asyncio

    video = SimpleNamespace(name="VIDEO")

    async def prepare(encoder, requests, modality):
        return SimpleNamespace(num_items=1, items_per_req=[1], aux_data={})

    def remember(leaf: dict, cached: bool) -> SimpleNamespace:
        requests = [{"mm_items": [leaf]}]
        encoder = encoder_with_global_cache(cached)
        return asyncio.run(remember_video_settings(prepare, encoder, requests, video))

    pruned = {"video_pruning_method": "evs", "video_pruning_rate": 0.75}
    with pytest.raises(ValueError, match=r"video_pruning_rate=0.75.*--encoder-only.*--enable-mm-global-cache"):
        remember(pruned, cached=True)
    assert remember({"video_pruning_rate": 0.0}, cached=True).aux_data == {}  # q = 0 serves as upstream
    assert remember(pruned, cached=False).aux_data[ENCODER_SETTINGS] == [pruned]


# --- every hook acts for the plugin's architectures only --------------------------------------------------


def test_a_language_server_of_a_model_not_served_dispatches_each_request_as_sent():
    tokenizer_manager = language_server()
    tokenizer_manager.model_config.hf_config = config(NOT_SERVED)
    for given in ({"video_pruning_rate": 0.75}, {"video_pruning_rate": 1.5}, None):  # a bad one too: SGLang's to judge
        request = generate_request(given, {"max_new_tokens": 2})
        carry_pruning_to_encoders(tokenizer_manager, request)
        assert request.mm_processor_kwargs == given and request.sampling_params == {"max_new_tokens": 2}


def test_video_entries_carry_a_setting_for_a_served_model_only():
    asked = {"video_pruning_method": "evs", "video_pruning_rate": 0.5}
    for architecture, carried in ((SERVED_ARCHITECTURE, True), (NOT_SERVED, False)):
        receiver = SimpleNamespace(mm_processor=SimpleNamespace(hf_config=config(architecture)))
        entries = [{"modality": SimpleNamespace(name="VIDEO"), "url": "v.mp4"}]
        result = settings_to_video_entries(entries, receiver, generate_request(dict(asked)))
        assert (result[0].keys() >= asked.keys()) is carried, architecture


def test_an_encoder_prunes_the_videos_of_a_served_model_only():
    def encode(architecture: str):
        encoder = SimpleNamespace(
            server_args=SimpleNamespace(encoder_only=True),
            model_config=SimpleNamespace(hf_config=config(architecture)),
            preprocessor=SimpleNamespace(_flatten_nested_items=lambda items: items),
        )
        context = SimpleNamespace(aux_data={}, num_items=1, items_per_req=[1])

        async def original(*args, **kwargs):
            return context

        requests = [{"mm_items": [{"url": "v.mp4", "video_pruning_method": "evs", "video_pruning_rate": 0.5}]}]
        return asyncio.run(remember_video_settings(original, encoder, requests, SimpleNamespace(name="VIDEO")))

    assert ENCODER_SETTINGS in encode(SERVED_ARCHITECTURE).aux_data  # what prune_on_encoder reads to prune
    assert encode(NOT_SERVED).aux_data == {}  # nothing for publish_pruned_sizes or prune_on_encoder to act on


def test_a_failed_request_is_given_an_empty_prompt_for_a_served_model_only():
    for architecture, ids in ((SERVED_ARCHITECTURE, array("q")), (NOT_SERVED, None)):
        scheduler = SimpleNamespace(model_config=SimpleNamespace(hf_config=config(architecture)))
        recv_req = SimpleNamespace(input_ids=None)
        reportable_failed_request(SimpleNamespace(scheduler=scheduler), recv_req)
        assert recv_req.input_ids == ids, architecture


def test_rows_without_records_are_refused_for_a_served_model_only():
    waiting = waiting_request({"video_pruning_rate": 0.5}, [[2, 2, 2]], [None])
    waiting.mm_processor.hf_config = config(NOT_SERVED)
    refuse_rows_without_records(waiting)  # another model's rows are SGLang's


def test_records_are_kept_beside_a_videos_rows_by_a_served_models_server_only(monkeypatch, tmp_path):
    """`video_meta_attrs_for` is handed a model type only: the server's checkpoint decides."""
    upstream = ("video_grid_thw",)
    for architecture, kept in ((SERVED_ARCHITECTURE, True), (NOT_SERVED, False)):
        checkpoint = tmp_path / architecture
        checkpoint.mkdir()
        (checkpoint / "config.json").write_text(json.dumps({"architectures": [architecture]}))
        server_args = SimpleNamespace(model_path=checkpoint)  # the server of that checkpoint
        # (into the module's namespace: getattr would resolve SGLang's own, importing its runtime context)
        monkeypatch.setitem(vars(sglang_compat), "get_server_args", lambda args=server_args: args)
        assert (disaggregated.RECORDS in with_pruning_records(upstream, "qwen3_5")) is kept, architecture
