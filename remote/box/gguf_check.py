"""Check a GGUF file's header and layout without loading it: the post-surgery and post-download check.

Runs ON the box (standard library only, Python >= 3.8) and in the console, which passes a
`read_at` that does remote range reads. It reads the header (all KVs and ALL tensor infos: the
header ends after the last tensor info, not after the last KV) and never the tensor data.
The header is read by gguf_format.py; this module judges the layout it describes.

Library:
  check(read_at, file_size, expect_tensors=None, expect_last=None) -> dict
  inspect(...) -> (dict, [Tensor], [(key, value type, start, end)])   (what surgery builds on)
      read_at(offset, length) -> bytes returns up to `length` bytes from `offset`.
  check_file(path, expect_tensors=None, expect_last=None) -> dict   (OSError if unreadable)

CLI:
  python3 -m samai_box.gguf_check FILE [--expect-tensors N] [--last-tensor NAME] [--json]
  exit 0: no error-level problem, 1: problems, 2: the file could not be read.

Result: {"ok", "version", "tensor_count", "kv_count", "alignment", "header_end", "data_start",
         "data_end", "expected_size", "size_note", "file_size", "tensors", "first_tensor", "last_tensor",
         "kv", "arrays", "architecture", "embedding_length", "projector",
         "problems": [{"code", "severity", "message", "offset"}]}
  embedding_length: a text model's {architecture}.embedding_length (None for a projector);
  projector: for an mmproj file (architecture "clip"), {"projector_type", "has_vision_encoder",
  "projection_dim" (the embedding size it feeds the text model), "image_size", "patch_size",
  "embedding_length" (the vision tower's), "block_count"}, each None when absent; else None.
  header_end: where the last tensor info ends; data_end: data_start + max(offset + nbytes), the
  least a loader needs (header_end when there are no tensors); expected_size: data_start + that
  end padded to the alignment, which is what GGUF writers produce. A size in between is fine, and
  size_note says why (a vocab-only file ends at header_end: nothing follows to pad for).

Problem codes (a contract: `samai-console check gguf` and its users match on them): lfs_pointer,
  bad_magic, bad_version, bad_kv_type, absurd_count (a count or length no file has: the "string
  length 2^58" trap of a misplaced patch), header_truncated (ends inside its header), misaligned, overlap,
  truncated (file shorter than its tensors need), oversize (longer than its header describes),
  tensor_count_mismatch, last_tensor_mismatch; and also bad_tensor_type, bad_shape, bad_alignment,
  duplicate_name, unexpected_offset (llama.cpp refuses those files too), bad_string_length,
  over_limit (the header declares more than this check reads: see below), unreadable (CLI
  only); for a projector (general.architecture "clip", an mmproj file), from
  check() only (inspect() judges a sound GGUF, what surgery needs): no_projector_type,
  no_vision_encoder, no_projection_dim, bad_projector_kv (a clip key of a type llama.cpp's clip
  loader does not read: it aborts). Every problem is severity "error" today.
  Cut or corrupt, and the fix each hint gives: a file that ends inside its header is
  header_truncated (fetch it again) when everything read so far is what real files hold, counts
  included (a model has thousands of tensors and KVs, not 2^58); absurd_count (redo the patch) is
  for a count or length no file has; bad_string_length (corrupt, not cut) when the parse failed
  after a string length under the hard limit but beyond what real keys, tokens or values hold.
  Limits (gguf_format.py says why each value): over MAX_TENSORS tensors, MAX_KVS KVs,
  MAX_KEY_BYTES of keys, MAX_ARRAY_ITEMS items in one array, a MAX_STRING_LENGTH string or
  MAX_HEADER_BYTES of header, where the file has room for them, the check reports over_limit
  with the number declared and the limit, and reads no further; without the room, the same
  numbers are absurd_count. So what a check costs follows the bytes there, never a count.
  The tensor table is read in columns (gguf_format.TensorTable): check() keeps a name and three
  numbers per tensor; inspect() also keeps each Tensor, for surgery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .gguf_format import ReadAt, Span, Tensor

import argparse
import json
import os
import sys

from .gguf_format import (
    BOOL,
    FILE_TYPE_NAMES,
    STRING,
    UINT32,
    VALUE_TYPE_NAMES,
    HeaderProblem,
    Problems,
    RangeReader,
    TensorTable,
    Truncated,
    align,
    empty_result,
    read_header,
)

SUMMARY_KEYS = ("general.architecture", "general.name", "general.file_type", "general.size_label",
                "general.quantization_version")

# ---------------------------------------------------------------------------------------------
# Tensor data layout, judged on the table's columns (gguf_format.TensorTable): tensor i is
# table.names[i], at table.offsets[i] in the data area, table.nbytes(i) long, its info at
# table.info_offsets[i].


def check_alignment_of_tensors(table: TensorTable, alignment: int, problems: Problems) -> None:
    for i, offset in enumerate(table.offsets):
        if offset % alignment:
            problems.add("misaligned", "Tensor %r offset %d is not a multiple of the alignment %d."
                         % (table.names[i], offset, alignment), table.info_offsets[i])


def check_overlaps(table: TensorTable, problems: Problems) -> None:
    """Each tensor against the one before it in the data (of those of a known size)."""
    before, end = None, 0  # the tensor before (its index) and where its data ends
    for i in table.by_offset():
        size = table.nbytes(i)
        if size is None:
            continue
        if before is not None and table.offsets[i] < end:
            problems.add("overlap", "Tensor %r [%d, %d) overlaps %r [%d, %d) (offsets relative to"
                         " the data start)." % (table.names[i], table.offsets[i], table.offsets[i] + size,
                                                table.names[before], table.offsets[before], end), table.info_offsets[i])
        before, end = i, table.offsets[i] + size


def check_within_file(table: TensorTable, data_start: int, file_size: int, problems: Problems) -> None:
    room = file_size - data_start  # what the data area may hold
    for i, offset in enumerate(table.offsets):
        size = table.nbytes(i)
        if size is not None and offset + size > room:
            problems.add("truncated", "Tensor %r data [%d, %d) runs past the end of the %d-byte file."
                         % (table.names[i], data_start + offset, data_start + offset + size, file_size),
                         table.info_offsets[i])


def check_contiguous(table: TensorTable, alignment: int, problems: Problems) -> None:
    """llama.cpp wants each tensor right after the previous one, padded: 'has offset X, expected Y'."""
    expected = 0
    for i, offset in enumerate(table.offsets):
        size = table.nbytes(i)
        if size is None:
            return
        if offset != expected:
            problems.add("unexpected_offset", "Tensor %r has offset %d, expected %d (llama.cpp refuses this:"
                         " tensors must follow each other, padded to %d)." % (table.names[i], offset, expected,
                                                                              alignment), table.info_offsets[i])
            return
        expected += align(size, alignment)


def check_size(result: dict[str, Any], table: TensorTable, problems: Problems) -> None:
    data_start, alignment, file_size = result["data_start"], result["alignment"], result["file_size"]
    if table.unknown_sizes:
        return  # an unknown type was reported already; the size cannot be known
    end = table.data_end
    result["data_end"] = data_start + end if len(table) else result["header_end"]
    result["expected_size"] = data_start + align(end, alignment)
    if result["data_end"] <= file_size < result["expected_size"]:
        result["size_note"] = size_note(result, table)
    if file_size < result["data_end"]:
        problems.add("truncated", "The file is %d bytes, %d SHORT of data_start %d + end of tensor data %d = %d"
                     " (truncated download or copy?)." % (file_size, result["data_end"] - file_size, data_start, end,
                                                          result["data_end"]), file_size)
    elif file_size > result["expected_size"]:
        problems.add("oversize", "The file is %d bytes, %d BIGGER than data_start %d + padded end of tensor"
                     " data %d = %d: the header does not describe it all (tensor infos lost or data appended?)."
                     % (file_size, file_size - result["expected_size"], data_start, align(end, alignment),
                        result["expected_size"]), result["expected_size"])


def size_note(result: Mapping[str, Any], table: TensorTable) -> str:
    """Why a file under expected_size is still whole: nothing a loader reads is missing."""
    short = result["expected_size"] - result["file_size"]
    if not len(table):
        return ("No tensors (a vocab-only file): the file ends where its header ends (%d); expected_size %d only"
                " adds the padding to the alignment %d that a data section would start at, and there is none"
                " (%d bytes)." % (result["header_end"], result["expected_size"], result["alignment"], short))
    return ("The file ends where the last tensor's data ends (data_end %d), without the %d bytes of padding to"
            " the alignment %d that writers usually add: a loader reads nothing from them."
            % (result["data_end"], short, result["alignment"]))


def check_layout(result: dict[str, Any], table: TensorTable, problems: Problems) -> None:
    alignment = result["alignment"]
    check_alignment_of_tensors(table, alignment, problems)
    check_overlaps(table, problems)
    check_within_file(table, result["data_start"], result["file_size"], problems)
    if not (problems.counts.get("misaligned") or problems.counts.get("overlap")):
        check_contiguous(table, alignment, problems)
    check_size(result, table, problems)


# ---------------------------------------------------------------------------------------------
# What the file is: a text model's embedding size, a projector's clip keys

CLIP = "clip"  # general.architecture of an mmproj file (llama.cpp's convert_hf_to_gguf.py --mmproj)
# The projector's figures: result key -> (GGUF key, the value type llama.cpp's clip loader reads).
PROJECTOR_KEYS = (
    ("projector_type", "clip.projector_type", STRING),
    ("has_vision_encoder", "clip.has_vision_encoder", BOOL),
    ("projection_dim", "clip.vision.projection_dim", UINT32),
    ("image_size", "clip.vision.image_size", UINT32),
    ("patch_size", "clip.vision.patch_size", UINT32),
    ("embedding_length", "clip.vision.embedding_length", UINT32),
    ("block_count", "clip.vision.block_count", UINT32),
)
MIXED_PROJECTOR_TYPE = "clip.vision.projector_type"  # what llama.cpp reads when clip.projector_type is absent
PROJECTOR_CODES = ("no_projector_type", "no_vision_encoder", "no_projection_dim", "bad_projector_kv")


def describe_model(result: dict[str, Any], types: Mapping[str, int]) -> None:
    """The architecture, a text model's embedding size, a projector's figures (a clip key of
    another type than the loader reads counts as absent). types: each KV's value type, by key."""
    kv = result["kv"]
    arch = kv.get("general.architecture")
    result["architecture"] = arch if isinstance(arch, str) else None
    if arch != CLIP:
        size = kv.get("%s.embedding_length" % arch) if isinstance(arch, str) else None
        result["embedding_length"] = size if is_count(size) else None
        return
    result["projector"] = projector = {}
    for name, key, want in PROJECTOR_KEYS:
        key = projector_key(name, key, types)
        value = kv.get(key) if types.get(key) == want else None
        projector[name] = None if want == UINT32 and not value else value


