"""The Balancer driven by the simulator: flexmarl.sim.workload, and flexmarl.sim.routing driving
the real InstancePool on the cluster simulator's engines (virtual clock, cost model;
deterministic, about a second each): the engine's timing as the routing runs see it,
least_loaded against round_robin on a long-tailed stream, hierarchical moves toward the hot
agent without flapping or losing a request.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from flexmarl.config.balance import BalancerConfig
from flexmarl.rollout.balancer import percentile
from flexmarl.sim.costs import load_costs
from flexmarl.sim.routing import RoutingConfig, initial_placement, move_times, run_routing
from flexmarl.sim.workload import (AgentProfile, Call, CallChain, SkewedWorkload,
                                   tokens_by_agent)


# ============================================================================ (b) workload

def test_workload_is_seeded_skewed_and_long_tailed():
    w = SkewedWorkload(seed=3)
    a, b = w.episodes(0), w.episodes(0)
    assert a == b and a != w.episodes(1) and a != SkewedWorkload(seed=4).episodes(0)
    assert len(a) == w.episodes_per_step
    solver, verifier = w.agents
    per_round = []
    for ep in a:
        names = [c.agent for c in ep.calls]
        rounds = names.count("verifier")
        assert 1 <= rounds <= 2 and names[-1] == "verifier"
        per_round.append((len(names) - rounds) / rounds)
        for c in ep.calls:
            assert len(c.lengths) == c.n and all(1 <= x <= c.max_tokens for x in c.lengths)
    assert min(per_round) >= 4 and max(per_round) <= 8      # 4-8 solver calls per verifier call
    lengths = [x for ep in a for c in ep.calls if c.agent == "solver" for x in c.lengths]
    assert percentile(lengths, 0.99) > 5 * percentile(lengths, 0.5)   # a long tail
    totals = tokens_by_agent(a)
    assert totals["solver"] > 5 * totals["verifier"]
    with pytest.raises(ValueError, match="calls"):
        AgentProfile("x", calls=(3, 2))


# ============================================================================ (b) routing runs

COSTS = load_costs()
MODEL = COSTS.models["14b"]
PROMPT = 100
REL = 1e-9


def fixed(calls: int = 1, n: int = 1, length: int = 10, episodes: int = 1) -> SkewedWorkload:
    """One agent, every sample exactly `length` tokens."""
    return SkewedWorkload(agents=(AgentProfile("a", calls=(calls, calls), n=n, max_tokens=64,
                                               median_tokens=length, sigma=0.0),),
                          rounds=(1, 1), episodes_per_step=episodes)


def on_one_instance(workload, **config):
    return run_routing(workload, {"a": ["r0"]}, BalancerConfig(strategy="least_loaded"),
                       RoutingConfig(**{"steps": 1, "prompt_tokens": PROMPT, **config}))


def prefill() -> float:
    return COSTS.prefill_s(MODEL, PROMPT)


def decode(batch: int) -> float:
    """One decode step of `batch` sequences of PROMPT-token prompts (under one segment, the
    engine keeps the step time of the batch's arrival)."""
    return COSTS.decode_step_s(MODEL, batch, batch * PROMPT)


def test_engine_model_timing():
    # One sequence of 10 tokens: its prefill, then 10 decode steps (the cost model's).
    single = prefill() + 10 * decode(1)
    r = on_one_instance(fixed())
    assert r.step_s == [pytest.approx(single, rel=REL)] and r.requests[0].queue_wait == 0.0
    assert r.tokens_served == {"r0": 10} and r.busy_s["r0"] == pytest.approx(single, rel=REL)
    # One sequence at a time: the second request waits in the queue for the first to finish.
    r = on_one_instance(fixed(episodes=2), max_num_seqs=1)
    assert sorted(r.waits()) == [0.0, pytest.approx(single, rel=REL)]
    assert r.step_s == [pytest.approx(2 * single, rel=REL)]
    # n samples are n sequences decoded together, each prefilled: 3 prefills, 10 steps of 3.
    r = on_one_instance(fixed(n=3))
    assert r.step_s == [pytest.approx(3 * prefill() + 10 * decode(3), rel=REL)]
    assert r.tokens_served == {"r0": 30}
    # The calls of an episode run one after the other; an idle instance starts at once.
    r = on_one_instance(fixed(calls=2), steps=2)
    assert r.step_s == [pytest.approx(2 * single, rel=REL)] * 2 and len(r.requests) == 4
    assert r.waits() == [0.0] * 4 and r.all_finished


@dataclass(frozen=True)
class Script:
    """A workload of hand-written episodes, the same every step."""

    chains: tuple[CallChain, ...]

    def episodes(self, step: int) -> list[CallChain]:
        return list(self.chains)


def test_a_request_arriving_while_an_instance_decodes_joins_its_batch_at_once():
    """Continuous batching: a call that reaches a busy instance starts at once (its queue wait
    is 0); its prefill stalls the running sequence, which then decodes in a batch of two."""
    long = CallChain("long", (Call("a", 1, 256, (100,)),))
    late = CallChain("late", (Call("b", 1, 256, (5,)), Call("a", 1, 256, (10,))))
    r = run_routing(Script((long, late)), {"a": ["r0"], "b": ["r1"]},
                    BalancerConfig(strategy="least_loaded"),
                    RoutingConfig(steps=1, prompt_tokens=PROMPT))
    first, joined = r.requests[0], r.requests[2]
    assert (first.id, joined.id) == ("longc0", "latec1") and joined.instance == "r0"
    assert joined.dispatched == pytest.approx(prefill() + 5 * decode(1), rel=REL)
    assert joined.queue_wait == 0.0 and joined.finished < first.finished
    alone = prefill() + 100 * decode(1)
    assert alone + prefill() < first.finished < alone + prefill() + 10 * decode(2) + 1e-9
    assert r.tokens_served == {"r0": 110, "r1": 5} and r.all_finished


def test_simulation_is_deterministic():
    def run():
        w = SkewedWorkload(seed=5, episodes_per_step=32)
        r = run_routing(w, initial_placement(w.agent_names, 2), BalancerConfig(),
                        RoutingConfig(steps=2))
        return r.step_s, r.waits(), [(m.instance, m.src, m.dst, m.at) for m in r.moves], \
            r.tokens_served
    assert run() == run()


def long_tailed_stream(seed: int) -> SkewedWorkload:
    """One agent, one sample per call, lengths lognormal with sigma 1.5 (p99 ~ 33 x median)."""
    return SkewedWorkload(agents=(AgentProfile("a", calls=(4, 8), n=1, max_tokens=1024,
                                               median_tokens=32, sigma=1.5),),
                          rounds=(1, 1), episodes_per_step=32, seed=seed)


def test_least_outstanding_work_beats_round_robin_on_a_long_tailed_stream():
    """4 instances of 4 sequences each, 16 episodes at once: a long sample holds a sequence
    slot for long, round robin keeps sending to an instance that has them, least_loaded sees
    it still busy."""
    config = RoutingConfig(max_num_seqs=4, max_concurrent_episodes=16, steps=2)
    waits, steps = {}, {}
    for strategy in ("round_robin", "least_loaded"):
        waits[strategy], steps[strategy] = [], 0.0
        for seed in range(3):
            r = run_routing(long_tailed_stream(seed), {"a": ["r0", "r1", "r2", "r3"]},
                            BalancerConfig(strategy=strategy), config)
            assert r.all_finished
            waits[strategy] += r.waits()
            steps[strategy] += sum(r.step_s)
    stats = {s: {"p50": percentile(w, 0.5), "p99": percentile(w, 0.99),
                 "mean": sum(w) / len(w), "step_s": steps[s]} for s, w in waits.items()}
    for s, v in stats.items():
        print(f"{s:<13} queue wait p50 {v['p50']:.3f} s  p99 {v['p99']:.3f} s  "
              f"mean {v['mean']:.3f} s  step time {v['step_s']:.1f} s (3 seeds x 2 steps)")
    rr, ll = stats["round_robin"], stats["least_loaded"]
    assert ll["p99"] < 0.8 * rr["p99"]
    assert ll["mean"] < 0.7 * rr["mean"]
    assert ll["step_s"] < rr["step_s"]


def skewed_run(strategy: str, **balance):
    w = SkewedWorkload(seed=0, episodes_per_step=128)
    return run_routing(w, initial_placement(w.agent_names, 4),
                       BalancerConfig(strategy=strategy, **balance),
                       RoutingConfig(max_concurrent_episodes=64, max_num_seqs=16, steps=4))


def test_hierarchical_moves_toward_the_hot_agent_and_loses_nothing():
    r = skewed_run("hierarchical")
    rr = skewed_run("round_robin")
    print(f"hierarchical: {len(r.moves)} moves, step {r.mean_step_s:.1f} s vs round_robin "
          f"{rr.mean_step_s:.1f} s; load ratio {r.load_ratio:.2f} vs {rr.load_ratio:.2f}; "
          + "; ".join(f"{m.instance} {m.src}->{m.dst} at {move_times(m)[0]:.0f} s "
                      f"(loads {m.src_load:.0f}/{m.dst_load:.0f}, drain "
                      f"{m.drain_s:.2f} s + load {m.load_s:.2f} s)" for m in r.moves))
    # Toward the hot agent only, each instance once, never below min_instances, then no more.
    assert r.moves and all((m.src, m.dst) == ("verifier", "solver") for m in r.moves)
    assert len({m.instance for m in r.moves}) == len(r.moves) <= 3
    assert {a: len(v) for a, v in r.placement.items()} == {"solver": 4 + len(r.moves),
                                                           "verifier": 4 - len(r.moves)}
    assert all(m.dst_load > 5 * max(m.src_load, 1.0) for m in r.moves)
    assert r.mean_step_s < rr.mean_step_s and r.load_ratio < rr.load_ratio
    # Nothing lost: every dispatched request finished, the balancer holds none.
    assert r.all_finished and set(r.inflight_at_end.values()) == {0}
    # Each move drained: nothing routed to the instance from plan to done, its earlier
    # requests finished before the weights loaded, later ones are the new agent's. The load
    # takes the cost model's time for the agent's weights.
    assert any(m.drain_s > 0 for m in r.moves)
    eps = 1e-9   # move_times recomputes the instants from the pool's durations
    for m in r.moves:
        planned, drained, done = move_times(m)
        # (the model directory's weights, never synced: host -> device, issue 54's price)
        assert m.load_s == pytest.approx(COSTS.host_load_s(MODEL), rel=REL)
        mine = [q for q in r.requests if q.instance == m.instance]
        assert not [q for q in mine if planned + eps < q.dispatched < done - eps]
        assert all(q.finished <= drained + eps for q in mine if q.dispatched < planned - eps)
        assert all(q.agent == m.dst for q in mine if q.dispatched >= done - eps)


def two_phase_workload(hot_calls: int, seed: int) -> SkewedWorkload:
    """Episodes of `hot_calls` calls of one agent, then one of another, all alike: the hot
    agent's demand is hot_calls x the cold one's, in phases (every step starts hot). Calls
    are short (16 tokens median: ~0.4 s on the 14b model), so a step's opening phase, when
    only the hot agent has calls, lasts a few checks, not a demand window: what the balancer
    sees is the sustained demand the tests are about."""
    profile = dict(n=1, max_tokens=64, median_tokens=16, sigma=0.5)
    return SkewedWorkload(agents=(AgentProfile("hot", calls=(hot_calls, hot_calls), **profile),
                                  AgentProfile("cold", calls=(1, 1), **profile)),
                          rounds=(1, 1), episodes_per_step=128, seed=seed)


def phase_run(hot_calls: int, seed: int, steps: int = 4):
    return run_routing(two_phase_workload(hot_calls, seed), initial_placement(["hot", "cold"], 4),
                       BalancerConfig(strategy="hierarchical"),
                       RoutingConfig(max_concurrent_episodes=32, max_num_seqs=16, steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_hierarchical_stops_under_the_ratio_and_does_not_flap(seed):
    """Demand 6:1 on 4 + 4 instances: moves go to the hot agent until its load per instance is
    under 5x the cold one's, well before the cold agent is down to one instance; none back."""
    r = phase_run(6, seed, steps=8)
    print(f"seed {seed}: moves " + ", ".join(f"{m.src}->{m.dst} at {move_times(m)[0]:.0f} s"
                                             for m in r.moves)
          + f"; run {r.makespan_s:.0f} s")
    assert r.moves and all((m.src, m.dst) == ("cold", "hot") for m in r.moves)
    assert len({m.instance for m in r.moves}) == len(r.moves)
    assert len(r.placement["cold"]) >= 2                  # stopped by the ratio, not the floor
    # It settled under the ratio: over the last 60% of the run the hot agent's load per
    # instance is under 5x the cold one's. (A move's load is the model directory's weights
    # host -> device since issue 54, 0.59 s here against 0.33 s over two rails before: seed 1's
    # second move pays only at 129 s of 137 s, seed 0's at 38 s; before issue 54, 45 s.)
    after = r.samples[int(0.4 * len(r.samples)):]
    mean = {a: sum(c.loads[a] for c in after) / len(after) for a in ("hot", "cold")}
    assert mean["hot"] < 5.0 * mean["cold"]
    assert r.all_finished


@pytest.mark.parametrize("seed", [0, 1])
def test_demand_under_the_ratio_moves_nothing(seed):
    r = phase_run(2, seed)                                # demand 2:1, ratio 5
    assert r.moves == [], [(m.instance, m.src, m.dst, m.at) for m in r.moves]
