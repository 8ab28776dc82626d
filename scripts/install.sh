#!/usr/bin/env bash
# Install everything this project needs on a fresh Debian machine (idempotent):
# system services used by the tests (etcd, Redis; Chromium + chromedriver for the dashboard tests;
# Prometheus' promtool for the alert rules)
# and the Python package with its extras.
#   --with-frameworks   also build the framework venvs the connector tests use (outside the repo):
#                       SGLang (scripts/install_sglang.sh, ~3 min, ~7 GB), vLLM for CPU
#                       (scripts/install_vllm.sh, ~2 min, ~3.5 GB), LMCache into the vLLM venv
#                       (scripts/install_lmcache.sh, ~1 min, ~1.9 GB), LMDeploy with CPU torch
#                       (scripts/install_lmdeploy.sh, ~2 min, ~1.7 GB), then NIXL in the SGLang and
#                       vLLM venvs with our NIXL plugin built there (scripts/install_nixl.sh).
#                       Without them those tests skip.
set -euo pipefail
with_fw=0
for arg in "$@"; do
  case "$arg" in
    --with-frameworks) with_fw=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server etcd-client)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)  # promtool: tests/deploy (alert rules)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # self-signed certificates of tests/security
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium chromium-driver)  # tests/dashboard
[ "$with_fw" = 1 ] && ! command -v g++ >/dev/null 2>&1 && need_apt+=(g++)  # builds the NIXL plugin
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "[install] apt-get install ${need_apt[*]}"
  t=$SECONDS
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  echo "[install]   (apt-get: $((SECONDS - t)) s)"
fi

PY=${PYTHON:-python3}
echo "[install] pip install -e .[test,torch,plot,fast,lint]"
t=$SECONDS
$PY -m pip install -q --disable-pip-version-check -e ".[test,torch,plot,fast,lint]"
echo "[install]   (pip: $((SECONDS - t)) s)"
if [ "$with_fw" = 1 ]; then
  # lmcache goes into the vLLM venv (after vllm); nixl last: it installs into the sglang and vllm venvs
  for fw in sglang vllm lmcache lmdeploy nixl; do
    if [ -f "scripts/install_${fw}.sh" ]; then
      t=$(date +%s)
      bash "scripts/install_${fw}.sh"
      echo "[install] ${fw} venv ready in $(( $(date +%s) - t ))s"
    fi
  done
fi
echo "[install] done"
