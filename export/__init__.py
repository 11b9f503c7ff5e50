"""Artifact export (edgefl.export): frozen prefix as an inference graph, trainable suffix as training
artifacts. Backends arrive with the export work; nothing here is imported by the planner."""
