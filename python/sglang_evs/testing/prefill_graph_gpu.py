"""The GPU prefill-graph check's servers, requests and checks (`test/models/test_prefill_cuda_graph_gpu.py`
runs them on the GPU route; its CPU dry run, `test_prefill_cuda_graph_gpu_setup.py`, on CPU servers in graph
mode): the plugin with graphs (traced), upstream with the same flags, the plugin with every graph off."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sglang_evs import trace
from sglang_evs.runtime.gpu_route import SERVER_ARGS
from sglang_evs.testing.compare import assert_same_generation
from sglang_evs.testing.gpu import ROUTE_ON, without_graphs
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    generate,
    media_kwargs,
    per_request_rate,
)
from sglang_evs.testing.server import PREFILL_GRAPHS_BY_FLAG, Launch, running_servers

# bfloat16's step is 2^-8 of a value: the tiny model's logits (spread about 4) then differ by a few hundredths
# between a padded (replayed) batch and an eager one; the bounds are several times that.
Q0_TOLERANCE = 0.25  # against upstream, whose prefill is eager
PRUNED_TOLERANCE = 0.25  # against the same server with every graph off
CHUNK = 64
PRUNED = (("evs", 0.75), ("vidcom2", 0.75))


def gpu_server_args() -> list[str]:
    """The plugin's and upstream's GPU server: the route's flags, bfloat16, 64-token chunks, graphs as
    SGLang sets them (prefill buckets up to the chunk size), decode graphs for batches up to 8."""
    return [
        *SERVER_ARGS, "--dtype", "bfloat16", "--chunked-prefill-size", str(CHUNK),
        "--cuda-graph-max-bs-decode", "8", "--max-total-tokens", "16384", "--mem-fraction-static", "0.15",
    ]  # fmt: skip


def rate_prompt(label: str, *media: str) -> str:
    """The tiny model's chat prompt with `label` before the media: new to the radix cache for each label."""
    return chat_prompt(*media).replace("user\n", f"user\n{label}: ", 1)


def cases(media: Path, method: str = "evs", rate: float = 0.0) -> dict[str, tuple[str, dict]]:
    """name -> (prompt, request fields): image (q = 0 only: images are not pruned), video, image + video.
    q = 0 requests carry no pruning fields, so upstream gets the same request."""
    label = f"{method} at {rate}" if rate else "Unpruned"
    pruning = per_request_rate(rate, method) if rate else {}
    out = {
        "video": (rate_prompt(label, VIDEO), {**media_kwargs(videos=[media / "moving.mp4"]), **pruning}),
        "image+video": (
            rate_prompt(label, IMAGE, VIDEO),
            {**media_kwargs(images=[media / "image2.png"], videos=[media / "noise.mp4"]), **pruning},
        ),
    }
    if not rate:
        out["image"] = (rate_prompt(label, IMAGE), media_kwargs(images=[media / "image.png"]))
    return {f"{name} {label}": case for name, case in out.items()}


def all_cases(media: Path) -> dict[str, tuple[str, dict]]:
    out = cases(media)
    for method, rate in PRUNED:
        out |= cases(media, method, rate)
    return out


def concurrent_batch(media: Path) -> tuple[list[str], dict]:
    """Image, text and video requests in one prefill, pruned at q = .5."""
    prompts = [rate_prompt("Batch", IMAGE), rate_prompt("Batch"), rate_prompt("Batch", VIDEO)]
    return prompts, {
        "image_data": [[str(media / "image2.png")], [], []],
        "video_data": [[], [], [str(media / "static.mp4")]],
        **per_request_rate(0.5),
    }


def serve_all(base_url: str, media: Path, q0_only: bool = False) -> dict[str, Generation]:
    requests = cases(media) if q0_only else all_cases(media)
    out = {name: generate(base_url, prompt, **kwargs)[0] for name, (prompt, kwargs) in requests.items()}
    if not q0_only:
        prompts, kwargs = concurrent_batch(media)
        out |= {f"batch {i}": reply for i, reply in enumerate(generate(base_url, prompts, **kwargs))}
    return out


def gap_until_parting(got: Generation, want: Generation) -> tuple[float, int | None]:
    """The largest logprob gap over the steps both took alike, and the step where their tokens parted (None)."""
    gap = 0.0
    for step, (a, b) in enumerate(zip(got.output_ids, want.output_ids, strict=True)):
        if a != b:
            return gap, step
        gap = max(gap, abs(got.logprobs[step] - want.logprobs[step]))
    return gap, None


