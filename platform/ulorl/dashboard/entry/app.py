"""Streamlit entry file shipped inside the package (used when ``dashboard/app.py`` of a source
checkout is not there). Kept alone in its folder: Streamlit puts the entry file's folder on
``sys.path``."""

from ulorl.dashboard.app import main

main()
