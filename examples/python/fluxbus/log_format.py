"""fluxd's log format for Python processes (docs/logging.md): one line per event,

    2026-11-24T00:21:07.123Z info fluxbus.store: store audit: registered again key=value other="quoted value"

the time in UTC with milliseconds, the level (trace, debug, info, notice, warning, error, critical), the label (the
logger's name), ``:``, the message (a newline in it written ``\\n``: one event, one line), then the metadata (a
record's ``extra=`` fields) as ``key=value`` sorted by key, a value quoted as a JSON string when it is empty or has a
space, a control character, ``"`` or ``=``.

The library only logs (``logging.getLogger("fluxbus")``, ``"fluxbus.store"``) and never configures logging. An
application that wants fluxd's lines calls :func:`configure_logging` once, first thing (the example stores do); or
puts :class:`FluxLogFormatter` on a handler of its own. Like fluxd and the Swift SDKs' ``FluxLogging.bootstrap()``:

- ``FLUXBUS_LOG_LEVEL`` (default ``info``) and ``FLUXBUS_LOG_FORMAT`` (``text``, the default, or ``json``: one
  object per line with ``time``, ``level``, ``label``, ``message`` and ``metadata``);
- ``FLUXBUS_LOG_TIME=0`` (fluxd sets it for the workers it starts: it logs each line a worker prints with its own
  time) leaves the time out: ``info audit-store: counted todo/create seq=1``;
- under systemd's journal (``JOURNAL_STREAM`` names stderr) a text line starts with its syslog priority instead of
  the time (``<6>audit-store: ...``), so that the journal has one time and the right level.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, IO, Mapping, Optional, Union

__all__ = ["TRACE", "NOTICE", "LEVELS", "level_name", "parse_level", "format_line", "FluxLogFormatter",
           "configure_logging"]

#: The levels of fluxd that Python's logging has no name for: ``log.log(NOTICE, ...)``.
TRACE = 5
NOTICE = 25
#: fluxd's level names and the ``logging`` numbers they stand for.
LEVELS: Dict[str, int] = {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO, "notice": NOTICE,
                          "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_PRIORITY = {"trace": 7, "debug": 7, "info": 6, "notice": 5, "warning": 4, "error": 3, "critical": 2}

for _number, _name in ((TRACE, "TRACE"), (NOTICE, "NOTICE")):  # names for other formatters ("Level 25" otherwise)
    if logging.getLevelName(_number) == f"Level {_number}":
        logging.addLevelName(_number, _name)

# The attributes every LogRecord has: any other one came from ``extra=`` and is metadata.
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime",
                                                                                     "taskName"}


def level_name(levelno: int) -> str:
    """fluxd's name for a ``logging`` level number (numbers between two levels count as the lower one)."""
    if levelno <= TRACE:
        return "trace"
    if levelno < logging.INFO:
        return "debug"
    if levelno < NOTICE:
        return "info"
    if levelno < logging.WARNING:
        return "notice"
    if levelno < logging.ERROR:
        return "warning"
    if levelno < logging.CRITICAL:
        return "error"
    return "critical"


def parse_level(level: Union[int, str, None], default: int = logging.INFO) -> int:
    """A level as a ``logging`` number: a number, one of fluxd's names (any case), or ``None``/``""`` for
    ``default``. Raises ``ValueError`` for any other name."""
    if level is None or level == "":
        return default
    if isinstance(level, int):
        return level
    number = LEVELS.get(level.strip().lower())
    if number is None:
        raise ValueError(f"unknown log level {level!r}: one of {', '.join(LEVELS)}")
    return number


