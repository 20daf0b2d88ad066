"""The site (mkdocs.yml): it builds with no warning, and reads well in a real browser (issue #49).

Default lane, in small: mkdocs.yml's `validation` settings with `--strict` make a missing figure
or a link to a page that does not exist fail the build (a one-page site in tmp_path, built three
times: whole, without its figure, with a broken link).

Slow lane, in full: `mkdocs build --strict` of the real site (docs/, the lessons, the API), then
tools/site_check.py in headless Chromium (Debian's chromium and chromium-driver): every lesson
page loads with its heading, its figure decoded and its code highlighted; the search box finds
lesson 01; every internal link and image of every page answers 200 and every #fragment exists;
the two screenshots are written (into tmp_path here; `python tools/site_check.py --screenshots
docs/images` refreshes the committed ones).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURE = ROOT / "tutorials/figures/01_model_and_kv_cache.png"


def _build_one_page_site(tmp_path: Path, page: str, figure: bool):
    """Build a one-page site with the repository's validation settings; the Abort or None."""
    import yaml
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    validation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["validation"]
    docs = tmp_path / "docs"
    (docs / "figures").mkdir(parents=True, exist_ok=True)
    (docs / "index.md").write_text(page)
    (docs / "figures/fig.png").unlink(missing_ok=True)
    if figure:
        (docs / "figures/fig.png").write_bytes(FIGURE.read_bytes())
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        yaml.safe_dump({"site_name": "t", "docs_dir": "docs", "validation": validation})
    )
    cfg = load_config(str(config), strict=True, site_dir=str(tmp_path / "site"))
    try:
        build(cfg)
    except Abort as e:
        return e
    return None


def test_a_missing_figure_or_a_broken_link_fails_the_build(tmp_path, caplog):
    page = "# A page\n\n![the figure](figures/fig.png)\n"
    assert _build_one_page_site(tmp_path, page, figure=True) is None  # whole: it builds
    assert _build_one_page_site(tmp_path, page, figure=False) is not None
    assert "figures/fig.png" in caplog.text
    caplog.clear()
    broken = page + "\nSee [the design](design.md) and [its part](#no-such-heading).\n"
    assert _build_one_page_site(tmp_path, broken, figure=True) is not None
    assert "design.md" in caplog.text and "no-such-heading" in caplog.text


@pytest.mark.slow
def test_the_site_builds_without_a_warning_and_reads_well_in_chromium(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its future
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    lessons = sorted(ROOT.glob("tutorials/[0-9][0-9]_*.py"))
    for lesson in lessons:  # each lesson: its page, its notebook and its source, published
        for published in (f"{lesson.stem}/index.html", f"{lesson.stem}.ipynb", lesson.name):
            assert (site / "tutorials" / published).is_file(), published
    spec = importlib.util.spec_from_file_location("site_check", ROOT / "tools/site_check.py")
    site_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site_check)
    shots = tmp_path / "shots"
    assert site_check.check_site(site, shots) == []
    for name in ("site_home.png", "site_lesson.png"):
        data = (shots / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 50_000, name
    # The checks can fail: the same site with lesson 01's figure gone.
    (site / "tutorials/figures" / FIGURE.name).unlink()
    with site_check.serve(site) as base, site_check.chromium() as driver:
        found = site_check.check_lesson(driver, f"{base}tutorials/{lessons[0].stem}/", "01")
        _, broken = site_check.check_links(site, base)
    assert len(found) == 1 and "figures not shown" in found[0], found
    assert broken and all(FIGURE.name in b and "HTTP 404" in b for b in broken), broken
