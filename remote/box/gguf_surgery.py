"""GGUF surgery on the box: show a header, set a KV, add tensors from a donor, extract tensors.

Runs ON the box (standard library only, Python >= 3.8). Request on stdin, reply on stdout:

  {"op": "show", "workspace", "path"}  ->  the header (bounded), KVs, tensor table, problems
  {"op": "set_kv", "workspace", "path", "out", "set": {KEY: VALUE}, "types": {KEY: T}}
  {"op": "add_tensors", "workspace", "path", "donor", "tensors": [NAME], "out",
   "expect_tensors"?, "expect_last"?}
  {"op": "extract", "workspace", "path", "tensors": [NAME], "out"}
  Any write op with "plan": true writes nothing and says what it would: its size ("bytes"),
  tensor count, last tensor, the disk free where OUT goes ("free"), and its "pin". Given back
  with the write ("pin": the plan's), the write is of exactly that plan: each source's size,
  validators and header sha256, the output's size and the byte ranges read from each source
  must be the same, or it is refused with the difference before any tensor byte is fetched.
  Any op may carry "redirect_hosts": [HOST], the hosts a URL may redirect to besides its own.

A path is relative to the workspace or absolute; `path` and `donor` may be http(s) URLs, read
by byte range only (gguf_source.py). OUT lies inside the workspace (confine.py), never exists
yet, and is never the input: the input is never modified. The output is written as OUT.part,
then every mandatory assertion runs on what was written (gguf_write.py), and only then is it
renamed to OUT, never over anything there. An OUT.part that exists already (an earlier run
that did not finish, or someone else's) is refused and left alone: only the operator knows
whether it may go. An input or donor that the checker finds broken (a kv_count patched one
byte off, a header_end taken too early) is refused, its problem named.

Write reply: {"ok", "op", "out", "planned", "bytes", "tensors", "last_tensor", "added",
"fetched", "donor_size", "free", "pin", "assertions": [{"name", "ok", "detail"}], "failure"?};
a write request this tool cannot read is a failure too ("bad request: ..."). Any other request
that is not one of these is {"error": ...}. (wire.py: GgufRequest, GgufWriteReply.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Mapping, Sequence, cast

if TYPE_CHECKING:
    from .gguf_format import Span, Tensor
    from .gguf_source import Source

import os
import re
import sys

from .confine import Escape, open_parent, parts_inside, workspace_root
from .gguf_check import inspect
from .gguf_format import (
    ARRAY,
    BOOL,
    GGML_TYPES,
    STRING,
    U32,
    VALUE_TYPE_NAMES,
    HeaderProblem,
    RangeReader,
    Truncated,
)
from .gguf_source import SourceError, is_url, open_source, refuse_changes
from .gguf_write import (
    PART,
    Layout,
    OutTensor,
    WriteError,
    create_part,
    discard_part,
    encode_kv,
    encode_value,
    publish,
    tensor_reads,
    type_of,
    verify,
    write_part,
)
from .procfs import one_line, serve
from .wire import Assertion, GgufRequest, GgufWriteReply

MAX_SHOW_KVS = 256
MAX_SHOW_TENSORS = 4096
SHOW_STRING = 160  # characters of a string value shown
SHOW_ITEMS = 5  # an array's first items shown
SHOW_ITEM = 40
MAX_NAMES = 4096
WRITE_OPS = ("set_kv", "add_tensors", "extract")
FIXED_KEYS = ("general.alignment",)  # changing it would move every tensor: not a KV edit
MAX_REDIRECT_HOSTS = 16
HOST_NAME = re.compile(r"[A-Za-z0-9._:-]{1,253}")  # a name, an IPv4 or an IPv6 address (urlsplit's hostname)


class Refused(Exception):
    """The request is understood but will not be carried out: why, with the numbers."""


class BadRequest(Exception):
    """The request is not one this tool reads: the field and what it must be."""


def handle(raw: Any) -> dict[str, Any] | GgufWriteReply:
    """The reply to one request; never raises for anything JSON can hold (each value is checked
    where it is read: a GgufRequest names the keys, not what came)."""
    if not isinstance(raw, dict):
        return {"error": "bad request: not an object"}
    req = cast(GgufRequest, raw)
    op = req.get("op")
    try:
        if op == "show":
            return show(req)
        if op in WRITE_OPS:
            return write(req, op)
        return {"error": "bad request: op %r is not one of show, %s" % (str(op)[:40], ", ".join(WRITE_OPS))}
    except BadRequest as e:
        if op in WRITE_OPS:
            return failure(req, op, "bad request: %s" % e)
        return {"error": "bad request: %s" % e}
    except (SourceError, OSError) as e:
        if op == "show":
            return {"error": one_line(e) if isinstance(e, OSError) else str(e)}
        return failure(req, op, one_line(e) if isinstance(e, OSError) else str(e))
    except (Refused, WriteError, Escape) as e:
        return failure(req, op, str(e))


def failure(req: GgufRequest, op: Any, why: str) -> GgufWriteReply:
    out = req.get("out")
    return {"ok": False, "op": op, "out": out if isinstance(out, str) else "",
            "planned": bool(req.get("plan")), "failure": why, "assertions": []}


def text(req: Mapping[str, Any], key: str, required: bool = True) -> Any:
    value = req.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise BadRequest("%s must be a non-empty string" % key)
    return value


def names_of(req: Mapping[str, Any], key: str) -> list[str]:
    value = req.get(key)
    if not isinstance(value, list) or not value or len(value) > MAX_NAMES:
        raise BadRequest("%s must be a list of 1 to %d names" % (key, MAX_NAMES))
    if not all(isinstance(n, str) and n for n in value):
        raise BadRequest("%s must hold names (strings)" % key)
    return list(dict.fromkeys(value))  # each once, in the order given


def optional_int(req: Mapping[str, Any], key: str) -> int | None:
    value = req.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise BadRequest("%s must be a count" % key)
    return value


def redirect_hosts(req: Mapping[str, Any]) -> list[str]:
    hosts = req.get("redirect_hosts")
    if hosts is None:
        return []
    if (not isinstance(hosts, list) or len(hosts) > MAX_REDIRECT_HOSTS
            or not all(isinstance(h, str) and HOST_NAME.fullmatch(h) for h in hosts)):
        raise BadRequest("redirect_hosts must be a list of at most %d host names" % MAX_REDIRECT_HOSTS)
    return hosts


def plan_pin(req: Mapping[str, Any], sources: int) -> dict[str, Any] | None:
    """The plan's pin given back with a write, its shape checked; None when there is none."""
    pin = req.get("pin")
    if pin is None:
        return None
    if not (isinstance(pin, dict) and type(pin.get("bytes")) is int and isinstance(pin.get("reads"), list)
            and isinstance(pin.get("sources"), list) and len(pin["sources"]) == sources
            and all(isinstance(s, dict) and all(v is None or type(v) in (int, str) for v in s.values())
                    for s in pin["sources"])):
        raise BadRequest("pin must be the plan's: {bytes, reads, sources: one per source}")
    return pin


