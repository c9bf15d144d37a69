"""Hostile clients against vllm-omni serve, round two: requests that tried to run the server out of
memory or out of connections, with and without the API key. Each attack runs while a well-behaved
client on another address keeps asking /health (every answer within 1 s) and sending small
requests (every one 200), and each must leave the server's peak resident memory within 100 MB of
its baseline (400 MB for the 64 keyed uploads the byte budget admits a few of), the attacker
refused with a clear 4xx or 503.

No key: bodies without a length (411), thousands of byte ranges (ignored), 64 uploads held open
(401 from the head, the body never read), hundreds of silent connections from one address (its
share of the connections) and from many (/health still answers; a good client evicts an idle one).
With the key: 32 MiB of "{}," (413 while parsing), 48 MiB of text (400 before tokenizing), text
within the byte bound but over the context (400 from the tokenizer), a WAV of 1,024 channels,
megabyte field names and speakers (answers of a few hundred bytes), 64 uploads against
--max-inflight-bytes (503 with Retry-After beyond it).
Videos (the tiny Wan folder): the largest job (400 by its cost), finished jobs not counted against
--max-video-jobs, paged lists without prompts, guidance 1e308 (400), byte ranges of /content,
errors without paths, the folder of a killed server removed at the next start.

    resource_attack_test.py VLLM_OMNI QWEN3_OMNI_FIXTURE WAN_FIXTURE
OMNI_ATTACKS=no_length,ranges runs only those (default: all). Standard library only.
"""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from serving import (Failed, RssPeak, Server, auth, check, check_latencies, close, connect,
                     exchange, expect_status, head_bytes, json_headers, probe_health,
                     read_response, run_clients, send_pieces, server_closed)

