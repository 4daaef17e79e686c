"""Qwen3.5 served with its MTP head (`--speculative-algorithm NEXTN`, chain drafts) and video pruning.

On the CPU route, float32, with 29-token chunks (they cut inside every video and on framing tokens):
- a speculating plugin server against a plugin server without speculation: greedy tokens equal and
  logprobs within SPECULATION_TOLERANCE, at q = 0, .5 and .75 (EVS) and under VidCom2, for text,
  image, video, image+video and two videos; a radix repeat; 8 concurrent requests at mixed rates;
- against upstream SGLang speculating with the same flags: at q = 0, bit-identical;
- the rotary positions every target and draft forward of a pruned request was handed (the trace),
  against the rule computed here from transformers' `get_rope_index` and the served keep-mask;
- Qwen3.5-MoE, speculating against not, on a pruned video;
- Qwen3-VL with an EAGLE3 draft model that reads M-RoPE: the same, against upstream and no speculation;
- in graph mode (`sglang_evs.testing.server`), as a GPU serves by default, where SGLang's verify,
  draft-decode, draft-extend and prefill graphs replay: the tokens of the same server in eager mode
  (logprobs within SPECULATION_TOLERANCE) with at least its acceptance, bit-identical to upstream in
  graph mode at q = 0, and the positions every replay read (the trace), against the rule.
The checkpoints' MTP heads are made for drafts that are accepted (`testing/tiny_qwen_vl.py`), so the
draft really drafts: a head that failed to load would accept none.
"""

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.benchmarks import load_benchmark
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.hf_reference import expected_positions, rule_positions
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    generate,
    media_kwargs,
    per_request_rate,
)
from sglang_evs.testing.server import PREFILL_GRAPHS_BY_FLAG, Launch, run_to_exit, running_servers
from sglang_evs.testing.workload import replayed_padded, send_alone, send_together, side_by_side

pytestmark = pytest.mark.slow  # twelve servers

NEXTN = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3")  # fmt: skip
# The MoE pair drafts three steps deep (four verify tokens): a longer chain over the pruned prompt.
NEXTN_THREE_STEPS = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")  # fmt: skip
CHUNK = 29
# The graph-mode servers serve one request at a time: decode and verify graphs for batches of 1, 2 and 4 (SGLang
# captures 19 sizes by default, 20-30 s of a tiny speculating server's start on 2 cores).
GRAPH_BATCHES = ("--cuda-graph-bs-decode", "1", "2", "4")
# Gated DeltaNet conv states in float32 (SGLang's default rounds them to bfloat16 between steps, which
# a verify over three draft tokens does not: ~1e-3 apart in logprobs).
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# Speculating vs not, both float32: the target computes the same tokens in verify batches of three
# instead of one at a time (other matmul shapes, summation orders). Measured here: up to 1.7e-6.
SPECULATION_TOLERANCE = 1e-4
MAX_NEW_TOKENS = 10
EVS_RATES = (0.5, 0.75)


def traced(trace_path: Path) -> dict[str, str]:
    """A server's environment that traces, every forward's rotary positions included."""
    return {trace.ENV: str(trace_path), trace.POSITIONS_ENV: "1"}


def cases(media_dir: Path, clips: dict[str, Path]) -> dict[str, tuple[str, dict]]:
    return {
        "text": (chat_prompt(text="Tell me a long story about a cat."), {}),
        "image": (chat_prompt(IMAGE), media_kwargs(images=[media_dir / "image.png"])),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]])),
        "image_video": (
            chat_prompt(IMAGE, VIDEO),
            media_kwargs(images=[media_dir / "image2.png"], videos=[clips["noise"]]),
        ),
        "two_videos": (chat_prompt(VIDEO, VIDEO), media_kwargs(videos=[clips["static"], clips["moving"]])),
    }


VIDEO_CASES = ("video", "image_video", "two_videos")
SETTINGS = {  # name -> the request's pruning fields
    "q=0": {},
    **{f"evs q={q}": per_request_rate(q) for q in EVS_RATES},
    "vidcom2 q=0.75": per_request_rate(0.75, "vidcom2"),
    "images and evs q=0.5": {"mm_processor_kwargs": {"image_pruning_rate": 0.5, "video_pruning_rate": 0.5}},
}


