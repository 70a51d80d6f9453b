"""Integrations with the trainers users train in: each records an ordinary run store through a Session.

``profiler.integrations.lightning`` (PyTorch Lightning, extra ``stallscope[lightning]``) and
``profiler.integrations.hf`` (Hugging Face's Trainer, extra ``stallscope[hf]``). Nothing is imported here: a
framework is imported only by its own module, which says in one line what to install when it is missing.
"""

from __future__ import annotations

MISSING = "stallscope's {what} integration needs {needs}: pip install 'stallscope[{extra}]'"


def missing(what: str, needs: str, extra: str) -> ImportError:
    """The one-line ImportError an integration raises when its framework is not installed."""
    return ImportError(MISSING.format(what=what, needs=needs, extra=extra))