def projector_key(name: str, key: str, types: Mapping[str, int]) -> str:
    if name == "projector_type" and key not in types and MIXED_PROJECTOR_TYPE in types:
        return MIXED_PROJECTOR_TYPE
    return key


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def judge_projector(projector: Mapping[str, Any], types: Mapping[str, int], problems: Problems) -> None:
    """What makes llama.cpp's clip loader refuse a projector, or its server answer images blind."""
    for name, key, want in PROJECTOR_KEYS:
        key = projector_key(name, key, types)
        if key in types and types[key] != want:
            problems.add("bad_projector_kv", "%s is a %s; llama.cpp's clip loader reads a %s (and aborts on any"
                         " other type)." % (key, VALUE_TYPE_NAMES.get(types[key], types[key]), VALUE_TYPE_NAMES[want]))
    if not projector["projector_type"]:
        problems.add("no_projector_type", "A projector (general.architecture \"clip\") without clip.projector_type"
                     " (or %s): llama.cpp refuses it (unknown projector type)." % MIXED_PROJECTOR_TYPE)
    if projector["has_vision_encoder"] is not True:
        why = "false" if projector["has_vision_encoder"] is False else "absent"
        problems.add("no_vision_encoder", "clip.has_vision_encoder is %s: this projector has no vision encoder,"
                     " so it cannot read an image." % why)
    if not projector["projection_dim"]:
        problems.add("no_projection_dim", "No clip.vision.projection_dim: the embedding size the projector feeds"
                     " the text model is unknown, so neither llama.cpp nor the preflight can match it to a model.")


