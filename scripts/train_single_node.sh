#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Train an alfish conf on one machine, data-parallel over its GPUs.
#
#   scripts/train_single_node.sh CONF ROOT_DIR [NPROC] [-- extra train args]
#   scripts/train_single_node.sh confs/sac_pendulum.gin runs/sac            # one rank per GPU, or 1 without GPUs
#   scripts/train_single_node.sh confs/ppo_cartpole.gin runs/ppo 2 -- --conf_param TrainerConfig.num_iterations=10
#
# NPROC: processes (ranks) to start; default one per GPU (CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`), else 1.
# NPROC=1 runs `python -m alfish.bin.train` itself (no torchrun: nothing to coordinate, and its exit status is the
# trainer's: 0 done, 2 a conf/root_dir problem, 1 a failure during training, 128+N stopped by signal N); NPROC>1 runs
# `python -m torch.distributed.run --standalone --nproc_per_node=NPROC -m alfish.bin.train ...` (nccl on GPUs, gloo
# on the CPU; alfish chooses). Re-running with the same ROOT_DIR resumes from its newest checkpoint (with the same
# NPROC: a checkpoint resumes only with the world size that wrote it).
#
# Reads: PYTHON (default `python` on PATH), OMP_NUM_THREADS (default: this machine's cores / NPROC, at least 1),
# CUDA_VISIBLE_DEVICES (the GPUs to count), ALFISH_DRY_RUN=1 (print the command, prefixed by its OMP_NUM_THREADS,
# and exit 0). The script execs the command, so signals (SIGTERM: checkpoint and stop) reach the trainer or torchrun.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

alfish_parse_train_args "${ALFISH_PROG} CONF ROOT_DIR [NPROC] [-- extra train args]" "$@"
nproc=${ALFISH_NPROC:-$(alfish_default_nproc)}
alfish_set_omp_threads "$nproc"
python=$(alfish_python)

train=(-m alfish.bin.train --conf "$ALFISH_CONF" --root_dir "$ALFISH_ROOT_DIR" ${ALFISH_EXTRA[@]+"${ALFISH_EXTRA[@]}"})
if [[ $nproc -eq 1 ]]; then
    alfish_exec "$python" "${train[@]}"
else
    # --standalone: a rendezvous on a free local port, so two jobs on one machine do not collide
    alfish_exec "$python" -m torch.distributed.run --standalone --nproc_per_node="$nproc" "${train[@]}"
fi
