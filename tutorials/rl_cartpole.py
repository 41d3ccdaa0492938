"""Reinforcement learning with remote objects: one agent, several observers.

Each observer owns a CartPole environment. The agent owns the policy. Every
episode, the agent asks all observers to play at once; each observer steps its
own environment and, for every step, asks the agent for an action through an
RRef to the agent, then reports the reward. After the episode the agent
updates its policy (REINFORCE) from all observers' trajectories.

What it shows:

- ``torchrpc.remote(worker, Observer)`` creates an object on another worker
  and returns an ``RRef`` to it at once;
- ``rref.rpc_sync().method(...)`` / ``rref.rpc_async().method(...)`` call
  methods on the object where it lives;
- RRefs travel as arguments: the agent passes ``RRef(self)`` to observers,
  which call back into it.

Run it (from the repository root):

    .venv/bin/python tutorials/rl_cartpole.py --observers 2 --episodes 200

It uses gymnasium's CartPole if gymnasium is installed, else the small
built-in CartPole below (the same physics).
"""

import argparse
import math
import os
import random
import socket
import subprocess
import sys
import threading
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchrpc as rpc

warnings.simplefilter("ignore")  # torch.jit deprecation notices


class CartPole:
    """A pole on a cart; push left (0) or right (1); +1 reward per step
    until the pole falls past 12 degrees or the cart leaves the track."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.state = None

    def reset(self):
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        return list(self.state)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        gravity, mass_pole, total_mass, half_length, tau = 9.8, 0.1, 1.1, 0.5, 0.02
        temp = (force + mass_pole * half_length * theta_dot ** 2 * sin) / total_mass
        theta_acc = (gravity * sin - cos * temp) / (half_length * (4.0 / 3.0 - mass_pole * cos ** 2 / total_mass))
        x_acc = temp - mass_pole * half_length * theta_acc * cos / total_mass
        x, x_dot = x + tau * x_dot, x_dot + tau * x_acc
        theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * theta_acc
        self.state = [x, x_dot, theta, theta_dot]
        done = abs(x) > 2.4 or abs(theta) > 12 * 2 * math.pi / 360
        return list(self.state), 1.0, done


def make_env(seed):
    try:
        import gymnasium

        env = gymnasium.make("CartPole-v1")

        class Gym:
            def reset(self):
                return list(env.reset(seed=seed)[0])

            def step(self, action):
                state, reward, terminated, truncated, _ = env.step(action)
                return list(state), float(reward), terminated or truncated

        return Gym()
    except ImportError:
        return CartPole(seed)


class Observer:
    """Lives on an observer worker: plays episodes, asking the agent for actions."""

    def __init__(self, seed):
        self.env = make_env(seed)
        self.id = rpc.get_worker_info().id

    def run_episode(self, agent_rref, max_steps):
        state = self.env.reset()
        for _ in range(max_steps):
            action = agent_rref.rpc_sync().select_action(self.id, state)
            state, reward, done = self.env.step(action)
            agent_rref.rpc_sync().report_reward(self.id, reward)
            if done:
                break


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 128)
        self.out = nn.Linear(128, 2)

    def forward(self, x):
        return F.softmax(self.out(F.dropout(F.relu(self.hidden(x)), 0.6, self.training)), dim=-1)


class Agent:
    """Lives on the agent worker: owns the policy and the observers' RRefs."""

    def __init__(self, observers, gamma=0.99):
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.gamma = gamma
        self.lock = threading.Lock()
        self.observers = [rpc.remote(name, Observer, args=(seed,)) for seed, name in enumerate(observers)]
        self.log_probs = {}  # observer id -> [log prob of each action]
        self.rewards = {}  # observer id -> [reward of each step]
        self.running_reward = 0.0

    def select_action(self, ob_id, state):
        probs = self.policy(torch.tensor(state).unsqueeze(0))
        dist = torch.distributions.Categorical(probs)
        action = dist.sample()
        with self.lock:
            self.log_probs.setdefault(ob_id, []).append(dist.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        with self.lock:
            self.rewards.setdefault(ob_id, []).append(reward)

    def run_episode(self, max_steps):
        me = rpc.RRef(self)
        futures = [ob.rpc_async().run_episode(me, max_steps) for ob in self.observers]
        torch.futures.wait_all(futures)
        return self.finish_episode()

    def finish_episode(self):
        """REINFORCE over every observer's trajectory; returns the running reward."""
        losses, lengths = [], []
        for ob_id, rewards in self.rewards.items():
            returns, r = [], 0.0
            for reward in reversed(rewards):
                r = reward + self.gamma * r
                returns.insert(0, r)
            returns = torch.tensor(returns)
            returns = (returns - returns.mean()) / (returns.std() + 1e-8) if len(returns) > 1 else returns
            losses += [-lp * ret for lp, ret in zip(self.log_probs[ob_id], returns)]
            lengths.append(len(rewards))
        self.optimizer.zero_grad()
        torch.cat(losses).sum().backward()
        self.optimizer.step()
        self.log_probs, self.rewards = {}, {}
        self.running_reward = 0.05 * (sum(lengths) / len(lengths)) + 0.95 * self.running_reward
        return self.running_reward


def options(port):
    return rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--observers", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    world_size = args.observers + 1
    if args.rank > 0:  # an observer process started below: it only serves
        rpc.init_rpc(f"observer{args.rank}", rank=args.rank, world_size=world_size,
                     rpc_backend_options=options(args.port))
        rpc.shutdown()
        return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--observers", str(args.observers)], env=env)
             for r in range(1, world_size)]
    try:
        torch.manual_seed(0)
        rpc.init_rpc("agent", rank=0, world_size=world_size, rpc_backend_options=options(port))
        agent = Agent([f"observer{r}" for r in range(1, world_size)])
        for episode in range(1, args.episodes + 1):
            running = agent.run_episode(args.max_steps)
            if episode % 10 == 0 or episode == args.episodes:
                print(f"episode {episode:4d}  running reward {running:7.2f}", flush=True)
            if running > 0.95 * args.max_steps:
                print(f"solved after {episode} episodes: running reward {running:.1f}")
                break
        agent = None  # drop the observers' RRefs before leaving
        rpc.shutdown()
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode != 0 for p in procs):
        sys.exit("an observer failed")


if __name__ == "__main__":
    main()
