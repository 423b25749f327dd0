"""`lpx adapter eval|report`: ask the eval gate to (re-)evaluate a version, and read its report.

ALIAS is `name-vN` for one version or `name` for the adapter's latest version.
"""

from __future__ import annotations

import re
import time

import typer
from rich.table import Table

from libs.cli.registry_cmds import _call, _fail, _split, adapter_app, err, out

DECIDED = ("active", "rejected", "retired")


def register(app: typer.Typer) -> None:
    """The commands attach to `lpx adapter` (registry_cmds.adapter_app) when this module is imported."""


def _version(tenant: str, alias: str) -> tuple[str, dict]:
    """(adapter name, version row) for `name-vN` or `name` (its latest version)."""
    pinned = re.fullmatch(r"(.+)-v(\d+)", alias)
    name = pinned.group(1) if pinned else alias
    history = _call("GET", f"/v1/tenants/{tenant}/adapters/{name}/versions")
    if not history:
        _fail(f"{tenant}/{name} has no versions")
    if not pinned:
        return name, history[-1]
    number = int(pinned.group(2))
    for row in history:
        if row["number"] == number:
            return name, row
    _fail(f"{tenant}/{name} has no version {number}")


@adapter_app.command("eval")
def adapter_eval(
    ref: str = typer.Argument(..., metavar="TENANT/ALIAS"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait for the verdict and print the report"),
    timeout_s: float = typer.Option(1800, "--timeout", help="seconds to wait for the verdict"),
    by: str = typer.Option("lpx-cli", "--by", help="who asks (recorded)"),
) -> None:
    """Run (or re-run) the eval gate on a pending, evaluating or rejected version."""
    tenant, alias = _split(ref, "alias")
    name, version = _version(tenant, alias)
    number = version["number"]
    _call("POST", f"/v1/tenants/{tenant}/adapters/{name}/versions/{number}/evaluate", json={"requested_by": by})
    err.print(f"evaluation of {tenant}/{name}-v{number} requested")
    if not wait:
        return
    row = _wait_for_verdict(tenant, name, number, timeout_s)
    _print_report(row)
    if row["status"] != "active":
        raise typer.Exit(1)


def _wait_for_verdict(tenant: str, name: str, number: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    with err.status(f"waiting for the eval gate on {tenant}/{name}-v{number}...") as status:
        while time.monotonic() < deadline:
            row = _version(tenant, f"{name}-v{number}")[1]
            if row["status"] in DECIDED:
                return row
            status.update(f"{tenant}/{name}-v{number} is {row['status']}...")
            time.sleep(1.0)
    _fail(
        f"no verdict for {tenant}/{name}-v{number} within {timeout_s:.0f}s (is an eval gate running for "
        f"base {row['base_model']}?)"
    )


@adapter_app.command("report")
def adapter_report(
    ref: str = typer.Argument(..., metavar="TENANT/ALIAS"),
    as_json: bool = typer.Option(False, "--json", help="the raw report"),
) -> None:
    """The eval gate's report for a version: verdict, every check, each case, parity, versions."""
    tenant, alias = _split(ref, "alias")
    row = _version(tenant, alias)[1]
    if as_json:
        out.print_json(data=row["eval_report"])
        return
    _print_report(row)


def _print_report(row: dict) -> None:
    report = row.get("eval_report")
    head = f"{row['tenant']}/{row['alias']} (sha256 {row['digest'][:12]}, base {row['base_model']}): {row['status']}"
    out.print(f"[bold]{head}[/bold] - {row['status_reason']}", highlight=False)
    if not report:
        out.print("no evaluation report (yet)")
        return
    checks = Table("check", "status", "seconds", "detail", title="checks")
    for c in report["checks"]:
        colour = {"passed": "green", "failed": "red"}.get(c["status"], "dim")
        checks.add_row(c["name"], f"[{colour}]{c['status']}[/{colour}]", f"{c['seconds']:.2f}", c["detail"])
    out.print(checks)
    _print_cases(report)
    if report.get("parity"):
        parity = Table("prompt", "agreement", "vLLM", "transformers+peft", title="parity (greedy)")
        for p in report["parity"]:
            parity.add_row(p["prompt"], f"{p['agreement']:.2f}", p["engine"], p["reference"])
        out.print(parity)
    versions = ", ".join(f"{k} {v}" for k, v in report.get("versions", {}).items())
    out.print(
        f"threshold {report['threshold']:.2f}, regression margin {report['regression_margin']:.2f}, "
        f"{report['seconds']:.1f}s, attempt {report.get('gate', {}).get('attempt', '?')}; {versions}",
        highlight=False,
    )


def _print_cases(report: dict) -> None:
    candidate, baseline = report.get("candidate"), report.get("baseline")
    if not candidate:
        return
    base_cases = {c["id"]: c for c in (baseline or {}).get("cases", [])}
    title = f"eval cases: {candidate['passed']}/{candidate['total']} passed"
    if baseline:
        title += f" (active v{baseline['version']}: {baseline['passed']}/{baseline['total']})"
    base_model, lift = report.get("base"), report.get("lift")
    alone = {c["id"]: c for c in (base_model or {}).get("cases", [])}
    if base_model and lift:
        title += (f"; the base model alone: {base_model['passed']}/{base_model['total']}, "
                  f"lift {lift['pass_rate']:+.2f}")  # fmt: skip
    prompted, prompted_lift = report.get("base_prompted"), report.get("lift_prompted")
    with_prompt = {c["id"]: c for c in (prompted or {}).get("cases", [])}
    if prompted and prompted_lift:
        title += (f"; with the tenant's system prompt: {prompted['passed']}/{prompted['total']}, "
                  f"lift {prompted_lift['pass_rate']:+.2f}")  # fmt: skip
    if lift and lift.get("min_lift") is not None:
        title += f" (minimum lift {lift['min_lift']:+.2f})"
    cases = Table("case", "criterion", "result", "score", "answer / expected", title=title)
    for c in candidate["cases"]:
        mark = "[green]pass[/green]" if c["passed"] else "[red]fail[/red]"
        was = base_cases.get(c["id"])
        if was is not None:
            mark += f" (was {'pass' if was['passed'] else 'fail'})"
        if c["id"] in alone:
            mark += f" (base alone: {'pass' if alone[c['id']]['passed'] else 'fail'})"
        if c["id"] in with_prompt:
            mark += f" (base + system prompt: {'pass' if with_prompt[c['id']]['passed'] else 'fail'})"
        score = f"{c['score']:.3f} >= {c['threshold']:.2f}" if c.get("score") is not None else ""
        detail = c["answer"][:80] + (f"  [dim]expected {c['expected']!r}[/dim]" if c.get("expected") else "")
        cases.add_row(c["id"], c["criterion"], mark, score, detail)
    out.print(cases)
