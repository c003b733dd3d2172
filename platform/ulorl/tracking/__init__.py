"""MLflow tracking for ulorl: URI resolution, run lifecycle, metric names."""

from ulorl.tracking.uri import absolutize_uri, artifact_root_for, default_tracking_uri, resolve_tracking_uri

__all__ = ["absolutize_uri", "artifact_root_for", "default_tracking_uri", "resolve_tracking_uri"]