VLLM_OMNI, FIXTURE, WAN_FIXTURE = sys.argv[1], sys.argv[2], sys.argv[3]
KEY = "k2"
SMALL = {"model": "tiny", "modalities": ["text"], "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2}
TINY_VIDEO = {"prompt": "a fox", "size": "16x16", "num_frames": 5, "num_inference_steps": 2,
              "seed": 1}
MIB = 1 << 20


def post(port, path, body, key=KEY, timeout=120, source=None):
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    return exchange(port, "POST", path, json_headers(body, key), body, timeout, source)


def get(port, path, key=KEY, headers=(), source=None, max_body=None):
    return exchange(port, "GET", path, [*auth(key), *headers], source=source, max_body=max_body)


def chat_ok(port):
    status, _, body = post(port, "/v1/chat/completions", SMALL)
    return status == 200 or body[:200]


def models_ok(port):
    status, _, body = get(port, "/v1/models")
    return status == 200 or body[:200]


def under_attack(srv, attack, limit_mb=100, good=None):
    """Runs `attack()` while a client on 127.0.0.1 probes /health and (with `good`) sends a
    well-behaved request every second; checks the probes, the good requests and the peak RSS."""
    stop, latencies, goods = threading.Event(), [], []

    def probe():
        latencies.extend(probe_health(srv.port, 3600, stop=stop))

    def behave():
        while not stop.is_set():
            try:
                goods.append(good(srv.port))
            except OSError as e:
                goods.append(repr(e))
            stop.wait(1)

    threads = [threading.Thread(target=probe, daemon=True)]
    if good:
        threads.append(threading.Thread(target=behave, daemon=True))
    for t in threads:
        t.start()
    try:
        with RssPeak(srv.proc.pid) as rss:
            detail = attack()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    grown = srv.growth_kb(rss.peak_kb)
    worst = check_latencies(latencies)
    bad = [g for g in goods if g is not True]
    check(not good or (goods and not bad), f"well-behaved requests failed: {bad[:3]}")
    check(grown < limit_mb * 1000,
          f"the resident size grew by {grown / 1000:.1f} MB (limit {limit_mb})")
    return (f"{detail}; peak RSS +{grown / 1000:.1f} MB, worst /health {worst:.3f} s, "
            f"{len(goods)} good requests")


def error_of(body):
    return json.loads(body).get("error", {})


# -- no key


def no_length(srv):
    """Bodies with neither Content-Length nor Transfer-Encoding were read until the client
    closed: 256 MiB sent as fast as the server takes them."""
    def attack():
        statuses = []
        for method in ("POST", "PUT", "PATCH"):
            body = (bytes(MIB) for _ in range(256))
            status, _, reply = exchange(srv.port, method, "/v1/chat/completions",
                                        [("Content-Type", "application/json")], body,
                                        source="127.0.0.2")
            expect_status(status, 411, reply)
            check(error_of(reply).get("code") == "length_required", reply[:300])
            statuses.append(status)
        # Without a length a DELETE has no body (RFC 9112): answered at once, not read to the end.
        start = time.time()
        status, _, reply = exchange(srv.port, "DELETE", "/v1/videos/x", [], b"x" * MIB,
                                    source="127.0.0.2")
        expect_status(status, 401, reply)
        check(time.time() - start < 5, "a DELETE without a length waited for its client's close")
        return "/".join(map(str, statuses + [status]))
    return under_attack(srv, attack, good=chat_ok)


def ranges(srv):
    """A Range of ~1,500 byte ranges on every route made one copy of the answer per range:
    60 clients on GET /."""
    many = "bytes=" + ",".join(f"{i}-{i}" for i in range(1500))
    _, _, page = get(srv.port, "/", key=None)

    def one(i, out):
        try:
            out.append(get(srv.port, "/", key=None, headers=[("Range", many)],
                           source=f"127.0.0.{2 + i % 6}", max_body=4 * len(page)))
        except OSError as e:
            out.append((0, {}, repr(e).encode()))

    def attack():
        out = []
        run_clients(lambda i: one(i, out), 60, 60)
        for status, _, body in out:
            expect_status(status, 200, body)
            check(body == page, f"GET / with ranges answered {len(body)} bytes, not the page")
        check(len(out) == 60, f"{len(out)} of 60 clients answered")
        status, _, body = get(srv.port, "/", key=None, headers=[("Range", "bytes=0-9,20-29")])
        expect_status(status, 200, body)  # only /v1/videos/{id}/content serves ranges
        return f"60 x 200 with the {len(page)}-byte page"
    return under_attack(srv, attack, good=chat_ok)


def unkeyed_uploads(srv):
    """Every connection buffered up to the body limit before the key was checked: 64 uploads of
    64 MiB held open from 8 addresses."""
    def attack():
        socks = []
        try:
            for i in range(64):
                s = connect(srv.port, 30, f"127.0.0.{2 + i % 8}")
                s.sendall(head_bytes(srv.port, "POST", "/v1/chat/completions", [
                    ("Content-Type", "application/json"), ("Content-Length", str(64 * MIB))]))
                try:
                    s.sendall(bytes(MIB))
                except OSError:
                    pass  # the server answered and stopped reading: what we want
                socks.append(s)
            statuses = []
            for s in socks:
                status, _, body = read_response(s)
                expect_status(status, 401, body)
                statuses.append(status)
            return f"{len(statuses)} x 401"
        finally:
            for s in socks:
                close(s)
    return under_attack(srv, attack, good=chat_ok)


def hold_silent(port, sources, count, seconds):
    """`count` silent connections from each of `sources`, reopened as the server closes them,
    for `seconds`: the connections the server refused or closed."""
    socks, refused = {}, 0
    end = time.time() + seconds
    while time.time() < end:
        for src in sources:
            live = socks.setdefault(src, [])
            for s in [s for s in live if server_closed(s)]:
                live.remove(s)
                close(s)
                refused += 1
            while len(live) < count:  # reopened: what a client does when closed
                try:
                    live.append(connect(port, 5, src))
                except OSError:
                    refused += 1
                    break
        time.sleep(0.5)
    for live in socks.values():
        for s in live:
            close(s)
    return refused


def silent_one_address(srv):
    """256 silent connections, reopened when closed, took the whole shared pool: 300 from one
    address now take that address's share only."""
    def attack():
        refused = hold_silent(srv.port, ["127.0.0.2"], 300, 10)
        check(refused >= 300 - 64, f"only {refused} of the attacker's connections were refused")
        return f"{refused} of the attacker's connections refused or closed"
    return under_attack(srv, attack, good=chat_ok)


def silent_many_addresses(srv):
    """Silent connections from 6 addresses, reopened when closed, fill the whole pool: /health
    still answers, and a well-behaved client takes the place of an idle attacker's connection."""
    def attack():
        sources = [f"127.0.0.{10 + i}" for i in range(6)]
        refused = hold_silent(srv.port, sources, 60, 10)
        status, _, metrics = get(srv.port, "/metrics")
        expect_status(status, 200, metrics)
        counters = dict(re.findall(rb"^(omni_http_connections_\w+) (\d+)$", metrics, re.M))
        evicted = int(counters.get(b"omni_http_connections_evicted_total", b"0"))
        overflowed = int(counters.get(b"omni_http_connections_overflowed_total", b"0"))
        check(evicted > 0, f"no idle connection was evicted for the good client: {counters}")
        check(overflowed > 0, f"no connection went to the overflow lane: {counters}")
        return (f"{refused} connections over the caps refused or closed, {evicted} evicted, "
                f"{overflowed} on the lane")
    return under_attack(srv, attack, good=chat_ok)


# -- with the key


def json_values(srv):
    """32 MiB of "{}," parsed into a DOM before any field check cost +1.2 GiB."""
    body = b'{"model":"tiny","messages":[' + b"{}," * (32 * MIB // 3) + b"{}]}"

    def attack():
        status, _, reply = post(srv.port, "/v1/chat/completions", body)
        expect_status(status, 413, reply)
        check("JSON values" in error_of(reply)["message"], reply[:300])
        return str(status)
    return under_attack(srv, attack, good=chat_ok)


def long_text(srv):
    """48 MiB of text was tokenized whole before the context check (+3 GiB, 18 s)."""
    text = "lorem ipsum " * (48 * MIB // 12)
    request = {**SMALL, "messages": [{"role": "user", "content": text}]}

    def attack():
        start = time.time()
        status, _, reply = post(srv.port, "/v1/chat/completions", request)
        expect_status(status, 400, reply)
        check(error_of(reply).get("code") == "context_length_exceeded", reply[:300])
        took = time.time() - start
        check(took < 10, f"the refusal took {took:.1f} s")
        return f"400 in {took:.2f} s"
    return under_attack(srv, attack, good=chat_ok)


def over_context(srv):
    """Text under the byte bound but over the context in tokens: refused by the tokenizer."""
    # One-byte tokens (single digits, then spaces) as far as the byte bound lets them go.
    text = " ".join("7" for _ in range(6000))
    request = {**SMALL, "messages": [{"role": "user", "content": text}]}

    def attack():
        status, _, reply = post(srv.port, "/v1/chat/completions", request)
        expect_status(status, 400, reply)
        check("context" in error_of(reply)["message"], reply[:300])
        return str(status)
    return under_attack(srv, attack, good=chat_ok)


def wav_channels():
    frames = b"\x00\x00" * 1024 * 8  # 8 frames of 1,024 16-bit channels: 16 KiB
    fmt = struct.pack("<HHIIHH", 1, 1024, 16000, 16000 * 2048, 2048, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += b"data" + struct.pack("<I", len(frames)) + frames
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def many_channels(srv):
    """A 16 KB WAV declaring 1,024 channels cost 230 MiB."""
    import base64
    part = {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav_channels()).decode(), "format": "wav"}}
    request = {**SMALL, "messages": [{"role": "user", "content": [part]}]}

    def attack():
        status, _, reply = post(srv.port, "/v1/chat/completions", request)
        expect_status(status, 400, reply)
        check(error_of(reply).get("code") == "unsupported_channels", reply[:300])
        return str(status)
    return under_attack(srv, attack, good=chat_ok)


def echoes(srv):
    """Unknown field names and speakers were echoed whole in errors (4 MB answers)."""
    name = "x" * (4 * MIB)

    def attack():
        status, _, reply = post(srv.port, "/v1/chat/completions", {**SMALL, name: 1})
        expect_status(status, 400, reply)
        check(len(reply) < 2000, f"the unknown field's error is {len(reply)} bytes")
        audio = {**SMALL, "modalities": ["text", "audio"], "speaker": name}
        status, _, reply = post(srv.port, "/v1/chat/completions", audio)
        expect_status(status, 400, reply)
        check(len(reply) < 2000, f"the unknown speaker's error is {len(reply)} bytes")
        return "400 x 2, each under 2 KB"
    return under_attack(srv, attack, good=chat_ok)


def keyed_uploads(srv):
    """64 keyed uploads of 60 MiB against --max-inflight-bytes 256 MiB: a few are read, the rest
    get 503 with Retry-After from their head. Every head is sent before any body is complete, so
    no upload finishes and frees its bytes for a later one."""
    heads_sent = threading.Barrier(64)

    def upload(i, out):
        s = None
        try:
            s = connect(srv.port, 60, f"127.0.0.{2 + i % 8}")
            s.sendall(head_bytes(srv.port, "POST", "/v1/chat/completions", [
                ("Content-Type", "application/json"), ("Content-Length", str(60 * MIB)),
                *auth(KEY)]))
            s.sendall(bytes(MIB))
        except OSError:
            pass  # refused from the head: the answer is waiting
        try:
            heads_sent.wait(60)
            threading.Thread(target=send_pieces, args=(s, (bytes(MIB) for _ in range(59))),
                             daemon=True).start()
            out.append(read_response(s))
        except (OSError, threading.BrokenBarrierError) as e:
            out.append((0, {}, repr(e).encode()))
        finally:
            if s:
                close(s)

    def attack():
        out = []
        run_clients(lambda i: upload(i, out), 64, 120)
        busy = [h for status, h, _ in out if status == 503]
        read = [b for status, _, b in out if status == 400]  # zeros are not JSON
        other = [(status, b[:100]) for status, _, b in out if status not in (400, 503)]
        check(not other, f"answers other than 400 and 503: {other[:3]}")
        check(all("retry-after" in h for h in busy), "a 503 without Retry-After")
        check(1 <= len(read) <= 4, f"{len(read)} uploads of 60 MiB were read (budget: 4)")
        return f"{len(read)} read, {len(busy)} x 503"
    return under_attack(srv, attack, limit_mb=400, good=chat_ok)


# -- videos


def video_call(port, method, path, body=None, key=KEY):
    if body is None:
        return exchange(port, method, path, auth(key))
    data = json.dumps(body).encode()
    return exchange(port, method, path, json_headers(data, key), data)


def video_ok(port, method, path, body=None):
    status, _, reply = video_call(port, method, path, body)
    check(status == 200, f"{method} {path}: {status} {reply[:300]!r}")
    return json.loads(reply)


def wait_done(port, vid, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        v = video_ok(port, "GET", f"/v1/videos/{vid}")
        if v["status"] in ("completed", "failed"):
            return v
        time.sleep(0.05)
    raise Failed(f"video {vid} did not finish within {timeout} s")


def largest_job(srv):
    """The largest job the caps allowed (4096x4096, 1025 frames, 1000 steps) took +2.8 GiB."""
    def attack():
        status, _, reply = video_call(srv.port, "POST", "/v1/videos", {
            **TINY_VIDEO, "size": "4096x4096", "num_frames": 1025, "num_inference_steps": 1000})
        expect_status(status, 400, reply)
        check(error_of(reply).get("code") == "job_too_large", reply[:300])
        status, _, reply = video_call(srv.port, "POST", "/v1/videos",
                                      {**TINY_VIDEO, "guidance_scale": 1e308})
        expect_status(status, 400, reply)
        check(error_of(reply).get("param") == "guidance_scale", reply[:300])
        return "400 x 2"
    return under_attack(srv, attack, good=models_ok)


def finished_jobs(srv):
    """Finished jobs counted against --max-video-jobs (2 here) until their TTL."""
    def attack():
        for _ in range(4):
            v = wait_done(srv.port, video_ok(srv.port, "POST", "/v1/videos", TINY_VIDEO)["id"])
            check(v["status"] == "completed", v)
        slow = {**TINY_VIDEO, "size": "256x256", "num_inference_steps": 1000}
        running = [video_ok(srv.port, "POST", "/v1/videos", slow)["id"] for _ in range(2)]
        status, headers, reply = video_call(srv.port, "POST", "/v1/videos", TINY_VIDEO)
        expect_status(status, 429, reply)
        check("retry-after" in headers, f"429 without Retry-After: {headers}")
        for vid in running:
            video_ok(srv.port, "DELETE", f"/v1/videos/{vid}")
        return "4 finished jobs kept, the third active one 429"
    return under_attack(srv, attack, good=models_ok)


def listing(srv):
    """GET /v1/videos replayed every stored prompt (one 201 MB answer): pages without them."""
    prompt = "p" * (64 << 10)

    def attack():
        ids = []
        for _ in range(3):  # one after the other: at most 2 may be queued or running
            ids.append(video_ok(srv.port, "POST", "/v1/videos", {**TINY_VIDEO, "prompt": prompt})["id"])
            wait_done(srv.port, ids[-1])
        status, _, reply = video_call(srv.port, "POST", "/v1/videos",
                                      {**TINY_VIDEO, "prompt": prompt + "p"})
        expect_status(status, 400, reply)
        status, _, reply = video_call(srv.port, "GET", "/v1/videos?limit=2")
        expect_status(status, 200, reply)
        page = json.loads(reply)
        check(len(reply) < 4000 and all("prompt" not in v for v in page["data"]), reply[:300])
        check(page["has_more"] and len(page["data"]) == 2, page)
        rest = video_ok(srv.port, "GET", f"/v1/videos?limit=2&after={page['last_id']}")
        got = [v["id"] for v in page["data"] + rest["data"]]
        check(got[:3] == ids[::-1], f"pages {got} != newest first {ids[::-1]}")
        for vid in ids:
            video_ok(srv.port, "DELETE", f"/v1/videos/{vid}")
        return f"pages of {len(reply)} bytes"
    return under_attack(srv, attack, good=models_ok)


def content_ranges(srv):
    """Many ranges on /content took one keyed request past 6 GiB: a few spans are served from
    the file, more get the whole file once."""
    def attack():
        vid = wait_done(srv.port, video_ok(srv.port, "POST", "/v1/videos", TINY_VIDEO)["id"])["id"]
        path = f"/v1/videos/{vid}/content"
        status, _, whole = get(srv.port, path)
        expect_status(status, 200, whole)
        status, headers, part = get(srv.port, path, headers=[("Range", "bytes=0-9")])
        expect_status(status, 206, part)
        check(part == whole[:10] and headers["content-range"] == f"bytes 0-9/{len(whole)}",
              (headers, part))
        status, _, parts = get(srv.port, path, headers=[("Range", "bytes=0-9,20-29")])
        expect_status(status, 206, parts)
        check(whole[:10] in parts and whole[20:30] in parts, parts[:200])
        status, _, _ = get(srv.port, path, headers=[("Range", f"bytes={len(whole)}-")])
        expect_status(status, 416, b"")
        many = "bytes=" + ",".join("0-" for _ in range(2000))
        for _ in range(8):
            status, _, body = get(srv.port, path, headers=[("Range", many)],
                                  max_body=4 * len(whole))
            expect_status(status, 200, body[:100])
            check(body == whole, f"{len(body)} bytes for a {len(whole)}-byte video")
        video_ok(srv.port, "DELETE", f"/v1/videos/{vid}")
        return f"206 x 2, 416, 8 x the {len(whole)}-byte file"
    return under_attack(srv, attack, good=models_ok)


def failed_job_errors(srv):
    """A failed job's error named a temporary path."""
    def attack():
        bad = wait_done(srv.port, video_ok(srv.port, "POST", "/v1/videos",
                                           {**TINY_VIDEO, "size": "24x16"})["id"])
        check(bad["status"] == "failed", bad)
        message = bad["error"]["message"]
        check("/tmp" not in message and "omni-" not in message, f"a path in: {message}")
        video_ok(srv.port, "DELETE", f"/v1/videos/{bad['id']}")
        return "no path"
    return under_attack(srv, attack, good=models_ok)


def stale_folder(wan_flags):
    """A killed server left its omni-videos-* folder behind: the next one removes it."""
    parent = tempfile.mkdtemp(prefix="omni-stale-")
    try:
        env = {"TMPDIR": parent}
        first = Server(VLLM_OMNI, WAN_FIXTURE, KEY, wan_flags, env=env)
        left = [d for d in os.listdir(parent) if d.startswith("omni-videos-")]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        check(len(left) == 1 and os.path.isdir(os.path.join(parent, left[0])), left)
        second = Server(VLLM_OMNI, WAN_FIXTURE, KEY, wan_flags, env=env)
        try:
            now = [d for d in os.listdir(parent) if d.startswith("omni-videos-")]
            check(left[0] not in now and len(now) == 1, f"{left} then {now}")
        finally:
            second.stop()
        return f"{left[0]} removed at the next start"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def warm_chat(srv):
    status, _, body = post(srv.port, "/v1/chat/completions", SMALL)
    check(status == 200, f"warm-up: {status} {body[:300]!r}")


CHAT_FLAGS = ("--max-request-bytes", str(64 * MIB))
BUDGET_FLAGS = ("--max-request-bytes", str(64 * MIB), "--max-inflight-bytes", "256MiB")
WAN_FLAGS = ("--max-video-jobs", "2")
# name: (attack, server flags, model); in run order, those sharing a server together.
ATTACKS = {
    "no_length": (no_length, CHAT_FLAGS, FIXTURE),
    "ranges": (ranges, CHAT_FLAGS, FIXTURE),
    "unkeyed_uploads": (unkeyed_uploads, CHAT_FLAGS, FIXTURE),
    "silent_one_address": (silent_one_address, CHAT_FLAGS, FIXTURE),
    "silent_many_addresses": (silent_many_addresses, CHAT_FLAGS, FIXTURE),
    "json_values": (json_values, CHAT_FLAGS, FIXTURE),
    "long_text": (long_text, CHAT_FLAGS, FIXTURE),
    "over_context": (over_context, CHAT_FLAGS, FIXTURE),
    "many_channels": (many_channels, CHAT_FLAGS, FIXTURE),
    "echoes": (echoes, CHAT_FLAGS, FIXTURE),
    "keyed_uploads": (keyed_uploads, BUDGET_FLAGS, FIXTURE),
    "largest_job": (largest_job, WAN_FLAGS, WAN_FIXTURE),
    "finished_jobs": (finished_jobs, WAN_FLAGS, WAN_FIXTURE),
    "listing": (listing, WAN_FLAGS, WAN_FIXTURE),
    "content_ranges": (content_ranges, WAN_FLAGS, WAN_FIXTURE),
    "failed_job_errors": (failed_job_errors, WAN_FLAGS, WAN_FIXTURE),
}


def selected():
    wanted = [w.strip() for w in os.environ.get("OMNI_ATTACKS", "").split(",") if w.strip()]
    unknown = [w for w in wanted if w not in ATTACKS and w != "stale_folder"]
    if unknown:
        sys.exit(f"OMNI_ATTACKS: unknown attacks {unknown}; known: {list(ATTACKS)}, stale_folder")
    return wanted or [*ATTACKS, "stale_folder"]


def main():
    failures, srv = [], None
    for name in selected():
        try:
            if name == "stale_folder":
                detail = stale_folder(WAN_FLAGS)
            else:
                attack, flags, model = ATTACKS[name]
                if srv is None or (srv.flags, srv.model) != (flags, model):
                    if srv:
                        srv.stop()
                    srv = None
                    srv = Server(VLLM_OMNI, model, KEY, flags,
                                 warm_chat if model == FIXTURE else None)
                    srv.flags, srv.model = flags, model
                detail = attack(srv)
                srv.check_alive()
            print(f"attack {name}: {detail}", flush=True)
        except (Failed, OSError, ValueError, KeyError) as e:
            failures.append(f"attack {name}: {type(e).__name__}: {e}")
            print(f"FAIL {failures[-1]}", file=sys.stderr, flush=True)
            if srv:
                srv.stop()
            srv = None
    if srv:
        srv.stop()
    if failures:
        sys.exit(f"{len(failures)} attack(s) not held:\n  " + "\n  ".join(failures))
    print("all attacks held")


if __name__ == "__main__":
    main()
