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
echo "aicluster: installed in $(pwd)/.venv"
