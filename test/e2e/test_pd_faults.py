"""Faults under prefill/decode disaggregation with pruning: a decode server killed under a burst, and bad
pruning settings, through sglang-router in PD mode.

One fleet for the module (CPU route, tiny Qwen3-VL, float32): a prefill server and two decode servers
(EVS q = .5 as every server's default) behind one router in PD mode that names both decode servers
(`--decode` twice). Set as a user running such a fleet, whose servers may die, would set it:
- the router (`ROUTER_ARGS`): decode servers taken in turn (its default, cache-aware, matches the prompt's
  text only and sends every "Describe this." to one of them), and health checks every 2 s, 2 failures
  dropping a server (the default checks every 60 s, 3 failures: a dead decode server stays listed for up to
  3 minutes);
- the prefill server (`PREFILL_ENV`): `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` of 30 s. A request whose
  decode server died before sending its KV slots otherwise waits on the prefill server for SGLang's default
  300 s, and the router with it (seen by hand: 4 of these 16 requests were still unanswered after 120 s).

- Bad pruning settings in a chat request (`chat_template_kwargs`, the field the router forwards): a rate
  of 1.5 and an unknown method get HTTP 400 through the router, naming the setting; the fleet serves on.
- A burst of 16 concurrent chat requests (text, image, a video at the servers' default and at q = .75; 64
  output tokens each): once the decode servers hold at least half of them between them, the busier one's whole
  process group gets SIGKILL. The decode servers' forwards are held while the burst arrives (SGLang's
  `/slow_down`, `workload.FORWARD_HOLD_S` each; the survivor's hold is lifted at the kill): a tiny model
  decodes each request faster than the prefill server hands the next over, so unheld they would hold more than
  a few at once only by chance (CI's machine: never in 60 s). Every request is answered, or fails with an HTTP
  error, within the client's bounded timeout (none hangs); the router drops the dead server from its list
  within 30 s, and the requests that follow are all served, by the other decode server (its access log says
  so) and the same prefill server. Run with `-s` to see each request's outcome and when it ended.
"""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import requests

from sglang_evs.testing import workload
from sglang_evs.testing.requests import pruning_setting
from sglang_evs.testing.router import healthy_workers, running_pd_router, worker_args
from sglang_evs.testing.server import RunningServer, mooncake_missing, pd_decode_launch, pd_launches, running_servers

MOONCAKE_MISSING = mooncake_missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))]

SERVER_ARGS = worker_args(0.5)  # float32, metrics, EVS q = .5 by default
# How long the prefill server waits for a request's decode server to send its KV slots before failing the
# request (SGLang's default: 300 s). A decode server killed after the router handed it a request never sends
# them: without this, such a request waits the full 300 s on the prefill server, and the router with it.
BOOTSTRAP_TIMEOUT_S = 30
PREFILL_ENV = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(BOOTSTRAP_TIMEOUT_S)}
ROUTER_ARGS = (
    "--decode-policy", "round_robin",
    "--health-check-interval-secs", "2", "--health-failure-threshold", "2", "--health-success-threshold", "1",
)  # fmt: skip
BURST = 16
MAX_TOKENS = 64  # long enough that the decode servers are still decoding the burst when one is killed
CLIENT_TIMEOUT_S = 120.0  # a request not answered by then counts as hung


class Fleet(NamedTuple):
    prefill: RunningServer
    decodes: list[RunningServer]
    router: RunningServer


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, list[Path]]:
    return workload.write_media(tmp_path_factory.mktemp("pd_faults_media"), clips=2, images=2)


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pd_faults")
    pd = pd_launches(tiny_model_dir, folder, SERVER_ARGS, PREFILL_ENV)
    pd = pd._replace(decode=pd_decode_launch(tiny_model_dir, folder / "decode.log", SERVER_ARGS))
    second = pd_decode_launch(tiny_model_dir, folder / "decode2.log", SERVER_ARGS)
    with running_servers(pd.prefill, pd.decode, second) as (prefill, *decodes):
        with running_pd_router(prefill, decodes, pd.bootstrap_port, folder / "router.log", ROUTER_ARGS) as router:
            yield Fleet(prefill, decodes, router)


