"""Exact measures of LLM agents playing a small OpenSpiel game: policy tables, NashConv,
cross-play and ratings.

    Analysis.measure(agents, generate)      (the run: starting and final weights)
      every information state of the game (open_spiel TabularPolicy: one state each)
        ─► the prompt its player would get (SpielRules.prompt) + each reply that names a legal
           action (reply_forms: "[Bet]...", "Bet", "Bet." and their lower case) ─►
           generate(agent, Generate(prompt_logprobs=True, max_tokens=1))
        ─► log p(that reply | the prompt): the last tokens' prompt logprobs, the forms of an
           action added up
        ─► the tables: `chosen`, each action's share of the legal replies' probability
           (temperature 1: the model's own distribution); `played`, that mixed with the
           uniform random action the game plays for a seat whose replies all name none
           (openspiel.play's rule); `legal_mass`, the legal replies' total (how often a reply
           names a legal action in one of those forms: what training against rejections
           raises)
      ─► open_spiel exploitability.nash_conv of each agent in every seat (as played, and as
         chosen), and of the team
         (each seat its own agent): 0 is a Nash equilibrium, uniform random play is 0.917 in
         Kuhn Poker and 4.747 in Leduc Poker
    cross_play(game, tables)               (flexmarl eval --cross-play)
      every pair of policies, seat-balanced: the exact expected return of each against each
      (expected_game_score.policy_value), the share of duplicate matches won over sampled
      deals (each deal in every seat, won by the side whose returns beat the other's in the
      same games) and openskill ratings
      (Plackett-Luce, a match at a time) from those same matches

Below the teams of openspiel.py (which imports this module, never the other way): what a
player knows (state_text), a deal's chance outcomes (deal, chance) and a seat played from a
table (TablePlayer).

Why the likelihood and not samples: it is exact for the model (no sampling noise, which would
add its own exploitability: a table estimated from k samples per state is off by about
1/sqrt(k) in every state), costs one prompt pass per (state, action) where sampling costs many,
and is the same number on any machine. What it leaves out: replies that begin otherwise and
name an action at their first bracket ("I bet. [Bet]"), which the game's parser accepts; their
share is inside 1 - legal_mass (the played table counts them as rejected). Counting "[Bet]"
alone was not enough: a Kuhn player that had learnt to answer "Pass." and nothing else
(always pass: NashConv 2.0) measured legal mass 0, hence uniform play, 0.917.
"""
from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from flexmarl.envs import require
from flexmarl.protocol import Generate, SamplingParams

MAX_EXACT_STATES = 5000
"""Games with at most this many information states get their tables by default (Kuhn 12,
Leduc 936): one prompt pass per (state, action)."""
MAX_PASSES_AT_ONCE = 32


def state_text(state: Any, player: int) -> str:
    """What `player` knows: the information-state string, else the observation string."""
    kind = state.get_game().get_type()
    if kind.provides_information_state_string:
        return state.information_state_string(player)
    if kind.provides_observation_string:
        return state.observation_string(player)
    raise ValueError(f"{kind.short_name}: has neither an information-state nor an observation "
                     "string; give openspiel_team a describe(state, player)")


def deal(seed: int) -> random.Random:
    """The generator of a deal's chance outcomes: its seed alone, so every seating of the
    deal sees the same cards for as long as the chance nodes come in the same order."""
    return random.Random(seed)


def chance(state: Any, rng: random.Random) -> int:
    """A chance outcome drawn with its probability."""
    outcomes = state.chance_outcomes()
    x, total = rng.random(), 0.0
    for action, p in outcomes:
        total += p
        if x < total:
            return action
    return outcomes[-1][0]


class TablePlayer:
    """A seat played from a policy table (a past version of an agent: policy_tables.PastPool)."""

    def __init__(self, name: str, table: Any) -> None:
        self.name, self.table = name, table

    def act(self, state: Any, rng: random.Random) -> int:
        probs = self.table.action_probabilities(state)
        actions = list(probs)
        return rng.choices(actions, [probs[a] for a in actions])[0]

    def __repr__(self) -> str:
        return f"TablePlayer({self.name})"


