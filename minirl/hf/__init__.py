"""Hugging Face I/O: checkpoint directories (model_files.py), their tokenizers and chat templates
(docs/your_own_model.md)."""
