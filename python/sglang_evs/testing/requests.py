"""Prompts, per-request pruning settings and /generate calls shared by the end-to-end tests, the demo
and the benchmarks."""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sglang_evs.methods import PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"  # Qwen3-Omni


def chat_prompt(*media: str, text: str = "Describe this.") -> str:
    """The tiny model's chat template, written out: media placeholders, then the text."""
    return f"<|im_start|>user\n{''.join(media)}{text}<|im_end|>\n<|im_start|>assistant\n"


GEMMA3_IMAGE = "<start_of_image>"
LLAVA_IMAGE = "[IMG]"


def gemma3_chat_prompt(*images: str, text: str = "Describe this.") -> str:
    """The tiny Gemma 3's chat template, written out: one GEMMA3_IMAGE per image, then the text."""
    return f"<bos><start_of_turn>user\n{''.join(images)}{text}<end_of_turn>\n<start_of_turn>model\n"


def llava_chat_prompt(*images: str, text: str = "Describe this.") -> str:
    """The tiny LLaVA's (Pixtral's [INST] format) chat template, written out: one LLAVA_IMAGE per image."""
    return f"<s>[INST]{''.join(images)}{text}[/INST]"


GLM4V_IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"
GLM4V_VIDEO = "<|begin_of_video|><|video|><|end_of_video|>"


def glm4v_chat_prompt(*media: str, text: str = "Describe this.") -> str:
    """The tiny GLM-4.1V / GLM-4.5V's chat template, written out: GLM4V_IMAGE / GLM4V_VIDEO placeholders,
    then the text."""
    return f"[gMASK]<sop><|user|>\n{''.join(media)}{text}<|assistant|>\n"


def pruning_setting(rate: float, method: str = "evs") -> dict:
    """The settings that prune at ``rate`` with ``method``: ``{"video_pruning_method": method,
    "video_pruning_rate": rate}``."""
    return {PRUNING_METHOD_SETTING: method, PRUNING_RATE_SETTING: rate}


def per_request_rate(rate: float, method: str = "evs", field: str = "mm_processor_kwargs") -> dict:
    """Request-body fields that prune one request at ``rate`` with ``method`` (overriding the server's).
    ``field="chat_template_kwargs"`` (chat requests only) is the one sglang-router forwards."""
    return {field: pruning_setting(rate, method)}


def per_request_pruning(setting: float | dict, field: str = "mm_processor_kwargs") -> dict:
    """Request-body fields of a rate (a float: EVS at that rate) or of any settings (a dict of them)."""
    return {field: dict(setting)} if isinstance(setting, dict) else per_request_rate(setting, field=field)


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]  # of each generated token
    top_logprobs: list[list[tuple[float, int]]]  # top-k (logprob, token id) at each step
    prompt_tokens: int
    cached_tokens: int
    meta: dict = field(compare=False)  # ids and timings differ run to run


def media_kwargs(
    images: Sequence[Path | str] = (), videos: Sequence[Path | str] = (), audios: Sequence[Path | str] = ()
) -> dict:  # fmt: skip
    out: dict = {}
    if images:
        out["image_data"] = [str(p) for p in images]
    if videos:
        out["video_data"] = [str(p) for p in videos]
    if audios:
        out["audio_data"] = [str(p) for p in audios]
    return out


