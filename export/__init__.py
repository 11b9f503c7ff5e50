"""Artifact export (edgefl.export): a TrainConfig + global weights -> the frozen prefix as an inference graph
and the trainable suffix as training artifacts, each described by a manifest (edgefl.manifest).

`pipeline` (one config's set, weight refresh), `plan_export` (a plan's distinct configs), `split` (the
modules every backend exports), `backend` (the backend contract), `backends` (backends by name: ort,
executorch, torch). Imports torch; nothing here is imported by the planner or the device."""
