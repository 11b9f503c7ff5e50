"""MQTT broker deployment (edgefl.broker): configuration, credentials, ACLs, launcher."""
