#!/usr/bin/env bash
# Install everything this project needs on a fresh Debian machine (idempotent):
# system services used by the tests (etcd, Redis) and the Python package with its extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server etcd-client)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "[install] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
echo "[install] pip install -e .[test,torch,plot,fast]"
$PY -m pip install -q --disable-pip-version-check -e ".[test,torch,plot,fast]"
echo "[install] done"
