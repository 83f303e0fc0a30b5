"""The simulated replica: engine ranks, their GPUs, metrics, answers and faults.

:class:`Simulator` turns an OpenAI request body into a scheduled :class:`Request` on the least
loaded live rank (as vLLM's data-parallel coordinator does) and applies faults. The HTTP layer
(:mod:`inferwatch.sim.openai_api`, :mod:`inferwatch.sim.server`) sits on top.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.capacity import planner as cap
from inferwatch.logs import log_event
from inferwatch.sim import coldstart
from inferwatch.sim import faults as fault_doc
from inferwatch.sim.answers import EOS, Answer, AnswerBook, chat_tokens, pieces, text_tokens
from inferwatch.sim.engine import Engine, Event, SimClock
from inferwatch.sim.gpu import NON_FATAL_XIDS, SimulatedGPU, gpu_uuid, render_dcgm
from inferwatch.sim.metrics import VllmMetrics
from inferwatch.sim.scheduler import Request
from inferwatch.sim.specdecode import Drafter

VLLM_VERSION = "0.33.0"

logger = logging.getLogger("inferwatch.sim")


@dataclass(frozen=True)
class SimConfig:
    """Everything a simulated replica is made of; the CLI flags map one to one."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    #: the names the API answers to, as vLLM's ``--served-model-name a b``: replies and metrics
    #: carry the first; empty: the model's own name
    served_model_names: tuple[str, ...] = ()
    gpu: str = "H100"
    tensor_parallel: int = 1
    engine_ranks: int = 1  # data-parallel engine cores (the `engine` label)
    gpu_memory_utilization: float = 0.92
    block_size: int = 16
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    weight_dtype: str | None = None
    kv_cache_dtype: str = "auto"
    num_gpu_blocks: int | None = None  # like vLLM's --num-gpu-blocks-override
    batching: str = "continuous"  # or "static"
    enable_prefix_caching: bool = True
    speed: float = 1.0
    seed: int = 0
    goldens: Path | None = None  # folder of golden YAML files; None: the shipped ones
    faults: Mapping[str, Any] | None = None
    admin_token: str | None = None
    hostname: str = "inferwatch-sim"
    host: str = "127.0.0.1"
    port: int = 8000
    gpu_port: int | None = None  # also serve the DCGM endpoint on its own port
    storage_bandwidth: float = 0.0  # bytes/s the weights load at; 0: loaded at once
    graph_capture_seconds: float = 0.0  # first step of each batch shape costs this much more
    num_speculative_tokens: int = 0  # draft tokens per decode step; 0: no speculative decoding
    draft_acceptance: float = 0.8  # the draft's first-position acceptance on an idle engine


