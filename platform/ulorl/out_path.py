"""An output file a command writes at the end, checked before any work (so a long benchmark is not run
for a report it cannot write): a folder, a missing or non-folder parent, a place this user cannot write.

    problem = out_file_problem(Path("runs/"), "--out", "peer.json")
    # "--out runs is a folder; give a file path, e.g. runs/peer.json"

The answer follows ``ulorl-clean``'s for its ``--out``: a folder is refused (never written into under
a name the user did not give), with the file path to give instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def out_file_problem(path: Path, flag: str, example_name: str) -> Optional[str]:
    """Why ``path`` (given as ``flag``) cannot be written as a file, naming the fix; None when it can.
    ``example_name`` is the file name suggested inside a folder given by mistake. Creates nothing."""
    if path.is_dir():
        return f"{flag} {path} is a folder; give a file path, e.g. {path / example_name}"
    parent = path.parent
    if not parent.exists():
        return (f"{flag} {path}: the folder {parent} does not exist; create it first (mkdir -p {parent}) or give "
                "a path in an existing folder")
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is a file, not a folder; give a path in a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{flag} {path} is not writable by this user; give another path"
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: the folder {parent} is not writable by this user; give another path"
    return None