def chat(base_url: str, request: workload.MixedRequest, max_tokens: int = 8, **setting) -> requests.Response:
    """A chat request through the router (greedy; `setting` over its rate in `chat_template_kwargs`), with a
    bounded timeout."""
    body = {**request.chat_body(max_tokens), "ignore_eos": True}
    if setting:
        body["chat_template_kwargs"] = {**body.get("chat_template_kwargs", {}), **setting}
    return requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=CLIENT_TIMEOUT_S)


def error_message(response: requests.Response) -> str:
    """The error's text as the router returns it (SGLang's OpenAI error body, or the router's own)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    return str(body.get("message") or body.get("error", {}).get("message") or body)


BAD_SETTINGS = [  # chat_template_kwargs -> what the 400 must say
    ({"video_pruning_rate": 1.5}, "video_pruning_rate must be a number in [0, 1), got 1.5"),
    ({"video_pruning_method": "fast"}, "video_pruning_method must be one of 'evs', 'vidcom2', got 'fast'"),
]


def test_bad_pruning_settings_get_400_naming_the_setting_through_the_router_and_the_fleet_serves_on(fleet, files):
    video, text = workload.mixed_requests(files, 3, video_rates=(None,))[2], workload.mixed_requests(files, 1)[0]
    reference = chat(fleet.router.base_url, video)
    assert reference.status_code == 200, reference.text
    for setting, message in BAD_SETTINGS * 2:  # each twice, a good request after each
        response = chat(fleet.router.base_url, video, **setting)
        assert response.status_code == 400 and message in error_message(response), (setting, response.text)
        for request in (video, text):
            good = chat(fleet.router.base_url, request)
            assert good.status_code == 200, good.text
        assert good.json()["choices"][0]["message"]["content"]
    again = chat(fleet.router.base_url, video)
    assert again.json()["choices"][0]["message"] == reference.json()["choices"][0]["message"]
    assert all(server.alive() for server in (fleet.prefill, *fleet.decodes))


class Outcome(NamedTuple):
    name: str
    status: str  # completed | error | hung
    ended_after_kill_s: float  # negative: before the kill
    error: str  # the HTTP status and the error's first line; "" when completed


def served_chats(server: RunningServer) -> int:
    """Chat requests a server has answered with HTTP 200, from its access log (the harness's PD servers publish
    no Prometheus samples on `/metrics`, so SGLang's request counter cannot be read there)."""
    return server.log().count('"POST /v1/chat/completions HTTP/1.1" 200')


def load(server: RunningServer) -> int:
    """Requests a decode server holds: running, and waiting (its waiting count takes in its PD queues:
    preallocating, receiving KV), as its scheduler reports them now (`/v1/loads`; a decode server's
    `/metrics` gauges are refreshed only every 40 decode steps)."""
    ranks = requests.get(f"{server.base_url}/v1/loads", timeout=10).json()["loads"]
    return sum(rank["num_running_reqs"] + rank["num_waiting_reqs"] for rank in ranks)


class Killed(NamedTuple):
    outcomes: list[Outcome]
    loads_at_kill: list[int]  # per decode server
    unfinished_at_kill: int  # requests of the burst not yet answered
    victim: int
    survivor: RunningServer
    unlisted_after_s: float | None  # the router's list dropped the killed server this long after the kill
    listed: list[str]  # the router's healthy workers then


@pytest.fixture(scope="module")
def killed(fleet, files) -> Killed:
    """The burst, the kill of the busier decode server once both run some of it, every request's outcome."""
    burst = workload.mixed_requests(files, BURST, video_rates=(None, 0.75))
    killed_at = [float("inf")]

    def send(request: workload.MixedRequest) -> Outcome:
        try:
            response = chat(fleet.router.base_url, request, MAX_TOKENS)
        except requests.Timeout:
            return Outcome(request.name, "hung", time.monotonic() - killed_at[0], "no answer")
        except requests.RequestException as exc:
            return Outcome(request.name, "error", time.monotonic() - killed_at[0], f"{type(exc).__name__}: {exc}")
        ended = time.monotonic() - killed_at[0]
        if response.status_code == 200:
            return Outcome(request.name, "completed", ended, "")
        return Outcome(request.name, "error", ended, f"{response.status_code}: {error_message(response)[:300]}")

    for decode in fleet.decodes:  # held, so that the burst gathers on them
        workload.slow_down(decode.base_url, workload.FORWARD_HOLD_S)
    try:
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            futures = [pool.submit(send, request) for request in burst]
            deadline, loads = time.monotonic() + 60, [0, 0]
            while time.monotonic() < deadline and not (all(loads) and sum(loads) >= BURST // 2):
                loads = [load(decode) for decode in fleet.decodes]
                time.sleep(0.05)
            assert all(loads) and sum(loads) >= BURST // 2, f"the burst never ran on both decode servers: {loads}"
            victim = max(range(2), key=lambda i: loads[i])
            os.killpg(fleet.decodes[victim].process.pid, signal.SIGKILL)
            killed_at[0] = time.monotonic()
            workload.slow_down(fleet.decodes[1 - victim].base_url, None)
            unfinished = sum(1 for f in futures if not f.done())
            dead, unlisted = fleet.decodes[victim].base_url, None
            while unlisted is None or not all(f.done() for f in futures):  # they end as the router drops it
                if unlisted is None and dead not in healthy_workers(fleet.router.base_url):
                    unlisted = time.monotonic() - killed_at[0]
                if time.monotonic() - killed_at[0] > CLIENT_TIMEOUT_S + 10:
                    break
                time.sleep(0.2)
            outcomes = [future.result() for future in futures]  # each bounded by CLIENT_TIMEOUT_S
    finally:
        for decode in fleet.decodes:
            if decode.alive():
                workload.slow_down(decode.base_url, None)
    fleet.decodes[victim].process.wait()
    listed = healthy_workers(fleet.router.base_url)
    result = Killed(outcomes, loads, unfinished, victim, fleet.decodes[1 - victim], unlisted, listed)
    print(f"\ndecode servers' loads at the kill {loads} ({unfinished} requests unanswered), killed decode server "
          f"{victim}; the router dropped it from its list {unlisted} s after the kill")  # fmt: skip
    for outcome in outcomes:
        print(f"  {outcome.name:16s} {outcome.status:9s} {outcome.ended_after_kill_s:6.2f} s  {outcome.error}")
    return result


def test_a_decode_server_killed_under_a_burst_leaves_no_request_hanging(killed):
    statuses = [outcome.status for outcome in killed.outcomes]
    assert len(statuses) == BURST and "hung" not in statuses, killed.outcomes
    assert max(outcome.ended_after_kill_s for outcome in killed.outcomes) < CLIENT_TIMEOUT_S
    for outcome in killed.outcomes:  # an error is the server's or the router's answer, not a dropped connection
        assert outcome.status == "completed" or outcome.error[:3].isdigit(), outcome


def test_the_router_drops_the_dead_decode_server_and_serves_the_following_requests_with_the_other(fleet, files, killed):
    assert killed.unlisted_after_s is not None and killed.unlisted_after_s < 30, killed
    assert sorted(killed.listed) == sorted([fleet.prefill.base_url, killed.survivor.base_url])
    after = workload.mixed_requests(files, 8, video_rates=(None, 0.75))
    served_before = served_chats(killed.survivor)
    with ThreadPoolExecutor(max_workers=len(after)) as pool:
        responses = list(pool.map(lambda request: chat(fleet.router.base_url, request, 8), after))
    assert [r.status_code for r in responses] == [200] * len(after), [error_message(r) for r in responses]
    assert all(r.json()["choices"][0]["message"]["content"] for r in responses)
    assert served_chats(killed.survivor) - served_before == len(after)
    # a pruned video through the survivor: the q = .75 prompt is shorter than the default's (q = .5)
    prompts = {request.kind: r.json()["usage"]["prompt_tokens"] for request, r in zip(after, responses, strict=True)}
    assert prompts["video q=0.75"] < prompts["video"]
    assert fleet.prefill.alive() and killed.survivor.alive()


def test_bad_settings_after_the_kill_still_get_400_and_a_pruned_video_is_served(fleet, files, killed):
    video = workload.mixed_requests(files, 3, video_rates=(None,))[2]
    for setting, message in BAD_SETTINGS:
        response = chat(fleet.router.base_url, video, **setting)
        assert response.status_code == 400 and message in error_message(response), (setting, response.text)
    good = chat(fleet.router.base_url, video, **pruning_setting(0.75))
    assert good.status_code == 200, good.text
