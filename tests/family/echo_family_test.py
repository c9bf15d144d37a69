"""A model family added without a line in the shared code: echo_family.cc registers itself and is
linked only into vllm-omni-echo (vllm-omni's main plus that file). Its two stages run as two gRPC
workers under `generate --stage-configs-path` and under `serve`, handing each other a typed
payload (Letter) that crosses the wire as its tensor; vllm-omni itself, without the family,
refuses the same stage config. Standard library only.

Usage: echo_family_test.py VLLM_OMNI_ECHO VLLM_OMNI ECHO_YAML"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request

ECHO, PRODUCT, YAML = sys.argv[1:4]


def check(cond, msg):
    if not cond:
        print("FAILED:", msg, file=sys.stderr)
        sys.exit(1)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


# generate: the answer on stdout; with --json, each stage's figures show it ran as a worker.
r = run([ECHO, "generate", "--stage-configs-path", YAML, "--prompt", "hi there"])
check(r.returncode == 0, f"generate exited {r.returncode}: {r.stderr}")
check(r.stdout.strip() == "H-I- -T-H-E-R-E", f"generate printed {r.stdout!r}")
r = run([ECHO, "generate", "--stage-configs-path", YAML, "--prompt", "ok", "--json"])
check(r.returncode == 0, f"generate --json exited {r.returncode}: {r.stderr}")
answer = json.loads(r.stdout)
check(answer["text"] == "O-K" and answer["finish_reason"] == "stop", f"answer {r.stdout}")
for stage in ("stage 0 (echo_shout)", "stage 1 (echo_spell)"):
    worker = answer["offload"].get(stage, {}).get("worker", {})
    check(worker.get("requests_completed") == 1, f"{stage} was no worker: {r.stdout}")

# The product links no echo family: the same config names an unknown kind.
r = run([PRODUCT, "generate", "--stage-configs-path", YAML, "--prompt", "hi"])
check(r.returncode != 0, "vllm-omni ran a kind it does not link")
check("model_stage: unknown value 'echo_shout'" in r.stderr, f"vllm-omni said {r.stderr!r}")

# serve: a chat answer, whole and streamed.
proc = subprocess.Popen([ECHO, "serve", "--stage-configs-path", YAML, "--port", "0"],
                        stderr=subprocess.PIPE, text=True)
port, lines = None, []
for line in proc.stderr:
    lines.append(line)
    m = re.search(r"listening on http://[^:]+:(\d+) \(model '([^']*)'\)", line)
    if m:
        port, model = int(m.group(1)), m.group(2)
        break
check(port is not None, "serve did not start: " + "".join(lines))
threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
# Named after the checkpoint folder of the stage that reads the request.
check(model == os.path.basename(os.path.dirname(os.path.abspath(YAML))), f"model name {model!r}")


def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, resp.read().decode()


try:
    messages = [{"role": "user", "content": "ok"}]
    status, body = post({"model": model, "messages": messages, "modalities": ["text"]})
    answer = json.loads(body)
    check(status == 200, f"status {status}: {body}")
    check(answer["choices"][0]["message"]["content"] == "O-K", f"answer {body}")
    check(answer["choices"][0]["finish_reason"] == "stop", f"answer {body}")

    status, body = post({"model": model, "messages": messages, "modalities": ["text"],
                         "stream": True})
    check(status == 200, f"status {status}: {body}")
    text = ""
    for event in body.split("\n\n"):
        data = event.removeprefix("data: ").strip()
        if data and data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    check(text == "O-K", f"streamed {text!r} ({body})")
finally:
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, f"serve exited {proc.returncode}")
print("echo family: generate, serve and two workers passed")
