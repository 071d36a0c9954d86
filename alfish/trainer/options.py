"""Run options that are not ALF TrainerConfig fields; gin name ``Trainer`` (the name confs have always used)."""
from __future__ import annotations

import dataclasses
from typing import Union

import gin

from alfish.learn.threads import check_setting


@gin.configurable("Trainer")
@dataclasses.dataclass(frozen=True)
class RunOptions:
    """save_replay_buffer: store the replay buffer (as tensors, full capacity) in checkpoints, so a resumed run
    continues with the same data; set False to keep checkpoints small (a resume then refills one mini-batch of fresh
    steps).
    num_threads: torch intra-op threads: ``'auto'`` (the default: one thread for small networks, else the free cores
    of this machine shared by its ranks; the rule and its measurements are in ``alfish/learn/threads.py``), a
    positive int, or ``None`` (torch's default: one per core, whatever else runs).
    progress_log_interval_s: seconds between progress lines when stderr is not a terminal.
    random_warm_up_actions: collect the ``initial_collect_steps`` with uniformly random actions instead of the
    untrained policy's (as the TD3 paper and SB3's ``learning_starts`` do; ALF uses the policy, the default here).
    Off-policy algorithms whose rollout stores no info (SAC, DDPG, TD3, DQN), synchronous unroll only.
    host_memory_cache_mb: MB of freed host memory the process keeps for reuse instead of returning it to the OS
    (glibc's mmap/trim thresholds; ``alfish/learn/host_memory.py``): fresh update buffers then cost no page faults
    (SAC's update ~7% faster here); 0 leaves malloc's defaults.
    run_record: write ``ROOT_DIR/run_record/<start time>/`` at each start (rank 0): git commit and diff (or a copy
    of the package source), installed packages, the conf and the user modules it imports, the command line
    (``alfish/trainer/run_record.py``).
    """

    save_replay_buffer: bool = True
    num_threads: Union[int, str, None] = "auto"
    progress_log_interval_s: float = 10.0
    random_warm_up_actions: bool = False
    host_memory_cache_mb: int = 256
    run_record: bool = True

    def __post_init__(self) -> None:
        check_setting(self.num_threads)
        if self.host_memory_cache_mb < 0:
            raise ValueError(f"Trainer.host_memory_cache_mb={self.host_memory_cache_mb} must be >= 0 (0: malloc's "
                             "defaults)")