def format_time(millis: int) -> str:
    """Milliseconds since the epoch as RFC 3339 UTC with milliseconds: ``2026-11-24T00:21:07.123Z``."""
    seconds, ms = divmod(int(millis), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def _one_line(text: str) -> str:
    """``text`` with newlines and other control characters escaped, as fluxd writes a message."""
    if not any(ord(c) < 0x20 for c in text):
        return text
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20:
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def _json_string(text: str) -> str:
    """``text`` as a JSON string escaped exactly as fluxd escapes one (``"``, ``\\``, ``\\n``, ``\\r``, ``\\t``,
    other control characters as ``\\u00XX``; everything else as it is)."""
    out = ['"']
    for c in text:
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def _value_text(value: Any) -> str:
    """A metadata value as text: strings as they are, lists and dicts as compact JSON, others with ``str``."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, default=str)
    return _scalar(value)


def _text_value(value: Any) -> str:
    """A metadata value in a text line: bare, or quoted when empty or it has spaces, controls, ``"`` or ``=``."""
    text = _value_text(value)
    if text and not any(ord(c) <= 0x20 or c == '"' or c == "=" for c in text):
        return text
    return _json_string(text)


def _json_value(value: Any) -> str:
    """A metadata value in a JSON line: lists and dicts as JSON, anything else as a string."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_json_string(str(k)) + ":" + _json_value(value[k])
                              for k in sorted(value, key=str)) + "}"
    return _json_string(_scalar(value))


def format_line(level: Union[int, str], label: str, message: str, metadata: Optional[Mapping[str, Any]] = None, *,
                millis: Optional[int] = None, fmt: str = "text", timestamps: bool = True,
                journald: bool = False) -> str:
    """One log line in fluxd's format, without the trailing newline. ``level``: fluxd's name or a ``logging``
    number; ``millis``: the time (ms since the epoch; default now); ``fmt``: ``text`` or ``json``;
    ``timestamps=False``: a text line starts with the level (a worker under fluxd); ``journald``: a text line starts
    with ``<PRIORITY>`` instead of time and level, a JSON line carries ``priority``."""
    name = level if isinstance(level, str) else level_name(level)
    if name not in LEVELS:
        raise ValueError(f"unknown log level {name!r}: one of {', '.join(LEVELS)}")
    if millis is None:
        millis = time.time_ns() // 1_000_000
    keys = sorted(metadata or {})
    if fmt == "json":
        line = (f'{{"time":"{format_time(millis)}","level":"{name}","label":{_json_string(label)},'
                f'"message":{_json_string(message)}')
        if journald:
            line += f',"priority":{_PRIORITY[name]}'
        if keys:
            assert metadata is not None
            line += ',"metadata":{' + ",".join(_json_string(k) + ":" + _json_value(metadata[k]) for k in keys) + "}"
        return line + "}"
    if fmt != "text":
        raise ValueError(f"unknown log format {fmt!r}: text or json")
    if journald:
        line = f"<{_PRIORITY[name]}>{label}: "
    elif timestamps:
        line = f"{format_time(millis)} {name} {label}: "
    else:
        line = f"{name} {label}: "
    line += _one_line(message)
    for key in keys:
        assert metadata is not None
        line += f" {key}={_text_value(metadata[key])}"
    return line


def _is_journal(journal_stream: Optional[str], stream: Any) -> bool:
    """Whether ``stream`` is systemd's journal: ``JOURNAL_STREAM`` names its device and inode (systemd.exec(5))."""
    if not journal_stream:
        return False
    try:
        device, inode = (int(part) for part in journal_stream.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return st.st_dev == device and st.st_ino == inode


class FluxLogFormatter(logging.Formatter):
    """A ``logging.Formatter`` that writes fluxd's lines (see the module): label = the logger's name, metadata = the
    record's ``extra=`` fields; an exception's traceback goes into the message (escaped: still one line).

    ``fmt`` (``text``/``json``), ``timestamps`` and ``journald`` default to what the environment says
    (``FLUXBUS_LOG_FORMAT``, ``FLUXBUS_LOG_TIME``, ``JOURNAL_STREAM`` naming ``stream``, default stderr);
    ``clock`` (ms since the epoch) replaces the record's time (tests)."""

    def __init__(self, fmt: Optional[str] = None, *, timestamps: Optional[bool] = None,
                 journald: Optional[bool] = None, stream: Optional[IO[str]] = None,
                 clock: Optional[Callable[[], int]] = None):
        super().__init__()
        self.format_name = fmt or os.environ.get("FLUXBUS_LOG_FORMAT") or "text"
        if self.format_name not in ("text", "json"):
            raise ValueError(f"unknown log format {self.format_name!r}: text or json")
        self.timestamps = os.environ.get("FLUXBUS_LOG_TIME") != "0" if timestamps is None else timestamps
        self.journald = (_is_journal(os.environ.get("JOURNAL_STREAM"), stream if stream is not None else sys.stderr)
                         if journald is None else journald)
        self.clock = clock

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        metadata = {key: value for key, value in record.__dict__.items()
                    if key not in _RECORD_FIELDS and not key.startswith("_")}
        millis = self.clock() if self.clock is not None else int(record.created * 1000)
        return format_line(record.levelno, record.name, message, metadata, millis=millis, fmt=self.format_name,
                           timestamps=self.timestamps, journald=self.journald)


def configure_logging(level: Union[int, str, None] = None, *, fmt: Optional[str] = None,
                      stream: Optional[IO[str]] = None, logger: Optional[logging.Logger] = None) -> logging.Handler:
    """For an application (never called by the library): its log, the library's lines included, in fluxd's
    format on ``stream`` (default stderr), one line per event, at ``level`` (a name such as ``"debug"`` or a
    number; default ``FLUXBUS_LOG_LEVEL``, else info). Like ``logging.basicConfig(force=True)``: the handlers the
    root logger (or ``logger``) had are removed, so no event is printed twice in two formats. Returns the handler.
    Call it once, first thing in ``main``."""
    target = logger if logger is not None else logging.getLogger()
    number = parse_level(level if level is not None else os.environ.get("FLUXBUS_LOG_LEVEL"))
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(FluxLogFormatter(fmt, stream=out))
    for old in list(target.handlers):
        target.removeHandler(old)
        if getattr(old, "_fluxbus", False):
            old.close()
    handler._fluxbus = True  # type: ignore[attr-defined]
    target.addHandler(handler)
    target.setLevel(number)
    return handler
