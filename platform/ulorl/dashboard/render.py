"""HTML for sampled responses (``samples/step_*.jsonl`` records, schema.SAMPLE_RECORD_FIELDS).

Each response token is a ``<span>`` whose background is the colour of the policy version that
decoded its segment; a segment start carries a small ``seg i · vN`` badge; tokens excluded by MPT
masking are struck through in a red outline. Token text is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any, Optional

import pandas as pd

# Light backgrounds, readable under dark text; indexed by policy version modulo length.
VERSION_COLORS: tuple[str, ...] = (
    "#cfe2ff", "#d1f2d9", "#ffe5b4", "#f3d1f4", "#d7f0f7", "#fff3b0", "#e2d9f3", "#fbd5d5",
)
UNKNOWN_COLOR = "#e9ecef"
MASKED_STYLE = "text-decoration:line-through;outline:1px solid #d62728;color:#8b0000"


def version_color(version: Optional[int]) -> str:
    if version is None:
        return UNKNOWN_COLOR
    return VERSION_COLORS[int(version) % len(VERSION_COLORS)]


def token_versions(segments: Iterable[dict[str, Any]], n_tokens: int) -> list[tuple[Optional[int], Optional[int]]]:
    """(segment index, version) of each of ``n_tokens`` response tokens; (None, None) outside
    every segment."""
    out: list[tuple[Optional[int], Optional[int]]] = [(None, None)] * n_tokens
    for i, seg in enumerate(segments):
        start, end = int(seg.get("start", 0)), int(seg.get("end", 0))
        for t in range(max(start, 0), min(end, n_tokens)):
            out[t] = (i, seg.get("version"))
    return out


def sample_html(record: dict[str, Any]) -> str:
    """One sampled response as an HTML block (header line, prompt, coloured response)."""
    tokens = [str(t) for t in (record.get("tokens") or [])]
    segments = list(record.get("segments") or [])
    masked = {int(p) for p in (record.get("masked_positions") or [])}
    reward = record.get("reward")
    header = (
        f"sample {html.escape(str(record.get('sample_id', '?')))} · group "
        f"{html.escape(str(record.get('group_id', '?')))} · step {html.escape(str(record.get('step', '?')))} · "
        f"reward <b>{html.escape(str(reward))}</b> · {html.escape(str(record.get('status', '?')))} · "
        f"{len(tokens)} tokens · {len(segments)} segment(s) · {len(masked)} masked"
    )
    prompt = html.escape(str(record.get("prompt_text", "")))
    parts: list[str] = []
    if tokens:
        starts = {int(s.get("start", 0)): (i, s.get("version")) for i, s in enumerate(segments)}
        for t, (seg, version) in enumerate(token_versions(segments, len(tokens))):
            if t in starts:
                si, sv = starts[t]
                parts.append(
                    f'<span class="ulorl-seg" style="font-size:0.7em;border-left:2px solid #333;'
                    f'padding:0 3px;margin-left:2px;color:#333">seg {si} · v{html.escape(str(sv))}</span>'
                )
            style = f"background:{version_color(version)}"
            if t in masked:
                style += ";" + MASKED_STYLE
            title = f"token {t} · segment {seg} · policy v{version}" + (" · masked MPT" if t in masked else "")
            parts.append(f'<span class="ulorl-tok" style="{style}" title="{html.escape(title)}">'
                         f"{html.escape(tokens[t])}</span>")
    else:
        parts.append(html.escape(str(record.get("response_text", ""))))
    return (
        '<div class="ulorl-sample" style="border:1px solid #ddd;border-radius:6px;padding:8px;margin:6px 0">'
        f'<div style="font-size:0.85em;color:#555">{header}</div>'
        '<div style="font-family:monospace;font-size:0.85em;color:#666;white-space:pre-wrap;margin:4px 0">'
        f'{prompt}</div>'
        '<div style="font-family:monospace;font-size:0.9em;white-space:pre-wrap;line-height:1.7">'
        f'{"".join(parts)}</div>'
        "</div>"
    )


def legend_html(versions: Iterable[int]) -> str:
    """Colour key for the policy versions present, plus the masked-token style."""
    items = [
        f'<span style="background:{version_color(v)};padding:0 6px;margin-right:4px">policy v{int(v)}</span>'
        for v in sorted(set(int(v) for v in versions))
    ]
    items.append(f'<span style="{MASKED_STYLE};padding:0 6px">masked MPT token</span>')
    return f'<div style="font-size:0.85em;margin-bottom:4px">{"".join(items)}</div>'


def samples_summary(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per record: sample_id, group_id, reward, status, tokens, segments, versions, masked."""
    rows = []
    for r in records:
        segs = r.get("segments") or []
        rows.append({
            "sample_id": r.get("sample_id"), "group_id": r.get("group_id"), "reward": r.get("reward"),
            "status": r.get("status"), "tokens": len(r.get("tokens") or []), "segments": len(segs),
            "versions": ",".join(str(s.get("version")) for s in segs),
            "masked": len(r.get("masked_positions") or []),
        })
    return pd.DataFrame(rows, columns=["sample_id", "group_id", "reward", "status", "tokens", "segments",
                                       "versions", "masked"])