class TracedRequest(NamedTuple):
    clip: Path  # a clip no earlier request sent
    reply: Generation  # at q = .5
    events: list[dict]  # its rope_positions events
    kept: list[int]  # its keep-mask (kept pad indices)


@dataclass
class Served:
    speculating: dict[tuple[str, str], Generation] = field(default_factory=dict)  # (case, setting)
    plain: dict[tuple[str, str], Generation] = field(default_factory=dict)
    upstream: dict[str, Generation] = field(default_factory=dict)  # q = 0, upstream speculating
    radix_repeat: Generation | None = None  # video at .75 again
    mixed_alone: list[Generation] = field(default_factory=list)
    mixed_together: list[Generation] = field(default_factory=list)
    mixed_prefill: tuple[int, int, int] = (0, 0, 0)
    traced: TracedRequest | None = None
    moe: dict[str, Generation] = field(default_factory=dict)  # "speculating" / "plain"
    benchmark: dict = field(default_factory=dict)  # benchmark/bench_speculative.py's summary
    graphs: dict[tuple[str, str], Generation] = field(default_factory=dict)  # speculating in graph mode
    graphs_upstream: dict[str, Generation] = field(default_factory=dict)  # q = 0, upstream in graph mode
    graphs_traced: TracedRequest | None = None
    padded: list[Generation] = field(default_factory=list)  # PADDED at once in graph mode
    padded_replays: list[dict] = field(default_factory=list)  # their `graph_replay` events
    padded_eager: list[Generation] = field(default_factory=list)  # each alone, speculating eagerly


# three requests at once: 3 live rows in a graph of 4 (GRAPH_BATCHES), the fourth SGLang's padding
PADDED = tuple((chat_prompt(text=text), {}, 0.0) for text in ("Count the objects.", "Say yes or no.", "Name a color."))
PADDED_TOKENS = 16


def mixed(all_cases: dict[str, tuple[str, dict]]) -> list[tuple[str, dict, float]]:
    """8 requests, text and image among videos at three rates."""
    rates = {"text": 0.0, "image": 0.75, "video": 0.75, "image_video": 0.5, "two_videos": 0.0}
    first = [(prompt, kw, rates[name]) for name, (prompt, kw) in all_cases.items()]
    more = [(all_cases[name][0], all_cases[name][1], q) for name, q in
            (("video", 0.5), ("two_videos", 0.75), ("image_video", 0.0))]  # fmt: skip
    return first + more


def trace_pruned_request(base_url: str, trace_path: Path, out: Path, seed: int) -> TracedRequest:
    """An unseen clip at q = .5 on a server traced with positions, and what the trace shows of it. At .5 the
    kept tokens spill past the first group: their layout before the mask (the canonical split,
    `methods/canonical.py`) is not the mask's, so the request's positions must be corrected."""
    clip = media.write_clip(out / "unseen.mp4", "moving", num_frames=16, fps=4, seed=seed)
    events_before = len(trace.read(trace_path, "rope_positions"))
    reply = ask(base_url, (chat_prompt(VIDEO), media_kwargs(videos=[clip])), per_request_rate(0.5))
    events = trace.read(trace_path, "rope_positions")[events_before:]
    return TracedRequest(clip, reply, events, trace.read(trace_path, "keep_mask")[-1]["kept"])


def ask(base_url: str, case: tuple[str, dict], setting: dict) -> Generation:
    prompt, kw = case
    return generate(base_url, prompt, max_new_tokens=MAX_NEW_TOKENS, **kw, **setting)[0]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("speculation_clips")
    kinds = media.CLIP_KINDS
    return {kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=9) for kind in kinds}


def qwen3_5_launches(dense: Path, moe: Path, out: Path) -> tuple[Launch, ...]:
    args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK)]
    trace_path = out / "trace.jsonl"
    return (
        Launch(dense, out / "speculating.log", [*args, *NEXTN],
               {**HYBRID_ENV, **traced(trace_path)}),
        Launch(dense, out / "plain.log", args, HYBRID_ENV),
        Launch(dense, out / "upstream.log", [*args, *NEXTN], {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}),
        Launch(moe, out / "moe-speculating.log", [*args, *NEXTN_THREE_STEPS], HYBRID_ENV),
        Launch(moe, out / "moe-plain.log", args, HYBRID_ENV),
        Launch(dense, out / "graphs.log", [*args, *NEXTN, *GRAPH_BATCHES],
               {**HYBRID_ENV, **traced(out / "graphs-trace.jsonl")}, graph_mode=True),
        Launch(dense, out / "graphs-upstream.log", [*args, *NEXTN, *GRAPH_BATCHES],
               {**HYBRID_ENV, "SGLANG_PLUGINS": "none"}, graph_mode=True),
    )  # fmt: skip


