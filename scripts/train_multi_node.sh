#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Train an alfish conf data-parallel over several machines: run this same command on every node.
#
#   MASTER_ADDR=node01 MASTER_PORT=29500 NNODES=2 scripts/train_multi_node.sh CONF ROOT_DIR [NPROC] [-- extra args]
#
# It runs torchrun with a c10d rendezvous (the default, RDZV_BACKEND=c10d):
#   python -m torch.distributed.run --nnodes=NNODES --nproc_per_node=NPROC --rdzv_id=RDZV_ID --rdzv_backend=c10d
#       --rdzv_endpoint=MASTER_ADDR:MASTER_PORT -m alfish.bin.train --conf CONF --root_dir ROOT_DIR [extra args]
# The rendezvous numbers the nodes itself, so every node runs the identical command (what `srun` does, see
# slurm/train.sbatch) and NODE_RANK is not needed; the store is hosted by the node whose address is MASTER_ADDR.
# With RDZV_BACKEND=static it runs torchrun's fixed rendezvous instead, which needs each node's NODE_RANK:
#   ... --nnodes=NNODES --node_rank=NODE_RANK --nproc_per_node=NPROC --master_addr=MASTER_ADDR
#       --master_port=MASTER_PORT ...
#
# Reads (required): MASTER_ADDR (host name or address of the rendezvous node, reachable from every node),
#   MASTER_PORT (a free TCP port on it), NNODES (number of nodes; with c10d also MIN:MAX for an elastic job),
#   NODE_RANK (static only: this node's index, 0..NNODES-1).
# Reads (optional): RDZV_BACKEND (c10d | static), RDZV_ID (c10d: the job's id, the same on every node; default
#   SLURM_JOB_ID, else alfish-MASTER_ADDR-MASTER_PORT), NPROC_PER_NODE or the NPROC argument (default: one per GPU,
#   else 1), PYTHON, OMP_NUM_THREADS (default cores / NPROC), ALFISH_DRY_RUN=1 (print the command and exit 0).
# ROOT_DIR must be on a file system every node sees: rank 0 (on whichever node) writes checkpoints there and every
# rank reads them to resume.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

alfish_parse_train_args "${ALFISH_PROG} CONF ROOT_DIR [NPROC] [-- extra train args]" "$@"

need() {  # need NAME WHAT-TO-SET-IT-TO...
    [[ -n ${!1:-} ]] || alfish_die "$1 is not set: set it to ${*:2}"
}
need MASTER_ADDR "the host name or address of the node that hosts the rendezvous, reachable from every node" \
    "(e.g. the job's first node; the same on every node)"
need MASTER_PORT "a free TCP port on MASTER_ADDR, e.g. 29500 (the same on every node)"
need NNODES "the number of nodes in the job (the same on every node)"
[[ $MASTER_PORT =~ ^[0-9]+$ && $MASTER_PORT -ge 1 && $MASTER_PORT -le 65535 ]] ||
    alfish_die "MASTER_PORT must be a TCP port number (1-65535), got '$MASTER_PORT'"

backend=${RDZV_BACKEND:-c10d}
nproc=${ALFISH_NPROC:-${NPROC_PER_NODE:-$(alfish_default_nproc)}}
alfish_is_count "$nproc" || alfish_die "NPROC_PER_NODE must be a positive integer, got '$nproc'"
case $backend in
    c10d)
        [[ $NNODES =~ ^[1-9][0-9]*(:[1-9][0-9]*)?$ ]] ||
            alfish_die "NNODES must be a number of nodes or MIN:MAX (elastic), got '$NNODES'"
        rdzv_id=${RDZV_ID:-${SLURM_JOB_ID:-alfish-$MASTER_ADDR-$MASTER_PORT}}
        rdzv=(--nnodes="$NNODES" --nproc_per_node="$nproc" --rdzv_id="$rdzv_id" --rdzv_backend=c10d
              --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT")
        ;;
    static)
        alfish_is_count "$NNODES" ||
            alfish_die "NNODES must be a positive integer with RDZV_BACKEND=static, got '$NNODES'"
        need NODE_RANK "this node's index, 0 to $((NNODES - 1)), different on each node (RDZV_BACKEND=static)"
        [[ $NODE_RANK =~ ^[0-9]+$ && $NODE_RANK -lt $NNODES ]] ||
            alfish_die "NODE_RANK must be 0 to $((NNODES - 1)) for NNODES=$NNODES, got '$NODE_RANK'"
        rdzv=(--nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$nproc" --master_addr="$MASTER_ADDR"
              --master_port="$MASTER_PORT")
        ;;
    *)
        alfish_die "RDZV_BACKEND must be c10d (the default) or static, got '$backend'"
        ;;
esac
alfish_set_omp_threads "$nproc"
python=$(alfish_python)

alfish_exec "$python" -m torch.distributed.run "${rdzv[@]}" \
    -m alfish.bin.train --conf "$ALFISH_CONF" --root_dir "$ALFISH_ROOT_DIR" ${ALFISH_EXTRA[@]+"${ALFISH_EXTRA[@]}"}
