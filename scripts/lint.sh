#!/usr/bin/env bash
# Lint and type-check the repository (what .ci/run runs; ruff and mypy come with the `lint` extra).
#   ruff check                 rules and scope in pyproject.toml [tool.ruff]
#   mypy (lenient)             mooncake_core and mooncake_proxy, as packages
#   mypy --strict              the pure modules: master state and records, scheduling, the TE wire
#                              format, the range allocator, the PD contract (mooncake_core/pd), the vLLM
#                              connectors' layout, stats, tp
# --help prints this text.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
  "") ;;
  *) echo "lint.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STRICT=(mooncake_core/store/master_state.py mooncake_core/store/master_records.py mooncake_core/store/master_absence.py
        mooncake_core/store/master_batch.py mooncake_core/store/master_tier.py mooncake_core/store/master_space.py mooncake_core/store/master_tasks.py mooncake_core/store/master_groups.py mooncake_core/store/packing.py
        mooncake_proxy/scheduling mooncake_proxy/first_token.py
        mooncake_core/transfer/wire.py mooncake_core/utils/range_allocator.py mooncake_core/auth.py mooncake_core/store/limits.py mooncake_core/store/dummy_wire.py
        mooncake_core/dashboard/window.py mooncake_core/utils/rounds.py mooncake_core/utils/progress.py
        mooncake_connectors/vllm/layout.py mooncake_connectors/vllm/kv_groups.py mooncake_core/pd mooncake_connectors/vllm/stats.py
        mooncake_connectors/vllm/tp.py mooncake_core/store/tensor_layout.py mooncake_core/transfer/ucx/lanes.py mooncake_core/transfer/ucx/plan.py mooncake_core/transfer/topology.py mooncake_core/structured/infer.py mooncake_core/store/mooncake_config.py mooncake_core/structured/refs.py mooncake_core/structured/catalog.py)
rc=0
echo "[lint] ruff check"
"$PY" -m ruff check . || rc=1
echo "[lint] mypy mooncake_core mooncake_proxy"
MYPYPATH="$PWD" "$PY" -m mypy -p mooncake_core -p mooncake_proxy || rc=1
echo "[lint] mypy --strict on the pure modules"
MYPYPATH="$PWD" "$PY" -m mypy --strict --follow-imports=silent "${STRICT[@]}" || rc=1
exit $rc
