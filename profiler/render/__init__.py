"""Rendering: terminal report, live status. The only package that imports rich; it computes no figure."""
