"""`edgefl report` renders: every image the HTML references exists and is a valid PNG."""
import os
import re
import subprocess
import sys

FLEET = "fleet:\n  groups:\n    small: {count: 3, memory_budget: 70MiB, runtime: ort}\n    big: {count: 2, memory_budget: 1GiB}\n"


def test_report_renders_real_runs(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    runs = []
    for method in ("slt", "fedolf"):
        out = tmp_path / "runs" / method
        r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                            "--dataset", "fashion-mnist", "--method", method, "--rounds", "2",
                            "--clients-per-round", "2", "--train-limit", "300", "--test-limit", "200", "-o", str(out)],
                           capture_output=True, text=True, timeout=300, env=os.environ)
        assert r.returncode == 0, r.stderr
        runs.append(str(out))
    report = tmp_path / "report"
    r = subprocess.run([sys.executable, "-m", "edgefl", "report", *runs, "-o", str(report)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    page = (report / "index.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == 3 + 2 * len(runs)
    for name in images:
        data = (report / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, name
    assert "slt" in page and "fedolf" in page


def test_report_of_a_folder_without_history_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "edgefl", "report", str(tmp_path), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 2 and "history.json" in r.stderr and "Traceback" not in r.stderr