def count_infostates(game: Any, stop_after: int = MAX_EXACT_STATES,
                     max_histories: int = 200_000) -> int:
    """The number of decision information states, walking the tree; stop_after + 1 as soon as
    it is over `stop_after`, or once it has walked `max_histories` histories (a big game stops
    early instead of enumerating its whole tree)."""
    seen: set[tuple[int, str]] = set()
    stack, histories = [game.new_initial_state()], 0
    while stack:
        state = stack.pop()
        histories += 1
        if histories > max_histories:
            return stop_after + 1
        if state.is_terminal():
            continue
        if not state.is_chance_node():
            p = state.current_player()
            seen.add((p, state_text(state, p)))
            if len(seen) > stop_after:
                return stop_after + 1
        stack.extend(state.child(a) for a in state.legal_actions())
    return len(seen)


def uniform(game: Any) -> Any:
    """A tabular policy playing every legal action alike."""
    return require("open_spiel.python.policy", "open_spiel").TabularPolicy(game)


def nash_conv(game: Any, table: Any) -> float:
    """OpenSpiel's NashConv: what best responses gain against `table`, summed over players."""
    exploitability = require("open_spiel.python.algorithms.exploitability", "open_spiel")
    return float(exploitability.nash_conv(game, table))


def nash(game: Any, iterations: int = 2000, target: float = 1e-3) -> tuple[Any, float]:
    """An approximate Nash equilibrium of a two-player zero-sum game (CFR+, until its NashConv
    is under `target` or after `iterations`), and its NashConv."""
    cfr = require("open_spiel.python.algorithms.cfr", "open_spiel")
    solver = cfr.CFRPlusSolver(game)
    value = math.inf
    for i in range(1, iterations + 1):
        solver.evaluate_and_update_policy()
        if i % 100 == 0 or i == iterations:
            value = nash_conv(game, solver.average_policy())
            if value < target:
                break
    average = solver.average_policy()
    table = uniform(game)
    for key, row in table.state_lookup.items():
        state = table.states[row]
        probs = average.action_probabilities(state)
        table.action_probability_array[row] = [probs.get(a, 0.0) for a in
                                               range(game.num_distinct_actions())]
    return table, value


def reply_forms(name: str, names: Any) -> list[tuple[str, bool]]:
    """The replies that name action `name` as openspiel.parse reads them, each (text, whether
    it is the whole reply: its end of sequence follows): "[Name]" and what may follow it,
    "Name" and "Name." alone, and the same in lower case where no other action's name is
    that one ignoring case. Disjoint, so their probabilities add up (a lower bound of the
    probability that a reply plays the action: "[ Name ]", "I bet. [Bet]" and other token
    paths to the same text are left out)."""
    forms = [(f"[{name}]", False), (name, True), (f"{name}.", True)]
    low = name.lower()
    if low != name and sum(n.strip().casefold() == name.strip().casefold() for n in names) == 1:
        forms += [(f"[{low}]", False), (low, True), (f"{low}.", True)]
    return forms


