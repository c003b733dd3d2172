"""UloRL comparison dashboard over MLflow.

    ulorl-dashboard [--tracking-uri URI] [--port 8501]
    # or: MLFLOW_TRACKING_URI=sqlite:////abs/mlflow.db streamlit run dashboard/app.py

The pages live in ``platform/ulorl/dashboard/`` (importable and tested); this file only starts them.
"""

from ulorl.dashboard.app import main

main()