class ApiError(Exception):
    """A request the API refuses, with the HTTP status and OpenAI error type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass
class Job:
    """A request accepted by the API and where its tokens will come from."""

    id: str
    request: Request
    engine: Engine
    stream: asyncio.Queue[Event] | None = None
    tool_call_name: str | None = None  # the reply is this tool call, arguments as tokens


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    if content is None:
        return ""
    raise ApiError(400, "message content must be a string or a list of text parts")


def _int_field(body: Mapping[str, Any], key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"{key} must be an integer of at least {low}")
    return value


class Simulator:
    def __init__(self, config: SimConfig) -> None:
        """Size the replica with the capacity model; raises CapacityError/FaultError."""
        self.config = config
        model = cap.model_preset(config.model)
        self.served_names = config.served_model_names or (model.name,)
        self.model_name = self.served_names[0]
        gpu = cap.gpu_preset(config.gpu)
        serving = cap.ServingSpec(
            tensor_parallel=config.tensor_parallel,
            gpu_memory_utilization=config.gpu_memory_utilization,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            weight_dtype=config.weight_dtype,
            kv_cache_dtype=config.kv_cache_dtype,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.capacity = cap.compute(model, gpu, serving)
        self.num_blocks = config.num_gpu_blocks or self.capacity.num_blocks
        self.clock = SimClock(config.speed)
        checkpoint = self.capacity.weight_bytes * config.tensor_parallel
        self.load_seconds = coldstart.load_seconds(checkpoint, config.storage_bandwidth)
        self.book = AnswerBook.from_dir(config.goldens, config.seed)
        self._rng = random.Random(config.seed)
        self._turns = itertools.count()
        cache_info = {
            rank: {
                "block_size": str(config.block_size),
                "cache_dtype": config.kv_cache_dtype,
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "gpu_memory_utilization": str(config.gpu_memory_utilization),
                "num_gpu_blocks": str(self.num_blocks),
                "num_gpu_blocks_override": str(config.num_gpu_blocks),
                "kv_cache_memory_bytes": str(self.capacity.kv_bytes),
                "kv_cache_size_tokens": str(self.num_blocks * config.block_size),
                "kv_cache_max_concurrency": str(
                    round(
                        self.num_blocks
                        / self.capacity.blocks_per_sequence(self.capacity.max_model_len),
                        2,
                    )
                ),
            }
            for rank in range(config.engine_ranks)
        }
        self.metrics = VllmMetrics(
            self.model_name, self.capacity.max_model_len, cache_info, config.num_speculative_tokens
        )
        allocated = self.capacity.budget_bytes - self.capacity.reserve_bytes
        self.gpus = [
            SimulatedGPU(
                index=i,
                spec=gpu,
                uuid=gpu_uuid(f"{config.hostname}:{config.port}", i),
                hostname=config.hostname,
                allocated_bytes=allocated,
                activation_bytes=self.capacity.reserve_bytes,
            )
            for i in range(config.engine_ranks * config.tensor_parallel)
        ]
        tp = config.tensor_parallel
        self.engines = [
            Engine(
                rank,
                self.capacity,
                self.num_blocks,
                static_batching=config.batching == "static",
                enable_prefix_caching=config.enable_prefix_caching,
                metrics=self.metrics.ranks[rank],
                gpus=self.gpus[rank * tp : (rank + 1) * tp],
                clock=self.clock,
                graphs=coldstart.GraphCache(config.graph_capture_seconds),
                drafter=self._drafter(rank),
            )
            for rank in range(config.engine_ranks)
        ]
        self.faults = fault_doc.Faults()
        self.apply_faults(config.faults)
        self._tasks: list[asyncio.Task[None]] = []

    def _drafter(self, rank: int) -> Drafter | None:
        k = self.config.num_speculative_tokens
        if not k:
            return None
        rng = random.Random(f"{self.config.seed}:spec:{rank}")
        return Drafter(k, self.config.draft_acceptance, rng)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine tasks on the running event loop."""
        self._tasks = [asyncio.create_task(e.run(), name=f"engine-{e.rank}") for e in self.engines]
        if self.loading:
            self._tasks.append(asyncio.create_task(self._load(), name="load-weights"))

    async def _load(self) -> None:
        """Log the load of the weights, as vLLM logs "Loading weights took ..."."""
        log_event(
            logger, logging.INFO, "loading model weights", seconds=round(self.load_seconds, 2)
        )
        while self.loading:
            await asyncio.sleep((self.load_seconds - self.clock.now()) / self.clock.speed + 0.001)
        log_event(logger, logging.INFO, "model loaded", seconds=round(self.load_seconds, 2))

    async def stop(self) -> None:
        for engine in self.engines:
            engine.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # --- health and faults ----------------------------------------------------------------------
    @property
    def loading(self) -> bool:
        """Still reading the weights (simulated time since start < load time)."""
        return self.clock.now() < self.load_seconds

    @property
    def healthy(self) -> bool:
        return not self.loading and not self.faults.hang and any(not e.dead for e in self.engines)

    def apply_faults(self, document: Any) -> None:
        """Merge a fault document (raises FaultError before changing anything)."""
        faults, events = fault_doc.parse(document, self.faults, len(self.gpus))
        self.faults = faults
        for event in events:
            self._gpu_event(event)
        for engine in self.engines:
            engine.set_faults(faults)

    def clear_faults(self) -> None:
        """No faults; GPUs as they started; dead engines restarted."""
        self.faults = fault_doc.Faults()
        for gpu in self.gpus:
            gpu.clear_faults()
        for engine in self.engines:
            engine.set_faults(self.faults)
            engine.revive()

    def _gpu_event(self, event: fault_doc.GpuEvent) -> None:
        gpu = self.gpus[event.index]
        gpu.ecc_sbe += event.ecc_sbe
        gpu.ecc_dbe += event.ecc_dbe
        gpu.remapped_correctable += event.remapped_correctable
        gpu.remapped_uncorrectable += event.remapped_uncorrectable
        if event.remap_pending is not None:
            gpu.remap_pending = event.remap_pending
        if event.remap_failure is not None:
            gpu.remap_failure = event.remap_failure
        if event.xid is not None:
            gpu.xid = event.xid
            if event.xid not in NON_FATAL_XIDS:
                self.engines[event.index // self.config.tensor_parallel].kill()

    def faults_state(self) -> dict[str, Any]:
        return {
            **self.faults.as_dict(),
            "gpu": [
                {
                    "index": g.index,
                    "xid": g.xid,
                    "ecc_sbe": g.ecc_sbe,
                    "ecc_dbe": g.ecc_dbe,
                    "remapped_correctable": g.remapped_correctable,
                    "remapped_uncorrectable": g.remapped_uncorrectable,
                    "remap_pending": g.remap_pending,
                    "remap_failure": g.remap_failure,
                }
                for g in self.gpus
            ],
            "dead_engines": [e.rank for e in self.engines if e.dead],
        }

    def dcgm_text(self) -> str:
        return render_dcgm(self.gpus, self.clock.now())

    # --- requests -------------------------------------------------------------------------------
    def prepare(self, body: Any, chat: bool) -> Job:
        """Validate an OpenAI request and plan its reply; raises ApiError."""
        if self.loading:
            raise ApiError(503, "the model is still loading", "ServiceUnavailableError")
        if not isinstance(body, Mapping):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model", self.model_name)
        if model not in self.served_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n=1 is supported")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list")
            turns = []
            for message in messages:
                if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                    raise ApiError(400, "each message must be an object with a role")
                turns.append(
                    {"role": message["role"], "content": _message_text(message.get("content"))}
                )
            prompt = chat_tokens(turns)
            users = [t["content"] for t in turns if t["role"] == "user"]
            question = users[-1] if users else turns[-1]["content"]
            limit = _int_field(body, "max_completion_tokens", 1) or _int_field(
                body, "max_tokens", 1
            )
        else:
            raw = body.get("prompt")
            if isinstance(raw, list) and len(raw) == 1:
                raw = raw[0]
            if not isinstance(raw, str):
                raise ApiError(400, "prompt must be a string (or a list of one string)")
            prompt, question = text_tokens(raw), raw
            limit = _int_field(body, "max_tokens", 1) or 16  # the OpenAI default for completions
        max_len = self.capacity.max_model_len
        max_tokens = limit if limit is not None else max_len - len(prompt)
        if len(prompt) + max_tokens > max_len or max_tokens < 1:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion.",
            )
        degenerate = None
        if (
            self.faults.degenerate
            and max_tokens >= self.faults.degenerate_min_tokens
            and self._rng.random() < self.faults.degenerate_rate
        ):
            degenerate = self.faults.degenerate
        tools = body.get("tools")
        tools_offered = chat and bool(tools) and body.get("tool_choice") != "none"
        answer = self.book.answer(
            question,
            tools_offered=tools_offered,
            max_tokens=max_tokens,
            ignore_eos=bool(body.get("ignore_eos")),
            degenerate=degenerate,
        )
        planned, finish_reason = self._plan(answer, max_tokens)
        request_id = (
            f"{'chatcmpl' if chat else 'cmpl'}-{uuid.UUID(int=self._rng.getrandbits(128)).hex}"
        )
        request = Request(
            id=request_id,
            prompt=prompt,
            planned=planned,
            finish_reason=finish_reason,
            max_tokens=max_tokens,
        )
        engine = self._route()
        name = answer.tool_call.name if answer.tool_call else None
        return Job(request_id, request, engine, tool_call_name=name)

    def _route(self) -> Engine:
        """The least-loaded live rank; ties go round-robin."""
        turn = next(self._turns)
        count = len(self.engines)
        live = [e for e in self.engines if not e.dead] or self.engines
        return min(live, key=lambda e: (e.load, (e.rank - turn) % count))

    @staticmethod
    def _plan(answer: Answer, max_tokens: int) -> tuple[Sequence[str], str]:
        planned: list[str] = (
            pieces(answer.tool_call.arguments) if answer.tool_call else list(answer.pieces)
        )
        if len(planned) >= max_tokens:
            return planned[:max_tokens], "length"
        if answer.natural_end:
            return [*planned, EOS], "stop"
        return planned, "length"

    def submit(self, job: Job) -> None:
        """Queue the job, or raise ApiError(500) for an injected error or a dead engine."""
        if job.engine.dead:
            job.engine.metrics.success["error"].inc()
            raise ApiError(500, "the engine is dead (GPU failure)", "InternalServerError")
        if self.faults.error_rate and self._rng.random() < self.faults.error_rate:
            job.engine.metrics.success["error"].inc()
            raise ApiError(500, "injected engine error", "InternalServerError")
        job.stream = job.engine.submit(job.request)
