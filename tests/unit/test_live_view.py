"""The live view of a served round and its status file (edgefl.cli.live), `edgefl status` reading it, and
the operator's lines of edgefl serve (edgefl.cli.console): states as the transport saw them, in order,
with times; nothing cut without saying how much."""
import io
import json
import re
import time

from rich.console import Console
from typer.testing import CliRunner

from edgefl.cli.console import round_line
from edgefl.cli.live import LiveView
from edgefl.cli.main import app
from edgefl.server.history import RoundRecord, record_to_json
from edgefl.transport.activity import Activity
from edgefl.units import listing

GROUPS = {"pi-0": "pi", "pi-1": "pi", "phone-0": "phone"}
LINE = re.compile(r"^\d\d:\d\d:\d\d round (\d+): (.*)$")


def view(tmp_path, activity, online=("pi-0", "pi-1", "phone-0"), **kw):
    console = Console(file=io.StringIO(), width=200, force_terminal=kw.pop("terminal", False))
    return LiveView(activity, console, tmp_path, rounds=3, groups=GROUPS, broker="mqtt://b:1883",
                    online=lambda: online, tick_s=0.05, **kw), console


def status(tmp_path) -> dict:
    return json.loads((tmp_path / "status.json").read_text())


def test_without_a_terminal_every_change_is_one_timestamped_line_and_the_file_follows(tmp_path):
    activity = Activity()
    live, console = view(tmp_path, activity)
    with live:
        for d in GROUPS:
            activity.sent(d, 2)
        activity.waiting(2, GROUPS, time.time() + 600)
        activity.acknowledged("pi-0", 3 << 20)
        activity.progress("pi-0", "training")
        activity.presence("phone-0", False, "its connection was lost (last will)")
        activity.reported("pi-0", 2, ok=True)
        activity.acknowledged("pi-0", 1)          # after its report: no step back
        time.sleep(0.3)
        running = status(tmp_path)
    lines = [LINE.match(line).groups() for line in console.file.getvalue().splitlines()]
    assert [text for _, text in lines] == [
        "pi-0 sent", "pi-1 sent", "phone-0 sent", lines[3][1], "pi-0 downloading", "pi-0 training",
        "phone-0 offline (its connection was lost (last will))", "pi-0 reported"]
    assert {r for r, _ in lines} == {"2"}
    assert re.fullmatch(r"waiting for 3 devices until \d\d:\d\d:\d\d \((599|600) s\)", lines[3][1]), lines[3]
    assert running["round"] == 2 and not running["finished"] and running["expected"] == 3
    assert {d: s["state"] for d, s in running["devices"].items()} == {"pi-0": "reported", "pi-1": "sent",
                                                                      "phone-0": "offline"}
    assert running["devices"]["pi-0"]["bytes"] == 3 << 20
    done = status(tmp_path)
    assert done["finished"] and done["outcome"] == "completed"


def test_a_quiet_round_repeats_who_it_waits_for(tmp_path):
    activity = Activity()
    live, console = view(tmp_path, activity, quiet_s=0.2)
    with live:
        activity.sent("pi-0", 1)
        activity.sent("pi-1", 1)
        activity.waiting(1, ["pi-0", "pi-1"], time.time() + 100)
        activity.acknowledged("pi-1", 5 << 20)
        activity.reported("pi-0", 1, ok=True)
        time.sleep(0.6)
    reminder = [line for line in console.file.getvalue().splitlines() if "waiting for pi-1" in line]
    assert reminder, console.file.getvalue()
    assert re.search(r"round 1 of 3: 1/2 reported, deadline in (99|100) s \(\d\d:\d\d:\d\d\); 3/3 devices online; "
                     r"waiting for pi-1 \(downloading \d+ s, 5 MiB fetched\)$", reminder[0]), reminder[0]


def test_on_a_terminal_it_draws_the_round_as_a_table(tmp_path):
    activity = Activity()
    live, console = view(tmp_path, activity, online=("pi-0", "pi-1", "stranger"), terminal=True)
    activity.sent("pi-0", 1)
    activity.waiting(1, ["pi-0"], time.time() + 60)
    activity.progress("pi-0", "training")
    text = Console(file=io.StringIO(), width=200)
    text.print(live._render())
    drawn = text.file.getvalue().splitlines()
    assert drawn[0].startswith("round 1 of 3: 0/1 reported, deadline in ")
    assert drawn[0].endswith("; 2/3 devices online")      # the stranger is not one of the fleet
    assert re.match(r"pi-0 +pi +training +\d+ s", drawn[1])
    assert drawn[2] == "offline, not in this round: phone-0"


def test_edgefl_status_prints_the_round_in_progress_and_then_the_finished_rounds(tmp_path):
    activity = Activity()
    live, _ = view(tmp_path, activity)
    activity.sent("pi-0", 2)
    activity.sent("phone-0", 2)
    activity.waiting(2, ["pi-0", "phone-0"], time.time() + 300)
    activity.acknowledged("pi-0", 2 << 20)
    live.write()
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert re.match(r"round 2 of 3: 0/2 reported, deadline in (299|300) s \(\d\d:\d\d:\d\d\); 3/3 devices online "
                    r"\(updated \d s ago\)$", lines[0]), lines[0]
    assert re.match(r"  phone-0 +phone +sent +\d+ s$", lines[1]) and re.match(
        r"  pi-0 +pi +downloading +\d+ s  2 MiB fetched$", lines[2]), lines

    stale = status(tmp_path)
    stale["updated"] -= 120                                   # serve was killed two minutes ago
    (tmp_path / "status.json").write_text(json.dumps(stale))
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    # 120 s, or a little more on a machine slow enough that a second passed since the file was written
    assert re.search(r"has not updated this for 1[23]\d s: it is not running", r.output), r.output

    records = [RoundRecord(round=1, sampled={"pi-0": "pi", "phone-0": "phone"}, participating={"pi": 1},
                           failed={"phone-0": "offline: its connection was lost (last will) 3 s after ..."},
                           accuracy=0.5, upload_bytes=3 << 20, wall_s=12.0)]
    (tmp_path / "history.json").write_text(json.dumps({"rounds": [record_to_json(x) for x in records]}))
    live.write(finished=True, outcome="completed")
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert re.match(r"run completed at \d\d:\d\d:\d\d, round 2 of 3$", lines[0]), lines
    assert lines[1:] == ["finished rounds: 1", "  round 1: 1/2 reports, accuracy 0.5000, up 3 MiB, down 0 B, 12.0 s; "
                         "failed: phone-0 (offline: its connection was lost (last will) 3 s after ...)"]


def test_edgefl_status_of_a_folder_that_is_no_run_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code != 0 and "status.json nor history.json" in str(r.exception)


def test_cut_lists_say_how_much_they_left_out():
    assert listing(["a", "b"], 3) == "a, b"
    assert listing([f"d{i}" for i in range(8)], 3) == "d0, d1, d2 and 5 more"
    record = RoundRecord(round=4, sampled={f"d{i}": "g" for i in range(9)}, participating={},
                         skipped={f"d{i}": "offline" for i in range(5)}, missing=[f"d{i}" for i in range(5, 9)],
                         aggregated=False)
    line = round_line(record)
    assert "skipped: d0 (offline), d1 (offline), d2 (offline) and 2 more" in line
    assert "no report from d5, d6, d7, d8;" in line and line.endswith("below quorum: not aggregated")


def test_edgefl_version_prints_the_installed_version():
    from importlib.metadata import version

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output == f"edgefl {version('edgefl')}\n"
