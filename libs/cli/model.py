"""`lpx model fetch|list|verify`: the base-model catalogue and local bootstrap."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
model_app = typer.Typer(help="Base models: the catalogue, and fetching the local dev base (SmolLM2-135M).")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


@model_app.command("list")
def list_models() -> None:
    """The catalogue: every known base with its shapes and where its weights come from."""
    from libs.models import CATALOG
    from libs.models.bootstrap import model_path

    table = Table(title="base-model catalogue")
    for col in ("name", "architecture", "layers", "hidden", "kv dim", "mlp", "vocab", "source", "local"):
        table.add_column(col)
    for spec in CATALOG.values():
        local = model_path(spec.name)
        table.add_row(
            spec.name,
            spec.architecture,
            str(spec.num_layers),
            str(spec.hidden_size),
            str(spec.kv_dim),
            str(spec.intermediate_size),
            str(spec.vocab_size),
            spec.source,
            str(local) if local.exists() else "-",
        )
    Console().print(table)


@model_app.command()
def fetch(
    name: str = typer.Argument("smollm2-135m", help="catalogue name (see `lpx model list`)"),
    force: bool = typer.Option(False, help="convert again even if a verified copy exists"),
    smoke: bool = typer.Option(True, help="load the checkpoint and generate a few tokens as a check"),
) -> None:
    """Download, convert once and verify a base model into $LPX_HOME/models/NAME (idempotent)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from libs.models.bootstrap import ModelFetchError, smoke_generate
    from libs.models.bootstrap import fetch as do_fetch

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(f"{name}: starting", total=1.0)

        def report(stage: str, fraction: float) -> None:
            bar.update(task, completed=fraction, description=f"{name}: {stage}")

        try:
            fetched = do_fetch(name, force=force, progress=report)
        except (ModelFetchError, KeyError) as exc:
            console.print(f"[red]fetch failed:[/red] {exc}")
            raise typer.Exit(1) from None
    console.print(f"{name} at [bold]{fetched.path}[/bold] (weights sha256 {fetched.weights_sha256[:16]}...)")
    if smoke:
        with console.status("smoke test: loading with transformers and generating..."):
            answer = smoke_generate(fetched.path)
        console.print(f"smoke test answer: {answer!r}")


@model_app.command()
def verify(name: str = typer.Argument("smollm2-135m")) -> None:
    """Check a fetched model's weights against the checksum in its manifest."""
    from libs.models.bootstrap import ModelFetchError
    from libs.models.bootstrap import verify as do_verify

    try:
        fetched = do_verify(name)
    except ModelFetchError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(f"{name}: ok ({fetched.path})")


@model_app.command()
def derive(
    name: str = typer.Argument(..., help="name of the derived base (written to $LPX_HOME/models/NAME)"),
    source: str = typer.Option("smollm2-135m", "--from", help="a fetched base model"),
    seed: int = typer.Option(0, help="seed of the residual-stream permutation and the training"),
    steps: int = typer.Option(4, help="continued-training steps after the permutation"),
) -> None:
    """Derive a second base from a fetched one (a permuted residual stream plus a short continued
    training): the same shapes, but adapters of the source do not transfer. For migration drills."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from libs.models.derive import derive_base
    from libs.paths import models_dir

    src = models_dir() / source
    if not (src / "config.json").is_file():
        console.print(f"[red]{source} is not fetched:[/red] run `lpx model fetch {source}` first")
        raise typer.Exit(1)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(f"{name}: starting", total=1.0)

        def report(stage: str, fraction: float) -> None:
            bar.update(task, completed=fraction, description=f"{name}: {stage}")

        path = derive_base(src, models_dir() / name, seed=seed, steps=steps, progress=report)
    console.print(f"{name} at [bold]{path}[/bold]; register it with `lpx base register {name} {path}`")
