"""The rollout side's run-shape sections: `pipeline` (batch shape, parallelism, the pipeline
policy's name) and `eval` (held-out evaluation during and around the run).

Ground floor: imports flexmarl.checks only; flexmarl.orchestrator takes both from here and
checks that every mode named here has its policy (flexmarl.orchestrator.policy.PIPELINES).
"""
from __future__ import annotations

from dataclasses import dataclass

from flexmarl.checks import require

PIPELINE_MODES = ("sync", "micro_batch", "one_step_off", "bounded")
"""Valid `pipeline.mode` values; each names a pipeline policy."""
EVAL_MODES = ("greedy", "sampled")
"""The held-out measurements' decoding modes (eval.modes)."""

CREDITS = ("turn", "trajectory")
"""How a group's rewards become advantages (pipeline.credit):

- "turn" (default; agent- and turn-aware grouping, as AT-GRPO): an agent's k-th call is
  compared with its k-th call in the task's other trajectories; a group closes as soon as every
  trajectory has rewarded that call (complete_group), so it can train while later turns run.
- "trajectory": each trajectory's return is the mean reward of the agent's rows in it; the
  advantage is GRPO's over the task's trajectories, the same for all of a trajectory's rows.
  It needs every row, so groups close with the task (complete_group does nothing)."""


@dataclass(kw_only=True, frozen=True)
class PipelineConfig:
    """Batch shape and parallelism of rollouts (section `pipeline`)."""

    mode: str = "micro_batch"
    """Pipeline policy; one of PIPELINE_MODES."""
    tasks_per_step: int = 4
    """Tasks in one global batch."""
    trajectories_per_task: int = 8
    """GRPO group size: independent runs of the workflow per task."""
    max_concurrent_tasks: int = 4
    """Inter-query parallelism: tasks whose workflows run at once."""
    max_concurrent_calls: int = 16
    """Intra-query parallelism: concurrent generate calls of one task."""
    micro_batch_groups: int = 1
    """GRPO groups per trainer micro-batch. One: a group's rows share their prompt, which the
    trainer then computes once (flexmarl.training.trainer, _shared_prefix); several groups
    share only their common start (a system message), and each group waits for the others."""
    samples_per_request: int = 0
    """Intra-query parallelism of one call's n samples: split them into requests of at most
    this many, spread over the agent's instances by the balancer; 0: one request per call."""
    max_staleness: int = 1
    """Mode `bounded`: the most versions a trained sample may lag its trainer (>= 1)."""
    credit: str = "turn"
    """How rewards become advantages; one of CREDITS: "turn" (an agent's k-th call against its
    k-th calls in the task's other trajectories) or "trajectory" (each trajectory's mean reward
    against the others')."""
    is_cap: float = 2.0
    """Mode `bounded`: cap of the truncated importance weight pi / pi_behaviour (used unless
    trainer.is_cap is set)."""

    def __post_init__(self) -> None:
        require(self.mode in PIPELINE_MODES, "pipeline.mode", self.mode,
                 f"must be one of {', '.join(PIPELINE_MODES)}")
        for name in ("tasks_per_step", "max_concurrent_tasks", "max_concurrent_calls",
                     "micro_batch_groups", "max_staleness"):
            require(getattr(self, name) >= 1, f"pipeline.{name}", getattr(self, name),
                     "must be >= 1")
        require(self.trajectories_per_task >= 2, "pipeline.trajectories_per_task",
                 self.trajectories_per_task,
                 "must be >= 2 (GRPO learns from reward differences within a group; a group "
                 "of one always has advantage 0)")
        require(self.credit in CREDITS, "pipeline.credit", self.credit,
                 f"must be one of {', '.join(CREDITS)}")
        require(self.is_cap > 0, "pipeline.is_cap", self.is_cap, "must be > 0")
        require(self.samples_per_request >= 0, "pipeline.samples_per_request",
                 self.samples_per_request, "must be >= 0 (0: one request per call)")


@dataclass(kw_only=True, frozen=True)
class EvalConfig:
    """Held-out evaluation while training and after it (section `eval`)."""

    every_steps: int = 0
    """Evaluate after every this many steps (between two steps' rollouts; the step's record
    carries it); 0: never during the run."""
    tasks: int = 0
    """Held-out tasks per evaluation, the first of Team.heldout; 0: all of them. This and
    final_tasks, before_tasks count rounds where the team names them (Team.heldout_round):
    for a game team (flexmarl.envs.textarena) they are games per (agent, opponent) pair, each
    deal played in every seat."""
    greedy: bool = True
    """Each task once at temperature 0; false: `n` trajectories per task at the agents' own
    sampling settings (seeded: the same draws every evaluation)."""
    n: int = 1
    """Trajectories per task when not greedy (their mean, and the best of them: best_team)."""
    before: bool = True
    """Measure the starting weights (greedy and sampled, `final_tasks`) once the workers are up
    and before step 1's rollout, when the team has held-out tasks; a resumed run skips it (its
    starting weights are no longer the initial ones)."""
    final: bool = True
    """The same measurement on the run's final weights at its end (RUN_DIR/eval.json), when
    the team has held-out tasks."""
    final_tasks: int = 0
    """Held-out tasks of the before and final measurements, the first of Team.heldout; 0: all
    of them (`tasks` stays the, usually smaller, set evaluated during the run)."""
    before_tasks: int = 0
    """Held-out tasks of the before measurement alone; 0: final_tasks. Fewer than the final
    measurement where the starting weights' numbers are known to be far off (a team of many
    held-out games: the final count sets the win rate's error that matters)."""
    max_concurrent_tasks: int = 64
    """Held-out tasks evaluated at once (their requests batch in the engines)."""
    modes: tuple[str, ...] = EVAL_MODES
    """The decoding modes of the before and final measurements: "greedy" (temperature 0) and
    "sampled" (the agents' own settings, one seeded draw per task); one of them halves their
    time (a team of many held-out games, say)."""

    def __post_init__(self) -> None:
        for name in ("every_steps", "tasks", "final_tasks", "before_tasks"):
            require(getattr(self, name) >= 0, f"eval.{name}", getattr(self, name),
                    "must be >= 0 (0: " + ("never" if name == "every_steps" else "all") + ")")
        require(self.n >= 1, "eval.n", self.n, "must be >= 1")
        require(self.greedy is False or self.n == 1, "eval.n", self.n,
                "must be 1 with eval.greedy = true (greedy answers are all alike); set "
                "eval.greedy = false to sample n per task")
        require(self.max_concurrent_tasks >= 1, "eval.max_concurrent_tasks",
                self.max_concurrent_tasks, "must be >= 1")
        modes = self.modes
        require(not isinstance(modes, str) and len(modes) >= 1
                and all(m in EVAL_MODES for m in modes) and len(set(modes)) == len(modes),
                "eval.modes", modes, f"must be a non-empty list of distinct modes out of "
                f"{', '.join(EVAL_MODES)}")
        object.__setattr__(self, "modes", tuple(modes))

    @property
    def active(self) -> bool:
        return self.every_steps > 0 or self.before or self.final
