"""Tests of `scalerl.pipeline` (a package so its test module names cannot clash with other suites)."""
