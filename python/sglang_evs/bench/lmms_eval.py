"""An lmms-eval model backend that sends real videos to an SGLang server running this plugin, so that
pruning runs; and the recipe's entry point, which refuses lmms-eval's frame-copying backends when the
server prunes.

    python -m sglang_evs.bench.lmms_eval --model sglang_evs \\
        --model_args base_url=http://127.0.0.1:30000,video_pruning_rate=0.75,pruning_log=evs.jsonl \\
        --tasks videomme --batch_size 1 --output_path results/

Everything after ``python -m sglang_evs.bench.lmms_eval`` is lmms-eval's own command line (``python -m
lmms_eval ...``): this module registers the ``sglang_evs`` model in lmms-eval's registry (in this process,
lmms-eval unchanged), checks the backend named by ``--model`` (`check_backend`), then runs lmms-eval's CLI.

Why a backend of its own: lmms-eval's OpenAI-compatible backends decode each video on the client and send
its frames as still images (``openai``/``openai_compatible``: ``max_frames_num`` = 10 frames by default,
``async_openai``: 64, ``srt_api``: 32). The server then sees images only, and images are never pruned: a run
against a pruning server would score unpruned frames and say nothing about pruning. This backend sends each
video as one ``video_url`` content part (a ``file://`` URL of the local path, or with ``video_transport=data``
the file itself as a ``data:`` URL for a server on another machine), so the server samples the frames and
the plugin prunes them.

Model args (``--model_args k=v,...``): ``base_url`` (the server, with or without ``/v1``; default
``$OPENAI_API_BASE`` or http://127.0.0.1:30000), ``model`` (the served model name, default ``default``),
the per-request pruning settings ``video_pruning_rate``, ``video_pruning_method``, ``video_token_budget``,
``video_pruning_min_tokens_per_group``, ``video_pruning_threshold`` (sent in each request's
``chat_template_kwargs``; left out, the server's own setting applies), ``video_transport`` (``file`` |
``data``), ``num_concurrent`` (requests in flight, default 4), ``timeout`` (s per request, default 1800),
``max_retries`` (connection errors and HTTP 5xx, default 3) and ``pruning_log`` (a JSONL file: one line per
request with its server-reported counts).

Each reply's counts are recorded: ``usage.prompt_tokens``, ``usage.prompt_tokens_details.video_tokens`` (the
video tokens the model read, i.e. kept), and, from SGLang's ``meta_info`` (``return_meta_info``),
``video_tokens_before_pruning`` and ``video_tokens_after_pruning``. A reply that carries no pruning counts
while its request had a video was not pruned: the run's summary says how many.

lmms-eval is imported only when the backend is built or the CLI runs: this module imports without it.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

MODEL_NAME = "sglang_evs"
CLASS_NAME = "SglangEvsChat"
CLASS_PATH = f"{__name__}.{CLASS_NAME}"
DEFAULT_BASE_URL = "http://127.0.0.1:30000"

# The per-request settings a run may name (`sglang_evs.methods`'s names); `video_stream` is a live stream's.
PRUNING_ARGS = (
    "video_pruning_method",
    "video_pruning_rate",
    "video_token_budget",
    "video_pruning_min_tokens_per_group",
    "video_pruning_threshold",
)
URL_SCHEMES = ("http://", "https://", "file://", "data:")

# lmms-eval 0.7.3's backends that turn a video into still images on the client, each with what it sends
# (lmms_eval/models/__init__.py MODEL_ALIASES gives the aliases). `openai` and its aliases (and `litellm`,
# which inherits its chat class) send a `video_url` instead with `pass_video_url=true`, chat class only.
IMAGE_SENDING_BACKENDS = {
    "openai": "at most max_frames_num (default 10) frames per video, as image_url parts",
    "async_openai": "nframes (default 64) frames per video, as image_url parts",
    "litellm": "at most max_frames_num (default 10) frames per video, as image_url parts",
    "srt_api": "at most max_frames_num (default 32) frames per video, as image_url parts",
    "gpt4v": "at most max_frames_num (default 10) frames per video, as image_url parts",
    "batch_gpt4": "at most max_frames_num (default 10) frames per video, as image_url parts",
}
BACKEND_ALIASES = {
    "openai_compatible": "openai",
    "openai_compatible_chat": "openai",
    "async_openai_compatible_chat": "async_openai",
    "async_openai_compatible": "async_openai",
    "litellm_chat": "litellm",
    "litellm_compatible": "litellm",
}
PASSES_VIDEO_URL = frozenset({"openai", "litellm"})  # chat classes with `pass_video_url` (not --force_simple)


# ---------------------------------------------------------------------------------------------------------
# The request path, without lmms-eval
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PruningRecord:
    """What the server reported for one request."""

    prompt_tokens: int
    completion_tokens: int
    videos: int  # video parts the request sent
    images: int  # image parts (a task that decodes its videos into frames itself sends these: never pruned)
    video_tokens: int | None  # usage.prompt_tokens_details.video_tokens: the video tokens read (kept)
    video_tokens_before_pruning: int | None  # meta_info; None: the server did not prune this request
    video_tokens_after_pruning: int | None
    video_pruning_method: str | None
    video_pruning_rate: float | None
    task: str | None = None
    doc_id: int | str | None = None

    @property
    def pruned(self) -> bool:
        return self.video_tokens_before_pruning is not None


@dataclass
class Reply:
    text: str
    record: PruningRecord


def api_root(base_url: str | None) -> str:
    """The server's root URL (``http://host:port``) from a base URL given with or without ``/v1``."""
    url = (base_url or os.environ.get("OPENAI_API_BASE") or DEFAULT_BASE_URL).rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def pruning_settings(args: Mapping[str, object]) -> dict:
    """The per-request pruning settings named in ``args`` (model args), checked as the server checks them
    (ValueError naming the setting)."""
    settings = {key: args[key] for key in PRUNING_ARGS if args.get(key) is not None}
    if settings:
        from sglang_evs.pruning.settings import NO_PRUNING, pruning_from

        pruning_from(settings, NO_PRUNING)
    return settings


