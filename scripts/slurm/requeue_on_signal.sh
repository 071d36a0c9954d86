#!/usr/bin/env bash
# Run a training command; on the pre-emption signal, have it checkpoint and stop, then requeue the SLURM job, which
# runs the same command again and resumes from that checkpoint.
#
#   scripts/slurm/requeue_on_signal.sh COMMAND [ARGS...]
#   # in a batch script submitted with --signal=B:USR1@120 --requeue (slurm/train.sbatch does this):
#   exec scripts/slurm/requeue_on_signal.sh scripts/train_single_node.sh confs/sac_pendulum.gin /shared/runs/sac
#
# On a signal named in ALFISH_REQUEUE_SIGNALS (default USR1: what --signal=B:USR1@120 sends the batch shell 120 s
# before the time limit, or at pre-emption where the cluster sends the user's signal then):
#   1. it asks COMMAND to stop: SIGTERM to it. The trainer checkpoints after the current iteration and exits 128+15;
#      torchrun forwards SIGTERM to its ranks, which stop together at one iteration (rank 0 writes the checkpoint).
#      When COMMAND is srun, SIGTERM goes to the job's steps through `scancel --signal=TERM $SLURM_JOB_ID` instead:
#      srun turns a SIGTERM of its own into SIGKILL for its tasks ("srun: forcing job termination").
#   2. it waits for COMMAND at most ALFISH_STOP_TIMEOUT_S seconds (default 100: less than the 120 s of notice), then
#      SIGKILLs it. Checkpoints are written atomically: a killed save leaves the previous checkpoint to resume from.
#   3. if COMMAND stopped because of that signal, it runs `scontrol requeue "$SLURM_JOB_ID"` (the job needs
#      --requeue). Stopped because of the signal means: exit 128+15 (the trainer, run directly), or exit 1 with
#      torchrun's record of the SignalException it raises after forwarding a signal (torchrun exits 1 whatever its
#      ranks did, so its status alone cannot tell a pre-empted run from a failed one: this wrapper points torchrun's
#      TORCHELASTIC_ERROR_FILE at a temporary file and reads it), or no exit within the wait. Exit 0 (training
#      finished meanwhile) and any other status (an error: 1 or 2 from the trainer; a requeue would fail the same
#      way) are not requeued.
# SIGTERM and SIGINT that are not in ALFISH_REQUEUE_SIGNALS (e.g. from `scancel`) are forwarded the same way but never
# requeue: a job someone cancelled stays cancelled. Without any signal the command just runs to its end.
#
# Reads: ALFISH_REQUEUE_SIGNALS (space-separated names, default "USR1"; add TERM where the cluster pre-empts with
#   SIGTERM, at the cost of also requeueing on scancel), ALFISH_STOP_TIMEOUT_S (default 100), SLURM_JOB_ID,
#   SLURM_RESTART_COUNT (logged), TMPDIR. Exports to COMMAND: TORCHELASTIC_ERROR_FILE (above) and, unless set,
#   TORCH_ELASTIC_SHUTDOWN_TIMEOUT = the wait minus 10 s (how long torchrun waits for its ranks after forwarding the
#   signal before killing them; torch versions before that variable wait 30 s).
# Exit status: COMMAND's (2 for a usage error of this wrapper).
set -euo pipefail

