"""The ground truth inside a Molt dataset label.

With ``--data.label_key reward_model`` Molt hands the agent the row's ``reward_model`` value,
``{"ground_truth": ...}``; a plain string label (``--data.label_key answer``) is the answer itself.
"""

from __future__ import annotations

from typing import Any


def ground_truth(label: Any) -> str:
    if isinstance(label, dict):
        if "ground_truth" not in label:
            raise ValueError(
                f"Label {label!r} has no 'ground_truth': prepare the data with molt-flashreinforce-data "
                "and pass --data.label_key reward_model."
            )
        label = label["ground_truth"]
    if isinstance(label, (list, tuple)) and len(label) == 1:
        label = label[0]
    if not isinstance(label, (str, int, float)) or isinstance(label, bool) or str(label).strip() == "":
        raise ValueError(f"Unusable ground truth {label!r}: expected a non-empty answer string.")
    return str(label)
