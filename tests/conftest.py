"""Suite-wide settings.

(The slow tests used to run shortest first so that most of them finished within the time CI had left; CI
now runs every phase to the end and fails when one does not finish, so their order no longer matters.)
"""

from __future__ import annotations

import os

# A local Ray stays on 127.0.0.1 only when this is set before ray is first imported (STACK.md); the
# product sets it before its own import, but an earlier test may have imported ray already.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
