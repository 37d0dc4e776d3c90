"""A Hugging Face hub stand-in on 127.0.0.1 for the download tests: it serves one fixture repository the way
the hub's `resolve` endpoint does (HEAD metadata headers, ETag = sha256 for LFS files and the git blob id for
the rest, Range requests), and can cut a transfer once or serve corrupted bytes under the right hash."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    repo_id: str
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)       # served as LFS files (sha256 etag)
    cut_once: set[str] = field(default_factory=set)  # first GET sends half the bytes, then drops the connection
    corrupt: set[str] = field(default_factory=set)   # GET serves flipped bytes under the true hash
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range header)

    def etag(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if name in self.lfs else git_blob_id(data)


def serve(repo: Repo) -> tuple[ThreadingHTTPServer, str]:
    """Start the server on a free loopback port; returns (server, endpoint URL). Call server.shutdown()."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _file(self) -> str | None:
            prefix = f"/{repo.repo_id}/resolve/"
            if not self.path.startswith(prefix):
                return None
            _revision, _, name = self.path[len(prefix):].partition("/")
            return name if name in repo.files else None

        def _headers(self, name: str, status: int, length: int, extra: dict | None = None) -> None:
            self.send_response(status)
            etag = repo.etag(name)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{etag}"')
            if name in repo.lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(repo.files[name])))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()

        def _missing(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self):
            repo.requests.append(("HEAD", self.path, self.headers.get("Range", "")))
            name = self._file()
            if name is None:
                return self._missing()
            self._headers(name, 200, len(repo.files[name]))

        def do_GET(self):
            repo.requests.append(("GET", self.path, self.headers.get("Range", "")))
            name = self._file()
            if name is None:
                return self._missing()
            data = repo.files[name]
            if name in repo.corrupt:
                data = bytes(b ^ 0xFF for b in data)
            start = 0
            if rng := self.headers.get("Range"):
                start = int(rng.split("=")[1].split("-")[0])
            body = data[start:]
            extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else None
            self._headers(name, 206 if start else 200, len(body), extra)
            if name in repo.cut_once:
                repo.cut_once.discard(name)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(2)  # the client sees a short read: a cut connection
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
