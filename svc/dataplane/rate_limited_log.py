"""
Log lines a peer can cause, at a bounded rate.

A peer opening hundreds of connections a second (never finishing TLS,
presenting a refused certificate, or over a connection limit) must not be
able to write hundreds of log lines a second. L{RateLimitedLog} writes at
most C{burst} lines of one kind per C{interval} seconds; the lines it
holds back are counted, and the next line of that kind it writes says how
many there were (C{suppressed}).

Pure logic over an injected clock (C{now}).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger, LogLevel

DEFAULT_BURST = 5
"""Lines of one kind written per interval."""

DEFAULT_INTERVAL = 10.0
"""Seconds of one interval."""


class _Kind:
    def __init__(self, started: float) -> None:
        self.started = started
        self.written = 0
        self.suppressed = 0


class RateLimitedLog:
    """
    At most C{burst} lines of each kind per C{interval} seconds to C{log};
    see the module docstring.
    """

    def __init__(
        self,
        now: Callable[[], float],
        log: Logger,
        *,
        burst: int = DEFAULT_BURST,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self._now = now
        self._log = log
        self._burst = burst
        self._interval = interval
        self._kinds: dict[str, _Kind] = {}

    def emit(self, kind: str, level: LogLevel, format: str, **fields: object) -> bool:
        """
        Write C{format} with C{fields} (plus C{suppressed}: lines of this
        kind held back since the last one written) unless C{kind} used its
        burst this interval; whether it was written.
        """
        now = self._now()
        state = self._kinds.get(kind)
        if state is None or now - state.started >= self._interval:
            suppressed = 0 if state is None else state.suppressed
            state = self._kinds[kind] = _Kind(now)
            state.suppressed = suppressed
        if state.written >= self._burst:
            state.suppressed += 1
            return False
        state.written += 1
        suppressed, state.suppressed = state.suppressed, 0
        self._log.emit(level, format, suppressed=suppressed, **fields)
        return True
