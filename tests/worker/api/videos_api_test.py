"""/v1/videos of `vllm-omni serve` through real HTTP requests (urllib; the pinned openai client
predates OpenAI's video API) on the tiny diffusers Wan folder: a job completes and its MP4 reads
back in ffprobe, progress moves with the steps, the list is newest first, DELETE removes a job
(and cancels a running one), /sync answers MP4 bytes, bad requests get OpenAI's error JSON, the
job limits (count, bytes on disk, expiry) hold, the private folder goes at stop, jobs batched with
--max-num-seqs give their MP4s alone byte for byte, and a Qwen3-Omni
server refuses saying it makes no video. /health answers after everything.

    videos_api_test.py VLLM_OMNI QWEN3_OMNI_FIXTURE WAN_FIXTURE
Exit 77 (skipped) without ffprobe, or from a build that writes no MP4.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

if shutil.which("ffprobe") is None:
    print("SKIP: ffprobe is not installed (Debian ffmpeg)")
    sys.exit(77)

VLLM_OMNI, OMNI_FIXTURE, WAN_FIXTURE = sys.argv[1], sys.argv[2], sys.argv[3]
KEY = "video-key"
TINY = {"prompt": "a red fox jumps over the lazy dog", "size": "16x16", "num_frames": 9,
        "num_inference_steps": 2, "seed": 42}


def start_server(model, *extra, env=None):
    proc = subprocess.Popen(
        [VLLM_OMNI, "serve", "--model", model, "--port", "0", "--served-model-name", "tiny",
         "--api-key", KEY, *extra], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError("the server did not start: " + "".join(lines))


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


class Form:
    def __init__(self, data):
        self.data = data


def form_body(fields, upload=None):
    # A multipart/form-data body; `upload` adds a file part of that name.
    parts = [f'--XyZ\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             for k, v in fields.items()]
    if upload:
        parts.append(f'--XyZ\r\nContent-Disposition: form-data; name="{upload}"; '
                     'filename="a.png"\r\nContent-Type: image/png\r\n\r\nPNG\r\n')
    return Form(("".join(parts) + "--XyZ--\r\n").encode())


def call(port, method, path, body=None, key=KEY):
    data = None if body is None else (body.data if isinstance(body, Form) else body
                                      if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "multipart/form-data; boundary=XyZ"
                       if isinstance(body, Form) else "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def ok_json(port, method, path, body=None):
    status, _, data = call(port, method, path, body)
    assert status == 200, (method, path, status, data[:300])
    return json.loads(data)


def expect_error(port, method, path, body, status, param=None, code=None, key=KEY):
    got, headers, data = call(port, method, path, body, key=key)
    assert got == status, (path, body, got, data[:300])
    assert headers["Content-Type"].startswith("application/json"), headers["Content-Type"]
    err = json.loads(data)["error"]
    assert err["message"] and err["type"], err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def wait_done(port, vid, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = ok_json(port, "GET", f"/v1/videos/{vid}")
        if v["status"] in ("completed", "failed"):
            return v
        time.sleep(0.02)
    raise AssertionError(f"{vid} did not finish")


def probe(mp4):
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(mp4)
        f.flush()
        out = subprocess.run(["ffprobe", "-v", "error", "-show_entries",
                              "stream=codec_name,width,height,nb_frames", "-of", "json", f.name],
                             capture_output=True, text=True, check=True).stdout
    return json.loads(out)["streams"][0]


def healthy(port):
    status, _, data = call(port, "GET", "/health", key=None)
    assert status == 200, data


def video_server():
    # TMPDIR: where the server makes its private folder, to see it made and removed.
    tmp = tempfile.mkdtemp()
    proc, port = start_server(WAN_FIXTURE, "--max-video-jobs", "4",
                              env=dict(os.environ, TMPDIR=tmp))
    try:
        folders = glob.glob(os.path.join(tmp, "omni-videos-*"))
        assert len(folders) == 1, folders
        assert os.stat(folders[0]).st_mode & 0o077 == 0, oct(os.stat(folders[0]).st_mode)
        check_video_api(port, folders[0])
    finally:
        stop_server(proc)
    assert glob.glob(os.path.join(tmp, "omni-videos-*")) == [], os.listdir(tmp)
    shutil.rmtree(tmp)


def mp4s(folder):
    # The folder also holds the file naming its owner (for a later server's clean-up).
    return [f for f in os.listdir(folder) if f.endswith(".mp4")]


def check_video_api(port, folder):
    models = ok_json(port, "GET", "/v1/models")
    assert models["data"][0]["video"] is True, models
    expect_error(port, "POST", "/v1/videos", TINY, 401, key=None)
    expect_error(port, "GET", "/v1/videos", None, 401, key="wrong")

    # A job: the object at once, then completed with an MP4 ffprobe reads.
    v = ok_json(port, "POST", "/v1/videos", dict(TINY, model="tiny"))
    assert re.fullmatch(r"video_[0-9a-f]+", v["id"]), v
    assert v["object"] == "video" and v["model"] == "tiny", v
    assert v["status"] in ("queued", "in_progress") and v["error"] is None, v
    assert v["size"] == "16x16" and v["completed_at"] is None, v
    done = wait_done(port, v["id"])
    if done["status"] == "failed" and "no MP4 output" in done["error"]["message"]:
        print("SKIP: this build writes no MP4 (no FFmpeg libraries)")
        sys.exit(77)
    assert done["status"] == "completed" and done["progress"] == 100, done
    assert done["completed_at"] >= done["created_at"] and done["expires_at"] > done["completed_at"]
    assert done["seconds"] == "0.5625", done  # 9 frames at 16 fps
    status, headers, mp4 = call(port, "GET", f"/v1/videos/{v['id']}/content")
    assert status == 200 and headers["Content-Type"] == "video/mp4", (status, headers)
    s = probe(mp4)
    assert (s["codec_name"], s["width"], s["height"], s["nb_frames"]) == ("h264", 16, 16, "9"), s
    assert len(mp4s(folder)) == 1, os.listdir(folder)

    # `seconds` (OpenAI's string) becomes the largest 4k+1 frames <= seconds * fps + 1.
    w = wait_done(port, ok_json(port, "POST", "/v1/videos",
                                dict(TINY, num_frames=None, seconds="1"))["id"])
    assert w["status"] == "completed" and w["seconds"] == "1.0625", w  # 17 frames

    # Progress moves with the steps, never back.
    long = dict(TINY, num_inference_steps=400)
    v2 = ok_json(port, "POST", "/v1/videos", long)
    seen = []
    while True:
        cur = ok_json(port, "GET", f"/v1/videos/{v2['id']}")
        seen.append(cur["progress"])
        if cur["status"] in ("completed", "failed"):
            break
        time.sleep(0.005)
    assert cur["status"] == "completed", cur
    assert seen == sorted(seen), seen
    assert any(0 < p < 100 for p in seen), seen

    # The list: newest first, without the prompts (GET /v1/videos/{id} has them).
    listed = ok_json(port, "GET", "/v1/videos")
    ids = [x["id"] for x in listed["data"]]
    assert listed["object"] == "list" and ids[:3] == [v2["id"], w["id"], v["id"]], ids
    assert all("prompt" not in x for x in listed["data"]), listed
    assert ok_json(port, "GET", f"/v1/videos/{v['id']}")["prompt"] == TINY["prompt"]

    # DELETE: the job and its file go.
    for vid in (w["id"], v2["id"]):
        assert ok_json(port, "DELETE", f"/v1/videos/{vid}") == {
            "id": vid, "object": "video", "deleted": True}
    expect_error(port, "GET", f"/v1/videos/{w['id']}", None, 404, "video_id", "video_not_found")
    expect_error(port, "GET", f"/v1/videos/{w['id']}/content", None, 404)
    expect_error(port, "DELETE", f"/v1/videos/{w['id']}", None, 404)
    assert len(mp4s(folder)) == 1, os.listdir(folder)

    # A running job: no content yet (409); deleted, it stops, and the next job runs at once.
    # Its 512x512 steps are slow next to a 16x16 job: the time its first ~16 steps took (with its
    # start) sets the bound, so both sides see the same machine load. Left running, its other
    # ~980 steps would take ~50 times that.
    submitted = time.time()
    slow = ok_json(port, "POST", "/v1/videos", dict(TINY, size="512x512", num_inference_steps=1000))
    while ok_json(port, "GET", f"/v1/videos/{slow['id']}")["progress"] < 2:
        time.sleep(0.005)
    paced_s = time.time() - submitted
    expect_error(port, "GET", f"/v1/videos/{slow['id']}/content", None, 409, code="video_not_ready")
    start = time.time()
    ok_json(port, "DELETE", f"/v1/videos/{slow['id']}")
    quick = wait_done(port, ok_json(port, "POST", "/v1/videos", TINY)["id"])
    assert quick["status"] == "completed", quick
    quick_s = time.time() - start
    assert quick_s < 10 * paced_s, (quick_s, paced_s)
    ok_json(port, "DELETE", f"/v1/videos/{quick['id']}")

    # A request the model refuses (its size rule): the job fails with the reason.
    bad = wait_done(port, ok_json(port, "POST", "/v1/videos", dict(TINY, size="24x16"))["id"])
    assert bad["status"] == "failed" and "16" in bad["error"]["message"], bad
    assert bad["error"]["code"], bad
    expect_error(port, "GET", f"/v1/videos/{bad['id']}/content", None, 409)
    ok_json(port, "DELETE", f"/v1/videos/{bad['id']}")

    # Bad requests: OpenAI's error JSON naming the field; no job is made.
    expect_error(port, "POST", "/v1/videos", {"size": "16x16"}, 400, "prompt", "missing_field")
    expect_error(port, "POST", "/v1/videos", dict(TINY, prompt=""), 400, "prompt")
    expect_error(port, "POST", "/v1/videos", dict(TINY, prompt=7), 400, "prompt", "invalid_type")
    expect_error(port, "POST", "/v1/videos", dict(TINY, size="16by16"), 400, "size",
                 "invalid_value")
    expect_error(port, "POST", "/v1/videos", dict(TINY, size="0x16"), 400, "size")
    expect_error(port, "POST", "/v1/videos", dict(TINY, seed="x"), 400, "seed", "invalid_type")
    expect_error(port, "POST", "/v1/videos", dict(TINY, num_frames=1.5), 400, "num_frames")
    expect_error(port, "POST", "/v1/videos", dict(TINY, num_inference_steps=0), 400,
                 "num_inference_steps")
    expect_error(port, "POST", "/v1/videos", dict(TINY, seconds="4"), 400, "seconds")
    expect_error(port, "POST", "/v1/videos", dict(TINY, num_frames=None, seconds="-1"), 400,
                 "seconds")
    expect_error(port, "POST", "/v1/videos", dict(TINY, boundary_ratio=2), 400, "boundary_ratio")
    expect_error(port, "POST", "/v1/videos", dict(TINY, quality="high"), 400, "quality",
                 "unknown_field")
    expect_error(port, "POST", "/v1/videos", dict(TINY, model="other"), 404, "model",
                 "model_not_found")
    expect_error(port, "POST", "/v1/videos", b"{not json", 400, code="invalid_json")
    expect_error(port, "POST", "/v1/videos", b"[1]", 400)
    expect_error(port, "GET", "/v1/videos/video_0000/content", None, 404, "video_id")
    assert [x["id"] for x in ok_json(port, "GET", "/v1/videos")["data"]] == [v["id"]]

    # multipart/form-data, as OpenAI's SDK sends it (with its Authorization header).
    form = form_body({"prompt": "1984", "size": "16x16", "num_frames": "9",
                      "num_inference_steps": "2", "seed": "42"})
    f = ok_json(port, "POST", "/v1/videos", form)
    assert f["prompt"] == "1984" and f["size"] == "16x16", f
    assert wait_done(port, f["id"])["status"] == "completed"
    ok_json(port, "DELETE", f"/v1/videos/{f['id']}")
    expect_error(port, "POST", "/v1/videos", form_body({"prompt": "x", "num_frames": "abc"}), 400,
                 "num_frames", "invalid_type")
    expect_error(port, "POST", "/v1/videos", form_body({"prompt": "x"}, upload="input_reference"),
                 400, "input_reference", "unsupported")
    expect_error(port, "POST", "/v1/videos", form_body({"prompt": "x"}), 415,
                 code="unsupported_media_type", key=None)  # a cross-site form could send that
    expect_error(port, "POST", "/v1/chat/completions", form_body({"prompt": "x"}), 415)
    err = expect_error(port, "POST", "/v1/chat/completions",
                       {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, 400,
                       "model", "unsupported")
    assert "/v1/videos" in err["message"], err

    # Sync: the MP4 bytes in the answer, and no job left behind.
    status, headers, mp4 = call(port, "POST", "/v1/videos/sync", TINY)
    assert status == 200 and headers["Content-Type"] == "video/mp4", (status, mp4[:200])
    assert headers["X-Video-Id"].startswith("video_"), headers
    assert probe(mp4)["nb_frames"] == "9"
    expect_error(port, "POST", "/v1/videos/sync", dict(TINY, size="16x"), 400, "size")
    sync_bad = expect_error(port, "POST", "/v1/videos/sync", dict(TINY, size="24x16"), 400)
    assert "16" in sync_bad["message"], sync_bad
    assert [x["id"] for x in ok_json(port, "GET", "/v1/videos")["data"]] == [v["id"]]

    # At most --max-video-jobs (4) queued or running: the fifth gets 429 with Retry-After; the
    # finished job stored (v) does not count.
    slow_job = ok_json(port, "POST", "/v1/videos", dict(TINY, size="512x512",
                                                        num_inference_steps=1000))["id"]
    made = [ok_json(port, "POST", "/v1/videos", TINY)["id"] for _ in range(3)]
    err = expect_error(port, "POST", "/v1/videos", TINY, 429)
    assert "queued or running" in err["message"], err
    status, headers, _ = call(port, "POST", "/v1/videos", TINY)
    assert status == 429 and int(headers["Retry-After"]) >= 1, (status, headers)
    ok_json(port, "DELETE", f"/v1/videos/{slow_job}")
    for vid in made:
        wait_done(port, vid)
        ok_json(port, "DELETE", f"/v1/videos/{vid}")

    # Counted in the metrics with the other requests.
    status, _, text = call(port, "GET", "/metrics")
    text = text.decode()
    assert re.search(r'omni_requests_total\{status="429"\} [1-9]', text), text
    assert re.search(r'omni_requests_total\{status="409"\} [1-9]', text), text
    assert 'omni_video_jobs{status="completed"} 1' in text, text
    assert re.search(r"omni_video_bytes [1-9]", text), text
    healthy(port)

    # Left running: the server stops it, exits 0 and removes the folder (video_server checks).
    running = ok_json(port, "POST", "/v1/videos", dict(TINY, num_inference_steps=1000))
    while ok_json(port, "GET", f"/v1/videos/{running['id']}")["status"] == "queued":
        time.sleep(0.005)


def limits_server():
    # Too small for any MP4: the job fails saying so; failed jobs expire too (after 2 s).
    proc, port = start_server(WAN_FIXTURE, "--max-video-bytes", "1000", "--video-job-ttl", "2")
    try:
        v = wait_done(port, ok_json(port, "POST", "/v1/videos", TINY)["id"])
        assert v["status"] == "failed" and v["error"]["code"] == "storage_full", v
        assert "--max-video-bytes" in v["error"]["message"], v
        assert v["expires_at"] - v["completed_at"] in (2, 3), v
        time.sleep(3.2)
        expect_error(port, "GET", f"/v1/videos/{v['id']}", None, 404)
        assert ok_json(port, "GET", "/v1/videos")["data"] == []
        healthy(port)
    finally:
        stop_server(proc)


def batch_server():
    # --max-num-seqs 4: four jobs (their own prompts, seeds, guidance) denoise together on the
    # stage's loop, each giving the MP4 it gives alone, byte for byte.
    proc, port = start_server(WAN_FIXTURE, "--max-num-seqs", "4")
    try:
        jobs = [dict(TINY, prompt=f"a red fox, take {k}", seed=10 + k, guidance_scale=g,
                     num_inference_steps=6) for k, g in enumerate([5.0, 3.0, 1.0, 7.5])]

        def content(vid):
            v = wait_done(port, vid)
            assert v["status"] == "completed", v
            status, _, mp4 = call(port, "GET", f"/v1/videos/{vid}/content")
            assert status == 200, status
            return mp4

        alone = [content(ok_json(port, "POST", "/v1/videos", job)["id"]) for job in jobs]
        ids = [ok_json(port, "POST", "/v1/videos", job)["id"] for job in jobs]
        together = [content(vid) for vid in ids]
        for k in range(len(jobs)):
            assert together[k] == alone[k], k
        assert len(set(alone)) == len(jobs)
        # Batched: the stage stepped more requests than steps.
        text = call(port, "GET", "/metrics")[2].decode()
        steps = float(re.search(r"omni_engine_steps_total\{[^}]*\} (\S+)", text).group(1))
        rows = float(re.search(r"omni_engine_batch_rows_total\{[^}]*\} (\S+)", text).group(1))
        assert rows > steps, (rows, steps)
        healthy(port)
    finally:
        stop_server(proc)


def omni_server():
    # A model that makes no video says so, on every video route.
    proc, port = start_server(OMNI_FIXTURE)
    try:
        assert ok_json(port, "GET", "/v1/models")["data"][0]["video"] is False
        err = expect_error(port, "POST", "/v1/videos", TINY, 400, "model", "unsupported")
        assert "makes no video" in err["message"], err
        expect_error(port, "GET", "/v1/videos", None, 400, "model", "unsupported")
        expect_error(port, "POST", "/v1/videos/sync", TINY, 400, "model", "unsupported")
        expect_error(port, "GET", "/v1/videos", None, 401, key=None)
        healthy(port)
    finally:
        stop_server(proc)


def main():
    video_server()
    limits_server()
    batch_server()
    omni_server()
    print("OK")


if __name__ == "__main__":
    main()
