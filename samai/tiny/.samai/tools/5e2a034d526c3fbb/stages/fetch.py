"""Fetch files onto the box: one fetch per file at a time, resumable, checked, never half-written.

Runs ON the box as a stage script; stdout is the stage log. Standard library only, Python >= 3.8.

  fetch.py file     --url URL --out PATH [--sha256 HEX] [--size N] [--range START-END]
  fetch.py manifest --url MANIFEST_URL --dest DIR
  fetch.py tar      --url URL --dest DIR --expect REL_PATH [--sha256 HEX] [--size N]
                    [--archive PATH] [--keep-archive]
  common options:   [--wait SECONDS] [--auth-env NAME] [--backoff SECONDS]

Markers (the first word of a line): FETCH_DONE (the command's result), FETCH_FILE (one file of a
manifest or the tar's archive), FETCH_BUSY, FETCH_RETRY n/5, SHA_MISMATCH, FETCH_FLATTENED,
TAR_LAYOUT, TAR_UNSAFE, FETCH_FAIL.
Exit codes: 0 done, 1 failed, 2 bad usage, 75 busy (another fetch holds the output's lock).

Why each rule (playbook §3):
- Two `curl -C -` on one file interleaved it into garbage: every output file has an flock, and
  the download goes to PATH.part, renamed to PATH only once it is complete and checked.
- Only a slice of a big file is sometimes needed: --range fetches exactly START..END (inclusive,
  like `curl -r`) and asserts its length.
- Release tarballs nest their tree (bin/bin/llama-server): after extracting, the expected
  executable must exist, else the nested tree is flattened into place.
- Every download is checked: size and sha256 when given; a file that fails is moved to PATH.bad
  so nothing downstream picks it up.

Locks: PATH.lock for each output file (a manifest locks file by file, so it also keeps out of
the way of a single-file fetch of one of its files); `tar` also holds DIR.lock while it
extracts. A lock file holds its holder's pid and is removed on release.
Retries: transient failures (connection refused or reset, a stalled read, HTTP 5xx/408/429) are
retried 5 times in a row with backoff, resuming each time; a retry after progress starts the
count again. The archive of `tar` is downloaded beside DIR and removed once extracted (unless
--keep-archive); a file:// archive is read where it is and never removed.
"""

import argparse
import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import posixpath
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1024 * 1024
QUIET_BELOW = 8 * CHUNK  # no progress lines for smaller files
HEARTBEAT_S = 10.0  # a progress line at least this often, even between 10 % steps
READ_TIMEOUT_S = 30  # per socket read: a stalled server is a retry, not a hang
RETRIES = 5
MAX_BACKOFF_S = 60.0
EXIT_BUSY = 75  # EX_TEMPFAIL: try again later
MANIFEST_LIMIT = 16 * 1024 * 1024
LOCK_POLL_S = 0.2
SCHEMES = ("http", "https", "file")
USER_AGENT = "samai-fetch/1"


class FetchError(Exception):
    """A failure that retrying will not fix. Printed as one line: MARKER text."""

    def __init__(self, text, marker="FETCH_FAIL"):
        Exception.__init__(self, text)
        self.marker = marker


class Transient(Exception):
    """A failure worth retrying: a dropped connection, a stalled read, a 5xx."""


class Busy(Exception):
    """Another process holds the lock on what we were asked to write."""

    def __init__(self, what, pid):
        Exception.__init__(self, what)
        self.what, self.pid = what, pid


class Unsatisfiable(Exception):
    """The server refused the byte range (HTTP 416); total is the file's size when it said."""

    def __init__(self, total):
        Exception.__init__(self, "range not satisfiable")
        self.total = total


# ------------------------------------------------------------------ small helpers


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%.1f GiB" % n


def one_line(error):
    text = str(error) or type(error).__name__
    return " ".join(text.split())


