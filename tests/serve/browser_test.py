#!/usr/bin/env python3
"""The playground page of `llada serve` (GET /) in headless Chromium, driven with selenium.

A server with an API key serves tiny-llada-tasks (diffusion) and smollm2 (autoregressive). The
test opens the page, checks that it asks for the key (the model list answers 401 without it),
types the key, and then:
  - sends a raw prompt to the diffusion model, twice (strategies vanilla, and revision on a
    prompt where it revises committed tokens, which the page counts and flashes): the
    page's recorded canvas frames go from all-masked through at least one partly-masked frame
    to no masked position, the last frame's text, the chat bubble's text and the reply equal
    `llada generate -m tiny-llada-tasks --mode diffusion --raw` with the same settings;
  - replays a recorded frame with the scrubber;
  - stops a long smollm2 reply with Esc, then chats with smollm2 (greedy): the streamed reply
    equals `llada generate -t 0`'s and the canvas panel stays hidden;
  - sends a request the server refuses (threshold 5): the page shows its error message;
  - on a second server with `--draft ngram`, shows usage's accepted of drafted tokens, the
    reply again equal to `llada generate`'s;
  - the browser console holds no error and no warning but the network's own lines for the
    401 of the first model list (asked for before the key was typed) and the refused request.

Usage: tests/serve/browser_test.py [PATH_TO_LLADA_BINARY]   (default: target/release/llada)
LLADA_BROWSER_SCREENSHOT=FILE.png saves the page as the diffusion check left it.
Needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver) and the
selenium PyPI package; scripts/test.sh installs them.
"""
import os
import shutil
import sys
import time

from common import generate, start_server, stop_server  # noqa: E402  (tests/serve/)

KEY = "sk-browser-test"
TIMEOUT = 60  # seconds any one wait in the page may take


def need(what, how):
    sys.exit(f"browser test: {what} is missing: {how}")


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    need("the selenium package", "python3 -m pip install selenium")


def browser_paths():
    """Chromium and its driver (Debian's packages; selenium's manager cannot download here)."""
    chrome = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                   if p), None)
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
    if not chrome or not driver:
        need("chromium" if not chrome else "chromedriver",
             "apt-get install chromium chromium-driver")
    return chrome, driver


def start_browser():
    chrome, driver = browser_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--disable-extensions"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def wait_js(drv, expr, what):
    try:
        WebDriverWait(drv, TIMEOUT, poll_frequency=0.05).until(
            lambda d: d.execute_script("return " + expr))
    except Exception:
        status = drv.execute_script("return document.getElementById('status').textContent")
        raise AssertionError(f"waited {TIMEOUT} s for {what}; the page says: {status!r}")


def problems(drv):
    """Console entries at WARNING or SEVERE."""
    return [e for e in drv.get_log("browser") if e["level"] in ("WARNING", "SEVERE")]


def fill(drv, field, value):
    el = drv.find_element(By.ID, field)
    el.clear()
    if value != "":
        el.send_keys(str(value))
    # The page saves settings on change; a blur fires it like a user leaving the field.
    drv.execute_script("arguments[0].dispatchEvent(new Event('change'))", el)


def send(drv, text):
    """Type TEXT, press Enter, and wait for the request to finish; the page's state after."""
    runs = drv.execute_script("return window.llada.runs")
    box = drv.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys("\n")
    wait_js(drv, f"window.llada.runs > {runs}", "the reply")
    st = drv.execute_script(
        "const s = window.llada; return {status: s.status, reply: s.reply, usage: s.usage,"
        " frames: s.frames, kind: s.kinds[document.getElementById('model').value]}")
    assert st["status"] == "done", (st["status"], drv.find_element(By.ID, "status").text)
    return st


