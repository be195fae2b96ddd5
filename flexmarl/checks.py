"""What every config section's validation shares: ConfigError, `require`, CPU core lists;
RequestError, for a call its caller can fix; and InvariantError, for a broken internal
guarantee.

Kept free of other imports so any component's config (beside the component) can use it.
"""
from __future__ import annotations

import os


class ConfigError(ValueError):
    """A config problem the user can fix; the message names `section.key` and the fix."""


class RequestError(ValueError):
    """A generate() call its caller can fix: a prompt out of the vocabulary or too long for
    the context, max_tokens past what is left of it. Refused where the call enters, before
    any engine sees it; the gateway answers 400 invalid_request_error naming `param`."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class InvariantError(RuntimeError):
    """A guarantee FlexMARL makes was broken: a bug, not bad input. Checked with `if`/`raise`,
    never `assert`, so that it holds under `python -O` too."""


def require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{name} {rule}, got {value!r}")



def parse_cpus(spec: str, name: str = "cpus") -> tuple[int, ...]:
    """ "0", "0,2", "0-3" or "0-1,4" as sorted core ids; "" is () (no pinning). "auto" is
    resolved by `role_cpus`, here it is ()."""
    if not spec.strip() or spec.strip() == "auto":
        return ()
    try:
        ids = parse_ranges(spec)
    except ValueError:
        raise ConfigError(f"{name} must list CPU cores like \"0\", \"0,2\" or \"0-3\", got "
                          f"{spec!r}") from None
    available = available_cpus()
    if available is not None and not ids <= set(available):
        raise ConfigError(f"{name} = {spec!r} names cores {sorted(ids - set(available))} that "
                          f"this process cannot use (available: {available})")
    return tuple(sorted(ids))


def parse_ranges(spec: str) -> set[int]:
    """ "0", "0,2", "0-3" or "0-1,4" as a set of ids; ValueError if it is none of these (the
    caller says which setting, for which kind of id)."""
    ids: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad range {part!r}")
        ids.update(range(first, last + 1))
    return ids


def available_cpus() -> list[int] | None:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
