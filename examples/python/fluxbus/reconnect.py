"""Reconnection: the policy (:class:`Reconnect`) and the events a UI can show (:class:`ConnectionEvent`).

Clients and stores reconnect by themselves (SPEC §15.5) when their connection ends without them closing it: the
socket dropped, fluxd said ``bye`` (``shutdown``, ``restart``) or closed the connection with a fatal error. They
wait ``initial_delay`` (50 ms) before the first attempt, then twice as long after each failed one, up to
``max_delay`` (2 s), each delay shaken by ``jitter`` so that many peers do not come back in step.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union


@dataclass(frozen=True)
class Reconnect:
    """How a client or store reconnects. ``Reconnect()`` is the default; ``Reconnect(enabled=False)`` (or
    ``reconnect=False`` wherever a policy is taken) turns reconnection off: the first lost connection ends the
    client, as in fluxbus 0.2.

    - ``initial_delay`` (s): the wait before the first attempt; each further attempt waits ``factor`` times
      longer, at most ``max_delay``;
    - ``jitter``: each wait is multiplied by a random factor between ``1 - jitter`` and ``1 + jitter`` (never
      above ``max_delay``);
    - ``max_attempts``: give up after this many failed attempts in a row (``None``: never);
    - ``give_up_after`` (s): give up when the next attempt would start this long after the connection was lost
      (``None``: never);
    - ``handshake_timeout`` (s): how long one attempt may take to connect and get fluxd's ``welcome``.

    Giving up closes the client: calls raise :class:`~fluxbus.errors.Disconnected` (``gave up reconnecting``)."""

    enabled: bool = True
    initial_delay: float = 0.05
    max_delay: float = 2.0
    factor: float = 2.0
    jitter: float = 0.2
    max_attempts: Optional[int] = None
    give_up_after: Optional[float] = None
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.initial_delay < 0 or self.max_delay < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"bad reconnect policy: {self}")
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ValueError("max_attempts must be at least 0 (or None: no limit)")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait before attempt ``attempt`` (1, 2, ...), jitter included."""
        base = min(self.max_delay, self.initial_delay * self.factor ** max(0, attempt - 1))
        return min(self.max_delay, base * (1 - self.jitter + 2 * self.jitter * rand()))


#: What ``reconnect=`` accepts: a policy, ``True``/``None`` (the default policy) or ``False`` (off).
ReconnectOption = Union[Reconnect, bool, None]


def reconnect_policy(option: ReconnectOption) -> Reconnect:
    """The policy ``option`` stands for."""
    if isinstance(option, Reconnect):
        return option
    if option is None or option is True:
        return Reconnect()
    if option is False:
        return Reconnect(enabled=False)
    raise TypeError(f"reconnect must be a fluxbus.Reconnect, True or False, not {option!r}")


@dataclass(frozen=True)
class ConnectionEvent:
    """Something that happened to a client's connection, for a UI to show. ``kind`` is one of:

    - ``disconnected``: the connection ended (``reason``; ``error``: fluxd's fatal error if it sent one);
      ``will_reconnect`` says whether the client tries again;
    - ``reconnecting``: attempt ``attempt`` starts after ``delay`` seconds (``reason``: why the connection or
      the previous attempt failed);
    - ``reconnected``: attempt ``attempt`` succeeded; ``epoch`` is the new ``welcome.epoch`` and
      ``epoch_changed`` says whether fluxd's history changed (an ephemeral or older fluxd restarted: versions
      and seqs start over), in which case the subscriptions take the next snapshot whatever its version;
    - ``gave-up``: the policy's ``max_attempts`` or ``give_up_after`` was reached; the client is closed.
    """

    DISCONNECTED = "disconnected"
    RECONNECTING = "reconnecting"
    RECONNECTED = "reconnected"
    GAVE_UP = "gave-up"

    kind: str
    reason: Optional[str] = None
    attempt: int = 0
    delay: Optional[float] = None
    will_reconnect: bool = False
    epoch: Optional[str] = None
    epoch_changed: Optional[bool] = None
    error: Optional[BaseException] = None

    def __str__(self) -> str:
        if self.kind == self.DISCONNECTED:
            return f"disconnected ({self.reason})" + ("; reconnecting" if self.will_reconnect else "")
        if self.kind == self.RECONNECTING:
            return f"reconnecting: attempt {self.attempt} in {self.delay:.2f} s ({self.reason})"
        if self.kind == self.RECONNECTED:
            change = "new epoch" if self.epoch_changed else "same epoch"
            return f"reconnected after {self.attempt} attempt(s) ({change})"
        return f"gave up reconnecting ({self.reason})"


#: A callback that receives :class:`ConnectionEvent` objects.
ConnectionCallback = Callable[[ConnectionEvent], Any]
