"""Which OpenTelemetry tracer and metric instruments to use now: the providers given to
:func:`configure`, else the global ones, looked up on every call and cached per provider object."""

from __future__ import annotations

from typing import Final

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


class _State:
    """Which providers to use, and what was resolved from them (cached per provider object)."""

    __slots__ = ("meter_env_read", "meter_provider", "meters", "tracer_env_read", "tracer_provider", "tracers")

    def __init__(self) -> None:
        self.tracer_provider: TracerProvider | None = None
        self.meter_provider: MeterProvider | None = None
        # (provider, resolved): one tuple, replaced atomically, so threads never see a torn pair.
        self.tracers: tuple[object, Tracer | None] = (None, None)
        self.meters: tuple[object, _Instruments | None] = (None, None)
        # Whether the API's public getter ran once (it loads a provider named by
        # OTEL_PYTHON_{TRACER,METER}_PROVIDER the first time it is asked).
        self.tracer_env_read = False
        self.meter_env_read = False


_state = _State()
_MISSING: Final = object()


def configure(*, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None) -> None:
    """Use these providers instead of the global ones; pass nothing to go back to the globals.

    The global OpenTelemetry providers can be set only once per process, so tests (and
    applications that keep several pipelines) hand their providers to cuaderno here.

    Args:
        tracer_provider: where cuaderno's spans go; ``None`` means the global tracer provider.
        meter_provider: where cuaderno's metrics go; ``None`` means the global meter provider.
    """
    _state.tracer_provider = tracer_provider
    _state.meter_provider = meter_provider
    _state.tracers = (None, None)
    _state.meters = (None, None)


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cuaderno")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


# The API's public getters test ``name in os.environ`` on every call while no global provider is
# set, which costs about 2 us (a KeyError raised and caught inside ``os.environ``). Once the
# getter has run, the module global it reads is checked directly instead. If a later API renames
# that private global, ``getattr`` finds nothing and the public getter is used: still correct.

def _global_tracer_provider() -> TracerProvider | None:
    if _state.tracer_env_read and getattr(trace, "_TRACER_PROVIDER", _MISSING) is None:
        return None
    provider = trace.get_tracer_provider()
    _state.tracer_env_read = True
    return provider


def _global_meter_provider() -> MeterProvider | None:
    if _state.meter_env_read and getattr(_metrics_internal, "_METER_PROVIDER", _MISSING) is None:
        return None
    provider = metrics.get_meter_provider()
    _state.meter_env_read = True
    return provider


def _tracer() -> Tracer | None:
    """The tracer to use now, or ``None`` when tracing is the API's no-op."""
    provider = _state.tracer_provider
    if provider is None:
        provider = _global_tracer_provider()
        if provider is None:
            return None
    seen, tracer = _state.tracers
    if provider is seen:
        return tracer
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        tracer = None  # no SDK yet: the next call looks again, so a provider set later is picked up
    else:
        tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
        if isinstance(tracer, trace.NoOpTracer):  # e.g. the SDK with OTEL_SDK_DISABLED=true
            tracer = None
    _state.tracers = (provider, tracer)
    return tracer


def _is_noop_meter_provider(provider: MeterProvider) -> bool:
    # The API's proxy for "no provider set yet" is private; its name is checked, not its type.
    # Should it ever be renamed, the proxy is merely treated as real: correct, only slower.
    return isinstance(provider, metrics.NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider"


def _instruments() -> _Instruments | None:
    """The instruments to use now, or ``None`` when metrics are the API's no-op."""
    provider = _state.meter_provider
    if provider is None:
        provider = _global_meter_provider()
        if provider is None:
            return None
    seen, instruments = _state.meters
    if provider is seen:
        return instruments
    instruments = None
    if not _is_noop_meter_provider(provider):
        meter = provider.get_meter(INSTRUMENTATION_NAME, _version())
        if not isinstance(meter, metrics.NoOpMeter):
            instruments = _Instruments(meter)
    _state.meters = (provider, instruments)
    return instruments
