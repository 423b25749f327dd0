#!/usr/bin/env bash
# compose.yaml end to end on a machine without Docker Hub or a GPU (README "Compose"; `make compose-check`):
# a Debian base image made here with mmdebstrap, every image built on it, the whole platform started from
# `compose.yaml` + `infra/compose/local.yaml` with podman-compose, then the README's own-adapter steps on the
# host against the published ports: a tenant, an adapter trained with peft, the gate's verdict, an answer
# through the gateway. Everything it started is removed at the end, also on failure.
#
# Needs (Debian 12, root): apt-get install podman podman-compose runc mmdebstrap, and in
# /etc/containers/containers.conf: [containers] default_ulimits = [] and pids_limit = 0, [engine] runtime =
# "runc" (see `preflight`); the project venv (`make venv`) and the base model (`make model`).
#
# podman-compose 1.0.3 ignores depends_on conditions, and Podman 4.3 runs healthchecks only from systemd
# timers (none in a container): `start` starts one service at a time, after its dependencies meet
# compose.yaml's conditions, running compose.yaml's healthchecks itself (`podman healthcheck run`).
#
# LPX_COMPOSE_FRESH=1 rebuilds the base image and builds every image without the layer cache (for timings).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
LPX="$ROOT/.venv/bin/lpx"
PROJECT=lpxcheck
BASE_IMAGE=localhost/loraplex-base:bookworm
INFRA=(nats postgres minio minio-init)
APP=(registry worker eval-gate trainer gateway)
HEALTH_TIMEOUT_S=${LPX_COMPOSE_HEALTH_TIMEOUT_S:-600}
COMPOSE=(podman-compose -p "$PROJECT" -f compose.yaml -f infra/compose/local.yaml)
WORK=$(mktemp -d /tmp/lpx-compose-check.XXXXXX)
STARTED=$(date +%s)

say() { printf '[compose-check %4ds] %s\n' "$(($(date +%s) - STARTED))" "$*"; }
container() { echo "${PROJECT}_$1_1"; }

teardown() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        say "FAILED (exit $rc); the last lines of each service's log:"
        for svc in "${INFRA[@]}" "${APP[@]}"; do
            podman container exists "$(container "$svc")" || continue
            echo "----- $svc ($(podman inspect -f '{{.State.Status}} exit={{.State.ExitCode}}' "$(container "$svc")"))"
            podman logs --tail 25 "$(container "$svc")" 2>&1 | cut -c1-400
        done
    fi
    say "tearing down"
    # All at once (podman-compose 1.0.3 stops one container after the other), then compose's own down.
    podman stop -t 30 $(podman ps -q --filter "label=io.podman.compose.project=$PROJECT") >/dev/null 2>&1 || true
    "${COMPOSE[@]}" down -v -t 1 >"$WORK/down.log" 2>&1 || cat "$WORK/down.log"
    podman volume rm -f "${PROJECT}_models" >/dev/null 2>&1 || true
    podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true  # podman-compose 1.0.3 leaves it
    rm -rf "$WORK"
    say "DISK free at the end: $(disk_free)"
    say "done in $(($(date +%s) - STARTED)) s (exit $rc)"
}

preflight() {
    local missing=()
    for tool in podman podman-compose mmdebstrap runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "missing: ${missing[*]} (apt-get install podman podman-compose runc mmdebstrap)" >&2
        exit 2
    fi
    # Without these Podman fails here: crun with "cgroups in hybrid mode not supported", any container
    # with "setrlimit RLIMIT_NOFILE: Operation not permitted".
    local conf=/etc/containers/containers.conf
    if ! grep -qs '^default_ulimits *= *\[\]' "$conf" || ! grep -qs '^pids_limit *= *0' "$conf" ||
        ! grep -qs '^runtime *= *"runc"' "$conf"; then
        printf '%s needs:\n[containers]\ndefault_ulimits = []\npids_limit = 0\n\n[engine]\nruntime = "runc"\n' "$conf" >&2
        exit 2
    fi
    [ -x "$PY" ] || { echo "no project venv: make venv" >&2; exit 2; }
    MODEL=$(LPX_HOME=${LPX_HOME:-$ROOT/.lpx} "$PY" -c 'from libs.models.bootstrap import verify; print(verify("smollm2-135m").path)') ||
        { echo "the base model is not fetched: make model" >&2; exit 2; }
}

