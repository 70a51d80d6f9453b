"""``python -m profiler`` is the ``stallscope`` command."""

from __future__ import annotations

import sys

from profiler.cli import main

if __name__ == "__main__":
    sys.exit(main())
