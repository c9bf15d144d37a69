"""What the hostile-client suites share: `vllm-omni serve` started and measured (its resident memory
and its /health latency), and raw HTTP over sockets, so that a test controls the framing byte for
byte and the client address it connects from (any 127.x.y.z is loopback on Linux). Standard
library only."""
import os
import re
import select
import socket
import subprocess
import threading
import time


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


# -- raw HTTP


def head_bytes(port, method, path, headers):
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(port, timeout=10, source=None):
    """A connection to the server from `source` (a loopback address; None: the default)."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                    source_address=(source, 0) if source else None)


def send_pieces(sock, pieces):
    # The server may answer and close before reading the body: a broken pipe here is expected.
    try:
        for piece in pieces:
            sock.sendall(piece)
    except OSError:
        pass


def read_response(sock, max_body=None):
    """Status, headers (lower-case names) and body of the one response on `sock`; with
    `max_body`, reading stops once that many body bytes arrived (the rest is not wanted)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        check(chunk, f"the server closed the connection without an answer (read {data[:200]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        if max_body is not None and len(body) >= max_body:
            break
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):  # after the head: the server's close
            break
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def close(sock):
    # shutdown first: it wakes a sender thread blocked on this socket, close() would not.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def exchange(port, method, path, headers=(), body=b"", timeout=60, source=None, max_body=None):
    """One request on a fresh connection; `body` is bytes or an iterable of pieces, sent on a
    thread so that a server answering before it has read them all is fine."""
    sock = connect(port, timeout, source)
    sender = None
    try:
        sock.sendall(head_bytes(port, method, path, [*headers, ("Connection", "close")]))
        pieces = [body] if isinstance(body, bytes) else body
        sender = threading.Thread(target=send_pieces, args=(sock, pieces), daemon=True)
        sender.start()
        return read_response(sock, max_body)
    finally:
        close(sock)
        if sender:
            sender.join(timeout)


def auth(key):
    return [("Authorization", f"Bearer {key}")] if key else []


def json_headers(body, key=None):
    return [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *auth(key)]


def health_status(port, timeout=10, source=None):
    return exchange(port, "GET", "/health", timeout=timeout, source=source)[0]


def server_closed(sock):
    # Readable means the server closed it, or answered and will close it.
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        sock.recv(4096)
    except OSError:
        pass
    return True


def probe_health(port, window_s, source=None, stop=None):
    """GET /health every 0.5 s, each on a fresh connection, for `window_s` (or until `stop` is
    set): the latencies (None: no 200 within 3 s)."""
    latencies, end = [], time.time() + window_s
    while time.time() < end and not (stop and stop.is_set()):
        start = time.time()
        try:
            ok = health_status(port, timeout=3, source=source) == 200
        except OSError:
            ok = False
        latencies.append(time.time() - start if ok else None)
        time.sleep(max(0.0, 0.5 - (time.time() - start)))
    return latencies


def check_latencies(latencies, limit_s=1.0):
    failed = sum(lat is None for lat in latencies)
    worst = max((lat for lat in latencies if lat is not None), default=float("inf"))
    check(latencies, "no /health probe ran")
    check(not failed, f"{failed} of {len(latencies)} /health probes got no 200 within 3 s")
    check(worst < limit_s, f"the slowest /health probe took {worst:.2f} s (limit {limit_s})")
    return worst


# -- the server and its memory


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))


class RssPeak:
    """The highest VmRSS of `pid` inside a `with`: the kernel's VmHWM reset on entry, or VmRSS
    sampled every 5 ms where /proc/PID/clear_refs may not be written."""

    def __init__(self, pid):
        self.pid, self.peak_kb, self._stop, self._sampler = pid, 0, threading.Event(), None

    def __enter__(self):
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak resident size to the current one
        except OSError:
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak_kb = max(self.peak_kb, status_kb(self.pid, "VmRSS"))

    def __exit__(self, *exc):
        self._stop.set()
        if self._sampler:
            self._sampler.join()
        else:
            self.peak_kb = status_kb(self.pid, "VmHWM")


class Server:
    """vllm-omni serve on `model` with `flags`, warmed up by `warm(server)`, its resident size
    measured after it."""

    def __init__(self, vllm_omni, model, key, flags, warm=None, env=None):
        self.key, self.flags = key, tuple(flags)
        cmd = [vllm_omni, "serve", "--model", model, "--port", "0", "--served-model-name", "tiny",
               *(["--api-key", key] if key else []), *flags]
        # Two malloc arenas: with one per thread the resident size would depend on which
        # threads served what, hiding or faking growth.
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "MALLOC_ARENA_MAX": "2", **(env or {})})
        self.lines = []
        self.port = self._wait_listening()
        check(health_status(self.port) == 200, "warm-up: /health did not answer 200")
        if warm:
            warm(self)
        self.baseline_kb = status_kb(self.proc.pid, "VmRSS")

    def _wait_listening(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                # Keep draining stderr (kept for the log checks) so the server never blocks.
                threading.Thread(target=self._drain, daemon=True).start()
                return int(m.group(1))
        self.stop()
        raise Failed("the server did not start: " + "".join(self.lines).strip())

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def growth_kb(self, peak_kb):
        return peak_kb - self.baseline_kb

    def check_alive(self):
        check(self.proc.poll() is None, f"the server died (exit status {self.proc.returncode})")
        check(health_status(self.port) == 200, "the server stopped answering /health with 200")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # requests still running (no cancel): not our check
            self.proc.kill()
            self.proc.wait()


def run_clients(client, count, timeout=None):
    """Runs client(i) for i in range(count), each in its own thread, and waits for them all."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def expect_status(got, want, body):
    want = want if isinstance(want, (tuple, list, set)) else (want,)
    check(got in want, f"expected {'/'.join(map(str, want))}, got {got}: {body[:300]!r}")


def bounded_memory(srv, attack, limit_mb=50):
    """Runs `attack()` and checks the server's peak resident size stayed within `limit_mb` of its
    baseline."""
    with RssPeak(srv.proc.pid) as rss:
        status = attack()
    grown = srv.growth_kb(rss.peak_kb)
    check(grown < limit_mb * 1000,
          f"the resident size grew by {grown / 1000:.1f} MB (limit {limit_mb})")
    return f"{status}, peak RSS +{grown / 1000:.1f} MB"
