"""device_runtime/native/src: the native trainer's header-only C++ utilities, checked against Python.

Compiles device_runtime/native/tests/util_check.cpp once per module (g++ -std=c++17; skipped if g++ is
missing) and guarantees that:
- NumpyGenerator(seed).permutation(n) equals np.random.default_rng(seed).permutation(n), bit for bit,
  including successive calls on one generator (the stream continues exactly), and next_uint64 equals
  PCG64's random_raw;
- sha256_file equals hashlib.sha256 (empty, 1 byte, 3 MiB spanning several 1 MiB chunks);
- parse_json (nlohmann-json) parses what json.dumps writes (unicode, surrogate pairs, escapes, int64 extremes,
  floats) and its dump reads back with json.loads to an equal document; bad JSON, and numbers past a double, are
  a one-line error naming the file (with the byte offset for bad syntax);
- a manifest (artifact_set.cpp's parse_manifest, read_suffix_fields) with a field missing, of the wrong type or
  out of range is one line naming the file and the field's path;
- npy_open / RowReader / convert_rows read float32, float64, uint8 and int64 arrays (format 1.0 and
  2.0 headers) exactly, and refuse Fortran-order, big-endian, object and unsupported dtypes in one line
  naming the file;
- npz_open finds each np.savez member's data offset (also with ZIP64 directories and a plain zipfile with
  a comment), RowReader gathers rows in any order with repeats as numpy fancy indexing does, and a
  savez_compressed file is refused in one line naming the file and the fix;
- npy_write_f32 writes the bytes np.save writes, which np.load reads back equal.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "device_runtime" / "native"


@pytest.fixture(scope="module")
def util(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not installed: the native utilities cannot be compiled; apt-get install -y g++")
    exe = tmp_path_factory.mktemp("native") / "util_check"
    subprocess.run([gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(NATIVE / "src"),
                    str(NATIVE / "tests" / "util_check.cpp"), str(NATIVE / "src" / "artifact_set.cpp"), "-o", str(exe)], check=True)

    def run(*args, ok=True):
        p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        if ok:
            assert p.returncode == 0, p.stderr
            return p.stdout
        return p
    return run


def refused(result, path, *words):
    """A UserError: exit status 2 and exactly one line on stderr naming the file."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"{path}: "), result.stderr
    for w in words:
        assert w in result.stderr, result.stderr
    return result.stderr


# --- numpy_random.h ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**40 + 3])
def test_permutation_matches_numpy(util, seed):
    sizes = [1, 2, 10, 300, 15000, 70000]
    # Three successive calls per size, then mixed sizes: the C++ stream must continue as numpy's does,
    # including a buffered 32-bit half carried from one call into the next.
    calls = [n for n in sizes for _ in range(3)] + [3, 70000, 10, 1, 15000]
    lines = util("perm", seed, *calls).splitlines()
    rng = np.random.default_rng(seed)
    assert len(lines) == len(calls)
    for n, line in zip(calls, lines):
        np.testing.assert_array_equal(np.array(line.split(), dtype=np.int64), rng.permutation(n), err_msg=f"n={n}")


@pytest.mark.parametrize("seed", [0, 2**40 + 3, 2**64 - 1])
def test_raw_output_matches_pcg64(util, seed):
    got = [int(v) for v in util("raw", seed, 5).split()]
    assert got == [int(v) for v in np.random.PCG64(np.random.SeedSequence(seed)).random_raw(5)]


# --- sha256.h ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 55, 56, 64, 3 * 2**20 + 7])
def test_sha256_matches_hashlib(util, tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert util("sha256", path).strip() == hashlib.sha256(data).hexdigest()


def test_sha256_missing_file(util, tmp_path):
    refused(util("sha256", tmp_path / "absent", ok=False), tmp_path / "absent", "cannot open")


# --- json_fields.h ---------------------------------------------------------------------------------

DOC = {
    "name": "caf\u00e9 \u65e5\u672c \U0001F600",  # 2-, 3- and 4-byte UTF-8; json.dumps writes a surrogate pair
    "escapes": "quote\" backslash\\ slash/ \b\f\n\r\t \x00\x01\x1f \x7f",
    "ints": [0, -1, 2**53, 2**53 + 1, 2**63 - 1, -2**63],
    "floats": [0.1, -2.5e-300, 1e300, 3.141592653589793, 1.0, -0.0, 5e-324],
    "nested": {"a": [], "b": {}, "c": [[[{"d": None, "e": True, "f": False}]]]},
    "order": {"z": 1, "a": 2, "m": 3},
}


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_json_round_trip(util, tmp_path, ensure_ascii):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(DOC, ensure_ascii=ensure_ascii, indent=1), encoding="utf-8")
    out = util("json", path)
    back = json.loads(out)
    assert back == DOC
    assert list(back["order"]) == ["z", "a", "m"]  # insertion order kept
    assert [type(v) for v in back["ints"]] == [int] * len(DOC["ints"])  # exact, not via double


