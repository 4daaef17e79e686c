"""`--dp-size 2` (SGLang's DP controller, one scheduler per replica) with EVS: 64 concurrent mixed
requests (videos at a rate, and at a threshold each replica's scheduler decides; images pruned by DivPrune) get a
single server's tokens and counts, and the Prometheus totals add up."""

import pytest

from sglang_evs import __version__, trace
from sglang_evs.testing import workload
from sglang_evs.testing.requests import counter_increase, pruning_metrics
from sglang_evs.testing.server import running_server

pytestmark = pytest.mark.slow

REQUESTS = 64
VIDEO_SETTINGS = (0.75, {"video_pruning_threshold": 0.3})
IMAGE_RATE = 0.5
SERVER_ARGS = ["--dtype", "float32", "--enable-metrics"]


@pytest.fixture(scope="module")
def request_set(tmp_path_factory):
    files = workload.write_media(tmp_path_factory.mktemp("dp_media"))
    return workload.mixed_requests(files, REQUESTS, VIDEO_SETTINGS, image_rate=IMAGE_RATE)


def send(server, request_set) -> dict:
    before = pruning_metrics(server.base_url)
    results = workload.send_concurrently(server.base_url, request_set)
    return {"results": results, "metrics": counter_increase(before, pruning_metrics(server.base_url))}


@pytest.fixture(scope="module")
def single(tiny_server, request_set):
    return send(tiny_server, request_set)


@pytest.fixture(scope="module")
def replicated(tiny_model_dir, tmp_path_factory, request_set):
    log_path = tmp_path_factory.mktemp("dp2") / "server.log"
    env = {trace.ENV: str(log_path.with_name("trace.jsonl"))}
    with running_server(tiny_model_dir, log_path, [*SERVER_ARGS, "--dp-size", "2"], env=env) as server:
        sent = send(server, request_set)
        log = server.log()
    return {**sent, "log": log, "keep_masks": trace.read(log_path.with_name("trace.jsonl"), "keep_mask")}


def test_every_request_succeeds_with_the_single_servers_tokens(single, replicated, request_set):
    failed = [
        (r.name, out) for r, out in zip(request_set, replicated["results"], strict=True) if isinstance(out, Exception)
    ]
    assert not failed
    for request, one, two in zip(request_set, single["results"], replicated["results"], strict=True):
        assert (two.output_ids, two.prompt_tokens) == (one.output_ids, one.prompt_tokens), request.name


def test_pruning_counts_per_request_and_in_prometheus_add_up(single, replicated, request_set):
    for request, one, two in zip(request_set, single["results"], replicated["results"], strict=True):
        fields = ("video_pruning_rate", "video_pruning_threshold", "video_tokens_before_pruning",
                  "video_tokens_after_pruning", "video_tokens", "image_tokens_before_pruning",
                  "image_tokens_after_pruning", "image_tokens")  # fmt: skip
        assert {f: two.meta.get(f) for f in fields} == {f: one.meta.get(f) for f in fields}, request.name
    totals = workload.pruning_totals(replicated["results"])
    assert totals["pruned_videos"] == REQUESTS // 2  # half the set are videos, all pruned
    assert replicated["metrics"] == totals == workload.pruning_totals(single["results"])
    images = [out.meta for request, out in zip(request_set, replicated["results"], strict=True) if request.images]
    assert images and all(meta["image_tokens_after_pruning"] * 2 == meta["image_tokens_before_pruning"]
                          for meta in images)  # fmt: skip


def test_both_replicas_pruned_and_the_plugin_loaded_in_each(replicated):
    log = replicated["log"]
    announced = [line for line in log.splitlines() if f"sglang-evs {__version__} plugin loaded" in line]
    schedulers = {line.split("pid ")[1].split(",")[0] for line in announced if "in run_scheduler_process" in line}
    assert len(schedulers) == 2
    assert any("in run_data_parallel_controller_process" in line for line in announced)
    pruning_schedulers = {str(event["pid"]) for event in replicated["keep_masks"]}
    assert pruning_schedulers == schedulers  # each replica computed keep-masks for videos it served
    deciding = {str(event["pid"]) for event in replicated["keep_masks"] if event.get("at_admission")}
    assert deciding == schedulers  # and decided thresholds as it admitted their requests
