"""Run evaluation samples through the experiment's agent exactly as Molt's rollouts run.

Contract: ``eval_sampling_params(protocol)`` is the sampling Molt's eval requests
(``SamplesGenerator._dispatch_to_agent_runners``: the protocol's temperature, top-p and token
cap, top-k off, at least one token, special tokens kept). ``await run_samples(tasks, runner,
engine_url, ...)`` runs each ``SampleTask`` as one ``runner.execute(prompt, label, sampling,
max_length, tokenizer, client)``, the call Molt's ``AgentRunnerActor.run_group`` makes, with
Molt's own ``RouterGenerateClient`` over one aiohttp session to vLLM's server (token-in /
token-out ``/inference/v1/generate``; the agent decodes, grades, runs its tools). At most
``concurrency`` samples are in flight; each finished one goes to ``on_sample(record)`` at once.
A sample whose episode raises stops the run: ``SampleError`` names it, after the samples in
flight have finished (they are kept, so a rerun redoes only the failed one and those never started).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Callable

from molt_flashreinforce.eval_record import Protocol
from molt_flashreinforce.evaluation.samples import SampleTask, sample_record


class SampleError(RuntimeError):
    """An episode that raised (the engine went away, the agent failed)."""


def eval_sampling_params(protocol: Protocol) -> SimpleNamespace:
    # The attributes Molt's client and StepEnvRunner read from vLLM's SamplingParams. No log-probs:
    # the eval trains nothing (Molt's eval asks for them only when the IS correction is on, and
    # its client requests one per token regardless).
    return SimpleNamespace(temperature=protocol.temperature, top_p=protocol.top_p, top_k=-1,
                           max_tokens=protocol.max_tokens, min_tokens=1, skip_special_tokens=False, logprobs=None)


async def run_samples(tasks: list[SampleTask], runner, engine_url: str, *, tokenizer, protocol: Protocol,
                      max_length: int, agent_kind: str | None, concurrency: int,
                      on_sample: Callable[[dict], None]) -> None:
    import aiohttp
    from molt.trainer.rollout.router import RouterGenerateClient

    sampling = eval_sampling_params(protocol)
    queue: asyncio.Queue[SampleTask] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    failures: list[tuple[SampleTask, BaseException]] = []

    def decode(tokens: list[int]) -> str:
        return tokenizer.decode(tokens, skip_special_tokens=False)

    # As Molt's AgentRunnerActor: no timeout (a long generation and a wedged one look the same
    # from here, and a retry would start over) and no cap on connections.
    async with aiohttp.ClientSession(base_url=engine_url, timeout=aiohttp.ClientTimeout(total=None),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        client = RouterGenerateClient(http)

        async def worker() -> None:
            while not failures:
                try:
                    task = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    trajectory = await runner.execute(task.prompt, task.label, sampling, max_length, tokenizer, client)
                    record = sample_record(task, trajectory, decode, agent_kind)
                except Exception as error:  # noqa: BLE001 - reported with the sample's name below
                    failures.append((task, error))
                    return
                on_sample(record)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    if failures:
        task, error = failures[0]
        raise SampleError(f"sample {task.sample_index} of {task.benchmark} problem {task.problem_id} failed: "
                          f"{type(error).__name__}: {error}") from error
