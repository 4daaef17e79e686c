"""sglang-evs: exact video-token pruning (EVS, VidCom2) for SGLang's Qwen VLMs.

Subpackages:
  evs/         pure-torch pruning algorithms: keep-masks and kept counts (no SGLang imports)
  pruning/     the model-agnostic pruning mechanism on SGLang: prompt layout before encoding,
               cache keys, region fill and exact positions after it, usage counts
  multimodal/  the model-agnostic embedding routine and its model contract
  models/      model adapters (Qwen3-VL/-MoE, Qwen2.5-VL, Qwen2-VL) and the fixed-address
               buffers their language models read under prefill CUDA graphs
  runtime/     CPU-only support so SGLang 0.5.23 runs without a GPU
  testing/     offline tiny-model builder, synthetic media, server launcher, CPU graph stand-in
  bench/       benchmark and accuracy tooling
sglang_compat.py is the one module that names SGLang internals; plugin.py the entry point.
"""

__version__ = "0.1.0"
