# Environment for SGLang on a CPU-only machine (source it). See docs/cpu-runtime.md.
export SGLANG_USE_CPU_ENGINE=1   # CPU code paths; activates sglang-evs' CPU runtime fixes
export HF_HUB_OFFLINE=1          # nothing is downloaded at run time
export TRANSFORMERS_OFFLINE=1
export TORCHDYNAMO_DISABLE=1     # skips 10-18 s of C++ compile on the first request
export TOKENIZERS_PARALLELISM=false
