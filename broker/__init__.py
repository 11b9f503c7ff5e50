"""MQTT broker deployment (edgefl.broker): mosquitto configuration, per-device logins and ACL, TLS,
service files, and a launcher that falls back to an embedded Python broker for demos."""
from edgefl.broker.acl import COORDINATOR
from edgefl.broker.deploy import write_deployment
from edgefl.broker.launch import EMBEDDED_WARNING, broker_command, run_foreground

__all__ = ["COORDINATOR", "EMBEDDED_WARNING", "broker_command", "run_foreground", "write_deployment"]
