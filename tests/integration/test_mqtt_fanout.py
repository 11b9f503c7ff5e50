"""The fan-out benchmark still runs end to end (a small fleet: the full run is `python bench/mqtt_fanout.py`)."""
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "mqtt_fanout.py"


def test_fanout_bench_delivers_to_every_device_and_writes_its_headline(tmp_path):
    out = tmp_path / "fanout.json"
    r = subprocess.run([sys.executable, str(BENCH), "--devices", "3", "--bytes", "3e6", "--repeats", "1", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["devices"] == 3 and result["total_bytes"] == 9_000_000
    assert result["edgefl_s"] > 0 and result["raw_s"] > 0
    assert abs(result["ratio_vs_raw"] - result["raw_s"] / result["edgefl_s"]) < 0.01
