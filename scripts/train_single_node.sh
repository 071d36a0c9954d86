#!/usr/bin/env bash
# Train a conf on one machine: one process, or NPROC data-parallel ranks under torchrun (gloo on CPU, nccl on GPU).
#
#   scripts/train_single_node.sh CONF ROOT_DIR [NPROC] [-- extra train arguments]
#   scripts/train_single_node.sh confs/sac_pendulum.gin runs/sac 2 -- --conf_param 'TrainerConfig.num_env_steps=5000'
#
# NPROC: the number of ranks; default: the number of GPUs `nvidia-smi -L` lists, else 1. With 1 the trainer runs as a
# plain process (no torchrun). OMP_NUM_THREADS defaults to the machine's cores divided by NPROC (at least 1), so the
# ranks do not oversubscribe the cores; set it to override. ALFISH_DRY_RUN=1 prints the command instead of running it.
# Re-running the same line resumes from ROOT_DIR's newest checkpoint. The exit status is the trainer's (0 finished,
# 2 a problem before training, 1 a failure during training, 128+N stopped by signal N).
set -euo pipefail

usage() { echo "usage: $0 CONF ROOT_DIR [NPROC] [-- extra train arguments]" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
conf=$1 root_dir=$2
shift 2
nproc=""
if [[ $# -gt 0 && $1 != "--" ]]; then nproc=$1; shift; fi
if [[ $# -gt 0 && $1 == "--" ]]; then shift; fi
[[ -f $conf ]] || { echo "error: conf $conf does not exist" >&2; exit 2; }

if [[ -z $nproc ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
        nproc=$(( gpus > 0 ? gpus : 1 ))
    else
        nproc=1
    fi
fi
[[ $nproc =~ ^[1-9][0-9]*$ ]] || { echo "error: NPROC must be a positive integer, got '$nproc'" >&2; exit 2; }

cores=$(nproc 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / nproc > 0 ? cores / nproc : 1 ))}
python=${PYTHON:-python}

if [[ $nproc -eq 1 ]]; then
    cmd=("$python" -m alfish.bin.train --conf "$conf" --root_dir "$root_dir" "$@")
else
    cmd=("$python" -m torch.distributed.run --standalone --nproc_per_node="$nproc"
         -m alfish.bin.train --conf "$conf" --root_dir "$root_dir" "$@")
fi
if [[ ${ALFISH_DRY_RUN:-0} == 1 ]]; then
    echo "OMP_NUM_THREADS=$OMP_NUM_THREADS ${cmd[*]}"
    exit 0
fi
exec "${cmd[@]}"
