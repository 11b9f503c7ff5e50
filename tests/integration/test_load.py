"""Load on a real mosquitto (issue: surviving faults and bad input): 200 device connections, light clients
in four processes speaking the device protocol, against the real round loop for 5 rounds: no report is
lost, and the broker's and the coordinator's peak RSS stay bounded. The heavier run with a comparison of
broker settings is `python bench/mqtt_load.py --sweep`."""
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "mqtt_load.py"
MiB = 2**20


def test_200_devices_5_rounds_lose_no_report(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(BENCH), "--devices", "200", "--rounds", "5", "--processes", "4",
                        "--timeout", "30", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["devices_seen_online"] == 200 and result["device_exit_codes"] == [0, 0, 0, 0], result["device_errors"]
    assert result["reports_expected"] == result["reports_aggregated"] == 1000 and result["reports_lost"] == 0
    for r in result["per_round"]:
        assert r["aggregated"] and r["reports"] == r["sampled"] == 200, r
        assert not (r["missing"] or r["failed"] or r["rejected"] or r["skipped"]), r
    # a few KiB per report: what the broker and the coordinator hold for the fleet stays small
    assert 0 < result["upload_bytes_per_report"] < 8 * 1024
    assert 0 < result["broker_rss_before_bytes"] <= result["broker_peak_rss_bytes"] < 64 * MiB
    assert 0 < result["coordinator_rss_before_bytes"] <= result["coordinator_peak_rss_bytes"]
    assert result["coordinator_peak_rss_bytes"] - result["coordinator_rss_before_bytes"] < 64 * MiB
    print(json.dumps({k: result[k] for k in ("broker_peak_rss_bytes", "coordinator_peak_rss_bytes",
                                             "coordinator_rss_before_bytes", "round_wall_s", "total_s")}))


def test_200_devices_in_2_groups_get_their_weights_once_per_group(tmp_path):
    """The same load with two config groups sharing by group: no report lost, and per round the coordinator
    publishes each group's weights once (on the group's topics) plus one instruction per device."""
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(BENCH), "--devices", "200", "--rounds", "3", "--processes", "4",
                        "--timeout", "60", "--groups", "2", "-o", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [run] = json.loads(out.read_text())["shared_groups"]["runs"]
    assert run["reports_lost"] == 0 and run["device_exit_codes"] == [0, 0, 0, 0], run["device_errors"]
    assert len(set(run["group_widths"].values())) == 2                  # two configs, so two different sets
    assert [b["round"] for b in run["bytes_per_round"]] == [1, 2, 3]
    for b in run["bytes_per_round"]:
        assert b["instruction_messages"] == 200 and b["group_artifact_messages"] == 4, b   # a chunk + its manifest each
        assert len(b["group_set_bytes"]) == 2 and b["device_artifact_bytes"] == 0, b
        sets = sum(b["group_set_bytes"].values())
        assert sets < b["group_artifact_bytes"] < sets + 2048, b          # each group's set once, and its manifest
        assert b["coordinator_published_bytes"] < 1.01 * b["expected_bytes_groups_x_set_plus_devices_x_instruction"]
        assert b["coordinator_published_bytes"] < b["per_device_delivery_would_publish_bytes"]
