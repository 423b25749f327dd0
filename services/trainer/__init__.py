"""The trainer-migration service: LoRA training jobs from stored datasets (base-model migrations are
training jobs the registry enqueues, one per adapter)."""
