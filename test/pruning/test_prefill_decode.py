"""The prefill/decode layout handshake (`pruning/prefill_decode.py`) on SGLang's own metadata buffers, status
messages and abort, with stand-ins for the queues and requests: the layout rides in slots SGLang leaves
free, a decode server aborts a request whose prefill laid out another prompt (the broken copy among them: a
decode side that kept the unpruned delta), and a prefill server fails the room of a decode server that
allocated for another prompt, with a reason that decode server reads; for a model the plugin does not serve,
each hook leaves SGLang's call as it was."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_evs.pruning import prefill_decode
from sglang_evs.pruning.fields import ENCODER_PRUNED, METHOD, RATE
from sglang_evs.pruning.prefill_decode import (
    LENGTH_SLOT,
    Layout,
    check_decode_allocation,
    check_prefill_layout,
    layout_of,
    read_layout,
    send_layout,
)

ROOM = 4242
PRUNED = 200  # pads the prefill's setting pruned from the request below
UNPRUNED_DELTA = -360


def video_item(method: str | None = "evs", rate: float = 0.5) -> SimpleNamespace:
    data = {} if method is None else {METHOD: method, RATE: rate}
    return SimpleNamespace(is_video=lambda: True, is_image=lambda: False, model_specific_data=data)


def image_item(method: str | None = "dart", rate: float = 0.5) -> SimpleNamespace:
    data = {} if method is None else {METHOD: method, RATE: rate}
    return SimpleNamespace(is_video=lambda: False, is_image=lambda: True, model_specific_data=data)


def request(length: int = 256, delta: int = UNPRUNED_DELTA + PRUNED, items=None, room: int = ROOM, **extra):
    """A scheduler request as the processor left it (on either server)."""
    inputs = SimpleNamespace(
        mrope_position_delta=torch.tensor([[delta]]), mm_items=[video_item()] if items is None else items
    )
    return SimpleNamespace(
        rid="r1", origin_input_ids=list(range(length)), multimodal_inputs=inputs, bootstrap_room=room,
        bootstrap_host="10.0.0.2", metadata_buffer_index=1, finished_reason=None, return_logprob=False, **extra,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def served(monkeypatch) -> None:
    """These servers serve a model of the plugin's (the hooks read it off the server's checkpoint)."""
    monkeypatch.setattr(prefill_decode, "serves_this_model", lambda: True)


@pytest.fixture(scope="module")
def buffers():
    """SGLang's own metadata buffers, as a CPU server allocates them."""
    from sglang.srt.disaggregation.utils import MetadataBuffers

    return MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=8)


def prefill_side(buffers, req) -> None:
    """What a prefill server with the plugin writes for `req`: SGLang's row, then the layout."""
    req.output_ids, req.return_sampling_mask, req.hidden_states_tensor = [7], False, None
    req.cached_tokens = req.cached_tokens_device = req.cached_tokens_host = req.cached_tokens_storage = 3
    req.get_mm_token_counts = lambda: (0, 0, PRUNED)
    send_layout(buffers.set_buf(req), buffers, req)


def test_the_layout_rides_in_slots_sglang_leaves_free(buffers):
    req = request()
    prefill_side(buffers, req)
    row = buffers.cached_tokens[1]
    assert row[:7].tolist() == [3, 3, 3, 3, 0, 0, PRUNED]  # SGLang's own slots, as it wrote them
    assert read_layout(row) == Layout(256, UNPRUNED_DELTA + PRUNED, "evs", 0.5) == layout_of(req)
    assert read_layout(torch.zeros(16, dtype=torch.int32)) is None  # what a prefill without the plugin sends
    odd = layout_of(request(items=[video_item("vidcom2", 0.3)]))
    prefill_side(buffers, request(items=[video_item("vidcom2", 0.3)]))
    assert read_layout(buffers.cached_tokens[1]) == odd  # a rate float32 cannot hold still compares equal
    assert str(odd) == "256 tokens, M-RoPE delta -160, videos pruned by vidcom2 at 0.3"


class Receiver:
    def __init__(self):
        self.cleared = False

    def clear(self):
        self.cleared = True


def commit(buffers, decode_req) -> list:
    """The decode server's commit of a received row through the hook; what SGLang's own commit was handed."""
    queue = SimpleNamespace(metadata_buffers=buffers)
    committed = []
    check_prefill_layout(lambda q, d: committed.append(d), queue, decode_req)
    return committed


def decode_request(req, rebootstrap: bool = False) -> SimpleNamespace:
    return SimpleNamespace(req=req, metadata_buffer_index=1, is_rebootstrap=rebootstrap, kv_receiver=Receiver())


def test_a_decode_server_commits_a_request_its_prefill_laid_out_alike(buffers):
    prefill_side(buffers, request())
    decode_req = decode_request(request())
    assert commit(buffers, decode_req) == [decode_req] and decode_req.req.finished_reason is None