def check_diffusion(drv, prompt, gen_length, block_length, strategy, threshold=""):
    want = generate("-m", "tiny-llada-tasks", "--mode", "diffusion", "--raw", "-t", "0",
                    "--gen-length", str(gen_length), "--block-length", str(block_length),
                    "--strategy", strategy, prompt,
                    *(["--threshold", str(threshold)] if threshold != "" else []))
    Select(drv.find_element(By.ID, "model")).select_by_value("tiny-llada-tasks")
    Select(drv.find_element(By.ID, "endpoint")).select_by_value("completion")
    Select(drv.find_element(By.ID, "strategy")).select_by_value(strategy)
    for field, v in (("gen_length", gen_length), ("block_length", block_length),
                     ("temperature", 0), ("max_tokens", ""), ("threshold", threshold)):
        fill(drv, field, v)
    st = send(drv, prompt)
    frames = st["frames"]
    masked = [sum(c["s"] == "i" for c in f["cells"]) for f in frames]
    assert all(len(f["cells"]) == gen_length for f in frames), [len(f["cells"]) for f in frames]
    assert masked[0] == gen_length, f"the first frame is not all masked: {masked}"
    assert any(0 < m < gen_length for m in masked), f"no intermediate frame: {masked}"
    assert masked[-1] == 0, f"the last frame still has masked positions: {masked}"
    assert all(a >= b for a, b in zip(masked, masked[1:])), f"a position was re-masked: {masked}"
    if strategy == "vanilla":  # steps = gen_length: the server's frames unmask one a step
        assert masked[1:gen_length + 1] == list(range(gen_length - 1, -1, -1)), masked
    assert frames[-1]["cells"][-1]["s"] == "s", "the last frame is not stable"
    final = "".join(c["t"] for c in frames[-1]["cells"])
    bubble = drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .text")[-1].text
    assert final == want, ("canvas", final, want)
    assert st["reply"] == want, ("reply", st["reply"], want)
    assert bubble == want.strip(), ("bubble", bubble, want)
    assert st["kind"] == "diffusion" and drv.find_element(By.ID, "diffusion").is_displayed()
    cells = drv.find_elements(By.CSS_SELECTOR, "#canvas .cell")
    assert len(cells) == gen_length and all("s" in c.get_attribute("class").split() for c in cells)
    steps = int(drv.find_element(By.ID, "c-step").text)
    # The server sends the all-masked frame as step 0, then one frame per step.
    assert frames[0]["origin"] == "server" and frames[0]["step"] == 0, frames[0]
    assert steps == len(frames) - 1, (steps, len(frames))
    u = st["usage"]
    assert u and u["completion_tokens"] > 0 and u["forward_passes"] > 0, u
    revised = sum(c["r"] for f in frames for c in f["cells"])
    assert int(drv.find_element(By.ID, "c-rev").text) == revised
    print(f"  diffusion {strategy}: {prompt!r} -> {want!r}: {len(frames)} frames "
          f"(masked per frame {masked}), {revised} revisions, {u['forward_passes']} forward passes")
    return len(frames), revised


def check_scrub(drv):
    """The replay scrubber draws a recorded frame: frame 1 has one position unmasked."""
    drv.execute_script("const r = document.getElementById('scrub'); r.value = 1;"
                       " r.dispatchEvent(new Event('input'))")
    cells = drv.find_elements(By.CSS_SELECTOR, "#canvas .cell")
    want = drv.execute_script("return window.llada.frames[1].cells.map(c => c.s)")
    got = [c.get_attribute("class").split()[1] for c in cells]
    assert got == want, (got, want)
    assert not drv.find_element(By.ID, "replay").get_property("disabled")


def check_stop(drv):
    """Esc stops a long reply; the page says so and keeps what came."""
    Select(drv.find_element(By.ID, "model")).select_by_value("smollm2")
    Select(drv.find_element(By.ID, "endpoint")).select_by_value("chat")
    fill(drv, "max_tokens", 2000)
    fill(drv, "temperature", "")
    runs = drv.execute_script("return window.llada.runs")
    box = drv.find_element(By.ID, "prompt")
    box.send_keys("Write a long story about the sea.\n")
    wait_js(drv, "document.querySelectorAll('.msg.assistant .text')"
            "[document.querySelectorAll('.msg.assistant .text').length - 1].textContent.length > 0",
            "the first piece of the long reply")
    box.send_keys(Keys.ESCAPE)
    wait_js(drv, f"window.llada.runs > {runs}", "the stop")
    st = drv.execute_script("return window.llada.status")
    assert st == "stopped", st
    assert drv.find_element(By.ID, "status").text == "Stopped."


def check_error(drv):
    """A request the server refuses: its OpenAI error message shows as an alert, and the only
    console entry is the network's 400."""
    Select(drv.find_element(By.ID, "model")).select_by_value("tiny-llada-tasks")
    Select(drv.find_element(By.ID, "endpoint")).select_by_value("completion")
    fill(drv, "threshold", 5)
    runs = drv.execute_script("return window.llada.runs")
    drv.find_element(By.ID, "prompt").send_keys("sort:2 1=\n")
    wait_js(drv, f"window.llada.runs > {runs}", "the refusal")
    fill(drv, "threshold", "")
    assert drv.execute_script("return window.llada.status") == "error"
    alert = drv.find_elements(By.CSS_SELECTOR, ".msg.error[role=alert]")[-1].text
    assert "400" in alert and "threshold" in alert, alert
    logs = problems(drv)
    assert len(logs) == 1 and logs[0]["source"] == "network" and "400" in logs[0]["message"] \
        and "/v1/completions" in logs[0]["message"], logs
    print(f"  refused request shown: {alert.splitlines()[-1]!r}")


