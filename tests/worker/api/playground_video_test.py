"""The playground's Video tab in headless Chromium (selenium), on the tiny diffusers Wan folder:
the tab shows for a model that makes video, a job runs with the progress bar, and the <video>
element loads the MP4 with the job's frames. A screenshot is kept as a test artifact.

    playground_video_test.py VLLM_OMNI QWEN3_OMNI_FIXTURE SCREENSHOT_PNG WAN_FIXTURE
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

VLLM_OMNI, SCREENSHOT, FIXTURE = sys.argv[1], sys.argv[3], sys.argv[4]
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not CHROMIUM or not os.path.exists(DRIVER):
    print("SKIP: needs Debian's chromium and chromium-driver")
    sys.exit(77)
KEY = "page-key"


def main():
    proc = subprocess.Popen([VLLM_OMNI, "serve", "--model", FIXTURE, "--port", "0",
                             "--served-model-name", "tiny", "--api-key", KEY],
                            stderr=subprocess.PIPE, text=True)
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
                 "--window-size=1000,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    try:
        # The key first (the page reads /v1/models with it), then the page once more.
        driver.get(f"http://127.0.0.1:{port}/")
        driver.find_element(By.ID, "key").send_keys(KEY)
        driver.execute_script("loadModel()")
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_element(By.ID, "video-tab").is_displayed())
        assert not driver.find_element(By.ID, "chat-tab").is_displayed()
        for field, value in (("vsize", "16x16"), ("vframes", "9"), ("vsteps", "300"),
                             ("vseed", "42")):
            driver.find_element(By.ID, field).send_keys(value)
        # Record the progress bar's values as the page sets them.
        driver.execute_script("""
            window.progressSeen = [];
            const bar = document.getElementById('vprogress');
            setInterval(() => window.progressSeen.push(bar.value), 20);""")
        driver.find_element(By.ID, "vsend").click()
        wait.until(lambda d: d.execute_script("return window.videoDone === true") or
                   d.find_element(By.ID, "vstatus").text.startswith("error"))
        status = driver.find_element(By.ID, "vstatus").text
        assert status.startswith("done: 16x16"), status
        # The <video> element holds the MP4: it loads, 16x16, 9 frames at 16 fps.
        meta = driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const v = document.getElementById('vplayer');
            const report = () => done([v.videoWidth, v.videoHeight, v.duration]);
            if (v.readyState >= 1) { report(); return; }
            v.addEventListener('loadedmetadata', report);
            v.addEventListener('error', () => done([-1, -1, v.error && v.error.code]));""")
        assert meta[0] == 16 and meta[1] == 16 and 0.5 <= meta[2] <= 0.6, meta
        seen = driver.execute_script("return window.progressSeen")
        assert max(seen) == 100, seen
        driver.save_screenshot(SCREENSHOT)
        print(f"playground video: {meta}, progress values {sorted(set(seen))}; "
              f"screenshot {SCREENSHOT}")
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
