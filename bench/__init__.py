"""The ``gemmlab`` command: benchmarks that check every result before timing it, and the
files they write (``results.json``, ``results.csv``, a PNG) under ``bench/results/``."""
