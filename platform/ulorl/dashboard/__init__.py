"""Streamlit comparison dashboard over the MLflow store (``ulorl-dashboard``).

Layers, so that everything but the page scripts is testable without a browser:

- ``store``   reads runs, metric histories and artifacts with ``MlflowClient`` (no Streamlit);
- ``frames``  pure pandas transforms (smoothing, bands, speedup, benchmark deltas, importance);
- ``charts``  Altair chart builders; ``render`` HTML of sampled responses;
- ``cache``   ``st.cache_data`` / ``st.cache_resource`` wrappers keyed by tracking URI;
- ``pages/``  one Streamlit page script per page; ``app`` wires them with ``st.navigation``.

Only the names in :mod:`ulorl.tracking.schema` are read.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PAGES_DIR = PACKAGE_DIR / "pages"