@pytest.mark.parametrize(
    ("decode", "named"),
    [
        # the broken copy: a decode side that kept the unpruned delta (same length, positions 200 lower)
        (request(delta=UNPRUNED_DELTA), "M-RoPE delta -160, videos pruned by evs at 0.5, this decode server's "
                                        "256 tokens, M-RoPE delta -360"),
        (request(length=156, delta=UNPRUNED_DELTA + 300, items=[video_item("evs", 0.75)]), "156 tokens"),
        (request(items=[video_item("vidcom2", 0.5)]), "videos pruned by vidcom2 at 0.5"),  # same count, other rows
        (request(length=456, delta=UNPRUNED_DELTA, items=[video_item(None)]), "456 tokens, M-RoPE delta -360, no"),
    ],
)  # fmt: skip
def test_a_decode_server_aborts_a_request_its_prefill_laid_out_otherwise(buffers, decode, named):
    prefill_side(buffers, request())
    decode_req = decode_request(decode)
    assert commit(buffers, decode_req) == []
    reason = decode.finished_reason
    assert reason.status_code == 400  # not retried by the router: it would fail alike
    assert reason.message.startswith("sglang-evs: request r1 was laid out differently by the two servers: the "
                                     "prefill server's prompt has 256 tokens, M-RoPE delta -160, videos pruned "
                                     "by evs at 0.5")  # fmt: skip
    assert named in reason.message and "must run sglang-evs with the same video pruning setting" in reason.message
    assert "and image pruning setting (image_pruning_method, image_pruning_rate)" in reason.message
    assert decode_req.kv_receiver is None  # cleared as SGLang's own abort branches clear it


def test_a_prefill_server_without_the_plugin_fails_a_pruned_request_and_serves_an_unpruned_one(buffers):
    buffers.cached_tokens[1].zero_()  # its rows never hold anything past slot 6
    buffers.bootstrap_room[1, 0] = ROOM
    pruned = decode_request(request())
    assert commit(buffers, pruned) == []
    assert "its prefill server sent no prompt layout: a prefill server without sglang-evs" in (
        pruned.req.finished_reason.message
    )
    text = decode_request(request(length=12, items=[]))
    assert commit(buffers, text) == [text]


def test_an_images_pruning_rides_beside_the_videos_and_is_compared_too(buffers):
    """A prompt with a pruned video and a pruned image: the same layout on both servers commits; another image
    method (the same count, other rows) aborts naming both; a prefill server without the plugin fails a request
    that prunes only its images here."""
    both = [video_item(), image_item("dart", 0.5)]
    prefill_side(buffers, request(items=both))
    decode_req = decode_request(request(items=[video_item(), image_item("dart", 0.5)]))
    assert commit(buffers, decode_req) == [decode_req]
    prefill_side(buffers, request(items=both))
    other = request(items=[video_item(), image_item("divprune", 0.5)])
    assert commit(buffers, decode_request(other)) == []
    named = ("videos pruned by evs at 0.5, images pruned by dart at 0.5, this decode server's 256 tokens, M-RoPE "
             "delta -160, videos pruned by evs at 0.5, images pruned by divprune at 0.5")  # fmt: skip
    assert named in other.finished_reason.message
    buffers.cached_tokens[1].zero_()  # a prefill server without the plugin
    buffers.bootstrap_room[1, 0] = ROOM
    images_only = request(items=[video_item(None), image_item("dart", 0.75)])
    assert commit(buffers, decode_request(images_only)) == []
    assert (
        "prunes its media on this decode server (256 tokens, M-RoPE delta -160, no video pruned, images pruned "
        "by dart at 0.75), but its prefill server sent no prompt layout" in images_only.finished_reason.message
    )


def test_a_warm_up_another_rooms_row_and_a_rebootstrap_are_left_to_sglang(buffers):
    prefill_side(buffers, request())
    other = request(length=9)
    for decode_req in (
        decode_request(request(length=9, room=ROOM + 1)),  # SGLang's corruption check names it
        decode_request(other, rebootstrap=True),
        decode_request(SimpleNamespace(**{**vars(other), "bootstrap_host": "2.2.2.2"})),  # FAKE_BOOTSTRAP_HOST
    ):
        assert commit(buffers, decode_req) == [decode_req]


class Manager:
    """Stands in for the prefill server's Mooncake KV manager: the decode server's slots for the room, and
    what `conclude_failure` was called with (whether the status message would carry the reason)."""

    kv_status_msg_carries_reason = False

    def __init__(self, allocated: list[int]):
        self.transfer_infos = {ROOM: {f"decode:{i}": SimpleNamespace(is_dummy=False,
                                                                    dst_kv_indices=np.arange(pages, dtype=np.int32))
                                      for i, pages in enumerate(allocated)}}  # fmt: skip
        self.failed: list[tuple[int, str, bool]] = []

    def conclude_failure(self, *, bootstrap_room, failure_reason):
        self.failed.append((bootstrap_room, failure_reason, self.kv_status_msg_carries_reason))


