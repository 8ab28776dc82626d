#!/usr/bin/env bash
# Install NIXL 1.5.1 into the framework venvs and build our NIXL backend plugin MooncakeCore there.
#
# Why in the framework venvs: NIXL's users here are vLLM's NixlConnector and SGLang's nixl
# disaggregation backend, which import nixl in their own venvs. Each venv gets the nixl build
# its processes ask for (the `nixl` meta package picks nixl-cuXX by the CUDA major it detects
# in the importing process: SGLang's torch and vLLM's cuda-bindings both say 13, so nixl-cu13;
# vLLM also keeps the nixl-cu12 of install_vllm.sh --with-nixl; all --no-deps so nothing else
# moves) and its own copy of libplugin_MooncakeCore.so, compiled with the system g++ by
# `mooncake_nixl_plugin install` beside nixl's bundled plugins (UCX stays available), once per
# nixl build in the venv. Venvs that do not exist are skipped
# (build them first with scripts/install_vllm.sh / scripts/install_sglang.sh).
#
# Idempotent: nixl is installed only when missing, the plugin is rebuilt only when its source
# changed.
#   VLLM_VENV     vLLM venv (default ~/.cache/mooncake-core/venvs/vllm)
#   SGLANG_VENV   SGLang venv (default ~/.cache/mooncake-core/venvs/sglang)
#   NIXL_VERSION  nixl version (default 1.5.1, the release the plugin's ABI was written for)
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
  "") ;;
  *) echo "install_nixl.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VER="${NIXL_VERSION:-1.5.1}"
command -v g++ >/dev/null 2>&1 || { echo "[install_nixl] g++ missing: apt-get install g++ (scripts/install.sh does)" >&2; exit 1; }

install_into() {  # venv, nixl build package, extra pip args
  local venv="$1" build="$2"; shift 2
  local vpy="$venv/bin/python"
  if [ ! -x "$vpy" ]; then
    echo "[install_nixl] $venv does not exist, skipped"
    return 0
  fi
  if ! "$vpy" - "$build" "$VER" >/dev/null 2>&1 <<'EOF2'
import sys, importlib.metadata as m
assert m.version(sys.argv[1]) == sys.argv[2] and m.version("nixl") == sys.argv[2]
EOF2
  then
    echo "[install_nixl] $venv: pip install --no-deps $build==$VER nixl==$VER"
    "$vpy" -m pip install -q --disable-pip-version-check --no-deps "$@" "$build==$VER" "nixl==$VER" 2>&1 \
      | { grep -v -e "^WARNING: Location" || true; }
  fi
  # the checkout's package, also when the venv's editable install points elsewhere
  PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" "$vpy" -m mooncake_connectors.nixl.cli install
}

shim="$(mktemp -d)"
for pair in mooncake_core:mooncake_core mooncake_connectors:connectors mooncake_proxy:proxy; do
  ln -s "$REPO/${pair#*:}" "$shim/${pair%%:*}"
done
trap 'rm -rf "$shim"' EXIT

install_into "${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/vllm}" nixl-cu13
install_into "${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-core/venvs/sglang}" nixl-cu13
echo "[install_nixl] done"
