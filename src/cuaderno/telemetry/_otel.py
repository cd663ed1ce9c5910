"""Which OpenTelemetry tracer and metric instruments to use now: the providers given to
:func:`configure`, else the global ones, looked up on every call and cached per provider object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Generic, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.trace import Tracer, TracerProvider

from cuaderno.telemetry._names import (
    INSTRUMENTATION_NAME,
    METRIC_MODEL_COST,
    METRIC_OPERATION_DURATION,
    METRIC_TOKEN_USAGE,
    METRIC_TOOL_DURATION,
    METRIC_UNPRICED_CALLS,
)

# Bucket boundaries the GenAI conventions recommend for these two histograms.
_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                         67108864)
_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                            81.92)


class _Instruments:
    """The instruments of one meter, created once per meter provider."""

    __slots__ = ("cost", "duration", "token_usage", "tool_duration", "unpriced")

    def __init__(self, meter: Meter) -> None:
        self.token_usage: Histogram = meter.create_histogram(
            METRIC_TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self.duration: Histogram = meter.create_histogram(
            METRIC_OPERATION_DURATION, unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.tool_duration: Histogram = meter.create_histogram(
            METRIC_TOOL_DURATION, unit="s", description="The duration of a single tool execution.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.cost: Counter = meter.create_counter(
            METRIC_MODEL_COST, unit="USD", description="Cost of priced model calls, in US dollars.")
        self.unpriced: Counter = meter.create_counter(
            METRIC_UNPRICED_CALLS, unit="{call}", description="Model calls whose cost is unknown (unpriced).")


_MISSING: Final = object()
_P = TypeVar("_P")  # a tracer or a meter provider
_R = TypeVar("_R")  # what is resolved from it: a tracer, the instruments


class _Resolver(Generic[_P, _R]):
    """One kind of provider (tracer or meter): which one to use now, and what was resolved from it
    (a tracer, the instruments), cached per provider object."""

    __slots__ = ("_api", "_env_read", "_get_global", "_global_name", "_resolve", "configured", "resolved")

    def __init__(self, api: object, global_name: str, get_global: Callable[[], _P],
                 resolve: Callable[[_P], _R | None]) -> None:
        self.configured: _P | None = None
        # (provider, resolved): one tuple, replaced atomically, so threads never see a torn pair.
        self.resolved: tuple[object, _R | None] = (None, None)
        # Whether the API's public getter ran once (it loads a provider named by
        # OTEL_PYTHON_{TRACER,METER}_PROVIDER the first time it is asked).
        self._env_read = False
        self._api = api
        self._global_name = global_name
        self._get_global = get_global
        self._resolve = resolve

    def use(self, provider: _P | None) -> None:
        self.configured = provider
        self.resolved = (None, None)

    def get(self) -> _R | None:
        """What to use now, or ``None`` when this signal is the API's no-op."""
        provider = self.configured
        if provider is None:
            # The API's public getters test ``name in os.environ`` on every call while no global
            # provider is set, which costs about 2 us (a KeyError raised and caught inside
            # ``os.environ``). Once the getter has run, the module global it reads is checked
            # directly instead. If a later API renames that private global, ``getattr`` finds
            # nothing and the public getter is used: still correct.
            if self._env_read and getattr(self._api, self._global_name, _MISSING) is None:
                return None
            provider = self._get_global()
            self._env_read = True
        seen, resolved = self.resolved
        if provider is seen:
            return resolved
        resolved = self._resolve(provider)
        self.resolved = (provider, resolved)
        return resolved


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cuaderno")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


def _resolve_tracer(provider: TracerProvider) -> Tracer | None:
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None  # no SDK yet: the next call looks again, so a provider set later is picked up
    tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
    return None if isinstance(tracer, trace.NoOpTracer) else tracer  # e.g. the SDK with OTEL_SDK_DISABLED=true


def _resolve_instruments(provider: MeterProvider) -> _Instruments | None:
    # The API's proxy for "no provider set yet" is private; its name is checked, not its type.
    # Should it ever be renamed, the proxy is merely treated as real: correct, only slower.
    if isinstance(provider, metrics.NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider":
        return None
    meter = provider.get_meter(INSTRUMENTATION_NAME, _version())
    return None if isinstance(meter, metrics.NoOpMeter) else _Instruments(meter)


_tracers: Final = _Resolver[TracerProvider, Tracer](trace, "_TRACER_PROVIDER", trace.get_tracer_provider,
                                                    _resolve_tracer)
_meters: Final = _Resolver[MeterProvider, _Instruments](_metrics_internal, "_METER_PROVIDER",
                                                        metrics.get_meter_provider, _resolve_instruments)

# Called once per model or tool call: the bound methods themselves, no call more.
_tracer: Final = _tracers.get
"""The tracer to use now, or ``None`` when tracing is the API's no-op."""
_instruments: Final = _meters.get
"""The instruments to use now, or ``None`` when metrics are the API's no-op."""


def _configured() -> tuple[Tracer | None, _Instruments | None] | None:
    """The tracer and the instruments a call reports to, or ``None`` when neither tracing nor
    metrics is configured: every call kind (model, tool) then returns its shared do-nothing handle
    and allocates nothing."""
    tracers, meters = _tracers, _meters
    if (tracers.configured is None and meters.configured is None and tracers._env_read and meters._env_read
            and getattr(trace, tracers._global_name, _MISSING) is None
            and getattr(_metrics_internal, meters._global_name, _MISSING) is None):
        # Nothing configured, no global provider: what both look-ups would answer (see
        # _Resolver.get), from attribute reads, without their two calls per model or tool call.
        return None
    tracer, instruments = _tracer(), _instruments()
    return None if tracer is None and instruments is None else (tracer, instruments)


def configure(*, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None) -> None:
    """Use these providers instead of the global ones; pass nothing to go back to the globals.

    The global OpenTelemetry providers can be set only once per process, so tests (and
    applications that keep several pipelines) hand their providers to cuaderno here.

    Args:
        tracer_provider: where cuaderno's spans go; ``None`` means the global tracer provider.
        meter_provider: where cuaderno's metrics go; ``None`` means the global meter provider.
    """
    _tracers.use(tracer_provider)
    _meters.use(meter_provider)
