"""MQTT fan-out: one artifact to many device processes over a local mosquitto, edgefl's chunked delivery
against a raw paho publish of the same bytes, side by side in one run.

edgefl: the coordinator (MqttTransport) ships the artifact file to every device and sends each an
instruction naming it; each device process (MqttLink) fetches it in 1 MiB chunks with a window of 8,
checks every chunk's sha256 and the whole file's, writes it into its cache and reports back.
raw: one plain paho client publishes the same bytes as one QoS 1 message to each device's own topic; each
device process's plain paho client receives it and answers with a one-byte QoS 1 message. For reference,
raw broadcast: one publish of the bytes to a topic all devices read, fanned out by the broker.
All are timed from the first publish to the last device's answer; each trial rotates which goes first;
the headline `ratio_vs_raw` is the ratio of the median times (edgefl's throughput over raw's).

    python bench/mqtt_fanout.py [--devices 50] [--bytes 20e6] [--repeats 6] [-o bench/results/mqtt_fanout.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt
import paho.mqtt.client as mqtt
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def raw_client(url: str, client_id: str) -> mqtt.Client:
    host, port = url.split("://")[1].split(":")
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect(host, int(port))
    c.loop_start()
    assert connected.wait(30), f"{client_id}: no CONNACK"
    return c


# ------------------------------------------------------------------------------------------ a device
def worker(url: str, device: str, cache: str) -> None:
    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.messages import DeviceReport

    raw = raw_client(url, f"{device}-raw")
    raw.on_message = lambda c, u, msg: c.publish(f"bench/done/{device}", b"1", qos=1)
    raw.subscribe([(f"bench/raw/{device}", 1), ("bench/raw-all", 1)])
    link = MqttLink(url, device, None, cache)
    link.announce({"pid": os.getpid()})
    while (job := link.next_instruction()) is not None:
        if job.instruction.option("stop"):
            break
        path = link.fetch(job.artifacts["blob"])
        path.unlink()   # the next trial ships a new artifact: keep the disk free
        link.report(DeviceReport(round=job.instruction.round, device_id=device, config_hash=job.instruction.config_hash,
                                 status="ok", examples=1))
    link.close()
    raw.disconnect()
    raw.loop_stop()


# --------------------------------------------------------------------------------------- the coordinator
def instruction(device: str, round: int, **options):
    from edgefl.messages import RoundInstruction
    from edgefl.trainconfig import TrainConfig
    return RoundInstruction(round=round, device_id=device, config=TrainConfig(num_layers=1), weights_version=0,
                            seed=0, lr=0.0, options=tuple(options.items()))


def edgefl_trial(server, devices: list[str], artifact: Path, round: int) -> float:
    t0 = time.perf_counter()
    for d in devices:
        server.send(instruction(d, round), {}, artifacts={"blob": server.ship(d, artifact)})
    reports = server.collect(round, devices, timeout_s=600)
    elapsed = time.perf_counter() - t0
    assert sorted(r.device_id for r in reports if r.ok) == sorted(devices), reports
    return elapsed


def raw_trial(url: str, devices: list[str], payload: bytes, broadcast: bool = False) -> float:
    done, all_done = set(), threading.Event()
    pub = raw_client(url, "bench-raw-publisher")

    def answered(c, u, msg):
        done.add(msg.topic.rsplit("/", 1)[1])
        if len(done) == len(devices):
            all_done.set()
    pub.on_message = answered
    pub.subscribe("bench/done/#", qos=1)
    time.sleep(0.5)   # the SUBACK
    t0 = time.perf_counter()
    for topic in ["bench/raw-all"] if broadcast else [f"bench/raw/{d}" for d in devices]:
        pub.publish(topic, payload, qos=1)
    assert all_done.wait(600), f"raw: {len(done)}/{len(devices)} answered"
    elapsed = time.perf_counter() - t0
    pub.disconnect()
    pub.loop_stop()
    return elapsed


def cpu_seconds(tree: dict) -> dict:
    return {part: sum(sum(p.cpu_times()[:2]) for p in processes) for part, processes in tree.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=50)
    p.add_argument("--bytes", type=float, default=20e6)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "mqtt_fanout.json")
    args = p.parse_args()

    import multiprocessing

    from mosquitto import Mosquitto, mosquitto_path

    from edgefl.device_runtime.mqtt_link import MqttLink  # noqa: F401  imported once, before the devices fork
    from edgefl.protocol.chunks import CHUNK_SIZE, WINDOW
    from edgefl.transport.mqtt import MqttTransport

    size = int(args.bytes)
    load_before = os.getloadavg()[0]
    devices = [f"dev-{i:03d}" for i in range(args.devices)]
    with tempfile.TemporaryDirectory(prefix="edgefl-fanout-") as tmp, Mosquitto(Path(tmp) / "broker") as broker:
        # one process per device, forked before any MQTT connection exists in this one
        procs = [multiprocessing.get_context("fork").Process(target=worker, args=(broker.url, d, f"{tmp}/cache-{d}"))
                 for d in devices]
        for proc in procs:
            proc.start()
        try:
            server = MqttTransport(broker.url)
            t0 = time.perf_counter()
            online = server.wait_online(devices, timeout_s=300)
            assert set(devices) <= set(online), f"only {len(online)} of {len(devices)} devices came online"
            startup = time.perf_counter() - t0
            times = {"raw": [], "edgefl": [], "broadcast": []}
            # CPU seconds of the devices, the broker and the coordinator (this process): not inflated by load
            cpu = {name: [] for name in times}
            tree = {"devices": [psutil.Process(proc.pid) for proc in procs], "broker": [psutil.Process(broker.proc.pid)],
                    "coordinator": [psutil.Process()]}
            for k in range(args.repeats):
                payload = os.urandom(size)          # a new artifact each trial: no cache hits
                artifact = Path(tmp) / f"artifact-{k}.bin"
                artifact.write_bytes(payload)
                trials = {"raw": lambda: raw_trial(broker.url, devices, payload),
                          "edgefl": lambda: edgefl_trial(server, devices, artifact, k + 1),
                          "broadcast": lambda: raw_trial(broker.url, devices, payload, broadcast=True)}
                order = list(trials)[k % 3:] + list(trials)[:k % 3]   # rotate: a load trend favours none
                for name in order:
                    before = cpu_seconds(tree)
                    times[name].append(trials[name]())
                    cpu[name].append({part: round(t - before[part], 2) for part, t in cpu_seconds(tree).items()})
                print(f"trial {k + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in trials), flush=True)
                artifact.unlink()
            for d in devices:
                server.send(instruction(d, 0, stop=True), {})
            server.wire.flush(30)
            for proc in procs:
                proc.join(timeout=60)
            server.close()
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
    version = subprocess.run([mosquitto_path(), "-h"], capture_output=True, text=True).stdout.splitlines()[0]
    total = size * len(devices)
    raw_s, edgefl_s, broadcast_s = times["raw"], times["edgefl"], times["broadcast"]
    raw_med, edgefl_med, broadcast_med = (statistics.median(t) for t in (raw_s, edgefl_s, broadcast_s))
    result = {
        "ratio_vs_raw": round(raw_med / edgefl_med, 3),   # edgefl's effective throughput / raw paho's
        "goal_ratio": 0.8,
        "edgefl_s": round(edgefl_med, 3), "raw_s": round(raw_med, 3),
        "edgefl_MBps": round(total / edgefl_med / 1e6, 1), "raw_MBps": round(total / raw_med / 1e6, 1),
        "devices": len(devices), "artifact_bytes": size, "total_bytes": total,
        "chunk_bytes": CHUNK_SIZE, "window": WINDOW, "repeats": args.repeats,
        "edgefl_trials_s": [round(t, 3) for t in edgefl_s], "raw_trials_s": [round(t, 3) for t in raw_s],
        "ratio_per_trial": [round(r / e, 3) for r, e in zip(raw_s, edgefl_s, strict=True)],
        "cpu_s_per_trial": cpu,
        "cpu_ratio_vs_raw": round(statistics.median(sum(c.values()) for c in cpu["raw"])
                                  / statistics.median(sum(c.values()) for c in cpu["edgefl"]), 3),
        # for reference: one publish to a topic every device reads, fanned out by the broker (the v1 scheme's
        # per-device ACL has no such topic for artifacts)
        "ratio_vs_raw_broadcast": round(broadcast_med / edgefl_med, 3), "raw_broadcast_s": round(broadcast_med, 3),
        "raw_broadcast_trials_s": [round(t, 3) for t in broadcast_s],
        "device_startup_s": round(startup, 2),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "paho": paho.mqtt.__version__,
                    "broker": version, "load_avg_1min_before": round(load_before, 2),
                    "load_avg_1min_after": round(os.getloadavg()[0], 2)},
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio_vs_raw", "edgefl_s", "raw_s", "edgefl_MBps", "raw_MBps")}))


if __name__ == "__main__":
    main()
