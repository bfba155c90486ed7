"""A job's egress gateway: the container's only way out, served by the work horse while the container lives.

Two unix sockets, bind-mounted read-only into the container (the runner's loopback forwarders pipe to them):

    provider.sock  pi's provider calls (origin-form HTTP): only the calls of provider_calls.py's table, their
                   paths, bodies and models checked; each call's worst case reserved against the job's token
                   budget, its dollar cap and the day's tokens, and its output ceiling lowered to what is left
                   (call_budget.py); forwarded over HTTPS with the key added; metered from the provider's own
                   answer and settled to it, one ledger row per model (EgressReport.spend_by_model: what each
                   model's own ledger is charged). A call for a model off the job's allowed-model list, or
                   for another model than the one it is held to, is refused `model-not-allowed` (403), never
                   forwarded, and stops the job. A call that cannot fit stops the job. At most
                   PI_GATEWAY_CALLS_IN_FLIGHT calls of a job are in flight, each body at most
                   PI_GATEWAY_MAX_REQUEST_MB, so the gateway's memory is bounded whatever the container sends
    proxy.sock     the HTTP(S)_PROXY of everything else: CONNECT tunnels and absolute-form requests, only to
                   the host:port pairs of PI_EGRESS_ALLOW; anything else is answered 403 before a name is
                   resolved or a socket opened

Why in the work horse and not one process per host: the gateway lives and dies with the one job it serves
(a dead horse leaves its container with no way out at all), the key never leaves the process that already
holds it, and the meter hands its ledger straight to the run's verdict. Its event loop runs on a thread of
its own; the horse's thread waits on the container as before.

Log lines carry host:port and counts only, never a path, a header or a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from hashlib import sha256
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from django.conf import settings
from redis.exceptions import RedisError
from yarl import URL

from apps.worker.gates import budget
from apps.worker.sandbox import call_budget, image_contract, metering, prices, provider_calls
from apps.worker.sandbox.egress_policy import log_safe, split_authority
from apps.worker.sandbox.metering import Meter, ResponseReader, Usage
from apps.worker.sandbox.provider_calls import CallRefused
from apps.worker.sandbox.providers import Upstream

logger = logging.getLogger("pidispatch.egress")

# What pi in the container holds in place of a key (models.json); the gateway drops it and adds the real one.
PLACEHOLDER_KEY = "pidispatch-gateway-adds-the-key"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "proxy-connection"})
MAX_PROXY_HEAD_BYTES = 16 * 1024
CONNECT_TIMEOUT_SECONDS = 10
MAX_DENIED_NAMED = 5
MAX_WAITING_CALLS = 16  # provider calls queued behind the job's calls in flight; past it they are refused


class GatewayUnavailable(Exception):
    """The gateway could not start (its sockets, its thread): an infrastructure fault, retried."""


@dataclass(frozen=True)
class Limits:
    """What the gateway holds the job to. A model, when set, is the only one it forwards; an allowed-model list,
    when set, names the only ones (their ids lowercased; apps/worker/allowed_models.py)."""

    max_tokens: int | None = None
    daily_token_cap: int | None = None
    model: str = ""
    max_cost_micros: int | None = None  # the job's dollar cap: no call is forwarded once its cost reaches it
    allowed_models: frozenset[str] = frozenset()

    def allows(self, model: str) -> bool:
        if self.allowed_models and model.lower() not in self.allowed_models:
            return False
        return not self.model or model == self.model


@dataclass
class EgressReport:
    """What the gateway saw, for the run's verdict and record."""

    meter: Meter
    stop_reason: str | None = None
    auth_refused: int = 0
    denied: int = 0  # requests not let out (a proxy destination off the allowlist, a provider call off the table)
    faults: int = 0
    tunnels: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)  # provider calls not forwarded, by reason
    unpriced_model: str = ""  # the model refused `model-unpriced` (its name when the operator or pi knows it)

    def spend_by_model(self) -> dict[str, metering.ModelSpend]:
        """What each model spent, keyed `provider/model` (lowercase, as a `model:<provider>/<model>` scoped limit
        names it): calls, tokens and cost in micro-dollars (None when a call of it could not be priced), ready to
        charge each model's own ledger."""
        return self.meter.spend_by_model()


def auth_headers(api: str, key: str) -> dict[str, str]:
    if api == "anthropic-messages":
        return {"x-api-key": key}
    if api == "google-generative-ai":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