def finalize(req, manager: Manager, pages: int) -> bool:
    def original(queue, req):
        req.disagg_kv_sender = SimpleNamespace(kv_mgr=manager, num_kv_indices=pages)
        return True

    return check_decode_allocation(original, SimpleNamespace(), req)


def test_a_prefill_server_sends_to_a_decode_server_that_allocated_its_pages():
    manager = Manager([256])
    assert finalize(request(), manager, 256) and manager.failed == []


def test_a_prefill_server_fails_the_room_of_a_decode_server_that_allocated_for_another_prompt():
    manager = Manager([456])  # a decode server without the plugin: the video unpruned
    assert finalize(request(), manager, 256)
    ((room, reason, carried),) = manager.failed
    assert room == ROOM and carried and not Manager.kv_status_msg_carries_reason
    assert "kv_status_msg_carries_reason" not in vars(manager)  # the manager's own setting again
    assert reason == (
        "sglang-evs: request r1 has 256 tokens, M-RoPE delta -160, videos pruned by evs at 0.5 on this prefill "
        "server, 256 KV pages to send, but decode server decode:0 allocated 456: it laid the prompt out "
        "differently (another pruning setting, or no sglang-evs, which does not prune); both servers must "
        "run sglang-evs with the same video pruning setting (video_pruning_method, video_pruning_rate) and image "
        "pruning setting (image_pruning_method, image_pruning_rate)"
    )


def test_the_reason_reaches_a_mooncake_decode_server_in_the_status_message():
    """SGLang's own encoding and parsing of a prefill status message, with the reason carried as the hook
    carries it: what the decode server's error names (and the router returns)."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    manager = SimpleNamespace(kv_status_msg_tag=None, kv_status_msg_carries_reason=True, _prefill_unique_rank=lambda: 0)
    message = MooncakeKVManager._encode_kv_status_message(
        manager, bootstrap_room=ROOM, status=KVPoll.Failed, failure_reason="sglang-evs: why"
    )
    assert MooncakeKVManager.parse_kv_status_message(manager, message) == (ROOM, int(KVPoll.Failed), 0,
                                                                            "sglang-evs: why")  # fmt: skip
    assert not MooncakeKVManager.kv_status_msg_carries_reason  # Mooncake's own: no reason, hence the hook's


def test_hooks_read_the_request_setting_from_its_items():
    assert layout_of(request(items=[video_item(None), video_item("vidcom2", 0.75)])).method == "vidcom2"
    # a --language-only prefill server's item, pruned by its encoder: the same layout as its decode server's
    by_encoder = {ENCODER_PRUNED: {"method": "evs", "rate": 0.5}}
    encoded = SimpleNamespace(is_video=lambda: True, is_image=lambda: False, model_specific_data=by_encoder)
    assert layout_of(request(items=[encoded])) == layout_of(request())
    assert layout_of(SimpleNamespace(origin_input_ids=[1, 2], multimodal_inputs=None)) == Layout(2, 0, None, 0.0)
    assert prefill_decode.METHOD_CODES == {"evs": 1, "vidcom2": 2}
    assert LENGTH_SLOT > 6


def test_for_a_model_not_served_every_hook_leaves_sglangs_call_as_it_was(buffers, monkeypatch):
    """Layouts that would fail a served model's request (another length, a prefill's pages a decode server did
    not allocate): SGLang's rows, commits and transfers, with no layout written, checked or failed."""
    monkeypatch.setattr(prefill_decode, "serves_this_model", lambda: False)
    buffers.cached_tokens[1].zero_()
    prefill_side(buffers, request())
    assert read_layout(buffers.cached_tokens[1]) is None and buffers.cached_tokens[1][7:].tolist() == [0] * 9
    buffers.bootstrap_room[1, 0] = ROOM
    other = decode_request(request(length=456, delta=UNPRUNED_DELTA, items=[video_item(None)]))
    assert commit(buffers, other) == [other] and other.req.finished_reason is None
    manager = Manager([456])
    assert finalize(request(), manager, 256) and manager.failed == []


def test_a_cleared_room_reads_failed_where_sglang_would_raise_and_end_the_transfer_thread(monkeypatch):
    """On SGLang's own `check_status`: a room cleared between a caller's membership test and its read (the
    race that ended a prefill server's transfer thread) reads Failed for a served model; a room that is there
    reads its status; for a model not served, SGLang's KeyError stands."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    manager = SimpleNamespace(request_status={ROOM: KVPoll.Transferring})
    hooked = prefill_decode.cleared_room_reads_failed
    assert hooked(CommonKVManager.check_status, manager, ROOM) == KVPoll.Transferring
    assert hooked(CommonKVManager.check_status, manager, ROOM + 1) == KVPoll.Failed
    monkeypatch.setattr(prefill_decode, "serves_this_model", lambda: False)
    with pytest.raises(KeyError):
        hooked(CommonKVManager.check_status, manager, ROOM + 1)