def generate(base_url: str, prompt: str | list, max_new_tokens: int = 8, top_k: int = 5, **extra) -> list[Generation]:
    """Greedy /generate with logprobs; a list prompt is sent as one batch request."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": top_k,
        **extra,
    }
    response = requests.post(f"{base_url}/generate", json=body, timeout=300)
    if response.status_code != 200:
        raise RuntimeError(f"/generate answered {response.status_code}: {response.text[:2000]}")
    outputs = response.json()
    return [_generation(out) for out in (outputs if isinstance(outputs, list) else [outputs])]


def _generation(out: dict) -> Generation:
    meta = out["meta_info"]
    return Generation(
        output_ids=out["output_ids"],
        logprobs=[entry[0] for entry in meta["output_token_logprobs"]],
        top_logprobs=[[(entry[0], entry[1]) for entry in step] for step in meta["output_top_logprobs"]],
        prompt_tokens=meta["prompt_tokens"],
        cached_tokens=meta.get("cached_tokens", 0),
        meta=meta,
    )


def open_session(base_url: str, streaming: bool = True) -> str:
    """A session opened on the server (a streaming one appends each turn to the last): its id."""
    body = {"capacity_of_str_len": 1 << 16, "streaming": streaming}
    response = requests.post(f"{base_url}/open_session", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def close_session(base_url: str, session_id: str) -> None:
    requests.post(f"{base_url}/close_session", json={"session_id": session_id}, timeout=60).raise_for_status()


def logprob_gap(got, want) -> float:
    """The largest difference between two replies' logprobs of the same generated tokens (anything with
    `.logprobs`: a `Generation`, or a test's own reference)."""
    return max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True))


def flush_cache(base_url: str, timeout: float = 30) -> None:
    """Empty the server's radix cache. SGLang refuses (HTTP 400) while requests are still running, which a
    pipeline-parallel server's last stage may still be doing after the answer went out: retried until then."""
    deadline = time.monotonic() + timeout
    while True:
        response = requests.post(f"{base_url}/flush_cache", timeout=60)
        if response.status_code != 400 or time.monotonic() > deadline:
            response.raise_for_status()
            return
        time.sleep(0.2)


def metric_samples(metrics_text: str) -> list:
    """Every sample of a Prometheus text exposition (`prometheus_client`'s parser): `.name`, `.labels`, `.value`."""
    from prometheus_client.parser import text_string_to_metric_families

    return [sample for family in text_string_to_metric_families(metrics_text) for sample in family.samples]


def metric_total(metrics_text: str, name: str) -> float:
    """The sum of one Prometheus metric's samples over its label sets (0 where absent)."""
    return sum(sample.value for sample in metric_samples(metrics_text) if sample.name == name)


def served_requests(base_url: str) -> float:
    """Requests the server has finished (SGLang's own counter; needs `--enable-metrics`)."""
    return metric_total(requests.get(f"{base_url}/metrics", timeout=30).text, "sglang:num_requests_total")


def pruning_metrics(*base_urls: str) -> dict[tuple[str, str], float]:
    """The plugin's Prometheus counters, summed over the servers given: (name without `sglang_evs_` and
    `_total`, method) -> value."""
    counters: dict[tuple[str, str], float] = {}
    for base_url in base_urls:
        for sample in metric_samples(requests.get(f"{base_url}/metrics", timeout=30).text):
            if sample.name.startswith("sglang_evs_") and sample.name.endswith("_total"):
                key = sample.name[len("sglang_evs_") : -len("_total")], sample.labels["method"]
                counters[key] = counters.get(key, 0.0) + sample.value
    return counters


def counter_increase(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], method: str = "evs"
) -> dict[str, float]:
    """How much each of one method's counters grew between two `pruning_metrics` readings: name -> increase."""
    return {name: value - before.get((name, m), 0.0) for (name, m), value in after.items() if m == method}


def serve(base_url: str, alone: dict[str, tuple[str, dict]], batched: dict, setting: dict) -> dict:
    """Each case of `alone` by itself, a radix repeat of its last, and the `batched` request (`text`,
    `image_data`, `video_data`), all at `setting`, each from an empty radix cache (chunk boundaries after a
    cache hit depend on what was cached)."""
    flush_cache(base_url)
    out = {name: generate(base_url, prompt, max_new_tokens=10, **kwargs, **setting)[0]
           for name, (prompt, kwargs) in alone.items()}  # fmt: skip
    prompt, kwargs = list(alone.values())[-1]
    out["radix repeat"] = generate(base_url, prompt, max_new_tokens=10, **kwargs, **setting)[0]
    flush_cache(base_url)
    prompts = batched["text"]
    media = {key: batched[key] for key in ("image_data", "video_data")}
    out["batch"] = generate(base_url, prompts, max_new_tokens=10, **media, **setting)
    return out
