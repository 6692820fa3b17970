"""The one error hierarchy of hwlat.

Every error a user can cause or fix is a `HwlatError`: the command line turns it into one line on
stderr and exit code 1. Messages say what was wrong and what to do about it.
"""

from __future__ import annotations


class HwlatError(Exception):
    """A domain error: one clear line for the user, exit code 1."""


class SpecError(HwlatError):
    """A model or input spec cannot be parsed or loaded."""


class NoDefaultInputs(SpecError):
    """A model spec that loads but has no default inputs to run it with."""


class CaptureError(HwlatError):
    """A model cannot be traced into its operator list."""


class ValueDependentCapture(CaptureError):
    """The forward reads tensor values (`.item()`, shapes that depend on values)."""


class DeviceError(HwlatError):
    """An unknown device, or one that is not available on this machine."""


class DatabaseError(HwlatError):
    """The kernel database is missing, corrupt, locked or from a newer hwlat."""


class NotFittedError(HwlatError):
    """A predictor was used before it was fitted."""


class UnmodelledOpError(HwlatError):
    """`--strict` prediction met an operator hwlat cannot model."""


class BenchError(HwlatError):
    """A benchmark or load test could not run."""


class ReplayError(CaptureError):
    """A captured op cannot be replayed on real tensors, or replays to other output specs."""


class AdvisorError(HwlatError):
    """The advisor cannot diagnose, predict or apply a lever as asked."""
