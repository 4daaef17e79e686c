"""Run as a script: every architecture of SGLang's model registry, which embedding routine its model reaches
and what that routine hands the language model, as one JSON line on stdout.

    python test/models/routine_probe.py on|off

The process loads SGLang the way a server does: the registry imports every model module, then (with `on`)
`load_plugins()` runs the plugin's hooks over them. For each architecture:
  - `resolved`: the class SGLang builds for it (`ModelRegistry.resolve_model_cls`, the plugin's answer
    where it answers);
  - `processor`: the multimodal processor SGLang's tokenizer process picks for it (`PROCESSOR_MAPPING`
    after `import_processors`, which the plugin extends for its own models), None for a text model;
  - `routines`: the embedding routines its model reaches, found by following, from every function the
    class and its bases define, the module-level names each one's code uses (into other SGLang and
    sglang-evs functions), and the classes whose `forward` an `__init__` binds as its own
    (`self.forward = self.thinker.forward`): each named as upstream's, this project's, or a wrapper of
    either (a hook);
  - `received`: for each routine reached, digests of what it hands the language model on a synthetic
    prefill, cut in two chunks across an image and a video: the input embeddings and every tensor
    argument, in the two shapes of call upstream's models make (plain, and with deepstack rows, as
    upstream Qwen3-VL's forward hands the routine `use_deepstack`); the multimodal model is a bare
    instance of the class.

And for every speculative draft architecture of the registry (`DRAFT_NAME`), the class SGLang builds for it
beside each target of `DRAFT_TARGETS` (none: outside a server), with positions traced and without (the
plugin answers the EAGLE3 draft only where they are): the server's target is what a draft worker reads of
its server arguments (`--model-path`), here a checkpoint directory holding only the target's config.json.

Printed: {"models": {architecture: row}, "drafts": {draft: {"target|traced": class}}}.
"""

import ast
import hashlib
import inspect
import json
import os
import re
import sys
import tempfile
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

HIDDEN, VOCAB = 8, 64
# A speculative draft, by its registry name (SGLang 0.5.23 names each draft class so: NEXTN/MTP layers, EAGLE
# heads, DFlash/DSpark and other draft models).
DRAFT_NAME = re.compile(r"MTP|NextN|Eagle|DFlash|DSpark|Draft")
# Targets SGLang builds the Qwen3.5 MTP draft for (`ModelConfig._config_draft_model`) that this project does
# not serve, and a text model with no draft of its own; the served targets are added from `served.SERVED`.
OTHER_TARGETS = (
    "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "LlamaForCausalLM",
)  # fmt: skip


def main(plugin: str) -> None:
    from sglang.srt.managers import mm_schedule, mm_utils, multimodal_processor
    from sglang.srt.models.registry import ModelRegistry

    import sglang_evs.multimodal.embed_routine as ours

    upstream_routine = mm_utils.general_mm_embed_routine  # before any hook can wrap it
    if plugin == "on":
        from sglang.srt.plugins import load_plugins

        load_plugins()
    multimodal_processor.import_processors("sglang.srt.multimodal.processors")  # as the tokenizer process does
    processors = {model.__name__: cls for model, cls in multimodal_processor.PROCESSOR_MAPPING.items()}
    mm_schedule.init_mm_embedding_cache(64 * 1024 * 1024)
    mm_utils.get_server_args = lambda: None  # no server here: the routine's path without adaptive dispatch
    known = {id(upstream_routine): "upstream", id(ours.general_mm_embed_routine): "sglang_evs"}

    table = {}
    for arch in sorted(ModelRegistry.models):
        cls, _ = ModelRegistry.resolve_model_cls([arch])
        routines = routines_reached(cls, known)
        processor = processors.get(arch)
        table[arch] = {
            "resolved": f"{cls.__module__}:{cls.__qualname__}",
            "processor": None if processor is None else f"{processor.__module__}:{processor.__qualname__}",
            "routines": sorted({name for name, _ in routines}),
            # this project's routine calls its models' post_process, which a bare instance cannot run:
            # those models are compared with upstream by the server tests
            "received": sorted(
                {
                    received(routine, cls, deepstack)
                    for name, routine in routines
                    if name != "sglang_evs"
                    for deepstack in (False, True)
                }
            ),  # fmt: skip
        }
    print(json.dumps({"models": table, "drafts": drafts_table(ModelRegistry)}))


