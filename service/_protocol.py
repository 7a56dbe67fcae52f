"""`waypoint serve`'s HTTP/1.1 connections: uvicorn's h11 protocol with read deadlines, so a client that
sends a request slowly, or half of one, cannot hold a connection open indefinitely.

uvicorn bounds the time between two requests on a connection (keep-alive) and the number of connections
it serves at once (`limit_concurrency`: 503 past it), but not how long a request may take to arrive. Here:

- the request line and headers must arrive within `header_timeout` seconds of the connection opening (or,
  on a kept-alive connection, of the next request's first byte);
- the body within `body_timeout` seconds of the headers;

otherwise the connection is closed. A deadline is set when its part begins and is never extended: sending a
byte at a time does not keep a connection. The endpoint reading a body that is cut off answers quietly
(service/_guard.py). Requests in flight, responses and event streams have no deadline here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["deadline_protocol", "HEADER_TIMEOUT", "BODY_TIMEOUT", "KEEP_ALIVE", "MAX_CONNECTIONS"]

HEADER_TIMEOUT = 10.0
"""Seconds a request's line and headers may take to arrive (`waypoint serve --header-timeout`)."""
BODY_TIMEOUT = 30.0
"""Seconds a request's body may take to arrive after its headers (`--body-timeout`)."""
KEEP_ALIVE = 5.0
"""Seconds an idle connection stays open between requests (`--keep-alive`; uvicorn's `timeout_keep_alive`)."""
MAX_CONNECTIONS = 1000
"""Connections served at once (`--max-connections`; uvicorn's `limit_concurrency`): a request past it is a 503.
An open page holds one or two (its event streams)."""

_log = logging.getLogger("waypoint.service")


def deadline_protocol(header_timeout: float = HEADER_TIMEOUT, body_timeout: float = BODY_TIMEOUT) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with the read deadlines of the module docstring (pass as `http=`)."""

    class DeadlineH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            self._timer: asyncio.TimerHandle | None = None
            self._part: str | None = None
            super().connection_made(transport)
            self._set("headers")  # a connection that sends nothing is closed too

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set(None)
            super().connection_lost(exc)

        def _watch(self) -> None:
            """Which part of a request is due now: its headers (some of it arrived, not all), its body, or none
            (waiting for our answer, or idle between requests: uvicorn's keep-alive)."""
            if self.transport.is_closing():
                return self._set(None)
            state = self.conn.their_state
            if state is h11.IDLE:
                self._set("headers" if self.conn.trailing_data[0] or self._part == "headers" else None)
            elif state is h11.SEND_BODY:
                self._set("body")
            else:
                self._set(None)

        def _set(self, part: str | None) -> None:
            if part == self._part:
                return  # a deadline set is never pushed back
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._part = part
            if part is not None:
                seconds = header_timeout if part == "headers" else body_timeout
                self._timer = self.loop.call_later(seconds, self._late, part, seconds)

        def _late(self, part: str, seconds: float) -> None:
            self._timer = None
            if self._part != part or self.transport.is_closing():
                return
            _log.info("closed a connection from %s: its request's %s did not arrive within %s s",
                      self.client[0] if self.client else "?", part, seconds)
            self.transport.close()

    return DeadlineH11Protocol