def file_data_url(path: str | Path, default_mime: str) -> str:
    mime = mimetypes.guess_type(str(path))[0] or default_mime
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def video_url(video: str | Path, transport: str = "file") -> str:
    """A video as a chat ``video_url``: URLs as they are; a local path as ``file://`` (the server reads the
    same file system) or, with ``transport="data"``, as the file's bytes in a ``data:`` URL."""
    if isinstance(video, str) and video.startswith(URL_SCHEMES):
        return video
    path = Path(video).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"video {video} not found")
    if transport == "file":
        return path.as_uri()
    if transport == "data":
        return file_data_url(path, "video/mp4")
    raise ValueError(f"video_transport must be 'file' or 'data', got {transport!r}")


def image_url(image) -> str:
    """An image (a PIL image, a path or a URL) as a chat ``image_url``."""
    if isinstance(image, str) and image.startswith(URL_SCHEMES):
        return image
    if isinstance(image, str | Path):
        return file_data_url(image, "image/png")
    import io

    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


def _as_dict(item) -> dict:
    return item.model_dump() if hasattr(item, "model_dump") else dict(item)


def openai_messages(messages: Iterable, transport: str = "file") -> tuple[list[dict], int, int]:
    """lmms-eval chat messages (``ChatMessages.messages``, or the plain dicts of a task's ``doc_to_messages``:
    ``{"role", "content": [{"type": "text" | "video" | "image", "text" | "url"}]}``) as OpenAI chat messages,
    each video one ``video_url`` part; and the numbers of videos and of images."""
    out, videos, images = [], 0, 0
    for message in messages:
        message = _as_dict(message)
        content = message["content"]
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        parts = []
        for part in content:
            part = _as_dict(part)
            kind = part.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "video":
                if part.get("start_time") is not None or part.get("end_time") is not None:
                    raise NotImplementedError(
                        "a video clip bound (start_time/end_time) cannot be sent as a video_url: the server would "
                        "read the whole video"
                    )
                parts.append({"type": "video_url", "video_url": {"url": video_url(part["url"], transport)}})
                videos += 1
            elif kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": image_url(part["url"])}})
                images += 1
            else:
                raise NotImplementedError(f"content part of type {kind!r} is not sent by the {MODEL_NAME} backend")
        out.append({"role": message["role"], "content": parts})
    return out, videos, images


