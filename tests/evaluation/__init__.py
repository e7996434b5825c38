"""Tests of `scalerl.evaluation` (a package so its test module names cannot clash with other suites)."""
