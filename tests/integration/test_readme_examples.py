"""The README's command blocks that need no server, run as written against the bundled files (issue 40: its
emulate example failed on examples/fleet.yaml): every ```bash block outside the sections named in SKIPPED, in
the README's order, in one folder holding a copy of examples/, with edgefl's console scripts on PATH; a block
must exit 0 (bash -e -o pipefail). The only changes are a test's budget (REDUCED: `--rounds N` runs 1 round, an
emulation samples 2 devices and evaluates on 500 test examples, `edgefl pretrain` takes 2 steps) and the lines
of ELSEWHERE, which another test runs. The skipped sections need an install, a server or a cluster, and say
where they run instead."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {
    "Quick start": "installs the project and its system packages",
    "Past one machine: devices in Ray actors": "starts a Ray cluster (tests/integration/test_ray_engine.py)",
    "Use edgefl from Flower": "needs Flower's own environment (tests/integration/test_flower.py runs it)",
    "Running the broker": "runs a broker in the foreground (test_readme_demo.py runs one from a deployment)",
    "Serving real devices over MQTT": "needs a broker and devices (test_readme_demo.py serves the demo)",
    "Run a small demo fleet on one machine": "tests/integration/test_readme_demo.py runs it",
    "Troubleshooting": "tests/integration/test_readme_demo.py runs it",
}
REDUCED = ((re.compile(r"--rounds \d+"), "--rounds 1"),
           (re.compile(r"\bedgefl emulate "), "edgefl emulate --clients-per-round 2 --test-limit 500 "),
           (re.compile(r"\bedgefl pretrain "), "edgefl pretrain --steps 2 "))
# lines run by another test: the bundle cross-builds the trainer for aarch64 and, the first time, downloads the
# Pi's wheels from the package index (minutes, and a network)
ELSEWHERE = {"edgefl device bundle ": "tests/integration/test_native_aarch64.py builds and checks a bundle"}


def readme_blocks() -> list[tuple[str, str]]:
    """(the (sub)section it is in, its body) of every ```bash block of README.md, in order."""
    out, title = [], ""
    for m in re.finditer(r"^(#{2,3}) ([^\n]+)$|^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S):
        if m[1]:
            title = m[2].strip()
        else:
            out.append((title, m[3]))
    return out


def test_the_skipped_sections_exist():
    titles = {title for title, _ in readme_blocks()}
    assert set(SKIPPED) <= titles, set(SKIPPED) - titles


def test_the_readme_emulate_example_runs_on_the_bundled_fleet(tmp_path, data):
    """The default run's share of this file: the README's first emulate command, as written but for REDUCED
    (the whole of every block, with its pretraining, caff emulation and executorch export, runs with -m slow)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    body = next(body for title, body in readme_blocks() if title == "Emulating a fleet")
    command = next(line for line in body.splitlines() if line.startswith("edgefl emulate --devices examples/fleet.yaml"))
    for pattern, budget in REDUCED:
        command = pattern.sub(budget, command)
    out = re.search(r"-o (\S+)", command)[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{command}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    history = json.loads((tmp_path / out / "history.json").read_text())
    assert len(history["rounds"]) == 1 and 0.0 <= history["rounds"][0]["accuracy"] <= 1.0


@pytest.mark.slow                                 # ~6 min on 2 idle cores: the examples' full set of commands
@pytest.mark.usefixtures("native_trainer")      # the native block builds it: the session's build is found
def test_every_command_block_that_needs_no_server_runs_as_written(tmp_path, data):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    ran = []
    for title, body in readme_blocks():
        if title in SKIPPED:
            continue
        body = "\n".join(line for line in body.splitlines() if not line.startswith(tuple(ELSEWHERE)))
        for pattern, budget in REDUCED:
            body = pattern.sub(budget, body)
        started = time.monotonic()
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, f"README section {title!r}:\n{body}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        ran.append((title, time.monotonic() - started))
    assert [t for t, _ in ran] == ["Planning a fleet", "Emulating a fleet", "Exporting artifacts and training on a device",
                                   "Training on a device without Python frameworks: the native trainer and the "
                                   "Raspberry Pi bundle"], ran
    assert (tmp_path / "runs" / "slt" / "history.json").is_file() and (tmp_path / "report" / "index.html").is_file()
    assert (tmp_path / "runs" / "caff" / "history.json").is_file() and (tmp_path / "client3").is_dir()
    print("README blocks:", ", ".join(f"{title} {seconds:.0f} s" for title, seconds in ran))


def test_the_lines_run_elsewhere_are_in_the_readme():
    lines = [line for _, body in readme_blocks() for line in body.splitlines()]
    for start in ELSEWHERE:
        assert any(line.startswith(start) for line in lines), start
