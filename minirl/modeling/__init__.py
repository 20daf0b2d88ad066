"""The model: the Llama/Qwen decoder with its KV cache, the exact-mode reductions, the sampling
spec the engine and the trainer share, the tokenizer interface and a checkpoint's config.json
read into a ModelConfig (docs/model.md)."""