def drafts_table(registry) -> dict[str, dict[str, str]]:
    """draft architecture -> {"target|traced": the class resolved} (see the module docstring)."""
    from sglang.srt import runtime_context

    from sglang_evs import trace
    from sglang_evs.served import SERVED

    drafts = sorted(arch for arch in registry.models if DRAFT_NAME.search(arch))
    table: dict[str, dict[str, str]] = {draft: {} for draft in drafts}
    with tempfile.TemporaryDirectory() as folder:
        for target in (None, *OTHER_TARGETS, *SERVED):
            checkpoint = None
            if target is not None:
                checkpoint = Path(folder, target)
                checkpoint.mkdir()
                (checkpoint / "config.json").write_text(json.dumps({"architectures": [target]}))
            # the server arguments a draft worker reads: only the target's checkpoint is read of them
            runtime_context._CONTEXT._server_args = None if target is None else SimpleNamespace(model_path=checkpoint)
            for traced in (False, True):
                traced_env = {trace.ENV: str(Path(folder, "trace.jsonl")), trace.POSITIONS_ENV: "1"}
                for key in traced_env:
                    os.environ.pop(key, None)
                os.environ.update(traced_env if traced else {})
                for draft in drafts:
                    cls, _ = registry.resolve_model_cls([draft])
                    table[draft][f"{target}|{traced}"] = f"{cls.__module__}:{cls.__qualname__}"
        for key in (trace.ENV, trace.POSITIONS_ENV):
            os.environ.pop(key, None)
        runtime_context._CONTEXT._server_args = None
    return table


def routines_reached(cls: type, known: dict[int, str]) -> list[tuple[str, object]]:
    """(name, routine) for every embedding routine `cls`'s model reaches (see the module docstring)."""
    found: dict[int, tuple[str, object]] = {}
    seen: set[int] = set()

    def name_of(value) -> str | None:
        if id(value) in known:
            return known[id(value)]
        wrapped = getattr(value, "__wrapped__", None)
        return f"hooked {known[id(wrapped)]}" if wrapped is not None and id(wrapped) in known else None

    def visit(fn) -> None:
        fn = inspect.unwrap(fn) if callable(fn) else fn  # through decorators such as torch.no_grad()
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in seen or not _ours_or_sglang(fn):
            return
        seen.add(id(fn))
        for name in _names(code):
            value = fn.__globals__.get(name)
            routine = name_of(value)
            if routine is not None:
                found[id(value)] = (routine, value)
            elif isinstance(value, types.FunctionType):
                visit(value)

    def visit_class(klass: type) -> None:
        for base in klass.__mro__:
            if base is object or base.__module__.startswith(("torch", "transformers")):
                continue
            for attr in vars(base).values():
                visit(getattr(attr, "__func__", attr))
            for delegate in _forward_delegates(base):
                visit_class(delegate)

    visit_class(cls)
    return list(found.values())


def _ours_or_sglang(fn) -> bool:
    return (getattr(fn, "__module__", None) or "").startswith(("sglang.", "sglang_evs."))


def _names(code: types.CodeType):
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _forward_delegates(klass: type) -> list[type]:
    """Classes whose `forward` `klass.__init__` binds as the model's own: `self.forward = self.X.forward`
    with `self.X = SomeClass(...)` in the same `__init__`."""
    init = vars(klass).get("__init__")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (TypeError, OSError):
        return []
    built, delegated = {}, []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = ast.unparse(node.targets[0]), node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and target.startswith("self."):
            built[target] = value.func.id
        elif target == "self.forward" and isinstance(value, ast.Attribute) and value.attr == "forward":
            delegated.append(ast.unparse(value.value))
    module = sys.modules[klass.__module__]
    return [vars(module)[built[attr]] for attr in delegated if built.get(attr) in vars(module)]


