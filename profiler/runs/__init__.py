"""Runs read back: what ``report``, ``compare`` and ``watch`` take from a run directory (docs/store.md)."""
