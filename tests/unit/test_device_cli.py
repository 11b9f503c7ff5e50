import json
import os
import subprocess
import sys


def test_device_info_reports_memory_and_runtimes_without_torch():
    # torch blocked from import: the device agent must not need it
    code = ("import sys; sys.modules['torch'] = None\n"
            "from edgefl.device_runtime.cli import main\n"
            "sys.exit(main(['info', '--format', 'json']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=60)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["ram_bytes"] > 0 and facts["cpu_count"] >= 1
    assert set(facts["runtimes"]) == {"ort", "executorch", "torch"}


def test_the_whole_device_agent_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import edgefl.device_runtime.agent, edgefl.device_runtime.run_cmd, edgefl.device_runtime.worker\n"
            "import edgefl.device_runtime.mqtt_link, edgefl.device_runtime.memcap, edgefl.hardware.energy\n"
            "import edgefl.device_runtime.trainers.ort_trainer\n"
            "from edgefl.device_runtime.cli import main\n"
            "sys.exit(main(['run', '--help']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--enforce-memory" in r.stdout


def test_version_prints_the_installed_edgefl_version():
    from importlib.metadata import version

    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "--version"], capture_output=True,
                       text=True, env=os.environ, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["edgefl-device", version("edgefl")]


def test_a_memory_in_bits_is_one_line_naming_the_option(tmp_path):
    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((4, 1, 28, 28), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(4, np.int64))
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "--id", "d", "--broker", "mqtt://127.0.0.1:1",
                        "--data", str(tmp_path), "--runtime", "ort", "--memory", "4Mb"],
                       capture_output=True, text=True, env=os.environ, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "edgefl-device: error: --memory: '4Mb' is in megabits; a size is in bytes: write 4MB or 4MiB"
