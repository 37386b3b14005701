#!/usr/bin/env python3
"""`tessera view` in headless Chromium (CTest label `browser`).

Starts `tessera view` on the viewer tests' job (tests/viewer/fixture.h: a slide whose heatmap has a known tumour
block), opens the page in headless Chromium through chromium-driver, and checks what a pathologist would: the index
lists the slides (the failed one with its error); the heatmap layer puts the tumour colour over the tumour block and
not over normal tissue (pixels of screenshots against the heatmap tile's own RGBA, composited); the opacity slider
and the toggle change it; quality control's layer greys the excluded ink and its checkbox hides it; P under the mouse; clicking a region zooms to its box; traversal requests are refused.
Every wait is for an event the page reports (window.tessera.state, OpenSeadragon's fully-loaded and animation
events, animation frames), never a sleep. Screenshots are kept in the artifacts folder. Exits 77 (skipped) with a
message when Chromium, chromium-driver or Selenium is missing.

usage: test_view.py TESSERA FIXTURE_PROGRAM ARTIFACTS_DIR
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

SKIP = 77
TIMEOUT = 120  # seconds any one wait may take before the test fails (a hang, not a speed)


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


try:
    from PIL import Image
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:
    skip(f"python3-selenium or python3-pil is not installed ({e}); scripts/install-deps.sh --browser installs them")

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    skip("chromium or chromium-driver is not installed; scripts/install-deps.sh --browser installs them")

TUMOUR = (1280, 768)   # level-0 centre of the fixture's tumour block (P = 0.95)
NORMAL = (384, 1408)   # level-0 centre of a normal cell (P = 0.02)
REGION = [1024, 512, 512, 512]
EXCLUDED = (256, 1792)  # level-0 centre of the fixture's excluded ink (its qc.png: bit 14)
QC_GREY = (110, 110, 110, 150)  # the QC layer's excluded colour and alpha (viewer/tiles.h)


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)
    print(f"ok: {message}")


def start_view(tessera, folder):
    proc = subprocess.Popen([tessera, "view", folder, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    # The address is printed once the server listens: reading it is the readiness wait.
    for line in proc.stdout:
        print(f"tessera view: {line.rstrip()}")
        if line.startswith("Tessera viewer: "):
            return proc, line.split()[2]
    raise Failure(f"tessera view ended (exit {proc.wait()}) without printing its address")


def wait_for(driver, script, what):
    try:
        WebDriverWait(driver, TIMEOUT).until(lambda d: d.execute_script(script))
    except Exception as e:
        state = driver.execute_script("return JSON.stringify(window.tessera && window.tessera.state)")
        raise Failure(f"waiting for {what}: {e!r}; page state {state}") from None


def frames(driver):
    """Lets OpenSeadragon draw: a forced redraw, then two animation frames (its update runs in the first)."""
    driver.execute_async_script(
        "const done = arguments[0]; tessera.viewer.forceRedraw();"
        "requestAnimationFrame(() => requestAnimationFrame(() => done()));")


def screenshot(driver, artifacts, name):
    png = driver.get_screenshot_as_png()
    with open(os.path.join(artifacts, name), "wb") as f:
        f.write(png)
    return Image.open(io.BytesIO(png)).convert("RGB")


def page_point(driver, x, y):
    """Where level-0 (x, y) of the slide is in the page's pixels (device pixels)."""
    return driver.execute_script(
        "const p = tessera.slideItem.imageToViewerElementCoordinates(new OpenSeadragon.Point(arguments[0], arguments[1]));"
        "const r = document.getElementById('viewer').getBoundingClientRect();"
        "return [(r.left + p.x) * devicePixelRatio, (r.top + p.y) * devicePixelRatio];", x, y)


def mean_rgb(image, point, radius=2):
    x, y = int(round(point[0])), int(round(point[1]))
    pixels = [image.getpixel((i, j)) for i in range(x - radius, x + radius + 1) for j in range(y - radius, y + radius + 1)]
    return [sum(p[c] for p in pixels) / len(pixels) for c in range(3)]


