"""A TCP relay at one loopback address in front of a server that restarts on another port.

A client under test (the sidecar) is given the relay's address once. The relay stops listening
while the server behind it is away (connections refused, as for a stopped engine) and listens
again in front of the new one. Its port is held meanwhile by a bound, non-listening socket in
the relay's ``SO_REUSEPORT`` group, so no other process can take it between the two.
"""

from __future__ import annotations

import selectors
import socket
import threading


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _reuse_port_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


class Relay:
    """A TCP relay on a fixed loopback port to an upstream port that may change; paused (not
    listening) until :meth:`resume` when made without an upstream."""

    def __init__(self, upstream: int | None = None) -> None:
        #: drop the second request of every connection without answering it
        self.drop_reused = False
        self.dropped = 0
        self._holder = _reuse_port_socket()
        self._holder.bind(("127.0.0.1", 0))
        self.port: int = self._holder.getsockname()[1]
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: bumped by pause(): a connection accepted before it must not outlive it
        self._generation = 0
        self.upstream = 0
        if upstream is not None:
            self.resume(upstream)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self, listener: socket.socket, generation: int) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by pause() or close()
                return
            threading.Thread(target=self._pipe, args=(client, generation), daemon=True).start()

    def _pipe(self, client: socket.socket, generation: int) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            client.close()
            return
        with self._lock:
            if generation != self._generation:  # paused meanwhile
                client.close()
                upstream.close()
                return
            self._open |= {client, upstream}
        answered = False
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            try:
                while True:
                    for key, _ in selector.select():
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(65536)
                        if not data:
                            return
                        if source is client and answered and self.drop_reused:
                            self.dropped += 1
                            return  # a request on a reused connection, dropped unanswered
                        answered = answered or source is upstream
                        key.data.sendall(data)
            except OSError:
                return
            finally:
                for end in (client, upstream):
                    end.close()

    def pause(self) -> None:
        """Nothing listens at the relay's port (connections refused), none stays open."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            self._generation += 1
            for end in self._open:
                end.close()
            self._open.clear()

    def resume(self, upstream: int) -> None:
        """Listen again, relaying to ``upstream``."""
        self.upstream = upstream
        listener = _reuse_port_socket()
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        listening = (listener, self._generation)
        threading.Thread(target=self._accept, args=listening, daemon=True).start()

    def close(self) -> None:
        self.pause()
        self._holder.close()
