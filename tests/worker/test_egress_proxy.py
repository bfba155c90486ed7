"""The egress gateway's proxy side: CONNECT tunnels and absolute-form requests reach exactly the host:port
pairs of PI_EGRESS_ALLOW; everything else is answered 403 before any name is resolved or socket opened.
Real sockets, a real listener on the host's own loopback (what a job must never reach unasked)."""

import logging

import pytest

from apps.worker.sandbox.egress_policy import PolicyError, parse_allowlist
from apps.worker.sandbox.providers import Upstream
from tests.egress_support import Listener, raw_exchange, running_gateway

UPSTREAM = Upstream("anthropic", "anthropic-messages", "https://api.anthropic.com", builtin=True)


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def test_a_tunnel_off_the_allowlist_is_refused_and_the_listener_sees_nothing(listener, redis_conn):
    with running_gateway(redis_conn, UPSTREAM) as (egress, _):
        answer = raw_exchange(egress.proxy_socket, f"CONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n"
                                                   f"Host: 127.0.0.1:{listener.port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403")
    assert listener.received == [] and egress.report.denied == 1


def test_an_absolute_form_request_off_the_allowlist_is_refused_and_the_listener_sees_nothing(listener, redis_conn):
    with running_gateway(redis_conn, UPSTREAM) as (egress, _):
        answer = raw_exchange(egress.proxy_socket, f"GET http://127.0.0.1:{listener.port}/secret HTTP/1.1\r\n"
                                                   f"Host: 127.0.0.1:{listener.port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and listener.received == []


def test_a_name_is_refused_without_being_resolved(redis_conn, monkeypatch):
    import socket

    def no_lookups(*args, **kwargs):
        raise AssertionError("the gateway resolved a name it was going to refuse")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookups)
    with running_gateway(redis_conn, UPSTREAM) as (egress, _):
        answer = raw_exchange(egress.proxy_socket, b"CONNECT exfiltrate.example.com:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403")


def test_an_allowed_tunnel_reaches_exactly_its_host_and_port(listener, redis_conn):
    with running_gateway(redis_conn, UPSTREAM, allow={("127.0.0.1", listener.port)}) as (egress, _):
        answer = raw_exchange(egress.proxy_socket,
                              f"CONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n\r\n".encode()
                              + b"GET /inside HTTP/1.1\r\nHost: x\r\n\r\n")
        other_port = raw_exchange(egress.proxy_socket,
                                  f"CONNECT 127.0.0.1:{listener.port + 1} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200 Connection Established") and answer.endswith(b"hello")
    assert listener.received == [b"GET /inside HTTP/1.1\r\nHost: x\r\n\r\n"]
    assert other_port.startswith(b"HTTP/1.1 403")


def test_an_allowed_absolute_form_request_goes_to_its_origin_in_origin_form(listener, redis_conn):
    with running_gateway(redis_conn, UPSTREAM, allow={("127.0.0.1", listener.port)}) as (egress, _):
        answer = raw_exchange(egress.proxy_socket,
                              f"GET http://127.0.0.1:{listener.port}/info/refs?service=git-upload-pack HTTP/1.1\r\n"
                              f"Host: 127.0.0.1:{listener.port}\r\nProxy-Connection: keep-alive\r\n"
                              f"User-Agent: git/2.39\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    (request,) = listener.received
    assert request.startswith(b"GET /info/refs?service=git-upload-pack HTTP/1.1\r\n")
    assert b"Proxy-Connection" not in request and b"Connection: close" in request and b"User-Agent: git" in request


@pytest.mark.parametrize("request_bytes", [
    b"GET /origin-form HTTP/1.1\r\nHost: x\r\n\r\n",       # not a proxy request
    b"CONNECT nonsense HTTP/1.1\r\n\r\n",                  # no port
    b"CONNECT a b c d\r\n\r\n",                            # not a request line
    b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",           # no such port
])
def test_malformed_proxy_requests_get_400(request_bytes, redis_conn):
    with running_gateway(redis_conn, UPSTREAM) as (egress, _):
        assert raw_exchange(egress.proxy_socket, request_bytes).startswith(b"HTTP/1.1 400")


def test_the_log_line_names_host_and_port_and_counts_only(listener, redis_conn, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.egress")
    with running_gateway(redis_conn, UPSTREAM, allow={("127.0.0.1", listener.port)}, job_id="gh-log-1") as (egress, _):
        raw_exchange(egress.proxy_socket, f"GET http://127.0.0.1:{listener.port}/private/path HTTP/1.1\r\n"
                                          "Host: x\r\n\r\n".encode())
        raw_exchange(egress.proxy_socket, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")
        raw_exchange(egress.proxy_socket, b"CONNECT bad=forged.example:443 HTTP/1.1\r\n\r\n")
    (summary,) = [record.getMessage() for record in caplog.records if "egress_summary" in record.getMessage()]
    assert "job=gh-log-1" in summary and f"tunnels=127.0.0.1:{listener.port}=1" in summary
    assert "denied=1" in summary and "denied_to=evil.example:443=1" in summary
    assert "/private/path" not in summary and "bad=forged" not in summary


def test_the_allowlist_is_host_and_port_exactly():
    assert parse_allowlist("registry.npmjs.org:443, [::1]:8080,10.0.0.1:3128") == {
        ("registry.npmjs.org", 443), ("::1", 8080), ("10.0.0.1", 3128)}
    assert parse_allowlist("") == frozenset()
    for bad in ("registry.npmjs.org", "*.npmjs.org:443", "host:0", "host:http", "a b:1", "[::1:80"):
        with pytest.raises(PolicyError, match="PI_EGRESS_ALLOW"):
            parse_allowlist(bad)