def composite(under, rgba, opacity):
    a = rgba[3] / 255.0 * opacity
    return [(1 - a) * under[c] + a * rgba[c] for c in range(3)]


def near(a, b, tolerance):
    return max(abs(x - y) for x, y in zip(a, b)) <= tolerance


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    tessera, fixture, artifacts = sys.argv[1:]
    os.makedirs(artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="tessera-browser-")
    proc = driver = None
    try:
        folder = subprocess.run([fixture, tmp], check=True, capture_output=True, text=True).stdout.strip()
        proc, url = start_view(tessera, folder)

        # The heatmap's own pixels at the two points (level 8: 8 level-0 px per pixel), to composite against.
        with urllib.request.urlopen(url + "dzi/case_001/heatmap-0_files/8/0_0.png") as r:
            tile = Image.open(io.BytesIO(r.read())).convert("RGBA")
        tumour_rgba = tile.getpixel((TUMOUR[0] // 8, TUMOUR[1] // 8))
        normal_rgba = tile.getpixel((NORMAL[0] // 8, NORMAL[1] // 8))
        print(f"heatmap RGBA: tumour {tumour_rgba}, normal {normal_rgba}")

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000", "--force-device-scale-factor=1", "--hide-scrollbars"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        driver.set_script_timeout(TIMEOUT)

        # The index.
        driver.get(url)
        wait_for(driver, "return window.tessera && tessera.state.index", "the index")
        rows = driver.find_elements(By.CSS_SELECTOR, "#index tbody tr")
        check(len(rows) == 2, f"the index lists the job's 2 slides ({len(rows)})")
        check("case_001" in rows[0].text and "0.950" in rows[0].text, f"case_001 with its score: {rows[0].text!r}")
        check("broken_002" in rows[1].text and "Not a TIFF file" in rows[1].text,
              f"the failed slide with its error: {rows[1].text!r}")
        wait_for(driver, "return [...document.querySelectorAll('#index img')].every(i => i.complete && i.naturalWidth > 0)",
                 "the thumbnails")
        screenshot(driver, artifacts, "1-index.png")

        # The slide and its heatmap.
        rows[0].click()
        wait_for(driver, "return tessera.state.slideLoaded && tessera.state.heatmapLoaded", "the slide and heatmap tiles")
        tumour_at = page_point(driver, *TUMOUR)
        normal_at = page_point(driver, *NORMAL)

        driver.find_element(By.ID, "heatmap-toggle").click()  # off
        frames(driver)
        off = screenshot(driver, artifacts, "2-heatmap-off.png")
        driver.find_element(By.ID, "heatmap-toggle").click()  # on again, at the slider's opacity
        driver.execute_script("const s = document.getElementById('opacity'); s.value = 100;"
                              "s.dispatchEvent(new Event('input'));")
        frames(driver)
        on = screenshot(driver, artifacts, "3-heatmap-opacity-1.png")

        under_tumour, under_normal = mean_rgb(off, tumour_at), mean_rgb(off, normal_at)
        seen_tumour, seen_normal = mean_rgb(on, tumour_at), mean_rgb(on, normal_at)
        expect_tumour = composite(under_tumour, tumour_rgba, 1.0)
        print(f"tumour: under {under_tumour}, seen {seen_tumour}, expected {expect_tumour}")
        print(f"normal: under {under_normal}, seen {seen_normal}")
        check(near(seen_tumour, expect_tumour, 12), "the tumour colour over the tumour block")
        check(near(seen_normal, composite(under_normal, normal_rgba, 1.0), 12), "the normal colour over normal tissue")
        check(not near(seen_normal, composite(under_normal, tumour_rgba, 1.0), 40), "no tumour colour over normal tissue")

        driver.execute_script("const s = document.getElementById('opacity'); s.value = 30;"
                              "s.dispatchEvent(new Event('input'));")
        frames(driver)
        faint = screenshot(driver, artifacts, "4-heatmap-opacity-0.3.png")
        seen_faint = mean_rgb(faint, tumour_at)
        check(near(seen_faint, composite(under_tumour, tumour_rgba, 0.3), 12) and not near(seen_faint, seen_tumour, 20),
              f"the opacity slider at 0.3 fades the tumour colour ({seen_faint})")

        # Quality control's layer: the excluded ink greyed over whatever is under it; its checkbox hides it.
        wait_for(driver, "return tessera.state.qcLoaded", "the QC tiles")
        excluded_at = page_point(driver, *EXCLUDED)
        frames(driver)
        qc_on = screenshot(driver, artifacts, "5-qc-on.png")
        driver.find_element(By.ID, "qc-toggle").click()  # off
        frames(driver)
        qc_off = screenshot(driver, artifacts, "6-qc-off.png")
        driver.find_element(By.ID, "qc-toggle").click()  # on again
        frames(driver)
        seen_on, seen_off = mean_rgb(qc_on, excluded_at), mean_rgb(qc_off, excluded_at)
        print(f"excluded ink: QC layer off {seen_off}, on {seen_on}")
        check(near(seen_on, composite(seen_off, QC_GREY, 1.0), 12) and not near(seen_on, seen_off, 20),
              "the QC layer greys the excluded ink, and its checkbox hides it")
        check(near(mean_rgb(qc_on, normal_at), mean_rgb(qc_off, normal_at), 3), "no QC colour over clean tissue")

        # P and µm under the mouse.
        viewer = driver.find_element(By.ID, "viewer")
        rect = driver.execute_script("return document.getElementById('viewer').getBoundingClientRect().toJSON()")
        ActionChains(driver).move_to_element_with_offset(
            viewer, int(tumour_at[0] - rect["left"] - rect["width"] / 2),
            int(tumour_at[1] - rect["top"] - rect["height"] / 2)).perform()
        wait_for(driver, "return document.getElementById('cursor').textContent.startsWith('P 0.950')", "P under the mouse")
        cursor = driver.find_element(By.ID, "cursor").text
        check("µm" in cursor, f"P and µm under the mouse: {cursor!r}")

        # Clicking a region zooms to its box.
        zooms = driver.execute_script("return tessera.state.zooms")
        driver.find_element(By.CSS_SELECTOR, "#regions li").click()
        wait_for(driver, f"return tessera.state.zooms > {zooms} && !tessera.state.animating", "the zoom to the region")
        wait_for(driver, "return tessera.state.slideLoaded", "the zoomed tiles")
        bounds = driver.execute_script(
            "const b = tessera.slideItem.viewportToImageRectangle(tessera.viewer.viewport.getBounds(true));"
            "return [b.x, b.y, b.width, b.height];")
        x, y, w, h = REGION
        print(f"view after the click: {bounds}")
        check(bounds[0] <= x and bounds[1] <= y and bounds[0] + bounds[2] >= x + w and bounds[1] + bounds[3] >= y + h
              and bounds[2] * bounds[3] <= 4 * w * h, "clicking the region zooms to its box")
        driver.find_element(By.ID, "truth-toggle").click()
        frames(driver)
        screenshot(driver, artifacts, "7-region-and-ground-truth.png")

        # Traversal is refused.
        for path in ("/static/..%2f..%2fCMakeLists.txt", "/dzi/..%2F..%2Fetc%2Fpasswd/slide.dzi", "/static/%2e%2e/x"):
            status = driver.execute_async_script(
                "const done = arguments[1]; fetch(arguments[0]).then(r => done(r.status), e => done(String(e)));", path)
            check(status == 404, f"{path} refused ({status})")
        try:
            urllib.request.urlopen(url + "api/slides/..%2f..%2fetc%2fpasswd")
            check(False, "a traversal outside the browser is refused")
        except urllib.error.HTTPError as e:
            check(e.code == 404, f"a traversal outside the browser is refused ({e.code})")
        print("all browser checks passed")
        return 0
    except Failure as e:
        print(f"FAILED: {e}")
        if driver:
            screenshot(driver, artifacts, "failure.png")
        return 1
    finally:
        if driver:
            driver.quit()
        if proc:
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