def shown(url):
    """The URL without query or credentials: presigned URLs carry their token in the query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def size_of(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def truncate(path):
    with open(path, "wb"):
        pass


class Progress:
    """Progress lines for the stage log: one per 10 % step or every HEARTBEAT_S, never two
    within a second; none for files under QUIET_BELOW, done before anyone could read them."""

    def __init__(self, label, total=None, done=0):
        self.label, self.total, self.first = label, total, done
        self.quiet = total is not None and total < QUIET_BELOW
        self.started = self.last_time = time.monotonic()
        self.last_step = self.step(done)

    def step(self, done):
        return None if not self.total else int(done * 10 // self.total)

    def update(self, done):
        if self.quiet:
            return
        now = time.monotonic()
        step = self.step(done)
        since = now - self.last_time
        if since < 1.0 or (since < HEARTBEAT_S and (step is None or step <= self.last_step)):
            return
        self.last_time, self.last_step = now, step
        rate = (done - self.first) / max(now - self.started, 1e-3)
        if self.total:
            print("%s: %s / %s (%d%%) %s/s" % (self.label, human(done), human(self.total),
                                               done * 100 // self.total, human(rate)))
        else:
            print("%s: %s %s/s" % (self.label, human(done), human(rate)))


def sha256_file(path, label=None):
    """Hex sha256 of a file, read in 1 MiB blocks; with a label it reports progress."""
    digest = hashlib.sha256()
    progress = Progress(label, os.path.getsize(path)) if label else None
    done = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            digest.update(block)
            done += len(block)
            if progress:
                progress.update(done)
    return digest.hexdigest()


# ------------------------------------------------------------------ one fetch per output file


def same_file(fd, path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def try_lock(path):
    """An fd holding LOCK_EX on path, or None while another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if same_file(fd, path):
            return fd
        os.close(fd)  # we locked a lock file its holder just removed: lock the current one


