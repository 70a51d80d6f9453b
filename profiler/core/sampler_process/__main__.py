"""``python -m profiler.core.sampler_process``: the sampler process (:mod:`profiler.core.sampler_process.process`)."""

from __future__ import annotations

import sys

from profiler.core.sampler_process.process import main

sys.exit(main())
