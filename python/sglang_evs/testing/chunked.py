"""Servers of one checkpoint at several chunked-prefill sizes, their radix repeats, and the graph-mode
trace checks that go with them: chunked prefill and the radix cache must see the positions one prefill sees."""

from pathlib import Path

from sglang_evs import trace
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.requests import generate
from sglang_evs.testing.server import Launch, running_servers

# Graph-mode chunk servers capture prefill graphs up to 64 tokens (SGLang's default stops below the chunk
# size for 33 or 50), so that their full chunks replay too, padded to the 48- or 64-token bucket.
GRAPH_CHUNK_ARGS = ("--cuda-graph-max-bs-prefill", "64")


def served_in_chunks(
    model_dir: Path, cases: list, chunk_sizes, server_args: list[str], log_dir: Path, graph_chunk: int | None = None
) -> dict:
    """chunk size (None: SGLang's default) -> (first replies, repeated replies) of `cases`, one
    server per size, started together; the repeats must hit the radix cache. The server of
    `graph_chunk` runs in graph mode (`sglang_evs.testing.server`), as a GPU serves by default: its media
    prefills replay prefill graphs where `server_args` set a default that prunes (`server.PRUNING_DEFAULT_ARGS`)."""
    launches, graph_trace = [], log_dir / "graph-trace.jsonl"
    for chunk in chunk_sizes:
        graphs = chunk is not None and chunk == graph_chunk
        args = [*server_args, *(["--chunked-prefill-size", str(chunk)] if chunk else []), *(GRAPH_CHUNK_ARGS * graphs)]
        env = {trace.ENV: str(graph_trace)} if graphs else None
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


def assert_chunks_equal(results: dict, reference: list, context: str) -> None:
    for chunk, (first, again) in results.items():
        for got, want in zip([*first, *again], [*reference, *reference], strict=True):
            assert_same_greedy(got, want, f"{context}, chunk size {chunk}")
