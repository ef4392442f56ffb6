"""lazyprefill from Python: the simulator, hardware profiles and model presets (docs/python.md).

The functions are the CLI's subcommands with their options as keyword arguments and the same
defaults; they call the same C++ library functions as the CLI and return typed results whose
attributes are in SI units (seconds, bytes, FLOP) and whose to_dict()/to_json() are the CLI's
--json documents. Bad input raises lazyprefill.Error (a ValueError) with the CLI's one-line message.
The engine (run, serve, eval) stays in the CLI.
"""

from ._core import (
    CompareReport,
    CompareRow,
    CompareTable,
    Error,
    InternalError,
    Memory,
    Model,
    OpCosts,
    PlanPoint,
    PlanReport,
    Prediction,
    Profile,
    Report,
    SimulateReport,
    SimulateResult,
    CapacityRun,
    Percentiles,
    ServingMetrics,
    ServingReport,
    ServingRun,
    __version__,
    engine_names,
    simulate,
    compare,
    plan,
    report,
    simulate_serving,
)

__all__ = [
    "CompareReport",
    "CompareRow",
    "CompareTable",
    "Error",
    "InternalError",
    "Memory",
    "Model",
    "OpCosts",
    "PlanPoint",
    "PlanReport",
    "Prediction",
    "Profile",
    "Report",
    "SimulateReport",
    "SimulateResult",
    "CapacityRun",
    "Percentiles",
    "ServingMetrics",
    "ServingReport",
    "ServingRun",
    "__version__",
    "engine_names",
    "simulate",
    "compare",
    "plan",
    "report",
    "simulate_serving",
]
