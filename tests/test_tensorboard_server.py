"""The dashboards as a person sees them: the installed TensorBoard server, started on a short real run,
answers its HTTP data API with the run's curves, pictures, chart layout and hyperparameters.

The routes are those of the installed tensorboard package (2.21): ``/data/runs`` (core plugin) and
``/data/plugin/<name>/<route>`` of the scalars, images, custom_scalars and hparams plugins.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from PIL import Image

from gan.training.outputs import Samples
from tools.tensorboard_server import tensorboard_server

RUN = "."  # the log directory holds the run's event files itself
TENSORBOARD_ORANGE = (245, 124, 0)  # the header bar of TensorBoard's web app


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def fetch_json(url: str) -> Any:
    return json.loads(fetch(url))


def run_read(url: str) -> bool:
    """The run is listed and read to its last step (the server reads event files after it starts)."""
    if RUN not in fetch_json(f"{url}/data/runs") or "loss/g" not in fetch_json(
            f"{url}/data/plugin/scalars/tags").get(RUN, {}):
        return False
    query = urllib.parse.urlencode({"run": RUN, "tag": "loss/g"})
    return fetch_json(f"{url}/data/plugin/scalars/scalars?{query}")[-1][1] == 6  # [wall_time, step, value]


@pytest.fixture(scope="module")
def dashboard(digits_run: Path) -> Iterator[str]:
    """The installed TensorBoard over the session's digits run, on 127.0.0.1; its base URL. Readiness is
    polled for at most 60 s (startup and the first read of the event files, on a busy 2-core machine)."""
    with tensorboard_server(digits_run / "tensorboard", ready=run_read, timeout_s=60) as url:
        yield url


def test_the_run_is_listed(dashboard):
    assert fetch_json(f"{dashboard}/data/runs") == [RUN]


def test_scalars_are_served_at_generator_steps(dashboard):
    tags = fetch_json(f"{dashboard}/data/plugin/scalars/tags")[RUN]
    assert {"loss/d", "loss/g", "d/real", "d/fake", "time/step_ms"} <= set(tags)
    query = urllib.parse.urlencode({"run": RUN, "tag": "loss/g"})
    points = fetch_json(f"{dashboard}/data/plugin/scalars/scalars?{query}")  # [wall_time, step, value] each
    assert [step for _, step, _ in points] == [1, 2, 3, 4, 5, 6]


def test_sample_grids_are_served_as_png(dashboard):
    tags = fetch_json(f"{dashboard}/data/plugin/images/tags")[RUN]
    assert "samples/grid" in tags
    query = urllib.parse.urlencode({"run": RUN, "tag": "samples/grid"})
    grids = fetch_json(f"{dashboard}/data/plugin/images/images?{query}")
    assert [g["step"] for g in grids] == [3, 6]
    image = Image.open(io.BytesIO(fetch(f"{dashboard}/data/plugin/images/individualImage?{grids[-1]['query']}")))
    assert image.format == "PNG" and image.width >= 512


@pytest.mark.skipif(shutil.which("dot") is None,
                    reason="Graphviz's dot is not installed (apt-get install graphviz): runs log no graph")
def test_the_g_loss_graph_is_served_at_step_0(dashboard):
    assert Samples.GRAPH_TAG in fetch_json(f"{dashboard}/data/plugin/images/tags")[RUN]
    query = urllib.parse.urlencode({"run": RUN, "tag": Samples.GRAPH_TAG})
    assert [g["step"] for g in fetch_json(f"{dashboard}/data/plugin/images/images?{query}")] == [0]


def test_custom_scalars_layout_is_served(dashboard):
    layout = fetch_json(f"{dashboard}/data/plugin/custom_scalars/layout")
    charts = {c["title"]: c["multiline"]["tag"] for category in layout["category"] for c in category["chart"]}
    assert charts["losses"] == ["loss/d", "loss/g"]
    assert charts["D output on real and fake"][:2] == ["d/real", "d/fake"]
    assert "time/step_ms" in charts["step time by phase (ms)"]


def test_hparams_are_served(dashboard):
    # The hparams routes take a JSON request (a GetExperimentRequest; empty: the defaults) as ?request=.
    query = urllib.parse.urlencode({"request": "{}"})
    experiment = fetch_json(f"{dashboard}/data/plugin/hparams/experiment?{query}")
    hparams = {h["name"] for h in experiment["hparamInfos"]}
    assert {"loss/name", "data/batch_size", "model/name"} <= hparams
    assert {"loss/d", "loss/g"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}


def test_the_server_stops_when_its_block_ends(digits_run):
    with tensorboard_server(digits_run / "tensorboard") as url:
        assert fetch_json(f"{url}/data/runs") == [RUN]
    with pytest.raises(urllib.error.URLError):  # connection refused: nothing listens on the port any more
        fetch(f"{url}/data/runs")


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Chromium is not installed (apt-get install chromium): tools/screenshots.py cannot run")
def test_the_screenshot_script_captures_a_rendered_dashboard(digits_run, tmp_path):
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "docs" / "screenshots.py")
    screenshots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screenshots)
    path = tmp_path / "scalars.png"
    with tensorboard_server(digits_run / "tensorboard", ready=run_read) as url:
        screenshots.screenshot(screenshots.chromium(), f"{url}/{screenshots.DASHBOARDS['scalars']}", path)
    with Image.open(path) as image:
        assert image.size == tuple(int(n) for n in screenshots.WINDOW.split(","))
        rgb = image.convert("RGB")
        # The single-page app has drawn: TensorBoard's orange header bar across the top, and charts below.
        assert rgb.getpixel((image.width // 2, 10)) == TENSORBOARD_ORANGE
        assert len(rgb.getcolors(maxcolors=4096)) > 20
