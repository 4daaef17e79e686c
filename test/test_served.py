"""`served.py`: one record per architecture, each draft written once, and each record's adapter class there."""

import ast
from pathlib import Path

from sglang_evs.served import EAGLE3_DRAFT, GLM4V, MTP_DRAFTS, QWEN_VL, SERVED, mtp_draft_of

MODELS = Path(__file__).resolve().parents[1] / "python" / "sglang_evs" / "models"


def defined_classes(module: str) -> set[str]:
    tree = ast.parse((MODELS / f"{module}.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def test_each_record_names_a_class_its_adapter_module_defines():
    for architecture, model in SERVED.items():
        assert model.architecture == architecture
        assert architecture in defined_classes(model.module), architecture
    for draft in [*MTP_DRAFTS.values(), EAGLE3_DRAFT]:
        module, _, name = draft.ours.partition(":")
        assert name in defined_classes(module), draft


def test_an_mtp_draft_is_written_once_and_read_from_its_targets():
    assert set(MTP_DRAFTS) == {"Qwen3_5ForCausalLMMTP", "Qwen4ExpForCausalLMMTP"}
    targets = {architecture for architecture in SERVED if mtp_draft_of(architecture) is not None}
    assert targets == {
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
    }
    assert mtp_draft_of("Qwen3_5ForConditionalGeneration") is mtp_draft_of("Qwen3_5MoeForConditionalGeneration")
    assert mtp_draft_of(None) is None and mtp_draft_of("LlavaForConditionalGeneration") is None


def test_the_families_and_what_is_left_off():
    assert {name for name, model in SERVED.items() if model.family is GLM4V} == {
        "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
    }
    assert all(model.family in (QWEN_VL, GLM4V) for model in SERVED.values())
    assert [name for name, model in SERVED.items() if model.eager_prefill] == []  # every one has prefill graphs
    assert {name for name, model in SERVED.items() if model.unproven_encoder_path} == {
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
    }
