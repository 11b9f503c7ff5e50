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
