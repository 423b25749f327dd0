"""`lpx up|ps|logs|restart|down`: the whole platform as supervised local processes (see libs/up)."""

from __future__ import annotations

import signal
import sys
import time

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
# Piped output (CI logs, tests) gets a wide console so the URLs and commands stay on one line.
out = Console(width=None if sys.stdout.isatty() else 160)


def register(app: typer.Typer) -> None:
    for command in (up, ps, logs, restart, down):
        app.command()(command)


def _platform():
    from libs.up.platform import LocalPlatform

    return LocalPlatform()


def _fail(exc: Exception) -> None:
    console.print(f"[red]{exc}[/red]")
    raise typer.Exit(1)


def _raise_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def up(
    workers: int = typer.Option(
        None, "--workers", min=1, help="workers per pool (default: what fits this machine's cores and memory)"
    ),
) -> None:
    """Start the local platform: the stack, then the registry, an eval gate per fetched base model, the
    trainer, the workers and the gateway, each supervised (restarted when it exits) with its own log.

    Idempotent: a second `lpx up` starts what is not running and reports the rest. State, logs and the
    admin token live in $LPX_HOME/up; ports are chosen once and kept (LPX_UP_GATEWAY_PORT and
    LPX_UP_REGISTRY_PORT pin them)."""
    from libs.up.platform import PlanError, UpError

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)
    platform = _platform()
    try:
        with console.status("starting the local platform (a vLLM worker loads in about a minute)..."):
            ends = platform.up(workers, on_event=lambda msg: console.log(msg))
    except (PlanError, UpError) as exc:
        _fail(exc)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: `lpx ps` shows what runs, `lpx down` stops it")
        raise typer.Exit(130) from None
    print_ps(platform.ps())
    out.print(
        f"\n[bold green]loraplex is up.[/bold green]\n"
        f"  gateway (OpenAI API):  {ends.gateway_url}/v1\n"
        f"  registry (admin API):  {ends.registry_url}\n"
        f"  gateway metrics:       {ends.gateway_metrics_url or '-'}  (lpx top reads it)\n"
        f"  admin token:           {ends.admin_token_file}  (the CLI reads it from {ends.env_file})\n"
        f"  logs:                  {ends.logs}  (lpx logs SERVICE -f)\n\n"
        "Next:\n"
        "  lpx tenant create acme                                        # prints the tenant's API key\n"
        "  lpx adapter push acme/support ./my-peft-adapter --base smollm2-135m   # eval-gated, then serves\n"
        f"  curl {ends.gateway_url}/v1/chat/completions -H 'Authorization: Bearer <key>' \\\n"
        '       -d \'{"model": "support", "messages": [{"role": "user", "content": "hi"}]}\'\n'
        "Stop with `lpx down` (services drain first); `lpx ps` shows each service."
    )


def ps() -> None:
    """Each service: pid, state, restarts, port, health, uptime. Exit code 1 unless all are healthy."""
    rows = _platform().ps()
    if not rows:
        console.print("the platform is not running: `lpx up`")
        raise typer.Exit(1)
    if not print_ps(rows):
        raise typer.Exit(1)


def print_ps(rows) -> bool:
    table = Table(title="loraplex local platform")
    for col in ("service", "pid", "state", "restarts", "port", "health", "uptime"):
        table.add_column(col)
    colours = {"running": "green", "starting": "yellow", "crash-looping": "red"}
    for row in rows:
        colour = colours.get(row.state, "red")
        uptime = _duration(row.uptime_s) if row.uptime_s is not None else "-"
        health = {"ok": "[green]ok[/green]", "failing": "[red]failing[/red]"}.get(row.health, "-")
        table.add_row(
            row.name,
            str(row.pid or "-"),
            f"[{colour}]{row.state}[/{colour}]",
            str(row.restarts),
            str(row.port or "-"),
            health,
            uptime,
        )
    out.print(table)
    for row in rows:
        if row.last_lines:
            out.print(f"[red]{row.name} is crash-looping[/red]; its last log lines:")
            for line in row.last_lines:
                out.print(f"  {line}", markup=False, highlight=False)
    return all(row.state == "running" and row.health == "ok" for row in rows)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def logs(
    service: str = typer.Argument(..., help="a service name from `lpx ps` (e.g. gateway, registry, worker-...)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines (Ctrl-C stops)"),
    lines: int = typer.Option(50, "--lines", "-n", min=0, help="how many of the last lines to print first"),
) -> None:
    """Print a service's log (supervisord keeps one file per service, rotated at 20 MB)."""
    from libs.up.platform import UpError

    try:
        path = _platform().log_file(service)
    except UpError as exc:
        _fail(exc)
    if not path.exists():
        _fail(UpError(f"{service} has no log yet ({path})"))
    with path.open(errors="replace") as log:
        for line in log.readlines()[-lines:] if lines else []:
            out.print(line.rstrip("\n"), markup=False, highlight=False)
        while follow:
            line = log.readline()
            if line:
                out.print(line.rstrip("\n"), markup=False, highlight=False)
            else:
                time.sleep(0.3)


def restart(service: str = typer.Argument(..., help="a service name, or a prefix: `worker` restarts every worker")):
    """Restart a service (SIGTERM, drain, start again)."""
    from libs.up.platform import UpError

    try:
        _platform().restart(service, on_event=lambda msg: console.log(msg))
    except UpError as exc:
        _fail(exc)


def down(
    purge: bool = typer.Option(False, "--purge", help="also delete the stack's data, the admin token and the state"),
) -> None:
    """Stop the platform: every service gets SIGTERM and time to drain (workers finish what they run),
    then the stack stops. Data stays unless --purge."""
    _platform().down(purge=purge, on_event=lambda msg: console.log(msg))
