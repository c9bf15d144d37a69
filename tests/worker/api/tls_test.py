"""vllm-omni serve over HTTPS (--tls-cert/--tls-key): the openai client trusting the server's
self-signed certificate gets an answer; a client that does not trust it, and plain HTTP, do not.

    tls_test.py VLLM_OMNI FIXTURE_DIR
Exit 77 (skipped) without the openai package or the openssl command.
"""
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

try:
    import httpx
    import openai
except ImportError:
    print("SKIP: the openai package is not installed (pip install -r tests/requirements-api.txt)")
    sys.exit(77)
if not shutil.which("openssl"):
    print("SKIP: needs the openssl command to make a certificate")
    sys.exit(77)

VLLM_OMNI, FIXTURE = sys.argv[1], sys.argv[2]


def main():
    tmp = tempfile.mkdtemp()
    cert, key = f"{tmp}/cert.pem", f"{tmp}/key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    bad = subprocess.run([VLLM_OMNI, "serve", "--model", FIXTURE, "--port", "0", "--tls-cert",
                          cert, "--tls-key", cert], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "TLS" in bad.stderr, (bad.returncode, bad.stderr)

    proc = subprocess.Popen([VLLM_OMNI, "serve", "--model", FIXTURE, "--port", "0",
                             "--served-model-name", "tiny", "--tls-cert", cert, "--tls-key", key],
                            stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on https://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the server did not start"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    try:
        trusting = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="none",
                                 http_client=httpx.Client(verify=cert), max_retries=0)
        r = trusting.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], modalities=["text"],
            max_tokens=4)
        assert r.choices[0].message.content is not None
        untrusting = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=0)
        try:
            untrusting.models.list()
            raise AssertionError("a client that does not trust the certificate got through")
        except openai.APIConnectionError:
            pass
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10)
            raise AssertionError("plain HTTP was answered on the HTTPS port")
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        print("TLS: trusted client answered, untrusted and plain HTTP refused")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
