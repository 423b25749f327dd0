#!/usr/bin/env bash
# Podman for `make compose-check` on Debian 12 (root), idempotent: the packages, and the settings these
# machines need (brief: crun fails with "cgroups in hybrid mode not supported", and containers fail with
# "setrlimit RLIMIT_NOFILE: Operation not permitted" without default_ulimits = [] and pids_limit = 0).
set -euo pipefail
missing=()
for tool in podman podman-compose mmdebstrap runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing podman podman-compose runc mmdebstrap (missing: ${missing[*]})"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman podman-compose runc mmdebstrap
fi
conf=/etc/containers/containers.conf
if ! grep -qs '^default_ulimits *= *\[\]' "$conf" || ! grep -qs '^pids_limit *= *0' "$conf" ||
    ! grep -qs '^runtime *= *"runc"' "$conf"; then
    [ -s "$conf" ] && cp "$conf" "$conf.before-loraplex"
    mkdir -p "$(dirname "$conf")"
    printf '[containers]\ndefault_ulimits = []\npids_limit = 0\n\n[engine]\nruntime = "runc"\n' >"$conf"
    echo "wrote $conf (the previous one, if any, is $conf.before-loraplex)"
fi
podman --version
