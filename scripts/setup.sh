#!/usr/bin/env bash
# Install what aicluster needs on this machine (Debian 12 / Ubuntu 22.04+, as root):
# Python's venv support and the project with its test tools in ./.venv.
# Idempotent: a second run only checks. Package indexes come from this host's own
# apt and pip configuration.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "aicluster: run this as root (the testbed needs it)" >&2
    exit 2
fi

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get -o Acquire::Retries=3 update -q >/dev/null
    timeout 900 apt-get -o Acquire::Retries=3 install -y -q --no-install-recommends "$@" >/dev/null
}

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3 python3-venv python3-pip
fi
missing=()
for tool in ssh:openssh-client git:git gcc:gcc; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
# C headers and the static C library: the STAND-IN minio's launcher (tests/e2e/standins).
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

stamp=.venv/.aicluster-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
    echo "$want" > "$stamp"
fi
# nginx's binary, unpacked beside the venv (not installed: no service starts), for the
# Ollama gateway's test (tests/unit/test_ollama_gateway_nginx.py). Debian's package has
# the binary; Ubuntu's is in nginx-core.
nginx_dir=.venv/opt/nginx
if [ ! -x "$nginx_dir/usr/sbin/nginx" ] && command -v dpkg >/dev/null; then
    tmp=$(mktemp -d)
    for package in nginx nginx-core; do
        (cd "$tmp" && timeout 300 apt-get download -q "$package" >/dev/null 2>&1) || {
            timeout 600 apt-get -o Acquire::Retries=3 update -q >/dev/null
            (cd "$tmp" && timeout 300 apt-get download -q "$package" >/dev/null 2>&1)
        } || continue
        mkdir -p "$nginx_dir" && dpkg -x "$tmp/${package}_"*.deb "$nginx_dir"
        [ -x "$nginx_dir/usr/sbin/nginx" ] && break
    done
    rm -rf "$tmp"
fi
# promtool from the distribution's prometheus package, unpacked beside the venv the same
# way (not installed: no service starts), for the monitoring alert pack's unit tests
# (tests/unit/test_monitoring_rules.py: promtool check rules / test rules). Only the
# promtool binary is kept; the server, its web assets and its service files are not.
promtool_dir=.venv/opt/prometheus
if [ ! -x "$promtool_dir/usr/bin/promtool" ] && command -v dpkg >/dev/null; then
    tmp=$(mktemp -d)
    (cd "$tmp" && timeout 300 apt-get download -q prometheus >/dev/null 2>&1) || {
        timeout 600 apt-get -o Acquire::Retries=3 update -q >/dev/null
        (cd "$tmp" && timeout 300 apt-get download -q prometheus >/dev/null 2>&1)
    } || true
    if ls "$tmp"/prometheus_*.deb >/dev/null 2>&1; then
        dpkg -x "$tmp"/prometheus_*.deb "$tmp/unpacked"
        mkdir -p "$promtool_dir/usr/bin"
        install -m 0755 "$tmp/unpacked/usr/bin/promtool" "$promtool_dir/usr/bin/promtool"
    else
        echo "aicluster: could not download prometheus (for promtool); the alert pack's" \
             "unit tests will fail until it is" >&2
    fi
    rm -rf "$tmp"
fi
echo "aicluster: installed in $(pwd)/.venv"
