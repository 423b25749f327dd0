"""The eval gate: no adapter version serves before it passes validation, evaluation and parity."""