class Analysis:
    """The exact measures of one OpenSpiel team (Team.analysis): `rules` (SpielRules), its
    agents' specs and the seats' players."""

    def __init__(self, rules: Any, specs: dict[str, Any], seats: list[str]) -> None:
        self.rules, self.specs, self.seats = rules, specs, list(seats)
        self.game = rules.loaded
        self.pool: PastPool | None = None
        """Past versions as training opponents (openspiel_team(train_opponents={"past": w}));
        the run keeps it filled (PastPool.refresh)."""

    async def table(self, runtime: Any, generate: Any, tag: str = "",
                    versions: set[int] | None = None) -> tuple[Any, Any, float]:
        """The agent's policy tables and its legal_mass (the mean over states of the
        probability of a reply naming a legal action, reply_forms): `chosen`, each action's share of
        the legal replies' probability (what the model picks when it answers in form), and
        `played`, what it plays under the game's rule for replies that name no legal action
        (asked again `retries` times, then a random legal action: at a state where a legal
        reply has probability m, chosen mixed with uniform by (1 - m)^(retries + 1)).
        `versions`, if given, gets the policy versions that answered."""
        table = uniform(self.game)
        name = runtime.spec.name
        calls = asyncio.Semaphore(MAX_PASSES_AT_ONCE)
        versions = versions if versions is not None else set()

        eos = getattr(runtime.tokenizer, "eos_token_id", None)

        async def logp(row: int, action: int, form: int, prompt_ids: list[int], text: str,
                       complete: bool) -> float:
            tail = runtime.tokenizer.encode(text, add_special_tokens=False)
            tail = tail + [eos] if complete else tail
            request = Generate(f"policy/{tag}{name}/{row}/{action}/{form}",
                               prompt_ids=prompt_ids + tail,
                               params=SamplingParams(max_tokens=1, temperature=0.0,
                                                     prompt_logprobs=True))
            async with calls:
                reply = await generate(name, request)
            versions.add(reply.version)
            got = reply.prompt_logprobs or []
            if len(got) < len(tail):
                raise RuntimeError(f"agent {name}: the engine returned {len(got)} prompt "
                                   f"logprobs for a reply of {len(tail)} tokens")
            value = float(sum(got[-len(tail):]))
            if math.isnan(value) or value > 0:
                raise RuntimeError(f"agent {name}: a log-probability of {value} from the "
                                   "engine (NaN or above 0)")
            return value

        jobs, rows = [], []
        for row, state in enumerate(table.states):
            player = state.current_player()
            messages, names = self.rules.prompt(state, player)
            prompt_ids = runtime.encode(messages)
            for action, text in names.items():
                for form, (reply, complete) in enumerate(reply_forms(text, names.values())):
                    if complete and eos is None:
                        continue
                    jobs.append(logp(row, action, form, prompt_ids, reply, complete))
                    rows.append((row, action))
        values = await asyncio.gather(*jobs)
        by_row: dict[int, dict[int, float]] = {}
        for (row, action), value in zip(rows, values):  # the forms' probabilities added up
            have = by_row.setdefault(row, {}).get(action, -math.inf)
            top = max(have, value)
            by_row[row][action] = top if top == -math.inf else top + math.log(
                math.exp(have - top) + math.exp(value - top))
        played = uniform(self.game)
        masses = []
        for row, lps in by_row.items():
            top = max(lps.values())
            weights = ({a: math.exp(v - top) for a, v in lps.items()} if top > -math.inf
                       else dict.fromkeys(lps, 1.0))  # no legal reply at all: uniform
            total = sum(weights.values())
            mass = min(1.0, sum(math.exp(v) for v in lps.values()))
            # In play a reply that names no legal action is asked again `retries` times, then
            # a uniformly random legal action is played: all fail with (1 - mass)^(retries+1).
            fallback = (1.0 - mass) ** (self.rules.retries + 1)
            table.action_probability_array[row] = 0.0
            played.action_probability_array[row] = 0.0
            for a, w in weights.items():
                table.action_probability_array[row, a] = w / total
                played.action_probability_array[row, a] = ((1 - fallback) * w / total
                                                           + fallback / len(weights))
            masses.append(mass)
        return table, played, sum(masses) / max(len(masses), 1)

    def profile(self, tables: dict[str, Any]) -> Any:
        """The team's own profile: each seat's information states from its player's table
        (a random seat's: uniform)."""
        out = uniform(self.game)
        for key, row in out.state_lookup.items():
            player = out.states[row].current_player()
            who = self.seats[player]
            if who in tables:
                out.action_probability_array[row] = tables[who].action_probability_array[row]
        return out

    async def measure(self, agents: dict[str, Any], generate: Any, tag: str = ""
                      ) -> dict[str, Any]:
        """Each agent's tables, legal_mass and NashConv (the agent in every seat): `nash_conv`
        of the policy it plays (`table`), `nash_conv_chosen` of its choice among legal replies
        (`chosen`); the team's NashConv (each seat its own player, as played); the uniform
        policy's NashConv beside them, for scale."""
        names = [n for n in dict.fromkeys(self.seats) if n in agents]
        made = await asyncio.gather(*(self.table(agents[n], generate, tag) for n in names))
        tables = {n: played for n, (_, played, _) in zip(names, made)}
        out: dict[str, Any] = {
            "game": self.rules.game, "method": "likelihood (temperature 1)",
            "uniform_nash_conv": nash_conv(self.game, uniform(self.game)),
            "team_nash_conv": nash_conv(self.game, self.profile(tables)), "agents": {}}
        for n, (chosen, played, mass) in zip(names, made):
            out["agents"][n] = {"nash_conv": nash_conv(self.game, played),
                                "nash_conv_chosen": nash_conv(self.game, chosen),
                                "legal_mass": mass, "table": as_dict(played),
                                "chosen": as_dict(chosen)}
            sampling = getattr(agents[n].spec, "sampling", None)
            if sampling is not None and (sampling.temperature != 1.0 or sampling.top_p < 1.0
                                         or sampling.top_k > 0):
                out["agents"][n]["note"] = (
                    f"the table is the model's distribution at temperature 1; this agent "
                    f"samples at temperature {sampling.temperature}, top_p {sampling.top_p}, "
                    f"top_k {sampling.top_k}, so its play differs from the table")
        return out


