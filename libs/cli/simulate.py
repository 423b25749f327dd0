"""`lpx simulate` (placeholder until the capacity-planner issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    pass