def check_expectations(result: Mapping[str, Any], complete: bool, expect_tensors: int | None, expect_last: str | None,
                       problems: Problems) -> None:
    if expect_tensors is not None and result["tensor_count"] is not None and result["tensor_count"] != expect_tensors:
        problems.add("tensor_count_mismatch", "The header has %d tensors, expected %d."
                     % (result["tensor_count"], expect_tensors), 8)
    if expect_last is not None and complete and result["last_tensor"] != expect_last:
        problems.add("last_tensor_mismatch", "The last tensor is %r, expected %r."
                     % (result["last_tensor"], expect_last), None)


# ---------------------------------------------------------------------------------------------
# Entry points


def check(read_at: ReadAt, file_size: int, expect_tensors: int | None = None,
          expect_last: str | None = None) -> dict[str, Any]:
    """Check the GGUF file behind read_at(offset, length) -> bytes; never reads tensor data. A
    projector is judged as llama.cpp's clip loader would (surgery, through inspect, judges only
    whether the file is a sound GGUF: it may be what fixes a projector's keys)."""
    result, _table, spans = examine(read_at, file_size, expect_tensors, expect_last, TensorTable(keep=False))
    if result["projector"] is not None:
        problems = Problems()
        judge_projector(result["projector"], dict((key, kind) for key, kind, _start, _end in spans), problems)
        result["problems"] += problems.finish()
        result["ok"] = result["ok"] and not problems.has_errors()
    return result


