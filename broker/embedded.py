"""`python -m edgefl.broker.embedded DIR`: serve a deployment folder with amqtt, for demos on one machine.

It reads the listener, the TLS files, the password file and the ACL from DIR's mosquitto.conf, and
enforces the logins and the ACL with the same rules as mosquitto (plugins below); a client's id must be its
login (mosquitto replaces it with the login; this one refuses another). What it cannot do (packet size
limit, persistence, MQTT 5; and amqtt 0.12.1 ends a connected session whose id another client names before
it checks that client's login: refused, it still knocks the session's owner off once) is why `edgefl broker
up` prefers mosquitto.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from amqtt.broker import Broker
from amqtt.contexts import Action
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin

from edgefl.broker.acl import may_subscribe, parse_acl, permits
from edgefl.broker.mosquitto_conf import read_conf
from edgefl.broker.passwords import parse_password_file, verify_password
from edgefl.errors import ConfigError, EdgeflError


class PasswordFileAuth(BaseAuthPlugin):
    """Logins checked against mosquitto's `$7$` password file."""

    @dataclass
    class Config:
        password_file: str = ""
        allow_anonymous: bool = False
        bind_client_id: bool = False

    def __init__(self, context) -> None:
        super().__init__(context)
        self.reload()

    def reload(self) -> None:
        self._hashes = parse_password_file(Path(self.config.password_file).read_text())

    async def authenticate(self, *, session) -> bool:
        if not session.username:
            return self.config.allow_anonymous
        hashed = self._hashes.get(session.username)
        if self.config.bind_client_id and session.client_id != session.username:
            return False      # mosquitto's use_username_as_clientid: no login takes over another's session
        return hashed is not None and verify_password(session.password or "", hashed)


class AclTopics(BaseTopicPlugin):
    """Publish, subscribe and delivery checked against the mosquitto ACL file; no rule, no access."""

    @dataclass
    class Config:
        acl_file: str = ""

    def __init__(self, context) -> None:
        super().__init__(context)
        self.reload()

    def reload(self) -> None:
        self._acl = parse_acl(Path(self.config.acl_file).read_text(), self.config.acl_file)

    async def topic_filtering(self, *, session=None, topic=None, action=None) -> bool:
        rules = self._acl.get(session.username, ()) if session and session.username else ()
        if not topic:
            return False
        if action == Action.SUBSCRIBE:
            return may_subscribe(rules, topic)
        return permits(rules, "write" if action == Action.PUBLISH else "read", topic)


def amqtt_config(folder: Path) -> dict:
    """amqtt's configuration for the deployment in `folder`: its one listener, logins and ACL."""
    path = folder / "mosquitto.conf"
    conf = read_conf(path)

    def one(key: str) -> str:
        if len(conf.get(key, [])) != 1 or not conf[key][0]:
            raise ConfigError(f"{path}: the embedded broker needs exactly one '{key}' line; "
                              "regenerate the file with 'edgefl broker config'")
        return conf[key][0]

    port, *bind = one("listener").split()
    if not port.isdigit() or len(bind) > 1:
        raise ConfigError(f"{path}: 'listener {one('listener')}' is not 'listener PORT [ADDRESS]'")
    listener = {"type": "tcp", "bind": f"{bind[0] if bind else '0.0.0.0'}:{port}"}
    if "certfile" in conf:
        listener.update(ssl=True, certfile=str(folder / one("certfile")), keyfile=str(folder / one("keyfile")))
    anonymous = conf.get("allow_anonymous", ["false"])[-1] == "true"
    bind = conf.get("use_username_as_clientid", ["false"])[-1] == "true"
    passwords, acl = folder / one("password_file"), folder / one("acl_file")
    for file in (passwords, acl):
        if not file.is_file():
            raise ConfigError(f"{file}: missing; regenerate the deployment with 'edgefl broker config'")
    parse_acl(acl.read_text(), str(acl))   # a bad ACL fails here in one line, not inside amqtt's plugin loader
    return {"listeners": {"default": listener}, "plugins": {
        f"{__name__}.PasswordFileAuth": {"password_file": str(passwords), "allow_anonymous": anonymous,
                                         "bind_client_id": bind},
        f"{__name__}.AclTopics": {"acl_file": str(acl)}}}


async def serve(folder: Path) -> None:
    config = amqtt_config(folder)
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def reload() -> None:
        """SIGHUP re-reads logins and ACL, as it does for mosquitto."""
        try:
            for plugin in broker.plugins_manager.plugins:
                if isinstance(plugin, (PasswordFileAuth, AclTopics)):
                    plugin.reload()
        except (OSError, EdgeflError) as exc:
            logging.getLogger("edgefl.broker").error("reload failed, the previous rules stay in force: %s", exc)

    loop.add_signal_handler(signal.SIGHUP, reload)
    await broker.start()
    print(f"embedded broker serving {folder.resolve()} on {config['listeners']['default']['bind']}", flush=True)
    await stop.wait()
    await broker.shutdown()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(Path(argv[0] if argv else ".")))
    except EdgeflError as exc:
        print(f"edgefl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
