"""The plugin's cost at q = 0 in one process: the same ForwardBatches through our model and upstream's.

    python benchmark/bench_overhead_inprocess.py --profile small --out overhead.json [--control]

Run in a process of its own (an in-process SGLang ModelRunner publishes process-wide state); the CPU
runtime's import fixes are installed first, so both variants run on the same ones.

What runs:
  - SGLang's ModelRunner is loaded the way ``sglang.benchmark.one_batch`` loads it, with no plugin:
    its model is upstream's Qwen3-VL, whose forward calls upstream's ``general_mm_embed_routine``
    (checked: the routine carries no hook). That model is the "upstream" variant.
  - The "ours" variant is this project's adapter for the same architecture
    (``models/registry.py``), built on the same config and holding the very same parameter tensors;
    its forward calls this project's routine directly (``multimodal/embed_routine.py``), which calls
    the adapter's ``post_process`` (fixed-address positions and deepstack buffers).
  - Requests go through SGLang's own path: the multimodal processor SGLang uses for Qwen3-VL (no
    pruning processor: q = 0 lays media out as upstream), ``MultimodalInputs.from_processor_output``
    and the model's ``pad_input_ids``, then ``ScheduleBatch.prepare_for_extend`` (or
    ``prepare_for_decode``) and ``ForwardBatch.init_new``. Scenarios: a text prompt, one image, one
    video, the same video prefilled in two chunks (the cut inside the video), and one decode step
    of a batch holding a text, an image and a video request.
  - Every call gets a fresh shallow copy of its scenario's batch (the routines clamp the input ids
    in place and drop the media they embedded), attention metadata built anew and SGLang's
    multimodal embedding cache cleared (the vision encoder runs on every extend call); none of that
    is timed. Timed: ``model.forward(input_ids, positions, forward_batch)`` under the runner's
    forward context, as SGLang's eager runner calls it.
  - After warm-up calls, each round runs every scenario once per variant, the order alternating
    between pairs. Per scenario and pooled: the per-pair ratio ours / upstream, its geometric mean
    and 95 % t interval (``ratios.geometric_interval``), and its median with an order-statistic
    interval (``ratios.median_interval``). The two variants' next-token logits must be bit-identical
    on every pair (float32), or the run stops.
  - A control run (``Settings.control``) puts upstream's model in both slots: the harness's own bias.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import platform
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs.bench.ratios import geometric_interval, median_interval

VARIANTS = ("ours", "upstream")
GOAL = 1.02  # the plugin's cost at q = 0: within 2 % of upstream


@dataclass(frozen=True)
class Settings:
    model_dir: Path
    rounds: int = 8
    warmup: int = 2
    clip_seconds: float = 4.0
    clip_size: int = 64
    max_total_tokens: int = 16384
    threads: int = 0  # torch threads (0: torch's default)
    control: bool = False  # A/A: upstream's model in both slots (the harness's own bias: expect 1)
    max_minutes: float = 0.0  # time budget of the timed rounds (0: none)


@dataclass
class Scenario:
    """One recorded ForwardBatch; `fresh()` hands out a copy a forward may consume."""

    name: str
    batch: Any  # sglang ForwardBatch, never run itself
    input_ids: torch.Tensor  # pads carry SGLang's hash-derived ids; a routine clamps its copy in place
    mrope_positions: torch.Tensor | None
    mm_inputs: list | None

    @classmethod
    def record(cls, name: str, batch: Any) -> Scenario:
        positions = None if batch.mrope_positions is None else batch.mrope_positions.clone()
        mm_inputs = None if batch.mm_inputs is None else list(batch.mm_inputs)
        return cls(name, batch, batch.input_ids.clone(), positions, mm_inputs)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def mode(self) -> str:
        return "decode" if self.batch.forward_mode.is_decode() else "extend"

    def fresh(self) -> Any:
        batch = copy.copy(self.batch)
        batch.input_ids = self.input_ids.clone()
        batch.mm_inputs = None if self.mm_inputs is None else list(self.mm_inputs)
        batch.mrope_positions = None if self.mrope_positions is None else self.mrope_positions.clone()
        batch.mm_input_embeds = None
        return batch


# --- the runner and the two models -------------------------------------------------------------------


def load_upstream_runner(settings: Settings) -> tuple[Any, Any, Any]:
    """SGLang's ModelRunner with no plugin loaded: (runner, tokenizer, server_args)."""
    args = cpu_server_args(settings.model_dir, max_total_tokens=settings.max_total_tokens)
    runner, tokenizer = load_runner(args)
    return runner, tokenizer, args


