"""The supported Molt range is enforced before the plugin touches Molt internals."""

from __future__ import annotations

import pytest

from molt_flashreinforce.plugin.compat import SUPPORTED_MOLT, check_molt_version


@pytest.mark.parametrize("version", ["0.2.1", "0.2.9", "0.2.1.post1", "0.2.10rc1"])
def test_supported_versions_pass(version):
    assert check_molt_version(version) == version


@pytest.mark.parametrize("version", ["0.2.0", "0.1.6", "0.3.0", "1.0", "0.3.0rc1"])
def test_other_versions_name_the_supported_range(version):
    with pytest.raises(ImportError, match=f"supports molt-rl{SUPPORTED_MOLT}, found molt-rl {version}"):
        check_molt_version(version)


def test_the_installed_molt_is_supported():
    assert check_molt_version() == "0.2.1"