def read_exactly(source: Source, start: int, length: int) -> bytes:
    parts, got = [], 0
    while got < length:
        part = source.read_at(start + got, length - got)
        if not part:
            raise SourceError("%s ended at %d, inside its header" % (source.name, start + got))
        parts.append(part)
        got += len(part)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# show


def show(req: GgufRequest) -> dict[str, Any]:
    workspace = text(req, "workspace")
    path = text(req, "path")
    source = open_source(path, workspace, allowed_hosts=redirect_hosts(req))
    try:
        result, tensors, spans = inspect(source.read_at, source.size)
        reader = RangeReader(source.read_at, source.size)
        kvs = [describe_kv(reader, span) for span in spans[:MAX_SHOW_KVS]]
    finally:
        source.close()
    return {
        "path": path, "file_size": source.size, "version": result["version"],
        "tensor_count": result["tensor_count"], "kv_count": result["kv_count"],
        "alignment": result["alignment"], "header_end": result["header_end"],
        "data_start": result["data_start"], "data_end": result["data_end"],
        "kvs": kvs, "kvs_left_out": max(0, len(spans) - MAX_SHOW_KVS),
        "tensors": [tensor_row(t) for t in tensors[:MAX_SHOW_TENSORS]],
        "tensors_left_out": max(0, len(tensors) - MAX_SHOW_TENSORS),
        "problems": result["problems"],
    }


def tensor_row(t: Tensor) -> dict[str, Any]:
    type_name = GGML_TYPES[t.type_id][0] if t.type_id in GGML_TYPES else "type %d" % t.type_id
    return {"name": t.name, "type": type_name, "shape": list(t.dims), "offset": t.offset, "size": t.nbytes}


