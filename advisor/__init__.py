"""advisor."""
