"""Suite-wide settings.

(The slow tests used to run shortest first so that most of them finished within the time CI had left; CI
now runs every phase to the end and fails when one does not finish, so their order no longer matters.)
"""

from __future__ import annotations

# No RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER here: every Ray the product (and a test) starts on this machine goes
# through ulorl.scale.local_ray.init_ray, which keeps it on 127.0.0.1 whatever the environment says; exporting
# the variable for the whole suite would hide a Ray that does not (tests/test_local_ray.py). Only a test that
# builds a multi-node cluster on purpose sets it, to 1 (tests/raycluster.py).
