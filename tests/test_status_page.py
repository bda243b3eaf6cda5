"""The manager's live status page (issue 30, item 2), in a real headless browser.

A manager (in-process, ``serve_manager(..., http_port=0)``) over real worker processes
(the ``workers`` fixture); Chromium from the system (Debian's ``chromium``, installed
by scripts/system_deps.sh) driven by Playwright opens the page, which must show the
cluster's workers and, while a join runs (chunks pushed with pauses between them), its
numbers must follow what was pushed and produced. Set ``PANJOIN_SCREENSHOT=PATH`` to
keep a screenshot of the page during the join (the README's docs/status-page.png).
The token and HTTPS checks need no browser and no worker.
"""

import http.client
import json
import os
import shutil
import ssl
import time
import urllib.error
import urllib.request

import pytest
from test_security import pki  # noqa: F401 (the fixture: certificates and token files)

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.manager.service import serve_manager
from panjoin.security import Security, use

WINDOW, PRED = "time:400,400", "band:2"
#: seconds the page may take to show a change (it polls every second; a loaded machine)
SHOWN_S = 60_000  # ms, Playwright's unit


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed: pip install -e '.[test]'")
    path = _chromium()
    if path is None:
        pytest.skip("no Chromium found (apt-get install chromium, or scripts/system_deps.sh)")
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def manager(workers):
    server, port = serve_manager([w.address for w in workers], 0, http_port=0)
    yield server, port
    server.stop(None).wait()


def _text_is(page, selector: str, text: str) -> None:
    """Wait until the element's text is ``text`` (the page updates once a second)."""
    page.wait_for_function("([sel, want]) => document.querySelector(sel).textContent === want",
                           arg=[selector, text], timeout=SHOWN_S)


def test_the_page_shows_the_cluster_and_follows_a_join(browser, manager, workers):
    server, port = manager
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{server.http_port}/")
    for w in workers:  # the workers of the running cluster, by address
        page.wait_for_function("a => document.querySelector('#workers').textContent"
                               ".includes(a)", arg=w.address, timeout=SHOWN_S)
    _text_is(page, "#tuples-in", "0")
    _text_is(page, "#joins-open", "0 / 0")

    ev = generate(6000, "zipf", key_min=0, key_max=80, rate=1000, seed=3, disorder_ms=20)
    cuts = [0, 1000, 2000, 3500, 5000, 6000]
    pushed = pairs = 0
    with Client(f"127.0.0.1:{port}") as c:
        # small subwindows: each ring has several, round-robin over the workers
        jid = c.open(WINDOW, PRED, "bisort", batch_size=256, subwindow_size=64)
        sess = c.session(jid)
        try:
            _text_is(page, "#joins-open", "1 / 1")
            for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
                out = sess.send(i + 1, ev.slice(a, b), flush=True)
                pushed, pairs = b, pairs + len(out.r_id)
                # the numbers follow the join: each chunk's tuples and pairs show up
                _text_is(page, "#tuples-in", f"{pushed:,}")
                _text_is(page, "#pairs-out", f"{pairs:,}")
                time.sleep(1.5)  # a pause: the rate charts get points in between
            assert pairs > 0
            # the join's rings: its subwindows, on the cluster's workers
            page.wait_for_function("id => document.querySelector('#joins').textContent"
                                   ".includes(id)", arg=jid, timeout=SHOWN_S)
            rings = page.locator("table.ring tbody tr")
            assert rings.count() > 0
            held = page.locator("#joins").inner_text()
            assert all(w.address in held for w in workers), held
            assert page.locator("#chart-rates canvas").count() == 1  # uPlot drew
            if shot := os.environ.get("PANJOIN_SCREENSHOT"):
                page.screenshot(path=shot, full_page=True)
        finally:
            sess.close()
    _text_is(page, "#joins-open", "0 / 1")
    _text_is(page, "#tuples-in", f"{pushed:,}")  # a closed join still counts
    assert page.locator("#error").inner_text() == ""
    assert not errors, errors
    page.close()


def _get(url: str, headers=None, context=None) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def secured(pki):  # noqa: F811
    """This process's security settings: the manager's certificate and token."""
    old = use(Security(pki["cert"], pki["key"], pki["ca"], pki["token"]))
    yield
    use(old)


def test_the_data_wants_the_token_and_comes_over_https(secured, pki):  # noqa: F811
    # no worker is asked before a join opens, but the page shows this one unreachable
    server, _ = serve_manager(["127.0.0.1:1"], 0, http_port=0)
    try:
        tls = ssl.create_default_context(cafile=pki["ca"])
        base = f"https://127.0.0.1:{server.http_port}"
        with urllib.request.urlopen(base + "/", timeout=60, context=tls) as r:
            assert b"uPlot" in r.read()  # the page itself holds no data
        code, body = _get(base + "/api/status", context=tls)
        assert code == 401 and "token" in body["error"]
        code, _ = _get(base + "/api/status?token=guess", context=tls)
        assert code == 401
        token = open(pki["token"]).read().strip()
        code, body = _get(base + "/api/status?token=" + token, context=tls)
        assert code == 200
        assert [w["address"] for w in body["workers"]] == ["127.0.0.1:1"]
        assert not body["workers"][0]["reachable"]
        code, body = _get(base + "/api/status", {"Authorization": f"Bearer {token}"}, tls)
        assert code == 200 and body["totals"]["joins_open"] == 0
        with pytest.raises((OSError, http.client.HTTPException)):  # no plaintext beside
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/api/status",
                                   timeout=60)
    finally:
        server.stop(None).wait()
    with pytest.raises(OSError):  # stopped with the gRPC server
        urllib.request.urlopen(base + "/", timeout=10, context=tls)


def test_a_taken_port_is_refused_with_the_flag_to_change():
    server, _ = serve_manager(["127.0.0.1:1"], 0, http_port=0)
    try:
        with pytest.raises(ValueError, match="--http-port"):
            serve_manager(["127.0.0.1:1"], 0, http_port=server.http_port)
    finally:
        server.stop(None).wait()
