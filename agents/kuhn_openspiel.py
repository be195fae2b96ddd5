"""Kuhn Poker as OpenSpiel plays it: two SmolLM2-135M-Instruct players, each its own model,
trained against each other, measured seat-balanced against their frozen starts and exactly:
each player's policy table and its NashConv (OpenSpiel's exploitability), before and after.

    seat 0 ─► agent "p0" (its own SmolLM2-135M-Instruct, rollout instance and trainer)
    seat 1 ─► agent "p1"
    OpenSpiel's kuhn_poker deals (J < Q < K, one card each, ante 1), checks every move and
    pays the returns: +-1 for a hand decided without a bet called, +-2 with one

The prompt says, in words, what the player knows (OpenSpiel's information state "1pb": the
card Q, the opponent checked then bet); the legal actions are OpenSpiel's own names ("[Pass]",
"[Bet]"). A reply that names no legal action is asked again once, then a random legal action is
played for it; the rejected reply is rewarded -2, the game's lowest return (flexmarl.envs.openspiel).

Training opponents (openspiel_team's train_opponents): in each task one player keeps its seat and
the other seat is, by equal weights, the other player as it is now, one of its past versions
(a policy table snapshotted every 5 versions) or the random player. Against a co-player alone, a
first try here stalled: p1 learnt to move validly and bet first, p0's moves then all lost or were
rejected alike (-1 either way, before rejected replies got the lowest return), and p0 had no
learning signal for 15 steps in a row.

Held out: each player against its frozen starting model ("start") and a uniformly random
player ("random"), 400 and 50 deals on seeds never trained on, each deal played in both seats.
eval.json "policies": each player's table before and after (its likelihood of "[Pass]" and
"[Bet]" at each of Kuhn's 12 information states) and NashConv (uniform random 0.917, Nash 0).

    flexmarl run --team agents/kuhn_openspiel.py   # sampled held-out play only (`config`)
    flexmarl eval RUN_DIR --cross-play       # start / saved / final / random / Nash, rated

Needs the `envs` extra (open_spiel, openskill) and the `pretrained` one (`make setup`).
"""
from __future__ import annotations

from flexmarl import AgentSpec, SamplingParams
from flexmarl.envs.openspiel import openspiel_team

TRAIN_LAYERS = 6
LEARNING_RATE = 1e-4
SAMPLING = SamplingParams(temperature=1.0, max_tokens=8)
"""An action is a few tokens ("[Bet]"); temperature 1: the table measures the model's own
distribution (policy_tables), the one sampled in play."""
EVAL_GAMES = {"start": 400, "random": 50}
CARDS = "JQK"


def describe(state, player: int) -> str:
    """Kuhn Poker's information state in words: the player's card and the betting so far."""
    info = state.information_state_string(player)
    card, history = CARDS[int(info[0])], info[1:]
    said = {"p": "checked", "b": "bet"}
    if not history:
        moves = "No one has acted yet: you act first."
    else:
        moves = "So far: " + ", then ".join(f"player {i % 2} {said[c]}"
                                            for i, c in enumerate(history)) + "."
        if history.endswith("b"):
            moves += " Pass folds (you lose your ante); Bet calls."
    return ("Kuhn Poker: a deck of J < Q < K, each player antes 1 chip and gets one card; "
            "Bet adds 1 chip. The higher card wins the pot at showdown.\n"
            f"Your card: {card}. {moves}")


config = {"run": {"name": "kuhn_openspiel"}, "eval": {"modes": ["sampled"]}}
"""The recommended run (flexmarl.team.load_team reads a team file's `config`): greedy play of
the untrained model is one fixed answer."""

team = openspiel_team(
    "kuhn_poker",
    players=[AgentSpec(name=name, model="smollm2-135m", train_layers=TRAIN_LAYERS,
                       lr=LEARNING_RATE, sampling=SAMPLING) for name in ("p0", "p1")],
    name="kuhn_openspiel",
    eval_games=EVAL_GAMES,
    describe=describe,
    train_opponents={"self": 1, "past": 1, "random": 1},
)
