#!/usr/bin/env python3
"""STAND-IN ollama (not Ollama): the ``bin/ollama`` of the e2e tests' stand-in release.

The real Ollama release cannot be downloaded on the machines the end-to-end tests run
on, so tests/e2e/standins/ollama.py packs this script as ``bin/ollama`` of a tarball
laid out like Ollama's own (``bin/ollama``, ``lib/ollama/``) and serves it through the
artifact directory. It answers exactly what the deploy, the role and the checks use,
and nothing else (anything else fails, saying "stand-in: unsupported ..."):

- ``ollama serve``: an HTTP server on exactly ``$OLLAMA_HOST`` (default
  127.0.0.1:11434, as Ollama), models under ``$OLLAMA_MODELS``:
  ``GET /`` ("Ollama is running"), ``GET /api/version``, ``GET /api/tags`` (the models
  whose manifests are on disk, and ``served_by``: this node's hostname),
  ``POST /api/pull`` (writes a manifest and one blob, as Ollama lays them out, streams
  the status lines; every pull is recorded in ``$OLLAMA_MODELS/.stand-in-pulls``),
  ``POST /api/generate`` (streamed NDJSON chunks ``options.num_predict`` (5) of them,
  0.2 s apart, each naming this node and when it was written; 404 for a model with no
  manifest, as Ollama). Every answer carries the header ``X-Stand-In``. It exits
  cleanly on SIGTERM.
- ``ollama list``, ``ollama pull NAME``: clients of that API at ``$OLLAMA_HOST``; exit 1
  when the server does not answer.
- ``ollama --version`` / ``ollama -v``: ``ollama version is <version> (STAND-IN ollama,
  not Ollama)``.

Standard library only (the testbed's nodes are Debian 12 with python3).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Set when the stand-in release is built (tests/e2e/standins/ollama.py).
VERSION = "unset"
WHAT = "STAND-IN ollama (not Ollama)"
DEFAULT_PORT = 11434
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
PULL_LOG = ".stand-in-pulls"
CHUNK_DELAY = 0.2


def fail(message: str, code: int = 2) -> None:
    print(f"stand-in ollama: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def host_port() -> tuple[str, int]:
    """``$OLLAMA_HOST`` as Ollama reads it: [scheme://]host[:port], default
    127.0.0.1:11434."""
    value = os.environ.get("OLLAMA_HOST", "").strip()
    if "://" in value:
        scheme, value = value.split("://", 1)
        if scheme != "http":
            fail(f"unsupported OLLAMA_HOST scheme {scheme!r} (only http)")
    value = value.rstrip("/")
    host, port = value, ""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port = value.split(":")
    elif value.count(":") > 1:
        host = value
    try:
        return host or "127.0.0.1", int(port) if port else DEFAULT_PORT
    except ValueError:
        fail(f"OLLAMA_HOST {value!r}: {port!r} is not a port")
        raise


def models_dir() -> str:
    value = os.environ.get("OLLAMA_MODELS")
    if value:
        return value
    return os.path.join(os.path.expanduser("~"), ".ollama", "models")


def parse_model(name: object) -> tuple[str, str, str, str] | None:
    """``[registry/][namespace/]model[:tag]`` -> its manifest path parts, as Ollama."""
    if not isinstance(name, str) or not name or name != name.strip():
        return None
    parts = name.split("/")
    if len(parts) > 3 or not all(parts):
        return None
    model, sep, tag = parts[-1].partition(":")
    if not model or (sep and not tag) or "/" in tag:
        return None
    registry = parts[0] if len(parts) == 3 else DEFAULT_REGISTRY
    namespace = parts[-2] if len(parts) >= 2 else DEFAULT_NAMESPACE
    for part in (registry, namespace, model, tag or "latest"):
        if part.startswith(".") or not all(c.isalnum() or c in "._-:" for c in part):
            return None
    return registry, namespace, model, tag or "latest"


def display_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """How ``ollama list`` names a model (the default registry and namespace left out)."""
    prefix = "" if registry == DEFAULT_REGISTRY else f"{registry}/"
    if prefix or namespace != DEFAULT_NAMESPACE:
        prefix += f"{namespace}/"
    return f"{prefix}{model}:{tag}"


def local_models(root: str) -> list[dict]:
    manifests = os.path.join(root, "manifests")
    out = []
    for dirpath, _dirs, files in os.walk(manifests):
        rel = os.path.relpath(dirpath, manifests).split(os.sep)
        if len(rel) != 3:
            continue
        for tag in sorted(files):
            path = os.path.join(dirpath, tag)
            with open(path, "rb") as f:
                data = f.read()
            try:
                size = sum(int(layer.get("size", 0)) for layer in json.loads(data)["layers"])
            except (ValueError, KeyError, TypeError):
                size = 0
            out.append({
                "name": display_name(*rel, tag),
                "model": display_name(*rel, tag),
                "digest": hashlib.sha256(data).hexdigest(),
                "size": size,
                "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                             time.gmtime(os.stat(path).st_mtime)),
            })
    return sorted(out, key=lambda m: m["name"])


def write_model(root: str, parts: tuple[str, str, str, str]) -> None:
    """A blob and a manifest as Ollama lays them out (blobs/sha256-<hex>,
    manifests/<registry>/<namespace>/<model>/<tag>), each written atomically."""
    blob = f"{WHAT}: model weights of {'/'.join(parts)}; not a model\n".encode()
    digest = hashlib.sha256(blob).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "stand_in": WHAT,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": f"sha256:{digest}", "size": len(blob)},
        "layers": [{"mediaType": "application/vnd.ollama.image.model",
                    "digest": f"sha256:{digest}", "size": len(blob)}],
    }, indent=1).encode()
    for path, data in ((os.path.join(root, "blobs", f"sha256-{digest}"), blob),
                       (os.path.join(root, "manifests", *parts), manifest)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.partial-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stand-in-ollama"
    models = ""
    hostname = ""

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        print(f"stand-in ollama: {self.address_string()} {format % args}", file=sys.stderr,
              flush=True)

    # -- reading and answering -------------------------------------------------------

    def _body(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not data:
            return {}
        try:
            body = json.loads(data)
        except ValueError:
            return {"_invalid": True}
        return body if isinstance(body, dict) else {"_invalid": True}

    def _head(self, status: int, kind: str, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("X-Stand-In", f"{WHAT} {VERSION} on {self.hostname}")
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _json(self, status: int, value: dict) -> None:
        data = json.dumps(value).encode()
        self._head(status, "application/json; charset=utf-8", len(data))
        if self.command != "HEAD":
            self.wfile.write(data)

    def _stream(self, lines) -> None:
        """NDJSON, one chunk per line, each sent as soon as it is made."""
        self._head(200, "application/x-ndjson", None)
        for value in lines:
            data = json.dumps(value).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _unsupported(self) -> None:
        message = f"stand-in: unsupported request {self.command} {self.path}"
        print(f"stand-in ollama: {message}", file=sys.stderr, flush=True)
        self._json(404, {"error": message})

    # -- the API ---------------------------------------------------------------------

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        if self.path == "/":
            self._head(200, "text/plain; charset=utf-8", len(b"Ollama is running"))
        else:
            self._unsupported()

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/":
            data = b"Ollama is running"
            self._head(200, "text/plain; charset=utf-8", len(data))
            self.wfile.write(data)
        elif self.path == "/api/version":
            self._json(200, {"version": VERSION, "stand_in": WHAT})
        elif self.path == "/api/tags":
            self._json(200, {"models": local_models(self.models), "served_by": self.hostname,
                             "stand_in": WHAT})
        else:
            self._unsupported()

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if body.get("_invalid"):
            self._json(400, {"error": "stand-in: the request body is not a JSON object"})
        elif self.path == "/api/pull":
            self._pull(body)
        elif self.path == "/api/generate":
            self._generate(body)
        else:
            self._unsupported()

    def _pull(self, body: dict) -> None:
        name = body.get("model") or body.get("name")
        parts = parse_model(name)
        if parts is None:
            self._json(400, {"error": f"stand-in: invalid model name {name!r}"})
            return
        with open(os.path.join(self.models, PULL_LOG), "a") as f:
            f.write(f"{time.time():.3f} {name}\n")
        write_model(self.models, parts)
        statuses = ["pulling manifest", "verifying sha256 digest", "writing manifest",
                    "success"]
        if body.get("stream") is False:
            self._json(200, {"status": "success"})
        else:
            self._stream({"status": s} for s in statuses)

    def _generate(self, body: dict) -> None:
        name = body.get("model")
        parts = parse_model(name)
        if parts is None or not os.path.isfile(os.path.join(self.models, "manifests", *parts)):
            self._json(404, {"error": f"model '{name}' not found"})
            return
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        count = options.get("num_predict", 5)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 100:
            self._json(400, {"error": "stand-in: options.num_predict must be 1-100"})
            return

        def chunk(i: int) -> dict:
            if i:
                time.sleep(CHUNK_DELAY)
            return {"model": name, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "response": self.hostname, "done": False, "served_by": self.hostname,
                    "index": i, "written_at": time.time()}

        if body.get("stream") is False:
            chunks = [chunk(i) for i in range(count)]
            self._json(200, {"model": name, "response": " ".join(c["response"] for c in chunks),
                             "done": True, "served_by": self.hostname, "stand_in": WHAT})
            return

        def lines():
            for i in range(count):
                yield chunk(i)
            yield {"model": name, "response": "", "done": True, "done_reason": "stop",
                   "served_by": self.hostname, "index": count, "written_at": time.time(),
                   "stand_in": WHAT}

        self._stream(lines())


def serve(args: list[str]) -> None:
    if args:
        fail(f"unsupported arguments to serve: {' '.join(args)}")
    host, port = host_port()
    Handler.models = models_dir()
    Handler.hostname = socket.gethostname()
    os.makedirs(Handler.models, exist_ok=True)

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

    try:
        server = Server((host, port), Handler)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc}", code=1)
        raise
    stopping = []

    def stop(signum, _frame) -> None:
        if not stopping:
            stopping.append(signum)
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"stand-in ollama: {WHAT} {VERSION} listening on {host}:{port}, models in "
          f"{Handler.models}", file=sys.stderr, flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    print(f"stand-in ollama: stopped ({signal.Signals(stopping[0]).name})"
          if stopping else "stand-in ollama: stopped", file=sys.stderr, flush=True)


def request(method: str, path: str, body: dict | None = None) -> http.client.HTTPResponse:
    host, port = host_port()
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"} if data else {})
        return conn.getresponse()
    except OSError:
        print("Error: could not connect to ollama app, is it running? (stand-in ollama "
              f"at {host}:{port})", file=sys.stderr, flush=True)
        sys.exit(1)


def list_models(args: list[str]) -> None:
    if args:
        fail(f"unsupported arguments to list: {' '.join(args)}")
    response = request("GET", "/api/tags")
    if response.status != 200:
        fail(f"GET /api/tags answered {response.status}", code=1)
    models = json.loads(response.read())["models"]
    rows = [("NAME", "ID", "SIZE", "MODIFIED")] + [
        (m["name"], m["digest"][:12], f"{m['size']} B", m["modified_at"]) for m in models
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("    ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"({WHAT} {VERSION})", file=sys.stderr)


def pull(args: list[str]) -> None:
    if len(args) != 1 or args[0].startswith("-"):
        fail(f"unsupported arguments to pull: {' '.join(args) or '(none)'}; give one model")
    response = request("POST", "/api/pull", {"model": args[0], "stream": True})
    last = {}
    for line in response:
        if line.strip():
            last = json.loads(line)
            print(last.get("status") or f"Error: {last.get('error')}", flush=True)
    if response.status != 200 or last.get("status") != "success":
        print(f"Error: pull of {args[0]} failed ({WHAT})", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str]) -> None:
    if argv in (["--version"], ["-v"]):
        print(f"ollama version is {VERSION} (STAND-IN ollama, not Ollama)")
        return
    commands = {"serve": serve, "list": list_models, "ls": list_models, "pull": pull}
    if not argv or argv[0] not in commands:
        fail(f"unsupported command {' '.join(argv) or '(none)'}; this {WHAT} knows "
             "serve, list, pull and --version")
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
