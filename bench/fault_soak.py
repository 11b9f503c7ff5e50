"""Fault soak: long served runs (real mosquitto with logins and client ids bound to them, real agents, real
`edgefl serve`) with a seeded fault injected every ~2 rounds, against the same run without faults.

Three runs of the same plan (FedAvg, a CNN, every device every round, ORT devices on Fashion-MNIST shares):
  fault_free      no faults: the reference model;
  lossless        faults that must not change the result: broker SIGKILL and SIGTERM mid-round (restarted
                  within ~1 s), stray upload pieces on a device's topics, the coordinator SIGKILLed and
                  restarted, a client-id takeover by another login, a full disk under the state folder
                  (tmpfs; freed, then the same serve command again): its final model is compared with fault_free;
  all             the lossless faults plus those that take a device out of a round (an agent paused past the
                  round's deadline, an agent SIGKILLed and started again).
Counted per run: rounds completed, reports lost (a device logged `round N: ok`, no refusal came back, and
round N does not hold its report), duplicates accepted (a round holding a device twice), devices that trained
a round twice, and per broker restart how long each device took to announce itself again (what the
coordinator's offline grace, edgefl.transport.endpoint.GRACE_S, must cover).

    python bench/fault_soak.py [--rounds 50] [--devices 5] [--seed 0] [--train-limit 600]
                               [--runs fault_free,lossless,all] [-o bench/results/fault_soak.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LOSSLESS = ("broker_sigkill", "broker_sigterm", "stray_pieces", "coordinator_sigkill", "takeover", "full_disk")
TAKE_OUT = ("missed_round", "agent_sigkill")
ROUND_TIMEOUT_S = 30.0      # a paused device's round closes at this deadline; room for a broker restart


def edgefl(*args) -> list[str]:
    return [sys.executable, "-m", "edgefl", *map(str, args)]


class Presence:
    """A separate login watching presence/+: when each device announced itself online (live, not retained)."""

    def __init__(self, port: int, password: str):
        import paho.mqtt.client as mqtt

        self.online: dict[str, list[float]] = {}
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="watcher", protocol=mqtt.MQTTv5)
        self.c.username_pw_set("watcher", password)
        self.c.on_connect = lambda c, *_: c.subscribe("fl/v1/presence/+", qos=1)
        self.c.on_message = self._message
        # a persistent session: what devices announce before this watcher is back is queued for it, not lost
        session = Properties(PacketTypes.CONNECT)
        session.SessionExpiryInterval = 3600
        self.c.connect("127.0.0.1", port, clean_start=False, properties=session)
        self.c.loop_start()

    def _message(self, client, userdata, msg) -> None:
        with contextlib.suppress(ValueError):
            if not msg.retain and json.loads(msg.payload).get("online"):
                self.online.setdefault(msg.topic.rsplit("/", 1)[1], []).append(time.monotonic())

    def publish(self, topic: str, payload: bytes) -> None:
        self.c.publish(topic, payload, qos=1).wait_for_publish(5)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class Soak:
    def __init__(self, folder: Path, fleet: Path, plan: Path, devices: list[str], args, faults: tuple[str, ...]):
        from mosquitto import Mosquitto, write_credentials

        self.folder, self.fleet, self.plan, self.devices, self.args = folder, fleet, plan, devices, args
        self.faults, self.asked, self.rng = faults, faults, random.Random(args.seed)
        logins = {u: os.urandom(8).hex() for u in ["coordinator", "watcher", "intruder", *devices]}
        self.passwords = logins
        # a login is its client id, as `edgefl broker config` writes it; no ACL (the suite tests the ACL)
        self.broker = Mosquitto(folder / "broker", logins=logins, persistence=True,
                                extra="use_username_as_clientid true\n")
        self.creds = folder / "credentials"
        self.creds.mkdir()
        for user, password in logins.items():
            write_credentials(self.creds / f"{user}.json", user, password)
        self.state = folder / "state"
        self.disk = self._mount(folder / "disk") if "full_disk" in faults else None
        if self.disk is not None:
            self.state = self.disk / "state"
        elif "full_disk" in faults:
            self.faults = tuple(f for f in faults if f != "full_disk")
        self.agents: dict[str, subprocess.Popen] = {}
        self.injected: list[dict] = []

    @staticmethod
    def _mount(folder: Path):
        folder.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(folder)], capture_output=True)
        return folder if r.returncode == 0 else None

    # ------------------------------------------------------------------------------------- processes
    def start_agent(self, device: str) -> None:
        from edgefl.engines.agents import device_command
        from edgefl.fleet import load_fleet

        group = load_fleet(self.fleet).groups[0]
        cmd = device_command(device, group, self.broker.url, self.folder / "data" / device, self.folder / "fleet",
                             self.creds, None, False)
        log = open(self.folder / "logs" / f"{device}.log", "a")
        self.agents[device] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def serve(self) -> subprocess.Popen:
        cmd = edgefl("serve", "--plan", self.plan, "--broker", self.broker.url, "--state", self.state, "--rounds",
                     self.args.rounds, "--devices", self.fleet, "--seed", self.args.seed, "--wait-online", 120,
                     "--round-timeout", ROUND_TIMEOUT_S, "--credentials", self.creds / "coordinator.json")
        return subprocess.Popen(cmd, stdout=open(self.folder / "serve.log", "a"), stderr=subprocess.STDOUT)

    # ------------------------------------------------------------------------------------- observing
    def history(self) -> list[dict]:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return json.loads((self.state / "history.json").read_text())["rounds"]
        return []

    def logged(self, device: str, round: int, what: str = "ok") -> int:
        path = self.folder / "logs" / f"{device}.log"
        prefix = f"{device}: round {round}: {what}"
        return sum(line.startswith(prefix) for line in path.read_text().splitlines()) if path.exists() else 0

    @staticmethod
    def until(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------------------------- faults
    def inject(self, fault: str, round: int, serve: subprocess.Popen) -> tuple[dict, subprocess.Popen]:
        time.sleep(self.rng.uniform(0.2, 0.8))     # into the round: its instructions out, devices at work
        record: dict = {"round": round, "fault": fault}
        if fault in ("broker_sigkill", "broker_sigterm"):
            self.broker.proc.send_signal(signal.SIGKILL if fault == "broker_sigkill" else signal.SIGTERM)
            self.broker.proc.wait(timeout=10)
            # down until a device has finished the round into the void (or 3 s)
            self.until(lambda: any(self.logged(d, round) for d in self.devices), 3)
            self.broker.start()
            back = time.monotonic()
            self.until(lambda: all(any(t > back for t in self.watch.online.get(d, [])) for d in self.devices), 60)
            record["reconnect_s"] = {d: round_s(min(after) - back) if (after := [
                t for t in self.watch.online.get(d, []) if t > back]) else None for d in self.devices}
        elif fault == "stray_pieces":
            from edgefl import topics

            device = self.rng.choice(self.devices)
            self.watch.publish(topics.result_meta(device, round, os.urandom(8).hex()), b"{not json")
            for seq in range(2):
                self.watch.publish(topics.result_chunk(device, round, os.urandom(8).hex(), seq), os.urandom(512))
            record["device"] = device
        elif fault == "coordinator_sigkill":
            serve.kill()
            serve.wait()
            serve = self.serve()
        elif fault == "takeover":
            victim = self.rng.choice(self.devices)
            r = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(self.broker.port), "-u", "intruder",
                                "-P", self.passwords["intruder"], "-i", victim, "-t", "fl/v1/presence/+", "-W", "1"],
                               capture_output=True)
            record.update(device=victim, connected=r.returncode in (0, 27))   # 27: -W timed out, as asked
        elif fault == "full_disk":
            from served_run import fill_disk

            filler = fill_disk(self.disk)
            self.until(lambda: serve.poll() is not None, 120)
            record["serve_exit"] = serve.returncode
            filler.unlink()
            if serve.returncode != 0:
                serve = self.serve()
        elif fault == "missed_round":
            device = self.rng.choice(self.devices)
            os.kill(self.agents[device].pid, signal.SIGSTOP)
            self.until(lambda: len(self.history()) >= round, 4 * ROUND_TIMEOUT_S)
            os.kill(self.agents[device].pid, signal.SIGCONT)
            record["device"] = device
        elif fault == "agent_sigkill":
            device = self.rng.choice(self.devices)
            self.agents[device].kill()
            self.agents[device].wait()
            time.sleep(1)
            self.start_agent(device)
            record["device"] = device
        return record, serve

    # ------------------------------------------------------------------------------------- the run
    def run(self) -> dict:
        from edgefl.engines.agents import export_shares
        from edgefl.fleet import load_fleet

        export_shares(load_fleet(self.fleet), "fashion-mnist", "iid", self.args.seed, self.folder / "data",
                      self.args.train_limit)
        (self.folder / "logs").mkdir()
        self.broker.start()
        self.watch = Presence(self.broker.port, self.passwords["watcher"])
        for device in self.devices:
            self.start_agent(device)
        t0 = time.monotonic()
        serve = self.serve()
        next_at = 2
        try:
            while True:
                done = len(self.history())
                if serve.poll() is not None and done >= self.args.rounds:
                    break
                if serve.poll() is not None and serve.returncode != 0:
                    raise RuntimeError(f"serve exited {serve.returncode}: {self.tail('serve.log')}")
                if self.faults and done >= next_at - 1 and done < self.args.rounds:
                    round = done + 1                  # the round in progress (the last one closed)
                    record, serve = self.inject(self.rng.choice(self.faults), round, serve)
                    self.injected.append(record)
                    next_at = round + self.rng.choice((1, 2, 3))
                time.sleep(0.05)
        finally:
            wall = time.monotonic() - t0
            if serve.poll() is None:
                serve.kill()
            for p in self.agents.values():
                p.send_signal(signal.SIGTERM)
            for p in self.agents.values():
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            self.watch.close()
            self.broker.stop()
        return self.summary(wall)

    def tail(self, name: str) -> str:
        return (self.folder / name).read_text()[-2000:]

    def summary(self, wall: float) -> dict:
        history = self.history()
        held = {r["round"]: set(r["device_metrics"]) for r in history}
        lost, twice, refused = [], [], []
        for device in self.devices:
            text = (self.folder / "logs" / f"{device}.log").read_text()
            for n in range(1, self.args.rounds + 1):
                ok = self.logged(device, n)
                twice += [[device, n]] if ok > 1 else []
                said_no = re.search(rf"refused the round-{n} upload", text) is not None
                refused += [[device, n]] if ok and said_no else []
                if ok and not said_no and device not in held.get(n, set()):
                    lost.append([device, n])
        duplicates = sum(sum(r["participating_devices"].values()) - len(r["device_metrics"]) for r in history)
        return {"rounds_completed": len(history), "wall_s": round_s(wall),
                "reports_lost": len(lost), "lost": lost, "duplicates_accepted": duplicates,
                "trained_twice": twice, "refused_late": refused,
                "aggregated_per_round": [len(r["device_metrics"]) for r in history],
                "faults": self.injected,
                **({"full_disk": "tmpfs" if self.disk else "not injected: cannot mount a tmpfs"}
                   if "full_disk" in self.asked else {})}

    def unmount(self) -> None:
        if self.disk is not None:
            subprocess.run(["umount", "-l", str(self.disk)], check=False)


def round_s(x: float) -> float:
    return round(x, 2)


def weights_diff(a: Path, b: Path) -> float:
    """The largest relative difference of any tensor between two weights.pt files."""
    import torch

    wa, wb = torch.load(a), torch.load(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].double() - wb[k].double()).norm() / max(float(wa[k].double().norm()), 1e-12))
               for k in wa)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--devices", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=int, default=600)
    p.add_argument("--runs", default="fault_free,lossless,all")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "fault_soak.json")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runs = {"fault_free": (), "lossless": LOSSLESS, "all": LOSSLESS + TAKE_OUT}
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                 "args": {k: v for k, v in vars(args).items() if k != "output"}, "round_timeout_s": ROUND_TIMEOUT_S, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="fault-soak-") as tmp:
        tmp = Path(tmp)
        fleet, plan = tmp / "fleet.yaml", tmp / "plan.json"
        fleet.write_text(f"fleet:\n  name: soak\n  groups:\n    pc: {{count: {args.devices}, runtime: ort, "
                         "memory_budget: 1GiB}\n")
        subprocess.run(edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "fedavg", "--rounds",
                              args.rounds, "--format", "json", "-o", plan), check=True, capture_output=True)
        devices = [f"pc-{i}" for i in range(args.devices)]
        weights = {}
        for name in args.runs.split(","):
            folder = tmp / name
            folder.mkdir()
            soak = Soak(folder, fleet, plan, devices, args, runs[name])
            try:
                result = soak.run()
                weights[name] = soak.state / "weights.pt"
                if name != "fault_free" and "fault_free" in weights and weights[name].exists():
                    result["max_rel_diff_vs_fault_free"] = weights_diff(weights["fault_free"], weights[name])
                if weights[name].exists():
                    shutil.copy(weights[name], folder / "weights.pt")
                    weights[name] = folder / "weights.pt"
            finally:
                soak.unmount()
            out["runs"][name] = result
            print(name, json.dumps({k: v for k, v in result.items() if k not in ("faults", "lost")}), flush=True)
    reconnect = [s for r in out["runs"].values() for f in r["faults"] for s in f.get("reconnect_s", {}).values()]
    if reconnect:
        seen = [s for s in reconnect if s is not None]
        out["reconnect_after_broker_restart_s"] = {"min": min(seen, default=None), "max": max(seen, default=None),
                                                   "seen": len(seen), "not_seen_within_60_s": len(reconnect) - len(seen)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
