"""Built-in models: the tiny character-level Llama used by the demo and the tests."""

from toprcli.models.tiny import TINY_PRESETS, build_tiny_model, build_tokenizer, count_parameters

__all__ = ["TINY_PRESETS", "build_tiny_model", "build_tokenizer", "count_parameters"]
