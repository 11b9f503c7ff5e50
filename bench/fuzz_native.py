"""Fuzzing the native trainer's parsers of untrusted bytes: a set's manifest.json, .npy and .npz files (a
device's data, a set's state.npz). Each target under device_runtime/native/fuzz/ (one folder per parser:
harness.cpp, corpus/) is built with Debian's clang and libFuzzer, AddressSanitizer and UBSan
(`apt-get install clang-14 libfuzzer-14-dev`), then run for its share of `--seconds`, starting from its
committed corpus and the inputs earlier runs found. A parser must turn any bytes into a result or a
UserError: a crash, a sanitizer report, an input running past 10 s or an allocation over 256 MiB is a
finding. After a finding the target starts again for the time it has left.

Per target the results hold the runs executed, seconds, crashes (their inputs' names), the working corpus
(files and bytes) and libFuzzer's final coverage. New corpus entries stay in the working folder (--work,
default $EDGEFL_DEVICE_HOME/fuzz); crashing inputs are kept in <work>/<target>/crashes/. --merge adds to
each committed corpus the new entries that reach new coverage (libFuzzer -merge=1) and the crashing inputs,
which the default suite then replays (tests/unit/test_native_fuzz_corpus.py): fix the parser first.

    python bench/fuzz_native.py [--seconds 600] [--targets manifest_json,npy,npz] [--work DIR] [--merge]
                                [-o bench/results/fuzz_native.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefl.device_runtime import native, native_fuzz  # noqa: E402

COMPILER = "clang++-14"
FLAGS = ["-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined"]
LIMITS = ["-timeout=10", "-rss_limit_mb=2048", "-malloc_limit_mb=256"]
RESTARTS = 20  # at most this many findings per target and run


def build(name: str, folder: Path, out: Path) -> Path:
    if shutil.which(COMPILER) is None:
        sys.exit(f"{COMPILER} is not installed; install it with: apt-get install clang-14 libfuzzer-14-dev")
    binary = out / f"fuzz_{name}"
    proc = subprocess.run(native_fuzz.fuzz_compile_argv(COMPILER, folder, binary, FLAGS), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"building the {name} fuzz target failed:\n{proc.stderr[-3000:]}")
    return binary


def files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []


def fuzz(name: str, binary: Path, seeds: Path, work: Path, seconds: float) -> dict:
    corpus, crashes = work / "corpus", work / "crashes"
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in files(crashes)}
    runs, spent, coverage, findings = 0, 0.0, None, []
    while spent < seconds - 1 and len(findings) < RESTARTS:
        argv = [str(binary), f"-max_total_time={max(1, int(seconds - spent))}", "-print_final_stats=1",
                f"-artifact_prefix={crashes}/", *LIMITS, str(corpus), str(seeds)]
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
        spent += time.monotonic() - start
        log = proc.stderr
        runs += sum(int(n) for n in re.findall(r"stat::number_of_executed_units: (\d+)", log))
        found = re.findall(r"\bcov: (\d+)", log)
        coverage = int(found[-1]) if found else coverage
        if proc.returncode != 0:
            kind = re.search(r"ERROR: (?:AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer): ([\w-]+)", log) or \
                re.search(r"runtime error: ([^\n]{0,120})", log)
            written = re.findall(r"Test unit written to (\S+)", log)
            findings.append({"input": Path(written[-1]).name if written else None,
                             "kind": kind.group(1) if kind else f"exit {proc.returncode}"})
            print(f"  {name}: finding {findings[-1]}", flush=True)
    new_crashes = sorted(p.name for p in files(crashes) if p.name not in before)
    return {"runs": runs, "seconds": round(spent, 1), "crashes": len(findings), "findings": findings,
            "crash_inputs": new_crashes, "corpus_files": len(files(corpus)),
            "corpus_bytes": sum(p.stat().st_size for p in files(corpus)), "seed_files": len(files(seeds)),
            "coverage": coverage, "runs_per_s": round(runs / spent) if spent else None}


def merge(binary: Path, seeds: Path, work: Path) -> int:
    """Adds to the committed corpus what reaches new coverage, and the crashing inputs; how many files."""
    count = len(files(seeds))
    subprocess.run([str(binary), "-merge=1", *LIMITS, str(seeds), str(work / "corpus")], capture_output=True)
    for crash in files(work / "crashes"):
        shutil.copy(crash, seeds / crash.name)
    return len(files(seeds)) - count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    targets = native_fuzz.fuzz_targets()
    p.add_argument("--seconds", type=float, default=600, help="in all, shared equally by the targets")
    p.add_argument("--targets", default=",".join(targets))
    p.add_argument("--work", type=Path, default=native.home() / "fuzz")
    p.add_argument("--merge", action="store_true", help="add new coverage and crashing inputs to the committed corpus")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "fuzz_native.json")
    args = p.parse_args()
    chosen = args.targets.split(",")
    unknown = [t for t in chosen if t not in targets]
    if unknown:
        sys.exit(f"--targets: unknown {', '.join(unknown)}; choose from {', '.join(targets)}")
    args.work.mkdir(parents=True, exist_ok=True)
    out: dict = {"date": datetime.date.today().isoformat(), "doc": __doc__.split("\n\n")[0].replace("\n", " "),
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.system(),
                             "arch": platform.machine()},
                 "compiler": " ".join([COMPILER, *FLAGS]), "limits": LIMITS, "seconds": args.seconds, "targets": {}}
    for name in chosen:
        binary = build(name, targets[name], args.work)
        print(f"{name}: fuzzing for {args.seconds / len(chosen):.0f} s", flush=True)
        result = fuzz(name, binary, targets[name] / "corpus", args.work / name, args.seconds / len(chosen))
        if args.merge:
            result["merged_into_corpus"] = merge(binary, targets[name] / "corpus", args.work / name)
        out["targets"][name] = result
        print(name, json.dumps({k: v for k, v in result.items() if k != "findings"}), flush=True)
    out["runs"] = sum(r["runs"] for r in out["targets"].values())
    out["crashes"] = sum(r["crashes"] for r in out["targets"].values())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
