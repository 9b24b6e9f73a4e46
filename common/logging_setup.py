"""Structured logging for the command line (``fedsbdt --log-format {text,json} --log-level LEVEL``).

Logs go to stderr only — stdout belongs to ``--json`` results.  ``json``
writes one object per line::

    {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "fedsbdt.train",
     "msg": "train: round 10/100 ...", "round": 10, "total": 100, "epsilon": 1.0, ...}

Every ``extra={...}`` field of a log call becomes a key.  Only the
``fedsbdt`` logger hierarchy is configured (never the root logger), and
configuring again replaces the previous handler, so calling ``main()`` many
times in one process (tests) never duplicates lines.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import IO, Any

LOGGER = "fedsbdt"
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
_HANDLER_NAME = "fedsbdt-cli"
_STANDARD = set(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {"message", "asctime",
                                                                                         "taskName"}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return v.item()
        except (TypeError, ValueError):
            pass
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra={...}`` fields of a record (everything that is not a standard LogRecord attribute)."""
    return {k: _jsonable(v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601), level, logger, msg, extra fields, exc (if any)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = _dt.datetime.fromtimestamp(record.created, tz=_dt.timezone.utc)
        out: dict[str, Any] = {"ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
                               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for k, v in extra_fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, allow_nan=False, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL logger: message`` — what a person reads on a terminal or in a CI log."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


class CurrentStderrHandler(logging.StreamHandler):
    """A stream handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    A handler bound to the ``sys.stderr`` of configuration time would keep writing to a replaced (possibly
    closed) stream when a test harness or an embedding program swaps ``sys.stderr`` later.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def quiet_grpc_core(environ=None) -> None:
    """Silence gRPC's C-core log lines (``E1127 … ssl_transport_security.cc …``) unless the user asked for them.

    The C core reads ``GRPC_VERBOSITY`` and ``GRPC_TRACE`` once, when ``grpc`` is first imported, so this runs
    before any command imports it.  A variable the user set is left alone (``GRPC_VERBOSITY=debug`` brings
    the lines back for a bug report); the failures those lines describe reach the user as our own one-line
    messages (bind failures, TLS handshakes: docs/troubleshooting.md)."""
    import os

    env = os.environ if environ is None else environ
    env.setdefault("GRPC_VERBOSITY", "NONE")
    env.setdefault("GRPC_TRACE", "")


def configure_logging(fmt: str = "text", level: str = "info", stream: IO[str] | None = None) -> logging.Logger:
    """Point the ``fedsbdt`` logger at ``stream`` (default: ``sys.stderr`` as it is at each record) in ``fmt``.

    Idempotent: a handler installed by an earlier call is replaced.  Returns the logger.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    logger = logging.getLogger(LOGGER)
    for h in list(logger.handlers):
        if h.get_name() == _HANDLER_NAME:
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream) if stream is not None else CurrentStderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