class PastPool:
    """Past versions of the learners as policy tables, for training games against them: a
    snapshot of each agent's played table every `every` versions its instances serve (the
    first: its starting weights), the newest `keep` kept. The run calls refresh() between its
    steps' work (launch.run), `pick` draws one for a game."""

    def __init__(self, analysis: Analysis, agents: list[str], every: int, keep: int) -> None:
        self.analysis, self.agents, self.every, self.keep = analysis, list(agents), every, keep
        self.tables: dict[str, list[tuple[int, Any]]] = {a: [] for a in self.agents}
        self._last: dict[str, int] = {}

    async def refresh(self, agents: dict[str, Any], generate: Any) -> list[tuple[str, int]]:
        """Snapshot the agents whose served version is `every` past their last snapshot;
        the (agent, version) pairs added. A table whose requests met two versions (a weight
        sync midway) is measured again."""
        added = []
        for name in self.agents:
            version = agents[name].version
            if name in self._last and version - self._last[name] < self.every:
                continue
            for _ in range(3):
                served: set[int] = set()
                _, played, _ = await self.analysis.table(agents[name], generate,
                                                         f"past/{version}/", served)
                if len(served) == 1:
                    break
                version = agents[name].version
            else:
                continue  # weights kept changing under it: the next refresh tries again
            [version] = served
            if name in self._last and version <= self._last[name]:
                continue  # the instances still serve the last snapshot's weights
            self.tables[name] = (self.tables[name] + [(version, played)])[-self.keep:]
            self._last[name] = version
            added.append((name, version))
        return added

    def pick(self, agent: str, rng: random.Random) -> Any:
        """A past version of `agent` (uniformly among the pool's), as a TablePlayer; None
        while the pool has none."""
        if not self.tables.get(agent):
            return None
        version, table = rng.choice(self.tables[agent])
        return TablePlayer(f"{agent}@v{version}", table)


def as_dict(table: Any) -> dict[str, list[float]]:
    """A table as {information state: [probability of each legal action, in action order]}."""
    out = {}
    for key, row in table.state_lookup.items():
        mask = table.legal_actions_mask[row]
        out[key] = [round(float(p), 6) for p, ok in zip(table.action_probability_array[row],
                                                          mask) if ok]
    return out


def _sample_game(game: Any, lineup: list[Any], seed: int, rng: random.Random) -> list[float]:
    """One game of `lineup` (a table per seat) on deal `seed`; its returns."""
    state, dealer = game.new_initial_state(), deal(seed)
    while not state.is_terminal():
        if state.is_chance_node():
            state.apply_action(chance(state, dealer))
            continue
        probs = lineup[state.current_player()].action_probabilities(state)
        actions = list(probs)
        state.apply_action(rng.choices(actions, [probs[a] for a in actions])[0])
    return state.returns()