def cpu_server_args(model_dir: Path | str, **overrides: Any) -> Any:
    """ServerArgs of a float32 CPU runner without radix cache; `overrides` are further ServerArgs fields."""

    fields = dict(model_path=str(model_dir), device="cpu", attention_backend="torch_native", dtype="float32",
                  max_total_tokens=16384, disable_radix_cache=True)  # fmt: skip
    return sglang.ServerArgs(**{**fields, **overrides})


def load_runner(args: Any) -> tuple[Any, Any]:
    """SGLang's ModelRunner in this process, as `sglang.benchmark.one_batch` loads it (publishing `args`
    process-wide), with whatever plugins the caller loaded: (runner, tokenizer)."""

    args.resolve_once()
    sglang.one_batch._set_envs_and_config(args)
    sglang.publish_server_args(args, role="scheduler", ranks=sglang.SpawnRanks(world_rank=0, gpu_id=0))
    sglang.one_batch._init_process_global_configs()
    bench_runner, tokenizer = sglang.one_batch.load_model(args, sglang.PortArgs.init_new(args), 0, 0)
    init_embedding_cache()
    return bench_runner.torch_runner, tokenizer


def init_embedding_cache() -> None:
    """SGLang's multimodal embedding cache, sized as the scheduler sizes it (one_batch builds none)."""

    sglang.mm_schedule.init_mm_embedding_cache(sglang.sglang_envs.SGLANG_VLM_CACHE_SIZE_MB.get() * 1024 * 1024)


def check_upstream(model: Any) -> str:
    """The upstream variant must be SGLang's own class calling SGLang's own, unhooked routine."""
    import importlib

    module = importlib.import_module(type(model).__module__)
    routine = getattr(module, "general_mm_embed_routine", None)
    if not type(model).__module__.startswith("sglang.srt.models."):
        raise RuntimeError(f"the runner's model is {type(model)}, not SGLang's: was a plugin loaded?")
    if routine is None or routine.__module__ != "sglang.srt.managers.mm_utils" or hasattr(routine, "__wrapped__"):
        raise RuntimeError(f"{module.__name__}.general_mm_embed_routine is not upstream's unhooked routine")
    return f"{type(model).__module__}.{type(model).__name__}"


def our_model(upstream: Any, runner: Any) -> Any:
    """This project's adapter for the upstream model's architecture, sharing its parameters."""

    from sglang_evs.models.registry import model_class

    cls = model_class(type(upstream).__name__)
    with sglang.set_default_torch_dtype(runner.model_config.dtype), torch.device(runner.device):
        ours = cls(config=runner.model_config.hf_config, quant_config=None)
    share_tensors(ours, upstream)
    ours.shared_experts_config = getattr(upstream, "shared_experts_config", None)
    return ours.eval()