GRAPH_CASES = (("text", "q=0"), *((name, setting) for name in VIDEO_CASES for setting in ("q=0", "evs q=0.5")))


def serve_qwen3_5(servers, all_cases: dict, clips: dict[str, Path], out: Path) -> Served:
    speculating, plain, upstream, moe_speculating, moe_plain, graphs, graphs_upstream = servers
    trace_path = out / "trace.jsonl"
    served = Served()
    for name, case in all_cases.items():
        served.upstream[name] = ask(upstream.base_url, case, {})
        for setting_name, setting in SETTINGS.items():
            if setting_name != "q=0" and name not in VIDEO_CASES:
                continue
            served.speculating[name, setting_name] = ask(speculating.base_url, case, setting)
            if (name, setting_name) == ("video", "evs q=0.75"):  # at once: the hybrid cache keeps few states
                served.radix_repeat = ask(speculating.base_url, case, setting)
            served.plain[name, setting_name] = ask(plain.base_url, case, setting)

    served.mixed_alone = send_alone(plain.base_url, mixed(all_cases))
    served.mixed_together, served.mixed_prefill = send_together(speculating.base_url, mixed(all_cases), trace_path)

    served.traced = trace_pruned_request(speculating.base_url, trace_path, out, seed=41)

    bench = load_benchmark("bench_speculative")  # its measurement, on this module's two Qwen3.5 servers
    samples = bench.measure({True: speculating.base_url, False: plain.base_url}, clips["moving"], 0.75, 2, 6)
    served.benchmark = bench.summarize(samples)

    moe_case = (chat_prompt(VIDEO), media_kwargs(videos=[clips["noise"]]))
    served.moe["speculating"] = ask(moe_speculating.base_url, moe_case, per_request_rate(0.75))
    served.moe["plain"] = ask(moe_plain.base_url, moe_case, per_request_rate(0.75))

    for name, setting in GRAPH_CASES:
        served.graphs[name, setting] = ask(graphs.base_url, all_cases[name], SETTINGS[setting])
    for name in ("text", "video", "image_video"):
        served.graphs_upstream[name] = ask(graphs_upstream.base_url, all_cases[name], {})
    served.graphs_traced = trace_pruned_request(graphs.base_url, out / "graphs-trace.jsonl", out, seed=41)
    served.padded_eager = [generate(speculating.base_url, p, PADDED_TOKENS, **kw)[0] for p, kw, _ in PADDED]
    served.padded, served.padded_replays = replayed_padded(
        graphs.base_url, PADDED, out / "graphs-trace.jsonl", "TARGET_VERIFY", PADDED_TOKENS
    )
    return served


def assert_same(got: Generation, want: Generation, context: str) -> None:
    assert_same_generation(got, want, SPECULATION_TOLERANCE, context)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculation_gives_the_tokens_of_no_speculation(served, setting):
    compared = [key for key in served.speculating if key[1] == setting]
    assert len(compared) == (5 if setting == "q=0" else 3)
    for key in compared:
        assert_same(served.speculating[key], served.plain[key], f"{key}")
    if setting != "q=0":  # pruning happened, as asked
        for key in compared:
            assert served.speculating[key].prompt_tokens < served.plain[key[0], "q=0"].prompt_tokens, key
    if "image_pruning_rate" in SETTINGS[setting].get("mm_processor_kwargs", {}):
        meta = served.speculating["image_video", setting].meta
        assert meta["image_tokens_after_pruning"] < meta["image_tokens_before_pruning"]


