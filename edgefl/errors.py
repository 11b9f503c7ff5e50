"""One error tree. User mistakes are `EdgeflError`s (the CLI prints one line and exits 2);
anything else is a bug and keeps its traceback."""


class EdgeflError(Exception):
    """Base of every error the user can cause or fix. Its message stays one line whatever user text it
    quotes: a newline or other control character (in a YAML key, say) is shown escaped."""

    def __str__(self) -> str:
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in super().__str__())


class ConfigError(EdgeflError):
    """Bad user input. The message names the file, the field and the fix."""


class InfeasiblePlanError(EdgeflError):
    """No configuration fits a device. The message names the device and the smallest budget that would."""


class ArtifactError(EdgeflError):
    """An artifact is missing, corrupt or does not match its hash."""


class TransportError(EdgeflError):
    """A message could not be delivered or received."""


class ReportRejected(EdgeflError):
    """A device upload failed validation; the message gives the reason."""


class StorageError(EdgeflError):
    """A file of a run cannot be written (a full disk, no permission) or read back as it was written (truncated,
    changed, inconsistent with the rest of the run). The message names the file or folder and the fix."""


class MissingDependencyError(EdgeflError):
    """An optional backend is not installed; the message carries the install hint."""


def require(module: str, extra: str):
    """Import an optional dependency or fail with the pip command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module} is not installed; install it with: pip install 'edgefl[{extra}]'"
        ) from exc