def describe_kv(reader: RangeReader, span: Span) -> dict[str, Any]:
    """{"key", "type", "value" (short text), "count" (arrays)} of one KV, read again from its place."""
    key, value_type, start, _end = span
    row: dict[str, Any] = {"key": key, "type": VALUE_TYPE_NAMES[value_type], "value": "", "count": None}
    try:
        reader.pos = start
        reader.skip(reader.u64())
        reader.u32()
        if value_type == ARRAY:
            element, count, items = array_head(reader)
            row.update(type="arr[%s]" % VALUE_TYPE_NAMES.get(element, "?"), count=count,
                       value="[%d items of %s] %s" % (count, VALUE_TYPE_NAMES.get(element, "?"), ", ".join(items))
                       + (" ..." if count > len(items) else ""))
        else:
            row["value"] = value_text(reader, value_type, SHOW_STRING)
    except (Truncated, HeaderProblem, KeyError, ValueError):
        row["value"] = "?"
    return row


def value_text(reader: RangeReader, value_type: int, limit: int) -> str:
    if value_type == STRING:
        length = reader.u64()
        shown = reader.take(min(length, limit)).decode("utf-8", "replace")
        return shown + ("... (%d bytes)" % length if length > limit else "")
    value = reader.scalar(value_type)
    if value_type == BOOL:
        return "true" if value else "false"
    return repr(value)


def array_head(reader: RangeReader) -> tuple[int, int, list[str]]:
    element = reader.u32()
    count = reader.u64()
    items = []
    if element in VALUE_TYPE_NAMES and element != ARRAY:
        for _ in range(min(count, SHOW_ITEMS)):
            items.append(value_text(reader, element, SHOW_ITEM))
    return element, count, items


# ---------------------------------------------------------------------------------------------
# set_kv, add_tensors, extract


class Header:
    """A source checked and read: the checker's result, its tensor infos and KV places, and
    its pin (the source's, with the header's sha256), checked against the plan's (pinned)."""

    def __init__(self, source: Source, role: str, pinned: Mapping[str, Any] | None = None) -> None:
        self.source = source
        self.result, self.tensors, self.spans = inspect(source.read_at, source.size)
        if not self.result["ok"]:
            problems = "; ".join("%s: %s" % (p["code"], p["message"]) for p in self.result["problems"][:3])
            raise Refused("the %s %s is not a sound GGUF file, refused (nothing written): check gguf finds %s"
                          % (role, source.name, problems))
        self.by_name = dict((t.name, t) for t in self.tensors)
        self.pin = dict(source.pin or {}, header_sha256=source.header_sha256(self.result["header_end"]))
        refuse_changes("the %s %s" % (role, source.name), pinned, self.pin, ("header_sha256",))

    def raw_kvs(self) -> list[tuple[str, int, bytes]]:
        if not self.spans:
            return []
        start, end = self.spans[0][2], self.spans[-1][3]
        data = read_exactly(self.source, start, end - start)
        return [(key, value_type, data[a - start:b - start]) for key, value_type, a, b in self.spans]

    def out_tensor(self, t: Tensor) -> OutTensor:
        nbytes = t.nbytes or 0  # a sound header (the only kind kept) knows every tensor's size
        return OutTensor(t.name, t.dims, t.type_id, nbytes, self.source, self.result["data_start"] + t.offset)

    def kept_tensors(self) -> list[OutTensor]:
        """The tensors as they are: the same infos, the same offsets in the data area."""
        kept = []
        for t in self.tensors:
            out = self.out_tensor(t)
            out.offset = t.offset
            kept.append(out)
        return kept


def picked(header: Header, names: Iterable[str], role: str) -> list[OutTensor]:
    missing = [n for n in names if n not in header.by_name]
    if missing:
        raise Refused("the %s has no tensor named %s (it has %d tensors: %s ...)"
                      % (role, ", ".join(repr(n) for n in missing[:5]), len(header.tensors),
                         ", ".join(t.name for t in header.tensors[:3])))
    return [header.out_tensor(header.by_name[n]) for n in names]


def set_kv_layout(req: GgufRequest, headers: list[Header]) -> tuple[Layout, Sequence[str]]:
    main = headers[0]
    changes = req.get("set")
    types = req.get("types") or {}
    if not isinstance(changes, dict) or not changes or not isinstance(types, dict):
        raise BadRequest("set must be an object {KEY: VALUE} with at least one key, types an object {KEY: T}")
    kvs = []
    done = set()
    for key, value_type, raw in main.raw_kvs():
        if key in changes:
            kvs.append(changed_kv(key, value_type, raw, changes[key], types.get(key)))
            done.add(key)
        else:
            kvs.append(raw)
    for key in changes:
        if key not in done:
            kvs.append(new_kv(key, changes[key], types.get(key)))
    return Layout(main.result["version"], kvs, main.kept_tensors(), main.result["alignment"]), ()


