"""Datasets and scorers."""

from colab_graphs.data.example import Example

__all__ = ["Example"]
