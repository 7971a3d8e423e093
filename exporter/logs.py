"""Go-exporter style logging: logfmt or JSON lines on stderr, key=value fields."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
LOGGER_NAME = "resmon"


def fields(**kv: Any) -> dict[str, Any]:
    """extra= argument that attaches key=value fields to one log line."""
    return {"resmon_fields": kv}


def _level_name(record: logging.LogRecord) -> str:
    return "warn" if record.levelno == logging.WARNING else record.levelname.lower()


def _timestamp(record: logging.LogRecord) -> str:
    ms = int(record.msecs)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z"


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\\n\t'):
        return json.dumps(text)
    return text


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """exc_info (and stack_info) as text, so an unexpected error keeps its type and traceback
    in either format."""
    text = ""
    if record.exc_info:
        text = formatter.formatException(record.exc_info)
    elif record.exc_text:
        text = record.exc_text
    if record.stack_info:
        text = (text + "\n" if text else "") + formatter.formatStack(record.stack_info)
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [f"ts={_timestamp(record)}", f"level={_level_name(record)}"]
        parts.append(f"msg={_logfmt_value(record.getMessage())}")
        for key, value in getattr(record, "resmon_fields", {}).items():
            parts.append(f"{key}={_logfmt_value(value)}")
        exc = _exception_text(self, record)
        if exc:
            parts.append(f"exc={_logfmt_value(exc)}")  # one line: the traceback's newlines are escaped
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": _level_name(record),
            "msg": record.getMessage(),
        }
        for key, value in getattr(record, "resmon_fields", {}).items():
            line[key] = value if isinstance(value, (int, float, bool)) or value is None else str(value)
        exc = _exception_text(self, record)
        if exc:
            line["exc"] = exc
        return json.dumps(line)


def setup(level: str, fmt: str) -> logging.Logger:
    """Configure the exporter's logger for the CLI (a library user keeps their own)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    log = logging.getLogger(LOGGER_NAME)
    log.handlers[:] = [handler]
    log.setLevel(LEVELS[level])
    log.propagate = False
    return log