def test_json_huge_numbers(util, tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('[1e-999, 123456789012345678901234567890, 18446744073709551615]')
    assert json.loads(util("json", path)) == [0.0, 1.2345678901234568e29, 2**64 - 1]
    for text in ("[1e999]", "[-1e999]", "[0.000001e400]"):  # no double holds them: refused, not infinite
        path.write_text(text)
        refused(util("json", path, ok=False), path, "not JSON", "out of range")


@pytest.mark.parametrize("text, where", [
    ('{"a": 1,}', "byte 8"),
    ('[1, 2', "byte 5"),
    ('{"a": "\\ud800"}', "surrogate"),
    ('01', "byte 1"),
    ('"\x01"', "control"),
    ("", "byte 0"),
    ("[" * 1000, "nesting"),
])
def test_json_errors(util, tmp_path, text, where):
    path = tmp_path / "bad.json"
    path.write_text(text)
    refused(util("json", path, ok=False), path, "not JSON", where)


# --- artifact_set.cpp: manifest fields ------------------------------------------------------------------

SUFFIX = json.loads((NATIVE / "fuzz" / "manifest_json" / "corpus" / "suffix.json").read_text())


def _without(doc, *path):
    doc = json.loads(json.dumps(doc))
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    del node[last]
    return doc


@pytest.mark.parametrize("doc, words", [
    (_without(SUFFIX, "config_hash"), ["config_hash: missing"]),
    (_without(SUFFIX, "files", 1, "sha256"), ["files[1].sha256: missing"]),
    (_without(SUFFIX, "optimizer", "betas", 1), ["optimizer.betas[1]: missing"]),
    ({**SUFFIX, "optimizer": {**SUFFIX["optimizer"], "eps": "x"}}, ["optimizer.eps: expected a number, found string"]),
    ({**SUFFIX, "extra": {**SUFFIX["extra"], "batch": 0}}, ["extra.batch: 0 is not a batch size"]),
    ({**SUFFIX, "inputs": [{"name": "f", "dtype": "float32", "shape": [4, -2]}]}, ["inputs[0].shape[1]: dimension -2"]),
    ({**SUFFIX, "trainable": [{"name": "w", "local": "w", "shape": [2**31 - 1] * 3}]}, ["trainable[0].shape: more than"]),
    ({**SUFFIX, "outputs": [{"name": "loss", "dtype": "float32", "shape": []}]}, ["'loss' and 'logits'"]),
])
def test_manifest_field_errors_name_file_and_field(util, tmp_path, doc, words):
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    refused(util("manifest", tmp_path, ok=False), tmp_path / "manifest.json", *words)


def test_manifest_reads(util, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(SUFFIX))
    assert util("manifest", tmp_path).strip() == "ok"


# --- npy.h: .npy -------------------------------------------------------------------------------------

ARRAYS = {
    "f4": np.random.default_rng(1).standard_normal((7, 1, 3, 3)).astype(np.float32),
    "f8": np.random.default_rng(2).standard_normal((5,)) * 1e3,
    "u1": np.random.default_rng(3).integers(0, 256, (7, 1, 3, 3), dtype=np.uint8),
    "i8": np.array([0, -5, 2**40, -2**40, 9], dtype=np.int64),
}


def parse_rows(out):
    header, *rows = out.splitlines()
    return dict(kv.split("=") for kv in header.split()), rows


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("key", list(ARRAYS))
def test_npy_read(util, tmp_path, key, version):
    a = ARRAYS[key]
    path = tmp_path / f"{key}.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    header, rows = parse_rows(util("npy", path, "float32"))
    assert header["descr"] == a.dtype.str
    assert header["shape"] == ",".join(map(str, a.shape))
    assert int(header["offset"]) == path.stat().st_size - a.nbytes
    got = np.array([r.split() for r in rows], dtype=np.float32).reshape(a.shape)
    np.testing.assert_array_equal(got, a.astype(np.float32))
    if a.dtype.kind in "iu":
        _, rows = parse_rows(util("npy", path, "int64"))
        np.testing.assert_array_equal(np.array([r.split() for r in rows], dtype=np.int64).reshape(a.shape), a)


def test_npy_float_labels_must_be_whole(util, tmp_path):
    path = tmp_path / "y.npy"
    np.save(path, np.array([1.0, 2.0], dtype=np.float32))
    assert parse_rows(util("npy", path, "int64"))[1] == ["1", "2"]
    np.save(path, np.array([1.0, 2.5], dtype=np.float32))
    p = util("npy", path, "int64", ok=False)
    assert p.returncode == 2 and "2.5" in p.stderr and "not an integer" in p.stderr


@pytest.mark.parametrize("array, words", [
    (np.asfortranarray(np.zeros((3, 4), np.float32)), ["Fortran order", "ascontiguousarray"]),
    (np.zeros(3, ">f4"), ["big-endian", "astype('<f4')"]),
    (np.array([1, "a"], dtype=object), ["Python objects"]),
    (np.zeros(3, np.complex64), ["'<c8' is not supported", "float32, uint8 or int64"]),
    (np.zeros(3, [("a", "<f4"), ("b", "<i4")]), ["structured"]),
])
def test_npy_refused(util, tmp_path, array, words):
    path = tmp_path / "x.npy"
    np.save(path, array, allow_pickle=True)
    refused(util("npy", path, "float32", ok=False), path, *words)


def test_npy_truncated(util, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((10, 4), np.float32))
    path.write_bytes(path.read_bytes()[:-1])
    refused(util("npy", path, "float32", ok=False), path, "truncated")


# --- npy.h: .npz -------------------------------------------------------------------------------------

def check_npz(util, path, arrays):
    listing = dict(line.split(" ", 1) for line in util("npz", path).splitlines())
    assert set(listing) == set(arrays)
    blob = path.read_bytes()
    for name, a in arrays.items():
        header = dict(kv.split("=") for kv in listing[name].split())
        off = int(header["offset"])
        assert blob[off:off + a.nbytes] == a.tobytes(), name  # the offset points at the data itself
    rows = [3, 0, 3, 5, 1, 2, 2, 9, 8, 7, 4, 6, 5]  # out of order, ascending runs, repeats
    x = util("npz", path, "x", "float32", *rows).splitlines()
    np.testing.assert_array_equal(np.array([r.split() for r in x], np.float32).reshape(len(rows), *arrays["x"].shape[1:]),
                                  arrays["x"][rows].astype(np.float32))
    y = util("npz", path, "y", "int64", *rows).split()
    np.testing.assert_array_equal(np.array(y, np.int64), arrays["y"][rows])


NPZ = {"x": np.random.default_rng(4).integers(0, 256, (10, 1, 4, 4), dtype=np.uint8),
       "y": np.arange(10, dtype=np.int64)[::-1].copy()}


def test_npz_savez(util, tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, **NPZ)
    check_npz(util, path, NPZ)


def test_npz_zip64_directory(util, tmp_path, monkeypatch):
    # Real zip64 directories only appear past 4 GiB; a tiny limit makes zipfile write every zip64 record
    # (central extra fields, the zip64 end record and its locator) for a small file.
    path = tmp_path / "data.npz"
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)
    np.savez(path, **NPZ)
    monkeypatch.undo()
    blob = path.read_bytes()
    assert b"PK\x06\x06" in blob and b"PK\x06\x07" in blob  # the zip64 end record and locator
    check_npz(util, path, NPZ)
    with np.load(path) as z:  # still a valid archive
        np.testing.assert_array_equal(z["x"], NPZ["x"])