def test_at_q0_the_plugin_speculates_bit_identically_to_upstream(served):
    for name, want in served.upstream.items():
        got = served.speculating[name, "q=0"]
        assert got.output_ids == want.output_ids and got.logprobs == want.logprobs, name
        assert got.top_logprobs == want.top_logprobs, name
    # on text the draft reads the positions upstream's reads (every M-RoPE axis is the index): the same drafts
    text, upstream_text = served.speculating["text", "q=0"].meta, served.upstream["text"].meta
    assert (text["spec_accept_length"], text["spec_verify_ct"]) == (
        upstream_text["spec_accept_length"], upstream_text["spec_verify_ct"]
    )  # fmt: skip


def test_drafts_are_accepted_and_reported_as_upstream_reports_them(served):
    upstream_keys = {key for key in served.upstream["text"].meta if key.startswith("spec_")}
    assert {"spec_accept_length", "spec_verify_ct"} <= upstream_keys
    for setting in ("q=0", "evs q=0.75"):
        for name in VIDEO_CASES:
            meta = served.speculating[name, setting].meta
            assert upstream_keys <= meta.keys(), (name, setting)
            assert meta["spec_verify_ct"] < MAX_NEW_TOKENS  # some verify accepted a draft
            assert meta["spec_accept_length"] > 1.0, (name, setting)
    assert "spec_accept_length" not in served.plain["video", "q=0"].meta


def test_a_radix_repeat_of_a_pruned_video_gives_the_same_tokens(served):
    first = served.speculating["video", "evs q=0.75"]
    assert served.radix_repeat.cached_tokens > 0
    assert_same(served.radix_repeat, first, "radix repeat")


def test_eight_concurrent_mixed_requests_equal_each_served_alone_without_speculation(served):
    batched, cached, prompt = served.mixed_prefill
    assert batched > 0, "no prefill forward held two requests' media"
    assert cached < prompt // 4
    for i, (got, want) in enumerate(zip(served.mixed_together, served.mixed_alone, strict=True)):
        assert_same(got, want, f"mixed request {i}")


def test_the_benchmark_measures_mtp_and_pruning_alone_and_together(served):
    configs = served.benchmark
    assert list(configs) == ["neither", "pruning", "MTP", "MTP + pruning"]
    # pruning shortens the prompt, speculation does not; only the speculating server reports acceptance
    assert configs["pruning"]["prompt_tokens"] == configs["MTP + pruning"]["prompt_tokens"]
    assert configs["pruning"]["prompt_tokens"] < configs["neither"]["prompt_tokens"] == configs["MTP"]["prompt_tokens"]
    assert configs["neither"]["mean_accept_length"] is None and configs["pruning"]["mean_accept_length"] is None
    assert configs["MTP"]["mean_accept_length"] > 1 and configs["MTP + pruning"]["mean_accept_length"] > 1
    for row in configs.values():
        for key in ("ttft_vs_neither", "tpot_vs_neither"):
            assert len(row[key]["per_round"]) == 2
            assert row[key]["low"] <= row[key]["geometric_mean"] <= row[key]["high"]


def test_moe_speculation_gives_the_tokens_of_no_speculation(served):
    """Three draft steps (`--speculative-num-steps 3`) on a video pruned at .75."""
    assert_same(served.moe["speculating"], served.moe["plain"], "Qwen3.5-MoE, video at .75")
    assert served.moe["speculating"].meta["spec_accept_length"] > 1.0


# --- graph mode: SGLang's verify, draft and prefill graphs replay, as on a GPU by default ------------


def graph_mode_requests(served: "Served | ServedEagle3") -> list[tuple[Generation, Generation]]:
    """(graph mode, eager mode) replies of the same requests, the traced one (q = .5) included."""
    pairs = [(served.graphs[key], served.speculating[key]) for key in served.graphs]
    return [*pairs, (served.graphs_traced.reply, served.traced.reply)]


def test_graph_mode_speculates_the_tokens_of_eager_mode_accepting_as_many_drafts(served):
    pairs = graph_mode_requests(served)
    for graph, eager in pairs:
        assert_same(graph, eager, "graph mode vs eager")
    verifies = [sum(reply.meta["spec_verify_ct"] for reply in replies) for replies in zip(*pairs, strict=True)]
    assert verifies[0] <= verifies[1]  # as many tokens in no more verifies: drafts accepted at least as often


