"""SGLang multimodal processors of sglang-evs (tokenizer-process side)."""
