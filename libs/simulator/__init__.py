"""Discrete-event simulation of a LoRA worker cluster under routing policies (numpy needed for runs)."""
