"""Ray is optional: edgefl never imports it unless `--engine ray` asks, and without it that option fails in one
line with the install hint. Ray is blocked in the child (sys.modules['ray'] = None), installed or not."""
import subprocess
import sys

BLOCK_RAY = "import sys; sys.modules['ray'] = None\n"


def child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_edgefl_modules_do_not_import_ray():
    code = ("import sys\n"
            "import edgefl.cli.main, edgefl.cli.emulate_cmd, edgefl.engines.local, edgefl.transport.memory\n"
            "import edgefl.transport.ray_transport, edgefl.engines.ray\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    r = child(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_engine_ray_without_ray_fails_in_one_line_with_the_install_hint(tmp_path):
    code = BLOCK_RAY + ("sys.argv = ['edgefl', 'emulate', '--devices', 'fleet.yaml', '--model', 'cnn', '--dataset',"
                        " 'fashion-mnist', '--method', 'fedavg', '--rounds', '1', '-o', %r, '--engine', 'ray']\n"
                        "from edgefl.cli.main import run\nrun()") % str(tmp_path / "run")
    r = child(code)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--engine ray" in r.stderr and "pip install 'edgefl[ray]'" in r.stderr
    assert not (tmp_path / "run").exists()      # it failed before any work


def test_an_unknown_engine_and_a_stray_address_are_refused(tmp_path):
    for extra, said in ((["--engine", "spark"], "--engine: expected local or ray"),
                        (["--address", "127.0.0.1:6379"], "--address: it names a Ray cluster; add --engine ray")):
        code = ("import sys\nsys.argv = ['edgefl', 'emulate', '--devices', 'fleet.yaml', '--model', 'cnn', "
                "'--dataset', 'fashion-mnist', '--method', 'fedavg', '--rounds', '1', '-o', %r, *%r]\n"
                "from edgefl.cli.main import run\nrun()") % (str(tmp_path / "run"), extra)
        r = child(code)
        assert r.returncode == 2 and said in r.stderr, r.stderr
