"""predictor."""