def sampling_fields(gen_kwargs: Mapping[str, object]) -> dict:
    """An lmms-eval task's ``generation_kwargs`` as chat request fields (greedy unless it says otherwise)."""
    fields = {"max_tokens": int(gen_kwargs.get("max_new_tokens", 1024)),
              "temperature": float(gen_kwargs.get("temperature", 0) or 0)}  # fmt: skip
    if gen_kwargs.get("top_p") is not None and fields["temperature"] > 0:
        fields["top_p"] = float(gen_kwargs["top_p"])
    until = gen_kwargs.get("until")
    stops = [until] if isinstance(until, str) else [s for s in (until or []) if isinstance(s, str) and s]
    if stops:
        fields["stop"] = stops
    return fields


class VideoChatClient:
    """Chat requests to one SGLang server, videos as ``video_url`` parts, the pruning settings (if any) in
    each request's ``chat_template_kwargs``, and each reply's counts recorded in ``records``."""

    def __init__(self, base_url: str | None = None, model: str = "default", pruning: Mapping | None = None,
                 video_transport: str = "file", timeout: float = 1800, max_retries: int = 3,
                 retry_backoff_s: float = 2.0) -> None:  # fmt: skip
        self.root = api_root(base_url)
        self.model = model
        self.pruning = pruning_settings(pruning or {})
        self.expects_pruning = _prunes(self.pruning)  # the request's own settings prune (else: the server's)
        if video_transport not in ("file", "data"):
            raise ValueError(f"video_transport must be 'file' or 'data', got {video_transport!r}")
        self.video_transport = video_transport
        self.timeout = float(timeout)
        self.max_retries = max(1, int(max_retries))
        self.retry_backoff_s = float(retry_backoff_s)
        self.records: list[PruningRecord] = []
        self._lock = threading.Lock()
        self._session = requests.Session()

    def request_body(self, messages: Iterable, gen_kwargs: Mapping | None = None) -> tuple[dict, int, int]:
        """The /v1/chat/completions body of lmms-eval ``messages``, and its numbers of videos and images."""
        chat, videos, images = openai_messages(messages, self.video_transport)
        body = {"model": self.model, "messages": chat, **sampling_fields(gen_kwargs or {}), "stream": False,
                "return_meta_info": True}  # fmt: skip
        if self.pruning:
            body["chat_template_kwargs"] = dict(self.pruning)
        return body, videos, images

    def post(self, body: dict) -> dict:
        """POST the body; retried on connection errors and HTTP 5xx, raised with the server's answer on 4xx."""
        url = f"{self.root}/v1/chat/completions"
        for attempt in range(1, self.max_retries + 1):
            try:
                response = self._session.post(url, json=body, timeout=self.timeout)
            except requests.ConnectionError as error:
                failure = f"{url}: {error}"
            else:
                if response.status_code == 200:
                    return response.json()
                failure = f"{url} answered {response.status_code}: {response.text[:1000]}"
                if response.status_code < 500:
                    break
            if attempt < self.max_retries:
                time.sleep(self.retry_backoff_s * attempt)
        raise RuntimeError(failure)

    def ask(self, messages: Iterable, gen_kwargs: Mapping | None = None, task: str | None = None,
            doc_id: int | str | None = None) -> Reply:  # fmt: skip
        body, videos, images = self.request_body(messages, gen_kwargs)
        reply = self.post(body)
        record = parse_record(reply, videos, images, task, doc_id)
        with self._lock:
            self.records.append(record)
        return Reply(reply["choices"][0]["message"].get("content") or "", record)

    def summary(self) -> dict:
        return summarize(self.records)


