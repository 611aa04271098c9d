#!/usr/bin/env python3
"""A tapwire trace reader written from docs/trace.md alone (Python 3 standard library).

Usage: read_trace.py FILE  -> prints a JSON summary: the header fields and, per record, its
kind, flags, t_us, seq, frame_len, stored_len, aux, the frame's op and status bytes and the
SHA-256 of the stored bytes.
"""
import hashlib
import json
import struct
import sys

MAGIC = b"TAPTRACE"
KINDS = {1: "REQUEST", 2: "REPLY", 3: "GAP", 4: "END"}


def read(path):
    data = open(path, "rb").read()
    if len(data) < 256 or data[0:8] != MAGIC:
        raise ValueError("not a tapwire trace")
    version, header_len = struct.unpack_from("<HH", data, 8)
    if version != 1 or header_len != 256:
        raise ValueError("unknown version %d / header_len %d" % (version, header_len))
    source, rows_policy, rows_every = struct.unpack_from("<BBH", data, 12)
    (start_unix_ms,) = struct.unpack_from("<Q", data, 16)
    row_bytes, num_spec, window, sample_mode, margin = struct.unpack_from("<IHHBB", data, 24)
    max_slots, vocab_size, hello_len = struct.unpack_from("<III", data, 36)
    hello = data[64 : 64 + hello_len]
    name = data[224:256].split(b"\0", 1)[0].decode("utf-8")
    header = {
        "version": version,
        "source": {1: "client", 2: "worker"}[source],
        "rows_policy": {0: "all", 1: "sampled", 2: "none"}[rows_policy],
        "rows_every": rows_every,
        "start_unix_ms": start_unix_ms,
        "row_bytes": row_bytes,
        "num_spec": num_spec,
        "window": window,
        "sample_mode": sample_mode,
        "margin": margin,
        "max_slots": max_slots,
        "vocab_size": vocab_size,
        # HELLO body (CONTRACT 6.1): window u16 at 64, num_spec u16 at 66, row_bytes u32 at 76
        "hello_window": struct.unpack_from("<H", hello, 64)[0],
        "hello_row_bytes": struct.unpack_from("<I", hello, 76)[0],
        "hello_auth_zero": hello[96:128] == bytes(32),
        "writer_name": name,
    }
    records = []
    at = header_len
    complete = False
    while at + 32 <= len(data):
        record_len, kind, flags, _res, t_us, seq, frame_len, stored_len, aux = struct.unpack_from(
            "<IBBHQIIII", data, at
        )
        if record_len < 32 or record_len % 8 != 0:
            raise ValueError("bad record_len %d at %d" % (record_len, at))
        if at + record_len > len(data):
            break  # cut inside a record: ignore it
        if kind not in KINDS or 32 + stored_len > record_len or stored_len > frame_len:
            raise ValueError("bad record at %d" % at)
        frame = data[at + 32 : at + 32 + stored_len]
        at += record_len
        if kind == 4:
            complete = True
            records.append({"kind": "END", "aux": aux})
            break
        rec = {
            "kind": KINDS[kind],
            "flags": flags,
            "t_us": t_us,
            "seq": seq,
            "frame_len": frame_len,
            "stored_len": stored_len,
            "aux": aux,
        }
        if kind in (1, 2):
            rec["op"] = frame[6]
            rec["status"] = frame[7]
            rec["sha256"] = hashlib.sha256(frame).hexdigest()
        records.append(rec)
    return {"header": header, "records": records, "complete": complete}


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
