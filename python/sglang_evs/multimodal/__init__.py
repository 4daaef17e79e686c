"""The model-agnostic multimodal embedding routine and the contract models implement for it."""
