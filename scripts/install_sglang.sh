#!/usr/bin/env bash
# Create (or update) a separate virtualenv with SGLang 0.5.23 for CPU and this repository in it.
#
# Why a separate venv: SGLang pins its own torch/transformers versions and must not disturb the
# main development environment. The SGLang tests (tests/sglang/) look for it at $SGLANG_VENV or
# ~/.cache/mooncake-core/venvs/sglang and skip with a message naming this script when it is absent
# (MOONCAKE_REQUIRE_SGLANG=1 turns the skip into a failure).
#
# Why not plain `pip install sglang==0.5.23`: that pulls ~11 GB of CUDA kernels. This recipe
# (about 7 GB) installs SGLang without its dependency list and then only what the CPU code paths
# import (../shared/frameworks/sglang-0.5.23-cpu-requirements.txt, copied below as CPU_REQS).
#
# Idempotent: re-running only fixes what is missing.
#   SGLANG_VENV        venv location (default ${XDG_CACHE_HOME:-~/.cache}/mooncake-core/venvs/sglang)
#   PYTHON             interpreter used to create the venv (default python3)
#   SGLANG_VERSION     sglang version (default 0.5.23; the connector was checked against it)
#   SGLANG_REQS        requirements file (default: the list embedded in this script)
#   SGLANG_WITH_NIXL=1 also install NIXL (UCX, ~210 MB) for bench/frameworks/bench_sglang_handoff.py's reference
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
  "") ;;
  *) echo "install_sglang.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VER="${SGLANG_VERSION:-0.5.23}"
. "$REPO/scripts/_venv.sh"
venv_init install_sglang "${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/sglang}"
PIP_NODEPS_PKG=sglang  # installed with --no-deps on purpose: pip's list of its missing (CUDA) requirements is noise

# torch/torchvision are pinned for every later pip call so that no requirement upgrades them.
CONSTRAINTS="$VENV/mooncake-sglang-constraints.txt"
printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$CONSTRAINTS"

if ! have torch 2.14.1 || ! have torchvision 0.29.1; then
  step "pip install torch==2.14.1 torchvision==0.29.1 (local wheels when present)"
  pipi torch==2.14.1 torchvision==0.29.1
fi
if ! "$VPY" -c "import triton, sys; sys.exit(0 if triton.__version__.startswith('3.8') else 1)" >/dev/null 2>&1; then
  step "pip install triton~=3.8.0"
  pipi -c "$CONSTRAINTS" "triton~=3.8.0"
fi
if ! have sglang "$VER"; then
  step "pip install --no-deps sglang==$VER"
  pipi --no-deps "sglang==$VER"
fi

REQS="${SGLANG_REQS:-$VENV/mooncake-sglang-cpu-requirements.txt}"
if [ -z "${SGLANG_REQS:-}" ]; then
  cat > "$REQS" <<'EOF'
numpy
pyzmq
aiohttp
requests
msgspec
prometheus-client>=0.20.0
psutil
fastapi
uvicorn>=0.51
pydantic
orjson
pybase64
setproctitle
uvloop
packaging
tqdm
transformers==5.19.0
tokenizers==0.23.2
regex
python-multipart
xxhash
zstandard
distro
einops
scipy
pillow
IPython
interegular
partial_json_parser
openai==2.8.0
anthropic>=0.20.0
blobfile==3.0.0
gguf
sentencepiece==0.2.1
tiktoken
watchfiles
python-dateutil<3
nvidia-ml-py
cuda-python>=13.0
openai-harmony==0.0.4
llguidance>=1.7.6,<2.0.0
xgrammar==0.2.7
mistral_common>=1.11.5
compressed-tensors==0.18.0
numba==0.65.1
dill
EOF
fi
STAMP="$VENV/.mooncake-sglang-reqs.sha"
SUM="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$SUM" ]; then
  step "pip install -r $(basename "$REQS") (torch pinned)"
  pipi -c "$CONSTRAINTS" -r "$REQS"
  echo "$SUM" > "$STAMP"
fi
if ! have sglang-router 0.3.2; then
  step "pip install sglang-router==0.3.2"
  pipi -c "$CONSTRAINTS" "sglang-router==0.3.2"
fi

if [ "${SGLANG_WITH_NIXL:-0}" = "1" ] && ! "$VPY" -c "import nixl._api" >/dev/null 2>&1; then
  # the `nixl` meta package would pull the CUDA 12 build; torch here is the CUDA 13 build
  step "pip install nixl-cu13 + nixl (--no-deps)"
  pipi -c "$CONSTRAINTS" nixl-cu13==1.5.1
  pipi --no-deps nixl==1.5.1
fi

step "installing this repo (editable, no deps) + its runtime deps"
install_repo -c "$CONSTRAINTS"

step "import check"
"$VPY" -W ignore - <<'EOF'
import importlib.metadata as m
import sglang, mooncake_core, mooncake_connectors.sglang  # noqa: F401
import sglang.srt.disaggregation.mooncake.conn  # noqa: F401  (imports without a GPU)
eps = [e.name for e in m.entry_points(group="sglang.srt.plugins")]
print("[install_sglang] sglang", m.version("sglang"), "torch", m.version("torch"), "plugins", eps, "OK")
EOF
venv_done
