#!/usr/bin/env python3
"""Rewrite proto/ from the wire-schema tables (schema.tsv, enums.tsv, cmdk.tsv).

Usage: python3 tools/gen-proto.py [--tables ../shared/protocol] [--local tools/schema-local.tsv] [--out proto]

`cmdk.tsv` (Cmd+K: `aiserver.v1.CmdKService`, its rerank calls and `ReportCmdKFate`) has the
columns of schema.tsv, `#` comment lines before its header, and its enum values as rows of type
`(enum value)`; its messages go to a file of their own, `aiserver/v1/cmdk.proto`, which imports
the `aiserver.v1` types it shares with the agent schema.

Only `high`-confidence rows are emitted. `schema-local.tsv` (same columns as schema.tsv) adds the
fields newer Cursor releases have that the shared tables do not yet list; tests/schema.rs reads it
too. Presence, oneofs, maps and nesting are kept exactly as
the tables say. `agent.v1` and `aiserver.v1` refer to each other, so the `aiserver.v1` types that
`agent.v1` needs (and their closure) get a file of their own that `agent.v1` imports; the rest of
`aiserver.v1` imports `agent.v1`. Output is deterministic (sorted), so re-running it on the same
tables gives the same bytes.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

SCALARS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32",
    "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
}
WELL_KNOWN = {
    "google.protobuf.Struct": "google/protobuf/struct.proto",
    "google.protobuf.Value": "google/protobuf/struct.proto",
    "google.protobuf.ListValue": "google/protobuf/struct.proto",
    "google.protobuf.NullValue": "google/protobuf/struct.proto",
    "google.protobuf.Timestamp": "google/protobuf/timestamp.proto",
    "google.protobuf.Duration": "google/protobuf/duration.proto",
    "google.protobuf.Empty": "google/protobuf/empty.proto",
    "google.protobuf.Any": "google/protobuf/any.proto",
}
FILES = {
    "agent": ("agent/v1/agent.proto", "agent.v1"),
    "deps": ("aiserver/v1/agent_deps.proto", "aiserver.v1"),
    "aiserver": ("aiserver/v1/aiserver.proto", "aiserver.v1"),
    "cmdk": ("aiserver/v1/cmdk.proto", "aiserver.v1"),
}


def read_tsv(path):
    with open(path, newline="", encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


def read_cmdk(path):
    """cmdk.tsv split into (field rows, enum rows in enums.tsv's columns); empty when absent."""
    if not os.path.exists(path):
        return [], []
    fields, enums = [], []
    for r in read_tsv(path):
        if r["type"] == "(enum value)":
            enums.append({"enum": r["message"], "value_name": r["field_name"], "number": r["field_number"],
                          "confidence": r["confidence"]})
        else:
            fields.append(r)
    return fields, enums


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--tables", default=os.path.join(here, "..", "..", "shared", "protocol"))
    ap.add_argument("--local", default=os.path.join(here, "schema-local.tsv"))
    ap.add_argument("--out", default=os.path.join(here, "..", "proto"))
    args = ap.parse_args()

    rows = read_tsv(os.path.join(args.tables, "schema.tsv"))
    local = read_tsv(args.local) if os.path.exists(args.local) else []
    shared_keys = {(r["message"], r["field_number"]) for r in rows}
    for r in local:
        if (r["message"], r["field_number"]) in shared_keys:
            print("local addition already in the shared tables (remove it): %s = %s" % (r["message"], r["field_number"]), file=sys.stderr)
            sys.exit(1)
    cmdk_rows, cmdk_enums = read_cmdk(os.path.join(args.tables, "cmdk.tsv"))
    for r in cmdk_rows:
        if r["message"] in {x["message"] for x in rows}:
            print("cmdk.tsv redefines a message of schema.tsv: %s" % r["message"], file=sys.stderr)
            sys.exit(1)
    cmdk_tops = {r["message"] for r in cmdk_rows} | {r["enum"] for r in cmdk_enums}
    schema = [r for r in rows + local + cmdk_rows if r["confidence"] == "high"]
    enums_rows = [r for r in read_tsv(os.path.join(args.tables, "enums.tsv")) + cmdk_enums if r["confidence"] == "high"]

    messages = {}  # fq name -> package
    fields = defaultdict(list)  # fq message -> rows
    for r in schema:
        messages[r["message"]] = r["package"]
        if r["label"] != "(empty message)":
            fields[r["message"]].append(r)
    enums = defaultdict(list)
    for r in enums_rows:
        enums[r["enum"]].append(r)

    def package_of(fq):
        for pkg in ("agent.v1", "aiserver.v1"):
            if fq.startswith(pkg + "."):
                return pkg
        return None

    def parent_of(fq):
        """The enclosing message of a nested type, or None at top level."""
        parent = fq.rsplit(".", 1)[0]
        return parent if parent in messages else None

    def top_level(fq):
        while parent_of(fq):
            fq = parent_of(fq)
        return fq

    # Sanity: every referenced type must be known.
    missing = set()
    for msg, rows in fields.items():
        for r in rows:
            t = r["type"]
            if t in SCALARS or t in WELL_KNOWN or t in messages or t in enums:
                continue
            missing.add((msg, r["field_name"], t))
    if missing:
        for m in sorted(missing):
            print("unresolved type: %s.%s -> %s" % m, file=sys.stderr)
        sys.exit(1)

    def refs(fq_top):
        """All non-scalar types referenced from a top-level message and everything nested in it."""
        out = set()
        for msg in messages:
            if top_level(msg) == fq_top:
                for r in fields.get(msg, []):
                    if r["type"] not in SCALARS:
                        out.add(r["type"])
                    if r["label"].startswith("map<"):
                        key = r["label"][4:-1].split(",")[0]
                        if key not in SCALARS:
                            out.add(key)
        return out

    # Split aiserver.v1: the closure of what agent.v1 uses goes into agent_deps.proto.
    deps = set()
    frontier = set()
    for msg, pkg in messages.items():
        if pkg == "agent.v1" and parent_of(msg) is None:
            for t in refs(msg):
                if package_of(t) == "aiserver.v1":
                    frontier.add(top_level_any(t, messages))
    while frontier:
        t = frontier.pop()
        if t in deps:
            continue
        deps.add(t)
        if t in messages:
            for r in refs(t):
                if package_of(r) == "agent.v1":
                    print("agent_deps closure refers back to agent.v1: %s -> %s" % (t, r), file=sys.stderr)
                    sys.exit(1)
                if package_of(r) == "aiserver.v1":
                    frontier.add(top_level_any(r, messages))

    def file_of(fq):
        top = top_level_any(fq, messages)
        if top in cmdk_tops:
            return "cmdk"
        if package_of(top) == "agent.v1":
            return "agent"
        return "deps" if top in deps else "aiserver"

    # Group top-level declarations per file.
    tops = defaultdict(list)
    for msg in messages:
        if parent_of(msg) is None:
            tops[file_of(msg)].append(("message", msg))
    for en in enums:
        if en.rsplit(".", 1)[0] not in messages:
            tops[file_of(en)].append(("enum", en))

    children = defaultdict(list)
    for msg in messages:
        p = parent_of(msg)
        if p:
            children[p].append(("message", msg))
    for en in enums:
        p = en.rsplit(".", 1)[0]
        if p in messages:
            children[p].append(("enum", en))

    def type_ref(t):
        if t in SCALARS:
            return t
        return "." + t

    def render_enum(en, indent):
        pad = "  " * indent
        name = en.rsplit(".", 1)[1]
        vals = sorted(enums[en], key=lambda r: (int(r["number"]), r["value_name"]))
        lines = [pad + "enum %s {" % name]
        if any(int(v["number"]) == 0 for v in vals) is False:
            print("enum without a zero value: %s" % en, file=sys.stderr)
            sys.exit(1)
        numbers = [int(v["number"]) for v in vals]
        if len(set(numbers)) != len(numbers):
            lines.append(pad + "  option allow_alias = true;")
        # proto3 requires the zero value first.
        vals.sort(key=lambda r: (int(r["number"]) != 0, int(r["number"]), r["value_name"]))
        for v in vals:
            lines.append(pad + "  %s = %s;" % (v["value_name"], v["number"]))
        lines.append(pad + "}")
        return lines

    def render_field(r, pad):
        label = r["label"]
        t = type_ref(r["type"])
        if label.startswith("map<"):
            key = label[4:-1].split(",")[0]
            return pad + "map<%s, %s> %s = %s;" % (type_ref(key), t, r["field_name"], r["field_number"])
        prefix = {"singular": "", "optional": "optional ", "repeated": "repeated "}[label]
        return pad + "%s%s %s = %s;" % (prefix, t, r["field_name"], r["field_number"])

    def render_message(msg, indent):
        pad = "  " * indent
        name = msg.rsplit(".", 1)[1]
        lines = [pad + "message %s {" % name]
        for kind, child in sorted(children[msg], key=lambda c: c[1]):
            lines += render_message(child, indent + 1) if kind == "message" else render_enum(child, indent + 1)
        rows = sorted(fields.get(msg, []), key=lambda r: int(r["field_number"]))
        emitted_oneofs = set()
        for r in rows:
            group = r["oneof_group"]
            if not group:
                lines.append(render_field(r, pad + "  "))
            elif group not in emitted_oneofs:
                emitted_oneofs.add(group)
                lines.append(pad + "  oneof %s {" % group)
                for m in rows:
                    if m["oneof_group"] == group:
                        if m["label"] != "singular":
                            print("oneof member with label %s: %s.%s" % (m["label"], msg, m["field_name"]), file=sys.stderr)
                            sys.exit(1)
                        lines.append(render_field(m, pad + "    "))
                lines.append(pad + "  }")
        lines.append(pad + "}")
        return lines

    def imports_for(key):
        out = set()
        for kind, top in tops[key]:
            if kind != "message":
                continue
            for t in refs(top):
                if t in WELL_KNOWN:
                    out.add(WELL_KNOWN[t])
                else:
                    other = file_of(t)
                    if other != key:
                        out.add(FILES[other][0])
        return sorted(out)

    for key, (path, pkg) in FILES.items():
        tables = "cmdk.tsv" if key == "cmdk" else "schema.tsv and enums.tsv"
        body = [
            "// Generated by tools/gen-proto.py from %s (high-confidence rows)." % tables,
            "// Do not edit by hand: change the tables or the generator and run it again.",
            'syntax = "proto3";',
            "",
            "package %s;" % pkg,
            "",
        ]
        for imp in imports_for(key):
            body.append('import "%s";' % imp)
        body.append("")
        for kind, top in sorted(tops[key], key=lambda c: c[1]):
            body += render_message(top, 0) if kind == "message" else render_enum(top, 0)
            body.append("")
        full = os.path.join(args.out, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write("\n".join(body).rstrip("\n") + "\n")
        print("wrote %s (%d top-level declarations)" % (path, len(tops[key])))


def top_level_any(fq, messages):
    """Top-level declaration containing a message or enum."""
    cur = fq
    while cur.rsplit(".", 1)[0] in messages:
        cur = cur.rsplit(".", 1)[0]
    return cur


if __name__ == "__main__":
    main()
