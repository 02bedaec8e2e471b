# Sourced by the install scripts: one line per step on the terminal, with its time, and
# the step's full output in a log file (the terminal gets the log's tail on a failure).
#   INSTALL_LOG=path   where the output goes (default: .venv/install.log)
#   step "what" command args...
INSTALL_LOG=${INSTALL_LOG:-${VENV:-.venv}/install.log}
mkdir -p "$(dirname "$INSTALL_LOG")"
_PROGRESS_T0=${_PROGRESS_T0:-$SECONDS}
export _PROGRESS_T0

step() {
  local what=$1 started=$SECONDS
  shift
  printf '  %-52s' "$what" >&2
  echo "=== $(date -u +%FT%TZ) $what: $*" >>"$INSTALL_LOG"
  if "$@" >>"$INSTALL_LOG" 2>&1; then
    printf '%4ds  (total %ds)\n' $((SECONDS - started)) $((SECONDS - _PROGRESS_T0)) >&2
  else
    local rc=$?
    printf 'FAILED after %ds (exit %d); the end of %s:\n' $((SECONDS - started)) "$rc" \
      "$INSTALL_LOG" >&2
    tail -n 30 "$INSTALL_LOG" >&2
    exit "$rc"
  fi
}
