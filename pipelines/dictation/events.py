"""What a dictation session says: Partial, Final and State events (times are audio time, in seconds)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Partial:
    text: str                # the whole current hypothesis of the open utterance
    stable: str              # its prefix two consecutive decodes agreed on
    at: float = 0.0          # audio time when it was emitted
    type: str = field(default="partial", init=False)


@dataclass(frozen=True)
class Final:
    text: str
    start: float             # audio time the speech started
    end: float               # audio time the speech ended
    at: float = 0.0          # audio time when it was emitted; at - end is the latency
    type: str = field(default="final", init=False)

    @property
    def latency(self) -> float:
        return self.at - self.end


@dataclass(frozen=True)
class State:
    state: str               # loading | warming | ready | listening | stopped
    type: str = field(default="state", init=False)


Event = Union[Partial, Final, State]