def compare(mine: dict[str, Generation], reference: dict[str, Generation], tolerance: float, what: str) -> None:
    gaps = {name: gap_until_parting(mine[name], ref) for name, ref in reference.items()}
    worst = max(gap for gap, _ in gaps.values())
    parted = {name: step for name, (_, step) in gaps.items() if step is not None}
    print(
        f"{what}: {len(gaps)} requests, largest logprob gap {worst:.3e} (bound {tolerance}); parted at a tie: {parted}"
    )
    for name, ref in reference.items():
        assert_same_generation(mine[name], ref, tolerance, f"{what}: {name}", near_ties=True)


# The CPU dry run's servers (test_prefill_cuda_graph_gpu_setup.py): graph mode, SGLang's graph runners replaying
# on CPU stand-ins (docs/cpu-runtime.md), with prefill buckets up to the chunk, as a GPU's defaults give.
CPU_DRY_RUN_ARGS = ["--dtype", "bfloat16", "--chunked-prefill-size", str(CHUNK), "--cuda-graph-max-bs-prefill",
                    str(CHUNK)]  # fmt: skip


# SGLang's vision-tower CUDA graphs (`multimodal/vit_cuda_graph_runner.py`, one graph per exact patch layout), on for
# the GPU's graph servers, plugin and upstream alike; they need a GPU attention backend (Triton's here), so the CPU
# dry run's towers stay eager.
VIT_GRAPHS = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"}


def eager_trace(trace_path: Path) -> Path:
    """The eager server's own trace, beside the graphs server's: its keep-masks and tower times."""
    return trace_path.with_name("eager-trace.jsonl")


def launches(model_dir: Path, work: Path, trace_path: Path, on_gpu: bool = True) -> list[Launch]:
    """The plugin with graphs (traced), upstream with graphs, the plugin eager (traced): on the GPU route, the
    graph servers' vision towers replaying SGLang's ViT graphs too, or (`on_gpu=False`) as CPU servers in graph
    mode, for the dry run."""
    traced, upstream = {trace.ENV: str(trace_path)}, {"SGLANG_PLUGINS": "none"}
    eager_traced = {trace.ENV: str(eager_trace(trace_path))}
    if not on_gpu:
        return [
            Launch(
                model_dir, work / "graphs.log", [*CPU_DRY_RUN_ARGS, *PREFILL_GRAPHS_BY_FLAG], traced, graph_mode=True
            ),
            Launch(model_dir, work / "upstream.log", CPU_DRY_RUN_ARGS, upstream, graph_mode=True),
            Launch(model_dir, work / "eager.log", CPU_DRY_RUN_ARGS, eager_traced),
        ]
    args = gpu_server_args()
    return [
        Launch(
            model_dir,
            work / "graphs.log",
            [*args, *PREFILL_GRAPHS_BY_FLAG],
            {**ROUTE_ON, **VIT_GRAPHS, **traced},
            cpu=False,
        ),  # fmt: skip
        Launch(model_dir, work / "upstream.log", args, {**ROUTE_ON, **VIT_GRAPHS, **upstream}, cpu=False),
        Launch(model_dir, work / "eager.log", without_graphs(args), {**ROUTE_ON, **eager_traced}, cpu=False),
    ]


REPEATED = f"video {PRUNED[0][0]} at {PRUNED[0][1]}"


@contextmanager
def serving_all(model_dir: Path, media: Path, work: Path, on_gpu: bool = True) -> Iterator[dict]:
    """The three servers' replies, a radix repeat on the graphs server, and its trace with the trace's size
    once the servers were up (capture and SGLang's warm-up are behind it)."""
    trace_path = work / "trace.jsonl"
    with running_servers(*launches(model_dir, work, trace_path, on_gpu), timeout=420) as (graphs, upstream, eager):
        started = trace_path.stat().st_size
        out = {
            "graphs": serve_all(graphs.base_url, media),
            "upstream": serve_all(upstream.base_url, media, q0_only=True),
            "eager": serve_all(eager.base_url, media),
        }
        prompt, kwargs = all_cases(media)[REPEATED]
        out["repeat"] = generate(graphs.base_url, prompt, **kwargs)[0]
        yield {**out, "trace": trace_path, "started": started}


def check_q0_matches_upstream(served: dict) -> None:
    compare(served["graphs"], served["upstream"], Q0_TOLERANCE, "q = 0, graphs against upstream")


