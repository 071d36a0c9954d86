#!/usr/bin/env bash
# Train a conf on several machines: run this same line on every node; torchrun's c10d rendezvous joins them.
#
#   MASTER_ADDR=node01 MASTER_PORT=29500 NNODES=2 NODE_RANK=0 NPROC_PER_NODE=4 \
#       scripts/train_multi_node.sh CONF ROOT_DIR [-- extra train arguments]
#
# Read from the environment (each is required, and missing ones are named):
#   MASTER_ADDR     the host of the rendezvous (any node that every node reaches, e.g. the first of the allocation)
#   MASTER_PORT     its port (free on that host)
#   NNODES          the number of nodes
#   NODE_RANK       this node's index, 0 .. NNODES-1
#   NPROC_PER_NODE  ranks on this node (e.g. its GPUs)
# Optional: RDZV_ID (the job's id: nodes with the same id join the same job; default alfish-$MASTER_PORT),
# OMP_NUM_THREADS (default: cores / NPROC_PER_NODE), PYTHON, ALFISH_DRY_RUN=1 (print the command, run nothing).
# ROOT_DIR must be on a file system every node sees: rank 0 writes checkpoints there and every rank resumes from them.
set -euo pipefail

usage() { echo "usage: $0 CONF ROOT_DIR [-- extra train arguments]" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
conf=$1 root_dir=$2
shift 2
if [[ $# -gt 0 && $1 == "--" ]]; then shift; fi

missing=()
for name in MASTER_ADDR MASTER_PORT NNODES NODE_RANK NPROC_PER_NODE; do
    [[ -n ${!name:-} ]] || missing+=("$name")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "error: set ${missing[*]} (see the header of $0)" >&2
    exit 2
fi

cores=$(nproc 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / NPROC_PER_NODE > 0 ? cores / NPROC_PER_NODE : 1 ))}
cmd=("${PYTHON:-python}" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK"
     --nproc_per_node="$NPROC_PER_NODE" --rdzv_id="${RDZV_ID:-alfish-$MASTER_PORT}" --rdzv_backend=c10d
     --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"
     -m alfish.bin.train --conf "$conf" --root_dir "$root_dir" "$@")
if [[ ${ALFISH_DRY_RUN:-0} == 1 ]]; then
    echo "OMP_NUM_THREADS=$OMP_NUM_THREADS ${cmd[*]}"
    exit 0
fi
exec "${cmd[@]}"