base_image() {
    if [ -n "${LPX_COMPOSE_FRESH:-}" ] || ! podman image exists "$BASE_IMAGE"; then
        local t0=$SECONDS
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$WORK/rootfs.tar"
        podman import --quiet "$WORK/rootfs.tar" "$BASE_IMAGE" >/dev/null
        rm -f "$WORK/rootfs.tar"
        say "TIMING base image (mmdebstrap + podman import): $((SECONDS - t0)) s"
    else
        say "TIMING base image: reused $BASE_IMAGE (LPX_COMPOSE_FRESH=1 rebuilds it)"
    fi
}

# pip inside a build uses this machine's pip configuration: its CA bundle (an intercepting proxy's CA is
# not in the image's), indexes and local wheel directories, mounted read-only for the build only.
pip_build_mounts() {
    "$PY" - "$WORK/pip.conf" <<'PYEOF'
import os, subprocess, sys

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
settings = {}
for line in listed.stdout.splitlines():  # global.cert='...', :env:.find-links='...'
    key, _, value = line.partition("=")
    settings[key.split(".", 1)[1]] = value.strip("'")
with open(sys.argv[1], "w") as conf:
    conf.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items())))
paths = set()
for value in settings.values():
    for token in value.split():
        path = token.removeprefix("file://").rstrip("/")
        if path.startswith("/") and os.path.exists(path):
            # A file:// index (.../simple) links to its files beside it: mount its parent.
            paths.add(os.path.dirname(path) if os.path.basename(path) == "simple" else path)
print(f"-v {sys.argv[1]}:/etc/pip.conf:ro", *(f"-v {p}:{p}:ro" for p in sorted(paths)))
PYEOF
}

disk_free() { df -h --output=avail /var/lib/containers | tail -1 | tr -d ' '; }

build_images() {
    local mounts t0=$SECONDS t1 cache=()
    mounts=$(pip_build_mounts)
    [ -n "${LPX_COMPOSE_FRESH:-}" ] && cache=(--no-cache)
    say "DISK free before the builds: $(disk_free) ($(du -sh /var/lib/containers/storage 2>/dev/null | cut -f1) in podman's storage)"
    local common=(podman build --quiet --network host "${cache[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE")
    # shellcheck disable=SC2086  # $mounts is a list of -v options
    for target in nats postgres s3; do
        "${common[@]}" $mounts -f infra/compose/Dockerfile --target "$target" -t "localhost/loraplex-$target:local" . \
            >"$WORK/build-$target.log" 2>&1 || { tail -30 "$WORK/build-$target.log"; return 1; }
    done
    say "TIMING infrastructure images (nats, postgres, s3): $((SECONDS - t0)) s"
    t0=$SECONDS
    for target in "${APP[@]}"; do
        t1=$SECONDS
        # shellcheck disable=SC2086
        "${common[@]}" $mounts --build-arg ENGINE_EXTRA=cpu -f infra/docker/Dockerfile --target "$target" \
            -t "localhost/loraplex-$target:local" . >"$WORK/build-$target.log" 2>&1 ||
            { tail -30 "$WORK/build-$target.log"; return 1; }
        say "TIMING image $target: $((SECONDS - t1)) s"
    done
    say "TIMING service images (${APP[*]}): $((SECONDS - t0)) s"
    # A rebuilt image leaves its previous version untagged (dangling): gigabytes per build otherwise. Only
    # dangling images go; the layers of the images just built stay, as the next build's cache.
    podman image prune -f >/dev/null
    say "DISK free after the builds and pruning dangling images: $(disk_free)"
    podman images --format '  {{.Repository}}:{{.Tag}} {{.Size}}' | grep loraplex-
}

# compose.yaml's depends_on of one service: "dependency condition" lines.
deps_of() {
    "$PY" -c 'import sys, yaml
for dep, cond in (yaml.safe_load(open("compose.yaml"))["services"][sys.argv[1]].get("depends_on") or {}).items():
    print(dep, cond["condition"] if isinstance(cond, dict) else "service_started")' "$1"
}

wait_for() {  # wait_for SERVICE CONDITION
    local name deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    name=$(container "$1")
    case "$2" in
    service_healthy)
        until podman healthcheck run "$name" >/dev/null 2>&1; do
            [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] || { say "$1 is not running"; return 1; }
            [ $SECONDS -lt "$deadline" ] || { say "$1 not healthy after ${HEALTH_TIMEOUT_S} s"; return 1; }
            sleep 2
        done ;;
    service_completed_successfully)
        local code
        code=$(podman wait "$name")
        [ "$code" = 0 ] || { say "$1 exited with $code"; return 1; } ;;
    service_started) [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] ;;
    *) say "unknown condition $2"; return 1 ;;
    esac
}