def inspect(read_at: ReadAt, file_size: int, expect_tensors: int | None = None,
            expect_last: str | None = None) -> tuple[dict[str, Any], list[Tensor], list[Span]]:
    """check(), and what surgery needs besides the result: (result, the tensor infos read (a
    list of Tensors, empty unless the whole header was read), each KV's (key, value type, start,
    end) in the file)."""
    result, table, spans = examine(read_at, file_size, expect_tensors, expect_last, TensorTable(keep=True))
    return result, (table.kept or []) if result["header_end"] is not None else [], spans  # kept: keep=True


def examine(read_at: ReadAt, file_size: int, expect_tensors: int | None, expect_last: str | None,
            table: TensorTable) -> tuple[dict[str, Any], TensorTable, list[Span]]:
    """The header read into `table` (a TensorTable) and judged: (result, table, KV spans)."""
    result = empty_result(file_size)
    result.update(architecture=None, embedding_length=None, projector=None)
    problems = Problems()
    reader = RangeReader(read_at, file_size)
    complete = False
    spans: list[Span] = []
    try:
        read_header(reader, result, problems, spans, table)
        complete = True
        check_layout(result, table, problems)
        describe_model(result, dict((key, kind) for key, kind, _start, _end in spans))
    except HeaderProblem as problem:
        problems.add(problem.code, problem.message, problem.offset)
    except Truncated as cut:  # read_at gave less than file_size promised: the file shrank
        problems.add("header_truncated", "The file ended at offset %d while reading the header (%d bytes"
                     " expected there)." % (cut.offset, cut.length), cut.offset)
    check_expectations(result, complete, expect_tensors, expect_last, problems)
    result["problems"] = problems.finish()
    result["ok"] = not problems.has_errors()
    return result, table, spans


