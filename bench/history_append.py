"""What a round's history costs as a run grows: history.json rewritten whole after every round (as edgefl did
before it appended) against one record appended (edgefl.server.history.HistoryFile), side by side in one run.

Each round's record samples `--devices` devices (the issue's case: 1,000 a round). Writes
bench/results/history_append.json: per round, the seconds of each way; at the last round and summed over the
run, and their ratio. Both ways convert the records they write (the rewrite every record, the append one).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edgefl.outdir import write_atomic
from edgefl.server.history import HistoryFile, RoundRecord, history_json, record_to_json

ROOT = Path(__file__).resolve().parents[1]


def record(r: int, devices: int) -> RoundRecord:
    ids = {f"dev-{i:05d}": "g" for i in range(devices)}
    return RoundRecord(round=r, sampled=ids, participating={"g": devices},
                       predicted_peak_bytes=dict.fromkeys(ids, 123_456_789),
                       measured_peak_bytes=dict.fromkeys(ids, 120_000_000), examples=dict.fromkeys(ids, 600),
                       flops_per_device=dict.fromkeys(ids, 1.5e12), accuracy=0.5, loss=1.0, wall_s=1.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "history_append.json")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp())
    records: list[RoundRecord] = []
    appended = HistoryFile(folder / "appended.json")
    rewrite_s, append_s = [], []
    for r in range(1, args.rounds + 1):
        records.append(record(r, args.devices))
        t = time.perf_counter()
        write_atomic(folder / "rewritten.json", (json.dumps(history_json(records), indent=1) + "\n").encode(),
                     durable=False)
        rewrite_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        appended.append(record_to_json(records[-1]))
        append_s.append(time.perf_counter() - t)
    same = json.loads((folder / "rewritten.json").read_text()) == json.loads((folder / "appended.json").read_text())
    result = {"rounds": args.rounds, "devices_per_round": args.devices, "same_history": same,
              "bytes_at_end": (folder / "appended.json").stat().st_size,
              "last_round_s": {"rewrite": rewrite_s[-1], "append": append_s[-1]},
              "last_round_ratio": rewrite_s[-1] / append_s[-1],
              "total_s": {"rewrite": sum(rewrite_s), "append": sum(append_s)},
              "total_ratio": sum(rewrite_s) / sum(append_s),
              "per_round_s": {"rewrite": rewrite_s, "append": append_s}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_round_s"}))


if __name__ == "__main__":
    main()
