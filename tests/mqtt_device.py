"""A device process for transport tests, with torch blocked from import: connects, announces itself,
fetches one artifact (optionally slowly) and prints JSON lines: {"held", "total"} per chunk, then
{"done", "sha256", "stats"}.

    python tests/mqtt_device.py URL DEVICE CACHE ARTIFACT [--delay SECONDS]
"""
import sys

sys.modules["torch"] = None   # the device side must not need torch

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from edgefl.device_runtime.mqtt_link import MqttLink  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("device")
    p.add_argument("cache")
    p.add_argument("artifact")
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    link = MqttLink(args.url, args.device, None, args.cache)
    link.announce({"pid": os.getpid()})

    def progress(held, total):
        print(json.dumps({"held": held, "total": total}), flush=True)
        time.sleep(args.delay)
    path = link.fetch(args.artifact, timeout_s=60, progress=progress)
    print(json.dumps({"done": True, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "stats": dataclasses.asdict(link.stats)}), flush=True)
    link.close()


if __name__ == "__main__":
    main()
