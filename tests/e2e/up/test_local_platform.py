"""The local platform as a new user meets it, from the command line only (issue: `lpx up`):
`lpx demo` (which runs on `lpx up` and leaves it running), then the README's "Try it with your own
adapter" block run as written inside the checkout with no environment set: `lpx tenant create`,
`lpx dataset push`, `lpx adapter push` of an adapter trained outside loraplex with peft, `lpx adapter
eval`, and a call through the gateway with the official openai client, answered by that adapter; a
fleet started beside it. Then `kill -9` of a service: back within seconds, `lpx ps` counts the restart,
and the platform answers again. `lpx down` leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.demo.tenants import TENANTS
from tests.e2e.up.readme import shell_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
LPX = [sys.executable, "-m", "libs.cli.main"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder laid out like a checkout after `make demo` (a Makefile beside `.lpx`): the README's
    commands run inside it with no environment set find the platform there."""
    folder = tmp_path_factory.mktemp("checkout")
    (folder / "Makefile").write_text("# stands for loraplex's Makefile: a checkout's .lpx is found beside it\n")
    return folder


@pytest.fixture(scope="module")
def home(checkout: Path, base_model_path: Path):
    """A fresh state directory, the checkout's `.lpx`, sharing only the fetched base model (the stack,
    the platform, the registry's data are its own)."""
    home = checkout / ".lpx"
    (home / "models").mkdir(parents=True)
    (home / "models" / base_model_path.name).symlink_to(base_model_path)
    yield home
    # --purge: as root the stack's PostgreSQL data lives under /var/tmp, outside this temp dir.
    subprocess.run([*LPX, "down", "--purge"], env=_env(home), capture_output=True, timeout=300)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LPX_")}
    return {**env, "LPX_HOME": str(home), "HF_HUB_OFFLINE": "1", "LPX_UP_WORKERS": "1"}


