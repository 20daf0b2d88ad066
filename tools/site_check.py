"""Read the built site as a person would, in headless Chromium: `python tools/site_check.py`.

    mkdocs build --strict                                   # the site, into build/site
    python tools/site_check.py [--site build/site] [--screenshots docs/images]

Serves the site on 127.0.0.1 (an ephemeral port), opens it in Debian's Chromium through
Selenium and Debian's chromedriver (`apt-get install chromium chromium-driver`; both come from
the same package source, so their versions match, and nothing is downloaded at run time), and
checks what a reader would see:

- every lesson page loads, with its title, and shows its figure (the image decoded: its natural
  width is above 0), and its code blocks are highlighted (a keyword's colour differs from a
  name's, as the theme's stylesheet paints them);
- the search box finds lesson 01 from a query typed into it;
- every internal link of every page resolves: the target answers 200 over HTTP and, for a
  `#fragment`, the target page has that id.

With --screenshots DIR it writes the home page and lesson 01 (scrolled to its figure) as
site_home.png and site_lesson.png. Prints one line per check and exits 1 if one fails.
tests/test_site.py runs the same checks (slow lane).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html.parser
import http.server
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1440,900",
)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would drown the report
        pass


@contextlib.contextmanager
def serve(site: Path):
    """The site over HTTP on 127.0.0.1 (search and directory URLs need a server, not file://)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def chromium():
    """Headless Chromium with a fresh profile, driven by Selenium through chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            raise SystemExit(f"{path} is missing: apt-get install -y chromium chromium-driver")
    with tempfile.TemporaryDirectory(prefix="minirl-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()


def wait_for(driver, script: str, timeout: float = 20.0):
    """Poll a JavaScript expression until it is truthy; its value (or None on timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = driver.execute_script(f"return {script}")
        if value:
            return value
        time.sleep(0.2)
    return None


IMAGES = "[...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth])"
COLOURS = """(() => {
  const colour = sel => { const e = document.querySelector(sel);
                          return e ? getComputedStyle(e).color : null; };
  return [colour('.highlight code .k, .highlight code .kn'), colour('.highlight code .n')];
})()"""


def check_lesson(driver, url: str, number: str) -> list[str]:
    """What fails on one lesson page (an empty list: it reads as it should)."""
    driver.get(url)
    problems = []
    if not wait_for(driver, "document.readyState === 'complete'"):
        return [f"{url}: did not finish loading"]
    title = driver.execute_script("return document.querySelector('h1')?.textContent || ''")
    if not title.startswith(f"Lesson {number}"):
        problems.append(f"{url}: the heading is {title!r}")
    images = driver.execute_script(f"return {IMAGES}")
    figures = [(src, width) for src, width in images if "figures/" in src]
    if not figures or not all(width for _, width in figures):
        problems.append(f"{url}: figures not shown: {figures or 'none on the page'}")
    keyword, name = driver.execute_script(f"return {COLOURS}")
    if keyword is None or name is None or keyword == name:
        problems.append(f"{url}: code not highlighted (keyword {keyword}, name {name})")
    return problems


def check_search(driver, base: str) -> list[str]:
    """Type a query into the search box; lesson 01 must be among the results."""
    from selenium.webdriver.common.by import By

    driver.get(base)
    wait_for(driver, "document.readyState === 'complete'")
    driver.execute_script(
        "document.querySelector('label.md-search__icon, .md-header__button[for=__search]')?.click()"
    )
    box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("KV cache prefill decode")
    found = wait_for(
        driver,
        "[...document.querySelectorAll('.md-search-result__link')].map(a => a.href)"
        ".filter(h => h.includes('01_model_and_kv_cache')).length",
        timeout=30,
    )
    return [] if found else ["search: 'KV cache prefill decode' does not find lesson 01"]


class _Links(html.parser.HTMLParser):
    """The links (`a href`, `img src`) and the ids of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag == "img" and a.get("src"):
            self.links.append(a["src"])


def _parse(text: str) -> _Links:
    parser = _Links()
    parser.feed(text)
    return parser


def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read()
            kind = response.headers.get("Content-Type", "")
            return response.status, body.decode() if "html" in kind else ""
    except urllib.error.HTTPError as e:
        return e.code, ""


def check_links(site: Path, base: str) -> tuple[int, list[str]]:
    """Every internal link and image of every page: (links checked, what fails)."""
    pages = {
        base + p.relative_to(site).as_posix().removesuffix("index.html"): p.read_text()
        for p in sorted(site.rglob("*.html"))
    }
    fetched: dict[str, tuple[int, str]] = {}
    problems, checked = [], 0
    for page, text in pages.items():
        for link in _parse(text).links:
            url = urllib.parse.urljoin(page, link)
            target, _, fragment = url.partition("#")
            if not target.startswith(base):
                continue  # another site: not this check's business
            checked += 1
            if target not in fetched:
                fetched[target] = _fetch(target)
            status, body = fetched[target]
            if status != 200:
                problems.append(f"{page}: {link} -> HTTP {status}")
            elif fragment and body and fragment not in _parse(body).ids:
                problems.append(f"{page}: {link} -> no #{fragment} on that page")
    return checked, problems


def check_site(site: Path, screenshots: Path | None = None) -> list[str]:
    """Every check of this module on the built site in `site`; prints a line per check."""
    lessons = sorted(p.parent.name for p in (site / "tutorials").glob("[0-9][0-9]_*/index.html"))
    problems = [] if lessons else [f"no lesson pages in {site}/tutorials"]
    with serve(site) as base:
        checked, broken = check_links(site, base)
        print(f"internal links: {checked} checked, {len(broken)} broken")
        problems += broken
        with chromium() as driver:
            for lesson in lessons:
                found = check_lesson(driver, f"{base}tutorials/{lesson}/", lesson[:2])
                print(f"{lesson}: {'ok' if not found else '; '.join(found)}")
                problems += found
            found = check_search(driver, base)
            print(f"search: {'ok' if not found else found[0]}")
            problems += found
            if screenshots is not None:
                take_screenshots(driver, base, lessons[0], screenshots)
    return problems


def take_screenshots(driver, base: str, lesson: str, folder: Path) -> None:
    """The home page, and a lesson scrolled to its figure, as a reader first sees them."""
    folder.mkdir(parents=True, exist_ok=True)
    driver.get(base)
    wait_for(driver, "document.readyState === 'complete'")
    driver.save_screenshot(str(folder / "site_home.png"))
    driver.get(f"{base}tutorials/{lesson}/")
    wait_for(driver, "document.readyState === 'complete'")
    driver.execute_script(
        "const f = [...document.images].find(i => i.src.includes('figures/'));"
        "f.scrollIntoView({block: 'start'}); window.scrollBy(0, -150);"
    )
    time.sleep(0.5)  # the header settles after a scroll
    driver.save_screenshot(str(folder / "site_lesson.png"))
    print(f"wrote {folder / 'site_home.png'} and {folder / 'site_lesson.png'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=Path("build/site"))
    parser.add_argument("--screenshots", type=Path, help="write site_home.png, site_lesson.png")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"error: no site in {args.site}: run `mkdocs build --strict` first", file=sys.stderr)
        return 2
    problems = check_site(args.site, args.screenshots)
    for p in problems:
        print(f"FAILED {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
