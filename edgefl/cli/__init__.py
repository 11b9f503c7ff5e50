"""The `edgefl` command line. Only this package wires the rooms together."""
