"""Loads the native core (torchrpc._C) once and keeps the load error.

Every entry point that needs the core calls :func:`native`, which raises an
ImportError naming the cause and how to rebuild, chained to the original error.
"""

_C = None
_LOAD_ERROR = None

try:
    import torch  # noqa: F401  (loads libtorch before our extension)
    from torchrpc import _C  # type: ignore[attr-defined,no-redef]
except ImportError as err:  # pragma: no cover - depends on the build
    _LOAD_ERROR = err


def native():
    """Returns the native module or raises an actionable ImportError."""
    if _C is None:
        import torch

        raise ImportError(
            "torchrpc's native core (torchrpc._C) could not be loaded: "
            f"{_LOAD_ERROR}. It must be built against the installed torch "
            f"({torch.__version__}); rebuild it with "
            "`MAX_JOBS=2 pip install --no-build-isolation -e .` (or `make build`)."
        ) from _LOAD_ERROR
    return _C
