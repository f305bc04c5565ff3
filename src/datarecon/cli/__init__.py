"""Command-line interface: one module per area, each exposing ``register(app)``."""
