"""A mixed request set (text, image, videos at two EVS rates) sent concurrently: the scale-out tests,
the router fault run and the router benchmark share it."""

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import requests

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.requests import (
    IMAGE,
    VIDEO,
    Generation,
    chat_prompt,
    flush_cache,
    generate,
    media_kwargs,
    per_request_pruning,
)

VIDEO_RATES = (0.25, 0.75)
T = TypeVar("T")  # what a sender takes (a MixedRequest, or a caller's own case), or what a piece of work returns


@dataclass(frozen=True)
class MixedRequest:
    name: str  # unique in a set: kind and index
    kind: str  # one of kinds(video_rates)
    text: str  # the user's words
    images: tuple[Path, ...] = ()
    videos: tuple[Path, ...] = ()
    rate: float | dict | None = None  # its own EVS rate or settings (`per_request_pruning`); None: the server's

    @property
    def prompt(self) -> str:
        """The templated prompt of /generate."""
        return chat_prompt(*[IMAGE] * len(self.images), *[VIDEO] * len(self.videos), text=self.text)

    @property
    def extra(self) -> dict:
        """The /generate fields besides the prompt: media, and the rate in `mm_processor_kwargs`."""
        rate = {} if self.rate is None else per_request_pruning(self.rate)
        return {**media_kwargs(images=self.images, videos=self.videos), **rate}

    def chat_body(self, max_new_tokens: int) -> dict:
        """The same request for /v1/chat/completions, greedy; the rate in `chat_template_kwargs`, the
        field sglang-router forwards."""
        parts = [{"type": "image_url", "image_url": {"url": f"file://{p}"}} for p in self.images]
        parts += [{"type": "video_url", "video_url": {"url": f"file://{p}"}} for p in self.videos]
        content = [*parts, {"type": "text", "text": self.text}]
        rate = {} if self.rate is None else per_request_pruning(self.rate, field="chat_template_kwargs")
        return {"model": "default", "messages": [{"role": "user", "content": content}],
                "max_tokens": max_new_tokens, "temperature": 0, **rate}  # fmt: skip


@dataclass(frozen=True)
class ChatAnswer:
    content: str
    prompt_tokens: int


