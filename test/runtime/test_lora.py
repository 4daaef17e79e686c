"""LoRA's pinned host tensors on the CPU route (`runtime/lora.py`): what SGLang's LoRA modules pin is created and
"pinned" on a CPU-only torch, with the values asked for; without the stand-ins the same calls raise."""

from types import ModuleType

import pytest
import torch

from sglang_evs.runtime import lora


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works where there is an accelerator")
def test_the_lora_modules_create_their_pinned_tensors_unpinned():
    with pytest.raises(RuntimeError, match="pin_memory"):
        torch.tensor([0, 4, 8], dtype=torch.int32, pin_memory=True)
    module = ModuleType("layers")
    lora.lora_modules_unpinned(module)
    offsets = module.torch.tensor([0, 4, 8], dtype=torch.int32, device="cpu", pin_memory=True)
    assert offsets.tolist() == [0, 4, 8] and offsets.dtype == torch.int32
    assert module.torch.zeros((3,), dtype=torch.int32, pin_memory=True).tolist() == [0, 0, 0]
    assert module.torch.empty(2, 5, pin_memory=True).shape == (2, 5)
    assert module.torch.cumsum is torch.cumsum  # everything else is torch's


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works where there is an accelerator")
def test_building_a_lora_manager_makes_pinning_return_the_tensor(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "pin_memory", torch.Tensor.pin_memory)  # restored after the test
    built = []

    class LoRAManager:
        def __init__(self, *args, **kwargs):
            built.append((args, kwargs))

    module = ModuleType("lora_manager")
    module.LoRAManager = LoRAManager
    lora.pin_memory_is_a_no_op(module)
    indices = torch.arange(4)
    with pytest.raises(RuntimeError, match="accelerator"):
        indices.pin_memory()  # nothing changed before a manager is built
    module.LoRAManager("model", max_loras=2)
    assert built == [(("model",), {"max_loras": 2})]
    assert indices.pin_memory() is indices
