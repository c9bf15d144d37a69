"""/v1/images of `vllm-omni serve`, driven by the real `openai` client on the tiny diffusers
Qwen-Image folders: generations and edits (Edit, one image; Edit-Plus, two) decode (PIL) and
equal, pixel for pixel, what `vllm-omni generate` writes for the same settings; bad requests get
OpenAI's error JSON (status, type, param); a text-to-image model refuses edits and an edit model
generations; a full queue answers 429; a client that leaves cancels its request; /metrics counts
it all; a Qwen3-Omni server refuses saying it makes no images. /health answers after everything.

    images_api_test.py VLLM_OMNI QWEN3_OMNI_FIXTURE QWEN_IMAGE_FIXTURE QWEN_IMAGE_EDIT_FIXTURE
Exit 77 (skipped) when the openai or pillow package is missing.
"""
import base64
import io
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import openai
    from PIL import Image
except ImportError:
    print("SKIP: openai or pillow is not installed (pip install -r tests/requirements-api.txt)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402  (the shared server start-up)

VLLM_OMNI, OMNI_FIXTURE, IMAGE_FIXTURE, EDIT_FIXTURE = sys.argv[1:5]
KEY = "image-key"
PROMPT = "A red fox sitting by a cafe, golden hour light."
SETTINGS = {"negative_prompt": "blurry, low quality", "num_inference_steps": 3,
            "true_cfg_scale": 4, "seed": 11}


def raw(port, method, path, body=None, key=KEY, content_type="application/json"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def pixels(png):
    image = Image.open(io.BytesIO(png) if isinstance(png, bytes) else png)
    assert image.format == "PNG" and image.mode == "RGB", (image.format, image.mode)
    return image.size, image.tobytes()


def expect_api_error(call, status, param, code, phrase=""):
    """`call()` raises the openai client's error for `status`; its body is OpenAI's error JSON."""
    try:
        call()
    except openai.APIStatusError as e:
        assert e.status_code == status, (e.status_code, e.body)
        err = e.body if "message" in (e.body or {}) else e.body["error"]
        assert err["type"] == ("invalid_request_error" if status == 400 else err["type"]), err
        assert err["param"] == param and err["code"] == code, err
        assert phrase in err["message"], err
        return err
    raise AssertionError(f"no error (expected {status})")


def metric(port, name):
    _, _, text = raw(port, "GET", "/metrics")
    m = re.search(rf"^{re.escape(name)} (\d+)", text.decode(), re.M)
    return int(m.group(1)) if m else 0


def wait_for(what, cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


EDIT_PROMPT = "Make the fox blue, keep the cafe."


def edit_many(client, images, fields):
    """An edit of several images as OpenAI's list form sends it (one "image[]" part each); the
    pinned client's images.edit takes one image."""
    return client.post("/images/edits", cast_to=openai.types.ImagesResponse, body=fields,
                       files=[("image[]", image) for image in images],
                       options={"headers": {"Content-Type": "multipart/form-data"}})


def edits(tmp):
    """Edit (one image) and Edit-Plus (two) through client.images.edit, equal to generate's."""
    image_a = os.path.join(EDIT_FIXTURE, "image_a.png")
    image_b = os.path.join(EDIT_FIXTURE, "image_b.png")
    plus = os.path.join(EDIT_FIXTURE, "plus")

    def generate(model, images, name):
        args = [VLLM_OMNI, "generate", "--model", model, "--prompt", EDIT_PROMPT,
                "--num-inference-steps", "2", "--seed", "5", "--width", "48", "--height", "32",
                "--output", os.path.join(tmp, name)]
        for image in images:
            args += ["--image", image]
        subprocess.run(args, capture_output=True, text=True, check=True, timeout=300)
        return pixels(os.path.join(tmp, name))

    ref_edit = generate(EDIT_FIXTURE, [image_a], "edit.png")
    ref_plus = generate(plus, [image_a, image_b], "plus.png")
    settings = {"num_inference_steps": 2, "seed": 5}
    for model, images, ref in ((EDIT_FIXTURE, [image_a], ref_edit),
                               (plus, [image_a, image_b], ref_plus)):
        srv = serving.Server(VLLM_OMNI, model, KEY, [])
        try:
            port = srv.port
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                                   max_retries=0)
            limit = json.loads(raw(port, "GET", "/v1/models")[2])["data"][0]["image_edit"]
            assert limit == (1 if model == EDIT_FIXTURE else 4), limit
            if len(images) == 1:
                with open(images[0], "rb") as f:
                    r = client.images.edit(model="tiny", image=f, prompt=EDIT_PROMPT,
                                           size="48x32", extra_body=settings)
            else:
                r = edit_many(client, [(os.path.basename(p), open(p, "rb").read())
                                       for p in images],
                              {"model": "tiny", "prompt": EDIT_PROMPT, "size": "48x32",
                               **settings})
            assert len(r.data) == 1, r
            assert pixels(base64.b64decode(r.data[0].b64_json)) == ref, \
                f"{model}: the edit differs from vllm-omni generate's"
            assert metric(port, "omni_image_edits_total") == 1

            # -- bad edits: OpenAI's error JSON, and the server stays healthy
            png = open(image_a, "rb").read()

            def edit(**kw):
                args = {"model": "tiny", "image": ("a.png", png), "prompt": EDIT_PROMPT,
                        "size": "48x32", "extra_body": {"num_inference_steps": 2}}
                args.update(kw)
                return lambda: client.images.edit(**args)

            expect_api_error(lambda: edit_many(client, [("a.png", png)] * (limit + 1),
                                               {"prompt": EDIT_PROMPT}),
                             400, "image", "invalid_value", f"edits at most {limit} image")
            expect_api_error(edit(mask=("m.png", png)), 400, "mask", "unsupported")
            expect_api_error(edit(n=11), 400, "n", "invalid_value", "from 1 to 10")
            expect_api_error(edit(size="1000x1000"), 400, "size", "invalid_value")
            # Not an image: the stage refuses it, naming the upload.
            expect_api_error(edit(image=("a.png", b"not an image" * 10)), 400, None, None,
                             "image 1")
            # An edit model needs an image: generations point to /v1/images/edits.
            expect_api_error(lambda: client.images.generate(prompt=EDIT_PROMPT, size="48x32"),
                             400, "image", "missing_field", "/v1/images/edits")
            # A form needs the Authorization header; JSON is not an edit.
            status, _, body = raw(port, "POST", "/v1/images/edits",
                                  json.dumps({"prompt": EDIT_PROMPT}).encode())
            assert status == 415, (status, body)
            srv.check_alive()
        finally:
            srv.stop()


def main():
    # The same requests through `vllm-omni generate`: n = 2 goes to two_0000.png, two_0001.png.
    tmp = tempfile.mkdtemp()

    def generate(n, name):
        subprocess.run(
            [VLLM_OMNI, "generate", "--model", IMAGE_FIXTURE, "--prompt", PROMPT,
             "--negative-prompt", SETTINGS["negative_prompt"], "--num-inference-steps", "3",
             "--true-cfg-scale", "4", "--seed", "11", "--width", "32", "--height", "48",
             "--num-images", str(n), "--output", os.path.join(tmp, name)],
            capture_output=True, text=True, check=True, timeout=300)

    generate(2, "two.png")
    generate(1, "one.png")
    refs = [pixels(os.path.join(tmp, f"two_000{i}.png")) for i in range(2)]
    ref_one = pixels(os.path.join(tmp, "one.png"))

    # No queue: a second request while one runs gets 429.
    srv = serving.Server(VLLM_OMNI, IMAGE_FIXTURE, KEY, ["--max-queued-images", "0"])
    port = srv.port
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        models = json.loads(raw(port, "GET", "/v1/models")[2])["data"][0]
        assert models["image"] is True and models["video"] is False, models

        # -- two images, equal to generate's
        r = client.images.generate(model="tiny", prompt=PROMPT, n=2, size="32x48",
                                   response_format="b64_json", extra_body=SETTINGS)
        assert isinstance(r.created, int) and abs(r.created - time.time()) < 600, r.created
        assert len(r.data) == 2, r
        for i, (image, ref) in enumerate(zip(r.data, refs)):
            size, data = pixels(base64.b64decode(image.b64_json))
            assert size == (32, 48), size
            assert (size, data) == ref, f"image {i} differs from vllm-omni generate's"
        assert refs[0] != refs[1], "the two images of one request are the same"
        # The model field may be left out; n defaults to 1.
        one = client.images.generate(prompt=PROMPT, size="32x48", extra_body=SETTINGS)
        assert len(one.data) == 1 and pixels(base64.b64decode(one.data[0].b64_json)) == ref_one
        assert metric(port, "omni_images_generated_total") == 3

        # -- bad requests: OpenAI's error JSON, and the server stays healthy
        def images(**kw):
            args = {"model": "tiny", "prompt": PROMPT, "size": "32x48",
                    "extra_body": {"num_inference_steps": 2}}
            args.update(kw)
            return lambda: client.images.generate(**args)

        expect_api_error(images(n=11), 400, "n", "invalid_value", "from 1 to 10")
        expect_api_error(images(response_format="url"), 400, "response_format", "unsupported",
                         "\"url\" is not supported")
        expect_api_error(images(size="1000x1000"), 400, "size", "invalid_value", "multiples of 16")
        expect_api_error(images(size="big"), 400, "size", "invalid_value", "WIDTHxHEIGHT")
        expect_api_error(images(prompt=""), 400, "prompt", "invalid_value", "must not be empty")
        expect_api_error(images(extra_body={"guidance_scale": 3}), 400, "guidance_scale",
                         "unknown_field")
        expect_api_error(images(quality="hd"), 400, "quality", "unknown_field")
        expect_api_error(images(extra_body={"seed": -1}), 400, "seed", "invalid_value")
        # Over the cap of 4 x the default 1024 x 1024 pixels (times n), before anything runs.
        expect_api_error(images(size="4096x4096"), 400, "size", "request_too_large",
                         "--max-image-request-pixels")
        expect_api_error(images(size="1024x1024", n=5), 400, "n", "request_too_large")
        expect_api_error(images(model="other"), 404, "model", "model_not_found")
        status, _, body = raw(port, "POST", "/v1/images/generations", b"{\"prompt\": ")
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json", body
        # Edits: this model makes images from text only.
        err = expect_api_error(
            lambda: client.images.edit(model="tiny", image=("a.png", b"\x89PNG" * 4096),
                                       prompt=PROMPT), 400, "image", "unsupported")
        assert "from text only" in err["message"], err
        assert json.loads(raw(port, "GET", "/v1/models")[2])["data"][0]["image_edit"] == 0
        # The key, as on every route.
        status, _, body = raw(port, "POST", "/v1/images/generations",
                              json.dumps({"prompt": PROMPT}).encode(), key=None)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", body
        # A chat request to the image model points to the images API.
        status, _, body = raw(port, "POST", "/v1/chat/completions", json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode())
        assert status == 400 and "/v1/images/generations" in json.loads(body)["error"]["message"]
        srv.check_alive()

        # -- one runs, none waits: a second request gets 429; the first's client leaves and its
        # request is cancelled (1000 steps at the default 1024 x 1024 take about a minute).
        slow = json.dumps({"prompt": PROMPT, "num_inference_steps": 1000})
        sock = serving.connect(port)
        sock.sendall(serving.head_bytes(port, "POST", "/v1/images/generations",
                                        serving.json_headers(slow, KEY)) + slow.encode())
        wait_for("the slow request to run", lambda: metric(port, "omni_image_requests_running"))
        status, headers, body = raw(port, "POST", "/v1/images/generations",
                                    json.dumps({"prompt": PROMPT, "size": "32x32"}).encode())
        assert status == 429 and headers["Retry-After"], (status, body)
        assert json.loads(body)["error"]["type"] == "rate_limit_error", body
        gone = time.time()
        serving.close(sock)
        wait_for("the cancelled request to end",
                 lambda: not metric(port, "omni_image_requests_running"), timeout=30)
        assert time.time() - gone < 30
        _, _, text = raw(port, "GET", "/metrics")
        assert 'omni_requests_total{status="499"} 1' in text.decode(), text.decode()[:2000]
        assert 'omni_requests_total{status="429"} 1' in text.decode()
        # The stage is free again.
        again = client.images.generate(prompt=PROMPT, size="16x16",
                                       extra_body={"num_inference_steps": 2})
        assert pixels(base64.b64decode(again.data[0].b64_json))[0] == (16, 16)
        srv.check_alive()
    finally:
        srv.stop()

    edits(tmp)

    # -- a model that makes no images
    omni = serving.Server(VLLM_OMNI, OMNI_FIXTURE, KEY, [])
    try:
        models = json.loads(raw(omni.port, "GET", "/v1/models")[2])["data"][0]
        assert models["image"] is False, models
        for path in ("/v1/images/generations", "/v1/images/edits"):
            status, _, body = raw(omni.port, "POST", path, json.dumps({"prompt": "x"}).encode())
            err = json.loads(body)["error"]
            assert status == 400 and err["param"] == "model" and "makes no images" in \
                err["message"], (path, status, body)
        omni.check_alive()
    finally:
        omni.stop()
    print("images API: two images equal to generate's, errors, edits (Edit, Edit-Plus) equal to "
          "generate's, key, 429, cancel, no-image model")


if __name__ == "__main__":
    main()
