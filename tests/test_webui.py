"""The chat page at / (ADR 0032), in a real headless browser: Debian's chromium and chromium-driver,
driven by selenium (nothing downloads a browser or a driver; scripts/install_browser.sh installs
both, and .ci/run runs it). A missing browser fails these tests: they never skip.

The server runs the ~74% MTP fixture, so the speculation view has accepted drafts, corrections and
a known acceptance to show. Screenshots go to build/test-artifacts/.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from llamaspec_fixtures import FixtureInfo
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from .server_util import Server, start_server

pytestmark = pytest.mark.fixture

ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "chromedriver"
# the grammar of an answer made of markup: it must show as these characters and run nothing
MARKUP = '<img src=x onerror="window.__xss=1"><b>bold</b>'


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """check()'s first truthy value, polled; fails the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("webui-logs")


@pytest.fixture(scope="module")
def server(fx_mtp_levels: dict[str, FixtureInfo], logs: Path) -> Iterator[Server]:
    # a fixed draft length: "auto" could step around drafting on a loaded machine, and this view is
    # about what drafting shows
    s = start_server(fx_mtp_levels["74"].path, "--metrics", "-np", "2", "-t", "1", "--n-draft", "3",
                     log_dir=logs)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `bash scripts/install_browser.sh` "
                    "(Debian's chromium and chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--disable-gpu", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def open_page(d: webdriver.Chrome, server: Server) -> None:
    """A fresh page, ready (the model line filled from /props), the settings open; the console log of
    the pages before is dropped."""
    d.get_log("browser")
    d.get(server.url + "/")
    wait_for("the model line", lambda: "mtp" in d.find_element(By.ID, "model").text)
    d.execute_script("document.getElementById('settings').open = true")


def set_field(d: webdriver.Chrome, field: str, value: str) -> None:
    d.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event('change'))", field, value)


def ask(d: webdriver.Chrome, text: str, done: str = "done") -> str:
    """Type a message, send it with Enter, wait for the status; the answer's text."""
    box = d.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    wait_for(f"status {done!r}", lambda: d.find_element(By.ID, "status").text in (done, "error"))
    assert d.find_element(By.ID, "status").text == done, last_answer(d)
    return last_answer(d)


def last_answer(d: webdriver.Chrome) -> str:
    return str(d.execute_script(
        "const a = document.querySelectorAll('#log li.assistant .text'); return a[a.length - 1].textContent"))


def figure(d: webdriver.Chrome, name: str) -> str:
    return str(d.find_element(By.ID, name).text)