def test_npz_plain_zip_with_comment(util, tmp_path):
    # Written without numpy: no zip64 extras at all, other members, and a comment after the directory.
    path = tmp_path / "data.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("README.txt", "not an array")
        for name, a in NPZ.items():
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, a)
        z.comment = b"PK\x05\x06 a comment that looks like a signature"
    check_npz(util, path, NPZ)


def test_npz_compressed_refused(util, tmp_path):
    path = tmp_path / "data.npz"
    np.savez_compressed(path, **NPZ)
    refused(util("npz", path, ok=False), path, "member x.npy is compressed", "numpy.savez (not savez_compressed)")
    refused(util("npz", path, "y", "int64", 0, ok=False), path, "compressed")


def test_npz_not_a_zip_and_bad_row(util, tmp_path):
    path = tmp_path / "data.npz"
    np.save(path, np.zeros(3))
    os.replace(str(path) + ".npy", path)
    refused(util("npz", path, ok=False), path, "not a .npz file")
    np.savez(path, **NPZ)
    refused(util("npz", path, "x", "float32", 10, ok=False), path, "row 10 is out of range")


# --- npy.h: writer -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 5, 1000])
def test_npy_write(util, tmp_path, n):
    path = tmp_path / "out.npy"
    util("write", path, n)
    np.testing.assert_array_equal(np.load(path), np.arange(n, dtype=np.float32))
    np.save(tmp_path / "ref.npy", np.arange(n, dtype=np.float32))
    assert path.read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert not (tmp_path / "out.npy.tmp").exists()