start() {
    local t0=$SECONDS svc dep cond
    # The base model: as `lpx model fetch` made it on the host, copied into compose's `models` volume.
    podman volume create --label "io.podman.compose.project=$PROJECT" "${PROJECT}_models" >/dev/null
    # Readable by the services' user (the conversion writes the weights with mode 600).
    podman run --rm -v "${PROJECT}_models:/models" -v "$MODEL:/src:ro" "$BASE_IMAGE" \
        sh -c 'cp -r /src /models/smollm2-135m && chmod -R a+rX /models'
    for svc in "${INFRA[@]}" "${APP[@]}"; do
        while read -r dep cond; do
            [ -n "$dep" ] && wait_for "$dep" "$cond"
        done < <(deps_of "$svc")
        say "starting $svc"
        "${COMPOSE[@]}" up -d --no-build "$svc" >"$WORK/up-$svc.log" 2>&1 || { cat "$WORK/up-$svc.log"; return 1; }
    done
    for svc in registry gateway; do wait_for "$svc" service_healthy; done
    say "TIMING every healthcheck passes: $((SECONDS - t0)) s after the first container started"
    local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    until curl -fsS http://127.0.0.1:8000/readyz 2>/dev/null | grep -q '"workers":[1-9]'; do
        [ $SECONDS -lt "$deadline" ] || { say "no worker joined the gateway in ${HEALTH_TIMEOUT_S} s"; return 1; }
        [ "$(podman inspect -f '{{.State.Running}}' "$(container worker)")" = true ] || { say "the worker stopped"; return 1; }
        sleep 3
    done
    say "TIMING serving (the worker's engine is up, the gateway routes to it): $((SECONDS - t0)) s; readyz: $(curl -fsS http://127.0.0.1:8000/readyz)"
}

# The README's "Try it with your own adapter", on the host against compose's published ports.
own_adapter() {
    local t0=$SECONDS key
    export LPX_HOME="$WORK/home" LPX_REGISTRY_URL=http://127.0.0.1:8100 HF_HUB_OFFLINE=1
    "$PY" - "$MODEL" "$WORK/adapter" <<'PYEOF'
import sys
from pathlib import Path

from libs.datasets import parse_file
from libs.demo.tenants import TENANTS
from libs.lora.train import LoraRecipe, train_adapter

examples = [example.model_dump() for example in parse_file(TENANTS[0].dataset).train]  # pirate tone
train_adapter(Path(sys.argv[1]), examples, Path(sys.argv[2]), LoraRecipe(steps=12, batch_size=2, seed=3))
PYEOF
    say "adapter trained with peft on the host ($((SECONDS - t0)) s)"
    key=$("$LPX" tenant create mycorp)
    "$LPX" dataset push mycorp libs/demo/data/acme.jsonl --name support-data
    "$LPX" adapter push mycorp/support "$WORK/adapter" --base smollm2-135m --dataset support-data
    t0=$SECONDS
    "$LPX" adapter eval mycorp/support-v1
    say "TIMING the gate's verdict: $((SECONDS - t0)) s"
    t0=$SECONDS
    ANSWER=$("$PY" -c "from openai import OpenAI
print(OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='$key', timeout=300, max_retries=0)
  .chat.completions.create(model='support', max_tokens=24, temperature=0,
                           messages=[{'role': 'user', 'content': 'Where is my order?'}]).choices[0].message.content)")
    say "ANSWER through the gateway ($((SECONDS - t0)) s): $ANSWER"
    [ -n "$ANSWER" ]
}

preflight
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1 || true # what an interrupted run left
podman volume rm -f "${PROJECT}_models" >/dev/null 2>&1 || true
base_image
build_images
# NATS users' passwords, the auth callout's keys and the registry's admin token, fresh for this run
# (compose.yaml reads them from the environment; no .env is written).
set -a
# shellcheck disable=SC1090
source <("$LPX" nats secrets)
LPX_REGISTRY_ADMIN_TOKEN=$(openssl rand -hex 16 2>/dev/null || "$PY" -c 'import secrets; print(secrets.token_hex(16))')
set +a
start
own_adapter
