"""alfish from Python (notebooks, scripts): ``alfish.train`` and ``alfish.load_policy``, the ``train`` and ``play``
commands as calls. ``import alfish`` reaches these names lazily (``alfish/__init__.py``), so it stays cheap. In a
notebook (in a script, under ``if __name__ == "__main__":``: a run's child processes run the script again):

    import gymnasium as gym
    import alfish

    result = alfish.train("confs/ppo_cartpole.gin", "runs/ppo", ["TrainerConfig.num_env_steps=20000"])
    print(result.average_return, result.env_steps)
    policy = alfish.load_policy("runs/ppo")
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=0)
    done = False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(policy.act(observation))
        done = terminated or truncated
"""
from alfish.api.policy import LoadPolicyError, Policy, load_policy
from alfish.api.training import TrainError, TrainResult, train

__all__ = ["LoadPolicyError", "Policy", "TrainError", "TrainResult", "load_policy", "train"]
