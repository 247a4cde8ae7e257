"""The chat page (GET /) in headless Chromium, driven over the DevTools protocol: the page loads
under its Content-Security-Policy without script errors, a typed message streams a reply into the
assistant bubble with a tokens/s line, and with --api-key-file the page shows the 401 as an error
until the key is typed into its key field.

Needs Chromium (Debian package chromium) and websocket-client (pip); skips without them. Set
KIRI_PAGE_SCREENSHOT=FILE to keep a screenshot of the finished conversation.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import request

websocket = pytest.importorskip("websocket")

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
KEY = "page-test-key-8c1d2e3f"


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium to drive the chat page (apt-get install chromium)")


class Browser:
    """A headless Chromium and a DevTools session on its one page."""

    def __init__(self, binary, profile):
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             "--remote-debugging-port=0", "--user-data-dir=%s" % profile, "--window-size=1000,800",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            assert self.proc.poll() is None, "chromium exited with %s" % self.proc.returncode
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        pages = []
        while not pages:
            targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10))
            pages = [t for t in targets if t["type"] == "page"]
            assert pages or time.monotonic() < deadline
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]
            self.events.append(msg)

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait_for(self, expression, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            v = self.js(expression)
            if v:
                return v
            assert time.monotonic() < deadline, "timed out waiting for: " + expression
            time.sleep(0.05)

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.ws.close()
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def browser(tmp_path):
    b = Browser(find_browser(), tmp_path / "profile")
    yield b
    b.close()


MESSAGES = "JSON.stringify([...document.querySelectorAll('#log .msg')].map(d => [d.className, d.textContent]))"
STATS = re.compile(r"(\d+) tokens, ([\d.]+) tokens/s, first token after (\d+) ms$")


def send_message(b, text, max_tokens, temperature):
    b.js("document.getElementById('max').value = '%d'; document.getElementById('temp').value = '%s';"
         "document.getElementById('input').value = %s; document.getElementById('send').click(); true"
         % (max_tokens, temperature, json.dumps(text)))


def wait_reply(b, n_messages):
    """Waits until the log holds n_messages bubbles, the last one finished (its stats line has
    'first token after'), or an error bubble; returns the bubbles."""
    b.wait_for("(() => { const m = document.querySelectorAll('#log .msg');"
               " return m.length >= %d && (/first token after/.test(m[m.length-1].textContent) ||"
               " m[m.length-1].classList.contains('error')) && !document.getElementById('send').disabled; })()"
               % n_messages)
    return json.loads(b.js(MESSAGES))


def test_chat_page_streams_a_reply(browser, start_server, tmp_path):
    srv = start_server(["--api-key-file", str(_keyfile(tmp_path)), "--parallel", "2"])
    b = browser
    b.call("Runtime.enable")
    b.call("Log.enable")
    b.call("Page.enable")
    b.call("Page.navigate", url=srv.url + "/")
    b.wait_for("document.readyState === 'complete' && !!document.getElementById('send')")
    assert b.js("document.title") == "kiri"

    # Without the key: the 401 is shown as an error bubble, and the message is not kept.
    send_message(b, "Hello there", 16, 0)
    bubbles = wait_reply(b, 2)
    assert bubbles[-1][0] == "msg error" and "API key" in bubbles[-1][1], bubbles

    # With the key typed in: the reply streams in and ends with the statistics line.
    b.js("const k = document.getElementById('key'); k.value = %s;"
         "k.dispatchEvent(new Event('change')); true" % json.dumps(KEY))
    send_message(b, "Tell me a story about a cat.", 24, 0)
    bubbles = wait_reply(b, 4)
    (ucls, utext), (acls, atext) = bubbles[-2], bubbles[-1]
    assert ucls == "msg user" and utext == "Tell me a story about a cat."
    assert acls == "msg assistant", bubbles
    stats = b.js("document.querySelector('#log .msg.assistant .stats').textContent")
    m = STATS.search(stats)
    assert m, stats
    reply = atext[: -len(stats)]
    # The same request through the API, greedy: the page shows exactly that text and token count.
    r = request(srv.port, "POST", "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "Tell me a story about a cat."}], "max_tokens": 24,
                 "temperature": 0}, headers={"Authorization": "Bearer " + KEY})
    assert r.status == 200, r
    assert reply == r.json["choices"][0]["message"]["content"] and reply
    assert int(m.group(1)) == r.json["usage"]["completion_tokens"]
    assert float(m.group(2)) > 0

    # A second turn carries the history: the request holds four messages now.
    send_message(b, "And then?", 8, 0)
    bubbles = wait_reply(b, 6)
    assert bubbles[-1][0] == "msg assistant" and "tokens/s" in bubbles[-1][1], bubbles

    # No script errors and no refused resources (a CSP violation would show here), beyond the
    # expected 401 and the browser's own /favicon.ico probe.
    problems = [e for e in b.events if e.get("method") == "Runtime.exceptionThrown" or
                (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error" and
                 not e["params"]["entry"].get("url", "").endswith("/favicon.ico") and
                 "status of 401" not in e["params"]["entry"].get("text", ""))]
    assert not problems, problems
    shot = os.environ.get("KIRI_PAGE_SCREENSHOT")
    if shot:
        data = b.call("Page.captureScreenshot", format="png")["data"]
        with open(shot, "wb") as f:
            f.write(base64.b64decode(data))


def _keyfile(tmp_path):
    p = tmp_path / "page-keys"
    p.write_text(KEY + "\n")
    return p
