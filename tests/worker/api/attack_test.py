"""Hostile clients against vllm-omni serve (tiny checkpoint), over raw sockets so the test controls
the framing byte for byte: a gzip bomb, a chunked body 100x the limit, Content-Length with
Transfer-Encoding, a cross-site text/plain post, slow and silent connections, a WAV declared at
1 Hz, a PNG declaring 20000x20000 pixels, and non-streamed requests dropped by their clients.
Each is refused with its status, the server's resident memory stays within 50 MB of its baseline
where a body could inflate, and the server still answers /health afterwards. The whole set runs
against a server with --api-key, the attacks sending no key (6 and 7 then again with it, to reach
the media checks; 8 with it, to hold slots), and against one without.

    attack_test.py VLLM_OMNI FIXTURE_DIR
OMNI_ATTACKS=1,2,3 runs only those attacks (default: all). Needs only the standard library.
"""
import base64
import gzip
import json
import os
import re
import struct
import sys
import threading
import time
import zlib

from serving import (Failed, Server as ServeProcess, auth, bounded_memory, check, check_latencies,
                     close, connect, exchange, expect_status, head_bytes, probe_health,
                     server_closed)

VLLM_OMNI, FIXTURE = sys.argv[1], sys.argv[2]
KEY = "k1"
LIMIT = 100000  # --max-request-bytes
# The slow and silent clients' address: the server caps each address's connections, and the
# /health probes come from 127.0.0.1.
ATTACKER = "127.0.0.2"
SMALL = {"model": "tiny", "modalities": ["text"], "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2}
LONG = {"model": "tiny", "modalities": ["text", "audio"],
        "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 2048,
        "max_audio_frames": 4096}


def post_chat(port, request, key=None, timeout=120):
    body = json.dumps(request).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    return exchange(port, "POST", "/v1/chat/completions", headers + auth(key), body, timeout)


def warm(srv):
    status, _, body = post_chat(srv.port, SMALL, srv.key)
    check(status == 200, f"warm-up: the small request got {status}: {body[:300]!r}")


def Server(key, flags):
    srv = ServeProcess(VLLM_OMNI, FIXTURE, key, ["--max-request-bytes", str(LIMIT), *flags], warm)
    srv.flags = tuple(flags)  # the attack's own, to tell when the next one needs another server
    return srv


# -- the attacks: each returns a short detail for the progress line


def gzip_bomb(srv):
    bomb = gzip.compress(bytes(100 * LIMIT))  # ~10 KB on the wire, 10 MB inflated
    headers = [("Content-Type", "application/json"), ("Content-Encoding", "gzip"),
               ("Content-Length", str(len(bomb)))]

    def attack():
        status, _, body = exchange(srv.port, "POST", "/v1/chat/completions", headers, bomb)
        expect_status(status, 415, body)
        return status
    return bounded_memory(srv, attack)


def chunked_flood(srv):
    piece = bytes(64 << 10)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    count = 100 * LIMIT // len(piece) + 1
    headers = [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]

    def attack():
        body = (chunk if i < count else b"0\r\n\r\n" for i in range(count + 1))
        status, _, reply = exchange(srv.port, "POST", "/v1/chat/completions", headers, body)
        expect_status(status, 411, reply)
        return status
    return bounded_memory(srv, attack)


def length_and_chunked(srv):
    # A request smuggler's framing: a proxy and the server could disagree on where it ends.
    headers = [("Content-Type", "application/json"), ("Content-Length", "5"),
               ("Transfer-Encoding", "chunked")]
    status, _, body = exchange(srv.port, "POST", "/v1/chat/completions", headers,
                               b"2\r\n{}\r\n0\r\n\r\n")
    expect_status(status, 400, body)
    return str(status)


def cross_site_post(srv):
    # What a web page may send to localhost without a CORS preflight.
    body = json.dumps(SMALL).encode()
    headers = [("Content-Type", "text/plain"), ("Origin", "http://evil.example"),
               ("Content-Length", str(len(body)))]
    status, _, reply = exchange(srv.port, "POST", "/v1/chat/completions", headers, body)
    expect_status(status, 415, reply)
    return str(status)


def drip_once(port):
    """A request head that never ends: the request line, Host, and nothing more yet."""
    sock = connect(port, 5, ATTACKER)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return sock


def drip(port, stop, closes, index):
    """One slow client for as long as `stop` is unset: a header line every 2 s; reopened (and
    counted in closes[index]) each time the server closes it."""
    sock, n = None, 0
    while not stop.is_set():
        n += 1
        try:
            if sock is None:
                sock = drip_once(port)
            elif server_closed(sock):
                close(sock)
                sock, closes[index] = None, closes[index] + 1
                continue
            else:
                sock.sendall(f"X-Drip-{n}: x\r\n".encode())
        except OSError:
            if sock:
                close(sock)
            sock, closes[index] = None, closes[index] + 1
        stop.wait(2)
    if sock:
        close(sock)


def slow_headers(srv):
    stop, closes = threading.Event(), [0] * 32
    drippers = [threading.Thread(target=drip, args=(srv.port, stop, closes, i), daemon=True)
                for i in range(32)]
    for t in drippers:
        t.start()
    silent = [connect(srv.port, 5, ATTACKER) for _ in range(50)]
    try:
        latencies = probe_health(srv.port, 30)
    finally:
        stop.set()
        for t in drippers:
            t.join(10)
        for s in silent:
            close(s)
    worst = check_latencies(latencies)
    never = sum(c == 0 for c in closes)
    check(not never, f"{never} of 32 dripping connections were never closed: no head deadline")
    return f"{len(latencies)} probes, worst /health {worst:.3f} s, {sum(closes)} drips cut"


def field_error(srv, part):
    """Sends `part` as the first content part of a text-only request: expects 400 naming it
    (and 401 first, before any decoding, from a server with a key when the key is missing)."""
    request = {**SMALL, "messages": [{"role": "user", "content": [part]}]}
    if srv.key:
        status, _, body = post_chat(srv.port, request)
        expect_status(status, 401, body)
    status, _, body = post_chat(srv.port, request, srv.key)
    expect_status(status, 400, body)
    err = json.loads(body).get("error", {})
    named = "messages[0].content[0]" in f"{err.get('message')} {err.get('param')}"
    check(named, f"the error does not name messages[0].content[0]: {err}")
    return status


def wav_at_1hz():
    samples = b"\x00\x40\x00\xc0" * 1125  # 4500 bytes: 2250 PCM16 samples, i.e. 37 min at 1 Hz
    fmt = struct.pack("<HHIIHH", 1, 1, 1, 2, 2, 16)  # PCM, mono, 1 Hz, 2 B/s, align 2, 16 bit
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def one_hz_wav(srv):
    data = base64.b64encode(wav_at_1hz()).decode()
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    return bounded_memory(srv, lambda: field_error(srv, part))


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_png():
    """A few dozen bytes that declare 20000x20000 8-bit RGB: 1.2 GB if decoded."""
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
            png_chunk(b"IDAT", zlib.compress(bytes(61))) + png_chunk(b"IEND", b""))


