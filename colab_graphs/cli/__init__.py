"""The `colab-graphs` command line (typer)."""