class _LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(torch.arange(VOCAB * HIDDEN, dtype=torch.float32).view(VOCAB, HIDDEN))
        self.received: list = []

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def forward(self, input_ids, forward_batch, input_embeds, **kwargs):
        tensors = {key: value.clone() for key, value in kwargs.items() if isinstance(value, torch.Tensor)}
        self.received.append((input_ids, input_embeds.clone(), tensors))
        return input_embeds


class _Mode:
    def is_decode(self) -> bool:
        return False

    def is_target_verify(self) -> bool:
        return False

    def is_extend(self) -> bool:
        return True


class _Batch:
    """The fields both routines read of a ForwardBatch, for one request's prefill chunk."""

    def __init__(self, mm_inputs, prefix: int, extend: int) -> None:
        self.forward_mode, self.mm_inputs = _Mode(), [mm_inputs]
        self.extend_prefix_lens_cpu, self.extend_seq_lens_cpu = [prefix], [extend]
        self.seq_lens_cpu = torch.tensor([prefix + extend])
        self.input_embeds = self.mm_input_embeds = self.spec_algorithm = None

    def contains_mm_inputs(self) -> bool:
        return self.mm_inputs is not None and any(mm is not None for mm in self.mm_inputs)


def received(routine, cls: type, deepstack: bool) -> str:
    """Digest of what `routine` hands the language model over a synthetic two-chunk prefill."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    width = 2 * HIDDEN if deepstack else HIDDEN
    spans = {Modality.IMAGE: (3, 6), Modality.VIDEO: (9, 14)}  # inclusive token spans, 4 and 6 rows
    items = []
    for modality, (start, end) in spans.items():
        rows = end - start + 1
        feature = torch.arange(rows * width, dtype=torch.float32).view(rows, width) + 1000 * (len(items) + 1)
        item = MultimodalDataItem(modality=modality, feature=feature, offsets=[(start, end)])
        item.set_pad_value()
        items.append(item)
    ids = list(range(1, 17))
    for item, (start, end) in zip(items, spans.values(), strict=True):
        ids[start : end + 1] = [item.pad_value] * (end - start + 1)
    features = {item.modality: item.feature for item in items}

    def embed(modality):
        return lambda chosen: torch.cat([features[modality] for _ in chosen])

    model = cls.__new__(cls)
    nn.Module.__init__(model)
    model.deepstack_visual_indexes = [0]
    model.separate_deepstack_embeds = lambda rows: (rows[:, :HIDDEN], rows[:, HIDDEN:])
    language_model = _LanguageModel()
    for prefix, extend in ((0, 7), (7, len(ids) - 7)):  # the first chunk ends inside the image
        mm_inputs = MultimodalInputs(mm_items=items)
        kwargs = {"use_deepstack": {Modality.IMAGE: True, Modality.VIDEO: True}} if deepstack else {}
        try:
            routine(
                input_ids=torch.tensor(ids[prefix : prefix + extend]),
                forward_batch=_Batch(mm_inputs, prefix, extend),
                language_model=language_model,
                multimodal_model=model,
                data_embedding_funcs={Modality.IMAGE: embed(Modality.IMAGE), Modality.VIDEO: embed(Modality.VIDEO)},
                positions=None,
                **kwargs,
            )
        except Exception as exc:  # a routine that cannot take what upstream's takes is a row of the table too
            return f"raised {type(exc).__name__}: {exc}"[:120]
    digest = hashlib.sha256()
    for input_ids, embeds, tensors in language_model.received:
        digest.update(repr((input_ids, sorted((k, tuple(v.shape)) for k, v in tensors.items()))).encode())
        for tensor in [embeds, *(tensors[k] for k in sorted(tensors))]:
            digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    main(sys.argv[1])