def changed_kv(key: str, value_type: int, raw: bytes, value: Any, given_type: Any) -> bytes:
    if key in FIXED_KEYS:
        raise Refused("%s cannot be set: every tensor's place depends on it" % key)
    element = None
    if value_type == ARRAY:
        element = U32.unpack_from(raw, 8 + len(key.encode("utf-8")) + 4)[0]
    if given_type is not None and type_of(str(given_type)) != (value_type, element):
        raise Refused("%s is a %s in the input; --type %s would change its type" % (key, type_name(value_type, element),
                                                                                   given_type))
    return encode_kv(key, value_type, encode_value(value_type, element, value))


def new_kv(key: str, value: Any, given_type: Any) -> bytes:
    if key in FIXED_KEYS:
        raise Refused("%s cannot be set: every tensor's place depends on it" % key)
    if not key or len(key.encode("utf-8")) > 255:
        raise Refused("%r is not a key (1 to 255 bytes)" % key[:80])
    if given_type is None:
        raise Refused("%s is a new key: its type is needed (--type T: u32, str, f32, bool, arr[str], ...)" % key)
    value_type, element = type_of(str(given_type))
    return encode_kv(key, value_type, encode_value(value_type, element, value))


def type_name(value_type: int, element: int | None) -> str:
    if value_type == ARRAY:
        return "arr[%s]" % ("?" if element is None else VALUE_TYPE_NAMES.get(element, "?"))
    return VALUE_TYPE_NAMES[value_type]


def add_tensors_layout(req: GgufRequest, headers: list[Header]) -> tuple[Layout, Sequence[str]]:
    main, donor = headers
    names = names_of(req, "tensors")
    present = [n for n in names if n in main.by_name]
    if present:
        raise Refused("the input has tensors named %s already" % ", ".join(repr(n) for n in present[:5]))
    added = picked(donor, names, "donor")
    kvs = [raw for _key, _type, raw in main.raw_kvs()]
    return Layout(main.result["version"], kvs, main.kept_tensors() + added, main.result["alignment"]), names


def extract_layout(req: GgufRequest, headers: list[Header]) -> tuple[Layout, Sequence[str]]:
    main = headers[0]
    names = names_of(req, "tensors")
    kvs = [raw for _key, _type, raw in main.raw_kvs()]
    return Layout(main.result["version"], kvs, picked(main, names, "input"), main.result["alignment"]), names


LAYOUTS = {"set_kv": set_kv_layout, "add_tensors": add_tensors_layout, "extract": extract_layout}


def write(req: GgufRequest, op: str) -> GgufWriteReply:
    workspace = workspace_root(text(req, "workspace"))
    out = text(req, "out")
    given = [("input", text(req, "path"))] + ([("donor", text(req, "donor"))] if op == "add_tensors" else [])
    expect_tensors, expect_last = optional_int(req, "expect_tensors"), text(req, "expect_last", required=False)
    pin, hosts = plan_pin(req, len(given)), redirect_hosts(req)
    target = out_target(workspace, out, given[0][1])
    sources: list[Source] = []
    headers: list[Header] = []
    try:
        for role, path in given:
            pinned = source_pin(pin, len(headers))
            sources.append(open_source(path, workspace, pinned, hosts))
            headers.append(Header(sources[-1], role, pinned))
        layout, added = LAYOUTS[op](req, headers)
        reply = planned(req, op, out, layout, added, sources, target)
        reply["pin"] = pin_of(headers, layout)
        refuse_changes("the output", pin, reply["pin"], ("bytes", "reads"))
        expect_tensors, expect_last = expectations(layout, expect_tensors, expect_last)
        if not req.get("plan"):
            reply["assertions"] = carried_out(workspace, out, layout, expect_tensors, expect_last, reply, sources)
            reply["fetched"] = sum(s.fetched for s in sources)
            failed = [a for a in reply["assertions"] if not a["ok"]]
            reply["ok"] = not failed
            if failed:
                reply["failure"] = "an assertion failed, OUT not written: " + "; ".join(a["detail"] for a in failed)
        return reply
    except (Refused, WriteError, SourceError, OSError) as e:
        reply = failure(req, op, one_line(e) if isinstance(e, OSError) else str(e))
        reply["fetched"] = sum(s.fetched for s in sources)  # what a refused donor cost: its header at most
        return reply
    finally:
        for source in sources:
            source.close()