def test_graph_mode_replays_padded_batches_with_the_tokens_of_eager_mode(served):
    """Three requests at once replay verify and draft graphs of 4 rows, one of them SGLang's padding (its Mamba
    slot -1): the Gated DeltaNet stand-ins must neither size anything by which rows are live (a capture
    froze another padding) nor write the padding row's states into a live request's slot."""
    padded = [event for event in served.padded_replays if event["requests"] == len(PADDED)]
    assert any(event["mode"] == "TARGET_VERIFY" for event in padded)
    assert any(event["phase"] == "draft_decode" for event in padded)
    for got, want in zip(served.padded, served.padded_eager, strict=True):
        assert_same(got, want, "three at once in graph mode vs alone eagerly")


def test_graph_mode_at_q0_is_bit_identical_to_upstream_in_graph_mode(served):
    for name, want in served.graphs_upstream.items():
        got = served.graphs[name, "q=0"]
        assert (got.output_ids, got.logprobs, got.top_logprobs) == (want.output_ids, want.logprobs, want.top_logprobs)
        assert got.meta["spec_verify_ct"] == want.meta["spec_verify_ct"], name


def assert_replayed_at_the_rules_positions(traced_request: TracedRequest, model_dir: Path, draft_prefill: bool) -> None:
    """Every forward at the rule's positions, the replayed ones traced from the buffer the replay read: target
    verify, draft decode and draft extend always replay, the target's prefill chunks where they fit a
    bucket, the draft's where its prefill has graphs (`draft_prefill`)."""
    assert_forwards_at_the_rules_positions(traced_request, model_dir)
    replayed = {(event["model"], event["mode"]) for event in traced_request.events if event.get("replayed")}
    want = {("target", "EXTEND"), ("target", "TARGET_VERIFY"), ("draft", "DECODE"), ("draft", "DRAFT_EXTEND_V2")}
    assert replayed == want | ({("draft", "EXTEND")} if draft_prefill else set())


def test_graph_mode_forwards_replay_at_the_rules_positions(served, tiny_qwen3_5_mtp_dir):
    assert_replayed_at_the_rules_positions(served.graphs_traced, tiny_qwen3_5_mtp_dir, draft_prefill=True)


# --- the positions every forward was handed, against the rule -------------------------------------


def assert_forwards_at_the_rules_positions(traced_request: TracedRequest, model_dir: Path) -> None:
    clip, reply, events, kept = traced_request
    rule, offset = rule_positions(str(model_dir), str(clip), tuple(kept))
    assert reply.prompt_tokens == rule.shape[1]
    assert reply.meta["video_tokens_after_pruning"] < reply.meta["video_tokens_before_pruning"]
    assert offset == int(rule.max()) + 1 - rule.shape[1]  # decode continues after the unpruned prompt
    seen = {(event["model"], event["mode"]) for event in events}
    assert {("target", "EXTEND"), ("draft", "EXTEND"), ("target", "TARGET_VERIFY"), ("draft", "DECODE"),
            ("draft", "DRAFT_EXTEND_V2")} <= seen  # fmt: skip
    prompt_rows = {"target": 0, "draft": 0}
    for event in events:
        got = torch.tensor(event["positions"])
        want = expected_positions(event, rule, offset)
        assert torch.equal(got, want), f"{event['model']} {event['mode']} at seq_len {event['seq_lens']}"
        if event["mode"] == "EXTEND":
            prompt_rows[event["model"]] += got.shape[1]
    # every prompt row went through both, chunk by chunk (less what the radix cache held)
    assert prompt_rows["target"] == prompt_rows["draft"] == rule.shape[1] - reply.cached_tokens


def test_every_draft_and_target_forward_of_a_pruned_request_uses_the_rules_positions(served, tiny_qwen3_5_mtp_dir):
    assert_forwards_at_the_rules_positions(served.traced, tiny_qwen3_5_mtp_dir)


# --- Qwen3-VL with an EAGLE3 draft model whose config reads M-RoPE (SGLang's `LlamaForCausalLMEagle3`) ---


