"""What the supervisor's thread drives: every part of a running framebatch process (decoders,
detector workers, live camera changes, decoder status events) is a :class:`Part`."""

from __future__ import annotations

#: a tick longer than this is logged, with where it went: leases are renewed on the
#: supervisor's thread, and a tick that stalls past their TTL lets a live worker's run out
SLOW_TICK_S = 1.0


class Part:
    """Started, ticked every ``SUPERVISE_TICK_S`` on the supervisor's thread, then asked to
    stop in the run's stop order (:mod:`pipeline.daemon`); each step does nothing unless
    overridden."""

    def start(self) -> None:
        """The run begins (``Pipeline.run``): start what runs on threads of its own."""

    def tick(self) -> None:
        """Look after what changed since the last tick."""

    def done(self) -> bool:
        """The part has finished its work (asked only of the part a role ends with)."""
        return False

    def stop(self) -> None:
        """This part's step of the stop order (the run's stop signal is set already)."""

    def raise_failure(self) -> None:
        """After the stop: raise what made the part fail, if anything did."""