def parse_record(reply: dict, videos: int, images: int = 0, task: str | None = None, doc_id=None) -> PruningRecord:
    """One chat reply's counts: usage and, where the server pruned, the plugin's meta-info fields."""
    usage = reply.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    meta = (reply.get("choices") or [{}])[0].get("meta_info") or {}
    return PruningRecord(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        videos=videos,
        images=images,
        video_tokens=details.get("video_tokens"),
        video_tokens_before_pruning=meta.get("video_tokens_before_pruning"),
        video_tokens_after_pruning=meta.get("video_tokens_after_pruning"),
        video_pruning_method=meta.get("video_pruning_method"),
        video_pruning_rate=meta.get("video_pruning_rate"),
        task=task,
        doc_id=doc_id,
    )


def summarize(records: Sequence[PruningRecord]) -> dict:
    """Totals over a run: requests, those with a video, those the server pruned, video tokens before and
    after pruning (pruned requests), kept video tokens as usage reports them, and prompt tokens."""
    with_video = [r for r in records if r.videos]
    pruned = [r for r in with_video if r.pruned]
    return {
        "requests": len(records),
        "video_requests": len(with_video),
        "image_only_requests": sum(1 for r in records if r.images and not r.videos),
        "pruned_requests": len(pruned),
        "video_tokens_before_pruning": sum(r.video_tokens_before_pruning for r in pruned),
        "video_tokens_after_pruning": sum(r.video_tokens_after_pruning or 0 for r in pruned),
        "usage_video_tokens": sum(r.video_tokens or 0 for r in with_video),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
    }


def summary_line(summary: Mapping) -> str:
    before, after = summary["video_tokens_before_pruning"], summary["video_tokens_after_pruning"]
    line = (f"{MODEL_NAME}: {summary['pruned_requests']} of {summary['video_requests']} video requests pruned, "
            f"video tokens {before} -> {after}")  # fmt: skip
    unpruned = summary["video_requests"] - summary["pruned_requests"]
    if unpruned:
        line += f"; {unpruned} video requests came back without pruning counts (the server did not prune them)"
    if summary["image_only_requests"]:
        line += (f"; {summary['image_only_requests']} requests sent images and no video (a task that decodes its "
                 "videos into frames itself, e.g. longvideobench_*_i): images are never pruned")  # fmt: skip
    return line


def _prunes(settings: Mapping) -> bool:
    from sglang_evs.pruning.settings import NO_PRUNING, pruning_from

    return bool(settings) and pruning_from(settings, NO_PRUNING).prunes


# ---------------------------------------------------------------------------------------------------------
# The lmms-eval model class (built on first use: lmms-eval is imported then)
# ---------------------------------------------------------------------------------------------------------


