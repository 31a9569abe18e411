"""The Molt versions this plugin is written against, checked before anything touches Molt.

The plugin reaches into Molt internals (registries, `PolicyTrainer`, the CLI's argparse
`choices`), so an untested Molt version fails loudly here instead of training wrongly.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_MOLT = ">=0.2.1,<0.3"
_LOWEST, _BELOW = (0, 2, 1), (0, 3)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_molt_version(installed: str | None = None) -> str:
    """Return the installed molt-rl version, or raise if it is missing or unsupported."""
    if installed is None:
        try:
            installed = metadata.version("molt-rl")
        except metadata.PackageNotFoundError:
            raise ImportError(
                f"molt-rl is not installed. Install molt-rl{SUPPORTED_MOLT} (GPU: pip install "
                "'molt-flashreinforce[molt]'; CPU: scripts/setup.sh installs it without its GPU dependencies)."
            ) from None
    release = _release(installed)
    if not (_LOWEST <= release and release[:2] < _BELOW):
        raise ImportError(
            f"molt-flashreinforce supports molt-rl{SUPPORTED_MOLT}, found molt-rl {installed}. "
            f"Install a supported version, e.g. pip install 'molt-rl{SUPPORTED_MOLT}'."
        )
    return installed
