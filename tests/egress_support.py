"""A job's egress gateway started in the test's own process, and clients that speak to its unix sockets as the
runner's forwarders would (the bytes are the container's; only the socket is reached from here)."""

from __future__ import annotations

import http.client
import socket
import threading
from contextlib import contextmanager

from apps.worker.sandbox import gateway
from apps.worker.sandbox.providers import Upstream
from devtools.scripted_provider import ScriptedProvider

PROVIDER_KEY = "sk-scripted-provider-key"
# Where pi would find each API under the stand-in, and the model it would ask for.
SHAPES = {
    "anthropic-messages": ("anthropic", "", "/v1/messages", "claude-sonnet-4-5"),
    "openai-completions": ("acme", "/v1", "/v1/chat/completions", "scripted-coder"),
    "openai-responses": ("openai", "/v1", "/v1/responses", "gpt-5"),
    "google-generative-ai": ("google", "/v1beta", "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
                             "gemini-2.5-flash"),
}


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def post(gateway_socket, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    connection = UnixHTTPConnection(str(gateway_socket))
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    return answer.status, data


def raw_exchange(gateway_socket, request: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes to a socket and read until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(gateway_socket))
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class Listener:
    """A TCP listener on the host's loopback that records every connection and answers HTTP 200."""

    def __init__(self):
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                        data += chunk
                except OSError:
                    pass
                self.received.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")

    def close(self):
        self.server.close()


def upstream_for(api: str, provider: ScriptedProvider) -> Upstream:
    name, base_path, _, _ = SHAPES[api]
    return Upstream(name, api, provider.url + base_path, builtin=name != "acme")


@contextmanager
def running_gateway(redis, upstream: Upstream, *, allow=frozenset(), limits=gateway.Limits(), key=PROVIDER_KEY,
                    job_id="egress-test"):
    stops: list[str] = []
    egress = gateway.EgressGateway(job_id=job_id, upstream=upstream, key=key, allow=frozenset(allow),
                                   limits=limits, redis=redis, owner=(1000, 1000), on_stop=stops.append)
    egress.start()
    try:
        yield egress, stops
    finally:
        egress.close()
