"""uvicorn's own lines come out in our log format, like every other line a server writes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time


def test_uvicorn_error_lines_are_json_lines() -> None:
    command = [sys.executable, "-P", "-m", "inferwatch", "--log-format", "json", "probe",
               "--listen", "127.0.0.1:0"]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stderr is not None
        started = json.loads(process.stderr.readline())
        assert started["msg"] == "probe runner starting", started
        host, port = started["listen"].rsplit(":", 1)
        deadline = time.monotonic() + 10
        while True:  # uvicorn serves a moment after our start line
            try:
                with socket.create_connection((host, int(port)), timeout=5) as client:
                    client.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                    client.recv(1024)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        time.sleep(0.2)  # the warning is written as the connection closes
    finally:
        process.terminate()
        rest = process.communicate(timeout=10)[1]
    events = [json.loads(line) for line in rest.splitlines()]  # every line parses
    invalid = [e for e in events if e["msg"] == "Invalid HTTP request received."]
    assert [(e["logger"], e["level"]) for e in invalid] == [("uvicorn.error", "warning")], rest