def _build_model_class():
    from lmms_eval.api.instance import GenerationResult, TokenCounts
    from lmms_eval.api.model import lmms

    class SglangEvsChat(lmms):
        """lmms-eval chat backend: each request's ``doc_to_messages`` sent to the server with its videos as
        ``video_url`` parts (`VideoChatClient`)."""

        is_simple = False

        def __init__(self, base_url: str | None = None, model: str = "default", video_transport: str = "file",
                     num_concurrent: int = 4, timeout: float = 1800, max_retries: int = 3,
                     pruning_log: str | None = None, **kwargs) -> None:  # fmt: skip
            super().__init__()
            settings = {key: kwargs.pop(key) for key in PRUNING_ARGS if key in kwargs}
            # lmms-eval passes batch_size, max_batch_size and device to every model; unknown args are refused
            for key in ("batch_size", "max_batch_size", "device"):
                kwargs.pop(key, None)
            if kwargs:
                raise TypeError(f"unknown {MODEL_NAME} model args {sorted(kwargs)}: see `{__name__}`'s docstring")
            self.client = VideoChatClient(base_url, str(model), settings, video_transport, timeout, max_retries)
            self.num_concurrent = max(1, int(num_concurrent))
            self.pruning_log = Path(pruning_log) if pruning_log else None

        @property
        def records(self) -> list[PruningRecord]:
            return self.client.records

        def _answer(self, request) -> GenerationResult:
            _, doc_to_messages, gen_kwargs, doc_id, task, split = request.args
            try:
                messages = doc_to_messages(self.task_dict[task][split][doc_id])
                reply = self.client.ask(messages, gen_kwargs, task, doc_id)
            except Exception as error:
                FAILED_REQUESTS.append(f"{task} doc {doc_id}: {error}")
                raise
            counts = TokenCounts(input_tokens=reply.record.prompt_tokens,
                                 output_tokens=reply.record.completion_tokens)  # fmt: skip
            return GenerationResult(text=reply.text, token_counts=counts)

        def generate_until(self, requests) -> list:
            done = len(self.records)
            with ThreadPoolExecutor(self.num_concurrent) as pool:
                results = list(pool.map(self._answer, requests))
            new = self.records[done:]
            if self.pruning_log is not None:
                self.pruning_log.parent.mkdir(parents=True, exist_ok=True)
                with self.pruning_log.open("a") as log:
                    log.writelines(json.dumps(asdict(r)) + "\n" for r in new)
            summary = summarize(new)
            print(summary_line(summary), file=sys.stderr, flush=True)
            missed = summary["video_requests"] > summary["pruned_requests"] or summary["image_only_requests"]
            if missed and self.client.expects_pruning:
                warnings.warn(summary_line(summary), stacklevel=2)
            return results

        def loglikelihood(self, requests):
            raise NotImplementedError(f"{MODEL_NAME} generates only (no loglikelihood over a chat API)")

        def generate_until_multi_round(self, requests):
            raise NotImplementedError(f"{MODEL_NAME} answers one round per request")

    SglangEvsChat.__module__, SglangEvsChat.__qualname__ = __name__, CLASS_NAME
    return SglangEvsChat


_model_class = None
FAILED_REQUESTS: list[str] = []  # this process's requests that raised (lmms-eval's CLI prints and goes on)


def __getattr__(name: str):
    """`SglangEvsChat`, built on first access (`importlib.import_module(...).SglangEvsChat` is how lmms-eval's
    registry loads a class path)."""
    global _model_class
    if name == CLASS_NAME:
        if _model_class is None:
            _model_class = _build_model_class()
        return _model_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def manifest():
    """lmms-eval's registration payload for this backend (what an ``lmms_eval.models`` entry point returns)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_NAME, chat_class_path=CLASS_PATH)


def register() -> None:
    """Register ``--model sglang_evs`` in lmms-eval's model registry, in this process."""
    from lmms_eval.models import MODEL_REGISTRY_V2

    MODEL_REGISTRY_V2.register_manifest(manifest(), overwrite=True)


# ---------------------------------------------------------------------------------------------------------
# Refusing the backends that send frames as images
# ---------------------------------------------------------------------------------------------------------


class FramesAsImagesError(ValueError):
    """A run whose backend would send video frames as images to a server that prunes videos."""


