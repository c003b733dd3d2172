"""Page scripts run by ``st.navigation`` (each renders when executed as ``__main__``)."""
