"""A local Hugging Face Hub for tests: the HTTP protocol huggingface_hub speaks, served from a folder.

    with HubServer(tmp_path / "hub") as hub:
        hub.add_repo("org/tiny", folder)           # one commit holding the folder's files
        env = {**os.environ, **hub.client_env(tmp_path / "hf-home")}   # HF_ENDPOINT=hub.url, ...

What it serves, as the client library reads it (huggingface_hub's file_download.py,
_snapshot_download.py, hf_api.py, _commit_api.py, lfs.py, utils/_http.py):
  GET  /api/{models|datasets|spaces}/ORG/NAME[/revision/REV][?blobs=true]   repo info + siblings
  GET  /api/.../ORG/NAME/tree/REV[/PATH]?recursive=..   listing, paginated by a Link rel="next" header
  POST /api/.../ORG/NAME/paths-info/REV            form: paths=..., expand=...
  HEAD/GET /[datasets/|spaces/]ORG/NAME/resolve/REV/PATH
      a regular file: 200, ETag = its git blob id, X-Repo-Commit, Range requests answered with 206;
      an LFS file: 302 to the "CDN" (a second server: another origin, so the client drops its
      Authorization header as it does for the Hub's CDN) with X-Linked-Etag = sha256, X-Linked-Size
  POST /api/.../ORG/NAME/preupload/REV             {"files": [{path, sample, size}]} -> uploadMode lfs|regular
  POST /[datasets/|spaces/]ORG/NAME.git/info/lfs/objects/batch   git-lfs batch API, always "basic"
  PUT  CDN/upload/SHA256?sig=..  then  POST .../lfs/objects/verify  {oid, size}
  POST /api/.../ORG/NAME/commit/REV                 ndjson: header, file (base64), lfsFile, deletedFile/Folder
  POST /api/validate-yaml, GET /api/whoami-v2, POST /api/repos/create
It never offers Xet storage: no X-Xet-Hash header, no xetHash in listings, batch transfer "basic".

Which files are LFS is decided as the Hub does with its default .gitattributes (LFS_PATTERNS),
plus any file over 10 MiB or whose sample holds a NUL byte. A regular file's id is git's blob
sha1 ("blob SIZE\\0" + content); an LFS file's id is that of its pointer file, with its sha256 in
"lfs". Errors carry X-Error-Code / X-Error-Message as the Hub's do.

Tokens: `tokens` maps a token to "read" or "write"; an unknown token gets 401 "Invalid credentials
in Authorization header"; a private repo needs a token; writing needs a write token.
Knobs (attributes, changeable while it runs): `cut_once` closes the next file body after that many
bytes (once), `throttle` bytes/s per body, `page_size` entries per tree page, `siblings_hook`
rewrites repo info's file list (to serve malformed metadata), `fail_next` lists statuses that
the next requests to the hub (not the CDN) get instead (e.g. [503, 503]). Per repo,
`refuse(repo_id, kind)` makes writes fail as the Hub's do: "quota" (403 storage limit reached),
"insufficient" (507 Insufficient Storage) or "readonly" (403 at preupload). `corrupt(repo_id, path)`
flips one byte of what is served for a file, its metadata unchanged. `requests` records
(method, path, Range header, status) of every request.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import secrets
import threading
import time
import urllib.parse
from abc import abstractmethod
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.httpfiles import parse_range

BLOCK = 16 * 1024
LFS_OVER = 10 * 1024 * 1024
# The Hub's default .gitattributes for a new repo (plus *.gguf, which the Hub treats as LFS too).
LFS_PATTERNS = ("*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib",
                "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
                "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
                "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
                "*.zst", "*tfevents*", "*.gguf")
QUOTA_MESSAGE = "Private repository storage limit reached, please upgrade your plan"
REFUSALS = {"quota": (403, QUOTA_MESSAGE), "insufficient": (507, "Insufficient Storage"),
            "readonly": (403, "This repository is read-only")}
TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
ZERO_COMMIT = "0" * 40


def git_blob_id(data: bytes) -> str:
    """What git (and the Hub, as a file's oid / blobId / ETag) calls a blob: sha1 of header + content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int, sample: bytes) -> bool:
    name = path.rsplit("/", 1)[-1]
    by_name = any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in LFS_PATTERNS)
    return by_name or size > LFS_OVER or b"\0" in sample


