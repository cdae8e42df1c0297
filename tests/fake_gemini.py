"""A local stand-in for the Gemini REST API on 127.0.0.1, for testing the real google-genai client.

    with FakeGemini([Reply.status(429), Reply.text('{"candidates": [...]}')]) as server:
        client = genai.Client(api_key="test", http_options=types.HttpOptions(base_url=server.base_url))

Each POST to `/{version}/models/{model}:generateContent` takes the next scripted reply: model text (wrapped
in a generateContent response), an HTTP error status with a Gemini-shaped error body, or a delay longer
than the client's timeout. When the script runs out, replies are HTTP 503. Every request is recorded
(path, the API key header, the JSON body) so tests can check what the client sent.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_STATUS_NAMES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE"}


@dataclasses.dataclass
class Reply:
    text: str | None = None
    status: int = 200
    delay_s: float = 0.0
    message: str | None = None  # an error's message; "{api_key}" becomes the request's key (a server that echoes it)

    @classmethod
    def json(cls, obj) -> "Reply":
        return cls(text=json.dumps(obj))

    @classmethod
    def error(cls, status: int, message: str | None = None) -> "Reply":
        return cls(status=status, message=message)

    @classmethod
    def hang(cls, seconds: float) -> "Reply":
        """Answer only after `seconds` (longer than the client timeout: the client gives up first)."""
        return cls(text='{"candidates": []}', delay_s=seconds)


@dataclasses.dataclass
class Request:
    path: str
    api_key: str | None
    body: dict

    @property
    def prompt(self) -> str:
        return " ".join(p.get("text", "") for c in self.body.get("contents", []) for p in c.get("parts", []))


class FakeGemini:
    def __init__(self, script: list[Reply]):
        self.script = list(script)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                with fake._lock:
                    fake.requests.append(Request(self.path, self.headers.get("x-goog-api-key"), body))
                    reply = fake.script.pop(0) if fake.script else Reply.error(503)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if ":generateContent" not in self.path:
                    reply = Reply.error(400)
                if reply.status != 200:
                    message = (reply.message or f"fake error {reply.status}").replace(
                        "{api_key}", str(self.headers.get("x-goog-api-key")))
                    payload = {"error": {"code": reply.status, "message": message,
                                         "status": _STATUS_NAMES.get(reply.status, "UNKNOWN")}}
                else:
                    payload = {
                        "candidates": [{"content": {"role": "model", "parts": [{"text": reply.text}]},
                                        "finishReason": "STOP", "index": 0}],
                        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 10, "totalTokenCount": 20},
                        "modelVersion": "fake-gemini",
                    }
                data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json; charset=UTF-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/"

    def __enter__(self) -> "FakeGemini":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