def check_chat(drv):
    q, n = "Name a colour.", 12
    want = generate(q, "-t", "0", "-n", str(n))
    Select(drv.find_element(By.ID, "model")).select_by_value("smollm2")
    Select(drv.find_element(By.ID, "endpoint")).select_by_value("chat")
    fill(drv, "max_tokens", n)
    fill(drv, "temperature", 0)
    drv.find_element(By.ID, "clear").click()
    st = send(drv, q)
    assert st["reply"] == want, (st["reply"], want)
    bubble = drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .text")[-1].text
    assert bubble == want.strip(), (bubble, want)
    assert st["kind"] == "autoregressive" and st["frames"] == [], st["kind"]
    assert not drv.find_element(By.ID, "diffusion").is_displayed()
    assert "completion " in drv.find_element(By.ID, "usage").text
    print(f"  chat smollm2: {q!r} -> {want!r}")


def check_speculative(drv, base):
    """A server drafting with prompt lookup: usage's accepted of drafted tokens on the page."""
    p, n = "a b c d e f g h a b c d e f g h a b c", 16
    want = generate(p, "--raw", "-t", "0", "-n", str(n))
    drv.get(base + "/")
    wait_js(drv, "document.getElementById('model').options.length == 1", "the model list")
    Select(drv.find_element(By.ID, "endpoint")).select_by_value("completion")
    fill(drv, "max_tokens", n)
    fill(drv, "temperature", 0)
    st = send(drv, p)
    assert st["reply"] == want, (st["reply"], want)
    u = st["usage"]
    assert u["drafted_tokens"] > 0 and 0 < u["accepted_tokens"] <= u["drafted_tokens"], u
    label = drv.find_element(By.ID, "spec-label").text
    assert label.startswith(f"Speculative: accepted {u['accepted_tokens']} of "
                            f"{u['drafted_tokens']} drafted"), label
    print(f"  speculative smollm2 (ngram): {label}, {u['forward_passes']} verify passes")


def main():
    t0 = time.time()
    browser_paths()  # a clear message before anything starts
    want_models = ["tiny-llada-tasks", "smollm2"]
    server, base = start_server("-m", "tiny-llada-tasks", "-m", "smollm2", "--api-key", KEY)
    drv = spec = None
    try:
        drv = start_browser()
        drv.set_page_load_timeout(TIMEOUT)
        drv.get(base + "/")
        assert drv.title == "llada playground", drv.title
        # Without the key the model list is refused, and the page says why.
        wait_js(drv, "document.getElementById('status').textContent.includes('API key')",
                "the page to ask for the API key")
        early = problems(drv)
        assert all(e["source"] == "network" and "/v1/models" in e["message"]
                   and "401" in e["message"] for e in early), early
        fill(drv, "apikey", KEY)
        wait_js(drv, "document.getElementById('model').options.length == 2", "the model list")
        models = [o.get_attribute("value") for o in
                  Select(drv.find_element(By.ID, "model")).options]
        assert models == want_models, models
        frames, _ = check_diffusion(drv, "sort:3 1 4 9 2=", 16, 8, "vanilla")
        if os.environ.get("LLADA_BROWSER_SCREENSHOT"):
            drv.save_screenshot(os.environ["LLADA_BROWSER_SCREENSHOT"])
        # A prompt on which the revision strategy changes committed tokens.
        n, revised = check_diffusion(drv, "add:123+456=", 32, 8, "revision", 0.9)
        assert revised > 0, "no revision to flash"
        frames += n
        check_scrub(drv)
        check_stop(drv)
        check_chat(drv)
        late = problems(drv)
        assert not late, f"console errors or warnings: {late}"
        check_error(drv)
        stop_server(server)
        spec, spec_base = start_server("-m", "smollm2", "--draft", "ngram")
        check_speculative(drv, spec_base)
        late = problems(drv)
        assert not late, f"console errors or warnings: {late}"
        print(f"browser test: all checks passed ({frames} canvas frames, "
              f"{time.time() - t0:.1f} s)")
    finally:
        if drv is not None:
            drv.quit()
        for s in (server, spec):
            if s is not None and s.poll() is None:
                stop_server(s)


if __name__ == "__main__":
    main()
