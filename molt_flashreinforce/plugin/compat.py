"""The Molt versions this plugin was tested with, checked before anything touches Molt.

    check_molt_version(installed=None) -> the installed molt-rl version

The plugin reaches into Molt's internals, so it runs only on a molt-rl the
suite ran against (`TESTED_MOLT`); any other refuses in one line (`UnsupportedMolt`). A user who
accepts the risk names the installed version in `ACCEPT_VARIABLE`; the run then goes on and every
process that checks says so on stderr, once.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

TESTED_MOLT = ("0.2.1",)
ACCEPT_VARIABLE = "MOLT_FLASHREINFORCE_ACCEPT_UNTESTED_MOLT"
_warned: set[str] = set()


class UnsupportedMolt(ImportError):
    """molt-rl is missing, or a version the plugin was not tested with (the message is one line)."""


def tested_versions() -> str:
    return ", ".join(f"molt-rl {version}" for version in TESTED_MOLT)


def check_molt_version(installed: str | None = None, environ=None) -> str:
    """Return the installed molt-rl version; raise `UnsupportedMolt` unless it was tested or accepted."""
    if installed is None:
        try:
            installed = metadata.version("molt-rl")
        except metadata.PackageNotFoundError:
            raise UnsupportedMolt(
                f"molt-rl is not installed; install molt-rl=={TESTED_MOLT[-1]} (GPU: pip install "
                "'molt-flashreinforce[molt]'; CPU: scripts/setup.sh installs it without its GPU dependencies)"
            ) from None
    if installed in TESTED_MOLT:
        return installed
    accepted = (os.environ if environ is None else environ).get(ACCEPT_VARIABLE)
    if accepted != installed:
        raise UnsupportedMolt(
            f"molt-flashreinforce is tested with {tested_versions()} and found molt-rl {installed}: install "
            f"molt-rl=={TESTED_MOLT[-1]}, or accept the risk with {ACCEPT_VARIABLE}={installed}"
            + (f" ({ACCEPT_VARIABLE}={accepted} names another version)" if accepted else "")
        )
    if installed not in _warned:
        _warned.add(installed)
        print(f"molt-flashreinforce: WARNING: UNTESTED MOLT: running on molt-rl {installed} because "
              f"{ACCEPT_VARIABLE}={installed}; the plugin was tested with {tested_versions()} only and reaches "
              "into Molt's internals, so training may be silently wrong", file=sys.stderr, flush=True)
    return installed
