"""Demo data and orchestration for `lpx demo` (written for this project)."""
