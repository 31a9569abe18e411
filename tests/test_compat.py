"""Supported Molt = tested Molt: the gate accepts the versions the suite ran against and refuses any
other in one line, unless the user names the installed version in the override, which is printed."""

from __future__ import annotations

import pytest

from molt_flashreinforce.plugin import compat
from molt_flashreinforce.plugin.compat import ACCEPT_VARIABLE, TESTED_MOLT, UnsupportedMolt, check_molt_version


def test_the_tested_versions_pass():
    assert TESTED_MOLT == ("0.2.1",)
    for version in TESTED_MOLT:
        assert check_molt_version(version, environ={}) == version


@pytest.mark.parametrize("version", ["0.2.0", "0.2.9", "0.2.1.post1", "0.2.10rc1", "0.3.0", "1.0"])
def test_other_versions_are_refused_in_one_line_naming_the_tested_ones_and_the_override(version):
    with pytest.raises(UnsupportedMolt) as refused:
        check_molt_version(version, environ={})
    message = str(refused.value)
    assert "\n" not in message
    assert f"tested with molt-rl 0.2.1 and found molt-rl {version}" in message
    assert f"install molt-rl==0.2.1, or accept the risk with {ACCEPT_VARIABLE}={version}" in message


def test_the_override_names_the_installed_version_and_is_printed_once(capsys, monkeypatch):
    monkeypatch.setattr(compat, "_warned", set())
    accepted = {ACCEPT_VARIABLE: "0.2.9"}
    assert check_molt_version("0.2.9", environ=accepted) == "0.2.9"
    assert check_molt_version("0.2.9", environ=accepted) == "0.2.9"
    err = capsys.readouterr().err
    assert err.count("WARNING: UNTESTED MOLT: running on molt-rl 0.2.9") == 1 and "tested with molt-rl 0.2.1" in err
    with pytest.raises(UnsupportedMolt, match=f"{ACCEPT_VARIABLE}=0.2.9 names another version"):
        check_molt_version("0.2.10", environ=accepted)


def test_the_installed_molt_is_supported():
    assert check_molt_version() == "0.2.1"


def test_the_stock_clis_runtime_env_hook_checks_the_version_and_forwards_an_acceptance(monkeypatch, capsys):
    from molt_flashreinforce.plugin import ray_hooks, seams

    monkeypatch.setattr(compat.metadata, "version", lambda name: "0.2.9")
    monkeypatch.setattr(seams, "install", lambda parts: seams.check())  # the wrapping itself: its own tests
    seams._checked.cache_clear()  # a process checks once; this test changes what it would find
    monkeypatch.delenv(ACCEPT_VARIABLE, raising=False)
    with pytest.raises(UnsupportedMolt, match="found molt-rl 0.2.9"):
        ray_hooks.runtime_env_hook(None)
    monkeypatch.setenv(ACCEPT_VARIABLE, "0.2.9")
    runtime_env = ray_hooks.runtime_env_hook({"env_vars": {"A": "1"}})
    assert runtime_env["env_vars"] == {"A": "1", ACCEPT_VARIABLE: "0.2.9"}  # every worker checks it again
    seams._checked.cache_clear()