def cross_play(game: Any, tables: dict[str, Any], *, deals: int = 200, seed: int = 1_000_000
               ) -> dict[str, Any]:
    """Every ordered pair (A, B) of `tables` (name -> a policy for every seat), seat-balanced:
    `payoff[A][B]` A's exact expected return with A in one seat and B in the others, averaged
    over A's seats (in a two-player zero-sum game the matrix is antisymmetric; with more
    players, B holds every other seat); `win[A][B]` A's share of `deals` duplicate matches won
    (a draw half), a match being the deal played once with A in each seat, sampled from the
    tables, and won by A when its returns exceed B's in the same games, added up over the
    seats (poker's chips, not its hands: a Nash player wins about half the hands against a
    random one and more chips; in a positive-sum game both scoring is no win; with more than
    two players, from the matches with A alone against B's); `ratings` openskill's
    Plackett-Luce from those same matches, in a shuffled order (mu, sigma and the
    conservative mu - 3 sigma, `ordinal`); `nash_conv` of each table. Nothing depends on the
    order of `tables`: each pair samples from its own generator."""
    egs = require("open_spiel.python.algorithms.expected_game_score", "open_spiel")
    openskill = require("openskill.models", "openskill")
    names = list(tables)
    n = game.num_players()
    payoff = {a: {} for a in names}
    win = {a: {} for a in names}
    model = openskill.PlackettLuce()
    ratings = {a: model.rating(name=a) for a in names}
    games = []
    # Every pair's matches from its own generator, in name order, so that no result depends
    # on the order the tables were given in. With two players a match with A alone in a seat
    # is one with B alone in the other: one direction plays both; with more, both are played.
    ordered = sorted(names)
    for a in ordered:
        for b in ordered:
            if a == b:
                continue
            values = []
            for seat in range(n):
                lineup = [tables[a] if i == seat else tables[b] for i in range(n)]
                values.append(egs.policy_value(game.new_initial_state(), lineup)[seat])
            payoff[a][b] = float(sum(values) / n)
            if n == 2 and b < a:
                continue
            rng = random.Random(f"{seed}/{a}/{b}")
            for k in range(deals):  # a duplicate match: the deal with `a` in every seat
                margin = 0.0  # a's returns less b's, in the same games
                for seat in range(n):
                    lineup = [tables[a] if i == seat else tables[b] for i in range(n)]
                    returns = _sample_game(game, lineup, seed + k, rng)
                    others = [r for i, r in enumerate(returns) if i != seat]
                    margin += returns[seat] - sum(others) / len(others)
                games.append((a, b, "win" if margin > 0 else "loss" if margin < 0 else "draw"))
    score: dict[tuple[str, str], list[float]] = {}
    random.Random(seed).shuffle(games)  # ratings depend on the order of games: no pair first
    for a, b, result in games:
        value = {"win": 1.0, "draw": 0.5, "loss": 0.0}[result]
        score.setdefault((a, b), []).append(value)
        if n == 2:  # the same match, seen from b
            score.setdefault((b, a), []).append(1.0 - value)
        ranks = {"win": [1, 2], "draw": [1, 1], "loss": [2, 1]}[result]
        [[ra], [rb]] = model.rate([[ratings[a]], [ratings[b]]], ranks=ranks)
        ratings[a], ratings[b] = ra, rb
    for a in names:
        for b in names:
            if a != b:
                got = score.get((a, b))
                win[a][b] = sum(got) / len(got) if got else None
    return {"policies": names, "payoff": payoff, "win": win, "deals": deals,
            "ratings": {a: {"mu": r.mu, "sigma": r.sigma, "ordinal": r.ordinal()}
                        for a, r in ratings.items()},
            "nash_conv": {a: nash_conv(game, t) for a, t in tables.items()}}


__all__ = ["Analysis", "MAX_EXACT_STATES", "PastPool", "TablePlayer", "as_dict", "chance",
           "count_infostates", "cross_play", "deal", "nash", "nash_conv", "reply_forms",
           "state_text", "uniform"]
