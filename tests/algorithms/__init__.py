"""Tests of `scalerl.algorithms` (a package so its test module names cannot clash with other suites)."""
