"""LoRA adapters (`--enable-lora --lora-backend torch_native`) on the CPU route: the host tensors it pins.

SGLang's LoRA layers (`lora/layers.py`) and its torch-native LoRA backend (`lora/backend/torch_backend.py`) keep
small offset, index and scaling tensors in pinned host memory for non-blocking copies to a GPU: created pinned
(`torch.tensor(..., pin_memory=True)`, `torch.zeros(..., pin_memory=True)`) or pinned after the fact
(`.pin_memory()`). On a CPU-only torch both raise ("pin_memory=True requires a CUDA or other accelerator backend",
"Cannot access accelerator device when none is available"), and a LoRA server stops while it builds its first
LoRA layer. The device is host memory here, so there is nothing
to pin for and the copies are plain copies:
- in those two modules `torch` is a view of torch whose `tensor`, `empty` and `zeros` drop `pin_memory`
  (`lora_modules_unpinned`);
- a server that builds a `LoRAManager` gets a `Tensor.pin_memory` that returns the tensor itself
  (`pin_memory_is_a_no_op`): the layers and the backend also pin tensors they got from elsewhere. Only a LoRA
  server builds one, and on a CPU-only torch `pin_memory()` has no other outcome than the error.
"""

from functools import wraps
from types import ModuleType
from typing import Any

import torch


def _unpinned(constructor):
    @wraps(constructor)
    def build(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return constructor(*args, **kwargs)

    return build


class _UnpinnedTorch:
    """`torch` as the LoRA modules see it on CPU: `tensor`, `empty` and `zeros` never pin; all else is torch."""

    tensor = staticmethod(_unpinned(torch.tensor))
    empty = staticmethod(_unpinned(torch.empty))
    zeros = staticmethod(_unpinned(torch.zeros))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def lora_modules_unpinned(module: ModuleType) -> None:
    """After `sglang.srt.lora.layers` or `sglang.srt.lora.backend.torch_backend` imports: nothing it creates
    is pinned."""
    module.torch = _UnpinnedTorch()


def _tensor_itself(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
    return tensor


def pin_memory_is_a_no_op(module: ModuleType) -> None:
    """After `sglang.srt.lora.lora_manager` imports: building a `LoRAManager` makes `Tensor.pin_memory` return the
    tensor itself, in this process."""
    manager = module.LoRAManager
    build = manager.__init__

    @wraps(build)
    def init(self, *args: Any, **kwargs: Any) -> None:
        torch.Tensor.pin_memory = _tensor_itself
        build(self, *args, **kwargs)

    manager.__init__ = init
