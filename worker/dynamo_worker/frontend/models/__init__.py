"""The model registry: which models are served, by which workers (pairing prefill and decode workers
by revision), and each model's tokenizer and chat template (its preprocessor)."""
