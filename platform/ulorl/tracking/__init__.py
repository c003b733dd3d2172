"""MLflow tracking for ulorl: URI resolution, run lifecycle, metric names."""

from ulorl.tracking.uri import absolutize_uri, artifact_root_for, default_tracking_uri, resolve_tracking_uri

__all__ = ["absolutize_uri", "artifact_root_for", "default_tracking_uri", "require_store_folder",
           "resolve_tracking_uri"]


def require_store_folder(uri: str) -> None:
    """A ``sqlite:`` store whose folder does not exist is a typo more often than a wish: refuse it
    (MLflow would create the folder silently) with a message naming the folder."""
    if uri.startswith("sqlite:///"):
        from pathlib import Path

        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise FileNotFoundError(f"tracking URI {uri}: folder {folder} does not exist; create it "
                                    "(mkdir -p) or give another --tracking-uri")
