"""serve-bench: time to first token, time to first audio, real-time factor and aggregate
throughput (generated tokens and seconds of speech per second of wall time) of `vllm-omni
serve`, at each concurrency, streamed and not, through the openai client. One JSON line per
(concurrency, stream). Starts the server on the tiny checkpoint unless --url is given.

    python3 bench/serve_bench.py [--vllm-omni build/worker/vllm-omni] [--model DIR]
                                 [--url http://127.0.0.1:8091/v1 --served-model-name NAME]
                                 [--requests 96] [--tokens 16] [--frames 24]
                                 [--concurrency 1,8] [--stream both|yes|no] [--rounds 1]

With --rounds N the concurrencies take turns N times (1, 8, 1, 8, ...), so that a machine whose
speed drifts weighs on every concurrency alike, and a last line per (concurrency, stream) pools
the rounds: medians over all their requests, throughput over all their wall time, and the ratios
to concurrency 1.

Non-streamed answers arrive whole: their first token and first audio are the whole latency.
Real-time factor = request latency / seconds of speech returned (below 1: faster than real time).
"""
import argparse
import base64
import io
import json
import re
import statistics
import subprocess
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor

import openai


def wav_seconds(data):
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def one(client, model, i, args, stream):
    messages = [{"role": "user", "content": f"Request {i}: describe a quiet morning."}]
    common = dict(model=model, messages=messages, modalities=["text", "audio"], temperature=0,
                  seed=abs(i), max_tokens=args.tokens, extra_body={"max_audio_frames": args.frames})
    start = time.perf_counter()
    if not stream:
        r = client.chat.completions.create(**common)
        latency = time.perf_counter() - start
        audio = wav_seconds(base64.b64decode(r.choices[1].message.audio.data))
        return latency, latency, latency, audio, r.usage.completion_tokens
    ttft = ttfa = None
    audio = 0.0
    tokens = 0
    for chunk in client.chat.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **common):
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices or not chunk.choices[0].delta.content:
            continue
        now = time.perf_counter() - start
        if (chunk.model_extra or {}).get("modality") == "audio":
            ttfa = ttfa if ttfa is not None else now
            audio += wav_seconds(base64.b64decode(chunk.choices[0].delta.content))
        else:
            ttft = ttft if ttft is not None else now
    return ttft, ttfa, time.perf_counter() - start, audio, tokens


def print_summary(pooled, rounds):
    """One line per (concurrency, stream): medians over every round's requests, throughput over
    every round's wall time, and the ratios to concurrency 1 where it ran."""
    summary = {}
    for (concurrency, stream), (rows, wall) in pooled.items():
        ttft, ttfa, _, _, tokens = zip(*rows)
        summary[(concurrency, stream)] = {
            "summary": True, "concurrency": concurrency, "stream": stream, "rounds": rounds,
            "requests": len(rows),
            "time_to_first_token_ms_p50": 1000 * statistics.median(ttft),
            "time_to_first_audio_ms_p50": 1000 * statistics.median(ttfa),
            "tokens_per_s": sum(tokens) / wall}
    for (concurrency, stream), line in summary.items():
        one_at_a_time = summary.get((1, stream))
        if one_at_a_time and concurrency != 1:
            line["tokens_per_s_vs_concurrency_1"] = (line["tokens_per_s"] /
                                                     one_at_a_time["tokens_per_s"])
            line["time_to_first_audio_vs_concurrency_1"] = (
                line["time_to_first_audio_ms_p50"] / one_at_a_time["time_to_first_audio_ms_p50"])
        print(json.dumps(line), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-omni", default="build/worker/vllm-omni")
    p.add_argument("--model", default="tests/fixtures/qwen3_omni_tiny")
    p.add_argument("--url", default="")
    p.add_argument("--served-model-name", default="tiny")
    p.add_argument("--requests", type=int, default=96,
                   help="requests per row (fewer: the first wave of simultaneous requests weighs "
                        "on the medians)")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--concurrency", default="1,8", help="comma-separated client counts")
    p.add_argument("--stream", choices=["both", "yes", "no"], default="both")
    p.add_argument("--rounds", type=int, default=1,
                   help="times the concurrencies take turns; above 1, a pooled summary follows")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    streams = {"both": (False, True), "yes": (True,), "no": (False,)}[args.stream]
    proc = None
    url = args.url
    if not url:
        proc = subprocess.Popen([args.vllm_omni, "serve", "--model", args.model, "--port", "0",
                                 "--served-model-name", args.served_model_name,
                                 "--max-concurrent-requests", "64"],
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1) + "/v1"
                break
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        one(client, args.served_model_name, -1, args, False)  # warm-up
        concurrencies = [int(c) for c in args.concurrency.split(",")]
        pooled = {}  # (concurrency, stream) -> [rows, wall seconds]
        for _, concurrency, stream in [(r, c, s) for r in range(args.rounds)
                                   for c in concurrencies for s in streams]:
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                rows = list(pool.map(lambda i: one(client, args.served_model_name, i, args,
                                                   stream), range(args.requests)))
            wall = time.perf_counter() - start
            pool_rows = pooled.setdefault((concurrency, stream), [[], 0.0])
            pool_rows[0].extend(rows)
            pool_rows[1] += wall
            ttft, ttfa, total, audio, tokens = zip(*rows)
            print(json.dumps({
                "concurrency": concurrency, "stream": stream, "requests": args.requests,
                "time_to_first_token_ms": {"p50": 1000 * statistics.median(ttft),
                                           "max": 1000 * max(ttft)},
                "time_to_first_audio_ms": {"p50": 1000 * statistics.median(ttfa),
                                           "max": 1000 * max(ttfa)},
                "latency_ms_p50": 1000 * statistics.median(total),
                "real_time_factor_p50": statistics.median(t / a for t, a in zip(total, audio)),
                "audio_seconds_per_request": statistics.mean(audio),
                "requests_per_s": args.requests / wall,
                "tokens_per_s": sum(tokens) / wall,
                "audio_seconds_per_s": sum(audio) / wall}), flush=True)
        if args.rounds > 1:
            print_summary(pooled, args.rounds)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
