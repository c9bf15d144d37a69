"""The playground's Image tab in headless Chromium (selenium), on the tiny diffusers Qwen-Image
folders. Text to image: the tab shows (chat hidden, no file input), two images come back at the
asked size. Edit (QwenImageEditPipeline, one image per request): the file input shows, Generate
without a file is refused by the page, and with the fixture's image it makes one image at the
asked size. A screenshot is kept as a test artifact.

    playground_image_test.py VLLM_OMNI QWEN3_OMNI_FIXTURE SCREENSHOT_PNG QWEN_IMAGE_FIXTURE
                             QWEN_IMAGE_EDIT_FIXTURE
Exit 77 (skipped) without selenium, chromium or chromedriver.
"""
import contextlib
import os
import shutil
import sys

try:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    print("SKIP: selenium is not installed (pip install -r tests/requirements-api.txt)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402  (the shared server start-up)

VLLM_OMNI, SCREENSHOT = sys.argv[1], sys.argv[3]
IMAGE_FIXTURE, EDIT_FIXTURE = sys.argv[4], sys.argv[5]
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not CHROMIUM or not os.path.exists(DRIVER):
    print("SKIP: needs Debian's chromium and chromium-driver")
    sys.exit(77)
KEY = "page-key"


@contextlib.contextmanager
def serve(fixture):
    """`vllm-omni serve` on FIXTURE with the key, for the block's lifetime; yields its port."""
    server = serving.Server(VLLM_OMNI, fixture, KEY, [])
    try:
        yield server.port
    finally:
        server.stop()


def open_image_tab(driver, port):
    """The page with the key typed in (it reads /v1/models with it), its Image tab showing."""
    driver.get(f"http://127.0.0.1:{port}/")
    driver.find_element(By.ID, "key").send_keys(KEY)
    driver.execute_script("loadModel()")
    WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "image-tab").is_displayed())
    assert not driver.find_element(By.ID, "chat-tab").is_displayed()
    assert not driver.find_element(By.ID, "video-tab").is_displayed()
    assert driver.find_element(By.ID, "tab-image").is_displayed()
    assert not driver.find_element(By.ID, "tab-video").is_displayed()


def fill(driver, **fields):
    for field, value in fields.items():
        driver.find_element(By.ID, field).clear()
        driver.find_element(By.ID, field).send_keys(value)


def generate(driver):
    """Clicks Generate and waits for the page to end the request; returns its status line."""
    driver.execute_script("window.imageDone = false")
    driver.find_element(By.ID, "isend").click()
    WebDriverWait(driver, 240).until(lambda d: d.execute_script("return window.imageDone === true"))
    return driver.find_element(By.ID, "istatus").text


def output_images(driver):
    """[width, height] of each <img> in the output once it has loaded ([-1, -1]: it did not)."""
    sources = [img.get_attribute("src")
               for img in driver.find_elements(By.CSS_SELECTOR, "#ioutput img")]
    assert all(s.startswith("data:image/png;base64,") for s in sources), [s[:40] for s in sources]
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const images = [...document.querySelectorAll('#ioutput img')];
        Promise.all(images.map((img) => img.decode().then(
            () => [img.naturalWidth, img.naturalHeight], () => [-1, -1]))).then(done);""")


def text_to_image(driver):
    with serve(IMAGE_FIXTURE) as port:
        open_image_tab(driver, port)
        assert not driver.find_element(By.ID, "iimages").is_displayed()
        fill(driver, isize="32x48", isteps="2", iseed="7", icount="2")
        status = generate(driver)
        assert status.startswith("done: 32x48"), status
        sizes = output_images(driver)
        assert sizes == [[32, 48], [32, 48]], sizes
        return status


def edit(driver):
    with serve(EDIT_FIXTURE) as port:
        open_image_tab(driver, port)
        files = driver.find_element(By.ID, "iimages")
        assert files.is_displayed()
        label = driver.find_element(By.ID, "iimages-label").text
        assert "up to 1 image" in label, label
        fill(driver, isize="32x48", isteps="2")
        # An edit model needs an image: the page says so before sending anything.
        refused = generate(driver)
        assert refused.startswith("error:"), refused
        assert not driver.find_elements(By.CSS_SELECTOR, "#ioutput img")
        files.send_keys(os.path.abspath(os.path.join(EDIT_FIXTURE, "image_a.png")))
        status = generate(driver)
        assert status.startswith("done: 32x48"), status
        sizes = output_images(driver)
        assert sizes == [[32, 48]], sizes
        driver.save_screenshot(SCREENSHOT)
        return refused, status


def main():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1000,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    try:
        generated = text_to_image(driver)
        refused, edited = edit(driver)
    finally:
        driver.quit()
    print(f"playground image: text to image '{generated}'; edit without a file '{refused}', "
          f"with image_a.png '{edited}'; screenshot {SCREENSHOT}")


if __name__ == "__main__":
    main()
