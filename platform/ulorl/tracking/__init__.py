"""MLflow tracking for ulorl: URI resolution, run lifecycle, metric names."""

from ulorl.tracking.store import TrackingStoreError, prepare_store, require_store_folder
from ulorl.tracking.uri import absolutize_uri, artifact_root_for, default_tracking_uri, resolve_tracking_uri

__all__ = ["TrackingStoreError", "absolutize_uri", "artifact_root_for", "default_tracking_uri", "prepare_store",
           "require_store_folder", "resolve_tracking_uri"]
