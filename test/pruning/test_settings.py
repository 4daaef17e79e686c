"""Which pruning applies to a request, and what is refused: pruning with speculative decoding
(Qwen3.5's MTP among them), whether the server or the request asks for it."""

from types import SimpleNamespace

import pytest

from sglang_evs.pruning.settings import NO_PRUNING, refuse_unsupported, request_pruning, server_pruning


def config(**settings) -> SimpleNamespace:
    return SimpleNamespace(architectures=["Qwen3_5ForConditionalGeneration"], **settings)


def request(**kwargs) -> SimpleNamespace:
    return SimpleNamespace(mm_processor_kwargs=kwargs or None)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"video_pruning_rate": 0.5}, "video_pruning_rate=0.5"),
        ({"video_retention_ratio": 0.25}, "video_retention_ratio=0.25"),
    ],
)
def test_server_pruning_with_speculative_decoding_is_refused_naming_the_setting(settings, named):
    pruning = server_pruning(config(**settings))
    with pytest.raises(ValueError, match=f"{named}.*speculative decoding"):
        refuse_unsupported(pruning, speculative=True)
    refuse_unsupported(pruning, speculative=False)  # without speculative decoding it serves


def test_a_request_that_asks_for_pruning_is_refused_under_speculative_decoding():
    server = server_pruning(config())
    assert server == NO_PRUNING
    refuse_unsupported(server, speculative=True)  # q = 0: nothing pruned, MTP serves as upstream
    asked = request_pruning(request(video_pruning_rate=0.75), server)
    assert asked.rate == 0.75
    with pytest.raises(ValueError, match="video_pruning_rate=0.75"):
        refuse_unsupported(asked, speculative=True)
    refuse_unsupported(request_pruning(request(video_pruning_rate=0.0), server), speculative=True)


def test_the_request_setting_overrides_the_server_default():
    server = server_pruning(config(video_pruning_rate=0.5))
    assert request_pruning(request(), server) is server
    assert request_pruning(request(video_retention_ratio=0.5), server).method.name == "vidcom2"
    with pytest.raises(ValueError, match="video_pruning_rate"):
        request_pruning(request(video_pruning_rate=1.5), server)
