#!/usr/bin/env bash
# Slurm prolog (slurm.conf: Prolog=/path/to/prolog.sh): runs as root on each
# host of a job before the job starts. For jobs that asked for fpga boards it
# programs every board with the site's base bitstream, so each job starts
# from a known state whatever the previous job left on the fabric; corefarm's
# node managers then load the job's own configurations at run time.
#
# Settings come from prolog.conf beside this script (or the file named by
# COREFARM_PROLOG_CONF), a shell fragment:
#   BOARDS=2                                # boards on this host
#   BASE_BITSTREAM=/lib/firmware/base.rbf   # what every job starts from
#   PROGRAMMER='fpga-program --board {board} {bitstream}'
# `{board}` becomes 0..BOARDS-1 and `{bitstream}` the base bitstream path.
# A non-zero exit drains the host (Slurm's prolog semantics): a board that
# cannot be programmed must not run jobs.
set -euo pipefail
conf="${COREFARM_PROLOG_CONF:-$(dirname "$(readlink -f "$0")")/prolog.conf}"
log() { logger -t corefarm-prolog -- "$*" 2>/dev/null || true; printf 'corefarm-prolog: %s\n' "$*" >&2; }

# Jobs that did not ask for boards leave them alone. Slurm gives a prolog
# no variable with the job's generic resources (but for GPUs): ask the
# controller once.
request=$(scontrol show job -o "${SLURM_JOB_ID:?not run as a Slurm prolog}" 2>/dev/null |
    grep -oE '(TresPerNode|TresPerJob|Gres)=[^ ]*fpga[^ ]*' || true)
[[ -n "$request" ]] || exit 0
[[ -r "$conf" ]] || { log "no $conf: nothing to program"; exit 0; }
BOARDS=0 BASE_BITSTREAM="" PROGRAMMER=""
# shellcheck source=/dev/null
. "$conf"
[[ -n "$BASE_BITSTREAM" && -n "$PROGRAMMER" ]] || { log "BASE_BITSTREAM or PROGRAMMER unset in $conf"; exit 1; }
[[ -r "$BASE_BITSTREAM" ]] || { log "base bitstream $BASE_BITSTREAM unreadable"; exit 1; }
for ((b = 0; b < BOARDS; b++)); do
    cmd=${PROGRAMMER//\{board\}/$b}
    cmd=${cmd//\{bitstream\}/$BASE_BITSTREAM}
    if ! out=$(bash -c "$cmd" 2>&1); then
        log "job ${SLURM_JOB_ID:-?}: programming board $b failed: $out"
        exit 1
    fi
done
log "job ${SLURM_JOB_ID:-?}: $BOARDS board(s) programmed with $BASE_BITSTREAM"
