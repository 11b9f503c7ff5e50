"""A malicious device for served-run tests. It joins the fleet as any device does (an `MqttLink`, presence,
instructions, the artifact set's manifest fetched and verified) and answers every instruction with a bad
report, one kind per round, built with the protocol's own envelopes. The test broker lets anyone publish
and subscribe anywhere, so it also reads the honest devices' uploads and forges uploads on other topics:

    round 1: a tensor under a name it was not sent; before it, a report for round 2 (not started yet)
             and one from `intruder`, a device outside the fleet
    round 2: a tensor of another shape; before it, a report for round 1 (closed) and two replays of the
             first watched device's round-2 upload: byte for byte (the same upload again), and under a name
             of its own (another report of that device)
    round 3: a tensor declared float64 where float32 was sent
    round 4: NaN in one tensor, Inf in another
    round 5: a tensor buffer four times the size the instruction expects (`upload_bytes`)

Each round it waits for the watched (honest) devices' uploads, then sends everything over its own single
connection with its own answer last: the coordinator receives the forged uploads while the round is
still open, and the round closes on the answer.

    python tests/malicious_device.py --id evil-0 --broker mqtt://127.0.0.1:PORT --cache DIR \\
        --watch pi-0,pi-1 --rounds 5
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np

from edgefl import topics
from edgefl.device_runtime.mqtt_link import MqttLink
from edgefl.manifest import Manifest
from edgefl.messages import DeviceReport
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import CHUNK_SIZE
from edgefl.protocol.mqtt_wire import MqttWire
from edgefl.protocol.tensors import pack

SET_ROLE = "set"        # edgefl.device_runtime.agent.SET_ROLE
INTRUDER = "intruder"


class Tap:
    """Every upload on the broker as it was published: (device, round) -> {topic: payload} in arrival order."""

    def __init__(self, url: str, client_id: str):
        self.uploads: dict[tuple[str, int], dict[str, bytes]] = {}
        self.complete: set[tuple[str, int]] = set()
        self.cond = threading.Condition()
        self.wire = MqttWire(url, client_id)
        self.wire.on_message(self._on_message)
        self.wire.subscribe([f"{topics.ROOT}/dev/+/up/result/#"])

    def _on_message(self, topic: str, payload: bytes, wire_bytes: int) -> None:
        t = topics.parse(topic)
        with self.cond:
            self.uploads.setdefault((t.device, t.round), {})[topic] = payload
            if t.kind == "result_meta":          # a link sends its meta after its chunks
                self.complete.add((t.device, t.round))
                self.cond.notify_all()

    def wait(self, keys: list[tuple[str, int]], timeout_s: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: set(keys) <= self.complete, timeout_s):
                raise SystemExit(f"malicious device: no upload from {sorted(set(keys) - self.complete)} "
                                 f"within {timeout_s:g} s")


def forge(wire, device: str, round: int, report: DeviceReport) -> None:
    """Upload `report` on `device`'s round-`round` topics, chunked as `DeviceLink.report` does."""
    buffer, order = pack(report.tensors)
    size = min(CHUNK_SIZE, wire.max_packet_size - 1024)
    chunks = [buffer[start:start + size] for start in range(0, len(buffer), size)]
    report.upload = report.upload or os.urandom(8).hex()
    for seq, chunk in enumerate(chunks):
        wire.publish(topics.result_chunk(device, round, report.upload, seq), chunk)
    wire.publish(topics.result_meta(device, round, report.upload), envelopes.upload_meta(
        report, order, len(buffer), hashlib.sha256(buffer).hexdigest(), len(chunks), {}))


def first_float(tensors: dict, min_ndim: int = 1) -> str:
    return next(k for k, v in tensors.items() if v.dtype.kind == "f" and v.ndim >= min_ndim)


def bad_tensors(round: int, sent: dict, upload_bytes: int) -> dict:
    """The tensors of this round's own (bad) answer; `sent`: what the instruction asked to train."""
    t = {k: v.copy() for k, v in sent.items()}
    if round == 1:
        name = first_float(t)
        t[f"{name}.renamed"] = t.pop(name)
    elif round == 2:
        name = first_float(t, min_ndim=2)
        t[name] = t[name].reshape(t[name].shape[0], -1).T.copy()     # same values, another shape
    elif round == 3:
        name = first_float(t)
        t[name] = t[name].astype(np.float64)
    elif round == 4:
        floats = [k for k, v in t.items() if v.dtype.kind == "f"]
        t[floats[0]].flat[0] = np.nan
        t[floats[-1]].flat[-1] = np.inf
    else:
        t["padding"] = np.zeros(3 * upload_bytes // 4, np.float32)  # 4x the expected buffer in all
    return t


def serve_round(link: MqttLink, tap: Tap, watch: list[str], timeout_s: float) -> int:
    job = link.next_instruction(timeout_s=timeout_s)
    if job is None:
        raise SystemExit(f"malicious device: no instruction within {timeout_s:g} s")
    ins = job.instruction
    r = ins.round
    manifest_path = link.fetch(job.artifacts[SET_ROLE], timeout_s)
    manifest = Manifest.from_json(json.loads(manifest_path.read_bytes()), "artifact set")
    sent = {e.name: np.zeros(e.shape, e.dtype) for e in manifest.trainable}

    def report(round: int, device: str, tensors: dict) -> DeviceReport:
        return DeviceReport(round=round, device_id=device, config_hash=ins.config_hash, status="ok", examples=64,
                            loss_before=2.3, loss_after=2.2, tensors=tensors)

    tap.wait([(d, r) for d in watch], timeout_s)
    if r == 1:
        link.report(report(r + 1, link.device_id, sent))             # a future round (its own topic of round 2)
        forge(link.wire, INTRUDER, r, report(r, INTRUDER, sent))     # a device outside the fleet
    elif r == 2:
        link.report(report(r - 1, link.device_id, sent))             # a closed round
        with tap.cond:
            replay = dict(tap.uploads[(watch[0], r)])
        for topic, payload in replay.items():                        # an accepted upload, byte for byte again
            link.wire.publish(topic, payload)
        renamed = os.urandom(8).hex()
        for topic, payload in replay.items():                        # and under another upload's name
            t = topics.parse(topic)
            if t.kind == "result_meta":
                meta = json.loads(payload)
                meta["report"]["upload"] = renamed
                link.wire.publish(topics.result_meta(t.device, t.round, renamed), json.dumps(meta).encode())
            else:
                link.wire.publish(topics.result_chunk(t.device, t.round, renamed, t.seq), payload)
    link.report(report(r, link.device_id, bad_tensors(r, sent, ins.option("upload_bytes"))))
    assert link.wire.flush(timeout_s)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--id", required=True)
    p.add_argument("--broker", required=True)
    p.add_argument("--cache", required=True, type=Path)
    p.add_argument("--watch", required=True, help="honest device ids, comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    watch = args.watch.split(",")
    tap = Tap(args.broker, f"{args.id}-tap")
    link = MqttLink(args.broker, args.id, None, args.cache)
    link.announce({"runtime": "ort"})
    print(f"{args.id}: online", flush=True)
    try:
        for _ in range(args.rounds):
            print(f"{args.id}: sent round {serve_round(link, tap, watch, args.timeout)}'s bad reports", flush=True)
    finally:
        link.close()
        tap.wire.close()


if __name__ == "__main__":
    main()
