"""The Streamlit app: sidebar (store, refresh, selection) and ``st.navigation`` over the pages.

Run by ``dashboard/app.py`` (in the repository) or ``ulorl/dashboard/streamlit_app.py`` (when
installed), both of which only call :func:`main`.
"""

from __future__ import annotations

import streamlit as st

from ulorl.dashboard import PAGES_DIR, cache, ui
from ulorl.quiet import quiet_libraries
from ulorl.tracking import absolutize_uri, resolve_tracking_uri

# (file under pages/, title, url path, icon); the root URL redirects to the first one
PAGES: tuple[tuple[str, str, str, str], ...] = (
    ("runs.py", "Runs", "runs", ":material/table:"),
    ("curves.py", "Curves", "curves", ":material/show_chart:"),
    ("speedup.py", "Speedup", "speedup", ":material/speed:"),
    ("benchmarks.py", "Benchmarks", "benchmarks", ":material/leaderboard:"),
    ("sweep.py", "Sweep", "sweep", ":material/tune:"),
    ("detail.py", "Run detail", "detail", ":material/article:"),
)


def _sidebar() -> None:
    with st.sidebar:
        st.markdown("### UloRL runs")
        if "_uri_input" not in st.session_state:
            st.session_state["_uri_input"] = resolve_tracking_uri()
        uri = st.text_input("Tracking URI", key="_uri_input",
                            help="Defaults to $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db")
        st.session_state[ui.URI_KEY] = absolutize_uri(uri.strip()) if uri.strip() else resolve_tracking_uri()
        if st.button("Refresh data", key="_refresh", help=f"Queries are cached for {cache.QUERY_TTL_S} s"):
            cache.clear()
        n = len(ui.selection())
        st.caption(f"{n} run(s) selected" if n else "No runs selected: pages show recent runs.")


def main() -> None:
    quiet_libraries()
    st.set_page_config(page_title="UloRL dashboard", page_icon=":material/monitoring:", layout="wide")
    pages = [st.Page(PAGES_DIR / fname, title=title, url_path=path, icon=icon) for fname, title, path, icon in PAGES]

    def home() -> None:
        """The root URL opens the first page at its own URL (``/runs``), so every page has one."""
        st.switch_page(pages[0])

    root = st.Page(home, title=PAGES[0][1], url_path="home", default=True, visibility="hidden")
    nav = st.navigation([root, *pages])
    _sidebar()
    nav.run()
