#!/usr/bin/env bash
# Create (or update) a separate virtualenv with LMDeploy 0.18.0 (CPU torch) and this repository in it.
#
# Why a separate venv: LMDeploy pins its own torch/transformers and must not disturb the main
# development environment. The LMDeploy tests (tests/lmdeploy/) look for it at $LMDEPLOY_VENV or
# ~/.cache/mooncake-core/venvs/lmdeploy and skip with a message naming this script when it is absent
# (MOONCAKE_REQUIRE_LMDEPLOY=1 turns the skip into a failure).
#
# Why not plain `pip install lmdeploy==0.18.0`: its requirements pull CUDA torch, triton, tilelang,
# ray and the NVIDIA runtime wheels (several GB) that CPU code never touches. This recipe installs
# torch 2.13.0 for CPU (a local wheel on this machine), LMDeploy with --no-deps, and then only the
# light packages its serving and PD-disaggregation modules import (proxy, api_server routes,
# disagg backends and connection pool, the cache engine, the engine loop, the CLI, kv_connector).
# About 1.5 GB, ~2 min.
#
# Idempotent: re-running only fixes what is missing.
#   LMDEPLOY_VENV     venv location (default ${XDG_CACHE_HOME:-~/.cache}/mooncake-core/venvs/lmdeploy)
#   PYTHON            interpreter used to create the venv (default python3)
#   LMDEPLOY_VERSION  lmdeploy version (default 0.18.0; the connector targets its disagg API)
# Options:
#   -h, --help        this text
set -euo pipefail
for a in "$@"; do
  case "$a" in
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VER="${LMDEPLOY_VERSION:-0.18.0}"
. "$REPO/scripts/_venv.sh"
venv_init install_lmdeploy "${LMDEPLOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/lmdeploy}"
PIP_NODEPS_PKG=lmdeploy  # installed with --no-deps on purpose: pip's list of its missing (CUDA) requirements is noise

if ! have torch 2.13.0; then
  step "pip install torch==2.13.0 (CPU; local wheel when present)"
  pipi torch==2.13.0
fi
if ! have lmdeploy "$VER"; then
  step "pip install --no-deps lmdeploy==$VER"
  pipi --no-deps "lmdeploy==$VER"
fi

# What `import lmdeploy` and its serve/disagg/cache-engine/CLI modules import on CPU
# (checked by the import line below); torch stays pinned.
LIGHT=(numpy fastapi uvicorn "pydantic>2.0.0" mmengine-lite shortuuid pyzmq "openai>=2.45.0"
       "transformers>=4.56.0,!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,!=5.7.*,!=5.8.*,!=5.9.*"
       fire aiohttp requests prometheus-client pillow safetensors einops cloudpickle partial_json_parser
       pybase64 protobuf psutil)
step "pip install the light packages LMDeploy's serving modules import (torch pinned)"
pipi "torch==2.13.0" "${LIGHT[@]}"
# The model agent (imported by the executors) imports xgrammar; its triton requirement is GPU-only.
if ! have xgrammar 0.2.9; then
  step "pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.11"
  pipi --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.11
fi

step "installing this repo (editable, no deps) + its runtime deps"
install_repo

step "import check"
"$VPY" - <<'EOF'
import importlib
import lmdeploy.pytorch.engine  # first: lmdeploy.pytorch.disagg.conn.engine_conn imports it circularly
for m in ("lmdeploy.pytorch.disagg.conn.engine_conn", "lmdeploy.pytorch.disagg.conn.proxy_conn",
          "lmdeploy.pytorch.disagg.backend", "lmdeploy.pytorch.engine.cache_engine",
          "lmdeploy.pytorch.engine.engine_loop", "lmdeploy.pytorch.engine.executor.uni_executor",
          "lmdeploy.serve.proxy.proxy", "lmdeploy.serve.openai.endpoints.distserve",
          "lmdeploy.serve.core.async_engine", "lmdeploy.pytorch.kv_connector.mooncake.store", "lmdeploy.cli",
          "mooncake_core", "mooncake_connectors.lmdeploy"):
    importlib.import_module(m)
import lmdeploy
from mooncake_connectors.lmdeploy import backend_class
print("[install_lmdeploy] lmdeploy", lmdeploy.__version__, "OK; Mooncake ->", backend_class().__name__)
EOF
venv_done
