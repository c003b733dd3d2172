"""Model loading (embedded tiny Qwen3 or any causal LM by path / HF id) and the embedded warm start."""

from ulorl.models.loading import EMBEDDED, ModelLoadError, embedded_model_dir, load_policy, load_tokenizer

__all__ = ["EMBEDDED", "ModelLoadError", "embedded_model_dir", "load_policy", "load_tokenizer"]