@dataclass(frozen=True)
class Entry:
    """One file of a commit."""

    size: int
    sha256: str
    blob_id: str  # git blob id: of the content, or of the pointer file for an LFS file
    lfs: bool

    def listing(self, path: str) -> dict:
        item = {"type": "file", "oid": self.blob_id, "size": self.size, "path": path}
        if self.lfs:
            item["lfs"] = {"oid": self.sha256, "size": self.size,
                           "pointerSize": len(lfs_pointer(self.sha256, self.size))}
        return item

    def sibling(self, path: str) -> dict:
        item = {"rfilename": path, "size": self.size, "blobId": self.blob_id}
        if self.lfs:
            item["lfs"] = {"sha256": self.sha256, "size": self.size,
                           "pointerSize": len(lfs_pointer(self.sha256, self.size))}
        return item


@dataclass
class Repo:
    id: str
    type: str = "model"
    private: bool = False
    refusal: str | None = None
    refs: dict[str, str] = field(default_factory=dict)  # branches and tags -> commit
    commits: dict[str, dict[str, Entry]] = field(default_factory=dict)


class HubError(Exception):
    """An error answer: status, message, and the X-Error-Code the Hub would send."""

    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        Exception.__init__(self, message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class Listening(ThreadingHTTPServer):
    """One of the hub's two servers (the hub, its CDN), knowing the HubServer it serves."""

    daemon_threads = True

    def __init__(self, handler, hubserver: HubServer) -> None:
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), handler)
        self.hubserver = hubserver
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HubServer:
    def __init__(self, root, tokens: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tokens = dict(tokens or {})
        self.repos: dict[tuple[str, str], Repo] = {}
        self.cut_once: int | None = None
        self.throttle: float | None = None
        self.page_size = 1000
        self.siblings_hook = None  # called with repo info's siblings, returns what is served instead
        self.fail_next: list[int] = []  # statuses the next hub requests get instead of their answer
        self.requests: list[tuple[str, str, str | None, int]] = []
        self.corrupted: set[str] = set()  # sha256 of blobs served with a flipped byte
        self.signatures: dict[str, str] = {}  # CDN signature -> sha256 it grants
        self.lock = threading.RLock()
        self.servers: list[Listening] = []

    # ------------------------------------------------------------------ lifetime

    def __enter__(self) -> HubServer:
        self.servers = [Listening(HubHandler, self), Listening(CdnHandler, self)]
        return self

    def __exit__(self, *exc) -> None:
        for httpd in self.servers:
            httpd.shutdown()
            httpd.server_close()

    @property
    def url(self) -> str:
        return self.servers[0].url

    def client_env(self, home) -> dict[str, str]:
        """What a huggingface_hub process needs to use this hub: HF_ENDPOINT, its own HF_HOME (no
        token or cache of the machine's), no telemetry, and Xet off (harmless where the client
        predates it; with Xet on, an upload would first ask for Xet storage)."""
        return {"HF_ENDPOINT": self.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_XET": "1"}

    @property
    def cdn_url(self) -> str:
        """The CDN: another origin, so the client sends it no Authorization header."""
        return self.servers[1].url

    # ------------------------------------------------------------------ repos (the test's side)

    def add_repo(self, repo_id: str, folder=None, *, files: dict[str, bytes] | None = None,
                 private: bool = False, repo_type: str = "model") -> str:
        """A repo with one commit on main holding folder's files (and `files`); its commit id."""
        with self.lock:
            self.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, private)
            content = dict(files or {})
            if folder is not None:
                for path in sorted(Path(folder).rglob("*")):
                    if path.is_file():
                        content[path.relative_to(folder).as_posix()] = path.read_bytes()
            return self.commit(repo_id, content, "initial commit", repo_type=repo_type)

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def commit(self, repo_id: str, files: dict[str, bytes], message: str = "update", *, branch: str = "main",
               delete: tuple[str, ...] = (), repo_type: str = "model") -> str:
        """A new commit on branch: files added or replaced, `delete` removed. Names are taken as
        given (a test may plant hostile ones)."""
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            tree = dict(repo.commits.get(repo.refs.get(branch, ""), {}))
            for path in delete:
                tree.pop(path, None)
            for path, data in files.items():
                tree[path] = self.store(data, is_lfs(path, len(data), data[:512]))
            return self.record_commit(repo, branch, tree, message)

    def record_commit(self, repo: Repo, branch: str, tree: dict[str, Entry], message: str) -> str:
        parent = repo.refs.get(branch, ZERO_COMMIT)
        listing = json.dumps(sorted((p, e.blob_id) for p, e in tree.items()))
        sha = hashlib.sha1(f"{parent}\n{message}\n{listing}\n{len(repo.commits)}".encode()).hexdigest()
        repo.commits[sha] = tree
        repo.refs[branch] = sha
        return sha

    def tag(self, repo_id: str, name: str, revision: str, repo_type: str = "model") -> None:
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            repo.refs[name] = self.resolve_revision(repo, revision)

    def refuse(self, repo_id: str, kind: str | None, repo_type: str = "model") -> None:
        assert kind is None or kind in REFUSALS, kind
        self.repo(repo_id, repo_type).refusal = kind

    def corrupt(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> None:
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            self.corrupted.add(repo.commits[self.resolve_revision(repo, revision)][path].sha256)

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Every file of a revision, as stored (what an upload left there)."""
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            tree = repo.commits[self.resolve_revision(repo, revision)]
            return {p: (self.blobs / e.sha256).read_bytes() for p, e in tree.items()}

    def store(self, data: bytes, lfs: bool) -> Entry:
        sha256 = hashlib.sha256(data).hexdigest()
        path = self.blobs / sha256
        if not path.exists():
            part = path.with_suffix(f".part-{secrets.token_hex(4)}")
            part.write_bytes(data)
            part.replace(path)
        blob_id = git_blob_id(lfs_pointer(sha256, len(data)) if lfs else data)
        return Entry(len(data), sha256, blob_id, lfs)

    def served(self, sha256: str) -> bytes:
        data = (self.blobs / sha256).read_bytes()
        if sha256 in self.corrupted and data:
            flipped = bytearray(data)
            flipped[len(data) // 2] ^= 0xFF
            data = bytes(flipped)
        return data

    # ------------------------------------------------------------------ lookups (the handler's side)

    def resolve_revision(self, repo: Repo, revision: str) -> str:
        if revision in repo.refs:
            return repo.refs[revision]
        if revision in repo.commits:
            return revision
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def take_cut(self) -> int | None:
        with self.lock:
            budget, self.cut_once = self.cut_once, None
            return budget

    def take_failure(self) -> int | None:
        with self.lock:
            return self.fail_next.pop(0) if self.fail_next else None

    def record(self, method: str, path: str, range_header: str | None, status: int) -> None:
        with self.lock:
            self.requests.append((method, path, range_header, status))

    def sign(self, sha256: str) -> str:
        signature = secrets.token_hex(16)
        with self.lock:
            self.signatures[signature] = sha256
        return signature


# ------------------------------------------------------------------ HTTP plumbing shared by both servers


class Plumbing(BaseHTTPRequestHandler):
    server_version = "hubserver/1"
    status = 0

    def log_message(self, format, *args):  # keep test output quiet
        pass

    @property
    def hub(self) -> HubServer:
        assert isinstance(self.server, Listening)
        return self.server.hubserver

    def body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self.chunked_body()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def chunked_body(self) -> bytes:
        data = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(data)
            data += self.rfile.read(size)
            self.rfile.readline()

    def answer(self, status: int, payload=None, headers: dict | None = None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.status = status
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def fail(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        self.answer(error.status, {"error": error.message}, headers)

    def send_file(self, data: bytes, headers: dict) -> None:
        """data, or the byte range asked for, streamed with the hub's throttle and one-time cut."""
        header = self.headers.get("Range")
        span = None if header is None else parse_range(header, len(data))
        if span == "unsatisfiable":
            self.answer(416, None, {"Content-Range": f"bytes */{len(data)}"})
            return
        first, last = span or (0, len(data) - 1)
        self.status = 206 if span else 200
        self.send_response(self.status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(max(0, last - first + 1)))
        if span:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.end_headers()
        if self.command != "HEAD":
            self.stream(data[first:last + 1])

    def stream(self, data: bytes) -> None:
        budget = self.hub.take_cut() if data else None
        try:
            for start in range(0, len(data), BLOCK):
                block = data[start:start + BLOCK]
                if budget is not None and start + len(block) >= budget:
                    self.wfile.write(block[:max(0, budget - start)])
                    self.wfile.flush()
                    self.close_connection = True
                    return  # the socket closes mid-body: the client sees a short read
                self.wfile.write(block)
                if self.hub.throttle:
                    time.sleep(len(block) / self.hub.throttle)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (killed, or it stopped reading)

    def dispatch(self) -> None:
        try:
            self.route(urllib.parse.urlsplit(self.path))
        except HubError as e:
            self.fail(e)
        except (ValueError, KeyError, TypeError) as e:  # a request this hub cannot make sense of
            self.fail(HubError(400, f"Bad request: {e}"))
        finally:
            self.hub.record(self.command, self.path, self.headers.get("Range"), self.status)

    do_GET = do_HEAD = do_POST = do_PUT = dispatch

    @abstractmethod
    def route(self, url: urllib.parse.SplitResult) -> None: ...


# ------------------------------------------------------------------ the Hub


API = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+?)(?:/(revision|tree|paths-info|preupload|commit)"
                 r"/([^/]+)(/.*)?)?$")
RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
LFS = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/(batch|verify)$")


class HubHandler(Plumbing):
    def route(self, url) -> None:
        path = url.path
        failure = self.hub.take_failure()
        if failure is not None:
            raise HubError(failure, "Service Unavailable" if failure == 503 else "Error")
        if path == "/api/whoami-v2" and self.command == "GET":
            return self.whoami()
        if path == "/api/validate-yaml" and self.command == "POST":
            self.body()
            return self.answer(200, {})
        if path == "/api/repos/create" and self.command == "POST":
            return self.create_repo(json.loads(self.body() or b"{}"))
        m = API.match(path)
        if m:
            return self.api(TYPES[m.group(1)], m.group(2), m.group(3), m.group(4), m.group(5), url.query)
        m = RESOLVE.match(path)
        if m and self.command in ("GET", "HEAD"):
            kind = (m.group(1) or "models")
            return self.resolve(TYPES[kind], m.group(2), urllib.parse.unquote(m.group(3)),
                                urllib.parse.unquote(m.group(4)))
        m = LFS.match(path)
        if m and self.command == "POST":
            repo = self.access(TYPES[m.group(1) or "models"], m.group(2), write=True)
            return self.lfs_batch(repo) if m.group(3) == "batch" else self.lfs_verify()
        raise HubError(404, "Sorry, we can't find the page you are looking for.")

    # ---------------------------------------------------------------- auth

    def token(self) -> str | None:
        value = self.headers.get("Authorization") or ""
        if not value:
            return None
        token = value[7:] if value.lower().startswith("bearer ") else value
        if token not in self.hub.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return token

    def access(self, repo_type: str, repo_id: str, write: bool = False) -> Repo:
        token = self.token()
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and token is None):
            raise HubError(401 if token is None else 404, "Repository not found", "RepoNotFound")
        if write and token is None:
            raise HubError(401, "You must be authenticated to write", "RepoNotFound")
        if write and token is not None and self.hub.tokens[token] != "write":
            raise HubError(403, "You don't have the rights to create a commit in this repo: the token is read-only")
        return repo

    def whoami(self) -> None:
        token = self.token()
        if token is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        role = self.hub.tokens[token]
        self.answer(200, {"type": "user", "name": "tester", "auth": {"accessToken": {"role": role}}})

    def create_repo(self, request: dict) -> None:
        token = self.token()
        if token is None or self.hub.tokens[token] != "write":
            raise HubError(401 if token is None else 403, "You don't have the rights to create a repo")
        repo_id = "{}/{}".format(request.get("organization") or "tester", request["name"])
        repo_type = request.get("type") or "model"
        with self.hub.lock:
            if (repo_type, repo_id) in self.hub.repos:
                raise HubError(409, "You already created this model repo")
            self.hub.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, bool(request.get("private")))
        self.answer(200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id})

    # ---------------------------------------------------------------- the /api routes

    def api(self, repo_type, repo_id, action, revision, rest, query) -> None:
        write = action in ("preupload", "commit")
        repo = self.access(repo_type, repo_id, write)
        revision = urllib.parse.unquote(revision or "main")
        if action in (None, "revision") and self.command == "GET":
            return self.repo_info(repo, revision, urllib.parse.parse_qs(query))
        if action == "tree" and self.command == "GET":
            return self.tree(repo, revision, urllib.parse.unquote((rest or "").lstrip("/")), query)
        if action == "paths-info" and self.command == "POST":
            return self.paths_info(repo, revision)
        if action == "preupload" and self.command == "POST":
            return self.preupload(repo, revision)
        if action == "commit" and self.command == "POST":
            return self.commit(repo, revision)
        raise HubError(405, "Method not allowed")

    def snapshot(self, repo: Repo, revision: str) -> tuple[str, dict[str, Entry]]:
        with self.hub.lock:
            sha = self.hub.resolve_revision(repo, revision)
            return sha, repo.commits[sha]

    def repo_info(self, repo: Repo, revision: str, params: dict) -> None:
        sha, tree = self.snapshot(repo, revision)
        blobs = params.get("blobs", ["false"])[0].lower() == "true"
        siblings = [e.sibling(p) if blobs else {"rfilename": p} for p, e in sorted(tree.items())]
        if self.hub.siblings_hook is not None:
            siblings = self.hub.siblings_hook(siblings)
        self.answer(200, {"_id": sha[:24], "id": repo.id, "private": repo.private, "sha": sha,
                          "siblings": siblings, "tags": [], "disabled": False, "gated": False})

    def tree(self, repo: Repo, revision: str, prefix: str, query: str) -> None:
        _sha, tree = self.snapshot(repo, revision)
        params = urllib.parse.parse_qs(query)
        recursive = params.get("recursive", ["false"])[0].lower() == "true"
        entries = tree_entries(tree, prefix, recursive)
        if prefix and not entries:
            raise HubError(404, "Entry not found", "EntryNotFound")
        start = int(params.get("cursor", ["0"])[0])
        page = entries[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(entries):
            rest = dict((k, v[0]) for k, v in params.items())
            rest["cursor"] = str(start + self.hub.page_size)
            here = urllib.parse.urlsplit(self.path).path
            headers["Link"] = f'<{self.hub.url}{here}?{urllib.parse.urlencode(rest)}>; rel="next"'
        self.answer(200, page, headers)

    def paths_info(self, repo: Repo, revision: str) -> None:
        form = urllib.parse.parse_qs(self.body().decode())
        _sha, tree = self.snapshot(repo, revision)
        found = []
        for path in form.get("paths", []):
            if path in tree:
                found.append(tree[path].listing(path))
            elif any(p.startswith(path.rstrip("/") + "/") for p in tree):
                found.append(folder_entry(path.rstrip("/"), tree))
        self.answer(200, found)

    def refusal(self, repo: Repo, where: tuple[str, ...]) -> None:
        kind = repo.refusal
        if kind is not None and ((kind == "readonly") == ("preupload" in where)):
            status, message = REFUSALS[kind]
            raise HubError(status, message)

    def preupload(self, repo: Repo, revision: str) -> None:
        request = json.loads(self.body())
        self.refusal(repo, ("preupload",))
        with self.hub.lock:
            tree = repo.commits.get(repo.refs.get(revision, ""), {})
        files = []
        for f in request["files"]:
            sample = base64.b64decode(f["sample"])
            mode = "lfs" if is_lfs(f["path"], int(f["size"]), sample) else "regular"
            old = tree.get(f["path"])
            oid = None if old is None else (old.sha256 if old.lfs else old.blob_id)
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self.answer(200, {"files": files, "commitOid": repo.refs.get(revision)})

    def commit(self, repo: Repo, revision: str) -> None:
        lines = [json.loads(line) for line in self.body().splitlines() if line.strip()]
        self.refusal(repo, ("commit",))
        with self.hub.lock:
            head = repo.refs.get(revision)
            if head is None and repo.commits:
                raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            tree = dict(repo.commits.get(head or "", {}))
            message = "commit"
            for item in lines:
                message = self.apply(item, tree) or message
            sha = self.hub.record_commit(repo, revision, tree, message)
        prefix = "" if repo.type == "model" else repo.type + "s/"
        self.answer(200, {"success": True, "commitOid": sha, "pullRequestUrl": None,
                          "commitUrl": f"{self.hub.url}/{prefix}{repo.id}/commit/{sha}"})

    def apply(self, item: dict, tree: dict[str, Entry]) -> str | None:
        """One ndjson line of a commit applied to tree; the header's summary, if it is one."""
        key, value = item["key"], item["value"]
        if key == "header":
            return value.get("summary")
        path = value["path"]
        if key == "file":
            data = base64.b64decode(value["content"])
            tree[path] = self.hub.store(data, False)
        elif key == "lfsFile":
            oid = value["oid"]
            if not (self.hub.blobs / oid).is_file():
                raise HubError(422, f"Your push was rejected: LFS file {path} was not uploaded")
            size = (self.hub.blobs / oid).stat().st_size
            tree[path] = Entry(size, oid, git_blob_id(lfs_pointer(oid, size)), True)
        elif key == "deletedFile":
            if tree.pop(path, None) is None:
                raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
        elif key == "deletedFolder":
            for name in [p for p in tree if p.startswith(path.rstrip("/") + "/")]:
                del tree[name]
        else:
            raise HubError(400, f"unknown commit operation {key!r}")
        return None

    # ---------------------------------------------------------------- files

    def resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        repo = self.access(repo_type, repo_id)
        sha, tree = self.snapshot(repo, revision)
        entry = tree.get(path)
        if entry is None:
            raise HubError(404, "Entry not found", "EntryNotFound", commit=sha)
        headers = {"X-Repo-Commit": sha}
        if not entry.lfs:
            headers["ETag"] = f'"{entry.blob_id}"'
            return self.send_file(self.hub.served(entry.sha256), headers)
        signature = self.hub.sign(entry.sha256)
        headers.update({"ETag": f'"{entry.sha256}"', "X-Linked-Etag": f'"{entry.sha256}"',
                        "X-Linked-Size": str(entry.size),
                        "Location": f"{self.hub.cdn_url}/lfs/{entry.sha256}?sig={signature}"})
        self.answer(302, None, headers)

    def lfs_batch(self, repo: Repo) -> None:
        request = json.loads(self.body())
        self.refusal(repo, ("batch",))
        objects = []
        for obj in request["objects"]:
            oid, size = obj["oid"], int(obj["size"])
            item = {"oid": oid, "size": size, "authenticated": True}
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                item["error"] = {"code": 422, "message": "invalid oid"}
            elif not (self.hub.blobs / oid).is_file():
                verify = "{}{}/verify".format(self.hub.url, self.path.rsplit("/", 1)[0])
                item["actions"] = {
                    "upload": {"href": f"{self.hub.cdn_url}/upload/{oid}?sig={self.hub.sign(oid)}"},
                    "verify": {"href": verify}}
            objects.append(item)
        self.answer(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def lfs_verify(self) -> None:
        request = json.loads(self.body())
        path = self.hub.blobs / str(request["oid"])
        if not re.fullmatch(r"[0-9a-f]{64}", request["oid"]) or not path.is_file():
            raise HubError(404, "Object not found")
        if path.stat().st_size != int(request["size"]):
            raise HubError(422, "Object size does not match")
        self.answer(200, {"success": True})


def folder_entry(path: str, tree: dict[str, Entry]) -> dict:
    inside = sorted(p for p in tree if p.startswith(path + "/"))
    oid = hashlib.sha1("\n".join(inside).encode()).hexdigest()
    return {"type": "directory", "oid": oid, "size": 0, "path": path}


def tree_entries(tree: dict[str, Entry], prefix: str, recursive: bool) -> list[dict]:
    """The listing of folder prefix ('' for the root): its files and folders, all levels if recursive."""
    base = prefix.rstrip("/") + "/" if prefix else ""
    files, folders = [], set()
    for path, entry in sorted(tree.items()):
        if not path.startswith(base):
            continue
        parts = path[len(base):].split("/")
        for depth in range(1, len(parts)):
            if depth == 1 or recursive:
                folders.add(base + "/".join(parts[:depth]))
        if len(parts) == 1 or recursive:
            files.append(entry.listing(path))
    return [folder_entry(f, tree) for f in sorted(folders)] + files


# ------------------------------------------------------------------ the CDN (another origin)


class CdnHandler(Plumbing):
    def route(self, url) -> None:
        m = re.match(r"^/(lfs|upload)/([0-9a-f]{64})$", url.path)
        signature = urllib.parse.parse_qs(url.query).get("sig", [""])[0]
        if not m or self.hub.signatures.get(signature) != m.group(2):
            raise HubError(403, "AccessDenied: bad signature")
        if m.group(1) == "lfs" and self.command in ("GET", "HEAD"):
            return self.send_file(self.hub.served(m.group(2)), {"ETag": f'"{m.group(2)}"'})
        if m.group(1) == "upload" and self.command == "PUT":
            return self.upload(m.group(2))
        raise HubError(405, "Method not allowed")

    def upload(self, sha256: str) -> None:
        """Stored under its sha256 only when it hashes to it (the verify step then finds it)."""
        data = self.body()
        if hashlib.sha256(data).hexdigest() == sha256:
            self.hub.store(data, True)
        self.answer(200, None, {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
