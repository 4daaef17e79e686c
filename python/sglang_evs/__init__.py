"""sglang-evs: exact video-token pruning (EVS, VidCom2) for SGLang's Qwen VLMs, as an SGLang plugin.

Subpackages:
  methods/     pure-torch pruning methods: keep-masks and kept counts (SGLang's evs_core maths only)
  pruning/     the model-agnostic pruning mechanism on SGLang: the pruned regions laid out before
               encoding, cache keys, region fill and exact positions after it, usage counts
  multimodal/  the model-agnostic embedding routine and its model contract
  models/      model adapters (Qwen3-VL/-MoE, Qwen3.5/-MoE, Qwen2.5-VL, Qwen2-VL) and the
               fixed-address buffers their language models read under prefill CUDA graphs
  runtime/     CPU-only support so SGLang 0.5.23 runs without a GPU
  testing/     offline tiny-model builder, synthetic media, server launcher, CPU graph stand-in
  bench/       benchmark and accuracy tooling
sglang_compat.py is the one module that names SGLang internals; plugin.py the entry point;
launch_server.py SGLang's launcher with vLLM's pruning flags; demo.py and visualize.py the README's tools.
"""

__version__ = "0.1.0"
