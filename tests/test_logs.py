"""uvicorn's own lines come out in our log format, like every other line a server writes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from support.wait import wait_for

pytestmark = pytest.mark.proc

INVALID_REQUEST = "Invalid HTTP request received."


def test_uvicorn_error_lines_are_json_lines() -> None:
    command = [sys.executable, "-P", "-m", "inferwatch", "--log-format", "json", "probe",
               "--listen", "127.0.0.1:0"]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True)
    try:
        started = json.loads(process.stderr.readline())
        assert started["msg"] == "probe runner starting", started
        reader.start()
        host, port = started["listen"].rsplit(":", 1)

        def send_garbage() -> bool:  # uvicorn serves a moment after our start line
            with socket.create_connection((host, int(port)), timeout=5) as client:
                client.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                client.recv(1024)
            return True

        wait_for(send_garbage, "the probe runner to accept a connection", 10,
                 ignore=(ConnectionRefusedError,))  # fmt: skip
        # the warning is written as the connection closes
        wait_for(lambda: any(INVALID_REQUEST in line for line in lines), "uvicorn's warning", 10)
    finally:
        process.terminate()
        process.wait(timeout=10)
        reader.join(timeout=10)
        process.stderr.close()
    events = [json.loads(line) for line in lines]  # every line parses
    invalid = [e for e in events if e["msg"] == INVALID_REQUEST]
    assert [(e["logger"], e["level"]) for e in invalid] == [("uvicorn.error", "warning")], lines
