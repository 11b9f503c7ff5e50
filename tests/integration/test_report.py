"""`edgefl report` renders real run folders (two emulated, one served) into a page a person can read: every
image it references is a valid PNG, the page fits a 1280 px window with every plot at least 900 px wide
(measured in headless Chromium), each run has its settings, groups (excluded ones with their reason) and,
served, its devices; an existing report is never overwritten silently."""
import json
import os
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from importlib.metadata import version
from pathlib import Path

import pytest

from edgefl.engines.serving import Serving
from edgefl.planning.plan import Plan
from edgefl.server.history import RoundRecord, write_history
from edgefl.units import format_bytes

FLEET = ("fleet:\n  groups:\n    small: {count: 3, memory_budget: 122MiB, runtime: ort}\n"
         "    big: {count: 2, memory_budget: 1GiB}\n    brick: {count: 1, memory_budget: 5MiB, runtime: ort}\n")
PNG = b"\x89PNG\r\n\x1a\n"
WINDOW = 1280
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REQUIRE = bool(os.environ.get("EDGEFL_REQUIRE_DATA"))   # CI sets it: a missing tool fails, never skips
# one worker renders the runs once for every test here (under xdist each worker would build its own)
pytestmark = pytest.mark.xdist_group("report")


def edgefl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "edgefl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=os.environ)