def source_pin(pin: Mapping[str, Any] | None, index: int) -> dict[str, Any] | None:
    return pin["sources"][index] if pin is not None else None


def pin_of(headers: list[Header], layout: Layout) -> dict[str, Any]:
    """What a write must find again: each source's pin, the output's size, and the byte ranges
    (source index, start, length) its tensors are read from."""
    index = dict((id(h.source), i) for i, h in enumerate(headers))
    reads = sorted([index[id(source)], start, end - start] for source, start, end, _members in tensor_reads(layout))
    return {"bytes": layout.size, "sources": [h.pin for h in headers], "reads": reads}


def out_target(workspace: str, out: str, path: str) -> str:
    """OUT's place in the workspace, refused when it leaves it, exists, or is the input."""
    if out.endswith("/"):
        raise Refused("OUT %s names a folder: OUT is the new file's name" % out)
    names = parts_inside(workspace, out)
    target = os.path.join(workspace, *names)
    if not is_url(path) and os.path.realpath(target) == os.path.realpath(os.path.join(workspace, path)):
        raise Refused("OUT %s is the input: there is no in-place mode, write a new file" % out)
    if os.path.isdir(target):
        raise Refused("OUT %s is a folder: OUT is the new file's name" % out)
    if os.path.lexists(target):
        raise Refused("OUT %s exists already: remove it or choose another name" % out)
    if os.path.lexists(target + PART):
        raise Refused("%s%s exists already, left by an earlier run that did not finish or put there by someone"
                      " else; it is not this tool's to remove: remove it, or choose another name" % (out, PART))
    return target


def free_at(target: str) -> int:
    """Bytes free to us on the filesystem OUT would be written to (its nearest existing folder)."""
    folder = os.path.dirname(target)
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def planned(req: GgufRequest, op: str, out: str, layout: Layout, added: Sequence[str], sources: list[Source],
            target: str) -> GgufWriteReply:
    last = layout.tensors[-1].name if layout.tensors else None
    donor = sources[-1]
    return {"ok": True, "op": op, "out": out, "planned": bool(req.get("plan")), "bytes": layout.size,
            "tensors": len(layout.tensors), "last_tensor": last, "added": list(added),
            "fetched": sum(s.fetched for s in sources), "donor_size": donor.size if op != "set_kv" else None,
            "free": free_at(target), "assertions": []}


def expectations(layout: Layout, expect_tensors: int | None, expect_last: str | None) -> tuple[int, str | None]:
    """What the output must show: as asked, and the plan must agree before anything is written."""
    count = len(layout.tensors)
    last = layout.tensors[-1].name if layout.tensors else None
    if expect_tensors is not None and expect_tensors != count:
        raise Refused("expected %d tensors, but the output would have %d: refused, nothing written"
                      % (expect_tensors, count))
    if expect_last is not None and expect_last != last:
        raise Refused("expected the last tensor %r, but the output's would be %r: refused, nothing written"
                      % (expect_last, last))
    return count, last


def carried_out(workspace: str, out: str, layout: Layout, expect_tensors: int, expect_last: str | None,
                reply: GgufWriteReply, sources: list[Source]) -> List[Assertion]:
    """Write OUT.part, assert, rename: OUT appears only when every assertion holds."""
    if reply["free"] < layout.size:
        raise Refused("OUT needs %d bytes and %d are free where it goes: refused, nothing written"
                      % (layout.size, reply["free"]))
    folder, name = open_parent(workspace, out, create=True)
    try:
        refuse_present(folder, name)
        fd = create_part(folder, name)
        published = False
        try:
            write_part(fd, layout)
            for source in sources:
                source.recheck()
            assertions = verify(fd, layout, expect_tensors, expect_last)
            if all(a["ok"] for a in assertions):
                publish(folder, name, fd)
                published = True
            return assertions
        finally:
            if not published:
                discard_part(folder, name, fd)
            os.close(fd)
    finally:
        os.close(folder)


def refuse_present(folder: int, name: str) -> None:
    """OUT was checked before the sources were read: something put there since stays as it is."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    raise WriteError("OUT %s appeared while the sources were read (a file or a link put there): refused, left as"
                     " it is, nothing written" % name)


if __name__ == "__main__":
    sys.exit(serve("gguf_surgery", handle))