def socket_root() -> Path:
    """A short private folder (unix socket paths are limited to 108 bytes), never one another user made."""
    if settings.PI_EGRESS_SOCKET_DIR:
        return Path(settings.PI_EGRESS_SOCKET_DIR)
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return Path("/run/pidispatch-egress")
    return Path(tempfile.gettempdir()) / f"pidispatch-egress-{os.geteuid()}"


def _private_folder(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise GatewayUnavailable(f"socket-folder-unsafe:{path}")


class EgressGateway:
    def __init__(self, *, job_id: str, upstream: Upstream, key: str, allow: frozenset[tuple[str, int]],
                 limits: Limits, redis, owner: tuple[int, int], on_stop: Callable[[str], None],
                 counts_in_the_day: bool = True):
        self.job_id = job_id
        # False for `doctor --live`'s probe: its few tokens are no job's, so the day's counter (the daily token
        # cap, the tokens-today figures) neither holds nor takes them.
        self.counts_in_the_day = counts_in_the_day
        self.upstream = upstream
        self._key = key
        self.allow = allow
        self.limits = limits
        self.redis = redis
        self.owner = owner
        self.on_stop = on_stop
        self.report = EgressReport(meter=Meter())
        self.budget = call_budget.CallBudget(max_tokens=limits.max_tokens, max_cost_micros=limits.max_cost_micros,
                                             daily_token_cap=limits.daily_token_cap if counts_in_the_day
                                             else None, redis=redis,
                                             now=call_budget.now_utc)
        self.folder = socket_root() / sha256(job_id.encode()).hexdigest()[:20]
        self.provider_socket = self.folder / "provider.sock"
        self.proxy_socket = self.folder / "proxy.sock"
        self.unrecorded_tokens = 0  # metered tokens the day's Redis counter has not taken yet
        self._denied_names: dict[str, int] = {}
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._pipes: set[asyncio.Task] = set()
        self._calls: asyncio.Semaphore | None = None  # made on the gateway's own loop
        self._waiting = 0

    # --- what the container gets ---------------------------------------------------------------------

    def mounts(self) -> list[tuple[str, str]]:
        """(host path, container path) of each socket, to bind-mount read-only."""
        return [(str(self.provider_socket), image_contract.PROVIDER_SOCKET),
                (str(self.proxy_socket), image_contract.PROXY_SOCKET)]

    @staticmethod
    def container_environment() -> dict[str, str]:
        proxy = f"http://127.0.0.1:{image_contract.PROXY_PORT}"
        local = "127.0.0.1,localhost"
        return {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy,
                "NO_PROXY": local, "no_proxy": local, "PI_CODING_AGENT_DIR": image_contract.AGENT_DIR}

    # --- lifetime ------------------------------------------------------------------------------------

    def __enter__(self) -> EgressGateway:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        root = socket_root()
        _private_folder(root)
        shutil.rmtree(self.folder, ignore_errors=True)  # a killed horse's leftovers for the same job
        _private_folder(self.folder)
        self._thread = threading.Thread(target=self._run, name=f"egress-{self.job_id}", daemon=True)
        self._thread.start()
        if not self._ready.wait(15) or self._failure is not None:
            self.close()
            raise GatewayUnavailable(type(self._failure).__name__ if self._failure else "start-timeout")

    def close(self) -> None:
        if self._loop is not None and self._closing is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._closing.set)
        if self._thread is not None:
            self._thread.join(30)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._thread is not None:
            self._log_summary()
            self._thread = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); after it, the job simply loses its way out
            self._failure = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        self._calls = asyncio.Semaphore(settings.PI_GATEWAY_CALLS_IN_FLIGHT)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=32, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS,
                                          sock_read=settings.PI_PROVIDER_READ_TIMEOUT_SECONDS),
            auto_decompress=False,
        )
        self._session = session
        # A refused body is read (and dropped) for two seconds at most after the answer, so a client still sending
        # it sees the answer rather than a reset, and one sending 60 MiB is cut off.
        provider = web.Server(self._provider_request, access_log=None, lingering_time=2)
        loop = asyncio.get_running_loop()
        provider_server = await loop.create_unix_server(provider, path=str(self.provider_socket))
        proxy_server = await asyncio.start_unix_server(self._proxy_connection, path=str(self.proxy_socket),
                                                       limit=MAX_PROXY_HEAD_BYTES)
        for path in (self.provider_socket, self.proxy_socket):
            if os.geteuid() == 0:
                os.chown(path, *self.owner)
            path.chmod(0o600)  # the container's user, and nobody else, may connect
        self._ready.set()
        try:
            await self._closing.wait()
        finally:
            provider_server.close()
            proxy_server.close()
            for task in list(self._pipes):
                task.cancel()
            await provider.shutdown(2)
            await session.close()

    def _log_summary(self) -> None:
        report = self.report
        tunnels = ",".join(f"{name}={count}" for name, count in sorted(report.tunnels.items())) or "-"
        denied_to = ",".join(f"{name}={count}" for name, count in sorted(self._denied_names.items())) or "-"
        logger.info("egress_summary job=%s provider=%s calls=%d tokens=%d faults=%d auth_refused=%d stop=%s "
                    "tunnels=%s denied=%d denied_to=%s", self.job_id, self.upstream.host_port, report.meter.calls,
                    report.meter.tokens_total, report.faults, report.auth_refused, report.stop_reason or "-",
                    tunnels, report.denied, denied_to)

    # --- stopping the job ------------------------------------------------------------------------------

    def _stop(self, reason: str) -> None:
        if self.report.stop_reason is None:
            self.report.stop_reason = reason
            logger.info("egress_stop job=%s reason=%s tokens=%d", self.job_id, reason, self.report.meter.tokens_total)
            threading.Thread(target=self.on_stop, args=(reason,), name=f"egress-stop-{self.job_id}",
                             daemon=True).start()

    def _count_tokens(self, key: str, tokens: int) -> None:
        """Into the day's counter; what Redis cannot take now is settled by the worker after the run."""
        if not tokens or not self.counts_in_the_day:
            return
        try:
            budget.add_tokens(self.redis, key, tokens + self.unrecorded_tokens)
            self.unrecorded_tokens = 0
        except RedisError:
            self.unrecorded_tokens += tokens

    # --- the provider ---------------------------------------------------------------------------------

    def _recorded_model(self, model: str) -> str:
        """Only a name the operator or pi's registry knows reaches the record (the container chose it)."""
        if model and (model == self.limits.model or model.lower() in self.limits.allowed_models
                      or prices.is_listed(self.upstream.provider, model)):
            return model.lower()
        return "unlisted"

    def _policy_answer(self, status: int, reason: str) -> web.Response:
        message = f"pidispatch egress gateway: {reason}"
        return web.json_response({"type": "error", "error": {"type": "pidispatch_policy", "message": message}},
                                 status=status)

    def _refused(self, refused: CallRefused) -> web.Response:
        """A call not forwarded: counted, logged (its reason only), and the job stopped when the reason says so."""
        self.report.refusals[refused.reason] = self.report.refusals.get(refused.reason, 0) + 1
        if refused.stop:
            self._stop(refused.reason)
        else:
            self.report.denied += 1
            logger.info("egress_call_refused job=%s provider=%s reason=%s", self.job_id, self.upstream.host_port,
                        refused.reason)
        answer = self._policy_answer(refused.status, refused.reason)
        answer.force_close()  # its body may be unread: the connection ends with the answer
        return answer

    async def _provider_request(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            call = provider_calls.match(self.upstream.api, request.method, request.raw_path, self.upstream.path)
        except CallRefused as refused:
            return self._refused(refused)
        # The job's calls in flight are bounded, and so are the ones waiting for a place (whose bodies are not
        # read yet): whatever the container sends, the gateway holds at most that many bodies at once.
        if self._calls.locked() and self._waiting >= MAX_WAITING_CALLS:
            return self._refused(CallRefused(429, "calls-in-flight"))
        self._waiting += 1
        try:
            await self._calls.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._forward(call, request)
        finally:
            self._calls.release()

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = settings.PI_GATEWAY_MAX_REQUEST_MB * 1024 * 1024
        if request.content_length is not None and request.content_length > limit:
            raise CallRefused(413, "request-too-large")
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise CallRefused(413, "request-too-large")
        return bytes(body)

    async def _prepared(self, call: provider_calls.Call, request: web.BaseRequest):
        """(body to forward, model, rates, reservation) once every check passed; CallRefused or BudgetRefused if
        not. What is forwarded is the parsed document (provider_calls.py's docstring says how)."""
        received = await self._read_body(request)
        document = provider_calls.parse(received)
        model = provider_calls.model_of(call, document)
        feature = provider_calls.refusal(call, document)  # the more telling reason first
        if feature:
            raise CallRefused(403, feature)
        if provider_calls.unknown_field(call, document, self.upstream.hostname):
            raise CallRefused(403, "provider-field-refused")
        if not self.limits.allows(model):
            raise CallRefused(403, "model-not-allowed", stop=True)
        rates = call_budget.Rates.of(prices.price(self.upstream.provider, model))
        if call.billed and rates is None and self.budget.dollar_cap_applies:
            self.report.unpriced_model = self._recorded_model(model)
            raise CallRefused(403, "model-unpriced", stop=True)
        rewritten = provider_calls.ask_for_usage(call, document)
        grant = None
        if call.billed:
            input_bound = provider_calls.input_bound(call, received, document)
            asked = provider_calls.output_ceiling(call, document)
            grant = await self.budget.reserve(rates, input_bound, asked)
            if grant.output is not None and grant.output != asked:
                provider_calls.set_output_ceiling(call, document, grant.output)
                rewritten = True
        return (provider_calls.serialise(document) if rewritten else received), model, rates, grant

    async def _forward(self, call: provider_calls.Call, request: web.BaseRequest) -> web.StreamResponse:
        stop = self.report.stop_reason or self.budget.exhausted()
        if stop:
            self._stop(stop)
            return self._policy_answer(403, stop)
        try:
            body, model, rates, grant = await self._prepared(call, request)
        except CallRefused as refused:
            return self._refused(refused)
        except call_budget.BudgetRefused as refused:
            return self._refused(CallRefused(403, refused.reason, stop=True))
        except RedisError:
            logger.warning("egress_budget_unavailable job=%s", self.job_id)
            return self._policy_answer(503, "the day's token budget could not be read")
        url = URL(self.upstream.origin + self.upstream.path + call.path + (f"?{call.query}" if call.query else ""),
                  encoded=True)
        headers = provider_calls.forwarded_headers(request.headers)
        headers.update(auth_headers(self.upstream.api, self._key))
        headers["Content-Type"] = "application/json"
        headers["Accept-Encoding"] = "identity"
        status, reader, cut, sent = None, None, False, True
        try:
            async with self._session.post(url, data=body, headers=headers, allow_redirects=False) as answer:
                status = answer.status
                if answer.status in (401, 403):
                    self.report.auth_refused += 1
                response = web.StreamResponse(status=answer.status, reason=answer.reason)
                for name, value in answer.headers.items():
                    if name.lower() not in HOP_BY_HOP | {"content-length"}:
                        response.headers.add(name, value)
                if answer.content_length is not None:
                    response.content_length = answer.content_length
                streaming = answer.headers.get("Content-Type", "").startswith("text/event-stream")
                reader = ResponseReader(call.api, streaming) if call.billed and 200 <= answer.status < 300 else None
                await response.prepare(request)
                try:
                    async for chunk in answer.content.iter_any():
                        if reader is not None:
                            reader.feed(chunk)
                        await response.write(chunk)
                    await response.write_eof()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    response.force_close()  # the provider or the container went away mid-answer
                    cut = True
                return response
        except aiohttp.ClientConnectorError as exc:
            sent = False  # no connection: nothing reached the provider
            return self._provider_fault(exc)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._provider_fault(exc)
        finally:
            # Whatever ended the call (an answer, a fault, the gateway closing mid-call): its reservation settles.
            if grant is not None:
                usage = reader.finish() if reader is not None else None
                unread = (reader is not None and (cut or usage is None)) or (status is None and sent)
                if reader is not None and usage is None and not cut:
                    self._stop("usage-unreadable")
                await self._settle(model, rates, grant, usage, charge_worst_case=unread,
                                   answered=status is not None or sent)

    def _provider_fault(self, exc: BaseException) -> web.Response:
        self.report.faults += 1
        logger.warning("egress_provider_fault job=%s provider=%s error=%s", self.job_id, self.upstream.host_port,
                       type(exc).__name__)
        return self._policy_answer(502, "the provider could not be reached")

    async def _settle(self, model: str, rates, grant: call_budget.Grant, usage: Usage | None, *,
                      charge_worst_case: bool, answered: bool) -> None:
        """Meter one call and settle its reservation. A call that may have been billed but whose usage was not
        read whole (cut short, timed out, no usage in a successful answer) is charged its reserved worst case."""
        worst_cost = None
        if charge_worst_case:
            usage = Usage(input=grant.input_bound, output=grant.output or 0)
            worst_cost = rates.cost(grant.input_bound, grant.output or 0) if rates is not None else None
        tokens = 0
        if answered:
            tokens = self.report.meter.record(self.upstream.provider, self._recorded_model(model), usage,
                                              worst_case=worst_cost)
        cost = worst_cost if worst_cost is not None else (
            prices.cost(self.upstream.provider, model, usage) if usage is not None else Decimal(0))
        if tokens > grant.tokens and grant.output is not None:
            logger.warning("egress_call_over_reservation job=%s reserved=%d used=%d", self.job_id, grant.tokens,
                           tokens)
        await self.budget.settle(grant, tokens, cost)
        self._count_tokens(*self.budget.day_adjustment(grant, tokens))

    # --- everything else: CONNECT and absolute-form, by the allowlist -----------------------------------

    async def _proxy_connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter):
        try:
            head = await asyncio.wait_for(client_reader.readuntil(b"\r\n\r\n"), 30)
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, ConnectionError):
            client_writer.close()
            return
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3:
            await self._answer(client_writer, 400, "malformed request")
            return
        method, target, version = parts
        if method == "CONNECT":
            destination = split_authority(target)
        elif target.startswith("http://"):
            destination = split_authority(urlsplit(target).netloc.rpartition("@")[2], default_port=80)
        elif target.startswith("https://"):
            destination = split_authority(urlsplit(target).netloc.rpartition("@")[2], default_port=443)
        else:
            await self._answer(client_writer, 400, "this is a proxy: absolute-form or CONNECT requests only")
            return
        if destination is None:
            await self._answer(client_writer, 400, "malformed destination")
            return
        host, port = destination
        if destination not in self.allow:
            self.report.denied += 1
            name = log_safe(host, port)
            if name in self._denied_names or len(self._denied_names) < MAX_DENIED_NAMED:
                self._denied_names[name] = self._denied_names.get(name, 0) + 1
            await self._answer(client_writer, 403, f"egress to {host}:{port} is not allowed (PI_EGRESS_ALLOW)")
            return
        if target.startswith("https://"):
            await self._answer(client_writer, 501, "use CONNECT for https")
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                                      CONNECT_TIMEOUT_SECONDS)
        except (TimeoutError, OSError):
            await self._answer(client_writer, 502, f"{host}:{port} could not be reached")
            return
        name = log_safe(host, port)
        self.report.tunnels[name] = self.report.tunnels.get(name, 0) + 1
        if method == "CONNECT":
            client_writer.write(f"{version} 200 Connection Established\r\n\r\n".encode("latin-1"))
        else:
            upstream_writer.write(self._origin_form(method, target, version, header_lines, host, port))
        await self._relay((client_reader, client_writer), (upstream_reader, upstream_writer))

    @staticmethod
    def _origin_form(method: str, target: str, version: str, header_lines: list[str], host: str, port: int) -> bytes:
        """One absolute-form request rewritten for its origin; the connection ends with its answer."""
        parts = urlsplit(target)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        kept = [line for line in header_lines if line and line.split(":", 1)[0].strip().lower()
                not in HOP_BY_HOP | {"host"}]
        authority = f"[{host}]" if ":" in host else host
        lines = [f"{method} {path} {version}", f"Host: {authority}" + (f":{port}" if port != 80 else ""),
                 *kept, "Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1")

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()

    async def _relay(self, client: tuple, upstream: tuple) -> None:
        """Both directions until either side is done (HTTP and TLS need no half-open connection)."""
        pipes = {asyncio.ensure_future(self._pipe(client[0], upstream[1])),
                 asyncio.ensure_future(self._pipe(upstream[0], client[1]))}
        self._pipes |= pipes
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
            self._pipes -= pipes
            for _, writer in (client, upstream):
                writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
        phrases = {400: "Bad Request", 403: "Forbidden", 501: "Not Implemented", 502: "Bad Gateway"}
        body = (message + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {phrases.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
