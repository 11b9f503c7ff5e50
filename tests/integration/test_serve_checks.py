"""What `edgefl serve` refuses before round 1 and how it counts who is there (issue: operating a served run):
a fleet file that is not the plan's, in either direction, is one line naming what differs; the online
count is of the fleet's devices only, naming strangers; nobody online is an error, not empty rounds."""
from __future__ import annotations

import pytest
from broker_fixture import edgefl

from edgefl.errors import ConfigError, TransportError

PLANNED = "fleet:\n  name: demo\n  groups:\n    pi: {count: 3, runtime: torch, memory_budget: 1GiB}\n" \
          "    phone: {count: 1, runtime: torch, memory_budget: 1GiB}\n"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    (folder / "fleet.yaml").write_text(PLANNED)
    r = edgefl("plan", "--devices", folder / "fleet.yaml", "--model", "cnn", "--method", "fedavg", "--rounds", "1",
               "--format", "json", "-o", folder / "plan.json", timeout=300)
    assert r.returncode == 0, r.stderr
    return folder / "plan.json"


@pytest.mark.parametrize("fleet, differs", [
    ("    pi: {count: 3, runtime: torch, memory_budget: 1GiB}\n    phone: {count: 160, runtime: torch, "
     "memory_budget: 1GiB}\n    lab: {count: 2, runtime: torch, memory_budget: 1GiB}\n",
     "the fleet file's group lab not in the plan; phone has 160 devices in the fleet file, 1 in the plan"),
    ("    pi: {count: 3, runtime: torch, memory_budget: 1GiB}\n",
     "the plan's group phone not in the fleet file"),
    ("    pi: {ids: [a, b], runtime: torch, memory_budget: 1GiB}\n    phone: {count: 1, runtime: torch, "
     "memory_budget: 1GiB}\n", "pi has 2 devices in the fleet file, 3 in the plan"),
], ids=["larger-fleet", "smaller-fleet", "other-count"])
def test_a_fleet_file_that_is_not_the_plans_is_refused_in_either_direction(plan, tmp_path, fleet, differs):
    devices = tmp_path / "fleet.yaml"
    devices.write_text("fleet:\n  groups:\n" + fleet)
    r = edgefl("serve", "--plan", plan, "--devices", devices, "--broker", "mqtt://127.0.0.1:1",
               "--state", tmp_path / "state", timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    [line] = r.stderr.strip().splitlines()
    assert line == (f"edgefl: error: --devices {devices} and --plan {plan} describe different fleets: {differs}; "
                    "pass the fleet file the plan was made from, or plan again with 'edgefl plan --devices' this file")


def test_the_plans_own_fleet_passes(plan, tmp_path):
    from edgefl.engines.deployed import fleet_of
    from edgefl.fleet import parse_fleet
    from edgefl.planning.plan import Plan

    fleet = parse_fleet(PLANNED)
    assert fleet_of(Plan.read(plan), fleet) is fleet
    rebuilt = fleet_of(Plan.read(plan))                  # no fleet file: ids as count: N names them
    assert [g.device_ids for g in rebuilt.groups] == [("pi-0", "pi-1", "pi-2"), ("phone-0",)]
    with pytest.raises(ConfigError, match="describe different fleets"):
        fleet_of(Plan.read(plan), parse_fleet(PLANNED.replace("count: 3", "count: 4")))


def _online_line(online, expected):
    from edgefl.engines.serving import online_line

    return online_line(dict.fromkeys(online, {}), expected, "mqtt://b:1883", 60)


def test_only_the_fleets_devices_count_as_online_and_strangers_are_named():
    assert _online_line(["pi-0", "old-1", "old-2", "old-3"], ["pi-0"]) == \
        "1 of 1 devices online; also connected but not in this fleet: old-1, old-2, old-3"
    assert _online_line(["pi-0"], [f"pi-{i}" for i in range(9)]) == \
        "1 of 9 devices online (not yet: pi-1, pi-2, pi-3, pi-4, pi-5 and 3 more)"


def test_a_resumed_run_names_the_devices_its_last_round_found_offline_apart():
    from edgefl.engines.serving import offline_in, online_line

    last = {"round": 6, "skipped": {"pi-1": "offline", "pi-3": "its group sits out rounds 6-9: ..."},
            "failed": {"pi-4": "offline: its connection was lost (last will) 3 s after its round-6 instruction; ...",
                       "pi-5": "out of memory"}}
    gone = offline_in(last)
    assert gone == {"pi-1": "offline in round 6", "pi-4": "offline in round 6"}
    line = online_line({"pi-0": {}}, ["pi-0", "pi-1", "pi-2"], "mqtt://b:1883", 60, gone)
    assert line == "1 of 3 devices online (not waited for: pi-1 (offline in round 6); not yet: pi-2)"


def test_nobody_of_the_fleet_online_is_an_error_naming_the_fix():
    with pytest.raises(TransportError, match=r"none of the 2 devices of the plan came online at mqtt://b:1883 within "
                                             r"60 s \(ids pi-0, pi-1\); start them with their logins"):
        _online_line(["stranger"], ["pi-0", "pi-1"])


def test_more_rounds_than_the_plan_has_are_refused_before_connecting(plan, tmp_path):
    """Rounds past the plan gave every device 'no configuration fits' (issue 40): one line with the fix."""
    r = edgefl("serve", "--plan", plan, "--broker", "mqtt://127.0.0.1:1", "--rounds", "10", "--state",
               tmp_path / "state", timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == (f"edgefl: error: --rounds 10: the plan {plan} has 1 round, so no device would train in "
                                "rounds 2-10; plan again with 'edgefl plan ... --rounds 10', or leave --rounds out")
