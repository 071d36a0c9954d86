#!/usr/bin/env bash
# Run a training command; on SLURM's pre-emption warning, stop it with a checkpoint and requeue the job.
#
#   scripts/slurm/requeue_on_signal.sh COMMAND [ARGS...]      (train.sbatch runs its srun line through it)
#
# The warning is SIGUSR1 (`#SBATCH --signal=B:USR1@180`: sent to this batch shell 180 s before the time limit or a
# pre-emption). It is forwarded to COMMAND as SIGTERM; alfish's trainer (all ranks: srun and torchrun pass SIGTERM
# on) writes a checkpoint and exits. This script waits for COMMAND at most ALFISH_STOP_TIMEOUT_S seconds (default 150,
# under the warning's lead) before SIGKILL, then, unless COMMAND finished (exit 0), runs
# `scontrol requeue $SLURM_JOB_ID`: the requeued job runs the same command with the same ROOT_DIR, which resumes
# from that checkpoint. A SIGTERM to this script (scancel) is forwarded too, but never requeues. COMMAND's exit
# status is this script's.
set -uo pipefail

[[ $# -ge 1 ]] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
stop_timeout_s=${ALFISH_STOP_TIMEOUT_S:-150}

"$@" &
child=$!
preempted=0
stop_requested_at=0  # $SECONDS when the child was asked to stop

# (the three functions below run from the traps)
# shellcheck disable=SC2329
stop_child() {
    kill -TERM "$child" 2>/dev/null || true
    [[ $stop_requested_at -gt 0 ]] || stop_requested_at=$SECONDS
}
# shellcheck disable=SC2329
on_warning() {
    preempted=1
    echo "requeue_on_signal: pre-emption warning: stopping the run with a checkpoint" >&2
    stop_child
}
# shellcheck disable=SC2329
on_term() { echo "requeue_on_signal: SIGTERM: stopping the run (no requeue)" >&2; stop_child; }
trap on_warning USR1
trap on_term TERM

# Poll in short interruptible sleeps (a trap runs as soon as its signal arrives); SIGKILL the child if it has not
# ended ALFISH_STOP_TIMEOUT_S seconds after it was asked to stop.
while kill -0 "$child" 2>/dev/null; do
    if (( stop_requested_at > 0 && SECONDS - stop_requested_at >= stop_timeout_s )); then
        echo "requeue_on_signal: the run did not stop within ${stop_timeout_s} s; killing it" >&2
        kill -KILL "$child" 2>/dev/null || true
    fi
    sleep 0.5 &
    wait $! 2>/dev/null || true
done
wait "$child"
status=$?
if [[ $preempted -eq 1 && $status -ne 0 ]]; then
    if [[ -n ${SLURM_JOB_ID:-} ]]; then
        echo "requeue_on_signal: run stopped (exit $status); requeueing job $SLURM_JOB_ID" >&2
        scontrol requeue "$SLURM_JOB_ID"
    else
        echo "requeue_on_signal: run stopped (exit $status); no SLURM_JOB_ID: rerun the command to resume" >&2
    fi
fi
exit "$status"
