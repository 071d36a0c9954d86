"""Run as a script by test_larger_than_memory.py: pure offline training on a memory-mapped dataset after capping the
process's data memory (RLIMIT_DATA: private writable memory such as the heap; read-only file mappings do not count)
at ALLOW bytes above what the process holds once the framework is warmed up.

    python capped_training.py DATASET ROOT_DIR ALLOW_MB

Prints 'control: MemoryError' when copying the dataset's observations into memory fails under the cap (the cap bites),
then trains, and prints 'trained N updates' and the process's VmData/VmRSS.
"""
import resource
import sys

import gin
import numpy as np

from alfish.config import TrainerConfig, load_conf
from alfish.trainer.build import build_trainer

CONF = """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (32, 32)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.mini_batch_size = 256
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
TrainerConfig.summary_interval = 50
"""


def status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def train(dataset: str, root_dir: str, iterations: int):
    conf = f"{root_dir}.gin"
    with open(conf, "w") as f:
        f.write(CONF)
    load_conf(conf, [f"TrainerConfig.offline_buffer_dir='{dataset}'", f"TrainerConfig.num_iterations={iterations}",
                     f"TrainerConfig.rl_train_after_update_steps={iterations}"])
    try:
        trainer = build_trainer(TrainerConfig(root_dir=root_dir))
    finally:
        gin.clear_config()
    assert trainer.run() == 0
    return trainer


def main() -> None:
    dataset, root_dir, allow_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    train(dataset, root_dir + "-warm", 3)  # thread pools, allocator arenas, lazy imports: the framework's own memory
    limit = status("VmData") + (allow_mb << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    observation = np.load(f"{dataset}/observation.npy", mmap_mode="r")
    try:
        copy = np.array(observation)  # what loading the dataset into memory would take
        print(f"control: copied {copy.nbytes >> 20} MB", flush=True)
    except MemoryError:
        print("control: MemoryError", flush=True)
    trainer = train(dataset, root_dir, 400)
    print(f"trained {trainer.learner.num_updates} updates; dataset {observation.nbytes >> 20} MB; "
          f"VmData {status('VmData') >> 20} MB (cap {limit >> 20} MB); VmRSS {status('VmRSS') >> 20} MB", flush=True)


if __name__ == "__main__":
    main()
