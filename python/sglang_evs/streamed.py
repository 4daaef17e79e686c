"""A server's streamed reply (SGLang's server-sent events, `/generate` and `/v1/chat/completions` alike): each chunk
with the time it arrived, the one client the package's timings and tools read streams with."""

import json
import time
from collections.abc import Iterator

import requests


def streamed_chunks(url: str, body: dict, timeout: float = 600) -> Iterator[tuple[float, dict]]:
    """POST `body` (which asks to stream) to `url`: (seconds since it was sent, chunk) per `data:` line, until
    `[DONE]`. RuntimeError naming the server's answer where it is not 200, or where a chunk carries an error."""
    start = time.perf_counter()
    with requests.post(url, json=body, timeout=timeout, stream=True) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:500]}")
        for raw in response.iter_lines():
            if not raw.startswith(b"data:") or raw.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(raw[len(b"data:") :])
            if isinstance(chunk, dict) and chunk.get("error"):
                raise RuntimeError(f"stream from {url} failed: {chunk['error']}")
            yield time.perf_counter() - start, chunk


def ttft_ms(url: str, body: dict, timeout: float = 600) -> float:
    """Milliseconds from sending `body` (streamed) to its first chunk; the rest of the stream is read to its end."""
    arrivals = [seconds for seconds, _ in streamed_chunks(url, {**body, "stream": True}, timeout)]
    if not arrivals:
        raise RuntimeError(f"stream from {url} ended without a chunk")
    return arrivals[0] * 1000
