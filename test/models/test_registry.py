"""Every SGLang model that passes deepstack through the routine's legacy `use_deepstack` argument is
answered by a class of this project, and a caller passing it still gets this project's routine.

Both in a fresh interpreter that loads the plugin the way SGLang's processes do (`load_plugins()`
after the model modules were imported, so the hooks also reach their `from ... import` bindings).
"""

import json
import os
import subprocess
import sys
import textwrap

# grep of SGLang 0.5.23: upstream Qwen3-VL's forward (`use_deepstack=self.use_deepstack`) and the
# registered architectures whose model runs it (none overrides forward)
USE_DEEPSTACK_ARCHITECTURES = {
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "Cosmos3ForConditionalGeneration",
}

PROBE = """
    import inspect, json
    import torch
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.models import qwen3_5, qwen3_vl  # imported before the plugin, as in a server
    from sglang.srt.managers.schedule_batch import Modality
    from sglang.srt.plugins import load_plugins
    from sglang_evs.models.adapter import AdaptedModel
    from sglang_evs.multimodal.contract import FetchedEmbedding

    def passes_use_deepstack(cls):
        try:
            return "use_deepstack" in inspect.getsource(cls.forward)
        except (AttributeError, OSError, TypeError):  # no forward, or not Python source
            return False

    callers = sorted(arch for arch, cls in ModelRegistry.models.items() if passes_use_deepstack(cls))
    load_plugins()
    resolved = {}
    for arch in callers:
        cls, _ = ModelRegistry.resolve_model_cls([arch])
        upstream = ModelRegistry.models[arch]
        resolved[arch] = [cls.__module__, issubclass(cls, AdaptedModel), issubclass(cls, upstream)]

    class Batch:
        class forward_mode:
            is_decode = staticmethod(lambda: True)
            is_target_verify = staticmethod(lambda: False)
        seq_lens_cpu = torch.tensor([4])
        input_embeds = None
        extend_prefix_lens_cpu = None
        contains_mm_inputs = staticmethod(lambda: False)

    class LanguageModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
        def get_input_embeddings(self):
            return self.embed
        def forward(self, input_ids, forward_batch, input_embeds, **kwargs):
            return input_embeds

    class Model(torch.nn.Module):
        implements_post_process_contract = True  # only this project's routine calls it
        calls = 0
        def post_process(self, fetched, layout):
            Model.calls += 1
            return fetched

    # the name upstream Qwen3-VL's forward (inherited by Qwen3.5) calls, with its arguments
    out = qwen3_vl.general_mm_embed_routine(
        input_ids=torch.tensor([3]), forward_batch=Batch(), language_model=LanguageModel(),
        multimodal_model=Model(), positions=None,
        use_deepstack={Modality.IMAGE: True, Modality.VIDEO: True}, pp_proxy_tensors=None,
    )
    print(json.dumps({"callers": callers, "resolved": resolved, "post_process_calls": Model.calls,
                      "rows": list(out.shape)}))
"""


def test_use_deepstack_callers_resolve_to_our_classes_and_get_our_routine():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["callers"]) == USE_DEEPSTACK_ARCHITECTURES
    for arch, (module, adapted, subclasses_upstream) in result["resolved"].items():
        assert module.startswith("sglang_evs.models."), arch
        assert adapted and subclasses_upstream, arch
    assert result["post_process_calls"] == 1 and result["rows"] == [1, 4]