def oversized_png(srv):
    url = "data:image/png;base64," + base64.b64encode(huge_png()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    return bounded_memory(srv, lambda: field_error(srv, part))


def requests_running(srv):
    status, _, body = exchange(srv.port, "GET", "/metrics", auth(srv.key), timeout=10)
    check(status == 200, f"/metrics answered {status}: {body[:300]!r}")
    m = re.search(rb"^omni_requests_running (\d+)", body, re.M)
    check(m, "/metrics has no omni_requests_running")
    return int(m.group(1))


def send_without_reading(port, request, key):
    body = json.dumps(request).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    sock = connect(port, 10)
    sock.sendall(head_bytes(port, "POST", "/v1/chat/completions", headers + auth(key)) + body)
    return sock


def dropped_requests(srv):
    socks = [send_without_reading(srv.port, LONG, srv.key) for _ in range(8)]
    time.sleep(1)
    running = requests_running(srv)
    for s in socks:
        s.close()
    closed = time.time()
    # Without all 8 running, freeing the slots would prove nothing.
    check(running == 8, f"only {running} of the 8 long requests were running after 1 s")
    while requests_running(srv) > 1 and time.time() < closed + 2:
        time.sleep(0.1)
    left = requests_running(srv)
    check(left <= 1, f"{left} requests still running 2 s after their clients closed")
    status, _, body = post_chat(srv.port, SMALL, srv.key)
    check(status != 429, "a new request got 429: the dropped requests still hold their slots")
    expect_status(status, 200, body)
    return f"8 running, {left} left {time.time() - closed:.1f} s after the close, then 200"


# In run order: those that share the plain server first, then the two with flags of their own.
ATTACKS = {
    1: ("gzip bomb", gzip_bomb, ()),
    2: ("chunked 100x the limit", chunked_flood, ()),
    3: ("Content-Length + Transfer-Encoding", length_and_chunked, ()),
    4: ("cross-site text/plain post", cross_site_post, ()),
    6: ("WAV at 1 Hz", one_hz_wav, ()),
    7: ("PNG of 20000x20000", oversized_png, ()),
    5: ("slow headers + silent connections", slow_headers, ("--request-head-timeout", "10")),
    8: ("dropped non-streamed requests", dropped_requests, ("--max-concurrent-requests", "8")),
}


def selected():
    wanted = os.environ.get("OMNI_ATTACKS", "").strip()
    if not wanted:
        return list(ATTACKS)
    pieces = [n.strip() for n in wanted.split(",")]
    numbers = {int(n) for n in pieces if n.isdigit()}
    if len(numbers) < len(set(pieces)) or not numbers <= set(ATTACKS):
        sys.exit(f"OMNI_ATTACKS={wanted}: expected attack numbers from 1 to 8, e.g. 1,2,3")
    return [n for n in ATTACKS if n in numbers]


def run_pass(key, numbers):
    """Every selected attack against a server with `key` (None: none); the failures."""
    label, srv, failures = "key" if key else "no key", None, []
    for n in numbers:
        name, attack, flags = ATTACKS[n]
        if n == 4 and key:
            continue  # a page cannot send the key: the keyless server is the one at risk
        try:
            if srv is None or srv.flags != flags:
                if srv:
                    srv.stop()
                srv = None  # a failed start must not leave the last server in use
                srv = Server(key, flags)
            detail = attack(srv)
            srv.check_alive()
            print(f"attack {n} {name} ({label}): {detail}", flush=True)
        except (Failed, OSError, ValueError) as e:
            failures.append(f"attack {n} {name} ({label}): {type(e).__name__}: {e}")
            print(f"FAIL {failures[-1]}", file=sys.stderr, flush=True)
            if srv:
                srv.stop()
            srv = None  # the next attack gets a fresh server
    if srv:
        srv.stop()
    return failures


def main():
    numbers = selected()
    failures = run_pass(KEY, numbers) + run_pass(None, numbers)
    if failures:
        sys.exit(f"{len(failures)} attack(s) not refused as expected:\n  " + "\n  ".join(failures))
    print("all attacks refused")


if __name__ == "__main__":
    main()