def check_file(path: str, expect_tensors: int | None = None, expect_last: str | None = None) -> dict[str, Any]:
    """check() on a local file. Raises OSError when the file cannot be opened or read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read_at(offset: int, length: int) -> bytes:
            f.seek(offset)
            return f.read(length)

        return check(read_at, size, expect_tensors=expect_tensors, expect_last=expect_last)


def unreadable_result(path: str, error: object) -> dict[str, Any]:
    result = empty_result(None)
    result["problems"] = [{"code": "unreadable", "severity": "error", "offset": None,
                           "message": "Cannot read %s: %s" % (path, error)}]
    return result


def describe_kv(key: str, value: Any) -> str:
    if key == "general.file_type" and value in FILE_TYPE_NAMES:
        return "%s (%s)" % (value, FILE_TYPE_NAMES[value])
    return str(value)


def expected_size_text(result: Mapping[str, Any]) -> str:
    """Writers pad the end to the alignment; a file that stops where the data ends is fine too."""
    low, high = result["data_end"], result["expected_size"]
    if low is None or low == high:
        return str(high)
    return "%s..%s (data end..padded)" % (low, high)


def summary(path: str, result: Mapping[str, Any]) -> str:
    lines = ["%s: %s" % (path, "OK" if result["ok"] else "PROBLEMS")]
    lines.append("  GGUF v%s, %s KVs, %s tensors (%s read), alignment %s" % (
        result["version"], result["kv_count"], result["tensor_count"], result["tensors"], result["alignment"]))
    lines.append("  header ends at %s, data starts at %s" % (result["header_end"], result["data_start"]))
    lines.append("  size %s bytes, expected %s" % (result["file_size"], expected_size_text(result)))
    if result["size_note"]:
        lines.append("  " + result["size_note"])
    if result["tensors"]:
        lines.append("  tensors: first %s, last %s" % (result["first_tensor"], result["last_tensor"]))
    for key in SUMMARY_KEYS:
        if key in result["kv"]:
            lines.append("  %s = %s" % (key, describe_kv(key, result["kv"][key])))
    if result.get("embedding_length"):
        lines.append("  embedding_length %s (%s.embedding_length)"
                     % (result["embedding_length"], result["architecture"]))
    if result.get("projector"):
        lines.append("  " + projector_text(result["projector"]))
    for key, info in sorted(result["arrays"].items()):
        if key.startswith("tokenizer.ggml.tokens"):
            lines.append("  %s = arr[%s,%d]" % (key, info["type"], info["count"]))
    for p in result["problems"]:
        at = "" if p["offset"] is None else " @%d" % p["offset"]
        lines.append("  %s %s%s: %s" % (p["severity"], p["code"], at, p["message"]))
    return "\n".join(lines)


def projector_text(projector: Mapping[str, Any]) -> str:
    """A projector's figures on one line, for a person."""
    p = projector
    return ("projector (mmproj): type %s, projection_dim %s (the text model's embedding size it needs),"
            " vision encoder %s, image %s px, patch %s px, %s vision blocks of %s"
            % (p["projector_type"], p["projection_dim"], {True: "yes", False: "no"}.get(p["has_vision_encoder"], "?"),
               p["image_size"], p["patch_size"], p["block_count"], p["embedding_length"]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Check a GGUF file's header and layout (reads no tensor data).")
    parser.add_argument("file")
    parser.add_argument("--expect-tensors", type=int, metavar="N", help="the tensor count it must have")
    parser.add_argument("--last-tensor", metavar="NAME", help="the name the last tensor info must have")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = check_file(args.file, expect_tensors=args.expect_tensors, expect_last=args.last_tensor)
        code = 0 if result["ok"] else 1
    except OSError as e:
        result = unreadable_result(args.file, e)
        code = 2
    if args.json:
        print(json.dumps(result))
    else:
        print(summary(args.file, result), file=sys.stdout if code != 2 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
