"""MQTT load: a few hundred device connections against edgefl's real round loop over a local mosquitto.

The coordinator is the one `edgefl serve` and `edgefl emulate` run: `Coordinator` with the MQTT transport
and the torch global model (`TorchServerModel`) of a tiny transformer LM, a FedAvg plan for the fleet,
every device sampled every round, in its own process. The devices are light clients, many `MqttLink`s
per process (torch blocked from import there), each answering every instruction as a device does over the
real protocol (instruction, weights fetched as a chunked artifact and verified, report uploaded) but with
the tensors it was sent, nudged, instead of training. Counted per round: reports the coordinator
aggregated against devices in the fleet (a device whose presence or report did not arrive shows as
skipped or missing). Peak RSS is the kernel's
high-water mark (VmHWM) of the broker and of the coordinator process; each also has its RSS before the
first device connected, so what the fleet added is visible beside what the process needs anyway.
The broker's max_queued_messages is sized as `edgefl broker config` sizes it for the fleet unless given.
With --sweep, short runs of 200 devices with other broker settings follow, to show which of them matter.

With --groups N (N >= 2): the fleet is N groups of equal size with a config each (HeteroFL: the first group
trains the full model, the others narrower ones, their budgets set between two widths' predicted peaks),
and the coordinator shares by group (`WireTransport.share_by_group`): each group's weights go out once on
the group's retained topics and its devices fetch them from there. A counting subscriber (a separate
client on everything the coordinator publishes: devices' down/ and the groups' topics) counts per round
the bytes of group artifacts, of artifacts sent to single devices, and of instructions; beside them what
they should be, the groups' set sizes plus the instructions, and what per-device delivery of the same
sets would have published. --compare M runs the same with M devices first, for the coordinator's peak
RSS at both sizes. These results go under "shared_groups" in the output file; its other keys are kept.

    python bench/mqtt_load.py [--devices 500] [--rounds 5] [--processes 4] [--max-queued N]
                              [--max-inflight N] [--sweep] [--groups 2 [--compare 500]]
                              [-o bench/results/mqtt_load.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

MODEL = {"name": "transformer", "layers": 1, "embed": 8, "heads": 2, "context": 8, "vocab": 16}
LINKS_PER_PROCESS = 300      # device connections per process at most (more processes than --processes if need be)


# broker settings compared by --sweep (None: mosquitto's default, 1000 queued and 20 in flight per client)
SWEEP = ({"max_queued": None, "max_inflight": None}, {"max_queued": 150, "max_inflight": None},
         {"max_queued": None, "max_inflight": 1}, {"max_queued": None, "max_inflight": 100})


def config_queue(devices: int) -> int:
    """max_queued_messages as `edgefl broker config` writes it for a fleet of `devices`."""
    from edgefl.broker.mosquitto_conf import MOSQUITTO_QUEUE_DEFAULT, PER_DEVICE_QUEUE

    return max(MOSQUITTO_QUEUE_DEFAULT, PER_DEVICE_QUEUE * (devices + 1))


def fleet_text(devices: int, groups: int = 1, budgets: tuple = ()) -> str:
    """One group `light`, or `groups` groups g0, g1, ... of equal size with `budgets` (default 1 GiB each)."""
    if groups == 1:
        return f"fleet: {{name: load, groups: {{light: {{count: {devices}, runtime: torch, memory_budget: 1GiB}}}}}}"
    sizes = [devices // groups + (i < devices % groups) for i in range(groups)]
    budgets = budgets or ("1GiB",) * groups
    groups_text = ", ".join(f"g{i}: {{count: {n}, runtime: torch, memory_budget: {b}}}"
                            for i, (n, b) in enumerate(zip(sizes, budgets)))
    return f"fleet: {{name: load, groups: {{{groups_text}}}}}"


def device_ids(devices: int, groups: int = 1) -> list[str]:
    from edgefl.fleet import parse_fleet

    return sorted(d for g in parse_fleet(fleet_text(devices, groups)).groups for d in g.device_ids)


def group_budgets(ref, groups: int) -> tuple[int, ...]:
    """Memory budgets under which HeteroFL gives group i the width 1 / 2**i: each the predicted peak at
    that width (the next wider one does not fit)."""
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext

    ctx = PlanContext(parse_fleet(fleet_text(groups, groups)), ref, batch_size=8)
    return tuple(ctx.cost(ctx.config(head_start=0, head_width=0.5 ** i, index_mode="prefix"), "torch").peak_memory_bytes
                 for i in range(groups))


def vm(pid: int | str, field: str) -> int:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


# ------------------------------------------------------------------------------------------- devices
def answer(link, rounds: int, timeout_s: float, errors: list) -> None:
    import numpy as np

    from edgefl.messages import DeviceReport

    try:
        for _ in range(rounds):
            # longer than the coordinator waits for the fleet and then for a round: a device it did not hear
            # of stays online (and counted lost) instead of leaving while the coordinator still waits
            job = link.next_instruction(timeout_s=3 * timeout_s)
            if job is None:
                raise TimeoutError(f"{link.device_id}: no instruction within {3 * timeout_s:g} s")
            ins = job.instruction
            sent = link.weights(job, timeout_s=timeout_s)
            nudged = {k: v + v.dtype.type(0.01) if v.dtype.kind == "f" else v for k, v in sent.items()}
            examples = 1 + int(np.frombuffer(link.device_id.encode(), np.uint8).sum() % 7)   # unequal weights
            link.report(DeviceReport(round=ins.round, device_id=link.device_id, config_hash=ins.config_hash,
                                     status="ok", examples=examples, tensors=nudged), timeout_s=timeout_s)
    except Exception as exc:   # reported by the process's exit code; the coordinator counts the lost report
        errors.append(f"{type(exc).__name__}: {exc}")


def devices_main(url: str, ids: list[str], rounds: int, cache: Path, timeout_s: float) -> int:
    sys.modules["torch"] = None   # type: ignore[assignment]  # a device never needs torch
    # hundreds of threads share this process's GIL: handing it over every 5 ms (the default) has them
    # mostly waking each other (measured: at 2,000 devices on 2 cores, 3x more system time than user time)
    sys.setswitchinterval(0.05)
    from edgefl.device_runtime.mqtt_link import MqttLink

    links = [MqttLink(url, d, None, cache / d) for d in ids]
    for link in links:
        link.announce({"runtime": "light", "pid": os.getpid()})
    errors: list[str] = []
    threads = [threading.Thread(target=answer, args=(link, rounds, timeout_s, errors)) for link in links]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for link in links:
        link.close()
    for e in errors[:5]:
        print(e, file=sys.stderr)
    return 1 if errors else 0


# --------------------------------------------------------------------------------------- coordinator
def coordinator_main(url: str, devices: int, rounds: int, out: Path, timeout_s: float, groups: int = 1) -> int:
    import torch

    from edgefl.engines.local import torch_trainer
    from edgefl.fleet import parse_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.server.coordinator import Coordinator, LoopSettings
    from edgefl.server.global_model import TorchServerModel
    from edgefl.transport.mqtt import MqttTransport
    from edgefl.zoo import ModelRef

    torch.set_num_threads(1)
    ref = ModelRef.of(MODEL["name"], **{k: v for k, v in MODEL.items() if k != "name"})
    fleet = parse_fleet(fleet_text(devices, groups, group_budgets(ref, groups) if groups > 1 else ()))
    strategy = get_strategy("fedavg" if groups == 1 else "heterofl")
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=rounds, batch_size=8)), fleet)
    widths = {name: g.steps[0].config.head_width for name, g in plan.groups.items()}
    assert groups == 1 or len(set(widths.values())) == groups, f"the groups' configs are not distinct: {widths}"
    server = TorchServerModel(ref, None, torch_trainer(ref), seed=0)
    transport = MqttTransport(url)
    if groups > 1:
        transport.share_by_group({d: g.name for g in fleet.groups for d in g.device_ids})
    ids = device_ids(devices, groups)
    rss_before = vm("self", "VmRSS")
    t0 = time.perf_counter()
    online = transport.wait_online(ids, timeout_s)
    connect_s = time.perf_counter() - t0
    settings = LoopSettings(rounds=rounds, clients_per_round=devices, seed=0, round_timeout_s=timeout_s)
    coordinator = Coordinator(fleet, plan, strategy, server, transport, settings, examples=lambda d: 1,
                              online=lambda: transport.online().keys())
    t0 = time.perf_counter()
    history = coordinator.run()
    run_s = time.perf_counter() - t0
    transport.close()
    out.write_text(json.dumps({
        "online": len(online), "connect_s": connect_s, "run_s": run_s,
        "rss_before_bytes": rss_before, "peak_rss_bytes": vm("self", "VmHWM"),
        "upload_bytes_per_report": history[0].upload_bytes // max(1, sum(history[0].participating.values())),
        "group_widths": widths, "artifact_chunks_sent_to_devices": transport.artifacts.chunks_sent,
        "group_chunks_published": transport.artifacts.group_chunks_published,
        "rounds": [{"round": r.round, "sampled": len(r.sampled), "aggregated": r.aggregated,
                    "reports": sum(r.participating.values()), "missing": r.missing, "failed": r.failed,
                    "rejected": r.rejected, "skipped": r.skipped, "wall_s": round(r.wall_s, 3)} for r in history]}))
    return 0


# ---------------------------------------------------------------------------------------------- main
class DownCounter:
    """A client of its own on everything the coordinator publishes (devices' down/ and the groups' topics):
    per round, payload bytes and messages of group artifacts (chunks and chunk manifests), artifacts sent to
    single devices, instructions, receipts of uploads, and cleared retained messages; and the size of each
    group artifact (from its chunk manifest). Bytes count towards the round of the next instruction: a round's
    artifacts go out before its instructions."""

    def __init__(self, url: str):
        import paho.mqtt.client as mqtt

        self.rounds: dict[int, dict] = {}
        self._pending = self._blank()
        self._lock = threading.Lock()
        host, port = url.removeprefix("mqtt://").rsplit(":", 1)
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="down-counter", protocol=mqtt.MQTTv5)
        self.client.on_message = self._message
        self.client.connect(host, int(port))
        self.client.subscribe([("fl/v1/dev/+/down/#", 1), ("fl/v1/group/#", 1)])
        self.client.loop_start()

    @staticmethod
    def _blank() -> dict:
        keys = ("group_artifact", "device_artifact", "instruction", "receipt", "cleared")
        return {**{f"{k}_bytes": 0 for k in keys}, **{f"{k}_messages": 0 for k in keys}, "group_sets": {}}

    def _message(self, client, userdata, msg) -> None:
        from edgefl import topics

        t, n = topics.parse(msg.topic), len(msg.payload)
        if t is None:
            return
        kind = ("cleared" if n == 0 else "instruction" if t.kind == "instr" else "receipt" if t.kind == "receipt"
                else "group_artifact" if t.group is not None else "device_artifact")
        with self._lock:
            self._pending[f"{kind}_bytes"] += n
            self._pending[f"{kind}_messages"] += 1
            if kind == "group_artifact" and t.kind == "manifest":
                self._pending["group_sets"][t.group] = self._pending["group_sets"].get(t.group, 0) + \
                    json.loads(msg.payload)["size"]
            if kind == "instruction":
                r = json.loads(msg.payload)["instruction"]["round"]
                into = self.rounds.setdefault(r, self._blank())
                for k, v in self._pending.items():
                    if k == "group_sets":
                        for g, size in v.items():
                            into[k][g] = into[k].get(g, 0) + size
                    else:
                        into[k] += v
                self._pending = self._blank()

    def close(self) -> tuple[dict[int, dict], dict]:
        """The rounds, and what came after the last instruction (the coordinator clearing what it published)."""
        time.sleep(1.0)          # what is still on its way
        self.client.disconnect()
        self.client.loop_stop()
        with self._lock:
            return self.rounds, {k: v for k, v in self._pending.items() if k != "group_sets"}


def per_round_bytes(counted: dict[int, dict], devices_of: dict[str, int]) -> list[dict]:
    """The counter's rounds with what they should be: each group's set once plus every instruction (the chunk
    manifests add their JSON), and what per-device delivery of the same sets would have published."""
    out = []
    for r, c in sorted(counted.items()):
        sets = c["group_sets"]
        published = c["group_artifact_bytes"] + c["device_artifact_bytes"] + c["instruction_bytes"]
        out.append({"round": r, **{k: v for k, v in c.items() if k != "group_sets"}, "group_set_bytes": sets,
                    "coordinator_published_bytes": published,
                    "expected_bytes_groups_x_set_plus_devices_x_instruction":
                        sum(sets.values()) + c["instruction_bytes"],
                    "per_device_delivery_would_publish_bytes": sum(devices_of[g] * size for g, size in sets.items())
                    + c["instruction_bytes"]})
    return out


def run(devices: int, rounds: int, processes: int, folder: Path, max_queued: int | None = None,
        max_inflight: int | None = None, timeout_s: float = 120.0, groups: int = 1) -> dict:
    """One load run in `folder`; the result as the JSON holds it."""
    from mosquitto import Mosquitto

    extra = "".join(f"{k} {v}\n" for k, v in (("max_queued_messages", max_queued),
                                                ("max_inflight_messages", max_inflight)) if v is not None)
    ids = device_ids(devices, groups)
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--rounds", str(rounds), "--timeout", str(timeout_s)]
    t_start = time.perf_counter()
    with Mosquitto(folder / "broker", extra=extra) as broker:
        broker_rss_before = vm(broker.proc.pid, "VmRSS")
        counter = DownCounter(broker.url) if groups > 1 else None
        coordinator = subprocess.Popen(me + ["--role", "coordinator", "--url", broker.url, "--devices", str(devices),
                                             "--groups", str(groups), "-o", str(folder / "coordinator.json")] + common,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # paho waits on select(): past ~400 connections a process's sockets pass FD_SETSIZE (1024) and connects fail
        share = min(-(-len(ids) // processes), LINKS_PER_PROCESS)
        clients = [subprocess.Popen(me + ["--role", "devices", "--url", broker.url, "--ids", ",".join(ids[i:i + share]),
                                          "--cache", str(folder / "cache")] + common,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for i in range(0, len(ids), share)]
        try:
            out, _ = coordinator.communicate(timeout=timeout_s * (rounds + 2))
            assert coordinator.returncode == 0, f"coordinator failed:\n{out[-3000:]}"
            client_out = [c.communicate(timeout=timeout_s * (rounds + 4))[0] for c in clients]
            broker_peak = vm(broker.proc.pid, "VmHWM")
        finally:
            for p in [coordinator, *clients]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            counted, after = counter.close() if counter is not None else (None, None)
    result = json.loads((folder / "coordinator.json").read_text())
    per_round = result.pop("rounds")
    shared = {}
    if counted is not None:
        from edgefl.fleet import parse_fleet

        devices_of = {g.name: len(g.device_ids) for g in parse_fleet(fleet_text(devices, groups)).groups}
        shared = {"groups": groups, "devices_per_group": devices_of, "group_widths": result["group_widths"],
                  "artifact_chunks_sent_to_devices": result["artifact_chunks_sent_to_devices"],
                  "group_chunks_published": result["group_chunks_published"],
                  "bytes_per_round": per_round_bytes(counted, devices_of), "bytes_after_the_last_round": after}
    return {
        "devices": devices, "rounds": rounds, "device_processes": len(clients),
        "reports_expected": devices * rounds, "reports_aggregated": sum(r["reports"] for r in per_round),
        # every device is online and sampled every round: any report not aggregated was lost on the way,
        # whether the device was never heard of (skipped as offline) or its report never came (missing)
        "reports_lost": devices * rounds - sum(r["reports"] for r in per_round),
        "devices_seen_online": result["online"],
        "broker_peak_rss_bytes": broker_peak, "broker_rss_before_bytes": broker_rss_before,
        "coordinator_peak_rss_bytes": result["peak_rss_bytes"],
        "coordinator_rss_before_bytes": result["rss_before_bytes"],
        "round_wall_s": [r["wall_s"] for r in per_round], "run_s": round(result["run_s"], 3),
        "connect_s": round(result["connect_s"], 3), "total_s": round(time.perf_counter() - t_start, 3),
        "upload_bytes_per_report": result["upload_bytes_per_report"],
        "broker_settings": {"max_queued_messages": max_queued or "mosquitto default (1000)",
                            "max_inflight_messages": max_inflight or "mosquitto default (20)"},
        "device_exit_codes": [c.returncode for c in clients],
        "device_errors": [o.strip()[-500:] for o in client_out if o.strip()],
        **shared,
        "per_round": per_round,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--max-queued", type=int, help="mosquitto max_queued_messages (default: as 'edgefl broker "
                                                  "config' sizes it; 0: mosquitto's own default)")
    p.add_argument("--max-inflight", type=int, help="mosquitto max_inflight_messages (default: mosquitto's)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a round (and a device) waits")
    p.add_argument("--sweep", action="store_true", help="also compare broker settings in short runs")
    p.add_argument("--groups", type=int, default=1, help="N >= 2: N config groups sharing by group (results under "
                                                         "'shared_groups', other keys of the output kept)")
    p.add_argument("--compare", type=int, help="with --groups: a run with this many devices first, for peak RSS")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "mqtt_load.json")
    p.add_argument("--role", choices=("coordinator", "devices"), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "devices":
        sys.exit(devices_main(args.url, args.ids.split(","), args.rounds, args.cache, args.timeout))
    if args.role == "coordinator":
        sys.exit(coordinator_main(args.url, args.devices, args.rounds, args.output, args.timeout, args.groups))
    if args.groups > 1:
        return groups_main(args)

    load_before = os.getloadavg()[0]
    queue = config_queue(args.devices) if args.max_queued is None else args.max_queued or None
    with tempfile.TemporaryDirectory(prefix="edgefl-load-") as tmp:
        result = run(args.devices, args.rounds, args.processes, Path(tmp) / "main", queue, args.max_inflight,
                     args.timeout)
        if args.sweep:
            result["settings_sweep"] = []
            for i, settings in enumerate(SWEEP):
                r = run(200, 2, args.processes, Path(tmp) / f"sweep-{i}", timeout_s=10.0, **settings)
                result["settings_sweep"].append({**r["broker_settings"], "devices": 200, "rounds": 2,
                                                 **{k: r[k] for k in ("reports_lost", "devices_seen_online",
                                                                      "round_wall_s", "broker_peak_rss_bytes")}})
                print(json.dumps(result["settings_sweep"][-1]), flush=True)
    result["machine"] = machine(load_before)
    result["method"] = " ".join(__doc__.split("\n\n")[1].split())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("devices", "rounds", "reports_lost", "broker_peak_rss_bytes",
                                             "coordinator_peak_rss_bytes", "total_s")}))


def machine(load_before: float) -> dict:
    version = subprocess.run([__import__("mosquitto").mosquitto_path(), "-h"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "broker": version,
            "load_avg_1min_before": round(load_before, 2), "load_avg_1min_after": round(os.getloadavg()[0], 2)}


def groups_main(args) -> None:
    """--groups: runs at --compare (if given) and --devices devices, under "shared_groups" of the output."""
    load_before = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="edgefl-load-") as tmp:
        for n in ([args.compare] if args.compare else []) + [args.devices]:
            queue = config_queue(n) if args.max_queued is None else args.max_queued or None
            runs.append(run(n, args.rounds, args.processes, Path(tmp) / f"groups-{n}", queue, args.max_inflight,
                            args.timeout, groups=args.groups))
            print(json.dumps({k: runs[-1][k] for k in ("devices", "rounds", "reports_lost",
                                                        "coordinator_peak_rss_bytes", "total_s")}), flush=True)
    shared = {"method": " ".join(__doc__.split("\n\n")[2].split()), "machine": machine(load_before), "runs": runs}
    if len(runs) == 2:
        small, large = runs
        shared["coordinator_peak_rss_ratio"] = round(large["coordinator_peak_rss_bytes"] /
                                                     small["coordinator_peak_rss_bytes"], 3)
        shared["coordinator_rss_growth_bytes"] = {r["devices"]: r["coordinator_peak_rss_bytes"] -
                                                  r["coordinator_rss_before_bytes"] for r in runs}
    old = json.loads(args.output.read_text()) if args.output.exists() else {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({**old, "shared_groups": shared}, indent=2) + "\n")


if __name__ == "__main__":
    main()
