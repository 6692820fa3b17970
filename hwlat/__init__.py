"""hwlat: the command line over profilers, kernels_db, predictor and advisor."""

__version__ = "0.1.0"
