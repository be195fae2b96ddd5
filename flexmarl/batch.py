"""Turn generated samples into a trainer micro-batch (right-padded token rows and masks)."""
from __future__ import annotations

from typing import Sequence

import torch

from flexmarl.protocol import TrainMicroBatch


def micro_batch(rows: Sequence[tuple[list[int], list[int], list[float]]],
                advantages: Sequence[float], *, pad_id: int = 0) -> TrainMicroBatch:
    """One row per (prompt_ids, response_ids, response_logprobs), with its advantage.

    old_logprobs[b, t] is the behaviour log-probability of input_ids[b, t]; only response
    positions are trained (response_mask), prompt and padding positions hold 0.
    """
    if len(rows) != len(advantages) or not rows:
        raise ValueError(f"micro_batch needs one advantage per row, got {len(rows)} rows and "
                         f"{len(advantages)} advantages")
    width = max(len(p) + len(r) for p, r, _ in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros(n, width)
    response = torch.zeros(n, width)
    old = torch.zeros(n, width)
    for b, (prompt, resp, logprobs) in enumerate(rows):
        if len(resp) != len(logprobs):
            raise ValueError(f"row {b}: {len(resp)} response tokens but {len(logprobs)} logprobs")
        p, r = len(prompt), len(resp)
        input_ids[b, :p + r] = torch.tensor(prompt + resp, dtype=torch.long)
        attention[b, :p + r] = 1
        response[b, p:p + r] = 1
        old[b, p:p + r] = torch.tensor(logprobs)
    return TrainMicroBatch(input_ids, attention, response, old,
                           torch.tensor(list(advantages), dtype=torch.float32))
