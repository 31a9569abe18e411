"""Under the supervisor, SLURM's SIGTERM and SIGUSR2 leave vLLM's engine processes running.

vLLM's EngineCore and Worker processes install a SIGTERM handler that shuts the engine down, then
load vLLM's general plugins (plugin/slurm_signals.py). The fault battery on vLLM's CPU engine found
the failure mode: a preemption SIGTERM to the math job killed the EngineCore ("EngineCore: trigger
received signal=SIGTERM"), so no checkpoint came at the next step. Each case below runs in a fresh
interpreter, as vLLM's spawned processes do. It installs a handler like vLLM's, runs vLLM's own
plugin loader, then signals itself.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from importlib.metadata import entry_points

import pytest

from molt_flashreinforce.cluster.progress import PROGRESS_DIR_VARIABLE
from molt_flashreinforce.plugin.slurm_signals import SLURM_SIGNALS, ignore_slurm_signals

ENGINE_PROCESS = """
import os, signal, sys
def shut_down(signum, frame):  # as vLLM's run_engine_core and worker_main do
    sys.exit(3)
signal.signal(signal.SIGTERM, shut_down)
signal.signal(signal.SIGINT, shut_down)
from vllm.plugins import load_general_plugins
load_general_plugins()
for signum in (signal.SIGTERM, signal.SIGUSR2):
    os.kill(os.getpid(), signum)
print("still running")
"""


def handlers() -> dict:
    return {signum: signal.getsignal(signum) for signum in SLURM_SIGNALS}


def engine_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENGINE_PROCESS], env=env, capture_output=True, text=True, timeout=300)


def test_the_plugin_is_registered_with_vllm():
    (plugin,) = [point for point in entry_points(group="vllm.general_plugins")
                 if point.name == "molt_flashreinforce_slurm_signals"]
    assert plugin.load() is ignore_slurm_signals


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM's CPU build is not installed (scripts/setup_vllm.sh; the test set-up runs it)")
def test_vllms_plugin_loader_makes_an_engine_process_ignore_slurms_signals_under_the_supervisor(tmp_path):
    base = {key: value for key, value in os.environ.items() if key not in (PROGRESS_DIR_VARIABLE, "VLLM_PLUGINS")}
    supervised = engine_process({**base, PROGRESS_DIR_VARIABLE: str(tmp_path)})
    assert supervised.returncode == 0 and "still running" in supervised.stdout, supervised.stderr[-3000:]
    # Without the supervisor nothing changes: vLLM's own handler ends the process, as it did in the battery.
    alone = engine_process(base)
    assert alone.returncode == 3 and "still running" not in alone.stdout, alone.stderr[-3000:]


def test_outside_a_supervised_run_the_signals_are_left_alone(monkeypatch):
    monkeypatch.delenv(PROGRESS_DIR_VARIABLE, raising=False)
    before = handlers()
    ignore_slurm_signals()
    assert handlers() == before


def test_off_the_main_thread_it_does_nothing_and_raises_nothing(monkeypatch, tmp_path):
    """vLLM loads its plugins in the engine actor's own threads too (AsyncEngineArgs), where Python
    cannot set a handler: the plugin raised there once, and every engine actor failed to start."""
    monkeypatch.setenv(PROGRESS_DIR_VARIABLE, str(tmp_path))
    before, raised = handlers(), []

    def call() -> None:
        try:
            ignore_slurm_signals()
        except Exception as error:  # noqa: BLE001 - whatever it raises is the failure
            raised.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert raised == [] and handlers() == before