def share_tensors(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Point every parameter and buffer of `dst` at `src`'s tensor of the same name. Modules only `dst`
    has (our fixed-address buffers) keep their own."""
    dst_modules = dict(dst.named_modules())
    for name, peer in src.named_modules():
        module = dst_modules.get(name)
        if module is None:
            raise RuntimeError(f"{type(dst).__name__} lacks upstream's module {name!r}")
        for store in ("_parameters", "_buffers"):
            mine, theirs = getattr(module, store), getattr(peer, store)
            if set(mine) != set(theirs):
                raise RuntimeError(f"{name}: {store} differ: {sorted(mine)} vs {sorted(theirs)}")
            mine.update(theirs)


# --- requests and batches, through SGLang's own path ---------------------------------------------------


def media_processor(runner: Any, server_args: Any) -> Any:
    """The multimodal processor SGLang's tokenizer manager builds for this model (no plugin: upstream's)."""

    sglang.import_processors("sglang.srt.multimodal.processors")
    return sglang.get_mm_processor(runner.model_config.hf_config, server_args, sglang.get_processor_wrapper(),
                            sglang.determine_tensor_transport_mode(), model_config=runner.model_config)  # fmt: skip


def make_request(runner: Any, processor: Any, tokenizer: Any, rid: str, prompt: str,
                 images: Sequence[Path] = (), videos: Sequence[Path] = (),
                 processor_kwargs: dict | None = None) -> Any:  # fmt: skip
    """A scheduler `Req` as SGLang builds it: processed media, padded ids, the whole prompt to extend
    (`processor_kwargs`: the request's `mm_processor_kwargs`)."""
    if images or videos:
        ids, mm_inputs = _processed(runner, processor, prompt, images, videos, processor_kwargs)
        return new_request(rid, ids, mm_inputs, prompt)
    return new_request(rid, array("q", tokenizer.encode(prompt)), text=prompt)


def new_request(rid: str, ids: Sequence[int], mm_inputs: Any = None, text: str = "") -> Any:
    """A scheduler `Req` of (padded) token ids and their media, ready to extend all its ids."""

    req = sglang.Req(rid=rid, origin_input_text=text, origin_input_ids=array("q", ids),
              sampling_params=sglang.SamplingParams(temperature=0, max_new_tokens=8))  # fmt: skip
    if mm_inputs is not None:
        req.extend_image_inputs(mm_inputs)
    req.full_untruncated_fill_ids = req.origin_input_ids
    req.logprob_start_len = -1
    req.extend_end = len(req.origin_input_ids)
    return req


def _processed(runner: Any, processor: Any, prompt: str, images, videos, processor_kwargs) -> tuple[array, Any]:
    obj = sglang.GenerateReqInput(text=prompt, image_data=[str(p) for p in images] or None,
                           video_data=[str(p) for p in videos] or None,
                           mm_processor_kwargs=processor_kwargs)  # fmt: skip
    output = asyncio.run(
        processor.process_mm_data_async(image_data=obj.image_data, audio_data=None, input_text=prompt,
                                        request_obj=obj, max_req_input_len=runner.model_config.context_len)
    )  # fmt: skip
    mm_inputs = sglang.MultimodalInputs.from_processor_output(
        output, requires_mm_token_modalities=runner.model_config.requires_mm_token_modalities
    )
    ids = array("q", output.input_ids)
    padded = mm_inputs.padded_input_ids
    if padded is not None and len(padded) == len(ids):
        return array("q", padded), mm_inputs
    return sglang.duplicate_pad_mm_input_ids(ids, mm_inputs, runner.model.pad_input_ids), mm_inputs


def schedule_batch(runner: Any, reqs: list) -> Any:
    tree_cache = sglang.one_batch.TreeCacheNamespace(page_size=sglang.get_schedule().page_size, device=runner.device,
                                              token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)  # fmt: skip
    return sglang.ScheduleBatch.init_new(
        reqs=reqs, req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator, tree_cache=tree_cache,
        model_config=runner.model_config, enable_overlap=False, spec_algorithm=sglang.SpeculativeAlgorithm.NONE,
    )  # fmt: skip


def extend_batch(runner: Any, batch: Any) -> Any:
    """`prepare_for_extend` and the ForwardBatch of it."""

    batch.prepare_for_extend()
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        batch.input_ids = batch.prefill_input_ids_cpu
        batch.prefill_input_ids_cpu = None
    return sglang.ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)


def decode_batch(runner: Any, batch: Any, next_ids: torch.Tensor) -> Any:
    """After an extend of `batch`: one decode step feeding `next_ids`, its ForwardBatch."""

    for req, token in zip(batch.reqs, next_ids.tolist(), strict=True):
        req.output_ids.append(int(token))
    batch.output_ids = next_ids
    batch.input_ids = next_ids.to(torch.int64)
    batch.prepare_for_decode()
    return sglang.ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)


# --- one timed call ------------------------------------------------------------------------------------


@contextmanager
def forward_context(runner: Any, batch: Any):

    with sglang.forward_context(sglang.ForwardContext(attn_backend=runner.attn_backend), forward_batch=batch):
        yield


