# Shared by scripts/install_{vllm,lmcache,lmdeploy,sglang}.sh (sourced, not run): the framework
# venv, pip with the machine's noise filtered, version checks, and step lines with their timing.
#
#   venv_init TAG VENV [create|require]   sets TAG, VENV, VPY, LOCK; creates the venv (create, with
#                                         $PYTHON or python3) or fails naming install_vllm.sh (require)
#   step "what"                           '[TAG] what' (and how long the step before took)
#   pipi ARGS...                          pip install -q under `flock $LOCK` (venvs are shared by
#                                         several checkouts); PIP_NODEPS_PKG=<pkg> also hides pip's
#                                         list of that --no-deps package's missing requirements
#   locked CMD...                         CMD under the same lock (pip uninstall)
#   have PKG VERSION                      the venv has PKG at VERSION (a local +suffix ignored)
#   repo_deps [EXTRA...]                  this repo's runtime requirements, one per line, read from
#                                         pyproject.toml (dependencies + the named extras): the
#                                         framework venvs install the repo with --no-deps, and a
#                                         hand-kept list once lacked pluggy
#   install_repo [PIP ARGS...]            pip installs repo_deps all (with ARGS: constraints, extra
#                                         packages), then this repo editable with --no-deps
#   venv_done                             the last step's time, the total and the venv size
# shellcheck shell=bash

venv_init() {
  TAG="$1"; VENV="$2"
  VPY="$VENV/bin/python"
  LOCK="$(dirname "$VENV")/.$(basename "$VENV").lock"  # /work/venvs/.vllm.lock for a shared venv
  _venv_t0=$SECONDS; _step_t0=""; _step_what=""
  mkdir -p "$(dirname "$VENV")"
  if [ ! -x "$VPY" ]; then
    if [ "${3:-create}" = require ]; then
      echo "[$TAG] $VENV has no python: run scripts/install_vllm.sh first" >&2
      exit 1
    fi
    step "creating venv $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
}

_step_end() {
  if [ -n "$_step_t0" ]; then
    echo "[$TAG]   ($_step_what: $((SECONDS - _step_t0)) s)"
  fi
}

step() {
  _step_end
  _step_what="$1"; _step_t0=$SECONDS
  echo "[$TAG] $1"
}

locked() { flock "$LOCK" "$@"; }

# The machine's pip config lists local indexes that lack most packages; hide pip's noise about them.
# A package installed with --no-deps on purpose makes pip's resolver list its (CUDA) requirements as
# missing after every later install; that list is expected and hidden as well.
pipi() {
  local pat=(-e "^WARNING: Location")
  if [ -n "${PIP_NODEPS_PKG:-}" ]; then
    pat+=(-e "^$PIP_NODEPS_PKG [0-9.]* requires " -e "^ERROR: pip's dependency resolver does not currently"
          -e "^This behaviour is the source of the following")
  fi
  locked "$VPY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "${pat[@]}" || true; }
}

have() {
  "$VPY" - "$1" "$2" >/dev/null 2>&1 <<'EOF'
import sys, importlib.metadata as m
assert m.version(sys.argv[1]).split("+")[0] == sys.argv[2]
EOF
}

repo_deps() {
  "$VPY" - "$REPO/pyproject.toml" "$@" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project.get("optional-dependencies", {})
seen, out, todo = set(), list(project["dependencies"]), list(sys.argv[2:])
while todo:
    name = todo.pop()
    if name in seen:
        continue
    if name not in extras:
        sys.exit(f"repo_deps: pyproject.toml has no extra {name!r} (it has {', '.join(sorted(extras))})")
    seen.add(name)
    for spec in extras[name]:
        self_ref = re.fullmatch(re.escape(project["name"]) + r"\[([^]]*)\]", spec.strip())
        if self_ref:  # "mooncake-core[etcd,redis]": follow the extras it names
            todo.extend(e.strip() for e in self_ref.group(1).split(","))
        else:
            out.append(spec)
print("\n".join(dict.fromkeys(out)))
EOF
}

install_repo() {
  local deps_txt deps
  deps_txt="$(repo_deps all)"  # its own line: a failing repo_deps stops the script (set -e)
  mapfile -t deps <<<"$deps_txt"
  pipi "$@" "${deps[@]}"
  pipi --no-deps -e "$REPO"
}

venv_done() {
  _step_end
  _step_t0=""
  echo "[$TAG] done in $((SECONDS - _venv_t0)) s; venv size $(du -sh "$VENV" | cut -f1)"
}
