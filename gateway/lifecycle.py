"""Start-up, self-healing and shutdown: Triton up, models loaded, golden answers checked; SIGTERM drains, then
stops Triton.

Child mode: a tritonserver that exits is restarted with backoff (at most --triton-restart-limit times per window,
then every model is failed with the reason), and its models go through loading → warming → ready again.
External mode (--triton-url), or an engine given to `create_app`: nothing is restarted; the engine's liveness is
tracked and the models are brought back when it returns. In both modes a model whose instance died (a
Python-backend stub missing from the process tree, or named dead by Triton in an error) is degraded and reloaded
through Triton's repository API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from .accelerator import accelerator_of, triton_is_local
from .inference import Inference
from .readiness import check_golden, prepare_heads
from .runtime import Runtime, ServedModel, apply_loaded_config
from .supervisor import TritonProcess, still_in_group, triton_preload
from .triton import Triton, TritonFailure

log = logging.getLogger("sr_gateway.lifecycle")

BACKOFF_CAP_SECONDS = 60.0
MODEL_RETRY_CAP_SECONDS = 300.0  # a model that keeps failing is tried again at least this often
UNLOAD_GRACE_SECONDS = 15.0  # how long the replaced instances of a reloaded model may take to exit


def expected_instances(config: dict[str, Any]) -> int:
    """Instances Triton runs for a model config (the sum of its instance groups; Triton's default is one)."""
    groups = config.get("instance_group") or [{}]
    return sum(int(g.get("count", 1) or 1) for g in groups)


class Lifecycle:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.process: TritonProcess | None = None
        self.task: asyncio.Task[None] | None = None
        self._bringing: dict[str, asyncio.Task[None]] = {}
        self._lost: dict[str, set[str]] = {}  # Triton model → instances Triton reported dead
        self._wake = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self._kill_reason: str | None = None  # set when the gateway itself kills tritonserver
        self._tries: dict[str, int] = {}  # failed bring-ups in a row, per model (the retry backoff's exponent)

    async def start(self) -> None:
        """Runs in the background so /health/live answers while models load."""
        metrics = self.runtime.metrics
        metrics.max_queue.set(self.runtime.settings.max_queue)
        # every series exists from the start (Prometheus sees 0, not nothing, until the first event)
        metrics.triton_last_exit.labels("").set(0)
        for model in self.runtime.models:
            for reason in ("instance_lost", "not_ready", "failed"):
                metrics.child(metrics.model_reloads, model, reason)
        given = self.runtime.inference is not None  # create_app(engine=...): that engine, never a child
        runner = self._track_external if self.runtime.settings.triton_url or given else self._supervise_child
        self.task = asyncio.create_task(runner())

    # -- Triton connection ------------------------------------------------------------------------------------
    def _connect(self, url: str) -> Inference:
        old = self.runtime.inference
        self.runtime.inference = Inference(Triton(url, on_instance_lost=self._instance_lost))
        if old is not None:
            asyncio.create_task(old.close())  # noqa: RUF006 - in-flight calls on it fail as unavailable
        return self.runtime.inference

    def _instance_lost(self, model: str, instance: str) -> None:
        self._lost.setdefault(model, set()).add(instance)
        self._wake.set()

    def _set_live(self, live: bool) -> None:
        self.runtime.triton_health["live"] = live
        self.runtime.metrics.triton_up.set(1 if live else 0)

    def _all_back_to(self, status: str, reason: str) -> None:
        """Every model waits for Triton again (requests get 503 not_ready with Retry-After meanwhile)."""
        self._cancel_bring_up()
        for model in self.runtime.models.values():
            self.runtime.set_status(model, status, reason)

    def _cancel_bring_up(self) -> None:
        for task in self._bringing.values():
            task.cancel()
        self._bringing.clear()
        self._lost.clear()

    def _bring_up_all(self) -> None:
        for model in self.runtime.models.values():
            self._bring_up_later(model)

    def _bring_up_later(self, model: ServedModel, *, reload: bool = False, retry: bool = False) -> None:
        if model.id not in self._bringing or self._bringing[model.id].done():
            self._bringing[model.id] = asyncio.create_task(self._bring_up(model, reload=reload, retry=retry))

    def _retry_later(self, model: ServedModel) -> None:
        """A failed model is tried again with backoff (--model-retry-s, doubling, at most
        MODEL_RETRY_CAP_SECONDS): a load that failed on a transient cause heals without a restart. It stays
        `failed` meanwhile, so a model that keeps failing keeps the process on its way to failing liveness."""
        base = self.runtime.settings.model_retry_s
        if base <= 0 or self._stopping:
            return
        tries = self._tries[model.id] = self._tries.get(model.id, 0) + 1
        delay = min(base * 2 ** (tries - 1), MODEL_RETRY_CAP_SECONDS)
        self.runtime.set_status(model, "failed", f"{model.reason}; trying again in {delay:g} s (try {tries + 1})")
        self.runtime.metrics.child(self.runtime.metrics.model_reloads, model.id, "failed").inc()

        async def later() -> None:
            await asyncio.sleep(delay)
            if model.status == "failed" and self.runtime.triton_health["live"]:
                self._bring_up_later(model, retry=True)
        self._bringing[f"{model.id} retry"] = asyncio.create_task(later())

    # -- child mode -------------------------------------------------------------------------------------------
    async def _supervise_child(self) -> None:
        settings = self.runtime.settings
        recent: deque[float] = deque()
        preload = triton_preload(settings.triton_allocator)  # once: every restart runs the same allocator
        while not self._stopping:
            self.process = TritonProcess(settings.model_repository, grpc_port=settings.triton_grpc_port,
                                         threads=settings.threads, metrics_port=settings.triton_metrics_port,
                                         metrics_address=settings.triton_metrics_address, preload=preload)
            try:
                await self.process.start()
                inference = self._connect(self.process.url)
                await inference.engine.wait_live(settings.triton_startup_s)
            except (TritonFailure, OSError, RuntimeError) as exc:
                log.error("Triton did not start: %s", exc)
                await self.process.stop(5.0)
                reason = f"Triton did not start: {exc}"
                if not recent:  # never came up at all: nothing to heal
                    self.runtime.fail_all(reason)
                    return
            else:
                self._set_live(True)
                self._bring_up_all()
                self._watch = asyncio.create_task(self._watch_models())
                assert self.process.exited is not None
                code = await self.process.exited
                self._watch.cancel()
                self._set_live(False)
                self._cancel_bring_up()  # loads in flight would only fail against the dead Triton and be retried
                await self.process.gone()  # no restart, and no `failed`, while its old stubs still hold memory
                if self._stopping:
                    return
                reason = self._kill_reason or f"tritonserver exited with code {code}"
                self._kill_reason = None
                self.runtime.triton_health["last_exit"] = reason
                self.runtime.metrics.triton_exited(reason)
                log.error("%s", reason)
            now = time.monotonic()
            recent.append(now)
            while recent and recent[0] < now - settings.triton_restart_window_s:
                recent.popleft()
            if len(recent) > settings.triton_restart_limit:
                self._cancel_bring_up()
                self.runtime.fail_all(f"{reason}; not restarted again: {settings.triton_restart_limit} restarts "
                                      f"within {settings.triton_restart_window_s:g} s")
                return
            delay = min(settings.triton_restart_backoff_s * 2 ** (len(recent) - 1), BACKOFF_CAP_SECONDS)
            self._all_back_to("loading", f"{reason}; restarting it in {delay:.1f} s")
            await asyncio.sleep(delay)
            self.runtime.triton_health["restarts"] += 1
            self.runtime.metrics.triton_restarts.inc()

    # -- external mode ----------------------------------------------------------------------------------------
    async def _track_external(self) -> None:
        """Never restarts anything: follows the engine's liveness, answers 503 while it is away, recovers after."""
        settings = self.runtime.settings
        engine = (self.runtime.inference or self._connect(settings.triton_url)).engine
        up: bool | None = None
        while not self._stopping:
            live = await engine.is_live()
            if live and not up:
                self._set_live(True)
                self._bring_up_all()
                self._watch = asyncio.create_task(self._watch_models())
            elif not live and up is not False:
                self._set_live(False)
                if self._watch is not None:
                    self._watch.cancel()
                self._all_back_to("loading", f"Triton at {engine.url} is not live; waiting for it")
            up = live
            await asyncio.sleep(settings.triton_check_s)

    # -- model health -----------------------------------------------------------------------------------------
    async def _watch_models(self) -> None:
        """Ready models must stay loaded with all their instances; the others are brought up again."""
        interval = self.runtime.settings.triton_check_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            assert self.runtime.inference is not None
            engine = self.runtime.inference.engine
            running = self.process.instances() if self.process is not None else None
            for model in list(self.runtime.models.values()):
                if model.status != "ready" or self._busy(model):
                    continue
                name = model.card.triton_name
                expected = int(model.engine_args.get("instances", 1))
                lost = sorted(self._lost.pop(name, set()))
                # child mode counts the stubs (a report may name an instance already replaced); external mode
                # has only Triton's reports
                alive = running.get(name, []) if running is not None else None
                have = len(alive) if alive is not None else max(expected - len(lost), 0)
                if have < expected:
                    named = f" (Triton reported {', '.join(lost)} dead)" if lost else ""
                    why = f"{have} of {expected} Triton instances running{named}; reloading it"
                    log.warning("model %s: %s", model.id, why)
                    self.runtime.set_status(model, "degraded", why)
                    self.runtime.metrics.child(self.runtime.metrics.model_reloads, model.id, "instance_lost").inc()
                    self._bring_up_later(model, reload=True)
                elif not await engine.is_ready(name):
                    log.warning("model %s is no longer ready in Triton; loading it again", model.id)
                    self.runtime.set_status(model, "loading", "Triton no longer has the model loaded; loading it")
                    self.runtime.metrics.child(self.runtime.metrics.model_reloads, model.id, "not_ready").inc()
                    self._bring_up_later(model)

    def _busy(self, model: ServedModel) -> bool:
        task = self._bringing.get(model.id)
        return task is not None and not task.done()

    async def _bring_up(self, model: ServedModel, *, reload: bool = False, retry: bool = False) -> None:
        """Load (or reload), warm up and check the golden answers. A retry of a failed model keeps its status
        `failed` until it passes."""
        runtime = self.runtime
        inference = runtime.inference
        assert inference is not None
        engine = inference.engine
        replaced: set[int] = set()
        try:
            if not reload:
                if not retry:
                    runtime.set_status(model, "loading")
                model.load_tokenizer()
                await engine.load(model.card.triton_name)
            else:
                replaced = self.process.stub_pids(model.card.triton_name) if self.process is not None else set()
                await engine.reload(model.card.triton_name)
            config = await engine.model_config(model.card.triton_name)
            inference.adopt(model.card.triton_name, config)  # rows per request, as this load declares
            apply_loaded_config(model, config)  # the engine, precision and tolerance of what Triton loaded
            model.output = next(o["name"] for o in config.get("output", []) if o["name"] != "TIMING")
            model.engine_args = {
                "triton_model": model.card.triton_name, "backend": config.get("backend"),
                "max_batch_size": config.get("max_batch_size"),
                "dynamic_batching": config.get("dynamic_batching", {}),
                "instance_group": config.get("instance_group", []),
                "instances": expected_instances(config),
            }
            model.accelerator = await asyncio.to_thread(  # once per load: /proc/cpuinfo or nvidia-smi
                accelerator_of, config, str(model.engine.get("precision", "fp32")),
                triton_is_local(runtime.settings.triton_url))
            if not retry:
                runtime.set_status(model, "warming", model.reason if reload else None)
            # probe the tokenizer's cut rules once (models that read no text have no tokenizer)
            await asyncio.to_thread(lambda: model.text_encoder().facts if model.tokenizer is not None else None)
            await prepare_heads(runtime, model)
            await check_golden(runtime, model)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is this model's reason, the process keeps serving
            if not runtime.triton_health["live"]:
                return  # Triton went away meanwhile; the supervisor owns the statuses now
            log.error("model %s failed: %s", model.id, exc)
            if model.status == "warming":  # it got as far as its golden check
                model.golden = {**model.golden, "status": "failed"}
            runtime.set_status(model, "failed", f"{type(exc).__name__}: {exc}")
            self._retry_later(model)
            return
        self._tries.pop(model.id, None)
        self._lost.pop(model.card.triton_name, None)  # errors from the replaced instances are old news
        if self.process is not None:
            self.process.forget_stubs()
        runtime.set_status(model, "ready")
        if replaced:
            self._bringing[f"{model.id} unload"] = asyncio.create_task(self._await_unload(model, replaced))
        labels = (model.id, model.card.revision or "", model.card.family, "triton/onnxruntime", "cpu",
                  model.card.numerics)
        runtime.metrics.model_info.labels(*labels).set(1)
        log.info("model %s is ready", model.id)

    async def _await_unload(self, model: ServedModel, replaced: set[int]) -> None:
        """The replaced instances must exit. They cannot when the dead one held a request: Triton never completes
        it, so that generation never unloads (and the request's client waits for good). Child mode then restarts
        tritonserver, which fails those requests and leaves nothing behind."""
        process = self.process
        assert process is not None
        deadline = time.monotonic() + UNLOAD_GRACE_SECONDS
        while time.monotonic() < deadline:
            if process.pgid is None or not still_in_group(replaced, process.pgid):
                return
            await asyncio.sleep(0.2)
        self._kill_reason = (f"restarted by the gateway: the replaced instances of model {model.id} did not unload "
                             f"within {UNLOAD_GRACE_SECONDS:g} s (a request was lost with the dead instance)")
        log.error("%s", self._kill_reason)
        process.kill()

    async def stop(self) -> None:
        self._stopping = True
        self.runtime.draining = True
        self._cancel_bring_up()
        if self._watch is not None:
            self._watch.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.runtime.inference is not None:
            await self.runtime.inference.close()
        if self.process is not None:
            await self.process.stop()