def timed_forward(runner: Any, model: Any, scenario: Scenario) -> tuple[float, torch.Tensor]:
    """Seconds of one `model.forward` on a fresh copy of the scenario's batch, and its next-token logits."""

    batch = scenario.fresh()
    if sglang.mm_schedule.embedding_cache is not None:
        sglang.mm_schedule.embedding_cache.clear()  # the vision encoder runs on every call
    runner.attn_backend.init_forward_metadata(batch)
    with torch.no_grad(), forward_context(runner, batch):
        start = time.perf_counter()
        output = model.forward(batch.input_ids, batch.positions, batch)
        seconds = time.perf_counter() - start
    return seconds, output.next_token_logits


# --- scenarios -------------------------------------------------------------------------------------------

TEXT = "Count the objects in the scene, say which one moves and where it goes."


def build_scenarios(runner: Any, models: dict[str, Any], tokenizer: Any, processor: Any, settings: Settings,
                    media_dir: Path) -> list[Scenario]:  # fmt: skip
    """text, image, video, video in two chunks, and a decode step of a text + image + video batch."""
    from sglang_evs.testing.media import write_clip, write_image
    from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt

    size = settings.clip_size
    image = write_image(media_dir / "image.png", size, size)
    frames = max(2, round(settings.clip_seconds * 4))
    video = write_clip(media_dir / "clip.mp4", "moving", fps=4, num_frames=frames, height=size, width=size)
    prompts = {"text": (chat_prompt(text=TEXT), {}), "image": (chat_prompt(IMAGE, text=TEXT), {"images": [image]}),
               "video": (chat_prompt(VIDEO, text=TEXT), {"videos": [video]})}  # fmt: skip

    def request(kind: str, rid: str) -> Any:
        prompt, media = prompts[kind]
        return make_request(runner, processor, tokenizer, rid, prompt, **media)

    scenarios = [Scenario.record(kind, extend_batch(runner, schedule_batch(runner, [request(kind, kind)])))
                 for kind in prompts]  # fmt: skip
    scenarios += chunked_video(runner, models["upstream"], request("video", "chunked"))
    scenarios.append(batch_decode(runner, models["upstream"], [request(kind, f"decode-{kind}") for kind in prompts]))
    return scenarios


def chunked_video(runner: Any, model: Any, req: Any) -> list[Scenario]:
    """The video request prefilled in two chunks, cut halfway into its video (as a chunked prefill cuts it)."""
    spans = [span for item in req.multimodal_inputs.mm_items for span in item.offsets]
    cut = (spans[0][0] + spans[-1][1]) // 2
    total = req.extend_end
    req.extend_end = cut
    first = Scenario.record("video_chunk1", extend_batch(runner, schedule_batch(runner, [req])))
    timed_forward(runner, model, first)  # the second chunk attends to this chunk's KV
    req.prefix_len, req.extend_end = cut, total
    second = Scenario.record("video_chunk2", extend_batch(runner, schedule_batch(runner, [req])))
    return [first, second]


def batch_decode(runner: Any, model: Any, reqs: list) -> Scenario:
    batch = schedule_batch(runner, reqs)
    prefill = Scenario.record("decode_prefill", extend_batch(runner, batch))
    _, logits = timed_forward(runner, model, prefill)
    return Scenario.record("decode", decode_batch(runner, batch, logits.argmax(dim=-1)))


# --- the measurement -------------------------------------------------------------------------------------


class OutputsDiffer(AssertionError):
    """The two variants gave different logits for the same batch: the comparison would be meaningless."""


