"""`lpx dataset push|list`: tenant datasets (chat JSONL with a train and an eval split, see
libs.datasets). The file is checked here first, so a bad line is reported with its number before
anything is uploaded; the registry checks it again."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from libs.cli.registry_cmds import _call, _fail, out
from libs.datasets import DatasetInvalid, parse_file

dataset_app = typer.Typer(
    help="Tenant datasets (train + eval split) for training and the eval gate.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(dataset_app, name="dataset")


@dataset_app.command("push")
def dataset_push(
    tenant: str,
    path: Path = typer.Argument(..., help="chat-format JSONL"),
    name: str | None = typer.Option(None, "--name", help="dataset name (default: the file's stem)"),
) -> None:
    """Validate a dataset line by line and store it (content-addressed in S3, a row in the registry)."""
    if not path.is_file():
        _fail(f"{path} is not a file")
    try:
        parsed = parse_file(path)
    except DatasetInvalid as exc:
        _fail(f"{path}: {exc}")
    name = name or path.stem.replace("_", "-").replace(".", "-")
    row = _call(
        "POST", "/v1/datasets", data={"tenant": tenant, "name": name}, files={"file": (path.name, path.read_bytes())}
    )
    out.print(
        f"dataset [bold]{tenant}/{row['name']}[/bold]: {len(parsed.train)} train examples, "
        f"{len(parsed.eval)} eval cases, sha256 {row['digest'][:16]}..."
    )


@dataset_app.command("list")
def dataset_list(tenant: str) -> None:
    """A tenant's datasets."""
    table = Table("name", "train", "eval", "digest", "created")
    for row in _call("GET", f"/v1/tenants/{tenant}/datasets"):
        table.add_row(
            row["name"], str(row["train_examples"]), str(row["eval_cases"]), row["digest"][:12], row["created_at"][:19]
        )
    out.print(table)
