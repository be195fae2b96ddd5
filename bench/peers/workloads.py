"""The workloads every system of `bench/peers.py` trains on: tasks, prompts and rewards.

Standard library only: it is imported by FlexMARL's side (the main `.venv`) and by the peers'
runners (`.venv-peers`, where FlexMARL is not installed). The sums, their train/held-out split,
the prompts and the reward are the default team's (`agents/smol_duo.py`), rebuilt here without
importing FlexMARL; `tests/test_peers.py` checks they are the same.

    sums   one agent ("solver") answers a + b; reward: its last number is the sum
    joint  two agents ("a", "b") each answer the same sum; both get the joint reward
           (right(a) + right(b)) / 2
    duo    the default team: the solver answers, the checker is told the solver's claim and
           answers; each is rewarded for being right
    mixed  the duo's work with two model families (agents/mixed_duo.py): the solver is Gemma 3
           270M base (no chat template: the plain rendering below, stopped at PLAIN_STOP), the
           checker SmolLM2-135M-Instruct (its chat template); per-agent model, lr and new tokens
           (PER_AGENT)

Every workload's settings are Setting's; a workload may set some per agent (PER_AGENT, applied
by agent_setting): the model family, the learning rate, the new tokens.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

MAX_OPERAND = 20
HELDOUT_SUMS = 100
SPLIT_SEED = "flexmarl.smol_duo"   # agents/smol_duo.py's split
SYSTEM = "You are good at arithmetic."
_NUMBER = re.compile(r"-?[0-9]+")

WORKLOADS = ("sums", "joint", "duo", "mixed")
AGENTS = {"sums": ("solver",), "joint": ("a", "b"), "duo": ("solver", "checker"),
          "mixed": ("solver", "checker")}
"""The agents of each workload, in the order their turns come."""
WORKFLOW = {"sums": "sums", "joint": "joint", "duo": "duo", "mixed": "duo"}
"""Which workflow each workload runs: mixed is the duo's, with other models."""

SMOLLM2 = "smollm2-135m"        # FlexMARL's names of the pretrained models (AgentSpec.model)
GEMMA3 = "gemma3-270m"
PLAIN_STOP = "\nQuestion:"
"""Where a completion of the plain rendering ends (flexmarl.orchestrator.prompts.PLAIN_STOP)."""


@dataclass(frozen=True)
class Setting:
    """What every system trains with (the default team's settings); agent_setting() gives one
    agent's, with its workload's PER_AGENT entries applied."""

    model: str = ""                 # the converted HF directory of the agent's model (the
    #                                 SmolLM2-135M-Instruct one unless agent_setting says else)
    family: str = SMOLLM2           # which pretrained model `model` is
    models: tuple = ()              # ((family, converted HF directory), ...): the other families
    train_layers: int = 6           # the last 6 of 30 blocks and the final norm train
    lr: float = 1e-4                # AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0), constant
    grad_clip: float = 1.0
    group_size: int = 8             # GRPO: samples per prompt
    prompts_per_step: int = 4       # prompts (tasks) per optimizer step, per agent
    temperature: float = 0.7
    max_new_tokens: int = 12
    clip_eps: float = 0.2
    steps: int = 8
    seed: int = 0


PER_AGENT = {
    # agents/mixed_duo.py's: Gemma at a 30th of SmolLM2's lr (its weights are small: at 1e-4
    # two steps wrecked it) and 16 new tokens (one token per digit, and " 12\n\nQuestion:" is 7).
    "mixed": {"solver": {"family": GEMMA3, "lr": 3e-6, "max_new_tokens": 16},
              "checker": {"family": SMOLLM2, "lr": 1e-4, "max_new_tokens": 12}},
}
"""Settings a workload sets per agent, over Setting's."""


def agent_family(workload: str, agent: str) -> str:
    return PER_AGENT.get(workload, {}).get(agent, {}).get("family", SMOLLM2)


def families(workload: str) -> list[str]:
    """The pretrained models a workload's agents start from, in the agents' order, once each."""
    return list(dict.fromkeys(agent_family(workload, a) for a in AGENTS[workload]))