def measure(settings: Settings, progress: Callable[[str], None] = print) -> dict:
    """Load, record the scenarios, warm up (checking each variant's routing), time the rounds, summarize."""
    from sglang_evs.runtime import bootstrap

    bootstrap.install()  # the CPU runtime's import fixes, as a CPU server has them (no-op elsewhere)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    runner, tokenizer, server_args = load_upstream_runner(settings)
    upstream_name = check_upstream(runner.model)
    ours = runner.model if settings.control else our_model(runner.model, runner)
    models = {"ours": ours, "upstream": runner.model}
    with tempfile.TemporaryDirectory() as media_dir:
        processor = media_processor(runner, server_args)
        scenarios = build_scenarios(runner, models, tokenizer, processor, settings, Path(media_dir))
    progress("scenarios: " + ", ".join(f"{s.name} ({s.mode}, {s.tokens} tokens)" for s in scenarios))
    gc.collect()
    gc.freeze()  # what was built so far is never scanned again: collections stay short during the calls
    with counted_routing(models["upstream"]) as routing:
        for _ in range(max(1, settings.warmup)):
            for index, scenario in enumerate(scenarios):
                paired_call(runner, models, scenario, index)
    check_routing(routing, max(1, settings.warmup) * len(scenarios), settings.control)
    report = summarize(scenarios, timed_rounds(runner, models, scenarios, settings, progress))
    report["rounds_requested"] = settings.rounds
    report["routing_in_warmup"] = routing
    report.update(setup(settings, upstream_name, type(models["ours"]), processor))
    return report


def timed_rounds(runner: Any, models: dict[str, Any], scenarios: list[Scenario], settings: Settings,
                 progress: Callable[[str], None]) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """Per scenario and variant, the seconds of each round; stops early rather than start a round that
    would end past `settings.max_minutes`."""
    times: dict[str, dict[str, list[float]]] = {s.name: {v: [] for v in VARIANTS} for s in scenarios}
    start = time.monotonic()
    for round_index in range(settings.rounds):
        round_start = time.monotonic()
        for index, scenario in enumerate(scenarios):
            seconds = paired_call(runner, models, scenario, round_index + index)
            for variant in VARIANTS:
                times[scenario.name][variant].append(seconds[variant])
        pooled = geometric_interval([r for t in times.values() for r in pair_ratios(t)])
        progress(f"round {round_index + 1}/{settings.rounds}: pooled ours/upstream {_interval_text(pooled)}")
        now = time.monotonic()
        if settings.max_minutes and now + (now - round_start) - start > 60 * settings.max_minutes:
            progress(f"stopping after {round_index + 1} rounds: the next would pass {settings.max_minutes} min")
            break
    return times


@contextmanager
def counted_routing(upstream: Any):
    """Counts, while active, the calls of upstream's routine (through the name upstream's forward calls),
    of ours (through the name our adapter calls) and of our `post_process`."""
    import importlib

    from sglang_evs.models import adapter

    targets = {
        "upstream_routine": (importlib.import_module(type(upstream).__module__), "general_mm_embed_routine"),
        "ours_routine": (adapter, "general_mm_embed_routine"),
        "ours_post_process": (adapter, "fill_graph_inputs"),
    }
    counts = dict.fromkeys(targets, 0)
    originals = {key: getattr(module, name) for key, (module, name) in targets.items()}
    for key, (module, name) in targets.items():
        setattr(module, name, _counting(originals[key], counts, key))
    try:
        yield counts
    finally:
        for key, (module, name) in targets.items():
            setattr(module, name, originals[key])


def _counting(function: Callable, counts: dict[str, int], key: str) -> Callable:
    def counted(*args, **kwargs):
        counts[key] += 1
        return function(*args, **kwargs)

    return counted


def check_routing(counts: dict[str, int], calls: int, control: bool = False) -> None:
    """Each variant's forward went through its own routine, once per call (`calls` per variant), and ours
    through `post_process`; in a control run both slots went through upstream's routine."""
    expected = dict.fromkeys(counts, calls)
    if control:
        expected = {key: 2 * calls if key == "upstream_routine" else 0 for key in counts}
    if counts != expected:
        raise RuntimeError(f"routing: expected {expected} calls, counted {counts}")


def paired_call(runner: Any, models: dict[str, Any], scenario: Scenario, parity: int) -> dict[str, float]:
    """Both variants on the scenario, in an order set by `parity`; their logits must be identical."""
    order = VARIANTS if parity % 2 == 0 else VARIANTS[::-1]
    seconds, logits = {}, {}
    for variant in order:
        seconds[variant], logits[variant] = timed_forward(runner, models[variant], scenario)
    if not torch.equal(logits["ours"], logits["upstream"]):
        diff = (logits["ours"] - logits["upstream"]).abs().max().item()
        raise OutputsDiffer(f"{scenario.name}: next-token logits differ between the variants (max |diff| {diff})")
    return seconds


