"""Screenshots of a run's TensorBoard dashboards, for docs/usage.md: ``python tools/screenshots.py <run>``.

Starts the installed TensorBoard on a free port of 127.0.0.1 over ``<run>/tensorboard`` (the run
directory train.py wrote), and has headless Chromium (Debian: ``apt-get install chromium``) capture
the Scalars, Images and Custom Scalars dashboards into ``docs/tensorboard_<dashboard>.png``. TensorBoard
is a single-page app that draws after the page has loaded: Chromium is given 15 s of virtual time to
fetch the data and render the charts before it takes the picture. Screenshots are stored with a
256-colour palette (flat UI colours survive it) to stay small.

    python train.py '~experiment' data=ring reg=r1 data.batch_size=512 trainer.max_steps=1500 \
        hydra.run.dir=outputs/ring_1500
    python tools/screenshots.py outputs/ring_1500
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

from PIL import Image

from tools.tensorboard_server import tensorboard_server

DOCS = Path(__file__).resolve().parent
# dashboard -> the URL fragment that opens it (and, for scalars and images, the tag filter it shows)
DASHBOARDS = {
    "scalars": "#scalars&" + urllib.parse.urlencode({"tagFilter": "^(loss/|d/(real|fake)$)"}),
    "images": "#images&" + urllib.parse.urlencode({"tagFilter": "^samples/"}),
    "custom_scalars": "#custom_scalars",
}
WINDOW = "1280,900"
VIRTUAL_TIME_MS = 15_000


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("error: no Chromium found: apt-get install chromium")


def screenshot(browser: str, url: str, path: Path) -> None:
    """``url`` as headless Chromium renders it, saved as a palette PNG at ``path``."""
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing cached from an earlier run
        subprocess.run([browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                        # Chromium's sandbox refuses to start as root, as in a container.
                        "--no-sandbox", f"--user-data-dir={profile}", f"--window-size={WINDOW}",
                        f"--virtual-time-budget={VIRTUAL_TIME_MS}", f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=180)
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(256)
    small.save(path, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory written by train.py")
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go (default: docs/)")
    args = parser.parse_args()
    if not (args.run / "tensorboard").is_dir():
        sys.exit(f"error: {args.run} has no tensorboard/ directory: give a run directory train.py wrote")
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tensorboard_server(args.run / "tensorboard") as url:
        for name, fragment in DASHBOARDS.items():
            path = args.out / f"tensorboard_{name}.png"
            screenshot(browser, f"{url}/{fragment}", path)
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
