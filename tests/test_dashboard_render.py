"""HTML of sampled responses: segment colours by policy version, masked tokens, escaping."""

from __future__ import annotations

import re

from ulorl.dashboard import render

RECORD = {
    "step": 2, "sample_id": 7, "group_id": 3, "reward": 1.0, "status": "finished",
    "prompt_text": "Sum 1 2 3", "response_text": "1 3 6 <b>",
    "tokens": ["1", " 3", " 6", " <b>"],
    "segments": [{"start": 0, "end": 2, "version": 0}, {"start": 2, "end": 4, "version": 1}],
    "masked_positions": [0, 2],
}


def _token_spans(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<span class="ulorl-tok" style="([^"]*)" title="[^"]*">(.*?)</span>', html)


def test_tokens_coloured_by_segment_version_and_masked_marked():
    html = render.sample_html(RECORD)
    spans = _token_spans(html)
    assert [text for _, text in spans] == ["1", " 3", " 6", " &lt;b&gt;"]       # escaped token text
    colours = [re.search(r"background:(#[0-9a-f]+)", style).group(1) for style, _ in spans]
    assert colours == [render.VERSION_COLORS[0]] * 2 + [render.VERSION_COLORS[1]] * 2
    masked = ["line-through" in style for style, _ in spans]
    assert masked == [True, False, True, False]
    # one boundary badge per segment, naming its policy version
    assert re.findall(r"seg (\d) · v(\d)", html) == [("0", "0"), ("1", "1")]
    assert "<b>1.0</b>" in html and "2 segment(s)" in html and "2 masked" in html


def test_token_versions_outside_segments_are_unknown():
    tv = render.token_versions([{"start": 1, "end": 2, "version": 5}], 3)
    assert tv == [(None, None), (0, 5), (None, None)]
    assert render.version_color(None) == render.UNKNOWN_COLOR
    assert render.version_color(len(render.VERSION_COLORS) + 2) == render.VERSION_COLORS[2]


def test_record_without_tokens_falls_back_to_escaped_text():
    html = render.sample_html({"response_text": "a < b", "prompt_text": "<script>x</script>"})
    assert "a &lt; b" in html and "&lt;script&gt;" in html and "<script>" not in html
    assert _token_spans(html) == []


def test_legend_and_summary():
    legend = render.legend_html([1, 0, 1])
    assert legend.count("policy v") == 2 and "masked MPT token" in legend
    summary = render.samples_summary([RECORD])
    assert summary.iloc[0][["tokens", "segments", "versions", "masked"]].tolist() == [4, 2, "0,1", 2]