prog=${0##*/}
say() {
    printf '%s %s: %s\n' "$(date +%H:%M:%S)" "$prog" "$*" >&2
}
die() {
    printf '%s: error: %s\n' "$prog" "$*" >&2
    exit 2
}

[[ $# -ge 1 ]] || die "no command given; usage: $prog COMMAND [ARGS...]"
timeout_s=${ALFISH_STOP_TIMEOUT_S:-100}
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "ALFISH_STOP_TIMEOUT_S must be a positive number of seconds, got '$timeout_s'"
read -r -a requeue_signals <<<"${ALFISH_REQUEUE_SIGNALS:-USR1}"
[[ ${#requeue_signals[@]} -ge 1 ]] || die "ALFISH_REQUEUE_SIGNALS is empty: name at least one signal, e.g. USR1"
for i in "${!requeue_signals[@]}"; do
    sig=${requeue_signals[$i]#SIG}
    kill -l "$sig" >/dev/null 2>&1 || die "ALFISH_REQUEUE_SIGNALS: '${requeue_signals[$i]}' is not a signal name"
    requeue_signals[i]=$sig
done

launcher_error=$(mktemp "${TMPDIR:-/tmp}/alfish-launcher-error.XXXXXX")
trap 'rm -f "$launcher_error"' EXIT
export TORCHELASTIC_ERROR_FILE=$launcher_error
TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-$((timeout_s > 20 ? timeout_s - 10 : timeout_s))}
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT

child=""            # COMMAND's pid, once started
command_name=${1##*/}
preempted=0         # a requeue signal arrived
stop_requested=0
stop_deadline=0     # $SECONDS by which COMMAND must have exited
timed_out=0

send_stop() {
    if [[ $command_name == srun ]]; then
        # signals every step of the job (not the batch shell: scancel spares it without --full)
        scancel --signal=TERM "${SLURM_JOB_ID:?is not set: cannot signal the tasks of srun}" ||
            say "scancel --signal=TERM $SLURM_JOB_ID failed; the job's tasks may not have been asked to stop"
    else
        kill -TERM "$child" 2>/dev/null || true  # (it may have exited already)
    fi
}

# shellcheck disable=SC2329  # called by the trap handlers below
request_stop() {
    if [[ $stop_requested == 1 ]]; then
        say "a stop is already under way"
        return 0
    fi
    stop_requested=1
    stop_deadline=$((SECONDS + timeout_s))
    if [[ -n $child ]]; then  # else: sent as soon as it starts
        send_stop
    fi
}

# shellcheck disable=SC2329  # called by the traps set below
on_requeue_signal() {
    say "received SIG$1 (pre-emption or time limit): asking the training to checkpoint and stop (SIGTERM), waiting" \
        "at most ${timeout_s} s, then requeueing the job"
    preempted=1
    request_stop
}

# shellcheck disable=SC2329  # called by the traps set below
on_stop_signal() {
    say "received SIG$1: asking the training to checkpoint and stop (SIGTERM); the job will not be requeued"
    request_stop
}

for sig in "${requeue_signals[@]}"; do
    # shellcheck disable=SC2064  # the signal's name is fixed now, on purpose
    trap "on_requeue_signal $sig" "$sig"
done
for sig in TERM INT; do
    if [[ " ${requeue_signals[*]} " != *" $sig "* ]]; then
        # shellcheck disable=SC2064
        trap "on_stop_signal $sig" "$sig"
    fi
done

"$@" &
child=$!
if [[ $stop_requested == 1 ]]; then
    send_stop
fi

# A trapped signal makes `wait` return (with 128+N) while COMMAND runs on; its handler has asked COMMAND to stop, and
# from then on the wait is bounded by polling until the deadline.
while :; do
    status=0
    wait "$child" || status=$?
    if ! kill -0 "$child" 2>/dev/null; then
        break  # it exited: $status is its exit status
    fi
    if [[ $stop_requested == 1 ]]; then
        while kill -0 "$child" 2>/dev/null && [[ $SECONDS -lt $stop_deadline ]]; do
            sleep 1
        done
        if kill -0 "$child" 2>/dev/null; then
            say "the command is still running ${timeout_s} s after the stop request: killing it (SIGKILL); its" \
                "newest complete checkpoint is kept"
            kill -KILL "$child" 2>/dev/null || true
            timed_out=1
        fi
        status=0
        wait "$child" || status=$?
        break
    fi
done

if [[ $preempted == 0 ]]; then
    exit "$status"
fi
if [[ $timed_out == 1 ]]; then
    why="it did not stop within ${timeout_s} s"
elif [[ $status == $((128 + 15)) ]]; then
    why="it stopped on SIGTERM (exit $status)"
elif [[ $status == 1 ]] && grep -q SignalException "$launcher_error" 2>/dev/null; then
    why="torchrun stopped its ranks on SIGTERM (exit 1, torchrun's SignalException)"
elif [[ $status == 0 ]]; then
    say "the training finished (exit 0) while stopping: not requeued"
    exit 0
else
    say "the command failed (exit $status) while stopping: not requeued (it would fail the same way; see its errors" \
        "above)"
    exit "$status"
fi
if [[ -z ${SLURM_JOB_ID:-} ]]; then
    say "$why, but SLURM_JOB_ID is not set (not a SLURM job): nothing to requeue; rerun the same command to resume"
    exit "$status"
fi
say "$why: requeueing job $SLURM_JOB_ID (restarts so far: ${SLURM_RESTART_COUNT:-0}); it will rerun the same" \
    "command and resume from the newest checkpoint"
if ! scontrol requeue "$SLURM_JOB_ID"; then
    say "error: 'scontrol requeue $SLURM_JOB_ID' failed: was the job submitted with --requeue? Resubmit it (same" \
        "ROOT_DIR) to resume"
fi
exit "$status"