def check_pruned_and_unpruned_match_eager(served: dict) -> None:
    assert {name for name in served["graphs"] if "vidcom2" in name} and any("evs at" in n for n in served["graphs"])
    compare(served["graphs"], served["eager"], PRUNED_TOLERANCE, "graphs against eager")


def check_every_media_prefill_and_decode_replayed(served: dict) -> None:
    events = events_since(served["trace"], served["started"])
    carried, unreplayed = media_forwards_without_replay(events)
    print(f"forwards with media rows: {carried}, of them without a prefill graph replay: {unreplayed}")
    assert carried > 0 and unreplayed == 0, f"{unreplayed} of {carried} forwards with media replayed no graph"
    (allocated,) = trace.read(served["trace"], "graph_inputs_allocated")
    media_prefills = [e for e in events if e["event"] == "deepstack" and e["media_rows"] > 0]
    assert {e["data_ptr"] for e in media_prefills} == {allocated["deepstack_ptr"]}
    replayed, eager = decode_steps(events)
    print(f"decode steps replayed: {replayed}, eager: {eager}")
    assert replayed > 0 and eager == 0


def check_chunked_prefill_cut_a_pruned_video(served: dict) -> None:
    events = [e for e in events_since(served["trace"], served["started"]) if e["event"] == "evs_positions"]
    assert any(cut_by_a_chunk(events, item) for item in {e["item"] for e in events})


def check_radix_repeat_answers_as_before(served: dict) -> None:
    first, again = served["graphs"][REPEATED], served["repeat"]
    assert again.cached_tokens > 0
    compare({REPEATED: again}, {REPEATED: first}, PRUNED_TOLERANCE, "radix repeat against the first")
    compare({REPEATED: again}, {REPEATED: served["eager"][REPEATED]}, PRUNED_TOLERANCE, "radix repeat against eager")


def check_keep_masks_match_eager(served: dict) -> None:
    """Each pruned video's keep-mask on the graphs server (its tower replaying SGLang's ViT graphs on a GPU) is the
    eager server's, bit for bit; and the tower's median time per encode on each, printed (T_vit with and without
    the ViT graphs)."""
    graphs, eager = served["trace"], eager_trace(served["trace"])
    masks = [{e["item"]: e["kept"] for e in trace.read(path, "keep_mask")} for path in (graphs, eager)]
    assert masks[0] and masks[0] == masks[1], {key: kept for key, kept in masks[0].items() if masks[1].get(key) != kept}
    for name, path in (("graphs", graphs), ("eager", eager)):
        times = sorted(e["ms"] for e in trace.read(path, "video_encoded"))
        print(f"{name}: {len(times)} video encodes, median {times[len(times) // 2]:.2f} ms")


CHECKS = (check_q0_matches_upstream, check_pruned_and_unpruned_match_eager,
          check_every_media_prefill_and_decode_replayed, check_chunked_prefill_cut_a_pruned_video,
          check_radix_repeat_answers_as_before, check_keep_masks_match_eager)  # fmt: skip


def events_since(trace_path: Path, offset: int) -> list[dict]:
    with open(trace_path) as lines:
        lines.seek(offset)
        return [json.loads(line) for line in lines if line.strip()]


def media_forwards_without_replay(events: list[dict]) -> tuple[int, int]:
    """(forwards that carried media rows, those of them not followed by a prefill graph replay before the
    scheduler's next forward), from the trace's events in the order they were written."""
    carried, unreplayed, pending = 0, 0, {}
    for event in events:
        pid = event["pid"]
        if event["event"] == "deepstack":
            unreplayed += pending.pop(pid, 0)
            if event["media_rows"] > 0:
                carried += 1
                pending[pid] = 1
        elif event["event"] == "graph_replay" and event["phase"] == "prefill":
            pending.pop(pid, None)
    return carried, unreplayed + sum(pending.values())


def decode_steps(events: list[dict]) -> tuple[int, int]:
    """(decode graph replays, decode forwards that ran the language model's Python: eager ones). A replay
    runs none of the model's Python, so an eager decode is one that wrote `language_model_inputs`."""
    replayed = sum(e["event"] == "graph_replay" and e["phase"] == "decode" for e in events)
    eager = sum(e["event"] == "language_model_inputs" and e["mode"] == "DECODE" for e in events)
    return replayed, eager


def cut_by_a_chunk(events: list[dict], item) -> bool:
    """Whether a pruned video's region was prefilled in two chunks (one chunk's part ends where another's begins)."""
    regions = [tuple(e["region"]) for e in events if e["item"] == item]
    return any(a[1] == b[0] for a in regions for b in regions)
