"""Search files for a secret (the tracking-password tests)."""

from __future__ import annotations

from pathlib import Path


def files_holding(secret: str, *folders: Path) -> list[str]:
    """Every regular file under ``folders`` whose bytes contain ``secret``."""
    needle = secret.encode()
    hits = []
    for folder in folders:
        for p in Path(folder).rglob("*"):
            if p.is_file() and not p.is_symlink():
                try:
                    if needle in p.read_bytes():
                        hits.append(str(p))
                except OSError:  # a socket, or a file removed while we walk
                    pass
    return hits
