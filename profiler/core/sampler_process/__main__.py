"""``python -m profiler.core.agent``: the sampler process (:mod:`profiler.core.agent.process`)."""

from __future__ import annotations

import sys

from profiler.core.agent.process import main

sys.exit(main())
