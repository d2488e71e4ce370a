"""The chat page at / (ADR 0032), in a real headless browser: Debian's chromium and chromium-driver,
driven by selenium (nothing downloads a browser or a driver; scripts/install_browser.sh installs
both, and .ci/run runs it). A missing browser fails these tests: they never skip.

`server` runs the ~74% MTP fixture, so the speculation view has accepted drafts, corrections and
a known acceptance to show; `slow` runs SmolLM2 on one thread (~75 tokens/s), so that a long
answer is still running when a test stops it. Screenshots go to build/test-artifacts/.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
def slow(smol_path: str, logs: Path) -> Iterator[Server]:
    s = start_server(smol_path, "--metrics", "-np", "2", "-t", "1", "--method", "none", log_dir=logs)
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
    wait_for("the model line", lambda: "sequences" in d.find_element(By.ID, "model").text)
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


def stream_origins(server: Server, messages: list[dict[str, str]], **kw: Any) -> tuple[list[str], list[int]]:
    """The token_origin and token_drafted lists of a streamed chat request."""
    origins: list[str] = []
    drafted: list[int] = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60, json={
            "messages": messages, "stream": True, "return_token_origin": True, **kw}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                origins += chunk.get("token_origin", [])
                drafted += chunk.get("token_drafted", [])
    return origins, drafted


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
    for raw in ("/webui/../config.py", "/webui/%2e%2e/webui.py", "/webui/app.js/x"):  # sent as they are
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", raw)
        assert conn.getresponse().status == 404, raw
        conn.close()


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
    assert browser.find_element(By.ID, "spec-server").text == "server's (length 3)"
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
    # the same request streamed: acceptance per draft position from its token_origin / token_drafted
    origins, drafted = stream_origins(server, [{"role": "user", "content": "Count with me"}], **body)
    proposed, accepted, run = [0] * 4, [0] * 4, 0
    for o, n in zip(origins, drafted):
        if o == "draft":
            run += 1
        elif o == "target":
            for i in range(1, n + 1):
                proposed[i] += 1
                accepted[i] += i <= run
            run = 0
    want = [f"{i}: {round(accepted[i] / proposed[i] * 100)}%" for i in (1, 2, 3)]
    titles = [e.get_attribute("textContent")
              for e in browser.find_elements(By.CSS_SELECTOR, "#chart-pos title")]
    assert titles == want
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


def idle(server: Server) -> bool:
    return not any(s["is_processing"] for s in httpx.get(server.url + "/slots").json())


def start_long_answer(d: webdriver.Chrome, text: str) -> None:
    """Send a message whose answer would take ~25 s (1900 tokens at ~75/s); return at its first token."""
    set_field(d, "max_tokens", "1900")
    set_field(d, "extra", json.dumps({"ignore_eos": True}))
    d.find_element(By.ID, "prompt").send_keys(text)
    d.find_element(By.ID, "send").click()
    wait_for("the first tokens", lambda: len(d.find_elements(By.CSS_SELECTOR, "#log li.streaming .tok")) > 0)


def test_stop_cancels_the_request(browser: webdriver.Chrome, slow: Server) -> None:
    open_page(browser, slow)
    assert browser.find_element(By.ID, "spec-server").text == "server's (none)"
    start_long_answer(browser, "Go on and on")
    browser.find_element(By.ID, "stop").click()
    wait_for("stopped", lambda: figure(browser, "status") == "stopped", timeout=5)
    # the server's sequence is free at once, ~25 s before the answer would have ended
    wait_for("every sequence free", lambda: idle(slow), timeout=2)
    assert 0 < int(figure(browser, "f-tokens")) < 1900
    # the conversation goes on after a stopped answer (which it keeps, as far as it came)
    set_field(browser, "max_tokens", "8")
    set_field(browser, "extra", "")
    ask(browser, "Shorter")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")) == 2
    # Esc stops too
    start_long_answer(browser, "Once more")
    browser.find_element(By.ID, "prompt").send_keys(Keys.ESCAPE)
    wait_for("stopped", lambda: figure(browser, "status") == "stopped", timeout=5)
    wait_for("every sequence free", lambda: idle(slow), timeout=2)
    assert console_errors(browser) == []


def test_new_chat_while_streaming(browser: webdriver.Chrome, slow: Server) -> None:
    open_page(browser, slow)
    start_long_answer(browser, "Tell me everything")
    browser.find_element(By.ID, "clear").click()
    wait_for("every sequence free", lambda: idle(slow), timeout=2)
    assert browser.find_elements(By.CSS_SELECTOR, "#log li, #turns tbody tr") == []
    # the new conversation holds nothing of the old one: its answer is the API's to this message alone
    set_field(browser, "max_tokens", "12")
    set_field(browser, "temperature", "0")
    set_field(browser, "extra", "")
    answer = ask(browser, "Name a colour.")
    want = api_chat(slow, [{"role": "user", "content": "Name a colour."}], temperature=0, max_tokens=12)
    assert answer == want["choices"][0]["message"]["content"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")) == 1


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
    set_field(browser, "extra", json.dumps({"stream": False}))  # the page's own fields are its own
    browser.find_element(By.ID, "send").click()
    assert "sets stream itself" in wait_for("the settings error", lambda: figure(browser, "settings-error"))
    # a request the server refuses (400): its message is shown, the question is back in the box
    set_field(browser, "extra", json.dumps({"grammar": "root ::= oops"}))
    browser.find_element(By.ID, "send").click()
    wait_for("the error", lambda: figure(browser, "status") == "error")
    assert "error:" in last_answer(browser)
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Hi"
    set_field(browser, "extra", "")
    set_field(browser, "max_tokens", "8")
    browser.find_element(By.ID, "send").click()
    wait_for("the answer", lambda: figure(browser, "status") == "done")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns tbody tr")) == 2


def metric(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def test_dashboard_under_load(browser: webdriver.Chrome, slow: Server, server: Server) -> None:
    open_page(browser, slow)
    requests = int(metric(slow, "llamaspec:requests_total"))
    tab = browser.find_element(By.ID, "tab-chat")
    tab.send_keys(Keys.ARROW_RIGHT)  # the tabs follow the arrow keys
    assert browser.find_element(By.ID, "view-chat").get_attribute("hidden") is not None
    assert browser.switch_to.active_element.get_attribute("id") == "tab-dash"
    wait_for("the dashboard", lambda: figure(browser, "d-requests") == str(requests))
    assert figure(browser, "d-slots") == "0 / 2"
    assert figure(browser, "d-acceptance") == "–"  # plain decoding: no drafts
    # a client elsewhere: the dashboard shows its sequence busy and the tokens it generates
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(api_chat, slow, [{"role": "user", "content": "Go"}], max_tokens=250,
                          ignore_eos=True)
        wait_for("a busy sequence", lambda: figure(browser, "d-slots") == "1 / 2")
        wait_for("a rate", lambda: float(figure(browser, "d-rate").replace("–", "0")) > 5)
        shot(browser, "dashboard")
        job.result()
    wait_for("the request counted", lambda: figure(browser, "d-requests") == str(requests + 1))
    assert figure(browser, "d-tokens") == str(int(metric(slow, "llamacpp:tokens_predicted_total")))
    browser.find_element(By.ID, "tab-dash").send_keys(Keys.ARROW_LEFT)
    assert browser.find_element(By.ID, "view-chat").get_attribute("hidden") is None
    assert console_errors(browser) == []
    # a speculative server's dashboard: its acceptance since start
    open_page(browser, server)
    browser.find_element(By.ID, "tab-dash").click()
    accepted = metric(server, "llamacpp:spec_decode_num_accepted_tokens_total")
    proposed = metric(server, "llamacpp:spec_decode_num_draft_tokens_total")
    assert proposed > 0
    want = f"{round(accepted / proposed * 100)}%"
    wait_for("the acceptance", lambda: figure(browser, "d-acceptance") == want)


def test_themes_and_a_narrow_screen(browser: webdriver.Chrome, server: Server) -> None:
    def background() -> str:
        return str(browser.execute_script("return getComputedStyle(document.body).backgroundColor"))

    try:
        for scheme in ("light", "dark"):  # the system's choice
            browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
                "features": [{"name": "prefers-color-scheme", "value": scheme}]})
            open_page(browser, server)
            dark = background() == "rgb(23, 24, 26)"
            assert dark == (scheme == "dark")
            assert browser.find_element(By.ID, "theme").get_attribute("aria-pressed") == str(dark).lower()
            browser.find_element(By.ID, "theme").click()  # the button overrides it
            assert (background() == "rgb(23, 24, 26)") != dark
            shot(browser, f"theme-{scheme}-toggled")
            browser.find_element(By.ID, "theme").click()
            browser.execute_script("localStorage.clear()")
        # a 320 px wide phone: nothing wider than the screen, the chat and the view one above the other
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": 320, "height": 700, "deviceScaleFactor": 1, "mobile": True})
        open_page(browser, server)
        assert browser.execute_script("return window.innerWidth") == 320
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 320
        set_field(browser, "max_tokens", "30")
        ask(browser, "Hello")
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 320
        shot(browser, "320px")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
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