def write_media(out: Path, clips: int = 4, images: int = 2) -> dict[str, list[Path]]:
    """Distinct 4-group clips (moving and noise, 16 frames at 4 fps) and images under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    kinds = ("moving", "noise")
    return {
        "videos": [
            media.write_clip(out / f"clip{i}.mp4", kinds[i % 2], num_frames=16, fps=4, seed=20 + i)
            for i in range(clips)
        ],
        "images": [media.write_image(out / f"image{i}.png", seed=30 + i) for i in range(images)],
    }


def kinds(video_rates: Sequence[float | dict | None]) -> tuple[str, ...]:
    """Request kinds: text, image, and a video kind per rate or settings (None: the server's default)."""

    def video(q: float | dict | None) -> str:
        if isinstance(q, dict):
            return "video " + ", ".join(f"{key}={value}" for key, value in q.items())
        return f"video q={q}" if q is not None else "video"

    return ("text", "image", *map(video, video_rates))


def mixed_requests(
    files: dict[str, list[Path]],
    count: int,
    video_rates: Sequence[float | dict | None] = VIDEO_RATES,
    image_rate: float | None = None,
) -> list[MixedRequest]:
    """`count` requests cycling text, image, and a video per rate in `video_rates` (the request's own
    rate or settings; None: the server's) over the media given; the images at `image_rate` (their
    `image_pruning_rate`; None: the server's)."""
    names = kinds(video_rates)
    out = []
    for i in range(count):
        kind = names[i % len(names)]
        turn = i // len(names)
        name = f"{kind} #{i}"
        if kind == "text":
            out.append(MixedRequest(name, kind, f"Say something about {turn}."))
        elif kind == "image":
            image = files["images"][turn % len(files["images"])]
            setting = None if image_rate is None else {"image_pruning_rate": image_rate}
            out.append(MixedRequest(name, kind, "Describe this.", images=(image,), rate=setting))
        else:
            clip = files["videos"][turn % len(files["videos"])]
            rate = video_rates[names.index(kind) - 2]
            out.append(MixedRequest(name, kind, "Describe this.", videos=(clip,), rate=rate))
    return out


def send(base_url: str, request: MixedRequest, max_new_tokens: int = 8) -> Generation:
    return generate(base_url, request.prompt, max_new_tokens=max_new_tokens, top_k=1, **request.extra)[0]


def send_chat(base_url: str, request: MixedRequest, max_new_tokens: int = 8) -> ChatAnswer:
    response = requests.post(f"{base_url}/v1/chat/completions", json=request.chat_body(max_new_tokens), timeout=300)
    response.raise_for_status()
    out = response.json()
    return ChatAnswer(out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens"])


def send_concurrently(
    base_url: str,
    batch: Sequence[T],
    max_new_tokens: int = 8,
    sender: Callable[[str, T, int], object] = send,
) -> list:
    """Every request of `batch` at once (one thread each) through `sender`; the results in order (an
    exception where one failed)."""

    def one(request: T):
        try:
            return sender(base_url, request, max_new_tokens)
        except Exception as exc:  # noqa: BLE001 - reported per request
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
        return list(pool.map(one, batch))


def pruning_totals(generations: Sequence[Generation]) -> dict[str, int]:
    """What the requests' meta info says EVS saw and kept, summed, and how many videos it pruned."""
    pruned = [g.meta for g in generations if "video_tokens_before_pruning" in g.meta]
    return {
        "video_tokens_before_pruning": sum(m["video_tokens_before_pruning"] for m in pruned),
        "video_tokens_after_pruning": sum(m["video_tokens_after_pruning"] for m in pruned),
        "pruned_videos": len(pruned),
    }


Case = tuple[str, dict, float | dict]  # (prompt, media kwargs, pruning rate or settings: `per_request_pruning`)


def send_case(base_url: str, case: Case, max_new_tokens: int = 8) -> Generation:
    prompt, kwargs, pruning = case
    return generate(base_url, prompt, max_new_tokens, **kwargs, **per_request_pruning(pruning))[0]


def send_alone(base_url: str, cases: Sequence[Case]) -> list[Generation]:
    """Cases one after the other, each from an empty radix cache: the reference a `send_together` round is
    compared with."""
    replies = []
    for case in cases:
        flush_cache(base_url)
        replies.append(send_case(base_url, case))
    return replies


def side_by_side(*work: Callable[[], T]) -> list[T]:
    """Each piece of work in a thread of its own, all at once; their results in order (the first failure raised).
    For request streams to different servers: a test server's scheduler runs one torch thread, so one stream
    keeps about one core busy, and two keep two. Each server still serves its own requests in its own order."""
    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        futures = [pool.submit(piece) for piece in work]
        return [future.result() for future in futures]


FORWARD_HOLD_S = 0.5  # how long each forward waits while a concurrent round's requests arrive (media: ~0.1 s each)


def slow_down(base_url: str, seconds: float | None) -> None:
    """Make every scheduler forward sleep `seconds` first (None: not at all): SGLang's `/slow_down`."""
    requests.post(f"{base_url}/slow_down", json={"forward_sleep_time": seconds}, timeout=60).raise_for_status()


def sent_while_held(
    base_url: str, send: Callable[[T], Generation], cases: Sequence[T], met: Callable[[], bool]
) -> list[Generation]:
    """Every case at once (one thread each) while each forward first sleeps `FORWARD_HOLD_S`, until `met()`.

    SGLang hands requests to its scheduler one by one as their media are processed, and an idle scheduler
    prefills each as it arrives: with a tiny model the forwards are faster than the media, so concurrent
    requests would meet in one batch only by chance. Held forwards let the rest queue behind the first. A
    round has met once all its requests reached the scheduler (`all_arrived`): the scheduler decides each
    batch from its queue, so from then on it batches them as it would held (prefill before decode: a decode
    waits for every queued prefill)."""
    slow_down(base_url, FORWARD_HOLD_S)
    try:
        with ThreadPoolExecutor(max_workers=len(cases)) as pool:
            futures = [pool.submit(send, case) for case in cases]
            while not met() and not all(f.done() for f in futures):
                time.sleep(0.05)
            slow_down(base_url, None)
            return [f.result() for f in futures]
    finally:
        slow_down(base_url, None)


def arrivals(trace_path: Path) -> int:
    """`request_arrived` events in a server's trace so far (`trace.record_arrival`)."""
    return len(trace.read(trace_path, "request_arrived"))


def all_arrived(trace_path: Path, arrivals_before: int, count: int) -> bool:
    """Whether `count` requests reached the server's schedulers since its first `arrivals_before` arrivals (each
    request once, though every tensor-parallel rank records it)."""
    return len({event["rid"] for event in trace.read(trace_path, "request_arrived")[arrivals_before:]}) >= count


def send_together(
    base_url: str, cases: Sequence[Case], trace_path: Path, attempts: int = 3
) -> tuple[list[Generation], tuple[int, int, int]]:
    """Cases sent at once, one HTTP request each, from an empty radix cache, until the trace shows a prefill
    forward that held the media of two of them or more (at most `attempts` rounds, see `sent_while_held`). The
    last round's replies in the order of `cases`, and its `prefilled_together`."""
    send = functools.partial(send_case, base_url)
    for _ in range(attempts):
        flush_cache(base_url)
        before, arrived = len(trace.read(trace_path, "embed_routine")), arrivals(trace_path)

        def met(before: int = before, arrived: int = arrived) -> bool:
            if all_arrived(trace_path, arrived, len(cases)):
                return True
            return any(e["media_requests"] >= 2 for e in trace.read(trace_path, "embed_routine")[before:])

        replies = sent_while_held(base_url, send, cases, met)
        batched = prefilled_together(trace_path, before, replies)
        if batched[0] > 0:
            break
    return replies, batched


def replayed_padded(
    base_url: str,
    cases: Sequence[Case],
    trace_path: Path,
    mode: str,
    max_new_tokens: int = 8,
    attempts: int = 3,
) -> tuple[list[Generation], list[dict]]:
    """Cases sent at once, from an empty radix cache, until a graph-mode server's trace shows a `mode` replay
    holding all of them in one batch (with 3 cases and graph sizes 1, 2, 4: three live rows and a padding row),
    as in `send_together`. The last round's replies in the order of `cases`, and its `graph_replay` events."""
    send = functools.partial(send_case, base_url, max_new_tokens=max_new_tokens)
    for _ in range(attempts):
        flush_cache(base_url)
        before, arrived = len(trace.read(trace_path, "graph_replay")), arrivals(trace_path)

        def replayed_together(before: int = before) -> bool:
            replays = trace.read(trace_path, "graph_replay")[before:]
            return any(event["mode"] == mode and event["requests"] == len(cases) for event in replays)

        def met(arrived: int = arrived) -> bool:
            return all_arrived(trace_path, arrived, len(cases)) or replayed_together()

        replies = sent_while_held(base_url, send, cases, met)
        if replayed_together():
            break
    return replies, trace.read(trace_path, "graph_replay")[before:]


def prefilled_together(trace_path, forwards_before: int, generations: Sequence[Generation]) -> tuple[int, int, int]:
    """How a concurrent round was prefilled, for asserting it was batched rather than served from the radix
    cache: (forwards after the first `forwards_before` `embed_routine` trace events whose tokens held
    placeholders of two requests or more, the round's cached prompt tokens, its prompt tokens)."""
    forwards = trace.read(trace_path, "embed_routine")[forwards_before:]
    shared = sum(1 for event in forwards if event["media_requests"] >= 2)
    return shared, sum(g.cached_tokens for g in generations), sum(g.prompt_tokens for g in generations)