def holder_pid(path):
    try:
        with open(path) as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def exclusive(lock_path, wait_s, what):
    """Hold an flock on lock_path (the holder's pid inside) while the block runs.

    The lock file is removed on release, so finished fetches leave nothing behind; a waiter
    that locked the removed file sees its inode is gone and locks the new one instead."""
    deadline = time.monotonic() + (wait_s or 0)
    announced = False
    while True:
        fd = try_lock(lock_path)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise Busy(what, holder_pid(lock_path))
        if not announced:
            print("waiting up to %g s for another fetch of %s (pid %s)" % (wait_s, what, holder_pid(lock_path)))
            announced = True
        time.sleep(LOCK_POLL_S)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, ("%d\n" % os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


# ------------------------------------------------------------------ sources: http(s) and file


class Source:
    """An open body: its bytes start at file offset `offset`; `length` bytes follow when known."""

    def __init__(self, stream, offset, length, total):
        self.stream, self.offset, self.length, self.total = stream, offset, length, total

    def read(self, n):
        try:
            return self.stream.read(n)
        except (OSError, http.client.HTTPException) as e:  # socket.timeout is an OSError
            raise Transient("read failed: %s" % one_line(e)) from None

    def close(self):
        with contextlib.suppress(Exception):
            self.stream.close()


def parse_content_range(value):
    """(first, last, total) from 'bytes 10-99/1000'; total is None for '*'."""
    m = re.match(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", value or "")
    if not m:
        raise Transient("unreadable Content-Range %r" % value)
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def total_from_416(headers):
    m = re.match(r"^\s*bytes\s+\*/(\d+)\s*$", (headers or {}).get("Content-Range", "") or "")
    return int(m.group(1)) if m else None


def open_http(url, first, last, token):
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if first > 0 or last is not None:
        request.add_header("Range", "bytes=%d-%s" % (first, "" if last is None else last))
    if token:
        # Unredirected: a redirect to a CDN must not carry the token along.
        request.add_unredirected_header("Authorization", "Bearer " + token)
    try:
        response = urllib.request.urlopen(request, timeout=READ_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        headers = e.headers
        e.close()
        if e.code == 416:
            raise Unsatisfiable(total_from_416(headers)) from None
        if e.code >= 500 or e.code in (408, 429):
            raise Transient("HTTP %d %s" % (e.code, e.reason)) from None
        raise FetchError("HTTP %d %s for %s" % (e.code, e.reason, shown(url))) from None
    except urllib.error.URLError as e:
        raise Transient("cannot reach %s: %s" % (shown(url), one_line(e.reason))) from None
    except (OSError, http.client.HTTPException) as e:
        raise Transient("request failed: %s" % one_line(e)) from None
    if response.status == 206:
        start, end, total = parse_content_range(response.headers.get("Content-Range"))
        return Source(response, start, end - start + 1, total)
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    return Source(response, 0, length, length)


def open_local(url, first, last):
    path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise FetchError("cannot open %s: %s" % (path, one_line(e))) from None
    total = os.fstat(f.fileno()).st_size
    if first > total or (last is not None and last >= total):
        f.close()
        raise Unsatisfiable(total)
    f.seek(first)
    end = total - 1 if last is None else last
    return Source(f, first, end - first + 1, total)


def open_source(url, first, last, token):
    """The body from byte `first` (to `last` inclusive, or the end). A server may ignore the
    range and start at 0: callers must look at source.offset."""
    if urllib.parse.urlsplit(url).scheme == "file":
        return open_local(url, first, last)
    return open_http(url, first, last, token)


def retrying(attempt, backoff, progress_mark=None):
    """Run attempt(), retrying Transient failures RETRIES times in a row with exponential backoff.
    A failure after progress (progress_mark() changed) starts the count again: a long download
    through a flaky link keeps going as long as it keeps getting somewhere."""
    failures = 0
    while True:
        before = progress_mark() if progress_mark else None
        try:
            return attempt()
        except Transient as e:
            if progress_mark and progress_mark() != before:
                failures = 0
            failures += 1
            if failures > RETRIES:
                raise FetchError("gave up after %d retries: %s" % (RETRIES, e)) from None
            print("FETCH_RETRY %d/%d: %s" % (failures, RETRIES, e))
            time.sleep(min(MAX_BACKOFF_S, backoff * 2 ** (failures - 1)))


# ------------------------------------------------------------------ downloading into PATH.part


def skip(source, count):
    """Read and drop count bytes: a server that ignored our Range sends the whole file."""
    while count > 0:
        block = source.read(min(CHUNK, count))
        if not block:
            raise Transient("connection closed while skipping to the range")
        count -= len(block)


def body_end(source, span):
    """The file offset right after the last byte we want from this body, or None if unknown."""
    end = source.offset + source.length if source.length is not None else None
    if span is None:
        return end
    if end is not None and end < span[1] + 1:
        raise FetchError("range %d-%d wants %d bytes but the file ends at byte %d (%s bytes)"
                         % (span[0], span[1], span[1] - span[0] + 1, end - 1, source.total or "?"))
    return span[1] + 1


def copy_body(source, part, position, end, label, want):
    """Append the body to part from file offset position up to end; a short body is Transient."""
    progress = Progress(label, want, size_of(part))
    with open(part, "ab") as f:
        while end is None or position < end:
            block = source.read(CHUNK if end is None else min(CHUNK, end - position))
            if not block:
                break
            f.write(block)
            position += len(block)
            progress.update(f.tell())
    if end is not None and position < end:
        raise Transient("connection closed %d bytes short" % (end - position))


def transfer(url, part, span, want, token, label):
    """One attempt: resume part from where it stops. Returns when the body is complete."""
    have = size_of(part)
    first = (span[0] if span else 0) + have  # file offset of the next byte we need
    last = span[1] if span else None
    try:
        source = open_source(url, first, last, token)
    except Unsatisfiable as e:
        if span:
            raise FetchError("range %d-%d is outside the file (%s bytes)"
                             % (span[0], span[1], e.total or "?")) from None
        if have and e.total == have:
            return  # we already hold every byte
        truncate(part)
        raise Transient("server refused to resume at byte %d (file is %s bytes); starting over"
                        % (have, e.total)) from None
    try:
        if source.offset > first:
            raise FetchError("asked for bytes from %d, the server sent them from %d" % (first, source.offset))
        if source.offset < first and source.offset == 0 and not span:
            # Never append a whole body to a partial file: that is how a file grows garbage.
            print("server ignored the Range request: restarting %s from byte 0" % part)
            truncate(part)
            first = 0
        elif source.offset < first:
            print("server sent bytes from %d: reading through to byte %d" % (source.offset, first))
            skip(source, first - source.offset)
        whole = want if want is not None or span else source.total  # for the progress lines
        copy_body(source, part, first, body_end(source, span), label, whole)
    finally:
        source.close()


def download(url, part, span, want, token, backoff, label):
    """Bring part to its full length, resuming after every transient failure."""
    def attempt():
        have = size_of(part)
        if want is not None and have > want:
            truncate(part)  # longer than the whole file: not a prefix of it
        elif want is not None and have == want:
            return
        if have:
            print("resuming %s at %s" % (part, human(have)))
        transfer(url, part, span, want, token, label)
    retrying(attempt, backoff, progress_mark=lambda: size_of(part))


def quarantine(path, out):
    bad = out + ".bad"
    os.replace(path, bad)
    return bad


def check_content(path, name, sha256, want):
    """(size, sha256) of path; SHA_MISMATCH (naming `name`) when either is not what we expect."""
    size = os.path.getsize(path)
    if want is not None and size != want:
        raise FetchError("%s expected size=%d got size=%d" % (name, want, size), "SHA_MISMATCH")
    digest = sha256_file(path, "sha256 " + os.path.basename(name))
    if sha256 and digest != sha256:
        raise FetchError("%s expected %s got %s" % (name, sha256, digest), "SHA_MISMATCH")
    return size, digest


def verify(path, out, sha256, want):
    """check_content of a finished download; one that fails is moved to OUT.bad."""
    try:
        return check_content(path, out, sha256, want)
    except FetchError:
        quarantine(path, out)
        raise


def already_present(out, sha256, want):
    """True when out is there and passes the checks we have; a failing one is moved aside."""
    if not os.path.isfile(out):
        return False
    if want is not None and os.path.getsize(out) != want:
        print("%s is there but holds %d bytes, not %d: moved to %s" % (out, os.path.getsize(out), want,
                                                                      quarantine(out, out)))
        return False
    if sha256 and sha256_file(out, "sha256 " + os.path.basename(out)) != sha256:
        print("%s is there but its sha256 differs: moved to %s" % (out, quarantine(out, out)))
        return False
    return True


def expected_length(size, span):
    if span is None:
        return size
    length = span[1] - span[0] + 1
    if size is not None and size != length:
        raise FetchError("--size %d disagrees with --range %d-%d (%d bytes)" % (size, span[0], span[1], length))
    return length


def local_source(url):
    """The path a file:// URL names, else None."""
    parts = urllib.parse.urlsplit(url)
    return urllib.request.url2pathname(parts.path) if parts.scheme == "file" else None


def same_path(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def fetch_file(url, out, sha256=None, size=None, span=None, wait_s=0, token=None, backoff=1.0,
               marker="FETCH_DONE"):
    """Fetch url (or its span) into out, under out's lock. Returns the size of out."""
    if os.path.isdir(out):
        raise FetchError("%s is a folder" % out)
    source = local_source(url)
    if source and same_path(source, out):
        raise FetchError("%s is the source file itself" % out)  # a failed check would move the source away
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    want = expected_length(size, span)
    with exclusive(out + ".lock", wait_s, out):
        if already_present(out, sha256, want):
            print("%s %s (already present)" % (marker, out))
            return os.path.getsize(out)
        what = shown(url) + ("" if span is None else " bytes %d-%d" % span)
        print("fetch %s -> %s" % (what, out))
        part = out + ".part"
        download(url, part, span, want, token, backoff, "fetch " + os.path.basename(out))
        got, digest = verify(part, out, sha256, want)
        os.replace(part, out)
    print("%s %s size=%d sha256=%s" % (marker, out, got, digest))
    return got


# ------------------------------------------------------------------ manifests


def check_relpath(rel):
    """A relative POSIX path that stays inside its folder, or FetchError."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise FetchError("refusing path %r: it must be relative and stay inside the folder" % (rel,))
    return rel


def read_small(url, token, backoff):
    def attempt():
        source = open_source(url, 0, None, token)
        try:
            data = source.read(MANIFEST_LIMIT + 1)
        finally:
            source.close()
        if len(data) > MANIFEST_LIMIT:
            raise FetchError("%s is larger than %s" % (shown(url), human(MANIFEST_LIMIT)))
        if source.length is not None and len(data) < source.length:
            raise Transient("connection closed %d bytes short" % (source.length - len(data)))
        return data
    try:
        return retrying(attempt, backoff)
    except Unsatisfiable:
        raise FetchError("%s: server answered 416" % shown(url)) from None


def manifest_entries(data, url):
    """[(path, size, sha256)] from {"files": [{"path", "size", "sha256"}]}, all checked first."""
    try:
        files = json.loads(data.decode("utf-8"))["files"]
        entries = [(f["path"], f["size"], f["sha256"]) for f in files]
    except (ValueError, KeyError, TypeError) as e:
        raise FetchError("%s is not a manifest ({\"files\": [{\"path\", \"size\", \"sha256\"}]}): %s"
                         % (shown(url), one_line(e))) from None
    for rel, size, sha256 in entries:
        check_relpath(rel)
        if not isinstance(size, int) or size < 0 or not re.match(r"^[0-9a-fA-F]{64}$", str(sha256)):
            raise FetchError("manifest entry %r needs an integer size and a 64-hex sha256" % (rel,))
    return [(rel, size, sha256.lower()) for rel, size, sha256 in entries]


def fetch_manifest(url, dest, wait_s, token, backoff):
    """Every file of the manifest into dest. Locks are per file (FILE.lock), so a manifest run
    and a single-file fetch of one of its files also keep out of each other's way."""
    entries = manifest_entries(read_small(url, token, backoff), url)
    print("manifest %s: %d files, %s" % (shown(url), len(entries), human(sum(e[1] for e in entries))))
    total = 0
    for rel, size, sha256 in entries:
        file_url = urllib.parse.urljoin(url, urllib.parse.quote(rel))
        out = os.path.join(dest, *rel.split("/"))
        total += fetch_file(file_url, out, sha256, size, None, wait_s, token, backoff, marker="FETCH_FILE")
    print("FETCH_DONE %s files=%d bytes=%d" % (dest, len(entries), total))


# ------------------------------------------------------------------ tarballs


def unsafe(text):
    return FetchError(text, "TAR_UNSAFE")


def normalized(name):
    return posixpath.normpath(name) if name else "."


def leaves_folder(path):
    return path.startswith("/") or path == ".." or path.startswith("../")


def through_link(name, links):
    """True when name sits below a symlink member: extracting it would write through the link."""
    parts = name.split("/")
    return any("/".join(parts[:i]) in links for i in range(1, len(parts)))


def check_members(members):
    """Refuse the archive before extracting anything: absolute paths, `..`, special files,
    links that point outside, and members that would be written through a link."""
    links = set(normalized(m.name) for m in members if m.issym())
    for m in members:
        name = normalized(m.name)
        if m.name.startswith("/") or leaves_folder(name):
            raise unsafe("%s: the path leaves the folder" % m.name)
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise unsafe("%s: device, fifo and other special entries are not allowed" % m.name)
        if through_link(name, links):
            raise unsafe("%s: it would be written through a link" % m.name)
        if m.issym():
            target = normalized(posixpath.join(posixpath.dirname(name), m.linkname))
            if m.linkname.startswith("/") or leaves_folder(target):
                raise unsafe("%s -> %s: the link points outside the folder" % (m.name, m.linkname))
        if m.islnk():
            target = normalized(m.linkname)
            if leaves_folder(target) or target in links or through_link(target, links):
                raise unsafe("%s => %s: the hard link points outside the folder or at a link" % (m.name, m.linkname))


def check_links_inside(root):
    """After extraction: every symlink, followed for real (chains included), stays inside."""
    top = os.path.realpath(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if real != top and not real.startswith(top + os.sep):
                    raise unsafe("%s -> %s: the link points outside the folder"
                                 % (os.path.relpath(path, root), os.readlink(path)))


def extract_safely(archive, into):
    """Extract archive into the empty folder `into`; returns the member names."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise FetchError("%s is not a readable tar archive: %s" % (archive, one_line(e))) from None
    with tar:
        members = tar.getmembers()
        check_members(members)
        options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # a second guard where it exists
        try:
            tar.extractall(into, members=members, numeric_owner=True, **options)
        except (tarfile.TarError, OSError) as e:
            raise unsafe("extracting %s failed: %s" % (archive, one_line(e))) from None
    check_links_inside(into)
    return [m.name for m in members]


def is_executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nested(root, expect):
    """The shallowest folder D below root with D/expect in it, or None."""
    found = []
    for folder, _dirs, _files in os.walk(root):
        if folder != root and os.path.isfile(os.path.join(folder, expect)):
            found.append((folder.count(os.sep), folder))
    return min(found)[1] if found else None


def remove_empty_parents(folder, root):
    while folder != root and os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)
        folder = os.path.dirname(folder)


def flatten(root, inner):
    """`mv inner/* root/`: the nested tree's contents move to the top of root."""
    holding = tempfile.mkdtemp(prefix=".flatten-", dir=root)
    os.rmdir(holding)
    os.rename(inner, holding)  # out of the way first: inner may hold an entry of its own name
    for name in sorted(os.listdir(holding)):
        target = os.path.join(root, name)
        if os.path.lexists(target):
            raise FetchError("cannot flatten %s: %s already exists at the top" % (os.path.relpath(inner, root), name),
                             "TAR_LAYOUT")
        os.rename(os.path.join(holding, name), target)
    os.rmdir(holding)
    remove_empty_parents(os.path.dirname(inner), root)


def ensure_layout(root, expect, names):
    """Make root/expect an executable file, flattening a nested tree when that is what it takes."""
    target = os.path.join(root, expect)
    if not os.path.lexists(target):
        inner = find_nested(root, expect)
        if inner is None:
            raise FetchError("%s not found; the archive holds: %s" % (expect, ", ".join(names[:8]) or "nothing"),
                             "TAR_LAYOUT")
        flatten(root, inner)
        print("FETCH_FLATTENED from %s" % os.path.relpath(inner, root))
    if not is_executable(target):
        raise FetchError("%s is in the archive but is not an executable file" % expect, "TAR_LAYOUT")


def move_into(staging, dest):
    """The extracted entries replace same-named entries of dest."""
    for name in os.listdir(staging):
        target = os.path.join(dest, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
        os.rename(os.path.join(staging, name), target)


def remove_stale_staging(dest):
    """Extraction folders left by a fetch that was killed (we hold dest's lock: none is live)."""
    for name in os.listdir(dest):
        if name.startswith(".extract-"):
            shutil.rmtree(os.path.join(dest, name), ignore_errors=True)


def default_archive(url, dest):
    name = posixpath.basename(urllib.parse.urlsplit(url).path) or "download.tar"
    return os.path.join(os.path.dirname(os.path.abspath(dest)), name)


def check_local_archive(path, sha256, size):
    """A file:// archive is read where it lies (never copied, never removed), checked all the same."""
    if not os.path.isfile(path):
        raise FetchError("no such archive: %s" % path)
    got, digest = check_content(path, path, sha256, size)
    print("FETCH_FILE %s size=%d sha256=%s (local)" % (path, got, digest))


def fetch_tar(url, dest, expect, sha256, size, wait_s, token, backoff, archive=None, keep_archive=False):
    """Download the archive (next to dest unless --archive; a file:// archive is read in place),
    extract it safely into a staging folder inside dest, fix its layout there, then move its
    entries into dest."""
    check_relpath(expect)
    dest = dest.rstrip("/") or "/"
    local = local_source(url) if archive is None else None
    archive = local or archive or default_archive(url, dest)
    if same_path(archive, dest):
        raise FetchError("the archive would overwrite %s: pass --archive" % dest)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with exclusive(dest + ".lock", wait_s, dest):
        if is_executable(os.path.join(dest, expect)):
            print("FETCH_DONE %s expect=%s (already present)" % (dest, expect))
            return
        if local:
            check_local_archive(local, sha256, size)
        else:
            fetch_file(url, archive, sha256, size, None, wait_s, token, backoff, marker="FETCH_FILE")
        os.makedirs(dest, exist_ok=True)
        remove_stale_staging(dest)
        staging = tempfile.mkdtemp(prefix=".extract-", dir=dest)
        try:
            names = extract_safely(archive, staging)
            ensure_layout(staging, expect, names)
            move_into(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if not (keep_archive or local):
            os.unlink(archive)  # playbook §4: intermediate files go as soon as they are used
    print("FETCH_DONE %s expect=%s files=%d" % (dest, expect, len(names)))


# ------------------------------------------------------------------ command line


def sha256_arg(text):
    if not re.match(r"^[0-9a-fA-F]{64}$", text):
        raise argparse.ArgumentTypeError("expected 64 hex digits")
    return text.lower()


def size_arg(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError("expected a byte count")
    return int(text)


def range_arg(text):
    m = re.match(r"^(\d+)-(\d+)$", text)
    if not m or int(m.group(2)) < int(m.group(1)):
        raise argparse.ArgumentTypeError("expected START-END with END >= START (inclusive, like curl -r)")
    return int(m.group(1)), int(m.group(2))


def url_arg(text):
    if urllib.parse.urlsplit(text).scheme not in SCHEMES:
        raise argparse.ArgumentTypeError("expected an http://, https:// or file:// URL")
    return text


def build_parser():
    parser = argparse.ArgumentParser(
        prog="fetch.py", description="Fetch files onto the box: locked per file, resumable, size/sha256 checked.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage, 75 busy (another fetch holds the lock).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="when another fetch holds the lock, wait this long for it (default: give up at once)")
    common.add_argument("--auth-env", metavar="NAME",
                        help="send 'Authorization: Bearer $NAME' (the value is never printed)")
    common.add_argument("--backoff", type=float, default=1.0, metavar="SECONDS",
                        help="first retry delay, doubled on each retry (default 1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    one = sub.add_parser("file", parents=[common], help="one file (or a byte range of it)")
    one.add_argument("--url", required=True, type=url_arg)
    one.add_argument("--out", required=True, metavar="PATH", help="where the file goes (PATH.part while downloading)")
    one.add_argument("--sha256", type=sha256_arg, metavar="HEX", help="expected sha256 of the output")
    one.add_argument("--size", type=size_arg, metavar="N", help="expected size of the output in bytes")
    one.add_argument("--range", type=range_arg, metavar="START-END",
                     help="only bytes START..END inclusive (like curl -r); the output is just that slice")

    many = sub.add_parser("manifest", parents=[common], help="every file a JSON manifest lists")
    many.add_argument("--url", required=True, type=url_arg,
                      help='URL of {"files": [{"path", "size", "sha256"}]}; paths are relative to its folder')
    many.add_argument("--dest", required=True, metavar="DIR")

    tar = sub.add_parser("tar", parents=[common], help="a tarball, extracted safely, with its layout checked")
    tar.add_argument("--url", required=True, type=url_arg)
    tar.add_argument("--dest", required=True, metavar="DIR")
    tar.add_argument("--expect", required=True, metavar="REL_PATH",
                     help="executable that must end up at DIR/REL_PATH (a nested tree is flattened to get it)")
    tar.add_argument("--sha256", type=sha256_arg, metavar="HEX", help="expected sha256 of the archive")
    tar.add_argument("--size", type=size_arg, metavar="N", help="expected size of the archive")
    tar.add_argument("--archive", metavar="PATH", help="where the archive is downloaded (default: beside DIR)")
    tar.add_argument("--keep-archive", action="store_true", help="keep the archive after extracting it")
    return parser


def bearer_token(name):
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise FetchError("environment variable %s is not set" % name)
    return value


def run(args):
    token = bearer_token(args.auth_env)
    if args.command == "file":
        fetch_file(args.url, args.out, args.sha256, args.size, args.range, args.wait, token, args.backoff)
    elif args.command == "manifest":
        fetch_manifest(args.url, args.dest, args.wait, token, args.backoff)
    else:
        fetch_tar(args.url, args.dest, args.expect, args.sha256, args.size, args.wait, token, args.backoff,
                  args.archive, args.keep_archive)


def main(argv=None):
    sys.stdout.reconfigure(line_buffering=True)  # the log is a file: each line must land as it is printed
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except Busy as e:
        print("FETCH_BUSY another fetch of %s is running (pid %s)" % (e.what, e.pid))
        return EXIT_BUSY
    except FetchError as e:
        print("%s %s" % (e.marker, e))
        return 1
    except OSError as e:
        print("FETCH_FAIL %s" % one_line(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
