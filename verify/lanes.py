"""The contract for a batch's lanes: drafters of one draft model that propose together (`DraftLanes`), how the
decoding loop finds them (`lane_groups`), and what a drafter compiles while a batch's lanes are being reset
(`forming_lanes`). Owned by verify/ like verify/contract.py; drafters/lanes.py implements it."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Protocol, Sequence

from draftkit.verify.contract import DecodeState, DraftTree


class DraftLanes(Protocol):
    """Optional, for the lanes of one batch: several drafters of one draft model proposing together.

    A drafter class that can draft several lanes at once offers `draft_lanes(drafters) -> DraftLanes | None`
    (a classmethod; None: these drafters cannot, for example drafts of different models). The decoding loop
    asks it once per batch, after every lane's `reset`, for the drafters of the batch's lanes that share a
    class; the group then proposes for those of them that draft in a step, one draft forward per level for
    all of them, instead of one forward per lane. `update` stays each drafter's own; the next `reset` of a
    drafter leaves its group."""

    def propose(self, states: "list[DecodeState | None]") -> list[DraftTree]:
        """One tree per drafter of the group, in the group's order; a None state asks for no tree."""


_FORMING_LANES = contextvars.ContextVar("draftkit_forming_lanes", default=False)


@contextlib.contextmanager
def forming_lanes(on: bool = True):
    """The decoding loop resets a batch's drafters inside this. A drafter that compiles its own (one-lane) draft
    forwards when given a prompt (compile_draft) leaves that to `warm()` in here: a lane that joins a group drafts
    with the group's graphs, and each lane's one-lane graphs, compiled for a buffer of its own prompt's size, went
    unused. The loop calls `warm()` on the drafters no group took, before any step is timed."""
    token = _FORMING_LANES.set(on)
    try:
        yield
    finally:
        _FORMING_LANES.reset(token)


def lanes_forming() -> bool:
    """A batch's drafters are being reset (`forming_lanes`): compile nothing for one lane now."""
    return _FORMING_LANES.get()


def lane_groups(drafters: Sequence) -> list[tuple[list[int], DraftLanes]]:
    """(lane indices, group) for every set of two or more drafters of one class that can draft together."""
    by_class: dict[type, list[int]] = {}
    for i, d in enumerate(drafters):
        if getattr(type(d), "draft_lanes", None) is not None:
            by_class.setdefault(type(d), []).append(i)
    out = []
    for cls, idx in by_class.items():
        group = cls.draft_lanes([drafters[i] for i in idx]) if len(idx) > 1 else None
        if group is not None:
            out.append((idx, group))
    return out


def reset_lanes(drafters: Sequence, prompts: Sequence) -> list[tuple[list[int], DraftLanes]]:
    """Each drafter reset for its prompt, and the batch's groups (`lane_groups`). In a batch the resets compile no
    one-lane graphs (`forming_lanes`); the drafters no group took draft alone and compile theirs now (`warm()`),
    before any step is timed."""
    batch = len(drafters) > 1
    with forming_lanes(batch):
        for d, p in zip(drafters, prompts):
            d.reset(p)
    groups = lane_groups(drafters)
    grouped = {i for idx, _ in groups for i in idx}
    for i, d in enumerate(drafters):
        if batch and i not in grouped and hasattr(d, "warm"):
            d.warm()
    return groups
