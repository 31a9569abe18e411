"""Hydra SearchPathPlugin: makes molt-flashreinforce's config groups visible to any Hydra app.

Hydra 1.3 discovers plugins by scanning the `hydra_plugins` namespace package (which therefore has
no `__init__.py`). With this package installed, another app can use our groups, for example
`defaults: [algo: flashreinforce]` or `+algo=grpo` on its command line.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

SEARCH_PATH = "pkg://molt_flashreinforce.conf"


class MoltFlashReinforceSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Appended: an app's own groups win over ours when both define one.
        search_path.append(provider="molt-flashreinforce", path=SEARCH_PATH)
