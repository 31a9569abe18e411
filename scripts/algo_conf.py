"""Writes `conf/algo/<algorithm>.yaml` from the settings in `molt_flashreinforce/algo_settings.py`.

    python scripts/algo_conf.py            # rewrite both files
    python scripts/algo_conf.py --check    # exit 1 naming a file that differs (tests/test_algo_settings.py)

Each setting becomes its help text as the comment above the key and its source tags as the key's
inline comment, which docs/hyperparameters.md cites (scripts/hyperparameters.py).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from molt_flashreinforce.algo_settings import ALGORITHMS, HEADERS, SETTINGS

CONF = Path(__file__).resolve().parents[1] / "molt_flashreinforce" / "conf" / "algo"
WIDTH = 100


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, WIDTH - 2)] if text else []


def render(algorithm: str) -> str:
    lines = [*_comment(HEADERS[algorithm]), "# Generated from molt_flashreinforce/algo_settings.py by "
             "scripts/algo_conf.py; edit the settings there.", f"name: {algorithm}"]
    for setting in SETTINGS[algorithm]:
        lines += _comment(setting.help)
        lines.append(f"{setting.name}: {setting.yaml_value()}" + (f" # {setting.source}" if setting.source else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    stale = []
    for algorithm in ALGORITHMS:
        path = CONF / f"{algorithm}.yaml"
        text = render(algorithm)
        if "--check" in sys.argv:
            if path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        sys.exit(f"stale: {', '.join(stale)}; run python scripts/algo_conf.py")


if __name__ == "__main__":
    main()
