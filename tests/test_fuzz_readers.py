"""The fuzz harness (tests/fuzz_readers.py) at its CI budget: every reader, mutated real inputs, each reader in
a subprocess under an address-space limit. Passes when no input raised anything but the typed error and
every reader stayed under the RSS ceiling; records inputs tried and peak RSS per reader (shown with -v or -s)."""
from __future__ import annotations

from .fuzz_readers import CASES, fuzz, table

RSS_CEILING_MB = 512


def test_every_reader_gives_a_typed_error_or_a_result_within_the_memory_ceiling(record_result):
    summaries = fuzz(list(CASES))
    record_result(table(summaries).replace("\n", "\n  "),
                  **{f"{s['reader']}.{key}": s[key] for s in summaries for key in ("inputs", "peak_rss_mb")})
    assert {s["reader"] for s in summaries} == set(CASES)
    assert all(s["inputs"] >= 60 and s["typed_errors"] and s["results"] for s in summaries), table(summaries)
    assert not [u for s in summaries for u in s["unexpected"]], table(summaries)
    assert max(s["peak_rss_mb"] for s in summaries) < RSS_CEILING_MB, table(summaries)
