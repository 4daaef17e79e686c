"""Servers of one checkpoint at several chunked-prefill sizes, their radix repeats, and the graph-mode
trace checks that go with them: chunked prefill and the radix cache must see the positions one prefill sees."""

from collections.abc import Callable, Mapping
from pathlib import Path

from sglang_evs import trace
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.requests import Generation, generate
from sglang_evs.testing.server import Launch, running_servers

# Graph-mode chunk servers capture prefill graphs up to 64 tokens (SGLang's default stops below the chunk
# size for 33 or 50), so that their full chunks replay too, padded to the 48- or 64-token bucket.
GRAPH_CHUNK_ARGS = ("--cuda-graph-max-bs-prefill", "64")


def served_in_chunks(
    model_dir: Path,
    cases: list,
    chunk_sizes,
    server_args: list[str],
    log_dir: Path,
    graph_chunk: int | None = None,
    env_by_chunk: Mapping[int | None, dict[str, str]] | None = None,
) -> dict:
    """chunk size (None: SGLang's default) -> (first replies, repeated replies) of `cases`, one
    server per size, started together; the repeats must hit the radix cache. The server of
    `graph_chunk` runs in graph mode (`sglang_evs.testing.server`), as a GPU serves by default: its media
    prefills replay prefill graphs where `server_args` set a default that prunes (`server.PRUNING_DEFAULT_ARGS`).
    `env_by_chunk`: environment of the server of a chunk size (its embedding cache, say)."""
    launches, graph_trace = [], log_dir / "graph-trace.jsonl"
    for chunk in chunk_sizes:
        graphs = chunk is not None and chunk == graph_chunk
        args = [*server_args, *(["--chunked-prefill-size", str(chunk)] if chunk else []), *(GRAPH_CHUNK_ARGS * graphs)]
        env = {**(env_by_chunk or {}).get(chunk, {}), **({trace.ENV: str(graph_trace)} if graphs else {})}
        launches.append(Launch(model_dir, log_dir / f"chunk-{chunk}.log", args, env, graph_mode=graphs))
    results = {}
    with running_servers(*launches) as servers:
        for chunk, server in zip(chunk_sizes, servers, strict=True):
            first = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
            again = [generate(server.base_url, p, **kw)[0] for p, kw in cases]
            assert all(a.cached_tokens > 0 for a in again), f"chunk size {chunk}: no radix hit"
            results[chunk] = first, again
    if graph_chunk is not None:
        assert_media_prefills_and_decodes_replayed(graph_trace)
    return results


def assert_media_prefills_and_decodes_replayed(trace_path: Path) -> list[dict]:
    """A graph-mode server replayed prefill graphs for media-carrying forwards, reading the model's position
    buffer, and decode graphs, reading SGLang's static M-RoPE positions (`sglang_evs.graph_trace`). Returns
    the media prefills' replays."""
    replays = trace.read(trace_path, "graph_replay")
    prefills = [r for r in replays if r["phase"] == "prefill" and r["media"]]
    assert prefills and {r["positions_from"] for r in prefills} == {"graph_inputs"}
    decodes = [r for r in replays if r["phase"] == "decode"]
    assert decodes and {r["positions_from"] for r in decodes} == {"mrope_positions"}
    return prefills


def chunk_graph_args(chunk: int, decode_batches: tuple[int, ...] = (1,)) -> tuple[str, ...]:
    """A graph-mode server's graphs where prompts are cut into `chunk`-token pieces: prefill buckets of 2, 4, 8, ...
    up to the first at least `chunk`, so that every piece is padded at most twofold (SGLang prefills a piece
    that more padding would take eagerly), and decode graphs for the batch sizes `decode_batches` only (SGLang's
    default 24 sizes took the tiny Qwen3-VL's start 1.0 s on CPU)."""
    buckets = [2]
    while buckets[-1] < chunk:
        buckets.append(buckets[-1] * 2)
    return ("--cuda-graph-bs-prefill", *map(str, buckets), "--cuda-graph-bs-decode", *map(str, decode_batches))


# What one request wrote to a server's trace: its replays, its extend forwards (eager or replayed: the outer
# forward runs in both), and its rotary positions where they are traced.
REQUEST_EVENTS = ("graph_replay", "extend_forward", "rope_positions")


def traced_request(trace_path: Path, ask: Callable[[], Generation]) -> tuple[Generation, dict[str, list[dict]]]:
    """`ask()`'s reply and the `REQUEST_EVENTS` the server traced while answering it (send it alone)."""
    before = {event: len(trace.read(trace_path, event)) for event in REQUEST_EVENTS}
    reply = ask()
    return reply, {event: trace.read(trace_path, event)[count:] for event, count in before.items()}


def assert_every_forward_replayed(reply: Generation, events: dict[str, list[dict]], prefills: int = 2) -> None:
    """A media request served alone by a graph-mode server (`traced_request`'s events): each of its extend
    forwards (at least `prefills`) replayed a prefill graph carrying its media and reading the model's position
    buffer, each decode step a decode graph reading SGLang's static M-RoPE positions."""
    replays = events["graph_replay"]
    prefill = [r for r in replays if r["phase"] == "prefill"]
    decode = [r for r in replays if r["phase"] == "decode"]
    assert len(prefill) == len(events["extend_forward"]) >= prefills, (len(prefill), len(events["extend_forward"]))
    assert all(r["media"] for r in prefill) and {r["positions_from"] for r in prefill} == {"graph_inputs"}, prefill
    assert len(decode) == len(reply.output_ids) - 1, (len(decode), len(reply.output_ids))
    assert {r["positions_from"] for r in decode} == {"mrope_positions"}, decode


def assert_chunks_equal(results: dict, reference: list, context: str) -> None:
    for chunk, (first, again) in results.items():
        for got, want in zip([*first, *again], [*reference, *reference], strict=True):
            assert_same_greedy(got, want, f"{context}, chunk size {chunk}")
