"""A local stand-in for Slack (Web API, response_url, Socket Mode) on 127.0.0.1: the tests' and `runbot demo --cluster`'s."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable

from aiohttp import WSMsgType, web

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # the signing secret tests (and the demo) sign with
BOT_TOKEN = "xoxb-1111-2222-testtoken"
APP_TOKEN = "xapp-1-A111-222-testtoken"
TEAM_ID, BOT_USER, BOT_ID = "T0TEST", "U0BOT", "B0BOT"


@dataclass
class _Rule:
    status: int  # 0: do the call, then drop the connection before answering
    times: int | None  # None: until clear_failures()
    method: str | None  # None: every Web API method; "response_url": response_url posts; "upload": file bytes
    retry_after: str | None = None
    error: str = "internal_error"  # the `error` of the answer's {"ok": false} body


class SlackStub:
    """Slack's Web API on 127.0.0.1, run by its own thread and event loop.

    `.calls` holds (method, payload) for every Web API call answered ok (what Slack *did*);
    `.attempts` holds (method, payload, status) for every call, failed ones included;
    `.responses` holds (name, payload) for every post to a `response_url(name)`;
    `.events` holds (monotonic time, kind, name, payload) of everything, for benches.
    Messages posted with chat.postMessage (and edited with chat.update) come back from
    conversations.history and conversations.replies, metadata included.
    Files go up as Slack's external upload does: files.getUploadURLExternal hands out an upload
    URL (on this stub), the bytes are POSTed there (`.uploads`: file id -> bytes; an event of kind
    "upload"), and files.completeUploadExternal shares them (`.files`: what it shared, and where).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        # The name its URLs give: "localhost" makes every client resolve it (through the event loop's
        # default executor, as aiohttp resolves slack.com), while it still listens on 127.0.0.1 only.
        self.host = host
        self.calls: list[tuple[str, dict]] = []
        self.attempts: list[tuple[str, dict, int]] = []
        self.responses: list[tuple[str, dict]] = []
        self.events: list[tuple[float, str, str, dict]] = []
        self.socket_received: list[dict] = []
        self.uploads: dict[str, bytes] = {}  # file id -> the bytes POSTed to its upload URL
        self.files: list[dict] = []  # each file files.completeUploadExternal shared: id, title, channel_id, …, content
        self._upload_urls: dict[str, dict] = {}  # file id -> what files.getUploadURLExternal was told
        self._last_file = 0
        # What auth.test's x-oauth-scopes header says the token was granted; None: the manifest's scopes.
        self.scopes: list[str] | None = None
        self.channels: dict[str, dict] = {}  # channel id -> {"name", "is_member"}, for conversations.info
        self._rules: list[_Rule] = []
        self._messages: dict[tuple[str, str], dict] = {}  # (channel, ts) -> the message as Slack stores it
        self._last_ts = 0.0
        self.clock_offset = 0.0  # Slack's clock minus ours: ts values are Slack's own time, like the real one's
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._sockets: list[web.WebSocketResponse] = []
        self.port = 0

    # -- lifecycle --

    def start(self) -> SlackStub:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="slack-stub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Slack stub did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> SlackStub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)  # the SDK GETs some methods (conversations.*)
        app.router.add_post("/response/{name}", self._response)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/ws", self._ws)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await self._runner.cleanup()

    # -- addresses --

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """For AsyncWebClient(base_url=…) / SLACK_API_BASE_URL."""
        return f"{self.url}/api/"

    def response_url(self, name: str = "r1") -> str:
        return f"{self.url}/response/{urllib.parse.quote(name, safe='')}"

    def upload_url(self, file_id: str) -> str:
        """Where files.getUploadURLExternal tells the caller to POST a file's bytes (this stub, loopback)."""
        return f"{self.url}/upload/{urllib.parse.quote(file_id, safe='')}"

    # -- what happened --

    def posts(self, method: str) -> list[dict]:
        """Payloads of the successful calls to one Web API method, in order."""
        return [payload for m, payload in self.calls if m == method]

    def channel_messages(self, channel: str) -> list[dict]:
        """The channel's top-level messages as Slack stores them (ts included), newest first."""
        return self._history("conversations.history", {"channel": channel})

    def responses_to(self, name: str) -> list[dict]:
        return [payload for n, payload in self.responses if n == name]

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.attempts.clear()
            self.responses.clear()
            self.events.clear()
            self.socket_received.clear()
            self.uploads.clear()
            self.files.clear()
            self._upload_urls.clear()
            self._rules.clear()
            self._messages.clear()
            self.clock_offset = 0.0
            self.scopes = None
            self.channels.clear()

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Block until predicate() is truthy (sync tests); returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            if value := predicate():
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for the Slack stub")
            time.sleep(0.01)

    async def until(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Await until predicate() is truthy (async tests: keeps the test's own loop running)."""
        deadline = time.monotonic() + timeout
        while True:
            if value := predicate():
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for the Slack stub")
            await asyncio.sleep(0.01)

    # -- faults --

    def fail(self, status: int = 500, times: int = 1, method: str | None = None, error: str = "internal_error") -> None:
        """The next `times` matching calls answer HTTP `status` with {"ok": false, "error": error} (method None:
        any Web API method; "response_url": response_url posts; "upload": posts of a file's bytes to its upload
        URL). A status of 200 is how Slack refuses a call (not_in_channel, missing_scope…)."""
        self._rules.append(_Rule(status, times, method, error=error))

    def fail_until_cleared(self, status: int = 500, method: str | None = None) -> None:
        self._rules.append(_Rule(status, None, method))

    def rate_limit(self, times: int | None = 1, retry_after: float | str = 0, method: str | None = None) -> None:
        """The next `times` matching calls answer 429 with Retry-After, as Slack does (None: until cleared)."""
        self._rules.append(_Rule(429, times, method, str(retry_after)))

    def drop_after_doing(self, times: int = 1, method: str | None = None) -> None:
        """The next `times` matching calls take effect, then the connection drops before the answer:
        the caller cannot tell whether its message landed."""
        self._rules.append(_Rule(0, times, method))

    def clear_failures(self) -> None:
        self._rules.clear()

    def _fault(self, method: str) -> web.Response | None:
        with self._lock:
            for rule in self._rules:
                applies = rule.method == method or (rule.method is None and method not in ("response_url", "upload"))
                if applies and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    break
            else:
                return None
        if rule.status == 0:
            return _DROP
        if rule.status == 429:
            return web.json_response({"ok": False, "error": "ratelimited"}, status=429,
                                     headers={"Retry-After": rule.retry_after or "0"})
        return web.json_response({"ok": False, "error": rule.error}, status=rule.status)

    # -- Socket Mode --

    def socket_send(self, envelope: dict) -> None:
        """Push an envelope to every connected Socket Mode client."""
        async def send() -> None:
            for ws in list(self._sockets):
                await ws.send_str(json.dumps(envelope))
        asyncio.run_coroutine_threadsafe(send(), self._loop).result(5)

    @property
    def socket_clients(self) -> int:
        return len(self._sockets)

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1,
                                      "connection_info": {"app_id": "A0TEST"}}))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    self.socket_received.append(data)
                    self.events.append((time.monotonic(), "socket", data.get("envelope_id", ""), data))
        finally:
            self._sockets.remove(ws)
        return ws

    # -- handlers --

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        payload = await _payload(request)
        fault = self._fault(method)
        status = fault.status if fault is not None and fault is not _DROP else 200 if fault is None else 0
        self.attempts.append((method, payload, status))
        if fault is not None and fault is not _DROP:
            return fault
        self.calls.append((method, payload))
        self.events.append((time.monotonic(), "api", method, payload))
        answer = self._answer(method, payload)
        if fault is _DROP:  # it happened, but the caller never hears so
            request.transport.abort()
            raise ConnectionResetError("dropped by the stub")
        headers = {"x-oauth-scopes": ",".join(self._scopes())} if method == "auth.test" else None
        return web.json_response(answer, headers=headers)

    def _scopes(self) -> list[str]:
        if self.scopes is not None:
            return self.scopes
        from bot.service.doctor import MANIFEST_SCOPES  # held to the manifest by tests/test_doctor.py

        return list(MANIFEST_SCOPES)

    def _answer(self, method: str, payload: dict) -> dict:
        if method == "auth.test":
            return {"ok": True, "url": "https://runbot-test.slack.com/", "team": "Test", "user": "runbot",
                    "team_id": TEAM_ID, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install": False}
        if method == "apps.connections.open":
            return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/ws"}
        if method == "chat.postMessage":
            self._last_ts = max(self._last_ts + 1e-6, time.time() + self.clock_offset)
            ts = f"{self._last_ts:.6f}"  # Slack's clock, unique and increasing
            message = {"type": "message", "ts": ts, "text": payload.get("text", ""), "blocks": _json(payload.get("blocks")),
                       "bot_id": BOT_ID, "user": BOT_USER}
            if payload.get("thread_ts"):
                message["thread_ts"] = payload["thread_ts"]
            if payload.get("metadata"):
                message["metadata"] = _json(payload["metadata"])
            self._messages[(payload.get("channel", ""), ts)] = message
            return {"ok": True, "channel": payload.get("channel"), "ts": ts, "message": message}
        if method == "chat.update":
            message = self._messages.get((payload.get("channel", ""), payload.get("ts", "")))
            if message is not None:
                message.update(text=payload.get("text", ""), blocks=_json(payload.get("blocks")))
            return {"ok": True, "channel": payload.get("channel"), "ts": payload.get("ts"), "text": payload.get("text", "")}
        if method == "conversations.info":
            found = self.channels.get(payload.get("channel", ""))
            if found is None:
                return {"ok": False, "error": "channel_not_found"}
            return {"ok": True, "channel": {"id": payload.get("channel"), **found}}
        if method in ("conversations.history", "conversations.replies"):
            return {"ok": True, "has_more": False, "messages": self._history(method, payload)}
        if method == "files.getUploadURLExternal":
            self._last_file += 1
            file_id = f"F0TEST{self._last_file:05d}"
            self._upload_urls[file_id] = {"filename": payload.get("filename", ""), "length": payload.get("length")}
            return {"ok": True, "upload_url": self.upload_url(file_id), "file_id": file_id}
        if method == "files.completeUploadExternal":
            shared = []
            for f in _json(payload.get("files")) or []:
                asked = self._upload_urls.get(f.get("id", ""), {})
                record = {"id": f.get("id"), "title": f.get("title") or asked.get("filename"),
                          "name": asked.get("filename"), "channel_id": payload.get("channel_id"),
                          "channels": payload.get("channels"), "initial_comment": payload.get("initial_comment"),
                          "thread_ts": payload.get("thread_ts"), "content": self.uploads.get(f.get("id", ""))}
                self.files.append(record)
                shared.append({"id": record["id"], "title": record["title"], "name": record["name"]})
            return {"ok": True, "files": shared}
        return {"ok": True}

    def _history(self, method: str, args: dict) -> list[dict]:
        """What chat.postMessage put in a channel (newest first), or in one thread (parent first)."""
        channel, oldest = args.get("channel", ""), Decimal(args.get("oldest") or 0)  # exact, as Slack compares ts
        found = [m for (c, ts), m in self._messages.items() if c == channel and (Decimal(ts) > oldest or ts == args.get("ts"))]
        if method == "conversations.history":
            return sorted((m for m in found if m.get("thread_ts") in (None, m["ts"])), key=lambda m: float(m["ts"]), reverse=True)
        thread = args.get("ts", "")
        return sorted((m for m in found if m["ts"] == thread or m.get("thread_ts") == thread), key=lambda m: float(m["ts"]))

    async def _upload(self, request: web.Request) -> web.Response:
        """A file's bytes, POSTed to the URL files.getUploadURLExternal gave; Slack answers in plain text."""
        file_id = request.match_info["file_id"]
        data = await request.read()
        fault = self._fault("upload")
        if fault is not None and fault is not _DROP:
            return fault
        if file_id not in self._upload_urls:
            return web.Response(status=404, text="no such upload")
        self.uploads[file_id] = data
        self.events.append((time.monotonic(), "upload", file_id, {"length": len(data)}))
        if fault is _DROP:
            request.transport.abort()
            raise ConnectionResetError("dropped by the stub")
        return web.Response(text=f"OK - {len(data)}")

    async def _response(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        payload = await _payload(request)
        fault = self._fault("response_url")
        if fault is not None and fault is not _DROP:
            return fault
        self.responses.append((name, payload))
        self.events.append((time.monotonic(), "response", name, payload))
        if fault is _DROP:
            request.transport.abort()
            raise ConnectionResetError("dropped by the stub")
        return web.Response(text="ok")


_DROP = web.Response(status=599)  # a marker: answer nothing, drop the connection


def _json(value: Any) -> Any:
    """Form-encoded calls carry blocks and metadata as JSON strings; JSON calls as objects."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


async def _payload(request: web.Request) -> dict:
    if request.method == "GET":
        return dict(request.query)
    text = await request.text()
    if request.content_type == "application/json":
        return {**request.query, **json.loads(text or "{}")}
    return {**request.query, **dict(urllib.parse.parse_qsl(text))}  # the SDK sends some methods' arguments in the URL