def console_errors(d: webdriver.Chrome) -> list[dict[str, Any]]:
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def shot(d: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"webui-{name}.png"
    assert d.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


def urls(text: str) -> set[str]:
    """The absolute URLs in a page or asset (SVG's namespace name is a name, not a fetch)."""
    return set(re.findall(r"\w+://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}


def api_chat(server: Server, messages: list[dict[str, str]], **kw: Any) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={"messages": messages, **kw})
    assert r.status_code == 200, r.text
    return dict(r.json())


# -- the page over HTTP ---------------------------------------------------------------------------


def test_page_and_assets_are_served_with_a_strict_policy(server: Server) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        r = httpx.get(f"{server.url}/webui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert urls(r.text) == set()  # nothing from elsewhere
    assert urls(page.text) == set()
    assert sum(len(httpx.get(f"{server.url}/webui/{n}").text.splitlines())
               for n in ("index.html", "app.js", "app.css")) <= 1500
    assert httpx.get(server.url + "/webui/nothing.js").status_code == 404
    assert httpx.get(server.url + "/webui/../config.py").status_code == 404


def test_no_webui_and_api_key(fx_mtp_levels: dict[str, FixtureInfo], logs: Path) -> None:
    off = start_server(fx_mtp_levels["74"].path, "--no-webui", log_dir=logs)
    try:
        assert httpx.get(off.url + "/").status_code == 404
        assert httpx.get(off.url + "/webui/app.js").status_code == 404
    finally:
        off.stop()
    keyed = start_server(fx_mtp_levels["74"].path, "--api-key", "sesame", log_dir=logs)
    try:  # the page is public, the API behind it is not
        assert httpx.get(keyed.url + "/").status_code == 200
        assert httpx.get(keyed.url + "/webui/app.js").status_code == 200
        assert httpx.get(keyed.url + "/props").status_code == 401
        assert httpx.get(keyed.url + "/webui/nothing.js").status_code == 401  # not an asset: not public
    finally:
        keyed.stop()


# -- in the browser -------------------------------------------------------------------------------


def test_page_loads_without_console_errors(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    assert "mtp-74.gguf" in figure(browser, "model") and "2 sequences" in figure(browser, "model")
    assert console_errors(browser) == []
    shot(browser, "loaded")


def test_streamed_answers_equal_the_api_greedy_answers(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    set_field(browser, "temperature", "0")
    set_field(browser, "max_tokens", "40")
    set_field(browser, "system", "Be brief.")
    first = ask(browser, "Hello there")
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    want = api_chat(server, history, temperature=0, max_tokens=40)["choices"][0]["message"]["content"]
    assert first == want and len(first) > 10
    # the second turn sends the whole conversation through the messages path
    second = ask(browser, "And again")
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And again"}]
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    want2 = c.chat.completions.create(model="x", messages=history, temperature=0,  # type: ignore[arg-type]
                                      max_tokens=40).choices[0].message.content
    assert second == want2
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")) == 2
    # the second turn found the first in its sequence's cache
    assert int(browser.find_element(By.CSS_SELECTOR, "#turns tbody tr:last-child td:last-child").text) > 0
    assert console_errors(browser) == []


def test_speculation_view_fills(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    set_field(browser, "temperature", "0")
    set_field(browser, "max_tokens", "120")
    ask(browser, "Count with me")
    body = {"temperature": 0, "max_tokens": 120}
    t = api_chat(server, [{"role": "user", "content": "Count with me"}], **body)["timings"]
    # the same greedy request over the API: the page shows its figures
    assert figure(browser, "f-tokens") == "120"
    assert int(figure(browser, "f-accepted")) == t["draft_n_accepted"] > 0
    assert figure(browser, "f-acceptance") == f"{round(t['draft_n_accepted'] / t['draft_n'] * 100)}%"
    assert 0.5 < t["draft_n_accepted"] / t["draft_n"] < 0.95  # the fixture's ~74%
    spans = {k: len(browser.find_elements(By.CSS_SELECTOR, f"#log li.assistant .o-{k}"))
             for k in ("draft", "target", "plain")}
    assert spans["draft"] > 0 and spans["target"] > 0
    # the charts: a histogram bar per accepted length 0..3, a bar per draft position 1..3, a time line
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-hist rect")) == 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-pos rect")) == 3
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-time path")) == 2
    shot(browser, "speculation")
    # per request: drafts of at most 1 token, then none
    set_field(browser, "spec-mode", "cap")
    set_field(browser, "n_max", "1")
    ask(browser, "Count with me")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-hist rect")) == 2  # accepted 0 or 1
    assert 0 < int(figure(browser, "f-accepted"))
    set_field(browser, "spec-mode", "off")
    ask(browser, "Count with me")
    assert figure(browser, "f-accepted") == "0" and figure(browser, "f-acceptance") == "–"
    last = browser.find_elements(By.CSS_SELECTOR, "#log li.assistant")[-1]
    assert {e.get_attribute("class") for e in last.find_elements(By.CSS_SELECTOR, ".tok")} == {"tok o-plain"}


def test_stop_cancels_the_request(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    set_field(browser, "max_tokens", "1900")
    set_field(browser, "extra", json.dumps({"ignore_eos": True}))
    browser.find_element(By.ID, "prompt").send_keys("Go on and on")
    browser.find_element(By.ID, "send").click()
    wait_for("the first tokens", lambda: int(figure(browser, "f-tokens")) > 0)
    browser.find_element(By.ID, "stop").click()
    wait_for("stopped", lambda: figure(browser, "status") == "stopped", timeout=5)

    def idle() -> bool:
        slots = httpx.get(server.url + "/slots").json()
        return not any(s["is_processing"] for s in slots)

    wait_for("every sequence free", idle, timeout=2)
    assert int(figure(browser, "f-tokens")) < 1900
    # the conversation goes on after a stopped answer (which it keeps, as far as it came)
    set_field(browser, "max_tokens", "8")
    set_field(browser, "extra", "")
    ask(browser, "Shorter")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")) == 2
    # Esc stops too
    set_field(browser, "max_tokens", "1900")
    set_field(browser, "extra", json.dumps({"ignore_eos": True}))
    browser.find_element(By.ID, "prompt").send_keys("Once more")
    browser.find_element(By.ID, "send").click()
    wait_for("the first tokens", lambda: figure(browser, "status") == "generating…"
             and len(browser.find_elements(By.CSS_SELECTOR, "#log li.streaming .tok")) > 0)
    browser.find_element(By.ID, "prompt").send_keys(Keys.ESCAPE)
    wait_for("stopped", lambda: figure(browser, "status") == "stopped", timeout=5)
    wait_for("every sequence free", idle, timeout=2)


def test_markup_in_an_answer_shows_as_text(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    grammar = "root ::= " + json.dumps(MARKUP)
    set_field(browser, "extra", json.dumps({"grammar": grammar}))
    answer = ask(browser, "Say something")
    assert answer == MARKUP
    assert browser.find_elements(By.CSS_SELECTOR, "#log img, #log b") == []
    assert browser.execute_script("return window.__xss") is None
    assert MARKUP in browser.find_element(By.ID, "log").text


def test_bad_settings_and_server_errors_are_shown(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    set_field(browser, "extra", "{not json")
    browser.find_element(By.ID, "prompt").send_keys("Hi" + Keys.ENTER)
    assert "More request fields" in wait_for("the settings error", lambda: figure(browser, "settings-error"))
    assert browser.find_elements(By.CSS_SELECTOR, "#log li") == []  # nothing was sent
    # a request the server refuses (400): its message is shown, the question can be asked again
    set_field(browser, "extra", json.dumps({"grammar": "root ::= oops"}))
    browser.find_element(By.ID, "send").click()
    wait_for("the error", lambda: figure(browser, "status") == "error")
    assert "error:" in last_answer(browser)


def test_dashboard_keyboard_and_themes(browser: webdriver.Chrome, server: Server) -> None:
    open_page(browser, server)
    done = httpx.get(server.url + "/metrics").text
    requests = next(int(float(line.split()[1])) for line in done.splitlines()
                    if line.startswith("llamaspec:requests_total "))
    tab = browser.find_element(By.ID, "tab-chat")
    tab.send_keys(Keys.ARROW_RIGHT)  # the tabs follow the arrow keys
    assert browser.find_element(By.ID, "view-chat").get_attribute("hidden") is not None
    assert browser.switch_to.active_element.get_attribute("id") == "tab-dash"
    wait_for("the dashboard", lambda: figure(browser, "d-requests") == str(requests))
    assert figure(browser, "d-slots") == "0 / 2"
    assert figure(browser, "d-acceptance").endswith("%")
    wait_for("a rate", lambda: figure(browser, "d-rate") not in ("", "–"))
    shot(browser, "dashboard")
    browser.find_element(By.ID, "tab-dash").send_keys(Keys.ARROW_LEFT)
    assert browser.find_element(By.ID, "view-chat").get_attribute("hidden") is None

    def background() -> str:
        return str(browser.execute_script("return getComputedStyle(document.body).backgroundColor"))

    before = background()
    browser.find_element(By.ID, "theme").click()
    assert background() != before
    shot(browser, "theme-toggled")
    browser.find_element(By.ID, "theme").click()
    assert background() == before
    # 320 px wide: nothing wider than the window
    browser.set_window_size(320, 700)
    try:
        width = browser.execute_script("return document.documentElement.scrollWidth")
        inner = browser.execute_script("return window.innerWidth")
        assert width <= inner
        shot(browser, "320px")
    finally:
        browser.set_window_size(1280, 900)
    assert console_errors(browser) == []


def test_the_page_asks_for_the_api_key(
    browser: webdriver.Chrome, fx_mtp_levels: dict[str, FixtureInfo], logs: Path
) -> None:
    keyed = start_server(fx_mtp_levels["74"].path, "--api-key", "sesame", log_dir=logs)
    try:
        browser.get(keyed.url + "/")
        dialog = browser.find_element(By.ID, "key-dialog")
        wait_for("the key dialog", lambda: dialog.get_attribute("open") is not None)
        browser.find_element(By.ID, "key-input").send_keys("wrong" + Keys.ENTER)
        wait_for("the refusal", lambda: "refused" in figure(browser, "key-error"))
        browser.find_element(By.ID, "key-input").send_keys("sesame" + Keys.ENTER)
        wait_for("the model line", lambda: "mtp" in figure(browser, "model"))
        set_field(browser, "max_tokens", "8")
        assert ask(browser, "Hello")
    finally:
        browser.execute_script("sessionStorage.clear()")
        keyed.stop()
