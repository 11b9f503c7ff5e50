"""A bundle's archive is the same bytes whenever the same files are packed: entries sorted, owned by root,
dated by SOURCE_DATE_EPOCH (else the last commit), normalised modes, a dated gzip header."""
import os
import subprocess
import tarfile
import time

from edgefl.device_runtime.bundle import ZIP_EPOCH, source_date_epoch, write_archive


def stage(root, mtime):
    top = root / "edgefl-device"
    (top / "bin").mkdir(parents=True)
    (top / "lib").mkdir()
    (top / "bin" / "edgefl-device").write_bytes(b"\x7fELF agent")
    (top / "bin" / "edgefl-device").chmod(0o775)
    (top / "lib" / "b.so").write_bytes(b"b" * 100)
    (top / "lib" / "a.so").write_bytes(b"a" * 100)
    (top / "README.md").write_text("read me\n")
    (top / "README.md").chmod(0o600)
    for path in [top, *top.rglob("*")]:
        os.utime(path, (mtime, mtime))
    return top


def test_two_archives_of_the_same_files_are_the_same_bytes(tmp_path):
    one, two = stage(tmp_path / "one", 1_700_000_000), stage(tmp_path / "two", time.time())
    write_archive(one, tmp_path / "one.tar.gz", 1_600_000_000)
    time.sleep(1.1)              # a gzip header dated by the clock would differ now
    write_archive(two, tmp_path / "two.tar.gz", 1_600_000_000)
    assert (tmp_path / "one.tar.gz").read_bytes() == (tmp_path / "two.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["edgefl-device", "edgefl-device/README.md", "edgefl-device/bin",
                                         "edgefl-device/bin/edgefl-device", "edgefl-device/lib",
                                         "edgefl-device/lib/a.so", "edgefl-device/lib/b.so"]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "root", "root", 1_600_000_000)}
    modes = {m.name: m.mode for m in members}
    assert modes["edgefl-device"] == modes["edgefl-device/bin/edgefl-device"] == 0o755     # was 0775
    assert modes["edgefl-device/README.md"] == modes["edgefl-device/lib/a.so"] == 0o644    # README was 0600
    assert not list(tmp_path.glob("*.partial"))


def test_the_epoch_comes_from_source_date_epoch_else_the_last_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    assert source_date_epoch(tmp_path) == 1234567890
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert source_date_epoch(tmp_path) == ZIP_EPOCH          # not a git checkout: no clock, no file times
    env = {**os.environ, "GIT_COMMITTER_DATE": "@1500000000 +0000", "GIT_AUTHOR_DATE": "@1500000000 +0000"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True, env=env)
    assert source_date_epoch(tmp_path) == 1500000000
