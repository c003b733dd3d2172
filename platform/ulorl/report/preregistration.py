"""Was a claim row's design fixed before its data existed? Checked from git and the runs, not stated.

A row is **pre-registered** only when the spec naming its seeds (the sweep YAML its runs came from)
was committed before the first of its runs started: the first commit of that file (``git log``,
oldest first) whose YAML plans every seed offset the row's runs ran (``seed_offsets``, else
``repeats``, the baseline's ``seeds`` and the references' ``seeds``), with its committer time before
the earliest run start. "no" when that commit came later or no commit names those seeds; "unknown"
when the runs carry no start time, the spec is not in a git checkout, or git is not there.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from ulorl.seeds import parse_seed_offsets
from ulorl.tracking.provenance import iso_utc

YES, NO, UNKNOWN = "yes", "no", "unknown"
# A sweep named <folder>_<rest> in these folders is sweeps/<folder>/<rest>.yaml (its ``name:``).
SWEEP_FOLDERS = ("choice", "entropy")


PREREG_RULE = ("A row is pre-registered only when the spec naming its seeds was committed before the first of its "
               "runs started: the first commit of the sweep file (git log) whose YAML plans every seed offset the "
               "row's runs ran, against the earliest run start; \"unknown\" when the runs carry no start time or "
               "git does not know the file.")


@dataclass(frozen=True)
class Preregistration:
    status: str                    # YES | NO | UNKNOWN
    spec: str                      # the spec file, relative to the repository root
    seeds: tuple[int, ...]         # the seed offsets the row's runs ran
    commit: Optional[str] = None   # the first commit of ``spec`` naming every one of them
    committed_ms: Optional[int] = None
    first_start_ms: Optional[int] = None
    why: str = ""


def planned_offsets(spec: Any) -> set[int]:
    """Seed offsets a sweep YAML (a parsed dict) runs: ``seed_offsets`` when given, else 0..repeats-1,
    the baseline's 0..seeds-1 (default 2) and each reference's 0..seeds-1 (default 1).
    ``planned_offsets({"repeats": 2, "baseline": {"seeds": 4}}) == {0, 1, 2, 3}``."""
    if not isinstance(spec, dict):
        return set()
    if spec.get("seed_offsets") is not None:
        try:
            return set(parse_seed_offsets(spec["seed_offsets"]))
        except ValueError:
            return set()
    out = set(range(int(spec.get("repeats") or 1)))
    if isinstance(spec.get("baseline"), dict):
        out |= set(range(int(spec["baseline"].get("seeds") or 2)))
    for ref in spec.get("references") or []:
        if isinstance(ref, dict):
            out |= set(range(int(ref.get("seeds") or 1)))
    return out


def spec_for_sweep(sweep: str) -> str:
    """The sweep file of a sweep name: ``choice_is_mode -> sweeps/choice/is_mode.yaml``, ``mpt_threshold ->
    sweeps/mpt_threshold.yaml``."""
    for folder in SWEEP_FOLDERS:
        if sweep.startswith(folder + "_"):
            return f"sweeps/{folder}/{sweep[len(folder) + 1:]}.yaml"
    return f"sweeps/{sweep}.yaml"


def _git(repo: Path, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def repo_root(where: Optional[Path] = None) -> Optional[Path]:
    """The git checkout holding ``where`` (default: ulorl's own source); None outside one."""
    here = where or Path(__file__).resolve().parent
    top = (_git(here, "rev-parse", "--show-toplevel") or "").strip()
    return Path(top) if top else None


def first_commit_naming(repo: Path, spec: str, seeds: set[int]) -> tuple[Optional[str], Optional[int], bool]:
    """(commit, committer time in ms) of the oldest commit of ``spec`` whose YAML plans every one of
    ``seeds`` (Nones when none does) and whether git knows the file at all."""
    log = _git(repo, "log", "--reverse", "--format=%H %ct", "--", spec)
    if not log or not log.strip():
        return None, None, False
    for line in log.splitlines():
        sha, ct = line.split()
        text = _git(repo, "show", f"{sha}:{spec}")
        if text is None:
            continue          # the commit deleted it
        try:
            planned = planned_offsets(yaml.safe_load(text))
        except yaml.YAMLError:
            continue
        if seeds <= planned:
            return sha, int(ct) * 1000, True
    return None, None, True


def judge(spec: str, seeds: Sequence[int], first_start_ms: Optional[int], commit: Optional[str],
          committed_ms: Optional[int], known: bool) -> Preregistration:
    """The verdict from what git and the runs say (pure)."""
    s = tuple(sorted(set(seeds)))

    def made(status: str, why: str) -> Preregistration:
        return Preregistration(status, spec, s, commit, committed_ms, first_start_ms, why)

    if not known:
        return made(UNKNOWN, f"{spec} is not in the git history here")
    if commit is None or committed_ms is None:
        return made(NO, f"no commit of {spec} names seed offsets {_seeds(s)}")
    if not first_start_ms:
        return made(UNKNOWN, "its runs carry no start time")
    lead = (first_start_ms - committed_ms) / 60000.0
    if committed_ms < first_start_ms:
        return made(YES, f"committed {lead:.0f} min before the first run started")
    return made(NO, f"committed {-lead:.0f} min after the first run started")


def _seeds(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    if s and s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s)) or "none"


def preregistration_of(row: Any, repo: Optional[Path]) -> Optional[Preregistration]:
    """The check for one claims row (``ClaimResult``: its ``sweep``, ``seed_offsets``, ``first_start``,
    ``spec``); None for a row without runs."""
    if not row.run_ids:
        return None
    spec = row.spec or spec_for_sweep(row.sweep.split(" ")[0])
    seeds = list(row.seed_offsets)
    if repo is None:
        return judge(spec, seeds, row.first_start, None, None, False)
    commit, ct, known = first_commit_naming(repo, spec, set(seeds))
    return judge(spec, seeds, row.first_start, commit, ct, known)


PREREG_COLUMNS = ("claim", "sweep", "seeds", "spec", "first commit naming them", "first run started",
                  "pre-registered")


def preregistration_markdown(results: Sequence[Any], repo: Optional[Path] = None) -> str:
    """One line per claims row with runs: the spec, the first commit naming its seeds and when, the
    first run's start, and "yes" / "no" / "unknown" with why."""
    repo = repo if repo is not None else repo_root()
    lines = ["| " + " | ".join(PREREG_COLUMNS) + " |", "|" + "|".join("---" for _ in PREREG_COLUMNS) + "|"]
    for r in results:
        p = preregistration_of(r, repo)
        if p is None:
            continue
        commit = f"{p.commit[:7]} ({iso_utc(p.committed_ms)})" if p.commit and p.committed_ms else "—"
        start = iso_utc(p.first_start_ms) if p.first_start_ms else "unknown"
        lines.append("| " + " | ".join([r.claim, r.sweep, _seeds(p.seeds), f"`{p.spec}`", commit, start,
                                        f"**{p.status}**: {p.why}"]) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["NO", "PREREG_COLUMNS", "PREREG_RULE", "Preregistration", "UNKNOWN", "YES", "first_commit_naming", "judge",
           "planned_offsets", "preregistration_markdown", "preregistration_of", "repo_root", "spec_for_sweep"]
