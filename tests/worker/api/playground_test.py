"""The playground page at "/" in headless Chromium (Debian chromium + chromium-driver, driven with
selenium): it lists the model's speakers, sends a prompt with an audio file, shows the streamed
text, plays the streamed audio chunks and hands the whole answer to its <audio> element. A
screenshot is kept as a test artifact.

    playground_test.py VLLM_OMNI FIXTURE_DIR SCREENSHOT_PNG
Exit 77 (skipped) without selenium, chromium or chromedriver.
"""
import os
import re
import shutil
import subprocess
import sys
import threading

try:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    print("SKIP: selenium is not installed (pip install -r tests/requirements-api.txt)")
    sys.exit(77)

VLLM_OMNI, FIXTURE, SCREENSHOT = sys.argv[1], sys.argv[2], sys.argv[3]
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not CHROMIUM or not os.path.exists(DRIVER):
    print("SKIP: needs Debian's chromium and chromium-driver")
    sys.exit(77)


def main():
    proc = subprocess.Popen([VLLM_OMNI, "serve", "--model", FIXTURE, "--port", "0",
                             "--served-model-name", "tiny"], stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the server did not start"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=1000,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("model: tiny"))
        speakers = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#speaker option")]
        assert "ethan" in speakers, speakers
        selected = driver.execute_script("return document.getElementById('speaker').value")
        assert selected == "ethan", selected  # the model's default voice
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("What do you hear?")
        driver.find_element(By.ID, "max_tokens").clear()
        driver.find_element(By.ID, "max_tokens").send_keys("12")
        driver.find_element(By.ID, "audio").send_keys(os.path.abspath(os.path.join(FIXTURE, "audio.wav")))
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith(("done", "error")))
        status = driver.find_element(By.ID, "status").text
        assert status.startswith("done"), status
        answer = driver.find_element(By.ID, "answer").text
        assert answer.strip(), "no text appeared"
        chunks = driver.execute_script("return window.audioChunks")
        assert chunks >= 1, chunks
        src = driver.find_element(By.ID, "speech").get_attribute("src")
        assert src.startswith("blob:"), src
        # The <audio> element holds the whole answer: it loads and has a duration.
        duration = driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const a = document.getElementById('speech');
            if (a.readyState >= 1) { done(a.duration); return; }
            a.addEventListener('loadedmetadata', () => done(a.duration));
            a.addEventListener('error', () => done(-1));
            a.load();""")
        assert duration and duration > 0, duration
        driver.save_screenshot(SCREENSHOT)
        print(f"playground: {len(answer)} characters, {chunks} audio chunks, "
              f"{duration:.2f} s of speech; screenshot {SCREENSHOT}")
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
