"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, its CLI reference is each
command's ``--help``, its Python reference documents the public names, and it renders in a real browser."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (make's environment installs it)")

ROOT = Path(__file__).resolve().parents[1]
SCREEN = (1280, 900)
# Material's default primary colour (indigo), the header bar's.
MATERIAL_HEADER_RGB = (0x40, 0x51, 0xB5)
PUBLIC_NAMES = ("yolotrain.YOLO", "yolotrain.train", "yolotrain.val", "yolotrain.predict",
                "yolotrain.interop.exporting.exporter.export", "yolotrain.load", "yolotrain.Yolov5",
                "yolotrain.YOLO_LOSS", "yolotrain.get_loaders", "yolotrain.doctor.watch")


def quiet_environment() -> dict[str, str]:
    """The build's environment: this checkout's sources first, without MkDocs' successor banners."""
    sources = [str(ROOT / "src"), str(ROOT / "packages" / "inplace-doctor" / "src")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*sources, os.environ.get("PYTHONPATH", "")]),
            "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly (any warning fails) into a temporary folder; the checkout is left as it was."""
    site_dir = tmp_path_factory.mktemp("site")
    checkout_before = sorted(path.name for path in ROOT.iterdir())
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(ROOT / "mkdocs.yml"), "--site-dir", str(site_dir)],
                           cwd=ROOT, env=quiet_environment(), capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    assert sorted(path.name for path in ROOT.iterdir()) == checkout_before
    return site_dir


def page_text(page: Path) -> str:
    """A built page's text as a reader sees it (tags removed, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_every_page_of_the_nav_is_built(site):
    for page in ("index.html", "getting-started/index.html", "tasks/detect/index.html", "tasks/segment/index.html",
                 "tasks/classify/index.html", "commands/train/index.html", "commands/doctor/index.html",
                 "cli/index.html", "doctor/index.html", "python/index.html", "int8/index.html",
                 "deployment/index.html", "coming-from-yolov5/index.html", "coming-from-ultralytics/index.html",
                 "reliability/index.html", "security/index.html", "performance/index.html",
                 "ARCHITECTURE/index.html", "reference/cli/index.html", "reference/python/index.html"):
        assert (site / page).is_file(), page
    # RELIABILITY.md is included whole, not linked.
    assert "Reliability: faults tried and what happened" in page_text(site / "reliability/index.html")


def test_the_cli_reference_is_each_commands_help(site, monkeypatch):
    from inplace_doctor.cli import _parser as doctor_parser

    from yolotrain.cli import build_parser

    monkeypatch.setenv("COLUMNS", "100")  # the width the reference is rendered at
    reference = page_text(site / "reference/cli/index.html")
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"train", "val", "predict", "track", "export", "tune", "data", "info", "doctor"} <= set(commands)
    parsers = {name: doctor_parser("yolotrain doctor") if name == "doctor" else parser
               for name, parser in commands.items()}
    parsers["data check"] = commands["data"]._subparsers._group_actions[0].choices["check"]
    for name, parser in parsers.items():
        assert parser.format_help().rstrip() in reference, name


def test_the_python_reference_documents_the_public_names(site):
    reference = (site / "reference/python/index.html").read_text()
    for name in PUBLIC_NAMES:
        assert f'id="{name}"' in reference, name
    text = page_text(site / "reference/python/index.html")
    assert "Train and val loaders of a YOLO-layout folder or dataset YAML" in text  # get_loaders' docstring


def browser() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def screenshot(page: Path, out: Path) -> Path:
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--screenshot={out}", f"--window-size={SCREEN[0]},{SCREEN[1]}", page.as_uri()]
    shot = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert shot.returncode == 0 and out.is_file(), shot.stderr
    return out


@pytest.mark.skipif(browser() is None, reason="no chromium binary (the CI set-up, .ci/run, installs Debian's)")
@pytest.mark.parametrize("page", ["index.html", "tasks/detect/index.html"])
def test_the_site_renders_in_a_browser(site, tmp_path, page):
    from PIL import Image

    png = screenshot(site / page, tmp_path / "page.png")
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == SCREEN  # IHDR: width, height
    picture = Image.open(png).convert("RGB")
    # The Material header bar across the top, and a page that is not blank: text in many shades.
    top_row = [picture.getpixel((x, 10)) for x in range(0, SCREEN[0], 16)]
    assert sum(near(pixel, MATERIAL_HEADER_RGB) for pixel in top_row) > 0.9 * len(top_row), top_row[:5]
    body = picture.crop((0, 100, SCREEN[0], SCREEN[1]))
    assert len(body.getcolors(maxcolors=1 << 20)) > 100


def near(pixel: tuple[int, int, int], colour: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, colour))