def served_run(folder: Path, fleet: Path) -> dict:
    """A run folder as `edgefl serve --state` leaves it (config.json with serve's keys, the plan, history.json
    through the coordinator's own record type), with what agents report: peak RSS, energy with its meter,
    bytes on the wire. Round 2: big-1 sends no report, small-0 is skipped (its group is excluded)."""
    folder.mkdir(parents=True)
    r = edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "fedolf", "--rounds", "2",
               "--format", "json", "-o", folder / "plan.json")
    assert r.returncode == 0, r.stderr
    plan = Plan.read(folder / "plan.json")
    peak = plan.groups["big"].steps[0].predicted.peak_memory_bytes
    serving = Serving(plan=folder / "plan.json", broker="mqtt://127.0.0.1:1883", seed=7, dataset="fashion-mnist")
    (folder / "config.json").write_text(json.dumps(serving.config_json(plan, 2)))
    measured = {(1, "big-0"): 100 * 2**20, (1, "big-1"): 90 * 2**20, (2, "big-0"): 120 * 2**20}
    joules = {(1, "big-0"): 1.25, (1, "big-1"): 2.0, (2, "big-0"): 1.75}
    up, down = {"big-0": 4_000_000, "big-1": 3_000_000}, {"big-0": 9_000_000, "big-1": 8_000_000}

    def metrics(r, d):
        traffic = lambda n: {"messages": 4, "payload_bytes": n, "wire_bytes": n + 400}
        return {"max_rss_bytes": measured[r, d], "runtime": "torch", "agent_peak_bytes": (5 + r) * 2**20,
                "energy": {"joules": joules[r, d], "source": "rapl", "estimated": False, "seconds": 3.0},
                "transport": {"download": traffic(down[d]), "upload": traffic(up[d])}}

    records = []
    for r, trained in ((1, ["big-0", "big-1"]), (2, ["big-0"])):
        sampled = {"big-0": "big", "big-1": "big"} | ({"small-0": "small"} if r == 2 else {})
        records.append(RoundRecord(
            round=r, sampled=sampled, participating={"big": len(trained)},
            skipped={"small-0": "no configuration of this method fits its group this round"} if r == 2 else {},
            predicted_peak_bytes={d: peak for d in ("big-0", "big-1")},
            measured_peak_bytes={d: measured[r, d] for d in trained}, examples={d: 50 for d in trained},
            upload_bytes=sum(up[d] for d in trained), download_bytes=sum(down[d] for d in trained),
            flops=1e9 * len(trained), train_loss=2.0 - r / 10, accuracy=0.2 + r / 10, loss=2.1 - r / 10,
            device_metrics={d: metrics(r, d) for d in trained}, missing=["big-1"] if r == 2 else [],
            wall_s=4.0))
    write_history(records, folder / "history.json")
    return {"measured": measured, "joules": joules, "up": up, "down": down, "peak": peak}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Two emulated runs made by the CLI, one served run folder, and the report of the three."""
    tmp = tmp_path_factory.mktemp("report")
    fleet = tmp / "fleet.yaml"
    fleet.write_text(FLEET)
    runs = []
    for method in ("slt", "fedolf"):
        out = tmp / "runs" / method
        r = edgefl("emulate", "--devices", fleet, "--model", "cnn", "--dataset", "fashion-mnist", "--method", method,
                   "--rounds", "2", "--clients-per-round", "2", "--train-limit", "300", "--test-limit", "200",
                   "-o", out)
        assert r.returncode == 0, r.stderr
        runs.append(out)
    served = served_run(tmp / "runs" / "campus", fleet)
    runs.append(tmp / "runs" / "campus")
    report = tmp / "report"
    r = edgefl("report", *runs, "-o", report)
    assert r.returncode == 0, r.stderr
    return {"report": report, "runs": runs, "served": served, "page": (report / "index.html").read_text()}


class Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts, with the run section (h2) and heading (h3) it is under."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self.section, self.heading, self._cell, self._title = [], "", "", None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"section": self.section, "heading": self.heading, "rows": []})
        elif tag == "tr":
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag in ("h2", "h3"):
            self._title = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1]["rows"][-1].append(self._cell)
            self._cell = None
        elif tag == "h2":
            self.section, self.heading, self._title = self._title, "", None
        elif tag == "h3":
            self.heading, self._title = self._title, None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._title is not None:
            self._title += data

    def table(self, run: str, heading: str) -> list[dict]:
        """The table under `heading` in the section of run `run`, as dicts keyed by its header."""
        for t in self.tables:
            if t["section"].startswith(f"Run {run} (") and t["heading"] == heading:
                header, *rows = t["rows"]
                return [dict(zip(header, row, strict=True)) for row in rows]
        raise AssertionError(f"no table {heading!r} for run {run}")


def test_every_image_is_a_png(rendered):
    import re

    images = re.findall(r'<img class="plot" src="([^"]+)"', rendered["page"])
    # comparison: accuracy, loss, vs upload, vs FLOPs; per run: participation and memory, and group accuracy
    # for the emulated runs (the served one recorded none)
    assert len(images) == 4 + 2 * 3 + 2, images
    assert {"loss_vs_round.png", "group_accuracy_0.png", "group_accuracy_1.png", "participation_2.png"} <= set(images)
    for name in images:
        data = (rendered["report"] / name).read_bytes()
        assert data[:8] == PNG and len(data) > 1000, name
    assert sorted(p.name for p in rendered["report"].iterdir()) == sorted(images + ["index.html"])


def test_settings_are_read_from_each_run_folder(rendered):
    tables = Tables(rendered["page"])
    slt = {row["setting"]: row["value"] for row in tables.table("slt", "Settings")}
    assert slt["run"] == "emulated" and slt["data set"] == "fashion-mnist" and slt["partition"] == "iid"
    assert slt["examples"] == "300 training, 200 test" and slt["clients per round"] == "2"
    assert slt["seed"] == "0" and slt["method"] == "slt" and slt["rounds"] == "2 completed of 2"
    assert slt["model"] == "cnn (1x28x28 input, 10 classes)" and slt["edgefl version"] == version("edgefl")
    campus = {row["setting"]: row["value"] for row in tables.table("campus", "Settings")}
    assert campus["run"] == "served over MQTT (mqtt://127.0.0.1:1883)" and campus["seed"] == "7"
    # a served run's server never sees how the devices' data was split, and says so; serve records its version
    assert campus["partition"] == "the devices' own data (a served run's server holds none of it)"
    assert campus["edgefl version"] == version("edgefl")
    assert campus["clients per round"] == "3 (most sampled in a round, from history)"
    assert campus["min reports"] == "1" and "update clip norm" not in campus   # serve wrote null: no row


def test_excluded_groups_carry_the_planners_reason(rendered):
    plan = json.loads((rendered["runs"][1] / "plan.json").read_text())
    excluded = {n: g["reason"] for n, g in plan["groups"].items() if g["excluded"]}
    assert "brick" in excluded
    groups = {row["group"]: row for row in Tables(rendered["page"]).table("fedolf", "Device groups")}
    for name, reason in excluded.items():
        assert groups[name]["status"] == f"excluded: {reason}"
        assert groups[name]["device-rounds trained"] == "0"
    assert groups["big"]["status"] == "takes part"


def test_served_run_has_a_device_table_of_measured_vs_predicted(rendered):
    s = rendered["served"]
    devices = {row["device"]: row for row in Tables(rendered["page"]).table("campus", "Devices")}
    big0, big1 = devices["big-0"], devices["big-1"]
    assert big0["predicted peak (max)"] == format_bytes(s["peak"])
    assert big0["measured peak (max)"] == format_bytes(120 * 2**20)
    ratios = [s["measured"][r, "big-0"] / s["peak"] for r in (1, 2)]
    assert big0["measured / predicted (max)"] == f"{max(ratios):.2f}" != f"{min(ratios):.2f}"     # not the median
    assert big0["of which agent"] == "7 MiB" and big1["of which agent"] == "6 MiB"
    assert big0["memory budget"] == format_bytes(Plan.read(rendered["runs"][2] / "plan.json").groups["big"]
                                                 .memory_budget_bytes)
    assert big0["energy (training)"] == "3 J over 2 rounds" and big0["energy source"] == "rapl"
    assert big0["upload"] == format_bytes(2 * s["up"]["big-0"]) and big0["download"] == format_bytes(2 * s["down"]["big-0"])
    assert big1["rounds trained"] == "1" and big1["rounds sampled"] == "2"
    assert big1["energy (training)"] == "2 J over 1 round"
    assert devices["small-0"]["measured peak (max)"] == "not measured"
    assert devices["small-0"]["upload"] == "not recorded"


def test_round_axes_have_whole_number_ticks(rendered):
    from edgefl.report import plots as report_plots
    from edgefl.report.runs import load_run

    runs = [load_run(p) for p in rendered["runs"]]
    for fig in (report_plots.accuracy_vs_round(runs), report_plots.loss_vs_round(runs),
                report_plots.participation_per_round(runs[2]), report_plots.group_accuracy(runs[0])):
        ax = fig.axes[0]
        fig.canvas.draw()
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_participation_counts_what_became_of_each_sampled_device(rendered):
    from edgefl.report.runs import load_run, participation

    served = load_run(rendered["runs"][2])
    assert [participation(r) for r in served.rounds] == [
        {"trained": 2, "skipped": 0, "failed": 0, "rejected": 0, "missing": 0},
        {"trained": 1, "skipped": 1, "failed": 0, "rejected": 0, "missing": 1}]


@pytest.fixture(scope="module")
def chromium():
    if not os.access(CHROMIUM, os.X_OK):
        hint = "these tests render the report in a browser: apt-get install -y chromium"
        if REQUIRE:
            pytest.fail(hint + " (EDGEFL_REQUIRE_DATA=1 makes a missing chromium fail)")
        pytest.skip(hint + " (EDGEFL_REQUIRE_DATA=1 makes this fail)")
    return CHROMIUM


def browse(chromium: str, page: Path, profile: Path, *args: str, timeout: float = 120) -> str:
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--window-size={WINDOW},900", "--hide-scrollbars", *args, page.as_uri()],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


# runs once every image has loaded: what the page measures at this window size goes into the title
PROBE = """<script>window.addEventListener("load", () => {
  const plots = [...document.querySelectorAll("img")].map(i => [i.getAttribute("src"), i.getBoundingClientRect().width,
                                                                 i.naturalWidth]);
  document.title = "probe:" + JSON.stringify({inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
                                              plots: plots});
});</script>"""


def test_page_fits_a_1280_px_window_with_wide_plots(rendered, chromium, tmp_path):
    import re

    report = rendered["report"]
    probe = report / "probe.html"    # beside index.html: its images load from the same folder
    probe.write_text(rendered["page"].replace("</body>", PROBE + "</body>"))
    try:
        dom = browse(chromium, probe, tmp_path / "profile-dom", "--virtual-time-budget=10000", "--dump-dom")
    finally:
        probe.unlink()
    found = re.search(r"<title>probe:(.*?)</title>", dom)
    assert found, dom[:2000]
    m = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert m["inner"] == WINDOW                       # the window really was 1280 px wide
    assert m["scroll"] <= WINDOW, m                   # nothing scrolls sideways
    for src, shown, natural in m["plots"]:
        assert natural > 0, f"{src} did not load"
        assert shown >= 900, (src, shown)
    assert len(m["plots"]) == 12

    shot = tmp_path / "page.png"
    browse(chromium, report / "index.html", tmp_path / "profile-shot", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == PNG and struct.unpack(">I", data[16:20])[0] == WINDOW


def test_an_existing_report_is_refused_and_force_writes_it_clean(rendered, tmp_path):
    runs = rendered["runs"][:1]
    out = tmp_path / "report"
    assert edgefl("report", *runs, "-o", out).returncode == 0
    stale = out / "memory_7.png"          # an image of an earlier, larger report
    stale.write_bytes(PNG)
    before = (out / "index.html").read_text()
    r = edgefl("report", *runs, "-o", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and str(out) in line and "choose another -o" in line and "--force" in line, line
    assert (out / "index.html").read_text() == before and stale.exists()
    r = edgefl("report", *runs, "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert not stale.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.html", "accuracy_vs_round.png", "loss_vs_round.png", "accuracy_vs_upload.png", "accuracy_vs_flops.png",
         "participation_0.png", "group_accuracy_0.png", "memory_0.png"])


def test_force_never_empties_a_folder_that_is_not_a_report(rendered):
    run = rendered["runs"][0]
    before = sorted(p.name for p in run.iterdir())
    r = edgefl("report", run, "-o", run, "--force")
    assert r.returncode == 2 and "not an edgefl report" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in run.iterdir()) == before


def test_report_of_a_folder_without_history_is_one_line(tmp_path):
    r = edgefl("report", tmp_path, "-o", tmp_path / "out", timeout=120)
    assert r.returncode == 2 and "history.json" in r.stderr and "Traceback" not in r.stderr


def test_the_page_has_contents_linking_every_section_and_figure(rendered):
    """A 10,500 px page had no table of contents (issue 40)."""
    import re

    page = rendered["page"]
    nav = re.search(r'<nav id="contents">(.*?)</nav>', page, re.S)
    assert nav and page.index("<nav") < page.index('id="comparison"'), page[:3000]
    targets = set(re.findall(r'<(?:h2|h3|figure) id="([^"]+)"', page))
    assert {"comparison", "run-0", "run-2-devices", "memory_2", "accuracy_vs_round"} <= targets
    assert set(re.findall(r'href="#([^"]+)"', nav.group(1))) == targets


def test_a_served_run_says_why_it_has_no_accuracy_per_group(rendered):
    assert ("Accuracy per group: not measured: a served run&#x27;s server holds none of its devices&#x27; data, so "
            "it evaluates the global model on the --dataset test split only.") in rendered["page"]


def test_an_excluded_groups_reason_covers_no_bar_label(rendered):
    """The reason sat in a box over the bars and covered their labels (issue 40): it goes under the group's name,
    below the axis."""
    from edgefl.report import plots as report_plots
    from edgefl.report.runs import load_run

    run = load_run(rendered["runs"][1])
    assert run.plan.groups["brick"].excluded
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(report_plots.memory_per_group(run))     # as the page's PNG is drawn
    canvas.draw()
    fig, renderer = canvas.figure, canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]     # the bars' value labels
    reasons = [t for t in ax.get_xticklabels() + ax.texts if "excluded:" in t.get_text()]
    assert len(labels) >= 5 and len(reasons) == 1, [t.get_text() for t in ax.texts]
    box = reasons[0].get_window_extent(renderer)
    assert not any(box.overlaps(label) for label in labels)
    assert box.y1 <= ax.get_window_extent(renderer).y0          # below the axes


def test_an_accuracy_axis_spans_at_least_a_tenth(rendered):
    """A run whose accuracy moved from 0.1625 to 0.1608 was drawn on an axis from 0.16075 to 0.1625, a fall."""
    from edgefl.report import plots as report_plots
    from edgefl.report.runs import load_run

    run = load_run(rendered["runs"][2])
    flat = [dict(r, accuracy=0.1625 - 0.0017 * (r["round"] - 1)) for r in run.rounds]
    run.rounds = flat
    for fig in (report_plots.accuracy_vs_round([run]), report_plots.accuracy_vs_cumulative([run], "upload_bytes")):
        lo, hi = fig.axes[0].get_ylim()
        assert hi - lo >= report_plots.ACCURACY_SPAN - 1e-9 and lo <= 0.1608 and hi >= 0.1625, (lo, hi)