def summarize(scenarios: list[Scenario], times: dict[str, dict[str, list[float]]]) -> dict:
    per_scenario, pooled = {}, []
    for scenario in scenarios:
        ours, upstream = times[scenario.name]["ours"], times[scenario.name]["upstream"]
        ratios = pair_ratios(times[scenario.name])
        pooled += ratios
        per_scenario[scenario.name] = {
            "mode": scenario.mode,
            "tokens": scenario.tokens,
            "outputs_identical": True,  # checked on every pair (paired_call raises otherwise)
            "median_ms": {"ours": statistics.median(ours) * 1e3, "upstream": statistics.median(upstream) * 1e3},
            "ratio": geometric_interval(ratios),
            "median_ratio": median_interval(ratios),
            "per_pair": ratios,
        }
    rounds = len(next(iter(times.values()))["ours"])
    totals = [sum(t["ours"][r] for t in times.values()) / sum(t["upstream"][r] for t in times.values())
              for r in range(rounds)]  # fmt: skip
    interval = geometric_interval(pooled)
    return {
        "scenarios": per_scenario,
        "pooled": interval,
        "pooled_half_width": half_width(interval),
        "pooled_median": median_interval(pooled),
        "round_totals": geometric_interval(totals),
        "goal": GOAL,
        "within_goal": interval["high"] is not None and interval["high"] <= GOAL,
        "outputs_identical": True,
        "rounds": rounds,
    }


def pair_ratios(times: dict[str, list[float]]) -> list[float]:
    return [a / b for a, b in zip(times["ours"], times["upstream"], strict=True)]


def half_width(interval: dict) -> float | None:
    """Half the interval's width, relative to its geometric mean (0.005 = +-0.5 %)."""
    if interval["low"] is None:
        return None
    return (interval["high"] - interval["low"]) / 2 / interval["geometric_mean"]


def setup(settings: Settings, upstream_name: str, ours: type, processor: Any) -> dict:
    import sglang

    return {
        "model": str(settings.model_dir),
        "variants": {"ours": f"{ours.__module__}.{ours.__name__}", "upstream": upstream_name},
        "processor": f"{type(processor).__module__}.{type(processor).__name__}",
        "warmup": settings.warmup,
        "control": settings.control,
        "max_minutes": settings.max_minutes,
        "clip_seconds": settings.clip_seconds,
        "clip_size": settings.clip_size,
        "torch_threads": torch.get_num_threads(),
        "sglang": sglang.__version__,
        "torch": torch.__version__,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _interval_text(interval: dict) -> str:
    if interval["low"] is None:
        return f"{interval['geometric_mean']:.4f}"
    return f"{interval['geometric_mean']:.4f} (95 % {interval['low']:.4f}-{interval['high']:.4f})"


def report_text(report: dict) -> str:
    lines = [f"{'scenario':<14}{'mode':<8}{'tokens':>7}{'ours ms':>10}{'upstream ms':>13}  ours/upstream (95 %)"]
    for name, row in report["scenarios"].items():
        lines.append(f"{name:<14}{row['mode']:<8}{row['tokens']:>7}{row['median_ms']['ours']:>10.2f}"
                     f"{row['median_ms']['upstream']:>13.2f}  {_interval_text(row['ratio'])}")  # fmt: skip
    width = report["pooled_half_width"]
    lines.append(f"pooled ({report['pooled']['pairs']} pairs): {_interval_text(report['pooled'])}"
                 + ("" if width is None else f", +-{100 * width:.2f} %"))  # fmt: skip
    median = report["pooled_median"]
    if median["low"] is not None:
        lines.append(f"median pair: {median['median']:.4f} (95 % {median['low']:.4f}-{median['high']:.4f})")
    lines.append(f"per-round totals: {_interval_text(report['round_totals'])}")
    lines.append(f"within {100 * (report['goal'] - 1):.0f} % (interval's upper end): {report['within_goal']}")
    return "\n".join(lines)