def _true(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def server_pruning(root: str, timeout: float = 10):
    """The server's default pruning (a `Pruning`) read from its ``/server_info`` (``json_model_override_args``),
    or None when the server cannot be asked. A default in the checkpoint's own config.json is not seen."""
    from sglang_evs.pruning.settings import NO_PRUNING, pruning_from

    try:
        response = requests.get(f"{root}/server_info", timeout=timeout)
        response.raise_for_status()
        overrides = response.json().get("json_model_override_args") or "{}"
    except (requests.RequestException, ValueError):
        return None
    overrides = json.loads(overrides) if isinstance(overrides, str) else overrides
    return pruning_from(overrides, NO_PRUNING)


def check_backend(model: str, args: dict | None = None, force_simple: bool = False, probe=server_pruning) -> None:
    """Refuse (`FramesAsImagesError`, naming why) a run whose lmms-eval backend sends each video as still
    images to a server that prunes videos, or that names a pruning setting for such a backend: frames sent as
    images never reach the pruning, so the run would measure unpruned frames. Warn when such a backend's
    server cannot be asked. ``args``: the backend's ``--model_args``, as lmms-eval parses them
    (``simple_parse_args_string``). ``probe(root)``: the server's pruning (`server_pruning`)."""
    backend = BACKEND_ALIASES.get(model, model)
    if backend not in IMAGE_SENDING_BACKENDS:
        return
    args = args or {}
    if backend in PASSES_VIDEO_URL and not force_simple and _true(args.get("pass_video_url", "false")):
        warnings.warn(
            f"lmms-eval's {model} backend with pass_video_url=true sends videos as video_url: the server's own "
            f"pruning applies, but it cannot send a per-request rate and does not record the pruning counts "
            f"(--model {MODEL_NAME} does both)",
            stacklevel=2,
        )
        return
    why = (
        f"lmms-eval's {model} backend{' (--force_simple)' if force_simple else ''} decodes each video on the "
        f"client and sends {IMAGE_SENDING_BACKENDS[backend]}: the server never sees a video, and frames sent as "
        f"images never reach the video pruning, so the run would score unpruned frames"
    )
    fix = f"use --model {MODEL_NAME} (each video sent as a video_url, the rate per request in its model args)"
    if backend in PASSES_VIDEO_URL and not force_simple:
        fix += ", or this backend with pass_video_url=true"
    named = {key: args[key] for key in PRUNING_ARGS if key in args}
    if named:
        raise FramesAsImagesError(f"{why}; it does not send {named} either (it ignores them): {fix}")
    if backend == "srt_api":  # it launches its own server
        root = f"http://{args.get('host', '127.0.0.1')}:{args.get('port', 30000)}"
    elif backend in ("gpt4v", "batch_gpt4"):  # a whole chat URL, from $OPENAI_API_URL
        url = str(args.get("api_url") or os.environ.get("OPENAI_API_URL") or "")
        root = api_root(url.removesuffix("/chat/completions") or None)
    else:
        root = api_root(args.get("base_url"))
    pruning = probe(root)
    if pruning is None:
        warnings.warn(f"{why}. The server at {root} could not be asked whether it prunes; if it does, {fix}",
                      stacklevel=2)  # fmt: skip
    elif pruning.prunes:
        raise FramesAsImagesError(f"{why}, while the server at {root} prunes videos ({pruning.named()}): {fix}")


# ---------------------------------------------------------------------------------------------------------
# The recipe's entry point
# ---------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sglang_evs.bench.lmms_eval <lmms-eval arguments>``: check the backend, register
    ``sglang_evs``, run lmms-eval's CLI."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "eval":
        argv = argv[1:]
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model")
    parser.add_argument("--model_args")
    parser.add_argument("--force_simple", action="store_true")
    known, _ = parser.parse_known_args(argv)
    try:
        from lmms_eval.utils import simple_parse_args_string
    except ImportError as error:
        sys.exit(f"lmms-eval does not import ({error}): pip install lmms-eval (docs/accuracy.md)")
    if known.model:
        try:
            check_backend(known.model, simple_parse_args_string(known.model_args or ""), known.force_simple)
        except FramesAsImagesError as error:
            sys.exit(f"refused: {error}")
    try:
        register()
        from lmms_eval.cli.dispatch import main as lmms_eval_main
    except ImportError as error:
        sys.exit(f"lmms-eval does not import ({error}): pip install lmms-eval (docs/accuracy.md)")

    sys.argv = [sys.argv[0], *argv]
    lmms_eval_main()
    if FAILED_REQUESTS:
        sys.exit(f"{MODEL_NAME}: {len(FAILED_REQUESTS)} requests failed, first: {FAILED_REQUESTS[0]}")


if __name__ == "__main__":
    main()
