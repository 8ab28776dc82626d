#!/usr/bin/env bash
# Lint and type-check the repository (what .ci/run runs; ruff and mypy come with the `lint` extra).
#   ruff check                 rules and scope in pyproject.toml [tool.ruff]
#   mypy (lenient)             mooncake_core and mooncake_proxy, as packages
#   mypy --strict              the pure modules: master state and records, scheduling, the TE wire
#                              format, the range allocator, the vLLM connectors' layout, params, stats
# The packages live under other directory names (proxy/ -> mooncake_proxy, connectors/ ->
# mooncake_connectors), which mypy cannot follow through an editable install; a temporary
# directory of symlinks gives it the import names. --help prints this text.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,9p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STRICT=(mooncake_core/store/master_state.py mooncake_core/store/master_records.py mooncake_core/store/master_absence.py
        mooncake_core/store/master_batch.py mooncake_core/store/master_tier.py mooncake_core/store/packing.py
        mooncake_proxy/scheduling mooncake_proxy/first_token.py
        mooncake_core/transfer/wire.py mooncake_core/utils/range_allocator.py mooncake_core/auth.py mooncake_core/store/limits.py
        mooncake_core/dashboard/window.py mooncake_core/utils/rounds.py mooncake_core/utils/progress.py
        mooncake_connectors/vllm/layout.py mooncake_connectors/vllm/params.py mooncake_connectors/vllm/stats.py
        mooncake_connectors/vllm/tp.py)
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
ln -s "$PWD/mooncake_core" "$shim/mooncake_core"
ln -s "$PWD/proxy" "$shim/mooncake_proxy"
ln -s "$PWD/connectors" "$shim/mooncake_connectors"
rc=0
echo "[lint] ruff check"
"$PY" -m ruff check . || rc=1
echo "[lint] mypy mooncake_core mooncake_proxy"
(cd "$shim" && MYPYPATH="$shim" "$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" -p mooncake_core -p mooncake_proxy) || rc=1
echo "[lint] mypy --strict on the pure modules"
(cd "$shim" && MYPYPATH="$shim" "$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" --strict --follow-imports=silent \
  "${STRICT[@]}") || rc=1
exit $rc
