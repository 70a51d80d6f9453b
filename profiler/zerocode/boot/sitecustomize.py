"""stallscope's start-up module for a program it launched (``stallscope run -- CMD``): loaded by the
interpreter at start-up because this directory is first on ``PYTHONPATH``. It runs any ``sitecustomize`` the
environment already had (the next one on ``sys.path``), then sets up the DataLoader timing in
``stallscope_instrument``. Nothing here may stop the program: any failure is one line on stderr.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the environment's own sitecustomize, the first one on sys.path after this directory."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_stallscope_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _boot() -> None:
    try:
        _chain()
    except Exception as exc:  # noqa: BLE001 - the environment's own start-up failed: as without stallscope
        sys.stderr.write(f"stallscope: the environment's sitecustomize failed: {type(exc).__name__}: {exc}\n")
    if _HERE not in sys.path:
        sys.path.append(_HERE)
    try:
        import stallscope_instrument

        stallscope_instrument.install()
    except Exception as exc:  # noqa: BLE001 - never stop the program for its profiler
        sys.stderr.write(f"stallscope: instrumentation steps aside ({type(exc).__name__}: {exc})\n")


_boot()
