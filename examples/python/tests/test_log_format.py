"""fluxd's log format in Python (fluxbus.log_format, docs/logging.md): the exact lines (the cases of fluxd's own
Tests/FluxDaemonTests/LogFormatTests.swift, quoting, escaping, levels, metadata from ``extra=``, journald, no time,
JSON) with a fixed clock; the library configuring nothing on import; and a store process (demo/audit_store.py)
run end to end across a fluxd restart to SIGTERM: every stderr line in the format, each event once."""
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from fluxbus import Client, FluxLogFormatter, configure_logging
from fluxbus.log_format import NOTICE, TRACE, format_line, level_name, parse_level

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
T = 1_795_479_667_123  # 2026-11-24T00:21:07.123Z
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (trace|debug|info|notice|warning|error|critical) "
                  r"[^\s:]+: \S.*$")


def test_text_lines_are_fluxds():
    assert (format_line("notice", "fluxd", "worker exited", {"worker": "todo", "status": "exit 1 (failure)"}, millis=T)
            == '2026-11-24T00:21:07.123Z notice fluxd: worker exited status="exit 1 (failure)" worker=todo')
    assert format_line("info", "fluxd", "a\nb", millis=T) == "2026-11-24T00:21:07.123Z info fluxd: a\\nb"
    assert format_line(logging.INFO, "fluxd", "listening", {}, millis=0) == "1970-01-01T00:00:00.000Z info fluxd: listening"
    assert format_line("info", "x", "t", millis=T + 877) == "2026-11-24T00:21:08.000Z info x: t"


def test_quoting_and_escaping():
    line = format_line("info", "fluxbus.store", 'say "hi"\r\n\tnow\x1b', {
        "empty": "", "space": "a b", "quote": 'a"b', "equals": "a=b", "newline": "a\nb", "control": "\x01",
        "plain": "/tmp/fluxd.sock", "unicode": "héllo", "backslash": "a\\b", "number": 42, "flag": True,
        "none": None, "list": ["a", "b"]}, millis=T)
    assert line == ('2026-11-24T00:21:07.123Z info fluxbus.store: say "hi"\\r\\n\\tnow\\u{1b}'
                    ' backslash=a\\b control="\\u0001" empty="" equals="a=b" flag=true'
                    ' list="[\\"a\\",\\"b\\"]" newline="a\\nb" none=null number=42 plain=/tmp/fluxd.sock'
                    ' quote="a\\"b" space="a b" unicode=héllo')
    assert "\n" not in line  # one event, one line


def test_without_time_journald_and_json():
    assert (format_line("info", "todos", "seq 1 todo/create", {"peer": "7"}, millis=T, timestamps=False)
            == "info todos: seq 1 todo/create peer=7")
    assert (format_line("warning", "fluxd", "slow consumer closed", {"peer": "7"}, millis=T, journald=True)
            == "<4>fluxd: slow consumer closed peer=7")
    assert format_line("info", "fluxd", "listening", millis=T, journald=True) == "<6>fluxd: listening"
    line = format_line("error", "fluxd", 'journal: "disk" full\n', {"dir": "/var/lib/fluxbus", "list": ["a", "b"]},
                       millis=T, fmt="json")
    assert line == ('{"time":"2026-11-24T00:21:07.123Z","level":"error","label":"fluxd","message":"journal: \\"disk\\" '
                    'full\\n","metadata":{"dir":"/var/lib/fluxbus","list":["a","b"]}}')
    assert json.loads(line)["message"] == 'journal: "disk" full\n'
    assert (format_line("info", "fluxd", "ready", millis=T, fmt="json")
            == '{"time":"2026-11-24T00:21:07.123Z","level":"info","label":"fluxd","message":"ready"}')


def test_levels():
    assert [level_name(n) for n in (1, TRACE, logging.DEBUG, 15, logging.INFO, NOTICE, logging.WARNING,
                                    logging.ERROR, logging.CRITICAL, 60)] == [
        "trace", "trace", "debug", "debug", "info", "notice", "warning", "error", "critical", "critical"]
    assert parse_level("Notice") == NOTICE and parse_level(None) == logging.INFO and parse_level(40) == 40
    with pytest.raises(ValueError):
        parse_level("verbose")
    assert logging.getLevelName(NOTICE) == "NOTICE"


def make_logger(name, formatter):
    stream = io.StringIO()
    logger = logging.getLogger(name)
    logger.propagate = False
    handler = configure_logging("trace", stream=stream, logger=logger)
    if formatter is not None:
        handler.setFormatter(formatter)
    return logger, stream


