"""Admission of vllm-omni serve without spurious refusals (tiny checkpoint): closed loops of
streaming clients, each sending its next request as soon as it reads [DONE].
- 8 clients against --max-concurrent-requests 8 for 30 s: no refusal (the running place goes back
  before the last chunk leaves, so the next request finds it free);
- 12 clients: the extra ones wait in the queue and every request succeeds;
- 100 clients: beyond 8 running and --max-queued-requests 16 waiting, 429 with Retry-After, and
  every accepted request completes with [DONE].

    admission_test.py VLLM_OMNI FIXTURE_DIR
Standard library only.
"""
import http.client
import json
import sys
import threading
import time

from serving import Failed, Server, check, run_clients

VLLM_OMNI, FIXTURE = sys.argv[1], sys.argv[2]
REQUEST = json.dumps({"model": "tiny", "modalities": ["text"], "stream": True, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "count to four"}]}).encode()


def one_request(port, source):
    """One streamed request from `source`: (status, Retry-After, whether [DONE] arrived)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/chat/completions", REQUEST,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        body = r.read()
        return r.status, r.getheader("Retry-After"), b"data: [DONE]" in body
    finally:
        conn.close()


def closed_loop(port, clients, seconds=None, rounds=None):
    """`clients` threads, each sending its next request when the last one ended, for `seconds`
    or `rounds` requests each: the outcomes."""
    out, lock, start = [], threading.Lock(), threading.Barrier(clients)
    end = time.time() + (seconds or 3600) + 1

    def client(i):
        # Spread over addresses: 100 clients from one would pass its share of the connections.
        source = f"127.0.0.{2 + i % 8}"
        start.wait()
        n = 0
        while time.time() < end and (rounds is None or n < rounds):
            n += 1
            try:
                result = one_request(port, source)
            except OSError as e:
                result = (0, None, repr(e))
            with lock:
                out.append(result)
            if result[0] == 429:
                time.sleep(0.05)

    run_clients(client, clients)
    return out


def summary(out):
    by_status = {}
    for status, _, _ in out:
        by_status[status] = by_status.get(status, 0) + 1
    return ", ".join(f"{n} x {s}" for s, n in sorted(by_status.items()))


def main():
    srv = Server(VLLM_OMNI, FIXTURE, None, ["--max-concurrent-requests", "8",
                                           "--max-queued-requests", "16"])
    failures = []
    try:
        for clients, kwargs in ((8, {"seconds": 30}), (12, {"seconds": 10}),
                                (100, {"rounds": 3})):
            out = closed_loop(srv.port, clients, **kwargs)
            try:
                ok = [r for r in out if r[0] == 200]
                check(all(done for _, _, done in ok), "an accepted request ended without [DONE]")
                if clients <= 12:
                    check(len(ok) == len(out), f"{clients} clients: {summary(out)}")
                else:
                    refused = [r for r in out if r[0] == 429]
                    check(len(ok) + len(refused) == len(out), summary(out))
                    check(refused, f"100 clients against 8 + 16 places: no 429 ({summary(out)})")
                    check(all(ra and int(ra) >= 1 for _, ra, _ in refused),
                          "a 429 without Retry-After")
                print(f"{clients} clients: {summary(out)}", flush=True)
            except Failed as e:
                failures.append(str(e))
                print(f"FAIL {e}", file=sys.stderr, flush=True)
        srv.check_alive()
    finally:
        srv.stop()
    if failures:
        sys.exit("\n".join(failures))
    print("admission held")


if __name__ == "__main__":
    main()
