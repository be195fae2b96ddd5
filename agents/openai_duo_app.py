"""An ordinary multi-agent app on the official `openai` client: a solver and a checker talk.

For each addition problem the solver proposes an answer; the checker, shown the problem and the
proposal, answers with its own sum; the episode's team reward is whether the solver was right,
and each agent is rewarded for its own correctness. Nothing here imports FlexMARL: the app reads
OPENAI_BASE_URL / OPENAI_API_KEY like any OpenAI app, and talks to FlexMARL's gateway only
through two extras, an episode id header and a reward POST:

    X-Episode-Id: "<problem>/<k>"          the k-th attempt at one problem: GRPO compares them
    POST {base}/episodes/<id>/reward       {"team": r, "agents": {"solver": r1, "checker": r2}}
    POST {base}/episodes/<id>/end

It runs until it is stopped (`flexmarl run --set gateway.app=...` stops it at the end). With
`--heldout` it plays held-out problems instead (another seed, none of them a training problem's
pair, one episode each): `flexmarl eval RUN_DIR` starts it as gateway.eval_app and scores its
first episodes (agents/openai_duo.py's heldout=N).
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import sys

import httpx
from openai import AsyncOpenAI

NUMBER = re.compile(r"-?[0-9]+")


def number(text: str) -> str | None:
    m = NUMBER.search(text)
    return m.group() if m else None


async def episode(client: AsyncOpenAI, http: httpx.AsyncClient, eid: str, a: int, b: int
                  ) -> float:
    headers = {"X-Episode-Id": eid}
    question = f"Compute {a}+{b}."
    proposal = await client.chat.completions.create(
        model="solver", messages=[{"role": "user", "content": question}],
        max_tokens=8, extra_headers=headers)
    guess = proposal.choices[0].message.content or ""
    check = await client.chat.completions.create(
        model="checker", messages=[{"role": "user", "content": question}],
        max_tokens=8, extra_headers=headers)
    verdict = check.choices[0].message.content or ""
    right = str(a + b)
    solver_ok = float(number(guess) == right)
    checker_ok = float(number(verdict) == right)
    await http.post(f"episodes/{eid}/reward", json={
        "team": solver_ok, "agents": {"solver": solver_ok, "checker": checker_ok}})
    await http.post(f"episodes/{eid}/end")
    return solver_ok


HELDOUT_SEED = 1_000_000


def is_heldout(a: int, b: int) -> bool:
    """About 1 pair in 10, by a hash of the pair: held-out problems are never trained on."""
    return random.Random(a * 100 + b).random() < 0.1


def problem_pair(rng: random.Random, heldout: bool) -> tuple[int, int]:
    while True:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        if is_heldout(a, b) == heldout:
            return a, b


async def main() -> None:
    heldout = "--heldout" in sys.argv[1:]
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/") + "/"
    key = os.environ.get("OPENAI_API_KEY", "flexmarl")
    client = AsyncOpenAI(base_url=base, api_key=key)
    rng = random.Random(HELDOUT_SEED if heldout else 0)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"},
                                 timeout=None) as http:
        status = (await http.get("flexmarl/status")).json()
        # Episodes per problem, compared by GRPO; a held-out problem is played once.
        attempts = 1 if heldout else status["trajectories_per_task"]
        problem = 0
        while True:  # a few problems at a time, each attempted `attempts` times
            batch = []
            for _ in range(4):
                a, b = problem_pair(rng, heldout)
                batch += [episode(client, http, f"{'h' if heldout else 'p'}{problem}/{k}", a, b)
                          for k in range(attempts)]
                problem += 1
            rewards = await asyncio.gather(*batch)
            print(f"app: {problem} problems, solver right {sum(rewards) / len(rewards):.2f} "
                  "in the last batch", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