def test_formatter_through_logging(monkeypatch):
    monkeypatch.delenv("FLUXBUS_LOG_TIME", raising=False)
    monkeypatch.delenv("FLUXBUS_LOG_FORMAT", raising=False)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logger, stream = make_logger("fluxtest.formatter", FluxLogFormatter(clock=lambda: T))
    logger.log(NOTICE, "store %s: %s", "audit", "registered", extra={"version": 3, "resumed": True})
    logger.log(TRACE, "fine detail")
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("handler failed", extra={"seq": 9})
    lines = stream.getvalue().splitlines()
    assert lines[0] == "2026-11-24T00:21:07.123Z notice fluxtest.formatter: store audit: registered resumed=true version=3"
    assert lines[1] == "2026-11-24T00:21:07.123Z trace fluxtest.formatter: fine detail"
    assert lines[2].startswith("2026-11-24T00:21:07.123Z error fluxtest.formatter: handler failed\\nTraceback (most recent")
    assert lines[2].endswith("ValueError: bad\\nvalue seq=9") and len(lines) == 3  # the traceback inside the line


def test_the_environment_sets_time_format_and_level(monkeypatch):
    monkeypatch.setenv("FLUXBUS_LOG_TIME", "0")
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logger, stream = make_logger("fluxtest.env", None)
    logger.info("seq %d todo/create", 1, extra={"peer": 7})
    assert stream.getvalue() == "info fluxtest.env: seq 1 todo/create peer=7\n"
    monkeypatch.setenv("FLUXBUS_LOG_FORMAT", "json")
    monkeypatch.setenv("FLUXBUS_LOG_LEVEL", "warning")
    stream = io.StringIO()
    configure_logging(stream=stream, logger=logger)
    logger.info("hidden")
    logger.warning("shown")
    assert json.loads(stream.getvalue())["message"] == "shown" and len(logger.handlers) == 1


def test_the_library_configures_nothing_on_import():
    code = ("import logging, fluxbus, fluxbus.store, fluxbus.aio; root = logging.getLogger(); "
            "print(root.handlers, root.level, logging.getLogger('fluxbus').handlers, "
            "logging.getLogger('fluxbus.store').handlers)")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[] {logging.WARNING} [] []"


def test_the_readme_snippet_logs_as_shown():
    with open(os.path.join(PACKAGE_ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Logging: fluxd's format"):]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLUXBUS_LOG") and key != "JOURNAL_STREAM"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                            env={**env, "PYTHONPATH": PACKAGE_ROOT})
    assert result.returncode == 0 and result.stdout == "", result.stderr
    shown = re.search(r"^# (.*)$", code, re.M).group(1)
    assert LINE.match(result.stderr.strip()) and result.stderr.strip()[24:] == shown[24:], (result.stderr, shown)


class Output:
    """A stream read by a thread: ``lines``, and ``wait_for(text)``."""

    def __init__(self, stream):
        self.lines = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, text, timeout=20.0):
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(text in line for line in self.lines):
                if not self.changed.wait(deadline - time.monotonic()) and time.monotonic() >= deadline:
                    raise AssertionError(f"no line with {text!r}: {self.lines}")
            return next(line for line in self.lines if text in line)


def test_a_store_process_logs_each_event_once_in_fluxds_format(fluxd_factory):
    """demo/audit_store.py from start to SIGTERM, across a restart of fluxd: stdout has the ready line only, every
    stderr line is in fluxd's format, and the loss, the return and the registration again come once each."""
    daemon = fluxd_factory(durable=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLUXBUS_LOG") and key != "JOURNAL_STREAM"}
    process = subprocess.Popen([sys.executable, os.path.join(PACKAGE_ROOT, "demo", "audit_store.py")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                               env={**env, "FLUXBUS_SOCKET": daemon.socket_path})
    out, err = Output(process.stdout), Output(process.stderr)
    try:
        out.wait_for("audit-store ready")
        with Client.connect(daemon.socket_path, timeout=20) as client:
            client.dispatch_and_settle("todo/create", {"title": "milk"}).raise_for_status()
            daemon.restart()
            err.wait_for("registered again")
            client.dispatch_and_settle("todo/create", {"title": "eggs"}).raise_for_status()
            err.wait_for("count=2")
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    out.thread.join(5)
    err.thread.join(5)
    process.stdout.close()
    process.stderr.close()
    assert out.lines == ["audit-store ready"]
    lines = err.lines
    assert all(LINE.match(line) for line in lines), lines
    messages = [line.split(" ", 1)[1] for line in lines]  # without the time
    assert len(set(messages)) == len(messages), f"a line repeated: {lines}"
    expected = [
        r"info audit-store: counted todo/create count=1 seq=1",
        r"notice fluxbus: connection to fluxd lost \(fluxd said bye \(restart\)\); reconnecting client=audit-py",
        r"notice fluxbus: reconnected to fluxd after \d+ attempt\(s\) client=audit-py",
        r"info audit-store: registered again resumed=true version=2",
        r"info audit-store: counted todo/create count=2 seq=\d+",
        r"info audit-store: signal 15: unregistering",
    ]
    assert len(messages) == len(expected) and all(re.fullmatch(p, m) for p, m in zip(expected, messages)), lines
