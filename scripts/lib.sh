# shellcheck shell=bash
# What alfish's launch scripts share: error messages, the GPU count, OMP_NUM_THREADS per rank, the interpreter, the
# dry run. Sourced by train_single_node.sh, train_multi_node.sh and slurm/train.sbatch (not run on its own); copy it
# with them. Every function is prefixed alfish_ and every global it sets ALFISH_, so sourcing it clobbers nothing.

# The script's name for messages ("train_single_node.sh: error: ...").
ALFISH_PROG=${ALFISH_PROG:-${0##*/}}

# Print "PROG: error: MESSAGE" to stderr and exit 2: the trainer's own status for "a problem found before training
# starts" (alfish/bin/train.py), so a wrapper or scheduler sees launch mistakes and conf mistakes alike.
alfish_die() {
    printf '%s: error: %s\n' "$ALFISH_PROG" "$*" >&2
    exit 2
}

alfish_note() {
    printf '%s: %s\n' "$ALFISH_PROG" "$*" >&2
}

alfish_is_count() {  # a positive decimal integer (no sign, no leading zero)
    [[ $1 =~ ^[1-9][0-9]*$ ]]
}

# Parse "CONF ROOT_DIR [NPROC] [-- extra train args]" into ALFISH_CONF, ALFISH_ROOT_DIR, ALFISH_NPROC (empty when not
# given) and the array ALFISH_EXTRA. $1 is the usage line for the error messages.
# shellcheck disable=SC2034  # the ALFISH_ globals are read by the script that sources this file
alfish_parse_train_args() {
    local usage=$1
    shift
    if [[ $# -lt 2 || $1 == -- || $2 == -- ]]; then
        alfish_die "expected a conf and a root_dir; usage: $usage"
    fi
    ALFISH_CONF=$1
    ALFISH_ROOT_DIR=$2
    shift 2
    ALFISH_NPROC=
    if [[ $# -gt 0 && $1 != -- ]]; then
        alfish_is_count "$1" ||
            alfish_die "NPROC must be a positive integer (processes on this machine), got '$1'; usage: $usage"
        ALFISH_NPROC=$1
        shift
    fi
    if [[ $# -gt 0 ]]; then
        [[ $1 == -- ]] || alfish_die "unexpected argument '$1': extra train arguments go after '--'; usage: $usage"
        shift
    fi
    ALFISH_EXTRA=("$@")
    # Checked here because torchrun would otherwise start every rank before each one fails on the same missing file.
    [[ -f $ALFISH_CONF ]] || alfish_die "conf file '$ALFISH_CONF' not found (relative paths are from $PWD)"
}

# The number of GPUs this process may use: CUDA_VISIBLE_DEVICES when it is set (SLURM sets it for a --gpus
# allocation, and nvidia-smi would list GPUs that belong to other jobs), else the GPUs `nvidia-smi -L` lists, else 0.
alfish_gpu_count() {
    local n=0
    if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
        if [[ -n $CUDA_VISIBLE_DEVICES && $CUDA_VISIBLE_DEVICES != -1 && $CUDA_VISIBLE_DEVICES != NoDevFiles ]]; then
            local ids
            IFS=, read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
            n=${#ids[@]}
        fi
    elif command -v nvidia-smi >/dev/null 2>&1; then
        # one "GPU i: ..." line per GPU (MIG instances are indented lines under their GPU); a broken driver lists none
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || true
        alfish_is_count "$n" || n=0
    fi
    echo "$n"
}

# Ranks to start on this machine: NPROC when given, else one per GPU, else 1 (a CPU run).
alfish_default_nproc() {
    local gpus
    gpus=$(alfish_gpu_count)
    if [[ $gpus -ge 1 ]]; then echo "$gpus"; else echo 1; fi
}

# Export OMP_NUM_THREADS = this machine's cores / ranks on it (at least 1), unless the user set it. Without it each
# rank's OpenMP (and MKL) team would size itself to every core of the machine: N ranks would run N x cores threads,
# and on a busy machine spinning OpenMP workers make small matmuls orders of magnitude slower (see
# alfish/learn/threads.py). torchrun alone would set 1 for every rank. alfish's Trainer.num_threads='auto' then picks
# each rank's torch threads within this. `nproc` counts the cores this process may use (affinity: a SLURM step's
# cpuset); it is read before OMP_NUM_THREADS is set because GNU nproc reports OMP_NUM_THREADS when that is set.
alfish_set_omp_threads() {
    local ranks=$1 cores
    if [[ -n ${OMP_NUM_THREADS:-} ]]; then
        return
    fi
    cores=$(nproc 2>/dev/null) || cores=1
    alfish_is_count "$cores" || cores=1
    OMP_NUM_THREADS=$((cores / ranks))
    if [[ $OMP_NUM_THREADS -lt 1 ]]; then OMP_NUM_THREADS=1; fi
    export OMP_NUM_THREADS
}

# The Python that runs alfish: $PYTHON, else `python` on PATH (an activated virtual environment). torchrun is started
# as `$PYTHON -m torch.distributed.run`, so it is the same environment's torchrun whatever else is on PATH.
alfish_python() {
    local python=${PYTHON:-python}
    command -v "$python" >/dev/null 2>&1 ||
        alfish_die "'$python' not found: activate the environment alfish is installed in, or set PYTHON=/path/to/python"
    echo "$python"
}

# The command as one line a shell reads back to the same words (so a dry run's output can be pasted).
alfish_quote() {
    local out="" word
    for word in "$@"; do
        out+="${out:+ }$(printf '%q' "$word")"
    done
    printf '%s\n' "$out"
}

alfish_dry_run() {
    [[ ${ALFISH_DRY_RUN:-0} != 0 ]]
}

# Run the command in place of this shell (exec: signals then reach the trainer or torchrun itself, and its exit
# status is the script's), or with ALFISH_DRY_RUN=1 print it, prefixed by the OMP_NUM_THREADS it would get, and exit 0.
alfish_exec() {
    if alfish_dry_run; then
        alfish_quote "OMP_NUM_THREADS=${OMP_NUM_THREADS:-}" "$@"
        exit 0
    fi
    alfish_note "running: $(alfish_quote "$@")"
    exec "$@"
}

# The first host of a SLURM nodelist ("node[01-02],gpu7" -> node01). `scontrol show hostnames` when scontrol is on
# PATH (always, inside a job); otherwise (a dry run on a machine without SLURM) this expands the first entry itself:
# each bracket group contributes its first number, e.g. rack[3-4]-n[09,12] -> rack3-n09.
alfish_first_host() {
    local list=$1 host="" rest prefix inner
    if command -v scontrol >/dev/null 2>&1; then
        local hosts=()
        mapfile -t hosts < <(scontrol show hostnames "$list")
        host=${hosts[0]:-}
    else
        rest=$list
        while :; do
            prefix=${rest%%[[,]*}  # up to the next '[' or ','
            host+=$prefix
            rest=${rest#"$prefix"}
            [[ $rest == \[* ]] || break
            inner=${rest#\[}
            inner=${inner%%]*}
            host+=${inner%%[,-]*}
            rest=${rest#*]}
        done
    fi
    [[ -n $host ]] || alfish_die "cannot find the first host of the nodelist '$list'"
    echo "$host"
}