@dataclass
class ServedEagle3:
    speculating: dict[tuple[str, str], Generation] = field(default_factory=dict)
    plain: dict[tuple[str, str], Generation] = field(default_factory=dict)
    upstream: dict[str, Generation] = field(default_factory=dict)
    traced: TracedRequest | None = None
    # the server speculating with a draft blind to M-RoPE positions: a pruning request's answer, and the
    # same video without pruning before and after it
    blind_refusal: requests.Response | None = None
    blind_before: Generation | None = None
    blind_after: Generation | None = None
    graphs: dict[tuple[str, str], Generation] = field(default_factory=dict)  # speculating in graph mode
    graphs_traced: TracedRequest | None = None


@pytest.fixture(scope="module")
def eagle3_draft_dir(tiny_qwen3_vl_six_layers_dir, tmp_path_factory) -> Path:
    from sglang_evs.testing import tiny_model

    return tiny_model.build_eagle3_draft(tmp_path_factory.mktemp("eagle3") / "draft", tiny_qwen3_vl_six_layers_dir)


@pytest.fixture(scope="module")
def blind_eagle3_draft_dir(eagle3_draft_dir, tmp_path_factory) -> Path:
    """The same EAGLE3 draft with 1-D rotary (no `mrope_section`): SGLang serves it, the plugin refuses to
    prune with it (`refusals.draft_reads_target_positions`)."""
    out = tmp_path_factory.mktemp("eagle3_blind") / "draft"
    shutil.copytree(eagle3_draft_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["rope_scaling"].pop("mrope_section")
    (out / "config.json").write_text(json.dumps(config))
    return out


def eagle3_flags(draft: Path) -> list[str]:
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft), *NEXTN[2:]]


def eagle3_launches(model: Path, draft: Path, blind_draft: Path, out: Path) -> tuple[Launch, ...]:
    trace_path = out / "trace.jsonl"
    args = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK)]
    return (
        Launch(model, out / "speculating.log", [*args, *eagle3_flags(draft)], traced(trace_path)),
        Launch(model, out / "plain.log", args),
        Launch(model, out / "upstream.log", [*args, *eagle3_flags(draft)], {"SGLANG_PLUGINS": "none"}),
        Launch(model, out / "blind.log", [*args, *eagle3_flags(blind_draft)]),
        # prefill graphs by flag: its q = 0 requests carry no pruning fields (`server.PREFILL_GRAPHS_BY_FLAG`)
        Launch(model, out / "graphs.log", [*args, *eagle3_flags(draft), *GRAPH_BATCHES, *PREFILL_GRAPHS_BY_FLAG],
               traced(out / "graphs-trace.jsonl"), graph_mode=True),
    )  # fmt: skip


def serve_eagle3(servers, all_cases: dict, out: Path) -> ServedEagle3:
    speculating, plain, upstream, blind, graphs = servers
    trace_path = out / "trace.jsonl"
    served = ServedEagle3()
    for name in ("text", "image", "video"):
        served.upstream[name] = ask(upstream.base_url, all_cases[name], {})
        served.speculating[name, "q=0"] = ask(speculating.base_url, all_cases[name], {})
    for name in ("video", "image_video"):
        for setting_name in ("evs q=0.5", "evs q=0.75", "vidcom2 q=0.75"):
            served.speculating[name, setting_name] = ask(speculating.base_url, all_cases[name], SETTINGS[setting_name])
            served.plain[name, setting_name] = ask(plain.base_url, all_cases[name], SETTINGS[setting_name])
    served.traced = trace_pruned_request(speculating.base_url, trace_path, out, seed=43)
    prompt, kw = all_cases["video"]
    served.blind_before = ask(blind.base_url, all_cases["video"], {})
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, **kw, **SETTINGS["evs q=0.5"]}
    served.blind_refusal = requests.post(f"{blind.base_url}/generate", json=body, timeout=120)
    served.blind_after = ask(blind.base_url, all_cases["video"], {})
    for key in (("video", "q=0"), ("video", "evs q=0.5"), ("image_video", "vidcom2 q=0.75")):
        served.graphs[key] = ask(graphs.base_url, all_cases[key[0]], SETTINGS[key[1]])
    served.graphs_traced = trace_pruned_request(graphs.base_url, out / "graphs-trace.jsonl", out, seed=43)
    return served