def lpx(home: Path, *args: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**_env(home), **(env or {})}
    done = subprocess.run([*LPX, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"lpx {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def platform_rows(home: Path, monkeypatch) -> dict:
    from libs.up.platform import LocalPlatform

    monkeypatch.setenv("LPX_HOME", str(home))
    return {row.name: row for row in LocalPlatform(stack=object()).ps()}


@pytest.fixture(scope="module")
def demo(home):
    done = lpx(home, "demo", timeout=1500)
    return done.stdout + done.stderr


def test_demo_runs_on_the_local_platform_and_leaves_it_running(demo, home):
    assert "The platform keeps running" in demo
    for tenant in TENANTS:
        assert tenant.name in demo
    # The fleet as `lpx top` draws it, sampled while the batch was in flight: the worker in its pool.
    assert "the fleet during that batch" in demo and "no fleet view" not in demo
    frame = demo.split("the fleet during that batch", 1)[1]
    assert "gpu slots" in frame and "up-smollm2-135m-r16-1" in frame and "hottest adapters" in frame
    assert any(f"{t.name}/{t.adapter} v" in frame for t in TENANTS), frame  # named by the registry
    ps = lpx(home, "ps").stdout
    for service in ("registry", "trainer", "eval-gate-smollm2-135m", "worker-smollm2-135m-r16-1", "gateway"):
        assert service in ps
    assert "crash-looping" not in ps
    assert tracebacks(home) == {}, "a normal `lpx demo` logged a traceback"


def service_logs(home: Path) -> dict[str, str]:
    return {log.name: log.read_text(errors="replace") for log in sorted((home / "up" / "logs").glob("*.log"))}


def tracebacks(home: Path, since: dict[str, str] | None = None) -> dict[str, str]:
    """Each service log holding a traceback (only what was written after `since`), with the lines around it."""
    found = {}
    for name, text in service_logs(home).items():
        text = text[len((since or {}).get(name, "")) :]
        if "Traceback (most recent call last)" in text:
            at = text.index("Traceback (most recent call last)")
            found[name] = text[max(0, at - 300) : at + 1500]
    return found


def test_a_second_lpx_up_reports_what_is_already_running(demo, home):
    # Sized so that no worker would fit a fresh start: the running platform's memory is not counted again
    # (CI once refused this second `lpx up`, "1 worker needs 10 GiB, 9.9 GiB available", with it running).
    done = lpx(home, "up", env={"LPX_UP_WORKER_MEMORY_GIB": "100000"})
    assert "registry: already running" in done.stderr
    assert "gateway: already running" in done.stderr


def test_lpx_top_on_the_local_platform_names_adapters_and_reads_the_gateways_metrics(demo, home):
    """With nothing set beyond LPX_HOME: `lpx top` finds the registry (names) and the gateway's metrics
    (per-status rates) in the file `lpx up` wrote; the metrics URL is a loopback one."""
    import httpx

    env_file = (home / "up" / "platform.env").read_text()
    metrics_url = json.loads(env_file.split("LPX_TOP_METRICS=", 1)[1].splitlines()[0])[0]
    assert metrics_url.startswith("http://127.0.0.1:")
    assert "lpx_gateway_requests_total{" in httpx.get(metrics_url, timeout=10).text  # the demo's requests
    snap = json.loads(lpx(home, "top", "--once", "--json", "--window", "0.5").stdout)
    assert not [note for note in snap["notes"] if note.startswith(("metrics", "adapter names"))], snap["notes"]
    names = {a["name"] for a in snap["adapters"]}
    assert any(f"{t.name}/{t.adapter} v1" in names for t in TENANTS), names


@pytest.fixture(scope="module")
def own_adapter(demo, home, checkout, base_model_path: Path, tmp_path_factory) -> tuple[str, str]:
    """The README's "Try it with your own adapter" block, run as written by bash inside the checkout with
    no LPX_ variable set (the CLI finds the checkout's .lpx), `lpx` and `python` from the venv on PATH as
    after `source .venv/bin/activate`. Only its placeholders are filled in: the dataset, an adapter
    trained with peft outside loraplex's trainer, the gateway's port and the key the first line printed.
    Returns (API key, adapter digest)."""
    from libs.datasets import parse_file
    from libs.lora.train import LoraRecipe, train_adapter

    dataset = TENANTS[0].dataset  # pirate tone: train examples + eval cases
    examples = [example.model_dump() for example in parse_file(dataset).train]
    out = tmp_path_factory.mktemp("mycorp-adapter") / "adapter"
    adapter_dir, _losses = train_adapter(base_model_path, examples, out, LoraRecipe(steps=12, batch_size=2, seed=3))
    first, rest = shell_block("### Try it with your own adapter").split("\n", 1)
    assert first.startswith("lpx tenant create mycorp")
    key = as_a_user(checkout, first).stdout.strip()
    assert key.startswith("lpx_mycorp_") and "\n" not in key
    port = platform_env(home)["LPX_GATEWAY_URL"].rsplit(":", 1)[1]
    filled = {"./support.jsonl": str(dataset), "./my-adapter": str(adapter_dir), "<gateway port>": port, "<key>": key}
    for placeholder, value in filled.items():
        assert placeholder in rest, f"the README's block no longer has {placeholder}"
        rest = rest.replace(placeholder, value)
    done = as_a_user(checkout, rest)
    assert "registered mycorp/support-v1" in done.stdout
    assert "active" in (done.stdout + done.stderr).lower()
    assert done.stdout.strip().splitlines()[-1].strip(), "the openai client printed no answer"
    return key, serving_digest(home, "mycorp", "support")


def as_a_user(checkout: Path, script: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    """bash -e in the checkout, no LPX_ variable set, the venv's commands first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LPX_")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{script}\nfailed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def platform_env(home: Path) -> dict[str, str]:
    lines = (home / "up" / "platform.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def serving_digest(home: Path, tenant: str, alias: str) -> str:
    """What the registry serves for the alias, read with the admin token `lpx up` wrote."""
    import httpx

    env = platform_env(home)
    auth = {"Authorization": f"Bearer {env['LPX_REGISTRY_ADMIN_TOKEN']}"}
    row = httpx.get(f"{env['LPX_REGISTRY_URL']}/v1/tenants/{tenant}/aliases/{alias}", headers=auth, timeout=10)
    row.raise_for_status()
    assert row.json()["status"] == "active"
    return row.json()["digest"]


def ask(home: Path, key: str) -> tuple[str, str | None]:
    from openai import OpenAI

    url = platform_env(home)["LPX_GATEWAY_URL"]
    client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=300, max_retries=0)
    reply = client.chat.completions.create(
        model="support", max_tokens=24, temperature=0, messages=[{"role": "user", "content": "Where is my order?"}]
    )
    return reply.choices[0].message.content, reply.system_fingerprint


def test_own_peft_adapter_is_pushed_gated_and_answers_through_the_openai_client(own_adapter, home):
    key, digest = own_adapter
    text, applied = ask(home, key)
    assert applied == digest  # the worker applied exactly the version the registry activated
    assert "ahoy" in text.lower() or "matey" in text.lower() or "arr" in text.lower(), text


def test_a_fleet_starts_beside_the_platform_as_the_readme_says(demo, checkout):
    """`lpx fleet up` on the platform `lpx up` started, from the checkout with no environment set: it waits
    for its own pool's simulated workers (the platform's vLLM worker is live too, in its own pool)."""
    said = as_a_user(checkout, "lpx fleet up --gateways 1 --workers 2 && lpx fleet status", timeout=600).stdout
    try:
        assert "fleet up: gateways http://127.0.0.1:" in said
        assert said.count("running") >= 3, said
    finally:
        as_a_user(checkout, "lpx fleet down", timeout=300)


@pytest.mark.parametrize("service", ["gateway", "registry", "worker-smollm2-135m-r16-1"])
def test_a_killed_service_is_back_within_seconds_and_the_restart_is_counted(service, own_adapter, home, monkeypatch):
    before = platform_rows(home, monkeypatch)[service]
    assert before.state == "running" and before.pid
    os.kill(before.pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = platform_rows(home, monkeypatch)[service]
        if now.state == "running" and now.pid not in (None, before.pid):
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"{service} not back within 15 s")
    assert now.restarts == before.restarts + 1
    key, digest = own_adapter
    deadline = time.monotonic() + 300  # a worker reloads its engine
    while True:
        try:
            assert ask(home, key)[1] == digest
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def test_down_stops_every_process_it_started(own_adapter, home, monkeypatch):
    rows = platform_rows(home, monkeypatch)
    pids = [row.pid for row in rows.values() if row.pid]
    stack_pids = json.loads((home / "stack" / "stack.json").read_text()).get("pids", {})
    before = service_logs(home)
    lpx(home, "down", timeout=300)
    assert tracebacks(home, since=before) == {}, "a graceful `lpx down` logged a traceback"
    from libs.stack.launcher import process_alive

    assert not any(process_alive(pid) for pid in pids + list(stack_pids.values()))
    assert not (home / "up" / "supervisor.sock").exists()