def agent_setting(setting: Setting, workload: str, agent: str) -> Setting:
    """One agent's Setting: `setting` with the workload's PER_AGENT entries for it, `model` the
    directory of its family (`setting.model` for SmolLM2, else from `setting.models`; "" when
    not given). Workloads without PER_AGENT entries get `setting` itself."""
    if agent not in AGENTS[workload]:
        raise KeyError(f"workload {workload} has no agent {agent!r} ({AGENTS[workload]})")
    over = dict(PER_AGENT.get(workload, {}).get(agent, {}))
    if not over:
        return setting
    family = over.pop("family", SMOLLM2)
    dirs = dict(setting.models)
    model = dirs.get(family) or (setting.model if family == setting.family else "")
    return replace(setting, model=model, family=family, **over)


@dataclass(frozen=True)
class Sum:
    a: int
    b: int

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def task_id(self) -> str:  # FlexMARL's tasks need one (agents/smol_duo.py's ids)
        return f"sum-{self.a}+{self.b}"


def split() -> tuple[list[Sum], list[Sum]]:
    """(train, held-out): agents/smol_duo.py's 300 training and 100 held-out sums."""
    pairs = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
    rng = random.Random(SPLIT_SEED)
    rng.shuffle(pairs)
    held, train = pairs[:HELDOUT_SUMS], pairs[HELDOUT_SUMS:]
    return [Sum(a, b) for a, b in train], [Sum(a, b) for a, b in held]


def step_tasks(setting: Setting) -> list[list[Sum]]:
    """The tasks of every step, in order: FlexMARL's data cursor with run.seed = setting.seed
    (flexmarl.orchestrator.orchestrator.task_stream: a fresh seeded order each epoch), so every
    system that lets us choose trains on the same tasks in the same steps."""
    train, _ = split()
    rng = random.Random(setting.seed)
    stream: list[Sum] = []
    n = setting.prompts_per_step
    while len(stream) < n * setting.steps:
        order = list(range(len(train)))
        rng.shuffle(order)
        stream += [train[i] for i in order]
    return [stream[s * n:(s + 1) * n] for s in range(setting.steps)]


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def right(text: str, task: Sum) -> float:
    return 1.0 if last_number(text) == task.answer else 0.0


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def solver_prompt(task: Sum) -> list[dict]:
    return chat(f"What is {task.a} + {task.b}? Reply with only the number.")


def checker_prompt(task: Sum, claim: str | None) -> list[dict]:
    if claim is None:  # the solver gave no number: the checker works the sum out alone
        return solver_prompt(task)
    return chat(f"A student says {task.a} + {task.b} = {claim}. What is {task.a} + {task.b}? "
                "Reply with only the number.")


def joint_reward(text_a: str, text_b: str, task: Sum) -> float:
    return (right(text_a, task) + right(text_b, task)) / 2


# ----------------------------------------------------------------------------- the plain rendering
# flexmarl.orchestrator.prompts' rendering of chat messages for a model without a chat template
# (Gemma 3 270M base), rebuilt here (FlexMARL is not installed in .venv-peers) and checked
# equal to it by tests/test_peers.py. Its text is tokenized the way the tokenizer encodes text
# (add_special_tokens=True: Gemma's BOS first), and a completion ends at PLAIN_STOP.

_LABELS = {"user": "Question", "assistant": "Answer"}


def render_plain(messages: list[dict]) -> str:
    """The system messages, a blank line, then "Question: ...\n" per user turn ("Answer:
    ...\n\n" per assistant turn), ending with "Answer:" for the model to complete."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    parts = ["\n\n".join(system) + "\n\n"] if system else []
    for m in messages:
        if m["role"] == "system":
            continue
        end = "\n\n" if m["role"] == "assistant" else "\n"
        parts.append(f"{_LABELS.get(m['role'], m['role'].capitalize())}: {m['content']}{end}")
    parts.append("Answer:")
    return "".join(parts)


def cut_at_stop(text: str, stop: str = PLAIN_STOP) -> str:
    """A completion's text up to its stop, as FlexMARL's engines cut it (text[:text.find(stop)])."""
    at = text.find(stop)
    return text if at < 0 else text[:at]


def stop_length(ids: list[int], decode, stop: str = PLAIN_STOP) -> int:
    """How many of a completion's tokens FlexMARL's engine keeps when it stops at `stop`: up to
    and with the token after which the decoded text (`decode(ids[:k])`, special tokens skipped)
    first holds the stop (flexmarl.rollout.torch_engine checks after every token); all of them
    when it never does."""
    for k in range(1, len(ids) + 1):
        if stop in decode(ids[:k]):
            return k
    return len(ids)