@pytest.fixture(scope="module")
def served_both(media_dir, clips, tiny_qwen3_5_mtp_dir, tiny_qwen3_5_moe_mtp_dir, tiny_qwen3_vl_six_layers_dir,
                eagle3_draft_dir, blind_eagle3_draft_dir, tmp_path_factory) -> tuple[Served, ServedEagle3]:  # fmt: skip
    """The twelve servers of this module, started together (starting is mostly one core importing)."""
    qwen3_5_out, eagle3_out = tmp_path_factory.mktemp("speculation"), tmp_path_factory.mktemp("eagle3_speculation")
    eagle3 = eagle3_launches(tiny_qwen3_vl_six_layers_dir, eagle3_draft_dir, blind_eagle3_draft_dir, eagle3_out)
    launches = (*qwen3_5_launches(tiny_qwen3_5_mtp_dir, tiny_qwen3_5_moe_mtp_dir, qwen3_5_out), *eagle3)
    all_cases = cases(media_dir, clips)
    with running_servers(*launches) as servers:
        qwen3_5, eagle3 = side_by_side(
            lambda: serve_qwen3_5(servers[:7], all_cases, clips, qwen3_5_out),
            lambda: serve_eagle3(servers[7:], all_cases, eagle3_out),
        )
        return qwen3_5, eagle3


@pytest.fixture(scope="module")
def served(served_both) -> Served:
    return served_both[0]


@pytest.fixture(scope="module")
def served_eagle3(served_both) -> ServedEagle3:
    return served_both[1]


def test_eagle3_at_q0_the_plugin_speculates_bit_identically_to_upstream(served_eagle3):
    for name, want in served_eagle3.upstream.items():
        got = served_eagle3.speculating[name, "q=0"]
        assert got.output_ids == want.output_ids and got.logprobs == want.logprobs, name
        assert got.meta["spec_verify_ct"] > 0, name  # it did speculate


def test_eagle3_pruned_videos_get_the_tokens_of_no_speculation(served_eagle3):
    assert len(served_eagle3.plain) == 6
    for key, want in served_eagle3.plain.items():
        got = served_eagle3.speculating[key]
        assert_same(got, want, f"EAGLE3 {key}")
        assert got.meta["spec_verify_ct"] < MAX_NEW_TOKENS, key  # some verify accepted a draft
    unpruned = served_eagle3.speculating["video", "q=0"].prompt_tokens
    assert all(served_eagle3.plain["video", setting].prompt_tokens < unpruned for _, setting in served_eagle3.plain)
    for name in ("video", "image_video"):  # a higher rate keeps fewer rows, an image among them too
        half, three_quarters = (served_eagle3.plain[name, f"evs q={rate}"].prompt_tokens for rate in (0.5, 0.75))
        assert three_quarters < half, name


def test_eagle3_draft_and_target_forwards_use_the_rules_positions(served_eagle3, tiny_qwen3_vl_six_layers_dir):
    assert_forwards_at_the_rules_positions(served_eagle3.traced, tiny_qwen3_vl_six_layers_dir)


def test_eagle3_in_graph_mode_speculates_as_in_eager_mode_at_the_rules_positions(
    served_eagle3, tiny_qwen3_vl_six_layers_dir
):
    """The draft's prefill stays eager (`plugin.keep_mrope_draft_prefill_eager`: SGLang's prefill graph would
    give this draft no M-RoPE positions); every other forward replays."""
    for graph, eager in graph_mode_requests(served_eagle3):
        assert_same(graph, eager, "EAGLE3 graph mode vs eager")
        assert graph.meta["spec_verify_ct"] <= eager.meta["spec_verify_ct"]
    assert_replayed_at_the_rules_positions(
        served_eagle3.graphs_traced, tiny_qwen3_vl_six_layers_dir, draft_prefill=False
    )


BLIND_DRAFT = "speculative decoding with a draft blind to M-RoPE positions (--speculative-algorithm EAGLE3)"


def test_a_pruning_request_to_a_server_speculating_with_a_refused_draft_gets_400(served_eagle3):
    """The server speculates with a 1-D-rotary EAGLE3 draft (no pruning default): a request asking for
    pruning is refused naming the setting and the draft, and the server serves on, the same tokens."""
    refusal = served_eagle3.blind_refusal
    assert refusal.status_code == 400, refusal.text
    assert "video_pruning_rate=0.5" in refusal.text and BLIND_DRAFT in refusal.text
    assert served_eagle3.blind_after.output_ids == served_eagle3.blind_before.output_ids
    assert served_eagle3.blind_before.meta["spec_verify_ct"] > 0  # it speculates


