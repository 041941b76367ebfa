#!/usr/bin/env python3
"""Seed fuzz/corpus/<target>/ from ../shared/protocol/captures and ../shared/fixtures/providers
(and the repo's own tests/fixtures). The corpus is not committed; rerun this any time."""
import base64, gzip, hashlib, json, os, pathlib, re, struct, sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = pathlib.Path(os.environ.get("SHARED_DIR", REPO.parent / "shared"))
CAPTURES = SHARED / "protocol" / "captures"
PROVIDERS = SHARED / "fixtures" / "providers"
CORPUS = HERE / "corpus"


def put(target, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


# --- a minimal protobuf writer (field numbers from ../shared/protocol/schema.tsv) ---
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(field, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def vi(field, n):
    return varint(field << 3) + varint(n)


def run_request(text, model, conversation):
    user_message = ld(1, text) + ld(2, "msg-" + conversation)
    action = ld(1, ld(1, user_message))                          # ConversationAction.user_message_action
    run = ld(1, b"") + ld(2, action) + ld(5, conversation) + ld(9, ld(1, model))
    return ld(1, run)                                            # AgentClientMessage.run_request


def messages_from_captures():
    msgs = []
    for f in sorted(CAPTURES.glob("*.ndjson")) if CAPTURES.is_dir() else []:
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            raw = json.dumps(rec.get("decoded_fields", {}))
            texts = re.findall(r'"text": "((?:[^"\\]|\\.)*)"', raw)
            models = re.findall(r'"modelId": "([^"]*)"', raw)
            conv = re.findall(r'"conversationId": "([^"]*)"', raw)
            if texts:
                msgs.append(run_request(json.loads('"%s"' % texts[0]), (models or ["default"])[0],
                                        (conv or ["conv"])[0]))
    msgs.append(run_request("Say hello", "byok-fake-model", "conv-1"))
    msgs.append(ld(7, b""))                                      # client_heartbeat
    msgs.append(ld(3, vi(1, 4) + ld(3, b"")))                    # kv set_blob_result
    msgs.append(ld(5, ld(1, vi(1, 1))))                          # exec stream_close
    msgs.append(ld(4, ld(3, b"")))                               # cancel_action
    return msgs


def frame(flags, payload):
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


def main():
    msgs = messages_from_captures()
    for m in msgs:
        put("agent_client_message", m)
        hexed = m.hex()
        put("bidi_hex", ld(1, hexed) + ld(2, ld(1, "req-1")) + vi(3, 0))
        put("bidi_hex", ld(2, ld(1, "req-1")) + vi(3, 2) + ld(4, m))
        put("bidi_hex", hexed.encode())
        # ctl byte 0: request stream, identity, 1-byte chunks; 0xfc: big chunks.
        put("connect_envelope", b"\x00" + frame(0, m))
        put("connect_envelope", b"\xfe" + frame(1, gzip.compress(m)))

    # End-of-stream frames as Cursor sent them (JSON after `json=` in the log).
    for f in sorted(CAPTURES.glob("*.log")) if CAPTURES.is_dir() else []:
        for js in re.findall(r"json=(\{.*\})", f.read_text()):
            put("connect_envelope", b"\x01" + frame(2, js.encode()))
            put("connect_envelope", b"\xfd" + frame(0, b"\x0a\x00") + frame(2, js.encode()))
    end = REPO / "tests" / "fixtures" / "connect" / "endstream-error.json"
    if end.exists():
        put("connect_envelope", b"\x05" + frame(2, end.read_bytes()))

    # Unary gzip bodies: the captured gzip model list, and gzip of every message.
    for f in sorted(CAPTURES.glob("*.gzip.b64")) if CAPTURES.is_dir() else []:
        put("unary_gzip", base64.b64decode(f.read_text()))
    for m in msgs:
        put("unary_gzip", gzip.compress(m))

    # Provider streams, framed as they go on the wire.
    roots = [PROVIDERS, REPO / "tests" / "fixtures" / "providers"]
    for root in roots:
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*")):
            if f.suffix not in (".sse", ".jsonl", ".json") or not f.is_file():
                continue
            body = f.read_bytes()
            if f.suffix == ".jsonl":
                out = []
                for line in body.decode().splitlines():
                    line = line.strip()
                    if not line:
                        continue
                    if f.parent.name in ("anthropic", "openai-responses"):
                        out.append("event: %s\n" % json.loads(line).get("type", "message"))
                    out.append("data: %s\n\n" % line)
                if f.parent.name in ("openai-chat", "openai-compatible"):
                    out.append("data: [DONE]\n\n")
                body = "".join(out).encode()
            # First byte picks the chunk size in the target.
            put("sse_parser", b"\x00" + body)
            put("sse_parser", b"\x07" + body)
            put("sse_parser", b"\xff" + body)

    # h2_frames: frame sequences around RFC 7541's example header blocks (Huffman and not).
    def h2frame(kind, flags, stream, payload):
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
    blocks = [
        bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"),
        bytes.fromhex("828684be5886a8eb10649cbf"),
        bytes.fromhex("828684410f7777772e6578616d706c652e636f6d"),
        bytes.fromhex("4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d"),
    ]
    settings = h2frame(4, 0, 0, struct.pack(">HI", 4, 1 << 20))
    for i, block in enumerate(blocks):
        seq = settings + h2frame(1, 4 | 1, 1 + 2 * i, block) + h2frame(0, 1, 1, b"hello")
        put("h2_frames", b"\x00" + seq)
        put("h2_frames", b"\x03" + seq)
        # The same block as HEADERS + CONTINUATION.
        half = len(block) // 2
        put("h2_frames", b"\x05" + h2frame(1, 0, 1, block[:half]) + h2frame(9, 4, 1, block[half:]))

    # h2_relay: flags byte (1: client preface + SETTINGS, 2: origin SETTINGS, 4: the client
    # never reads), then steps [head, len, kind, flags, stream, payload] (head 0x10 from the
    # client, 0x11 from the origin; bits 5-7 are extra polls).
    def step(origin, kind, flags, stream, payload, polls=0):
        body = bytes([kind, flags, stream]) + payload
        return bytes([0x10 | origin | (polls << 5), len(body)]) + body
    def lit(index, value):
        return bytes([index, len(value)]) + value
    req = b"\x83\x87" + lit(4, b"/echo") + lit(1, b"api2.cursor.sh")
    ours = b"\x83\x87" + lit(4, b"/ours/x") + lit(1, b"api2.cursor.sh")
    answer = step(1, 1, 5, 1, b"\x88", 2)
    put("h2_relay", b"\x03" + step(0, 1, 5, 1, req, 2) + answer)
    put("h2_relay", b"\x03" + step(0, 1, 4, 1, req) + step(0, 0, 1, 1, b"hi", 1) + answer)
    put("h2_relay", b"\x03" + step(0, 1, 5, 1, ours, 3) + step(0, 1, 5, 3, req, 2))
    put("h2_relay", b"\x03" + b"".join(step(0, 1, 4, i, req) + step(0, 3, 0, i, b"\0\0\0\x08") for i in range(1, 60, 2)))
    put("h2_relay", b"\x03" + step(0, 1, 0, 1, req) + step(0, 9, 0, 1, b"") * 40)
    put("h2_relay", b"\x07" + step(0, 6, 0, 0, b"pingping") * 60)
    put("h2_relay", b"\x03" + step(0, 1, 4, 1, req) + step(0, 0, 0, 1, b"x") * 80)
    put("h2_relay", b"\x03" + step(1, 4, 0, 0, b"\0\x04\0\0\0\0") + step(0, 1, 4, 1, req) + step(0, 0, 0, 1, b"data" * 50))

    for t in sorted(p.name for p in CORPUS.iterdir()):
        print("%-22s %d seeds" % (t, len(list((CORPUS / t).iterdir()))))


if __name__ == "__main__":
    sys.exit(main())
