"""FlexMARL's message kinds: one number per message of flexmarl.protocol (100 and up)."""
from __future__ import annotations

from enum import IntEnum


class FlexKind(IntEnum):
    """Wire constants: never renumber, only append."""

    GENERATE = 100
    GENERATE_REPLY = 101
    SUBSCRIBE_LOAD = 102
    LOAD_REPORT = 103
    WEIGHT_UPDATE = 104
    WEIGHT_UPDATE_DONE = 105
    TRAIN_BEGIN_BATCH = 110
    TRAIN_MICRO_BATCH = 111
    TRAIN_STATS = 112
    TRAIN_STEP = 113
    TRAIN_STEP_DONE = 114
    EXPORT_WEIGHTS = 115
    # 116, 117: the retired Offload/Onload (one swap path: SwapOut/SwapIn); not reused
    SWAP_DONE = 118
    SWAP_IN = 119
    SWAP_OUT = 120
    TRAIN_STATE = 121
    EXPORT_STATE = 122
    PARKED = 123
    FETCH_SHARDS = 124
    SHARD_DATA = 125
    DROP_PARKED = 126
    WEIGHT_TRANSFER = 127
    SEND_WEIGHTS = 128
    SLOT_STATUS = 129
    SLOT_STATUS_REPLY = 130
    SAVE_STATE = 131
    AWAIT_SAVED = 133
    STATE_SAVED = 134  # (132: a staged-state reply, folded into this one; not reused)
    SLEEP = 135
    WAKE_UP = 136
    ENGINE_MEMORY = 137
    FETCH_WEIGHTS = 138