def test_a_pruning_default_with_a_refused_draft_stops_at_startup(tiny_qwen3_vl_six_layers_dir, blind_eagle3_draft_dir):
    done = run_to_exit(
        tiny_qwen3_vl_six_layers_dir,
        [*eagle3_flags(blind_eagle3_draft_dir), "--json-model-override-args", '{"video_pruning_rate": 0.5}'],
    )
    assert done.returncode != 0
    assert "video_pruning_rate=0.5" in done.stderr + done.stdout and BLIND_DRAFT in done.stderr + done.stdout


# --- Qwen4-Exp's MTP layer (SGLang's `Qwen4ExpForCausalLMMTP`, given the target's positions by the plugin) ---

# Its MTP weights are drawn by SGLang (`--speculative-draft-load-format dummy`): the tiny checkpoint declares the
# layer (as released configs do) without weights, which transformers' Qwen4-Exp has no module for. Its drafts
# are then rarely accepted; the target decides every token, and the positions it is handed are the point here.
QWEN4_EXP_NEXTN = (*NEXTN, "--speculative-draft-load-format", "dummy", "--dtype", "bfloat16")


@dataclass
class ServedQwen4Exp:
    speculating: dict[float, Generation] = field(default_factory=dict)  # the moving clip at q
    plain: dict[float, Generation] = field(default_factory=dict)
    upstream: Generation | None = None  # q = 0, upstream speculating
    traced: TracedRequest | None = None


@pytest.fixture(scope="module")
def served_qwen4_exp(tiny_qwen4_exp_mtp_dir, clips, tmp_path_factory) -> ServedQwen4Exp:
    out, got = tmp_path_factory.mktemp("qwen4_exp_mtp"), ServedQwen4Exp()
    trace_path = out / "trace.jsonl"
    args = ["--chunked-prefill-size", str(CHUNK)]
    launches = (
        Launch(tiny_qwen4_exp_mtp_dir, out / "speculating.log", [*args, *QWEN4_EXP_NEXTN], traced(trace_path)),
        Launch(tiny_qwen4_exp_mtp_dir, out / "upstream.log", [*args, *QWEN4_EXP_NEXTN], {"SGLANG_PLUGINS": "none"}),
        Launch(tiny_qwen4_exp_mtp_dir, out / "plain.log", [*args, "--dtype", "bfloat16"]),
    )
    with running_servers(*launches) as (speculating, upstream, plain):
        video = (chat_prompt(VIDEO), media_kwargs(videos=[clips["moving"]]))
        for q in (0.0, 0.75):
            got.speculating[q] = ask(speculating.base_url, video, per_request_rate(q))
            got.plain[q] = ask(plain.base_url, video, per_request_rate(q))
        got.upstream = ask(upstream.base_url, video, per_request_rate(0.0))
        got.traced = trace_pruned_request(speculating.base_url, trace_path, out, seed=31)
    return got


def test_qwen4_exp_speculates_with_pruning_at_the_rules_positions(served_qwen4_exp, tiny_qwen4_exp_mtp_dir):
    """Every target and draft forward of a pruned video (prefill chunks, verifies, draft steps) at the rule's
    positions; the draft reads the target's M-RoPE positions as Qwen3.5's does."""
    assert_forwards_at_the_rules_positions(served_qwen4_exp.traced, tiny_qwen4_exp_mtp_dir)


def test_qwen4_exp_speculating_gives_the_tokens_of_no_speculation_and_of_upstream(served_qwen4_exp):
    """bfloat16: a verify batch rounds otherwise than a decode step, so a near-tie may break either way."""
    got = served_qwen4_exp
    for q in (0.0, 0.75):
        assert got.speculating[q].meta["spec_verify_ct"] > 0
        assert_same_generation(got.speculating[q], got.plain[q], 0.1, f"q = {q}", near_ties=True)
    assert got.speculating[0.75].prompt_tokens < got.speculating[0.0].prompt_tokens
    want = got.upstream
    assert (got.speculating[0.0].output_ids, got.speculating[0.0].logprobs) == (want.output_ids, want.logprobs)
